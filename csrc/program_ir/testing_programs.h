#ifndef PATHWAYS_PROGRAM_IR_TESTING_PROGRAMS_H_
#define PATHWAYS_PROGRAM_IR_TESTING_PROGRAMS_H_

// Test-only builders of small compiled functions and programs, shared by the
// lowering and runtime tests. Aborts the test on any error.

#include <memory>
#include <string>

#include "csrc/program_ir/program_ir.h"
#include "gtest/gtest.h"

namespace pw::testing {

// Virtual devices 0..n-1 of `slice`.
inline std::vector<VirtualDevice> AllOf(const std::shared_ptr<VirtualSlice>& slice) {
  std::vector<VirtualDevice> devices;
  for (int i = 0; i < slice->size(); ++i) devices.push_back(VirtualDevice{slice, i});
  return devices;
}

// pmap(lambda x: x <op> c) over `slice`, for per-shard shape `dims`; when
// `with_psum`, the result is psum'd over the axis "i" afterwards.
inline std::shared_ptr<const CompiledFunction> ScalarOpFunction(const std::string& name, OpKind op, double c,
                                                                const std::shared_ptr<VirtualSlice>& slice,
                                                                DeviceListRegistry* registry, DType dtype = DType::kF64,
                                                                Dims dims = {}, bool with_psum = false) {
  FunctionBuilder b(name, "i");
  const int32_t x = b.Parameter(dtype, dims);
  std::vector<uint8_t> bytes(DTypeSize(dtype));
  if (dtype == DType::kF64) {
    std::memcpy(bytes.data(), &c, 8);
  } else {
    const float f = static_cast<float>(c);
    std::memcpy(bytes.data(), &f, 4);
  }
  int32_t y = *b.Binary(op, x, *b.Constant(dtype, {}, bytes));
  if (with_psum) y = *b.Psum(y, "i");
  auto ir = b.Build({y});
  EXPECT_TRUE(ir.ok()) << ir.status();
  auto exe = FunctionExecutable::Compile(*ir);
  EXPECT_TRUE(exe.ok()) << exe.status();
  auto fn = CompiledFunction::Create(*exe, AllOf(slice), registry);
  EXPECT_TRUE(fn.ok()) << fn.status();
  return *fn;
}

// Figure 2 of the paper with slices of `n` devices from `rm`:
//   x = a(v); y = b(x); z = a(c(x)); return (y, z)
// with a = x * 2, b = x + 1, c = x / 2. The slices are returned through
// `slices` so the caller can keep them alive.
inline std::shared_ptr<const ProgramIr> Figure2(ResourceManager& rm, int n,
                                                std::vector<std::shared_ptr<VirtualSlice>>* slices) {
  for (int i = 0; i < 3; ++i) slices->push_back(*rm.AddSlice(n, "tpu"));
  auto a = ScalarOpFunction("a", OpKind::kMul, 2.0, (*slices)[0], rm.registry());
  auto b = ScalarOpFunction("b", OpKind::kAdd, 1.0, (*slices)[1], rm.registry());
  auto c = ScalarOpFunction("c", OpKind::kDiv, 2.0, (*slices)[2], rm.registry());
  ProgramBuilder pb("f");
  const int v = *pb.AddArg(DType::kF64, {n});
  const int x = (*pb.AddCall(a, {v}))[0];
  const int y = (*pb.AddCall(b, {x}))[0];
  const int cx = (*pb.AddCall(c, {x}))[0];
  const int z = (*pb.AddCall(a, {cx}))[0];
  auto ir = pb.Build({y, z});
  EXPECT_TRUE(ir.ok()) << ir.status();
  return *ir;
}

}  // namespace pw::testing

#endif  // PATHWAYS_PROGRAM_IR_TESTING_PROGRAMS_H_
