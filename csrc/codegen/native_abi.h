#ifndef PATHWAYS_CODEGEN_NATIVE_ABI_H_
#define PATHWAYS_CODEGEN_NATIVE_ABI_H_

// The interface between the runtime and the native code it generates for a
// fused region (fused_region.h). This header is compiled into the runtime
// and also embedded, as text, in every generated source file (after
// kernels/scalar_ops.h), so both sides see one definition. Standard library
// only; plain structs of pointers and integers (a C-compatible layout).
//
// A generated file defines, with C linkage:
//   int pw_native_abi()              returns kNativeAbiVersion as compiled;
//   uint64_t pw_native_source_hash() the hash its loader asked for;
//   void pw_region_<k>(const PwNativeArgs*) for each region k of the file.

#include <cstdint>

namespace pw::codegen {

// Bumped whenever these structs or the calling convention change, so a disk
// cache entry built for another layout is rebuilt, not run.
inline constexpr int kNativeAbiVersion = 2;

// The runtime's vectorized transcendentals (kernels/vector_math.h), passed in
// so that generated code gives the interpreter's bits: y[i] = f(x[i]).
struct PwVectorMath {
  void (*exp_f32)(const float*, float*, int64_t);
  void (*exp_f64)(const double*, double*, int64_t);
  void (*log_f32)(const float*, float*, int64_t);
  void (*log_f64)(const double*, double*, int64_t);
  void (*tanh_f32)(const float*, float*, int64_t);
  void (*tanh_f64)(const double*, double*, int64_t);
  void (*sin_f32)(const float*, float*, int64_t);
  void (*sin_f64)(const double*, double*, int64_t);
  void (*cos_f32)(const float*, float*, int64_t);
  void (*cos_f64)(const double*, double*, int64_t);
  void (*sqrt_f32)(const float*, float*, int64_t);
  void (*sqrt_f64)(const double*, double*, int64_t);
  void (*rsqrt_f32)(const float*, float*, int64_t);
  void (*rsqrt_f64)(const double*, double*, int64_t);
  void (*erf_f32)(const float*, float*, int64_t);
  void (*erf_f64)(const double*, double*, int64_t);
  void (*erfc_f32)(const float*, float*, int64_t);
  void (*erfc_f64)(const double*, double*, int64_t);
};

// One call of a region over a block of its loop space: rows [row_begin,
// row_end) counted over consecutive shards (row u is row u % R of shard
// u / R, R rows a shard), and columns [col_begin, col_end) of each (all of
// them when the region reduces its rows). Value k of the region's inputs
// (outputs) has shard s's elements at in[k] + s * in_stride[k] elements (0:
// one copy shared by all shards). Calls on disjoint blocks may run at once
// on different threads: the row buffers are the call's own (on its stack).
struct PwNativeArgs {
  int64_t row_begin, row_end;
  int64_t col_begin, col_end;
  const void* const* in;
  const int64_t* in_stride;
  void* const* out;
  const int64_t* out_stride;
  const PwVectorMath* vm;
};

using PwRegionFn = void (*)(const PwNativeArgs*);

}  // namespace pw::codegen

#endif  // PATHWAYS_CODEGEN_NATIVE_ABI_H_
