#ifndef PATHWAYS_KERNELS_FUNCTION_EXECUTABLE_H_
#define PATHWAYS_KERNELS_FUNCTION_EXECUTABLE_H_

// A compiled function ready to run on a gang of simulated devices: the
// FunctionIr plus a memory plan for its intermediate values.
//
// Run() executes all shards of one gang together, op by op. Shards of a gang
// are laid out shard-major and contiguous (shard s of a value at
// base + s * per_shard_bytes), so an elementwise op over the whole gang is one
// flat loop, and a collective (psum) reduces across the shard stride. This is
// the "gang launch" model: the executor starts a gang only when it is at the
// head of every device's queue and its inputs are ready, so no shard ever
// blocks a thread waiting for the rest of its gang inside a collective.
//
// When a gang spans several host processes, each host holds only some of its
// shards and runs them with RunLocal(): ops within a shard run exactly as in
// Run(). The reductions (psum, pmean, pmax, pmin) are hierarchical: the host
// reduces its local shards in-process, reduces that one value per host across
// the gang's hosts through GangCollectives (which the host implements over
// Gloo), and copies the result to its local shards. The other cross-shard
// ops gather their operand over the whole gang, run the same kernel over all
// shards and keep this host's rows, bit-identical to Run().
//
// Loops (kScan, kWhile, function_ir.h): the body (and a while's cond) is
// compiled once, with the loop, into an executable of its own, and each
// iteration runs it over the same shards as the loop (all of the gang, or
// this host's), in a workspace of the loop's scratch: the carries in two
// buffers that swap, an iteration's slices of the xs and its ys copied in
// and out (in place with one shard), a while's per-shard conditions. No
// iteration plans or allocates anything. A while runs its cond before each
// iteration and stops when no shard's is true; a shard whose cond is false
// keeps its carries while the others go on (function_ir.h). Cross-shard ops
// of a body or cond run as any others, every iteration (so every host of a
// gang makes the same calls in the same order): on a partial gang, a while
// whose cond or body calls the gang's collectives decides whether to go on
// with one more call, an AllReduce (kMax) of one bool, whether any of the
// host's shards goes on, so every host runs the gang's most iterations, as
// Run() over the whole gang does. In shard-parallel runs a loop whose body
// or cond has cross-shard ops closes its stage, as a collective does, and
// runs over the whole gang.

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "csrc/base/dtype.h"
#include "csrc/base/mutex.h"
#include "csrc/base/reduce_op.h"
#include "csrc/codegen/native_compiler.h"
#include "csrc/function_ir/function_ir.h"
#include "csrc/kernels/data_movement.h"
#include "csrc/kernels/elementwise.h"
#include "csrc/kernels/reduction.h"

namespace pw {

// The shards of a gang that one host holds: the gang's size and the
// positions in it of the local shards, in increasing order, which is also
// their order in the host's buffers (local shard k is gang position
// positions()[k]). Immutable value; thread-safe.
class LocalShards {
 public:
  // InvalidArgument unless 1 <= gang_size <= kMaxAxisSize and `positions` is
  // nonempty, strictly increasing and within [0, gang_size).
  static absl::StatusOr<LocalShards> Create(int gang_size, std::vector<int> positions);

  int gang_size() const { return gang_size_; }
  int num_local() const { return static_cast<int>(positions_.size()); }
  absl::Span<const int> positions() const { return positions_; }
  // True when this host holds every shard (positions 0 .. gang_size-1).
  bool whole_gang() const { return num_local() == gang_size_; }

 private:
  LocalShards(int gang_size, std::vector<int> positions)
      : gang_size_(gang_size), positions_(std::move(positions)) {}
  int gang_size_;
  std::vector<int> positions_;
};

// The cross-host half of a gang's collectives; a host process implements
// it over Gloo (GroupCollectives, host/host_groups.h). Every host of the gang makes the same calls in the same
// order (the calls follow the function's ops, which every host runs alike),
// so an implementation may match calls by their sequence. One RunLocal()
// uses it from one thread at a time.
class GangCollectives {
 public:
  virtual ~GangCollectives() = default;

  // `local` holds this host's shards of one value (its local positions, in
  // order, `shard_bytes` each, contiguous); fills `full` (gang_size *
  // shard_bytes bytes, not overlapping `local`) with all the gang's shards in
  // gang order. The local shards' slots of `full` may be written too. Both
  // pointers are only used during the call. An error (peer lost, timeout, or
  // an implementation's own reason such as "another host cannot run") ends
  // the RunLocal() that called it with that same status.
  virtual absl::Status AllGather(const void* local, void* full, int64_t shard_bytes) = 0;

