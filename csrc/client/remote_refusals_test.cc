// Refusals heard (issue 25, item 1): the client's side of hosts as processes
// (RemoteCluster) against HostProcesses served in this process, one per
// host, each through a handler that lets a test tamper with what its host
// receives: a load it cannot do, a run it refuses. What the client must make
// of that: the runs that need the load fail with the host's error, promptly;
// a refused run fails as a whole, its other hosts let go of it, and later
// runs between the same hosts are exact (a transfer pairs with its own run,
// not the next one of the same size). Every wait is bounded, so a hang fails
// its test.

#include "csrc/client/remote_cluster.h"

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "csrc/base/error_kind.h"
#include "csrc/base/spin.h"
#include "csrc/client/runtime.h"
#include "csrc/coordination/host_channel.h"
#include "csrc/coordination/host_server.h"
#include "csrc/host/host_process.h"
#include "csrc/program_ir/lowering.h"
#include "csrc/program_ir/testing_programs.h"
#include "gtest/gtest.h"

namespace pw {
namespace {

constexpr char kSecret[] = "remote-refusals-test";
// Far below Gloo's 30 s: a run that waits for a host that will never take
// part in it fails here.
constexpr int64_t kPromptNs = int64_t{10} * 1'000'000'000;

// One host: its HostProcess behind its handler. `tamper` sees each request
// first; true means it handled it (and replied, if a reply was wanted).
class TestHost final : public RequestHandler {
 public:
  using Tamper = std::function<bool(const std::shared_ptr<HostSession>&, wire::Request&)>;

  void set_tamper(Tamper tamper) {
    MutexLock lock(&mu_);
    tamper_ = std::move(tamper);
  }

  void Handle(const std::shared_ptr<HostSession>& session, wire::Request request) override {
    Tamper tamper;
    {
      MutexLock lock(&mu_);
      tamper = tamper_;
    }
    if (tamper && tamper(session, request)) return;
    process_.Handle(session, std::move(request));
  }
  void OnSessionEnd(const std::shared_ptr<HostSession>& session) override { process_.OnSessionEnd(session); }
  absl::StatusOr<std::string> PeerKey(int host) override { return process_.PeerKey(host); }
  void Heartbeat(const wire::Ping& ping, wire::Pong* pong) override { process_.Heartbeat(ping, pong); }

