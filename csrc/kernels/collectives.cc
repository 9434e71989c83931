#include "csrc/kernels/collectives.h"

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

namespace pw::kernels {
namespace {

// Sums shards in order 0..num_shards-1 into shard 0 of `out` (row by row, so
// the reads stay sequential), then replicates shard 0 to the other shards.
template <typename T>
void Psum(int num_shards, int64_t n, View x, T* out) {
  const T* px = static_cast<const T*>(x.data);
  for (int64_t j = 0; j < n; ++j) out[j] = px[j * x.elem_stride];
  for (int s = 1; s < num_shards; ++s) {
    const T* rx = px + s * x.shard_stride;
    for (int64_t j = 0; j < n; ++j) {
      if constexpr (std::is_same_v<T, int32_t>) {  // wraps like numpy, not UB
        out[j] = static_cast<int32_t>(static_cast<uint32_t>(out[j]) +
                                      static_cast<uint32_t>(rx[j * x.elem_stride]));
      } else if constexpr (std::is_same_v<T, bool>) {
        out[j] = out[j] || rx[j * x.elem_stride];
      } else {
        out[j] += rx[j * x.elem_stride];
      }
    }
  }
  if (n == 1) {  // a scalar all-reduce: one fill, not a memcpy call per shard
    std::fill(out + 1, out + num_shards, out[0]);
    return;
  }
  for (int s = 1; s < num_shards; ++s) {
    if (n > 0) std::memcpy(out + s * n, out, n * sizeof(T));
  }
}

// all_gather: out shard s = concat over source shards t at the gather axis.
// `outer` elements before the axis, `inner` after (per source shard).
template <typename T>
void AllGather(int num_shards, int64_t outer, int64_t inner, View x, T* out) {
  const T* px = static_cast<const T*>(x.data);
  const int64_t n = outer * num_shards * inner;
  for (int64_t o = 0; o < outer; ++o) {
    for (int t = 0; t < num_shards; ++t) {
      T* dst = out + (o * num_shards + t) * inner;
      const T* src = px + t * x.shard_stride + o * inner * x.elem_stride;
      for (int64_t j = 0; j < inner; ++j) dst[j] = src[j * x.elem_stride];
    }
  }
  for (int s = 1; s < num_shards; ++s) {
    if (n > 0) std::memcpy(out + s * n, out, n * sizeof(T));
  }
}

// ppermute: out shard d = x shard source[d], or zeros.
template <typename T>
void Ppermute(int num_shards, int64_t n, View x, const std::vector<int64_t>& source, T* out) {
  const T* px = static_cast<const T*>(x.data);
  for (int d = 0; d < num_shards; ++d) {
    T* dst = out + d * n;
    const int64_t src = d < static_cast<int>(source.size()) ? source[d] : -1;
    if (src < 0) {
      std::fill(dst, dst + n, T{});  // zero bits: 0, false, +0.0
      continue;
    }
    const T* rx = px + src * x.shard_stride;
    for (int64_t j = 0; j < n; ++j) dst[j] = rx[j * x.elem_stride];
  }
}

// pmean / pmax / pmin: reduce the shards in order into shard 0, then
// replicate. pmean divides the sum (in double) by num_shards and truncates
// toward zero for int32.
template <typename T>
void Pcollective(OpKind kind, int num_shards, int64_t n, View x, T* out) {
  const T* px = static_cast<const T*>(x.data);
  for (int64_t j = 0; j < n; ++j) {
    if (kind == OpKind::kPmean) {
      if constexpr (!std::is_same_v<T, bool>) {
        double acc = 0;
        for (int s = 0; s < num_shards; ++s) {
          acc += static_cast<double>(px[s * x.shard_stride + j * x.elem_stride]);
        }
        out[j] = static_cast<T>(acc / num_shards);
      }
      continue;
    }
    T acc = px[j * x.elem_stride];
    for (int s = 1; s < num_shards; ++s) {
      const T v = px[s * x.shard_stride + j * x.elem_stride];
      acc = kind == OpKind::kPmax ? Max(acc, v) : Min(acc, v);
    }
    out[j] = acc;
  }
  for (int s = 1; s < num_shards; ++s) {
    if (n > 0) std::memcpy(out + s * n, out, n * sizeof(T));
  }
}

// pmean on a partial gang, before and after the hosts' AllReduce: `sums`
// gets this host's float64 sums of its shards (in order) of `x`; then `out`
// (one shard) gets the gang's sums divided by `gang_size`, as Pcollective.
template <typename T>
void LocalMeanSumsOf(int num_shards, int64_t n, View x, double* sums) {
  const T* px = static_cast<const T*>(x.data);
  for (int64_t j = 0; j < n; ++j) {
    double acc = 0;
    for (int s = 0; s < num_shards; ++s) acc += static_cast<double>(px[s * x.shard_stride + j * x.elem_stride]);
    sums[j] = acc;
  }
}
template <typename T>
void MeanFromSumsOf(int gang_size, int64_t n, const double* sums, T* out) {
  for (int64_t j = 0; j < n; ++j) out[j] = static_cast<T>(sums[j] / gang_size);
}

// psum_scatter: shard d of `out` is the sum over shards s (in order) of
// x_s[o, d, i] for x_s of [outer, num_shards, inner].
template <typename T>
void PsumScatter(int num_shards, int64_t outer, int64_t inner, View x, T* out) {
  const T* px = static_cast<const T*>(x.data);
  const int64_t n = outer * inner;
  for (int d = 0; d < num_shards; ++d) {
    T* od = out + d * n;
    for (int s = 0; s < num_shards; ++s) {
      const T* xs = px + s * x.shard_stride;
      for (int64_t o = 0; o < outer; ++o) {
        const T* src = xs + (o * num_shards + d) * inner;
        T* dst = od + o * inner;
        if (s == 0) {
          std::copy(src, src + inner, dst);
        } else {
          for (int64_t i = 0; i < inner; ++i) dst[i] = ReduceAdd(dst[i], src[i]);
        }
      }
    }
  }
}

}  // namespace

std::optional<ReduceOp> HostReduction(OpKind kind, DType dtype) {
  switch (kind) {
    case OpKind::kPsum:
      return dtype == DType::kBool ? ReduceOp::kMax : ReduceOp::kSum;
    case OpKind::kPmean:
      return ReduceOp::kSum;  // of float64 sums
    case OpKind::kPmax:
      return ReduceOp::kMax;
    case OpKind::kPmin:
      return ReduceOp::kMin;
    default:
      return std::nullopt;
  }
}


void LocalMeanSums(DType dtype, int num_shards, int64_t n, View x, double* sums) {
  DispatchDType(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    LocalMeanSumsOf<T>(num_shards, n, x, sums);
  });
}

