// The runtime with hosts as processes (RemoteCluster), against HostProcesses
// served in this process: pw.diagnose while runs finish, a client's close()
// and the runtime's shutdown, compared with what they do in process; and
// host-reported part times on the client's clock.

#include "csrc/client/remote_cluster.h"

#include <atomic>
#include <cstdlib>
#include <limits>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "csrc/base/error_kind.h"
#include "csrc/base/spin.h"
#include "csrc/client/remote_cluster_internal.h"
#include "csrc/client/runtime.h"
#include "csrc/host/host_process.h"
#include "csrc/program_ir/lowering.h"
#include "csrc/program_ir/testing_programs.h"
#include "gtest/gtest.h"

namespace pw {
namespace {

constexpr char kSecret[] = "remote-cluster-test";

// HostProcesses served on loopback in this process, and runtimes that
// connect to them. Each runtime gets hosts of its own.
class RemoteRuntimeTest : public ::testing::Test {
 protected:
  // A runtime of one island of `num_hosts` hosts of 2 devices: with host
  // processes of its own when `remote`, else all in process.
  std::unique_ptr<Runtime> MakeRuntime(bool remote = true, int num_hosts = 2) {
    TopologyOptions options;
    options.num_islands = 1;
    options.hosts_per_island = num_hosts;
    options.devices_per_host = 2;
    options.num_executor_threads = 2;
    if (remote) {
      std::vector<std::string> addresses;
      for (int h = 0; h < num_hosts; ++h) {
        processes_.push_back(std::make_unique<HostProcess>(kSecret));
        auto server = HostServer::Start("127.0.0.1:0", kSecret, processes_.back().get());
        EXPECT_TRUE(server.ok()) << server.status();
        if (!server.ok()) return nullptr;
        addresses.push_back((*server)->address());
        servers_.push_back(*std::move(server));
      }
      Runtime::SetHostLauncher([addresses](const TopologyOptions&, int n) -> absl::StatusOr<LaunchedHosts> {
        if (n != static_cast<int>(addresses.size())) return absl::InternalError("wrong number of hosts");
        return LaunchedHosts{addresses, kSecret, nullptr};
      });
      options.hosts = HostsMode::kLocalProcesses;
    }
    auto rt = Runtime::Create(options);
    EXPECT_TRUE(rt.ok()) << rt.status();
    return rt.ok() ? *std::move(rt) : nullptr;
  }

  void TearDown() override {
    servers_.clear();
    processes_.clear();
  }

  // The executor of host `h` of the last runtime made (its hosts are the
  // last ones started).
  HostExecutor& HostOf(int h, int num_hosts = 2) {
    return *processes_[processes_.size() - num_hosts + h]->executor();
  }

  // Host `h` of the last runtime made dies: its server and process go.
  void KillHost(int h, int num_hosts) {
    const size_t i = processes_.size() - num_hosts + h;
    servers_[i].reset();
    processes_[i].reset();
  }
  // A new host process in host `h`'s place (of the last runtime made): its
  // address, for Runtime::ReplaceHost.
  std::string StartReplacement(int h, int num_hosts) {
    const size_t i = processes_.size() - num_hosts + h;
    processes_[i] = std::make_unique<HostProcess>(kSecret);
    auto server = HostServer::Start("127.0.0.1:0", kSecret, processes_[i].get());
    EXPECT_TRUE(server.ok()) << server.status();
    if (!server.ok()) return "";
    servers_[i] = *std::move(server);
    return servers_[i]->address();
  }