 private:
  HostProcess process_{kSecret};
  Mutex mu_;
  Tamper tamper_ ABSL_GUARDED_BY(mu_);
};

// Replies to `request` with `status`, as a host that refuses it.
void Refuse(const std::shared_ptr<HostSession>& session, const wire::Request& request, const absl::Status& status) {
  if (request.id() == 0) return;
  wire::Reply reply;
  reply.set_id(request.id());
  ToWire(status, reply.mutable_status());
  session->Reply(std::move(reply));
}

// Two islands of one host each, two devices per host: a slice of two
// devices is one host's.
class RemoteClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int h = 0; h < 2; ++h) {
      hosts_.push_back(std::make_unique<TestHost>());
      auto server = HostServer::Start("127.0.0.1:0", kSecret, hosts_.back().get());
      ASSERT_TRUE(server.ok()) << server.status();
      addresses_.push_back((*server)->address());
      servers_.push_back(*std::move(server));
    }
    Runtime::SetHostLauncher([addresses = addresses_](const TopologyOptions&, int num_hosts)
                                 -> absl::StatusOr<LaunchedHosts> {
      if (num_hosts != static_cast<int>(addresses.size())) return absl::InternalError("wrong number of hosts");
      return LaunchedHosts{addresses, kSecret, nullptr};
    });
  }

  void TearDown() override {
    slices_.clear();
    rt_.reset();  // ends the sessions first
    servers_.clear();
    hosts_.clear();
  }

  // The runtime on the hosts, with whatever tampering the test set up.
  void Start() {
    TopologyOptions options;
    options.hosts = HostsMode::kLocalProcesses;
    options.num_islands = 2;
    options.hosts_per_island = 1;
    options.devices_per_host = 2;
    options.device_memory_bytes = int64_t{1} << 24;
    options.num_executor_threads = 2;
    options.hang_report_ns = 0;
    auto rt = Runtime::Create(options);
    ASSERT_TRUE(rt.ok()) << rt.status();
    rt_ = *std::move(rt);
    for (int i = 0; i < 2; ++i) {
      auto slice = rt_->resource_manager().AddSlice(2, "tpu");
      ASSERT_TRUE(slice.ok()) << slice.status();
      slices_.push_back(*std::move(slice));
    }
  }

  int HostOf(int slice) const { return slices_[slice]->devices()->devices()[0]->host()->id(); }

  // y = b(a(v)), a = x * 2 on slice `from`, b = x + 1 on slice `to`: each
  // run copies a's result from one host to the other (DCN).
  std::shared_ptr<const LoweredProgram> Across(int from, int to, const std::string& name = "across") {
    auto a = testing::ScalarOpFunction("a", OpKind::kMul, 2.0, slices_[from], rt_->resource_manager().registry());
    auto b = testing::ScalarOpFunction("b", OpKind::kAdd, 1.0, slices_[to], rt_->resource_manager().registry());
    ProgramBuilder pb(name);
    const int v = *pb.AddArg(DType::kF64, {2});
    const int x = (*pb.AddCall(a, {v}))[0];
    const int y = (*pb.AddCall(b, {x}))[0];
    auto ir = pb.Build({y});
    EXPECT_TRUE(ir.ok()) << ir.status();
    auto lowered = Lower(*ir);
    EXPECT_TRUE(lowered.ok()) << lowered.status();
    return *lowered;
  }

  // Runs `program` on v = {v0, v1}: its one output, or the dispatch's error.
  absl::StatusOr<std::shared_ptr<ShardedBuffer>> Execute(const LoweredProgram& program, double v0, double v1) {
    const double v[] = {v0, v1};
    ProgramArg arg;
    arg.host_data = v;
    arg.dtype = DType::kF64;
    arg.dims = {2};
    auto outs = rt_->dispatcher().Execute(program, {arg});
    if (!outs.ok()) return outs.status();
    return (*outs)[0];
  }

  // Runs `program` on {v0, v1} and reads its output.
  absl::StatusOr<std::vector<double>> RunAndRead(const LoweredProgram& program, double v0, double v1) {
    auto out = Execute(program, v0, v1);
    if (!out.ok()) return out.status();
    return Values(**out);
  }

  // The buffer's values once ready; its error, or DeadlineExceeded after
  // kPromptNs.
  static absl::StatusOr<std::vector<double>> Values(const ShardedBuffer& buffer) {
    if (!buffer.AwaitFor(kPromptNs)) return absl::DeadlineExceededError("the buffer was not ready in time");
    if (absl::Status status = buffer.Await(); !status.ok()) return status;
    std::vector<double> values(static_cast<size_t>(buffer.total_bytes() / 8));
    if (absl::Status status = buffer.ReadInto(values.data()); !status.ok()) return status;
    return values;
  }

  std::vector<std::unique_ptr<TestHost>> hosts_;
  std::vector<std::unique_ptr<HostServer>> servers_;
  std::vector<std::string> addresses_;
  std::unique_ptr<Runtime> rt_;
  std::vector<std::shared_ptr<VirtualSlice>> slices_;
};

// Host `refuser` refuses the second RunProgram it gets. The refusal comes
// from its handler, before its executor sees the run: the client's cancel,
// sent to every host of the run (the refuser too), is what tells the
// refuser's executor to drop the run's messages.
TestHost::Tamper RefuseSecondRun(int refuser, std::shared_ptr<std::atomic<int>> runs) {
  return [refuser, runs](const std::shared_ptr<HostSession>& session, wire::Request& request) {
    if (request.kind_case() != wire::Request::kRun || runs->fetch_add(1) != 1) return false;
    Refuse(session, request,
           absl::FailedPreconditionError(absl::StrCat("host ", refuser, " refuses this run (test)")));
    return true;
  };
}