  // In place: `data` holds `count` elements of `dtype`, this host's
  // reduction of its local shards, and receives the reduction by `op` over
  // the gang's hosts, the same bits on every host. The order in which hosts'
  // values are combined is the implementation's (floating-point sums may
  // differ in their last bits from a sum in gang order). Never kSum of bool.
  // `data` is only used during the call; errors as AllGather's.
  virtual absl::Status AllReduce(DType dtype, ReduceOp op, void* data, int64_t count) = 0;
};

class FunctionExecutable {
 public:
  // Plans scratch memory for `ir`. Fails only on an op the kernels cannot run.
  // `native` false: the interpreter only (see "Native code" below), as with
  // PATHWAYS_NATIVE_KERNELS=0.
  static absl::StatusOr<std::shared_ptr<const FunctionExecutable>> Compile(
      std::shared_ptr<const FunctionIr> ir, bool native = true);

  const FunctionIr& ir() const { return *ir_; }
  const std::shared_ptr<const FunctionIr>& ir_ptr() const { return ir_; }

  // Bytes of one shard of parameter i / output i.
  int64_t param_bytes(int i) const { return ir_->param_type(i).num_bytes(); }
  int64_t output_bytes(int i) const { return ir_->output_type(i).num_bytes(); }

  // Scratch bytes Run() needs for a gang of `num_shards` shards.
  int64_t scratch_bytes(int num_shards) const {
    return scratch_per_shard_ * num_shards + tile_bytes_;
  }

  // Elements per tile of a fused elementwise run (see fusion_groups()).
  static constexpr int64_t kTileElements = 1024;

  // Elementwise fusion: a run of consecutive elementwise ops (casts, unary,
  // binary, comparisons, select) over values of one shape is computed tile
  // by tile, kTileElements of the gang at a time. Values used only inside the
  // run live in a small tile buffer and never get a full-size scratch slot,
  // so the run reads its inputs and writes its results once: one pass over
  // memory. Each group is the op range [first, last] of the IR (constants
  // and parameters inside it compute nothing).
  struct FusionGroup {
    int32_t first = 0;
    int32_t last = 0;
  };
  absl::Span<const FusionGroup> fusion_groups() const { return groups_; }

  // Runs every shard of one gang. inputs[i] holds parameter i for all shards
  // (shard-major, as above); outputs[i] receives output i for all shards.
  // `scratch` has at least scratch_bytes(num_shards) bytes, 64-byte aligned.
  // Input and output regions must not overlap. Thread-safe: the executable is
  // read-only, so many gangs may run it at once with their own scratch.
  // Runs on an executor thread: no allocation, no locks, no Python.
  void Run(int num_shards, absl::Span<const void* const> inputs,
           absl::Span<void* const> outputs, void* scratch) const;

  // Scratch bytes RunLocal() needs for `num_local` shards of a gang of
  // `gang_size`: scratch_bytes(num_local), then (when the gang is not all
  // local) room for the largest cross-shard op's operand and result over the
  // whole gang, each in 64-byte aligned pieces. Equal to
  // scratch_bytes(gang_size) when num_local == gang_size.
  int64_t local_scratch_bytes(int num_local, int gang_size) const {
    if (num_local == gang_size) return scratch_bytes(gang_size);
    return scratch_bytes(num_local) + gang_temp_per_shard_ * gang_size;
  }

  // Runs this host's shards of one gang: as Run() with num_shards =
  // local.num_local(), inputs and outputs holding only the local shards
  // (shard-major, in local order). Every cross-shard op whose operand is
  // neither a constant (the same on every shard) nor empty makes one call to
  // `collectives`, in op order: psum, pmax and pmin reduce the local shards
  // in-process (in gang order), then collectives->AllReduce (kSum; kMax for
  // a psum of bool, which is a logical or); pmean sums the local shards in
  // float64 and AllReduces those sums (as Run(), which sums in float64, then
  // divides by the gang size); all_gather, ppermute, all_to_all and
  // psum_scatter gather their operand from the whole gang with
  // collectives->AllGather. axis_index gives each shard its gang position.
  // A while loop whose cond or body makes such calls also makes one
  // AllReduce (kMax of one bool) before each iteration and after the last
  // (see "Loops" above).
  // Results equal the local shards' rows of Run() over the whole gang bit
  // for bit, except that floating-point psum and pmean add in another order
  // (local shards, then hosts): their last bits may differ. When
  // local.whole_gang() nothing is called and `collectives` may be null.
  // `scratch` has at least local_scratch_bytes(num_local, gang_size) bytes,
  // 64-byte aligned; `collectives` must outlive the call.
  //
  // InvalidArgument if the function was traced for another axis size than
  // the gang's, or if `collectives` is null when a call is needed (checked
  // before any op runs, so every host of a gang fails alike and none calls
  // `collectives`). An error from `collectives` is returned as it is, at
  // once; the outputs are then undefined. Thread-safe as Run(); allocates
  // nothing itself.
  absl::Status RunLocal(const LocalShards& local, absl::Span<const void* const> inputs,
                        absl::Span<void* const> outputs, void* scratch,
                        GangCollectives* collectives) const;

