#include "csrc/codegen/fused_region.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "csrc/base/parallel_for.h"
#include "csrc/codegen/native_compiler.h"
#include "csrc/executor/worker_pool.h"
#include "csrc/kernels/function_executable.h"
#include "gtest/gtest.h"

namespace pw::codegen {
namespace {

// Every function compiles natively at once (before any run), so a test can
// wait for its native code; the cache is ctest's (or a fresh one).
const bool kEnvironment = [] {
  setenv("PATHWAYS_NATIVE_AFTER_RUNS", "0", 1);
  if (std::getenv("PATHWAYS_KERNEL_CACHE") == nullptr) {
    setenv("PATHWAYS_KERNEL_CACHE", "/tmp/pathways-fused-region-test", 1);
  }
  return true;
}();

std::vector<uint8_t> RandomBytes(const ValueType& t, int shards, std::mt19937& rng) {
  std::vector<uint8_t> out(static_cast<size_t>(t.num_bytes() * shards));
  const int64_t n = t.num_elements() * shards;
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (int64_t i = 0; i < n; ++i) {
    if (t.dtype == DType::kF32) {
      float v = normal(rng);
      std::memcpy(out.data() + 4 * i, &v, 4);
    } else if (t.dtype == DType::kF64) {
      double v = normal(rng);
      std::memcpy(out.data() + 8 * i, &v, 8);
    } else if (t.dtype == DType::kI32) {
      int32_t v = static_cast<int32_t>(rng() % 200) - 100;
      std::memcpy(out.data() + 4 * i, &v, 4);
    }
  }
  return out;
}

// Runs `exe` over `shards` shards; the outputs' bytes.
std::vector<std::vector<uint8_t>> RunGang(const FunctionExecutable& exe, int shards,
                                      const std::vector<std::vector<uint8_t>>& inputs) {
  const FunctionIr& ir = exe.ir();
  std::vector<std::vector<uint8_t>> outs(static_cast<size_t>(ir.num_outputs()));
  std::vector<const void*> in;
  std::vector<void*> out;
  for (const auto& b : inputs) in.push_back(b.data());
  for (int i = 0; i < ir.num_outputs(); ++i) {
    outs[i].resize(static_cast<size_t>(exe.output_bytes(i) * shards));
    out.push_back(outs[i].data());
  }
  void* scratch = std::aligned_alloc(64, (exe.scratch_bytes(shards) + 63) / 64 * 64 + 64);
  exe.Run(shards, in, out, scratch);
  std::free(scratch);
  return outs;
}

// Runs `fn` as a job of an executor of `threads` threads, so that its
// kernels may split their loops over the others; returns the loops split.
int64_t RunOnExecutor(int threads, const std::function<void()>& fn) {
  WorkerPool pool(threads);
  struct Job : Runnable {
    const std::function<void()>* fn;
    std::atomic<bool> done{false};
    int64_t split = 0;
    void Run(RunContext&) override {
      (*fn)();
      split = CurrentParallelTeam()->loops_split();
      done.store(true, std::memory_order_release);
    }
  } job;
  job.fn = &fn;
  pool.Submit(&job);
  while (!job.done.load(std::memory_order_acquire)) std::this_thread::yield();
  pool.Stop();
  return job.split;
}

// Compiles `ir` twice, with native code and without; runs both on random
// inputs once the native code is loaded; the bits must be the same. With
// `executor_threads`, the native code runs on an executor of that many
// threads (its regions in blocks over them, when large enough).
void ExpectNativeMatchesInterpreter(std::shared_ptr<const FunctionIr> ir, int min_regions,
                                    std::mt19937& rng, int executor_threads = 0,
                                    int64_t* loops_split = nullptr) {
  auto native = FunctionExecutable::Compile(ir, true);
  auto interp = FunctionExecutable::Compile(ir, false);
  ASSERT_TRUE(native.ok() && interp.ok());
  ASSERT_GE((*native)->num_native_regions(), min_regions) << ir->ToText();
  ASSERT_EQ((*interp)->num_native_regions(), 0);
  if ((*native)->num_native_regions() == 0) return;
  NativeCompiler::Default().WaitIdle();
  ASSERT_TRUE((*native)->native_ready())
      << "no native code; see " << NativeCompiler::Default().options().cache_dir
      << "/*.failed.log\n"
      << ir->ToText();
  for (int shards : {1, 3}) {
    std::vector<std::vector<uint8_t>> inputs;
    for (int i = 0; i < ir->num_params(); ++i) {
      inputs.push_back(RandomBytes(ir->param_type(i), shards, rng));
    }
    const auto want = RunGang(**interp, shards, inputs);
    std::vector<std::vector<uint8_t>> got;
    if (executor_threads > 0) {
      const int64_t split =
          RunOnExecutor(executor_threads, [&] { got = RunGang(**native, shards, inputs); });
      if (loops_split != nullptr) *loops_split += split;
    } else {
      got = RunGang(**native, shards, inputs);
    }
    for (size_t k = 0; k < want.size(); ++k) {
      EXPECT_EQ(got[k], want[k]) << "output " << k << ", " << shards << " shards\n"
                                 << ir->ToText();
    }
  }
}

int32_t Scalar(FunctionBuilder& b, float v, DType dtype = DType::kF32) {
  std::vector<uint8_t> bytes(DTypeSize(dtype));
  if (dtype == DType::kF64) {
    const double d = v;
    std::memcpy(bytes.data(), &d, 8);
  } else {
    std::memcpy(bytes.data(), &v, 4);
  }
  return *b.Constant(dtype, {}, bytes);
}

// x - max(x), exp, / sum over the last axis, as JAX writes it.
std::shared_ptr<const FunctionIr> Softmax(int64_t rows, int64_t cols) {
  FunctionBuilder b("softmax", "");
  const int32_t x = b.Parameter(DType::kF32, {rows, cols});
  const std::vector<int64_t> last = {1};
  const int32_t m = *b.Reduce(ReduceKind::kMax, x, &last, false);
  const int32_t m1 = *b.BroadcastTo(*b.Reshape(m, {rows, 1}), {rows, cols});
  const int32_t e = *b.Unary(OpKind::kExp, *b.Binary(OpKind::kSub, x, m1));
  const int32_t s = *b.Reduce(ReduceKind::kSum, e, &last, false);
  const int32_t s1 = *b.BroadcastTo(*b.Reshape(s, {rows, 1}), {rows, cols});
  return *b.Build({*b.Binary(OpKind::kDiv, e, s1)});
}

// Layer norm with gamma and beta, and the residual sum before it.
std::shared_ptr<const FunctionIr> LayerNorm(int64_t rows, int64_t cols) {
  FunctionBuilder b("layer_norm", "");
  const int32_t x0 = b.Parameter(DType::kF32, {rows, cols});
  const int32_t res = b.Parameter(DType::kF32, {rows, cols});
  const int32_t g = b.Parameter(DType::kF32, {cols});
  const int32_t beta = b.Parameter(DType::kF32, {cols});
  const int32_t x = *b.Binary(OpKind::kAdd, x0, res);
  const std::vector<int64_t> last = {1};
  const int32_t mean = *b.Reduce(ReduceKind::kMean, x, &last, true);
  const int32_t d = *b.Binary(OpKind::kSub, x, mean);
  const int32_t var = *b.Reduce(ReduceKind::kMean, *b.Binary(OpKind::kMul, d, d), &last, true);
  const int32_t inv = *b.Unary(OpKind::kRsqrt, *b.Binary(OpKind::kAdd, var, Scalar(b, 1e-5f)));
  const int32_t y = *b.Binary(OpKind::kMul, *b.Binary(OpKind::kMul, d, inv), g);
  return *b.Build({*b.Binary(OpKind::kAdd, y, beta), x});
}

TEST(FusedRegionTest, SoftmaxIsOneRegionWithTheInterpretersBits) {
  std::mt19937 rng(1);
  auto ir = Softmax(7, 300);
  const auto regions = PlanFusedRegions(*ir, {});
  ASSERT_EQ(regions.size(), 1u);
  EXPECT_EQ(regions[0].rows, 7);
  EXPECT_EQ(regions[0].cols, 300);
  EXPECT_EQ(regions[0].inputs.size(), 1u);   // x, read once
  EXPECT_EQ(regions[0].outputs.size(), 1u);  // the result
  ExpectNativeMatchesInterpreter(ir, 1, rng);
}

TEST(FusedRegionTest, LayerNormWithGammaBetaAndResidualIsOneRegion) {
  std::mt19937 rng(2);
  auto ir = LayerNorm(5, 64);
  const auto regions = PlanFusedRegions(*ir, {});
  ASSERT_EQ(regions.size(), 1u);
  EXPECT_EQ(regions[0].outputs.size(), 2u);  // the norm and the residual sum
  ExpectNativeMatchesInterpreter(ir, 1, rng);
}

TEST(FusedRegionTest, EmptyValuesMakeNoRegion) {
  FunctionBuilder b("empty", "");
  const int32_t x = b.Parameter(DType::kF32, {0, 4});
  const int32_t y = *b.Unary(OpKind::kExp, *b.Binary(OpKind::kMul, x, x));
  auto ir = *b.Build({*b.Binary(OpKind::kAdd, y, x)});
  EXPECT_TRUE(PlanFusedRegions(*ir, {}).empty());
  std::mt19937 rng(5);
  ExpectNativeMatchesInterpreter(ir, 0, rng);
}

// A reshape of a value from before the region, read by the region and by an
// op after it (a transpose, which no region takes): the region reads its
// operand's memory in its place, so it must not cover the reshape, or the
// reshape's own slot stays unwritten.
TEST(FusedRegionTest, AReshapeReadAfterTheRegionStaysOutOfIt) {
  FunctionBuilder b("reshapes", "");
  const int32_t x = b.Parameter(DType::kF32, {4, 16});
  const int32_t y = *b.Transpose(x, {1, 0});
  const int32_t c = *b.Reshape(y, {8, 8});
  const int32_t e = *b.Unary(OpKind::kExp, c);
  const int32_t f = *b.Binary(OpKind::kMul, e, c);
  const int32_t t = *b.Transpose(c, {1, 0});
  auto ir = *b.Build({f, t, y});
  for (const FusedRegion& region : PlanFusedRegions(*ir, {})) {
    EXPECT_TRUE(region.first > c || region.last < c) << region.source;
  }
  std::mt19937 rng(6);
  ExpectNativeMatchesInterpreter(ir, 1, rng);
}

// Random graphs of elementwise ops over [rows, cols] with full, row, column
// and scalar operands, reductions over the last axis broadcast back, and
// conversions: the native code gives the interpreter's bits.
TEST(FusedRegionTest, RandomGraphsMatchTheInterpreterBitForBit) {
  std::mt19937 rng(3);
  const OpKind binary[] = {OpKind::kAdd, OpKind::kSub, OpKind::kMul, OpKind::kDiv,
                           OpKind::kMax, OpKind::kMin, OpKind::kPow, OpKind::kAtan2};
  const OpKind unary[] = {OpKind::kExp, OpKind::kTanh, OpKind::kNeg, OpKind::kAbs, OpKind::kSin,
                          OpKind::kErf, OpKind::kTan, OpKind::kSqrt, OpKind::kLog};
  int fused = 0;
  for (int trial = 0; trial < 24; ++trial) {
    const int64_t rows = 1 + rng() % 5, cols = 1 + rng() % 700;
    const DType dt = trial % 3 == 2 ? DType::kF64 : DType::kF32;
    FunctionBuilder b("random", "");
    std::vector<int32_t> full = {b.Parameter(dt, {rows, cols}), b.Parameter(dt, {rows, cols})};
    const int32_t row = b.Parameter(dt, {rows, 1});
    const int32_t col = b.Parameter(dt, {cols});
    std::vector<int32_t> outputs;
    const int steps = 3 + static_cast<int>(rng() % 10);
    for (int s = 0; s < steps; ++s) {
      const int32_t a = full[rng() % full.size()];
      int32_t r = -1;
      switch (rng() % 6) {
        case 0:
        case 1: {
          const int32_t others[] = {full[rng() % full.size()], row, col, Scalar(b, 0.5f, dt)};
          r = *b.Binary(binary[rng() % 8], a, others[rng() % 4]);
          break;
        }
        case 2:
          r = *b.Unary(unary[rng() % 9], a);
          break;
        case 3: {
          const std::vector<int64_t> last = {1};
          const ReduceKind kinds[] = {ReduceKind::kSum, ReduceKind::kMax, ReduceKind::kMean,
                                      ReduceKind::kMin};
          const int32_t red = *b.Reduce(kinds[rng() % 4], a, &last, true);
          r = *b.Binary(OpKind::kSub, a, *b.BroadcastTo(red, {rows, cols}));
          break;
        }
        case 4: {
          const int32_t c = *b.Binary(OpKind::kGt, a, full[rng() % full.size()]);
          r = *b.Select(c, a, *b.Unary(OpKind::kNeg, a));
          break;
        }
        default:
          r = *b.Convert(*b.Convert(a, dt == DType::kF32 ? DType::kF64 : DType::kF32), dt);
      }
      full.push_back(r);
      if (rng() % 3 == 0) outputs.push_back(r);
    }
    outputs.push_back(full.back());
    auto ir = b.Build(outputs);
    ASSERT_TRUE(ir.ok()) << ir.status();
    SCOPED_TRACE(testing::Message() << "trial " << trial);
    fused += PlanFusedRegions(**ir, {}).empty() ? 0 : 1;
    ExpectNativeMatchesInterpreter(*ir, 0, rng);
  }
  EXPECT_GE(fused, 20);  // the planner takes (almost) every such graph
}

// Regions large enough to be cut into blocks over the executor's threads:
// by rows (softmax, layer norm), by columns (one long row), by single rows
// (an output with an element per column keeps rows from being grouped), and
// random graphs as above but larger. The blocks give the bits of one call.
TEST(FusedRegionTest, BlocksOnTheExecutorThreadsGiveTheInterpretersBits) {
  std::mt19937 rng(7);
  int64_t split = 0;
  ExpectNativeMatchesInterpreter(Softmax(300, 1024), 1, rng, 2, &split);
  ExpectNativeMatchesInterpreter(LayerNorm(257, 515), 1, rng, 3, &split);
  {
    FunctionBuilder b("long_row", "");
    const int32_t x = b.Parameter(DType::kF32, {1, 300001});
    const int32_t y = b.Parameter(DType::kF32, {1, 300001});
    const int32_t t = *b.Unary(OpKind::kTanh, *b.Binary(OpKind::kAdd, *b.Binary(OpKind::kMul, x, Scalar(b, 2.0f)), y));
    ExpectNativeMatchesInterpreter(*b.Build({*b.Binary(OpKind::kMul, t, x)}), 1, rng, 2, &split);
  }
  {
    FunctionBuilder b("column_output", "");
    const int32_t x = b.Parameter(DType::kF32, {400, 300});
    const int32_t g = b.Parameter(DType::kF32, {300});
    const int32_t g2 = *b.Unary(OpKind::kExp, *b.Binary(OpKind::kMul, g, Scalar(b, 0.5f)));
    const int32_t y = *b.Binary(OpKind::kMul, *b.Unary(OpKind::kTanh, x), g2);
    auto ir = *b.Build({y, g2});
    const auto regions = PlanFusedRegions(*ir, {});
    ASSERT_FALSE(regions.empty());
    EXPECT_FALSE(regions.back().split_rows);  // g2 is written by every row
    ExpectNativeMatchesInterpreter(ir, 1, rng, 2, &split);
  }
  for (int trial = 0; trial < 6; ++trial) {
    const int64_t rows = 1 + rng() % 300, cols = 256 + rng() % 3000;
    FunctionBuilder b("random_large", "");
    const int32_t x = b.Parameter(DType::kF32, {rows, cols});
    const int32_t row = b.Parameter(DType::kF32, {rows, 1});
    const std::vector<int64_t> last = {1};
    const int32_t m = *b.Reduce(trial % 2 ? ReduceKind::kMax : ReduceKind::kSum, x, &last, true);
    const int32_t d = *b.Binary(OpKind::kSub, x, *b.BroadcastTo(m, {rows, cols}));
    const int32_t e = *b.Unary(OpKind::kExp, *b.Binary(OpKind::kMul, d, row));
    auto ir = *b.Build({e, m});
    SCOPED_TRACE(testing::Message() << "trial " << trial << ": " << rows << " x " << cols);
    ExpectNativeMatchesInterpreter(ir, 1, rng, 2, &split);
  }
  EXPECT_GT(split, 0);  // the blocks ran through the executor's team
}

// A compiler of the test's own, over a fresh directory.
struct TempCache {
  TempCache() {
    char tmpl[] = "/tmp/pw-native-cache-XXXXXX";
    dir = mkdtemp(tmpl);
  }
  ~TempCache() { std::system(("rm -rf " + dir).c_str()); }
  NativeOptions Options() const {
    NativeOptions o;
    o.cache_dir = dir;
    return o;
  }
  std::string dir;
};

std::string SoftmaxSource() {
  auto regions = PlanFusedRegions(*Softmax(4, 100), {});
  return EmitNativeSource(regions);
}

TEST(NativeCompilerTest, CompilesOnceThenHitsTheCacheAndRebuildsACorruptOrStaleEntry) {
  TempCache cache;
  const std::string source = SoftmaxSource();
  uint64_t key;
  {
    NativeCompiler compiler(cache.Options());
    key = compiler.KeyOf(source);
    auto lib = compiler.Compile(source, 1);
    ASSERT_TRUE(lib.ok()) << lib.status();
    EXPECT_EQ((*lib)->regions().size(), 1u);
    EXPECT_EQ(compiler.stats().compiled, 1);
  }
  char name[32];
  std::snprintf(name, sizeof(name), "/%016llx.so", static_cast<unsigned long long>(key));
  const std::string so = cache.dir + name;
  {
    NativeCompiler compiler(cache.Options());  // a second process, as it were
    auto lib = compiler.Compile(source, 1);
    ASSERT_TRUE(lib.ok()) << lib.status();
    EXPECT_EQ(compiler.stats().cache_hits, 1);
    EXPECT_EQ(compiler.stats().compiled, 0);
  }
  {
    std::ofstream(so, std::ios::trunc) << "not a shared library";
    NativeCompiler compiler(cache.Options());
    auto lib = compiler.Compile(source, 1);
    ASSERT_TRUE(lib.ok()) << lib.status();
    EXPECT_EQ(compiler.stats().rebuilt, 1);
  }
  {
    // Another source's library under this source's name (a stale entry).
    NativeCompiler compiler(cache.Options());
    const std::string other = source + "\n// another\n";
    ASSERT_TRUE(compiler.Compile(other, 1).ok());
    char other_name[32];
    std::snprintf(other_name, sizeof(other_name), "/%016llx.so",
                  static_cast<unsigned long long>(compiler.KeyOf(other)));
    ASSERT_EQ(std::rename((cache.dir + other_name).c_str(), so.c_str()), 0);
    auto lib = compiler.Compile(source, 1);
    ASSERT_TRUE(lib.ok()) << lib.status();
    EXPECT_EQ(compiler.stats().rebuilt, 1);
  }
}

TEST(NativeCompilerTest, NoCompilerIsAFailedCompileNotACrash) {
  TempCache cache;
  NativeOptions o = cache.Options();
  o.compiler = "/nonexistent/c++";
  NativeCompiler compiler(o);
  auto lib = compiler.Compile(SoftmaxSource(), 1);
  EXPECT_EQ(lib.status().code(), absl::StatusCode::kFailedPrecondition) << lib.status();
  EXPECT_EQ(compiler.stats().failed, 1);
}

TEST(NativeCompilerTest, OffMeansNoCompile) {
  TempCache cache;
  NativeOptions o = cache.Options();
  o.enabled = false;
  NativeCompiler compiler(o);
  EXPECT_FALSE(compiler.Compile(SoftmaxSource(), 1).ok());
}

// Runs on two threads while the native code is compiled and swapped in:
// every result is the interpreter's.
TEST(FusedRegionTest, SwapFromInterpreterToNativeMidRun) {
  // A shape of its own, so its source is not in the cache yet.
  auto ir = LayerNorm(9, 77 + static_cast<int64_t>(getpid() % 50));
  auto interp = FunctionExecutable::Compile(ir, false);
  std::mt19937 rng(4);
  std::vector<std::vector<uint8_t>> inputs;
  for (int i = 0; i < ir->num_params(); ++i) inputs.push_back(RandomBytes(ir->param_type(i), 2, rng));
  const auto want = RunGang(**interp, 2, inputs);
  auto native = FunctionExecutable::Compile(ir, true);
  ASSERT_TRUE(native.ok());
  std::atomic<bool> done{false};
  std::atomic<int> runs{0}, mismatches{0}, native_runs{0};
  auto worker = [&] {
    while (!done.load()) {
      const bool ready = (*native)->native_ready();
      if (RunGang(**native, 2, inputs) != want) ++mismatches;
      ++runs;
      if (ready) ++native_runs;
    }
  };
  std::thread t1(worker), t2(worker);
  NativeCompiler::Default().WaitIdle();
  while (native_runs.load() < 20) std::this_thread::yield();
  done = true;
  t1.join();
  t2.join();
  EXPECT_TRUE((*native)->native_ready());
  EXPECT_EQ(mismatches.load(), 0) << "of " << runs.load() << " runs";
}

}  // namespace
}  // namespace pw::codegen
