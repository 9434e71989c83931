#include "csrc/program_ir/lowering.h"

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "csrc/program_ir/testing_programs.h"
#include "gtest/gtest.h"

namespace pw {
namespace {

int CountLines(const std::string& text, absl::string_view needle) {
  int n = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) n += absl::StrContains(line, needle);
  return n;
}

class LoweringTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cluster_ = *Cluster::Create(TopologyOptions{});  // 2 islands x 8 devices
    rm_ = std::make_unique<ResourceManager>(cluster_.get(), &registry_);
  }
  std::unique_ptr<Cluster> cluster_;
  DeviceListRegistry registry_;
  std::unique_ptr<ResourceManager> rm_;
};

TEST_F(LoweringTest, Figure2HasOneNodePerCallWhateverTheShardCount) {
  for (int n : {2, 8}) {
    std::vector<std::shared_ptr<VirtualSlice>> slices;
    auto ir = testing::Figure2(*rm_, n, &slices);
    EXPECT_EQ(ir->num_nodes(), 4);
    EXPECT_EQ(CountLines(ir->ToText(), " = call @"), 4) << ir->ToText();
    auto lowered = Lower(ir);
    ASSERT_TRUE(lowered.ok()) << lowered.status();
    EXPECT_EQ((*lowered)->num_compute_steps(), 4);
    // With 2 devices, x flows a -> b (island 1) and a -> c (other devices of
    // island 0), and c's output flows back to a's devices. With 8 devices, c's
    // slice lands on the same physical devices as a's: only a -> b moves data.
    const int transfers = n == 2 ? 3 : 1;
    EXPECT_EQ((*lowered)->num_transfer_steps(), transfers) << (*lowered)->ToText();
    EXPECT_EQ(static_cast<int>((*lowered)->steps().size()), 4 + transfers);
    EXPECT_EQ((*lowered)->arg_placements().size(), 1u);
  }
}

TEST_F(LoweringTest, Figure2CrossesIslandsOverDcn) {
  std::vector<std::shared_ptr<VirtualSlice>> slices;
  auto ir = testing::Figure2(*rm_, 2, &slices);
  ASSERT_EQ(slices[0]->island()->id(), 0);
  ASSERT_EQ(slices[1]->island()->id(), 1);
  ASSERT_EQ(slices[2]->island()->id(), 0);
  auto lowered = *Lower(ir);
  const std::string text = lowered->ToText();
  EXPECT_EQ(CountLines(text, "transfer.dcn"), 1) << text;  // a -> b
  EXPECT_EQ(CountLines(text, "transfer.ici"), 2) << text;  // a -> c, c -> a
}

TEST_F(LoweringTest, SameDevicesNeedNoTransferAndChainsStayCompact) {
  auto slice = *rm_->AddSlice(8, "tpu");
  auto add = testing::ScalarOpFunction("add", OpKind::kAdd, 1.0, slice, &registry_, DType::kF32, {}, true);
  ProgramBuilder pb("chain");
  int v = *pb.AddArg(DType::kF32, {8});
  for (int i = 0; i < 128; ++i) v = (*pb.AddCall(add, {v}))[0];
  auto lowered = *Lower(*pb.Build({v}));
  EXPECT_EQ(lowered->num_compute_steps(), 128);
  EXPECT_EQ(lowered->num_transfer_steps(), 0);
  EXPECT_EQ(lowered->num_slots(), 129);
}

// The paper's scale (§5.1, configuration A): lowering is per node, not per
// shard, however many devices a slice has.
TEST(LoweringAtScaleTest, ChainOver2048DevicesHas128ComputeSteps) {
  TopologyOptions options;
  options.num_islands = 1;
  options.hosts_per_island = 512;
  options.devices_per_host = 4;
  auto cluster = *Cluster::Create(options);
  DeviceListRegistry registry;
  ResourceManager rm(cluster.get(), &registry);
  auto slice = *rm.AddSlice(2048, "tpu");
  auto step = testing::ScalarOpFunction("step", OpKind::kAdd, 1.0, slice, &registry, DType::kF32, {}, true);
  ProgramBuilder pb("chain");
  int v = *pb.AddArg(DType::kF32, {2048});
  for (int i = 0; i < 128; ++i) v = (*pb.AddCall(step, {v}))[0];
  auto ir = *pb.Build({v});
  auto lowered = *Lower(ir);
  EXPECT_EQ(ir->num_nodes(), 128);
  EXPECT_EQ(lowered->num_compute_steps(), 128);
  EXPECT_EQ(lowered->num_transfer_steps(), 0);
  EXPECT_EQ(lowered->steps().size(), 128u);
  EXPECT_EQ(lowered->num_slots(), 129);  // one per value, not per shard
  EXPECT_EQ(lowered->arg_placements().size(), 1u);
  for (const LoweredStep& s : lowered->steps()) EXPECT_EQ(s.devices->size(), 2048);
}