  // --- Shard-parallel runs (a gang's shards on several executor threads) ---
  //
  // The ops split into stages. Stage k runs the ops that compute each shard
  // from that shard alone, on any subset of the shards (RunStage: a part of
  // the gang, on one thread, while other threads run the other parts), then
  // its closing cross-shard op over the whole gang (RunStageCollective,
  // called once every part of stage k is done: by the part that finished
  // last, so no thread waits for another). The last stage has no closing op
  // and writes the outputs. Run() is the same sequence on one thread.
  int num_stages() const { return static_cast<int>(stages_.size()); }
  // Estimated work of one shard (elements written by its ops, plus m*n*k/8
  // per matmul): a caller splits a gang only when it is large enough to pay
  // for the hand-offs between threads (a few microseconds each).
  int64_t work_per_shard() const { return work_per_shard_; }
  // The same for stage `stage`'s per-shard ops: a stage with little work
  // (an Adam update of one leaf between two pmeans, or nothing) is cheaper
  // run on one thread than handed off.
  int64_t stage_work_per_shard(int stage) const {
    return stages_[static_cast<size_t>(stage)].work_per_shard;
  }
  // Scratch that the parts of a gang of `num_shards` share (each shard's
  // values, then room for a cross-shard op's result over the gang), and
  // each part's own tiles.
  int64_t shared_scratch_bytes(int num_shards) const {
    return (scratch_per_shard_ + gang_temp_per_shard_) * num_shards;
  }
  int64_t tile_bytes() const { return tile_bytes_; }
  // Stage `stage`'s per-shard ops on shards [begin, end) of a gang of
  // `num_shards`: inputs and outputs as Run()'s (whole gang), `scratch` the
  // shared scratch (64-byte aligned), `tiles` tile_bytes() of this thread's
  // own (64-byte aligned). Parts of one stage may run at once on disjoint
  // shard ranges. No allocation, no locks.
  void RunStage(int stage, int num_shards, int begin, int end, absl::Span<const void* const> inputs,
                absl::Span<void* const> outputs, void* scratch, void* tiles) const;
  // Stage `stage`'s closing cross-shard op over the whole gang, after all
  // of its parts; nothing for the last stage.
  void RunStageCollective(int stage, int num_shards, absl::Span<const void* const> inputs,
                          void* scratch) const;

  // Shared scratch for parallel runs, reused across runs so a run does not
  // allocate (nor fault in fresh pages) in the steady state. Thread-safe.
  // Null if `bytes` cannot be allocated.
  void* AcquireSharedScratch(int64_t bytes) const;
  void ReleaseSharedScratch(void* scratch, int64_t bytes) const;

  // The first call RunLocal() makes to its GangCollectives on a partial gang
  // (the same on every host of the gang, and on every partial layout of it),
  // so a host that cannot run its part can still make that call, and its
  // peers are not left waiting in it (see HostExecutor::RunPart).
  struct CollectiveCall {
    enum class Kind : uint8_t { kNone, kAllGather, kAllReduce };
    Kind kind = Kind::kNone;  // kNone: the function calls no collective
    int64_t shard_bytes = 0;  // kAllGather: AllGather's shard_bytes
    DType dtype = DType::kF32;  // kAllReduce: AllReduce's arguments
    ReduceOp op = ReduceOp::kSum;
    int64_t count = 0;
  };
  const CollectiveCall& first_collective() const { return first_collective_; }

  // --- Native code (csrc/codegen) ---
  //
  // Compile plans the function's fused regions (codegen/fused_region.h) and
  // registers their generated source with NativeCompiler::Default(), which
  // compiles it in the background once the function has run a few times.
  // Until then, and whenever PATHWAYS_NATIVE_KERNELS=0 or no compiler
  // exists, the interpreter runs every op; after, each region's ops are one
  // call of its native code. A run reads the swap once per region, so runs in
  // flight may mix the two; both give the same bits (fused_region.h).
  int num_native_regions() const { return static_cast<int>(native_regions_.size()); }
  // The generated code has been loaded and runs in place of the interpreter.
  bool native_ready() const {
    return native_ != nullptr && native_->regions.load(std::memory_order_acquire) != nullptr;
  }

