#include "csrc/client/runtime.h"

#include <atomic>
#include <map>
#include <random>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "csrc/base/spin.h"
#include "csrc/program_ir/lowering.h"
#include "csrc/program_ir/testing_programs.h"
#include "gtest/gtest.h"

namespace pw {
namespace {

std::unique_ptr<Runtime> MakeRuntime(int executor_threads, int64_t device_memory = int64_t{1} << 30,
                                     int64_t control_latency_ns = 0) {
  TopologyOptions options;
  options.num_executor_threads = executor_threads;
  options.device_memory_bytes = device_memory;
  options.control_latency_ns = control_latency_ns;
  auto rt = Runtime::Create(options);
  EXPECT_TRUE(rt.ok()) << rt.status();
  return *std::move(rt);
}

std::vector<double> Values(const ShardedBuffer& b) {
  const double* p = static_cast<const double*>(b.data());
  return std::vector<double>(p, p + b.total_bytes() / 8);
}

class RuntimeTest : public ::testing::TestWithParam<int> {};

TEST_P(RuntimeTest, RunsFigure2EndToEnd) {
  auto rt = MakeRuntime(GetParam());
  std::vector<std::shared_ptr<VirtualSlice>> slices;
  auto lowered = *Lower(testing::Figure2(rt->resource_manager(), 2, &slices));
  const double v[] = {1.0, 2.0};
  ProgramArg arg;
  arg.host_data = v;
  arg.dtype = DType::kF64;
  arg.dims = {2};
  auto outs = rt->dispatcher().Execute(*lowered, {arg});
  ASSERT_TRUE(outs.ok()) << outs.status();
  ASSERT_EQ(outs->size(), 2u);
  ASSERT_TRUE((*outs)[0]->Await().ok());
  ASSERT_TRUE((*outs)[1]->Await().ok());
  EXPECT_EQ(Values(*(*outs)[0]), (std::vector<double>{3.0, 5.0}));
  EXPECT_EQ(Values(*(*outs)[1]), (std::vector<double>{2.0, 4.0}));
  EXPECT_EQ((*outs)[0]->devices(), slices[1]->devices());  // y lives on b's slice
  EXPECT_EQ(rt->transfer_stats().dcn_transfers.load(), 1);
  EXPECT_EQ(rt->transfer_stats().ici_transfers.load(), 2);
}

TEST_P(RuntimeTest, MemoryReturnsWhenBuffersDie) {
  auto rt = MakeRuntime(GetParam());
  std::vector<std::shared_ptr<VirtualSlice>> slices;
  auto lowered = *Lower(testing::Figure2(rt->resource_manager(), 2, &slices));
  const double v[] = {1.0, 2.0};
  ProgramArg arg{nullptr, v, DType::kF64, {2}};
  for (int i = 0; i < 50; ++i) {
    auto outs = *rt->dispatcher().Execute(*lowered, {arg});
    if (i % 7 == 0) {
      ASSERT_TRUE(outs[1]->Await().ok());
    }
  }
  rt->AwaitQuiescence();
  // Intermediates die with their last consumer; outputs died with `outs`.
  for (int i = 0; i < 1000 && rt->object_stores().TotalLiveBytes() != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(rt->object_stores().TotalLiveBytes(), 0);
}

TEST_P(RuntimeTest, OutOfMemoryIsAnErrorAndTheRuntimeStaysUsable) {
  // 64 bytes per device: a chain of 8-byte shards fits 8 live buffers.
  auto rt = MakeRuntime(GetParam(), 64);
  auto slice = *rt->resource_manager().AddSlice(2, "tpu");
  auto add = testing::ScalarOpFunction("add", OpKind::kAdd, 1.0, slice, &rt->registry());
  ProgramBuilder big("big");
  int v = *big.AddArg(DType::kF64, {2});
  std::vector<int> all;
  for (int i = 0; i < 20; ++i) {
    v = (*big.AddCall(add, {v}))[0];
    all.push_back(v);
  }
  auto too_big = *Lower(*big.Build(all));  // every value is an output: all stay live
  const double x[] = {0.0, 10.0};
  ProgramArg arg{nullptr, x, DType::kF64, {2}};
  auto oom = rt->dispatcher().Execute(*too_big, {arg});
  EXPECT_EQ(oom.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(oom.status().message(), "out of device memory")) << oom.status();
  rt->AwaitQuiescence();
  ProgramBuilder small("small");
  const int w = *small.AddArg(DType::kF64, {2});
  auto ok = *Lower(*small.Build({(*small.AddCall(add, {w}))[0]}));
  for (int i = 0; i < 1000 && rt->object_stores().TotalLiveBytes() != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  auto outs = rt->dispatcher().Execute(*ok, {arg});
  ASSERT_TRUE(outs.ok()) << outs.status();
  ASSERT_TRUE((*outs)[0]->Await().ok());
  EXPECT_EQ(Values(*(*outs)[0]), (std::vector<double>{1.0, 11.0}));
}

TEST_P(RuntimeTest, ArgumentErrorsAreReported) {
  auto rt = MakeRuntime(GetParam());
  std::vector<std::shared_ptr<VirtualSlice>> slices;
  auto lowered = *Lower(testing::Figure2(rt->resource_manager(), 2, &slices));
  const double v[] = {1.0, 2.0, 3.0};
  auto wrong_shape = rt->dispatcher().Execute(*lowered, {ProgramArg{nullptr, v, DType::kF64, {3}}});
  EXPECT_EQ(wrong_shape.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(wrong_shape.status().message()),
            "argument 0 of program 'f' must be f64[2], got f64[3]");
  auto wrong_count = rt->dispatcher().Execute(*lowered, {});
  EXPECT_EQ(std::string(wrong_count.status().message()), "program 'f' takes 1 arguments, got 0");
}

// Eight threads run programs whose psum gangs overlap on shared devices,
// many times; every result is checked, and a hang fails the test by timeout.
TEST_P(RuntimeTest, StressSharedDevicesWithCollectives) {
  auto rt = MakeRuntime(GetParam());
  constexpr int kThreads = 8, kIterations = 200;
  std::vector<std::shared_ptr<VirtualSlice>> slices;
  std::vector<std::shared_ptr<const LoweredProgram>> programs;
  for (int t = 0; t < kThreads; ++t) {
    // 4-device slices on 8-device islands: each physical device is shared.
    auto s1 = *rt->resource_manager().AddSlice(4, "tpu");
    auto s2 = *rt->resource_manager().AddSlice(4, "tpu");
    auto f = testing::ScalarOpFunction("f", OpKind::kAdd, t, s1, &rt->registry(), DType::kF64, {3}, true);
    auto g = testing::ScalarOpFunction("g", OpKind::kMul, 2.0, s2, &rt->registry(), DType::kF64, {3}, true);
    ProgramBuilder pb("stress");
    const int v = *pb.AddArg(DType::kF64, {4, 3});
    const int a = (*pb.AddCall(f, {v}))[0];
    const int b = (*pb.AddCall(g, {a}))[0];
    const int c = (*pb.AddCall(f, {b}))[0];
    programs.push_back(*Lower(*pb.Build({c})));
    slices.push_back(s1);
    slices.push_back(s2);
  }
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      for (int i = 0; i < kIterations; ++i) {
        double x[12];
        for (double& e : x) e = static_cast<double>(rng() % 100);
        auto outs = rt->dispatcher().Execute(*programs[t], {ProgramArg{nullptr, x, DType::kF64, {4, 3}}});
        if (!outs.ok() || !(*outs)[0]->Await().ok()) {
          failures++;
          continue;
        }
        // a = psum(x + t); b = psum(2a) = 8a; c = psum(b + t) = 4b + 4t.
        const double* out = static_cast<const double*>((*outs)[0]->data());
        for (int j = 0; j < 3; ++j) {
          double a = 0;
          for (int s = 0; s < 4; ++s) a += x[s * 3 + j] + t;
          const double want = 4 * (8 * a) + 4 * t;
          for (int s = 0; s < 4; ++s) failures += out[s * 3 + j] != want;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  rt->AwaitQuiescence();
  EXPECT_EQ(rt->scheduler(0).num_in_flight() + rt->scheduler(1).num_in_flight(), 0);
  EXPECT_EQ(rt->scheduler(0).num_enqueued() + rt->scheduler(1).num_enqueued(),
            static_cast<uint64_t>(kThreads * kIterations * 3));
}

// Both dispatch modes, with and without a modeled control latency, compute
// the same results; an allocation failure in the middle of a parallel
// dispatch still releases the nodes dispatched before it.
TEST_P(RuntimeTest, DispatchModesAndControlLatency) {
  for (int64_t latency : {int64_t{0}, int64_t{50'000}}) {
    auto rt = MakeRuntime(GetParam(), /*device_memory=*/64, latency);
    std::vector<std::shared_ptr<VirtualSlice>> slices;
    auto figure2 = *Lower(testing::Figure2(rt->resource_manager(), 2, &slices));
    const double v[] = {1.0, 2.0};
    for (DispatchMode mode : {DispatchMode::kParallel, DispatchMode::kSequential}) {
      ExecuteOptions options;
      options.mode = mode;
      const int64_t start = NowNanos();
      auto outs = *rt->dispatcher().Execute(*figure2, {ProgramArg{nullptr, v, DType::kF64, {2}}}, options);
      ASSERT_TRUE(outs[0]->Await().ok());
      ASSERT_TRUE(outs[1]->Await().ok());
      EXPECT_EQ(Values(*outs[0]), (std::vector<double>{3.0, 5.0}));
      EXPECT_EQ(Values(*outs[1]), (std::vector<double>{2.0, 4.0}));
      // Parallel pays the latency once; sequential once per node on the
      // longest chain (a, c, a: three nodes).
      const int64_t elapsed = NowNanos() - start;
      EXPECT_GE(elapsed, mode == DispatchMode::kParallel ? latency : 3 * latency);
    }
    // Out of memory after some nodes were dispatched: they still run.
    auto slice = *rt->resource_manager().AddSlice(2, "tpu");
    auto add = testing::ScalarOpFunction("add", OpKind::kAdd, 1.0, slice, &rt->registry());
    ProgramBuilder big("big");
    int x = *big.AddArg(DType::kF64, {2});
    std::vector<int> all;
    for (int i = 0; i < 20; ++i) {
      x = (*big.AddCall(add, {x}))[0];
      all.push_back(x);
    }
    auto oom = rt->dispatcher().Execute(*Lower(*big.Build(all)).value(), {ProgramArg{nullptr, v, DType::kF64, {2}}});
    EXPECT_EQ(oom.status().code(), absl::StatusCode::kResourceExhausted);
    rt->AwaitQuiescence();  // hangs if the dispatched nodes were never released
    EXPECT_EQ(rt->scheduler(0).num_in_flight(), 0);
  }
}

// Shutdown() with 10 s of simulated work queued returns at once: the running
// gang's simulated time ends, the queued gangs are cancelled, and later calls
// are refused; finished results stay readable.
TEST_P(RuntimeTest, ShutdownCancelsQueuedWorkPromptly) {
  auto rt = MakeRuntime(GetParam());
  auto slice = *rt->resource_manager().AddSlice(2, "tpu");
  FunctionBuilder b("slow", "i");
  const int32_t x = b.Parameter(DType::kF64, {});
  auto ir = *b.Build({*b.SimulatedCompute(x, /*duration_ns=*/100'000'000)});
  auto fn = *CompiledFunction::Create(*FunctionExecutable::Compile(ir), testing::AllOf(slice), &rt->registry());
  ProgramBuilder pb("chain");
  int v = *pb.AddArg(DType::kF64, {2});
  for (int i = 0; i < 100; ++i) v = (*pb.AddCall(fn, {v}))[0];
  auto chain = *Lower(*pb.Build({v}));
  std::vector<std::shared_ptr<VirtualSlice>> slices;
  auto fast = *Lower(testing::Figure2(rt->resource_manager(), 2, &slices));
  const double in[] = {1.0, 2.0};
  auto done = *rt->Execute(*fast, {ProgramArg{nullptr, in, DType::kF64, {2}}});
  ASSERT_TRUE(done[0]->Await().ok());
  auto outs = *rt->Execute(*chain, {ProgramArg{nullptr, in, DType::kF64, {2}}});

  const int64_t start = NowNanos();
  rt->Shutdown();
  EXPECT_LT(NowNanos() - start, 2'000'000'000);  // not the 10 s queued
  EXPECT_TRUE(rt->is_shut_down());
  ASSERT_TRUE(outs[0]->IsDone());
  EXPECT_EQ(outs[0]->status().code(), absl::StatusCode::kCancelled) << outs[0]->status();
  EXPECT_TRUE(absl::StrContains(outs[0]->status().message(), "shut down")) << outs[0]->status();
  EXPECT_EQ(Values(*done[0]), (std::vector<double>{3.0, 5.0}));
  EXPECT_EQ(rt->Execute(*fast, {ProgramArg{nullptr, in, DType::kF64, {2}}}).status().code(),
            absl::StatusCode::kCancelled);
  EXPECT_EQ(rt->DevicePut(DType::kF64, {2}, in, slice->devices()).status().code(), absl::StatusCode::kCancelled);
  rt->Shutdown();  // idempotent
}

// A device fails under a program: the gang in its simulated time fails at
// once, its dependents fail without running (the last one would take 100 s),
// the error names the device, and other devices keep working.
TEST_P(RuntimeTest, FailedDeviceFailsItsWorkAndItsDependentsPromptly) {
  auto rt = MakeRuntime(GetParam());
  auto slice = *rt->resource_manager().AddSlice(2, "tpu");
  auto other = *rt->resource_manager().AddSlice(2, "tpu");
  auto slow = [&](int64_t ns, const std::shared_ptr<VirtualSlice>& on) {
    FunctionBuilder b("slow", "i");
    const int32_t x = b.Parameter(DType::kF64, {});
    auto ir = *b.Build({*b.SimulatedCompute(x, ns)});
    return *CompiledFunction::Create(*FunctionExecutable::Compile(ir), testing::AllOf(on), &rt->registry());
  };
  auto first = slow(100'000'000'000, slice);  // 100 s
  auto moved = slow(100'000'000'000, other);  // its input is transferred to another slice
  ProgramBuilder pb("chain");
  const int v = *pb.AddArg(DType::kF64, {2});
  const int a = (*pb.AddCall(first, {v}))[0];
  const int b = (*pb.AddCall(first, {a}))[0];
  const int c = (*pb.AddCall(moved, {b}))[0];
  auto chain = *Lower(*pb.Build({a, c}));
  const double in[] = {1.0, 2.0};
  auto outs = *rt->Execute(*chain, {ProgramArg{nullptr, in, DType::kF64, {2}}});
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // `a` is in its simulated time
  EXPECT_FALSE(outs[0]->IsDone());
  Device* victim = slice->devices()->devices()[1];
  rt->FailDevices({victim});
  EXPECT_TRUE(victim->failed());
  for (const auto& out : outs) {
    absl::Status s = out->Await();
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), absl::StrCat("device ", victim->id()))) << s;
  }
  EXPECT_TRUE(absl::StrContains(outs[0]->status().message(), "'slow' in program 'chain' failed")) << outs[0]->status();
  // The other slice still computes (Figure 2 on fresh slices of the other island).
  std::vector<std::shared_ptr<VirtualSlice>> slices;
  auto fig2 = *Lower(testing::Figure2(rt->resource_manager(), 2, &slices));
  for (const auto& s : slices) ASSERT_EQ(s->devices()->FailedDevice(), nullptr);
  auto ok = *rt->Execute(*fig2, {ProgramArg{nullptr, in, DType::kF64, {2}}});
  ASSERT_TRUE(ok[0]->Await().ok()) << ok[0]->status();
  EXPECT_EQ(Values(*ok[0]), (std::vector<double>{3.0, 5.0}));
  rt->AwaitQuiescence();
}

// Paper §4.1: after a remap, the same lowered program runs on the slice's
// new devices (re-lowered once, not recompiled), and its results are right.
TEST_P(RuntimeTest, ARemappedSlicesProgramsRunOnItsNewDevices) {
  auto rt = MakeRuntime(GetParam());
  std::vector<std::shared_ptr<VirtualSlice>> slices;
  auto lowered = *Lower(testing::Figure2(rt->resource_manager(), 2, &slices));
  const double in[] = {1.0, 2.0};
  auto before = *rt->Execute(*lowered, {ProgramArg{nullptr, in, DType::kF64, {2}}});
  ASSERT_TRUE(before[0]->Await().ok());
  const DeviceList* old_b = slices[1]->devices();
  EXPECT_EQ(before[0]->devices(), old_b);
  ASSERT_EQ(lowered->Current().value(), lowered.get());  // nothing remapped yet

  Device* victim = old_b->devices()[0];
  rt->FailDevices({victim});
  // Without a remap, the program fails on the failed device.
  auto failing = *rt->Execute(*lowered, {ProgramArg{nullptr, in, DType::kF64, {2}}});
  EXPECT_EQ(failing[0]->Await().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(failing[1]->Await().ok()) << failing[1]->status();  // z never touches slice b

  auto remap = rt->resource_manager().Remap(slices[1].get());
  ASSERT_TRUE(remap.ok()) << remap.status();
  EXPECT_EQ(remap->moved, (std::vector<int>{0}));
  EXPECT_EQ(slices[1]->devices()->FailedDevice(), nullptr);
  auto current = lowered->Current();
  ASSERT_TRUE(current.ok()) << current.status();
  EXPECT_NE(*current, lowered.get());
  EXPECT_EQ(lowered->Current().value(), *current);  // lowered once, then kept
  auto after = *rt->Execute(*lowered, {ProgramArg{nullptr, in, DType::kF64, {2}}});
  ASSERT_TRUE(after[0]->Await().ok()) << after[0]->status();
  ASSERT_TRUE(after[1]->Await().ok()) << after[1]->status();
  EXPECT_EQ(Values(*after[0]), (std::vector<double>{3.0, 5.0}));
  EXPECT_EQ(Values(*after[1]), (std::vector<double>{2.0, 4.0}));
  EXPECT_EQ(after[0]->devices(), slices[1]->devices());
  EXPECT_NE(after[0]->devices(), old_b);
  // An argument still on the old devices' healthy part is copied over.
  auto again = *rt->Execute(*lowered, {ProgramArg{after[1], nullptr, DType::kF64, {2}}});
  ASSERT_TRUE(again[0]->Await().ok()) << again[0]->status();
  EXPECT_EQ(Values(*again[0]), (std::vector<double>{5.0, 9.0}));
  rt->AwaitQuiescence();
}

// Failing a device right after dispatch, while its gang may be between its
// device check and entering its simulated time: the gang must still fail at
// once (it once waited out its 100 s here, in about 1 run in 5).
TEST_P(RuntimeTest, DeviceFailingAsItsGangStartsFailsItPromptly) {
  for (int run = 0; run < 30; ++run) {
    auto rt = MakeRuntime(GetParam());
    auto slice = *rt->resource_manager().AddSlice(2, "tpu");
    FunctionBuilder b("slow", "i");
    const int32_t x = b.Parameter(DType::kF64, {});
    auto ir = *b.Build({*b.SimulatedCompute(x, 100'000'000'000)});
    auto fn = *CompiledFunction::Create(*FunctionExecutable::Compile(ir), testing::AllOf(slice), &rt->registry());
    ProgramBuilder pb("one");
    const int v = *pb.AddArg(DType::kF64, {2});
    auto program = *Lower(*pb.Build({(*pb.AddCall(fn, {v}))[0]}));
    const double in[] = {1.0, 2.0};
    auto outs = *rt->Execute(*program, {ProgramArg{nullptr, in, DType::kF64, {2}}});
    if (run % 2 == 1) std::this_thread::sleep_for(std::chrono::microseconds(run * 10));
    rt->FailDevices({slice->devices()->devices()[0]});
    EXPECT_EQ(outs[0]->Await().code(), absl::StatusCode::kUnavailable) << "run " << run;
  }
}

// Programs for the diagnosis tests: "hold" runs 'slow' (an hour of simulated
// compute) on slice a; "after" runs 'first' on slice a, then 'second' on
// slice b (another island) with first's output copied over DCN.
struct HangPrograms {
  std::shared_ptr<VirtualSlice> a, b;
  std::shared_ptr<const LoweredProgram> hold, after;
};

HangPrograms MakeHangPrograms(Runtime& rt) {
  HangPrograms p;
  p.a = *rt.resource_manager().AddSlice(2, "tpu");
  p.b = *rt.resource_manager().AddSlice(2, "tpu");
  EXPECT_NE(p.a->island(), p.b->island());
  FunctionBuilder b("slow", "i");
  const int32_t x = b.Parameter(DType::kF64, {});
  auto ir = *b.Build({*b.SimulatedCompute(x, kMaxSimulatedNs)});
  auto slow = *CompiledFunction::Create(*FunctionExecutable::Compile(ir), testing::AllOf(p.a), &rt.registry());
  ProgramBuilder hold("hold");
  int v = *hold.AddArg(DType::kF64, {2});
  p.hold = *Lower(*hold.Build({(*hold.AddCall(slow, {v}))[0]}));
  auto first = testing::ScalarOpFunction("first", OpKind::kAdd, 1.0, p.a, &rt.registry());
  auto second = testing::ScalarOpFunction("second", OpKind::kMul, 2.0, p.b, &rt.registry());
  ProgramBuilder after("after");
  v = *after.AddArg(DType::kF64, {2});
  v = (*after.AddCall(first, {v}))[0];
  p.after = *Lower(*after.Build({(*after.AddCall(second, {v}))[0]}));
  return p;
}

const WaitingGang* FindWaiting(const Diagnosis& d, const std::string& node) {
  for (const WaitingGang& w : d.waiting) {
    if (w.gang.node == node) return &w;
  }
  return nullptr;
}

// Real programs: the gang queued behind another program's running gang names
// it; the gang on another island waiting for a copy of its input names the
// input's producer. Shutdown() ends the hour of simulated time at once.
TEST_P(RuntimeTest, DiagnoseNamesBlockersAndProducers) {
  auto rt = MakeRuntime(GetParam());
  HangPrograms p = MakeHangPrograms(*rt);
  SchedulingClient* tenant = *rt->CreateClient("tenant", 1.0);
  const double in[] = {1.0, 2.0};
  auto held = *rt->Execute(*p.hold, {ProgramArg{nullptr, in, DType::kF64, {2}}});
  ExecuteOptions options;
  options.client = tenant;
  auto outs = *rt->Execute(*p.after, {ProgramArg{nullptr, in, DType::kF64, {2}}}, options);
  Diagnosis d;
  const WaitingGang* first = nullptr;
  // The hold gang may take a moment to be running; wait for it (generously).
  for (int i = 0; i < 3000; ++i) {
    d = rt->Diagnose();
    first = FindWaiting(d, "first");
    if (first != nullptr && !first->blocked_by.empty() && first->blocked_by[0].gang.state == GangState::kRunning) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_NE(first, nullptr) << d.ToString();
  EXPECT_EQ(first->gang.program, "after");
  EXPECT_EQ(first->gang.client, "tenant");
  EXPECT_EQ(first->gang.devices, p.a->devices());
  EXPECT_EQ(first->gang.state, GangState::kQueued);
  ASSERT_EQ(first->blocked_by.size(), 1u) << d.ToString();
  EXPECT_EQ(first->blocked_by[0].gang.node, "slow");
  EXPECT_EQ(first->blocked_by[0].gang.program, "hold");
  EXPECT_EQ(first->blocked_by[0].gang.client, "default");
  EXPECT_EQ(first->blocked_by[0].gang.state, GangState::kRunning);
  EXPECT_EQ(first->blocked_by[0].device_ids.size(), 2u);

  const WaitingGang* second = FindWaiting(d, "second");
  ASSERT_NE(second, nullptr) << d.ToString();
  EXPECT_EQ(second->gang.island, p.b->island()->id());
  EXPECT_EQ(second->gang.state, GangState::kHoldingDevices);
  EXPECT_TRUE(second->blocked_by.empty());
  ASSERT_EQ(second->inputs.size(), 1u);
  EXPECT_TRUE(second->inputs[0].copy);
  ASSERT_TRUE(second->inputs[0].producer.has_value()) << d.ToString();
  EXPECT_EQ(second->inputs[0].producer->node, "first");
  EXPECT_EQ(second->inputs[0].producer->program, "after");
  EXPECT_NE(d.ToString().find("not ready: a copy of the output of 'first' of program 'after', client 'tenant'"),
            std::string::npos)
      << d.ToString();
  rt->Shutdown();
  EXPECT_TRUE(rt->Diagnose().waiting.empty());
}

INSTANTIATE_TEST_SUITE_P(ExecutorThreads, RuntimeTest, ::testing::Values(1, 2, 4));

// The watchdog reports nothing while nothing waits, then each gang that
// cannot start once; Shutdown() stops it.
TEST(RuntimeHangWatchdogTest, ReportsEachGangThatCannotStartOnce) {
  TopologyOptions options;
  options.hang_report_ns = 50'000'000;
  auto rt = *Runtime::Create(options);
  ASSERT_NE(rt->hang_watchdog(), nullptr);
  HangPrograms p = MakeHangPrograms(*rt);
  const double in[] = {1.0, 2.0};
  auto held = *rt->Execute(*p.hold, {ProgramArg{nullptr, in, DType::kF64, {2}}});
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // only a running gang
  EXPECT_FALSE(rt->hang_watchdog()->has_report());
  auto outs = *rt->Execute(*p.after, {ProgramArg{nullptr, in, DType::kF64, {2}}});
  // Both of after's gangs cannot start: collect reports until both came,
  // then a while longer.
  std::map<std::string, int> reported;
  int64_t both_at = 0;
  for (int i = 0; i < 3000; ++i) {
    while (std::optional<Diagnosis> report = rt->hang_watchdog()->TakeReport()) {
      for (const WaitingGang& w : report->waiting) reported[w.gang.node]++;
    }
    if (both_at == 0 && reported.size() == 2) both_at = NowNanos();
    if (both_at != 0 && NowNanos() - both_at > 300'000'000) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(reported, (std::map<std::string, int>{{"first", 1}, {"second", 1}}));
  rt->Shutdown();
  EXPECT_FALSE(rt->hang_watchdog()->has_report());
}

TEST(RuntimeHangWatchdogTest, ZeroTurnsTheWatchdogOff) {
  TopologyOptions options;
  options.hang_report_ns = 0;
  EXPECT_EQ((*Runtime::Create(options))->hang_watchdog(), nullptr);
}

}  // namespace
}  // namespace pw