 private:
  std::vector<std::unique_ptr<HostProcess>> processes_;
  std::vector<std::unique_ptr<HostServer>> servers_;
};

// The same cases with hosts in process and as HostProcesses: they must agree.
class LifecycleTest : public RemoteRuntimeTest, public ::testing::WithParamInterface<bool> {
 protected:
  bool remote() const { return GetParam(); }
};

// f(x) = simulated_compute(x + 1, ns) over `slice`.
std::shared_ptr<const CompiledFunction> Slow(Runtime& rt, const std::shared_ptr<VirtualSlice>& slice, int64_t ns,
                                             const std::string& name = "slow") {
  FunctionBuilder b(name, "i");
  const int32_t x = b.Parameter(DType::kF64, {});
  const double one = 1.0;
  std::vector<uint8_t> bytes(8);
  std::memcpy(bytes.data(), &one, 8);
  const int32_t y = *b.Binary(OpKind::kAdd, x, *b.Constant(DType::kF64, {}, bytes));
  auto ir = *b.Build({*b.SimulatedCompute(y, ns)});
  return *CompiledFunction::Create(*FunctionExecutable::Compile(ir), testing::AllOf(slice), &rt.registry());
}

// `steps` calls of `fn` in a chain, each on the last one's output.
std::shared_ptr<const LoweredProgram> Chain(const std::shared_ptr<const CompiledFunction>& fn, int steps,
                                      const std::string& name = "chain") {
  ProgramBuilder pb(name);
  int v = *pb.AddArg(DType::kF64, {static_cast<int64_t>(fn->virtual_devices().size())});
  for (int i = 0; i < steps; ++i) v = (*pb.AddCall(fn, {v}))[0];
  return *Lower(*pb.Build({v}));
}

std::vector<double> Read(const ShardedBuffer& b) {
  std::vector<double> out(static_cast<size_t>(b.total_bytes() / 8));
  absl::Status s = b.ReadInto(out.data());
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

// Item 5 of issue 25: pw.diagnose (Describe) names the producer of a pending
// input by walking the producing run's buffers, which the run drops (on a
// gRPC thread) as it finishes. Describe in a loop while runs of a chain
// finish: a use after free (a crash here, a report under ASan or TSan)
// unless Describe reads them under the run's lock.
TEST_F(RemoteRuntimeTest, DiagnoseWhileRunsFinish) {
  auto rt = MakeRuntime();
  ASSERT_NE(rt, nullptr);
  auto slice = *rt->resource_manager().AddSlice(2, "tpu");
  // Every step waits in its devices' queues behind the one before it,
  // with that one's output as its pending input.
  auto chain = Chain(Slow(*rt, slice, 20'000), 48);
  const double in[] = {1.0, 2.0};
  std::atomic<bool> done{false};
  std::thread dispatch([&] {
    std::vector<std::shared_ptr<ShardedBuffer>> last;
    for (int i = 0; i < 300; ++i) {
      auto outs = rt->Execute(*chain, {ProgramArg{nullptr, in, DType::kF64, {2}}});
      ASSERT_TRUE(outs.ok()) << outs.status();
      last.push_back((*outs)[0]);
      if (last.size() >= 3) {  // a few runs in flight at a time
        ASSERT_TRUE(last.front()->Await().ok());
        last.erase(last.begin());
      }
    }
    for (auto& b : last) ASSERT_TRUE(b->Await().ok());
    done = true;
  });
  int diagnoses = 0, named = 0;
  while (!done.load()) {
    Diagnosis d = rt->Diagnose();
    ++diagnoses;
    for (const WaitingGang& w : d.waiting) {
      for (const PendingInput& input : w.inputs) named += input.producer.has_value() ? 1 : 0;
    }
  }
  dispatch.join();
  EXPECT_GT(diagnoses, 10);
  EXPECT_GT(named, 0) << "no diagnosis named a producer: the race was not exercised";
}

// Item 7 of issue 25: Runtime::Shutdown() with 10 s of simulated work
// queued returns at once whether the hosts are in process or processes: the
// gangs that have not started are cancelled (on the hosts too), the running
// one's simulated time ends, and finished results stay readable. With hosts
// as processes, shutdown used to wait for every run on the hosts.
TEST_P(LifecycleTest, ShutdownCancelsQueuedWorkPromptly) {
  auto rt = MakeRuntime(remote());
  ASSERT_NE(rt, nullptr);
  auto slice = *rt->resource_manager().AddSlice(2, "tpu");
  auto chain = Chain(Slow(*rt, slice, 100'000'000), 100);
  auto fast = Chain(Slow(*rt, slice, 0, "fast"), 1, "fast");
  const double in[] = {1.0, 2.0};
  auto done = *rt->Execute(*fast, {ProgramArg{nullptr, in, DType::kF64, {2}}});
  ASSERT_TRUE(done[0]->Await().ok());
  auto outs = *rt->Execute(*chain, {ProgramArg{nullptr, in, DType::kF64, {2}}});
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the first gang is running

  const int64_t start = NowNanos();
  rt->Shutdown();
  EXPECT_LT(NowNanos() - start, 2'000'000'000);  // not the 10 s queued
  ASSERT_TRUE(outs[0]->IsDone());
  EXPECT_EQ(outs[0]->status().code(), absl::StatusCode::kCancelled) << outs[0]->status();
  EXPECT_TRUE(absl::StrContains(outs[0]->status().message(), "the pathways runtime shut down")) << outs[0]->status();
  EXPECT_EQ(Read(*done[0]), (std::vector<double>{2.0, 3.0}));
  EXPECT_EQ(rt->Execute(*fast, {ProgramArg{nullptr, in, DType::kF64, {2}}}).status().code(),
            absl::StatusCode::kCancelled);
  rt->Shutdown();  // idempotent
}

// Item 7 of issue 25: closing a client cancels its gangs that have not
// started, on the hosts too: their outputs fail with Cancelled naming the
// client, and another client's work on the same devices runs at once
// instead of after the closed client's 10 s of queued gangs. The running
// gang may finish.
TEST_P(LifecycleTest, CloseCancelsTheClientsQueuedWork) {
  auto rt = MakeRuntime(remote());
  ASSERT_NE(rt, nullptr);
  auto slice = *rt->resource_manager().AddSlice(2, "tpu");
  auto chain = Chain(Slow(*rt, slice, 100'000'000), 100);
  auto fast = Chain(Slow(*rt, slice, 0, "fast"), 1, "fast");
  SchedulingClient* tenant = *rt->CreateClient("tenant", 1.0);
  const double in[] = {1.0, 2.0};
  ExecuteOptions options;
  options.client = tenant;
  auto outs = *rt->Execute(*chain, {ProgramArg{nullptr, in, DType::kF64, {2}}}, options);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the first gang is running

  const int64_t start = NowNanos();
  rt->CloseClient(tenant);
  auto other = *rt->Execute(*fast, {ProgramArg{nullptr, in, DType::kF64, {2}}});
  ASSERT_TRUE(other[0]->AwaitFor(5'000'000'000)) << "the closed client's queued work still ran";
  EXPECT_LT(NowNanos() - start, 2'000'000'000);
  ASSERT_TRUE(other[0]->status().ok()) << other[0]->status();
  EXPECT_EQ(Read(*other[0]), (std::vector<double>{2.0, 3.0}));
  ASSERT_TRUE(outs[0]->AwaitFor(2'000'000'000));
  EXPECT_EQ(outs[0]->status().code(), absl::StatusCode::kCancelled) << outs[0]->status();
  EXPECT_TRUE(absl::StrContains(outs[0]->status().message(), "its client 'tenant' was closed")) << outs[0]->status();
  EXPECT_TRUE(absl::StrContains(outs[0]->status().message(), "in program 'chain' was cancelled")) << outs[0]->status();
  EXPECT_EQ(rt->Execute(*fast, {ProgramArg{nullptr, in, DType::kF64, {2}}}, options).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(rt->AwaitQuiescenceFor(5'000'000'000));
}

// Item 2 of issue 25: with the hosts' collective timeouts short (0.3 s,
// from the environment), a gang across both hosts queued behind 1.5 s of
// work on one of its devices times out, which breaks (or never makes) the
// group of the two hosts. The client sees the gang's part fail and renews
// the group ahead of its next run, so the next gangs across them run
// instead of failing for good.
TEST_F(RemoteRuntimeTest, AGangThatTimedOutDoesNotBreakTheHostsForGood) {
  setenv("PATHWAYS_COLLECTIVE_TIMEOUT", "0.3", 1);
  setenv("PATHWAYS_COLLECTIVE_ARRIVAL_TIMEOUT", "0.3", 1);
  auto rt = MakeRuntime();
  unsetenv("PATHWAYS_COLLECTIVE_TIMEOUT");
  unsetenv("PATHWAYS_COLLECTIVE_ARRIVAL_TIMEOUT");
  ASSERT_NE(rt, nullptr);
  auto all = *rt->resource_manager().AddSlice(4, "tpu");  // both hosts
  auto one = *rt->resource_manager().AddSlice(1, "tpu");
  auto busy = Chain(Slow(*rt, one, 1'500'000'000), 1, "busy");
  auto sum = testing::ScalarOpFunction("sum", OpKind::kAdd, 1.0, all, &rt->registry(), DType::kF64, {},
                                       /*with_psum=*/true);
  ProgramBuilder pb("gang");
  const int v = *pb.AddArg(DType::kF64, {4});
  auto gang = *Lower(*pb.Build({(*pb.AddCall(sum, {v}))[0]}));
  const double one_in[] = {1.0};
  const double in[] = {1.0, 2.0, 3.0, 4.0};
  auto held = *rt->Execute(*busy, {ProgramArg{nullptr, one_in, DType::kF64, {1}}});
  auto timed_out = *rt->Execute(*gang, {ProgramArg{nullptr, in, DType::kF64, {4}}});
  ASSERT_FALSE(timed_out[0]->Await().ok());
  EXPECT_TRUE(absl::IsUnavailable(timed_out[0]->status()) || absl::IsDeadlineExceeded(timed_out[0]->status()))
      << timed_out[0]->status();
  ASSERT_TRUE(held[0]->Await().ok());
  for (int i = 0; i < 2; ++i) {
    auto outs = *rt->Execute(*gang, {ProgramArg{nullptr, in, DType::kF64, {4}}});
    ASSERT_TRUE(outs[0]->Await().ok()) << outs[0]->status();
    EXPECT_EQ(Read(*outs[0]), (std::vector<double>{14.0, 14.0, 14.0, 14.0}));
  }
}

// Issue 28: a new host process takes a lost host's place. After host 2
// dies, work on its devices fails with HostLost; once a new process has
// replaced it, its devices are healthy again and the same programs run
// there: a gang whose psum meets every host (its collective groups made
// anew under the new epoch), and transfers both ways between a survivor's
// slice and the new host's (the data plane connected anew). A buffer made
// on the lost process stays lost (HostLost, from the client and from the new
// process alike). Twice: the second replacement replaces a replacement.
TEST_F(RemoteRuntimeTest, ANewProcessTakesALostHostsPlace) {
  constexpr int kHosts = 3;
  auto rt = MakeRuntime(/*remote=*/true, kHosts);
  ASSERT_NE(rt, nullptr);
  auto all = *rt->resource_manager().AddSlice(6, "tpu");
  // Each of the others on one host's two devices (the least loaded first).
  auto a = *rt->resource_manager().AddSlice(2, "tpu");
  auto b = *rt->resource_manager().AddSlice(2, "tpu");
  auto c = *rt->resource_manager().AddSlice(2, "tpu");
  ASSERT_EQ(c->devices()->devices()[0]->host()->id(), 2);
  ASSERT_EQ(a->devices()->devices()[0]->host()->id(), 0);
  auto sum = testing::ScalarOpFunction("sum", OpKind::kAdd, 1.0, all, &rt->registry(), DType::kF64, {},
                                       /*with_psum=*/true);
  ProgramBuilder gang_builder("gang");
  const int v = *gang_builder.AddArg(DType::kF64, {6});
  auto gang = *Lower(*gang_builder.Build({(*gang_builder.AddCall(sum, {v}))[0]}));
  // a -> c -> a: x + 1 on host 0, + 10 on host 2, * 2 back on host 0.
  auto plus_one = testing::ScalarOpFunction("plus_one", OpKind::kAdd, 1.0, a, &rt->registry());
  auto plus_ten = testing::ScalarOpFunction("plus_ten", OpKind::kAdd, 10.0, c, &rt->registry());
  auto twice = testing::ScalarOpFunction("twice", OpKind::kMul, 2.0, a, &rt->registry());
  ProgramBuilder trip_builder("trip");
  const int x = *trip_builder.AddArg(DType::kF64, {2});
  const int y = (*trip_builder.AddCall(plus_one, {x}))[0];
  const int z = (*trip_builder.AddCall(plus_ten, {y}))[0];
  auto trip = *Lower(*trip_builder.Build({(*trip_builder.AddCall(twice, {z}))[0]}));
  const double in[] = {1, 2, 3, 4, 5, 6};
  auto run_gang = [&] { return (*rt->Execute(*gang, {ProgramArg{nullptr, in, DType::kF64, {6}}}))[0]; };
  auto run_trip = [&] { return (*rt->Execute(*trip, {ProgramArg{nullptr, in, DType::kF64, {2}}}))[0]; };
  auto expect_works = [&] {
    auto g = run_gang();
    ASSERT_TRUE(g->Await().ok()) << g->status();
    EXPECT_EQ(Read(*g), std::vector<double>(6, 27.0));
    auto t = run_trip();
    ASSERT_TRUE(t->Await().ok()) << t->status();
    EXPECT_EQ(Read(*t), (std::vector<double>{24.0, 26.0}));
  };
  expect_works();
  const std::vector<Device*>& lost_devices = rt->cluster().hosts()[2]->devices();
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(absl::StrCat("replacement ", round + 1));
    auto kept = run_gang();  // a shard on host 2's process
    ASSERT_TRUE(kept->Await().ok()) << kept->status();
    KillHost(2, kHosts);
    for (int i = 0; i < 10000 && !(lost_devices[0]->failed() && lost_devices[1]->failed()); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ASSERT_TRUE(lost_devices[0]->failed() && lost_devices[1]->failed());
    auto failed = run_gang();
    EXPECT_FALSE(failed->Await().ok());
    EXPECT_EQ(GetErrorKind(failed->status()), ErrorKind::kHostLost) << failed->status();
    // A host that is not lost keeps its place.
    EXPECT_EQ(rt->ReplaceHost(1, "127.0.0.1:1").code(), absl::StatusCode::kFailedPrecondition);
    {
      // A host process of another cluster (another secret) is refused: the
      // host stays lost, and may still be replaced.
      HostProcess stranger("another-secret");
      auto server = HostServer::Start("127.0.0.1:0", "another-secret", &stranger);
      ASSERT_TRUE(server.ok()) << server.status();
      EXPECT_FALSE(rt->ReplaceHost(2, (*server)->address()).ok());
      EXPECT_TRUE(lost_devices[0]->failed());
    }
    const std::string address = StartReplacement(2, kHosts);
    ASSERT_TRUE(rt->ReplaceHost(2, address).ok());
    EXPECT_FALSE(lost_devices[0]->failed());
    EXPECT_FALSE(lost_devices[1]->failed());
    for (int i = 0; i < 3; ++i) expect_works();
    EXPECT_EQ(GetErrorKind(kept->CheckDevices()), ErrorKind::kHostLost) << kept->CheckDevices();
    std::vector<double> out(6);
    const absl::Status read = kept->ReadInto(out.data());
    EXPECT_EQ(GetErrorKind(read), ErrorKind::kHostLost) << read;
  }
}

// The same under proportional share, with many runs: with hosts as
// processes most of them still wait for admission in the client when the
// client closes; those fail at once, and the hosts cancel the admitted ones.
TEST_P(LifecycleTest, CloseCancelsTheClientsRunsWaitingForAdmission) {
  auto rt = MakeRuntime(remote());
  ASSERT_NE(rt, nullptr);
  ASSERT_TRUE(rt->SetSchedulingPolicy(SchedulingPolicy::kProportionalShare).ok());
  auto slice = *rt->resource_manager().AddSlice(2, "tpu");
  auto slow = Chain(Slow(*rt, slice, 100'000'000), 1);
  auto fast = Chain(Slow(*rt, slice, 0, "fast"), 1, "fast");
  SchedulingClient* tenant = *rt->CreateClient("tenant", 1.0);
  const double in[] = {1.0, 2.0};
  ExecuteOptions options;
  options.client = tenant;
  std::vector<std::shared_ptr<ShardedBuffer>> outs;
  for (int i = 0; i < 40; ++i) {
    outs.push_back((*rt->Execute(*slow, {ProgramArg{nullptr, in, DType::kF64, {2}}}, options))[0]);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const int64_t start = NowNanos();
  rt->CloseClient(tenant);
  auto other = *rt->Execute(*fast, {ProgramArg{nullptr, in, DType::kF64, {2}}});
  ASSERT_TRUE(other[0]->AwaitFor(5'000'000'000)) << "the closed client's queued work still ran";
  EXPECT_TRUE(other[0]->status().ok()) << other[0]->status();
  int cancelled = 0;
  for (auto& out : outs) {
    ASSERT_TRUE(out->AwaitFor(2'000'000'000));
    if (out->status().ok()) continue;  // it had started
    EXPECT_EQ(out->status().code(), absl::StatusCode::kCancelled) << out->status();
    EXPECT_TRUE(absl::StrContains(out->status().message(), "its client 'tenant' was closed")) << out->status();
    ++cancelled;
  }
  EXPECT_LT(NowNanos() - start, 2'000'000'000);
  EXPECT_GE(cancelled, 35);
  EXPECT_TRUE(rt->AwaitQuiescenceFor(5'000'000'000));
}

INSTANTIATE_TEST_SUITE_P(Hosts, LifecycleTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "AsProcesses" : "InProcess";
                         });

// Item 9 of issue 25: the client's caches and the hosts' tables followed
// every function and program ever dispatched, for ever: a loop that makes a
// new function and program each step (a new pw.pmap per step) grew both
// without bound. Now what the caller dropped is forgotten by the client and
// unloaded from the hosts (wire::Unload), once no run needs it, while what
// it still holds keeps working: in parallel and sequential dispatch.
class UnloadTest : public RemoteRuntimeTest, public ::testing::WithParamInterface<DispatchMode> {};

TEST_P(UnloadTest, DroppedProgramsAndFunctionsLeaveTheHosts) {
  auto rt = MakeRuntime();
  ASSERT_NE(rt, nullptr);
  auto slice = *rt->resource_manager().AddSlice(4, "tpu");  // 2 devices on each host
  ExecuteOptions options;
  options.mode = GetParam();
  auto kept = Chain(Slow(*rt, slice, 0, "kept"), 2, "kept");
  const double in[] = {1.0, 2.0, 3.0, 4.0};
  constexpr int kSteps = 300;
  std::shared_ptr<ShardedBuffer> last;
  for (int i = 0; i < kSteps; ++i) {
    // A function and a program of their own, dropped at the end of the step;
    // the last output outlives them (a run may still be in flight).
    auto program = Chain(Slow(*rt, slice, 0, absl::StrCat("step", i)), 1, absl::StrCat("step", i));
    auto outs = rt->Execute(*program, {ProgramArg{nullptr, in, DType::kF64, {4}}}, options);
    ASSERT_TRUE(outs.ok()) << outs.status();
    last = (*outs)[0];
    if (i % 50 == 0) {
      auto k = rt->Execute(*kept, {ProgramArg{nullptr, in, DType::kF64, {4}}}, options);
      ASSERT_TRUE(k.ok()) << k.status();
      EXPECT_EQ(Read(*(*k)[0]), (std::vector<double>{3.0, 4.0, 5.0, 6.0}));
    }
  }
  EXPECT_EQ(Read(*last), (std::vector<double>{2.0, 3.0, 4.0, 5.0}));
  for (int h = 0; h < 2; ++h) {
    // What is live (kept, and the last step's) and what a sweep has not
    // reached yet: a bound that does not grow with the number of steps.
    EXPECT_LE(HostOf(h).num_functions(), 64) << "host " << h;
    EXPECT_LE(HostOf(h).num_programs(), 2 * 64) << "host " << h;
  }
  // What the caller kept still runs after every sweep.
  auto k = rt->Execute(*kept, {ProgramArg{nullptr, in, DType::kF64, {4}}}, options);
  ASSERT_TRUE(k.ok()) << k.status();
  EXPECT_EQ(Read(*(*k)[0]), (std::vector<double>{3.0, 4.0, 5.0, 6.0}));
}

INSTANTIATE_TEST_SUITE_P(Modes, UnloadTest, ::testing::Values(DispatchMode::kParallel, DispatchMode::kSequential),
                         [](const ::testing::TestParamInfo<DispatchMode>& info) {
                           return info.param == DispatchMode::kParallel ? "Parallel" : "Sequential";
                         });

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
constexpr int64_t kMin = std::numeric_limits<int64_t>::min();

TEST(OnClientClockTest, MovesSaneTimesByTheOffset) {
  const PartInterval p = OnClientClock(1'500, 1'800, 1'000, 100, 2'000);
  EXPECT_EQ(p.start_ns, 500);
  EXPECT_EQ(p.end_ns, 800);
}

TEST(OnClientClockTest, ClampsTimesToTheRunsLife) {
  // Before the submission, after now, and reversed.
  PartInterval p = OnClientClock(0, 10'000, 0, 100, 2'000);
  EXPECT_EQ(p.start_ns, 100);
  EXPECT_EQ(p.end_ns, 2'000);
  p = OnClientClock(900, 300, 0, 100, 2'000);
  EXPECT_EQ(p.start_ns, 900);
  EXPECT_EQ(p.end_ns, 900);
}

TEST(OnClientClockTest, HostileTimesNeitherOverflowNorLeaveTheRunsLife) {
  for (const int64_t start : {kMin, int64_t{-1}, int64_t{0}, kMax}) {
    for (const int64_t end : {kMin, int64_t{0}, kMax}) {
      for (const int64_t offset : {kMin, int64_t{0}, kMax}) {
        const PartInterval p = OnClientClock(start, end, offset, 100, 2'000);
        EXPECT_GE(p.start_ns, 100);
        EXPECT_LE(p.end_ns, 2'000);
        EXPECT_LE(p.start_ns, p.end_ns);
        // What the accounts multiply by a gang's size stays small.
        EXPECT_LE(p.end_ns - p.start_ns, 1'900);
      }
    }
  }
}

}  // namespace
}  // namespace pw