// Host 1 refuses a run whose transfer host 0 sends anyway: the next run of
// the same size between them must take its own data.
TEST_F(RemoteClusterTest, ARunTheReceivingHostRefusesFailsPromptlyAndTheNextRunIsExact) {
  hosts_[1]->set_tamper(RefuseSecondRun(1, std::make_shared<std::atomic<int>>(0)));
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_EQ(HostOf(0), 0);
  ASSERT_EQ(HostOf(1), 1);
  auto program = Across(0, 1);  // host 0 sends, host 1 receives

  auto first = RunAndRead(*program, 1, 2);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(*first, (std::vector<double>{3, 5}));
  auto refused = Execute(*program, 10, 20);
  ASSERT_TRUE(refused.ok()) << refused.status();
  auto error = Values(**refused);
  EXPECT_EQ(error.status().code(), absl::StatusCode::kFailedPrecondition) << error.status();
  EXPECT_TRUE(absl::StrContains(error.status().message(), "host 1 refuses this run")) << error.status();
  auto after = RunAndRead(*program, 100, 200);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(*after, (std::vector<double>{201, 401})) << "a run took the refused run's transfer";
}

// Host 0 refuses a run whose transfer host 1 waits for: the run fails
// promptly (host 1 lets go of it), and the next run takes its own data.
TEST_F(RemoteClusterTest, ARunTheSendingHostRefusesFailsPromptlyAndTheNextRunIsExact) {
  hosts_[0]->set_tamper(RefuseSecondRun(0, std::make_shared<std::atomic<int>>(0)));
  ASSERT_NO_FATAL_FAILURE(Start());
  auto program = Across(0, 1);  // host 0 sends, host 1 receives

  auto first = RunAndRead(*program, 1, 2);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(*first, (std::vector<double>{3, 5}));
  const int64_t start = NowNanos();
  auto refused = Execute(*program, 10, 20);
  ASSERT_TRUE(refused.ok()) << refused.status();
  // Host 1 waits for a transfer host 0 will never send: the client tells it
  // to let go of the run.
  auto error = Values(**refused);
  EXPECT_EQ(error.status().code(), absl::StatusCode::kFailedPrecondition) << error.status();
  EXPECT_TRUE(absl::StrContains(error.status().message(), "host 0 refuses this run")) << error.status();
  auto after = RunAndRead(*program, 100, 200);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(*after, (std::vector<double>{201, 401})) << "a run took another run's transfer";
  EXPECT_LT(NowNanos() - start, kPromptNs);
  // Nothing of the refused run stays in flight on either host.
  EXPECT_TRUE(rt_->AwaitQuiescenceFor(kPromptNs));
}

// What a host that cannot do a load answers, and what the client makes of
// it: the run that needs the load fails with the host's error naming what
// could not be loaded, at once (not a hang, not a later error about
// something missing), and so does every later run of the program; the
// programs that do not need it still run.
struct LoadCase {
  const char* name;
  wire::Request::KindCase kind;
  const char* expected;  // in the error
};

class RefusedLoadTest : public RemoteClusterTest, public ::testing::WithParamInterface<LoadCase> {};

