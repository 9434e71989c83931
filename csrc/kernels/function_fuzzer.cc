// libFuzzer target: random programs of FunctionBuilder calls, then Compile
// and Run on 1-3 shards. Any sequence of calls must either fail with a
// Status or build a function that compiles and runs without a crash, an
// out-of-bounds access or undefined behaviour (built with ASan and UBSan by
// `make fuzz`). Values are capped at kMaxElements elements per shard so one
// input stays fast.
//
// The input is read as a stream of bytes: a header (dtype and shape of two
// parameters, the shard count), then one byte per builder call choosing the
// call, followed by the bytes of its arguments. Running out of bytes ends
// the function.

#include <cstddef>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <vector>

#include "csrc/function_ir/function_ir.h"
#include "csrc/kernels/function_executable.h"

namespace pw {
namespace {

constexpr int64_t kMaxElements = 4096;

class ByteReader {
 public:
  ByteReader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool empty() const { return pos_ >= size_; }
  uint8_t Byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  // A small signed integer: mostly in [-4, 11], sometimes extreme.
  int64_t Int() {
    const uint8_t b = Byte();
    if (b == 0xff) return INT64_MAX;
    if (b == 0xfe) return INT64_MIN;
    if (b == 0xfd) return int64_t{1} << 40;
    return static_cast<int64_t>(b % 16) - 4;
  }
  std::vector<int64_t> Ints(size_t max_count) {
    std::vector<int64_t> out(Byte() % (max_count + 1));
    for (int64_t& v : out) v = Int();
    return out;
  }
  Dims SmallDims() {
    Dims dims(Byte() % 4);
    for (int64_t& d : dims) d = Byte() % 5;
    return dims;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

constexpr DType kDTypes[] = {DType::kF32, DType::kF64, DType::kI32, DType::kBool, DType::kU32,
                             DType::kBF16};

DType PickDType(ByteReader& in) { return kDTypes[in.Byte() % std::size(kDTypes)]; }

void RunOne(const uint8_t* data, size_t size) {
  ByteReader in(data, size);
  const int shards = 1 + in.Byte() % 3;
  FunctionBuilder b("fuzz", "i");
  if (in.Byte() % 2 == 0 && !b.SetAxisSize(shards).ok()) return;
  std::vector<int32_t> values;
  for (int p = 0; p < 2; ++p) values.push_back(b.Parameter(PickDType(in), in.SmallDims()));
  auto pick = [&] { return values[in.Byte() % values.size()]; };
  const OpKind binary[] = {OpKind::kAdd, OpKind::kSub, OpKind::kMul, OpKind::kDiv, OpKind::kPow,
                           OpKind::kRem, OpKind::kAtan2, OpKind::kMax, OpKind::kMin, OpKind::kEq,  OpKind::kLt,
                           OpKind::kGe,  OpKind::kAnd, OpKind::kXor,
                           OpKind::kOr,  OpKind::kShiftLeft, OpKind::kShiftRightLogical,
                           OpKind::kShiftRightArithmetic};
  const OpKind unary[] = {OpKind::kNeg, OpKind::kAbs, OpKind::kExp, OpKind::kLog, OpKind::kTanh,
                          OpKind::kSqrt, OpKind::kRsqrt, OpKind::kSin, OpKind::kNot,
                          OpKind::kErf, OpKind::kErfc};
  while (!in.empty() && values.size() < 64) {
    absl::StatusOr<int32_t> v = absl::InvalidArgumentError("no op");
    switch (in.Byte() % 29) {
      case 0: {
        const DType dtype = PickDType(in);
        Dims dims = in.SmallDims();
        std::vector<uint8_t> bytes(NumElements(dims) * DTypeSize(dtype));
        for (uint8_t& x : bytes) x = in.Byte();
        if (dtype == DType::kBool) {
          for (uint8_t& x : bytes) x &= 1;
        }
        v = b.Constant(dtype, dims, bytes);
        break;
      }
      case 1: {
        const int32_t x = pick();
        v = in.Byte() % 4 ? b.Convert(x, PickDType(in)) : b.BitcastConvert(x, PickDType(in));
        break;
      }
      case 2: v = b.Binary(binary[in.Byte() % std::size(binary)], pick(), pick()); break;
      case 3: v = b.Unary(unary[in.Byte() % 9], pick()); break;
      case 4: v = b.Select(pick(), pick(), pick()); break;
      case 5: v = b.Psum(pick(), in.Byte() % 8 ? "i" : "j"); break;
      case 6: {
        const int32_t x = pick();
        std::vector<int64_t> axes = in.Ints(3);
        const bool all = in.Byte() % 3 == 0;
        v = b.Reduce(static_cast<ReduceKind>(in.Byte() % 5), x, all ? nullptr : &axes, in.Byte() % 2);
        break;
      }
      case 7: v = b.Pcollective(in.Byte() % 2 ? OpKind::kPmax : OpKind::kPmean, pick(), "i"); break;
      case 8: v = b.AxisIndex("i"); break;
      case 9: v = b.AllGather(pick(), "i", in.Int()); break;
      case 10: {
        const int32_t x = pick();
        std::vector<std::pair<int64_t, int64_t>> perm(in.Byte() % 4);
        for (auto& [s, d] : perm) {
          s = in.Int();
          d = in.Int();
        }
        v = b.Ppermute(x, "i", perm);
        break;
      }
      case 11: v = b.Copy(pick()); break;
      case 12: {
        const int32_t x = pick();
        const std::vector<int64_t> dims = in.Ints(4);
        v = b.Reshape(x, Dims(dims.begin(), dims.end()));
        break;
      }
      case 13: {
        const int32_t x = pick();
        const std::vector<int64_t> dims = in.Ints(4);
        v = b.BroadcastTo(x, Dims(dims.begin(), dims.end()));
        break;
      }
      case 14: {
        const int32_t x = pick();
        v = b.Transpose(x, in.Ints(4));
        break;
      }
      case 15: {
        const int32_t x = pick();
        std::vector<int64_t> start = in.Ints(4), limit = in.Ints(4), step = in.Ints(4);
        v = b.Slice(x, start, limit, step);
        break;
      }
      case 16: {
        const int32_t x = pick();
        v = b.Rev(x, in.Ints(3));
        break;
      }
      case 17: {
        const int32_t x = pick();
        std::vector<int64_t> lo = in.Ints(4), hi = in.Ints(4), interior = in.Ints(4);
        v = b.Pad(x, lo, hi, interior);
        break;
      }
      case 18: {
        std::vector<int32_t> xs(1 + in.Byte() % 3);
        for (int32_t& x : xs) x = pick();
        v = b.Concatenate(xs, in.Int());
        break;
      }
      case 19: {
        const int32_t x = pick(), indices = pick();
        v = b.Take(x, indices, in.Int());
        break;
      }
      case 20: {
        const int32_t updates = pick(), indices = pick();
        const int64_t axis = in.Int();
        v = b.ScatterAdd(updates, indices, axis, in.Int());
        break;
      }
      case 21: v = b.Matmul(pick(), pick()); break;
      case 22: {
        const int32_t x = pick();
        const int64_t split = in.Int();
        v = b.AllToAll(x, "i", split, in.Int());
        break;
      }
      case 23: {
        const int32_t x = pick();
        v = b.PsumScatter(x, "i", in.Int());
        break;
      }
      case 24: {
        const int32_t x = pick();
        v = b.TopK(x, in.Int());
        break;
      }
      case 25: {
        const int32_t operand = pick(), indices = pick(), updates = pick();
        const auto combiner = static_cast<Combiner>(in.Byte() % 6);  // 5: not a combiner
        const int64_t axis = in.Int();
        v = b.Scatter(combiner, operand, indices, updates, axis, in.Int());
        break;
      }
      case 26: {
        const int32_t x = pick();
        const auto combiner = static_cast<Combiner>(in.Byte() % 6);
        const int64_t axis = in.Int();
        v = b.Cumulative(combiner, x, axis, in.Byte() % 2 == 0);
        break;
      }
      case 27: {
        const int32_t x = pick();
        v = b.Sort(x, in.Byte() % 2 == 0);
        break;
      }
      case 28: {
        // A loop carrying one value over the rows of another (none if it is
        // zero-dimensional: then a length of its own): the body applies a
        // binary op to the carry and itself (converted back to the carry's
        // type), maybe psums it, and stacks the carry op the row as its y.
        const int32_t c = pick(), x = pick();
        const ValueType tc = b.type(c), tx = b.type(x);
        const bool over_rows = !tx.dims.empty();
        const int64_t length = over_rows ? tx.dims[0] : in.Byte() % 4;
        FunctionBuilder body("body", "i");
        if (b.axis_size() > 0 && !body.SetAxisSize(b.axis_size()).ok()) break;
        const int32_t bc = body.Parameter(tc.dtype, tc.dims);
        int32_t bx = bc;
        if (over_rows) bx = body.Parameter(tx.dtype, Dims(tx.dims.begin() + 1, tx.dims.end()));
        const OpKind kind = binary[in.Byte() % std::size(binary)];
        absl::StatusOr<int32_t> next = body.Binary(kind, bc, bc);
        if (next.ok() && in.Byte() % 3 == 0) next = body.Psum(*next, "i");
        if (next.ok()) next = body.Convert(*next, tc.dtype);
        absl::StatusOr<int32_t> y = body.Binary(kind, bc, bx);
        if (!next.ok() || !y.ok()) break;
        auto fn = body.Build({*next, *y});
        if (!fn.ok()) break;
        std::vector<int32_t> operands = {c};
        if (over_rows) operands.push_back(x);
        auto results = b.ScanResults(*fn, operands, 1, over_rows ? 1 : 0, length, in.Byte() % 2);
        if (!results.ok()) break;
        if (NumElements(b.type((*results)[1]).dims) > kMaxElements) return;
        values.push_back((*results)[0]);
        v = (*results)[1];
        break;
      }
    }
    if (!v.ok()) continue;
    if (NumElements(b.type(*v).dims) > kMaxElements) return;  // keeps one input fast
    values.push_back(*v);
  }
  std::vector<int32_t> outputs = {values.back()};
  if (values.size() > 3) outputs.push_back(values[values.size() / 2]);
  auto ir = b.Build(outputs);
  if (!ir.ok()) return;
  auto exe = FunctionExecutable::Compile(*ir);
  // Internal: an op the builder should have legalized (bfloat16) reached
  // Compile, a bug the fuzzer is here to find.
  if (absl::IsInternal(exe.status())) std::abort();
  if (!exe.ok()) return;
  const FunctionIr& f = (*exe)->ir();
  if (f.axis_size() != 0 && f.axis_size() != shards) return;  // placement refuses it
  std::vector<std::vector<uint8_t>> inputs(f.num_params()), results(f.num_outputs());
  std::vector<const void*> in_ptrs;
  std::vector<void*> out_ptrs;
  for (int i = 0; i < f.num_params(); ++i) {
    inputs[i].resize(std::max<int64_t>((*exe)->param_bytes(i) * shards, 1));
    for (size_t k = 0; k < inputs[i].size(); ++k) inputs[i][k] = static_cast<uint8_t>(k * 37 + 11);
    if (f.param_type(i).dtype == DType::kBool) {
      for (uint8_t& x : inputs[i]) x &= 1;
    }
    in_ptrs.push_back(inputs[i].data());
  }
  for (int i = 0; i < f.num_outputs(); ++i) {
    results[i].resize(std::max<int64_t>((*exe)->output_bytes(i) * shards, 1));
    out_ptrs.push_back(results[i].data());
  }
  // Exactly the scratch Run() asks for, so ASan sees any overrun.
  const int64_t scratch_bytes = (*exe)->scratch_bytes(shards);
  void* scratch = std::aligned_alloc(64, ((std::max<int64_t>(scratch_bytes, 1) + 63) / 64) * 64);
  (*exe)->Run(shards, in_ptrs, out_ptrs, scratch);
  std::free(scratch);
}

}  // namespace
}  // namespace pw

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  pw::RunOne(data, size);
  return 0;
}