void MeanFromSums(DType dtype, int gang_size, int64_t n, const double* sums, void* out) {
  DispatchDType(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    MeanFromSumsOf<T>(gang_size, n, sums, static_cast<T*>(out));
  });
}

void RunCrossShardKernel(const Op& op, const Dims& in_dims, const CopyPlan* all_to_all_plan,
                         int num_shards, const View& x, void* out) {
  const int64_t n = op.type.num_elements();
  if (op.kind == OpKind::kAllToAll) {
    const CopyPlan& p = *all_to_all_plan;
    const int64_t esize = DTypeSize(op.type.dtype);
    uint8_t* o = static_cast<uint8_t*>(out);
    for (int d = 0; d < num_shards; ++d) {
      for (int s = 0; s < num_shards; ++s) {
        const auto* src = static_cast<const uint8_t*>(x.data) +
                          (s * x.shard_stride + d * p.src_shard_step) * esize;
        StridedCopy(p, esize, src, o + (d * n + s * p.dst_shard_step) * esize);
      }
    }
    return;
  }
  if (op.kind == OpKind::kAllGather || op.kind == OpKind::kPpermute) {
    // Copies only: bfloat16 included.
    return DispatchStorageDType(op.type.dtype, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      T* o = static_cast<T*>(out);
      if (op.kind == OpKind::kPpermute) return Ppermute<T>(num_shards, n, x, op.perm_source, o);
      const size_t a = static_cast<size_t>(op.axis);
      AllGather<T>(num_shards, DimProduct(in_dims, 0, a), DimProduct(in_dims, a, in_dims.size()),
                   x, o);
    });
  }
  DispatchDType(op.type.dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    T* o = static_cast<T*>(out);
    switch (op.kind) {
      case OpKind::kPsum:
        return Psum<T>(num_shards, n, x, o);
      case OpKind::kPmean:
      case OpKind::kPmax:
      case OpKind::kPmin:
        return Pcollective<T>(op.kind, num_shards, n, x, o);
      case OpKind::kAllGather: {
        const size_t a = static_cast<size_t>(op.axis);
        return AllGather<T>(num_shards, DimProduct(in_dims, 0, a),
                            DimProduct(in_dims, a, in_dims.size()), x, o);
      }
      case OpKind::kPpermute:
        return Ppermute<T>(num_shards, n, x, op.perm_source, o);
      case OpKind::kPsumScatter: {
        const size_t a = static_cast<size_t>(op.axis);
        return PsumScatter<T>(num_shards, DimProduct(in_dims, 0, a),
                              DimProduct(in_dims, a + 1, in_dims.size()), x, o);
      }
      default:
        return;
    }
  });
}


}  // namespace pw::kernels