TEST_P(RefusedLoadTest, FailsTheRunsThatNeedItWithTheHostsError) {
  const LoadCase& c = GetParam();
  // The first load of that kind host 1 gets is the program's (the lists
  // of its transfer, function 'b', its steps there).
  hosts_[1]->set_tamper([kind = c.kind, seen = std::make_shared<std::atomic<int>>(0)](
                            const std::shared_ptr<HostSession>& session, wire::Request& request) {
    if (request.kind_case() != kind || seen->fetch_add(1) != 0) return false;
    if (kind == wire::Request::kLoadFunction) {
      // The host itself refuses it: the IR arrives corrupt.
      request.mutable_load_function()->set_ir("not a function");
      return false;
    }
    Refuse(session, request, absl::ResourceExhaustedError("no room for it here (test)"));
    return true;
  });
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_EQ(HostOf(1), 1);
  auto program = Across(0, 1);  // 'b' runs on host 1
  const int64_t start = NowNanos();
  auto first = RunAndRead(*program, 1, 2);
  ASSERT_FALSE(first.ok());
  EXPECT_LT(NowNanos() - start, kPromptNs);
  const absl::Status& error = first.status();
  EXPECT_NE(error.code(), absl::StatusCode::kDeadlineExceeded) << error;
  EXPECT_TRUE(absl::StrContains(error.message(), "host 1")) << error;
  EXPECT_TRUE(absl::StrContains(error.message(), c.expected)) << error;
  // Every later run of the program: the same error, at once.
  auto again = RunAndRead(*program, 3, 4);
  EXPECT_EQ(again.status(), error);
  // Both hosts still run what they could load.
  for (int slice : {0, 1}) {
    auto local = Across(slice, slice, absl::StrCat("local", slice));
    auto values = RunAndRead(*local, 1, 2);
    ASSERT_TRUE(values.ok()) << values.status();
    EXPECT_EQ(*values, (std::vector<double>{3, 5}));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Loads, RefusedLoadTest,
    ::testing::Values(LoadCase{"DefineDevices", wire::Request::kDefineDevices, "no room for it here (test)"},
                      LoadCase{"LoadFunction", wire::Request::kLoadFunction, "function 'b'"},
                      LoadCase{"LoadProgram", wire::Request::kLoadProgram, "no room for it here (test)"}),
    [](const ::testing::TestParamInfo<LoadCase>& info) { return std::string(info.param.name); });

// A chunk of a device_put that a host refuses fails the buffer there: its
// readers get the host's error, not a hang nor "no such buffer".
TEST_F(RemoteClusterTest, APutAHostRefusesFailsTheBufferWithItsError) {
  hosts_[1]->set_tamper([](const std::shared_ptr<HostSession>&, wire::Request& request) {
    if (request.kind_case() == wire::Request::kPut) request.mutable_put()->set_shard_bytes(-1);
    return false;
  });
  ASSERT_NO_FATAL_FAILURE(Start());
  const double v[] = {1, 2};
  auto put = rt_->DevicePut(DType::kF64, {2}, v, slices_[1]->devices());
  ASSERT_TRUE(put.ok()) << put.status();
  auto values = Values(**put);
  EXPECT_FALSE(values.ok());
  EXPECT_NE(values.status().code(), absl::StatusCode::kDeadlineExceeded) << values.status();
  EXPECT_NE(values.status().code(), absl::StatusCode::kNotFound) << values.status();
  EXPECT_TRUE(absl::StrContains(values.status().message(), "shard_bytes")) << values.status();
  // A run that reads it fails with that error too.
  auto program = Across(1, 1);
  ProgramArg arg;
  arg.buffer = *put;
  auto outs = rt_->dispatcher().Execute(*program, {arg});
  absl::Status status = outs.ok() ? Values(*(*outs)[0]).status() : outs.status();
  EXPECT_TRUE(absl::StrContains(status.message(), "shard_bytes")) << status;
}

// A host lost before a program's first dispatch: its loads are answered
// with its loss, so the dispatch fails at once, as pw.HostLostError naming
// the host (not a wait for answers that never come).
TEST_F(RemoteClusterTest, AHostLostBeforeTheFirstDispatchFailsItAsHostLost) {
  ASSERT_NO_FATAL_FAILURE(Start());
  servers_[1].reset();  // host 1's process is gone
  const int64_t deadline = NowNanos() + kPromptNs;
  while (rt_->remote()->hosts()[1].alive() && NowNanos() < deadline) absl::SleepFor(absl::Milliseconds(5));
  ASSERT_FALSE(rt_->remote()->hosts()[1].alive());
  auto program = Across(0, 1);
  const int64_t start = NowNanos();
  auto out = RunAndRead(*program, 1, 2);
  ASSERT_FALSE(out.ok());
  EXPECT_LT(NowNanos() - start, kPromptNs);
  EXPECT_EQ(GetErrorKind(out.status()), ErrorKind::kHostLost) << out.status();
  EXPECT_TRUE(absl::StrContains(out.status().message(), "host 1")) << out.status();
}

}  // namespace
}  // namespace pw