  // Per-op plans Compile makes for Run(): see kernels/elementwise.h and
  // kernels/reduction.h.
  using BroadcastPlan = kernels::BroadcastPlan;
  using ReducePlan = kernels::ReducePlan;

 private:
  explicit FunctionExecutable(std::shared_ptr<const FunctionIr> ir) : ir_(std::move(ir)) {}
  // The op loop shared by Run() and RunLocal(), over `num_shards` shards in
  // memory: the whole gang when `local` is null (never fails then), else
  // local's shards, cross-shard ops gathering through `collectives`.
  // Shards [begin, end) of a gang of `num_shards` whose values are laid out
  // in scratch for all `num_shards`, and ops [op_begin, op_end) of the IR.
  struct ShardRange {
    int num_shards;
    int begin, end;
    int32_t op_begin, op_end;
    bool write_outputs = true;  // when op_end is the last op
    // Scratch laid out shard-major (a parallel run): shard s's values at
    // scratch + s * scratch_per_shard_ + their offset, so parts of a gang
    // never share a slot; then end - begin is 1 and the range has no
    // cross-shard op. Else value-major, as Run()'s (a value's shards
    // contiguous at scratch + offset * num_shards).
    bool shard_major = false;
  };
  // Runs the range's ops on the range's shards; a cross-shard op in it needs
  // every shard. The outputs' shards of the range are written when the range
  // ends at the last op. `tile_buffer` holds tile_bytes_ for fused runs.
  // `gang_temp` is RunLocal's room for cross-shard ops over the whole gang
  // (see gang_temp_per_shard_); only a partial gang uses it.
  absl::Status RunShards(const ShardRange& range, const LocalShards* local,
                         GangCollectives* collectives, absl::Span<const void* const> inputs,
                         absl::Span<void* const> outputs, void* scratch, void* tile_buffer,
                         uint8_t* gang_temp) const;
  // Where a loop's operand or result is for the shards of a run: shard s's
  // bytes at data + s * stride (stride 0: one value shared by all shards).
  struct Strided {
    const uint8_t* data;
    int64_t stride;
  };
  // Runs loop op `v` (a scan or a while) over `num_shards` shards (see
  // "Loops" above). `workspace` holds its LoopPlan::workspace_bytes per
  // shard, value-major (a piece of p bytes per shard at offset o is at
  // workspace + o * num_shards); `tiles` and `gang_temp` are passed to the
  // body's and cond's runs.
  absl::Status RunLoop(int32_t v, int num_shards, absl::FunctionRef<Strided(int)> operand,
                       absl::FunctionRef<Strided(int)> result, uint8_t* workspace, void* tiles,
                       uint8_t* gang_temp, const LocalShards* local,
                       GangCollectives* collectives) const;
  std::shared_ptr<const FunctionIr> ir_;
  // Per op: byte offset of its value in one shard's slice of scratch, or -1
  // for parameters (read in place from the inputs).
  std::vector<int64_t> scratch_offset_;
  int64_t scratch_per_shard_ = 0;
  // Per op: index into plans_, or -1 when no operand needs broadcasting
  // beyond rank 0.
  std::vector<int32_t> plan_index_;
  std::vector<BroadcastPlan> plans_;
  // Per op: index into reduce_plans_ (kReduce ops), or -1.
  std::vector<int32_t> reduce_index_;
  std::vector<ReducePlan> reduce_plans_;
  // Per op: [first, first + count) of copy_plans_ (data-movement ops).
  std::vector<std::pair<int32_t, int32_t>> copy_range_;
  std::vector<CopyPlan> copy_plans_;
  // One kMatmul op: the product dims and, per batch element, the element
  // offsets of its two operands within one shard.
  struct MatmulPlan {
    int64_t m = 0, n = 0, k = 0;
    std::vector<int64_t> a_offsets, b_offsets;
    // The values read: the operands, or the operand of a transpose of an
    // operand's last two dims, read transposed.
    int32_t a = -1, b = -1;
    bool trans_a = false, trans_b = false;
  };
  static MatmulPlan MakeMatmulPlan(const Dims& a, const Dims& b);
  std::vector<int32_t> matmul_index_;
  std::vector<MatmulPlan> matmul_plans_;
  // One loop op (kScan, kWhile): its body (and cond) compiled once, and its
  // workspace. Offsets are per shard: the workspace's in the scratch (a slot
  // live only at the loop), the pieces' within the workspace, the results'
  // within the loop's slot (which holds the whole tuple; get_element ops
  // alias their pieces).
  struct LoopPlan {
    std::shared_ptr<const FunctionExecutable> body;
    std::shared_ptr<const FunctionExecutable> cond;  // a while's, else null
    int64_t workspace = 0;
    int64_t workspace_bytes = 0;
    // The body's and the cond's scratch (they run in turn) is at the
    // workspace's start; then the pieces.
    int64_t pointers = 0;  // the input pointers, the body's outputs', the cond's output's
    std::vector<int64_t> carry_a, carry_b;  // per carry: the two buffers
    std::vector<int64_t> slices;            // per xs: this iteration's slice
    std::vector<int64_t> ys;                // per y: this iteration's
    std::vector<int64_t> consts;            // per const: a copy, if not in place
    std::vector<int64_t> elements;          // per result: its piece of the slot
    int64_t flags = 0;                      // a while's: each shard's cond (a bool)
    // The body or cond has cross-shard ops: the loop closes a stage.
    bool cross_shard = false;
    // A while whose body or cond calls the gang's collectives: on a partial
    // gang, the hosts agree on each iteration (see "Loops" above).
    bool agree = false;
  };
  std::vector<int32_t> loop_index_;  // per op: into loop_plans_, or -1
  // One linear algebra op (OpClass::kLinalg): its batch of matrices (m x n;
  // a triangular solve's a is m x m and its b m x n), and its workspace (a
  // slot live only at the op; per shard, as a loop's). `elements`: a
  // tuple's pieces of the op's slot (up to three).
  struct LinalgPlan {
    int64_t batch = 0, m = 0, n = 0;
    int64_t workspace = 0;
    int64_t workspace_bytes = 0;
    int64_t elements[3] = {0, 0, 0};
  };
  std::vector<int32_t> linalg_index_;  // per op: into linalg_plans_, or -1
  std::vector<LinalgPlan> linalg_plans_;
  // Whether an op needs the whole gang: a cross-shard op, or a loop whose
  // body has one (at any depth).
  bool has_cross_shard_ = false;
  std::vector<LoopPlan> loop_plans_;
  std::vector<FusionGroup> groups_;
  // Native regions: the ops [first, last], the values read (inputs) and
  // written (outputs) in the order of the generated code's arguments, and
  // the row buffer it needs (in the tiles).
  struct NativeRegion {
    int32_t first = 0, last = 0;
    absl::InlinedVector<int32_t, 8> inputs, outputs;
    int64_t rows = 1, cols = 1;  // per shard
    bool split_rows = false, split_cols = false;  // see codegen::FusedRegion
    // Per output: the function output it is, when the region may write it
    // straight into the caller's output buffer (it is that output once, and
    // no op after the region reads it), else -1; only outputs 0..63.
    absl::InlinedVector<int32_t, 8> direct;
  };
  std::vector<NativeRegion> native_regions_;
  std::vector<int32_t> native_start_;  // per op: the region starting at it, or -1
  std::shared_ptr<codegen::NativeJob> native_;
  // Per op: 1 if it is not run: a transpose that only matmuls read (they
  // read its operand transposed), or a reshape that shares its operand's
  // slot (the operand dies at it).
  std::vector<uint8_t> skip_;
  std::vector<int32_t> group_start_;  // per op: the group starting at it, or -1
  std::vector<int64_t> tile_offset_;  // per op: its tile buffer (values internal to a group), or -1
  int64_t tile_bytes_ = 0;            // the tile buffers, once per gang, after the shards' scratch
  // RunLocal(): per gang shard, the most any cross-shard op needs for its
  // gathered operand (RoundUp of its bytes; 0 for a constant) plus its
  // result (RoundUp), after the tiles; a pmean's float64 sums fit there too.
  int64_t gang_temp_per_shard_ = 0;
  // Its kind is kNone unless a partial gang needs its GangCollectives.
  CollectiveCall first_collective_;
  // Shard-parallel stages: per-shard ops [begin, end), then op `collective`
  // (-1 for the last stage).
  struct Stage {
    int32_t begin = 0, end = 0;
    int32_t collective = -1;
    int64_t work_per_shard = 0;  // of its per-shard ops, as work_per_shard()
  };
  std::vector<Stage> stages_;
  int64_t work_per_shard_ = 0;
  struct ScratchBlock {
    int64_t bytes;
    void* data;
  };
  mutable Mutex pool_mu_;
  mutable std::vector<ScratchBlock> free_scratch_ ABSL_GUARDED_BY(pool_mu_);
 public:
  ~FunctionExecutable();
};

}  // namespace pw

#endif  // PATHWAYS_KERNELS_FUNCTION_EXECUTABLE_H_