TEST_F(LoweringTest, ArgumentUsedOnTwoSlicesIsPlacedTwiceOnce) {
  auto s0 = *rm_->AddSlice(2, "tpu");
  auto s1 = *rm_->AddSlice(2, "tpu");
  auto f = testing::ScalarOpFunction("f", OpKind::kMul, 3.0, s0, &registry_);
  auto g = testing::ScalarOpFunction("g", OpKind::kMul, 5.0, s1, &registry_);
  ProgramBuilder pb("p");
  const int v = *pb.AddArg(DType::kF64, {2});
  const int a = (*pb.AddCall(f, {v}))[0];
  const int b = (*pb.AddCall(g, {v}))[0];
  const int c = (*pb.AddCall(f, {v}))[0];
  auto lowered = *Lower(*pb.Build({a, b, c}));
  EXPECT_EQ(lowered->arg_placements().size(), 2u);
}

TEST_F(LoweringTest, ErrorsNameTheProblem) {
  auto slice = *rm_->AddSlice(2, "tpu");
  auto f = testing::ScalarOpFunction("f", OpKind::kMul, 3.0, slice, &registry_);
  ProgramBuilder pb("p");
  const int v3 = *pb.AddArg(DType::kF64, {3});
  auto bad = pb.AddCall(f, {v3});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(bad.status().message()),
            "pmap of 'f' over 2 devices got leading axis of size 3 for argument 0");
  auto arity = pb.AddCall(f, {v3, v3});
  EXPECT_EQ(std::string(arity.status().message()), "'f' takes 1 arguments, got 2");
  ProgramBuilder pb2("q");
  const int w = *pb2.AddArg(DType::kF64, {2});
  auto passthrough = Lower(*pb2.Build({w}));
  EXPECT_EQ(passthrough.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(LoweringTest, CompiledFunctionRejectsDevicesItCannotGang) {
  auto s0 = *rm_->AddSlice(2, "tpu");  // island 0
  auto s1 = *rm_->AddSlice(2, "tpu");  // island 1
  FunctionBuilder b("f", "");
  auto ir = *b.Build({b.Parameter(DType::kF32, {})});
  auto exe = *FunctionExecutable::Compile(ir);
  auto across = CompiledFunction::Create(exe, {VirtualDevice{s0, 0}, VirtualDevice{s1, 0}}, &registry_);
  EXPECT_EQ(across.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(across.status().message(), "span islands")) << across.status();
  auto twice = CompiledFunction::Create(exe, {VirtualDevice{s0, 1}, VirtualDevice{s0, 1}}, &registry_);
  EXPECT_EQ(twice.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(twice.status().message(), "distinct physical devices")) << twice.status();
}

// Intermediates count against device memory: a function whose scratch
// cannot fit is refused at placement, before it could exhaust host memory.
TEST_F(LoweringTest, CompiledFunctionRejectsIntermediatesLargerThanDeviceMemory) {
  auto slice = *rm_->AddSlice(2, "tpu");  // devices of 1 GiB
  FunctionBuilder b("huge", "i");
  const int32_t x = b.Parameter(DType::kF32, {});
  const int32_t big = *b.BroadcastTo(x, {1 << 16, 1 << 14});  // 4 GiB, then summed away
  const std::vector<int64_t> all = {0, 1};
  auto ir = *b.Build({*b.Reduce(ReduceKind::kSum, big, &all, false)});
  auto placed = CompiledFunction::Create(*FunctionExecutable::Compile(ir), testing::AllOf(slice), &registry_);
  EXPECT_EQ(placed.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(placed.status().message(), "'huge' needs 42949")) << placed.status();
}

}  // namespace
}  // namespace pw
