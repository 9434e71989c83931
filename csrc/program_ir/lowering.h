#ifndef PATHWAYS_PROGRAM_IR_LOWERING_H_
#define PATHWAYS_PROGRAM_IR_LOWERING_H_

// Lowering (paper §4.2): the program IR with physical devices. Every edge
// whose producer and consumer sit on different devices gets a transfer step
// (ICI inside an island, DCN across islands); program arguments get a
// placement per set of devices that consumes them. The result is still one
// step per node or edge, never per shard, and is reused for every run while
// the virtual-to-physical mapping is unchanged.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "csrc/base/mutex.h"
#include "csrc/coordination/transfer.h"
#include "csrc/program_ir/program_ir.h"

namespace pw {

struct LoweredStep {
  enum class Kind : uint8_t { kCompute, kTransfer };
  Kind kind = Kind::kCompute;
  const DeviceList* devices = nullptr;        // where the step's outputs live
  const CompiledFunction* fn = nullptr;       // kCompute
  int node = -1;                              // kCompute: program node index
  LinkKind link = LinkKind::kNone;            // kTransfer
  absl::InlinedVector<int, 4> in_slots;       // kTransfer: exactly one
  absl::InlinedVector<int, 2> out_slots;      // kTransfer: exactly one
};

// Where a program argument must be placed for its consumers.
struct ArgPlacement {
  int arg = 0;
  const DeviceList* devices = nullptr;
  int slot = 0;
};

struct SlotType {
  DType dtype = DType::kF32;
  Dims dims;
};

// Made by Lower() only, always owned by a shared_ptr: whoever keeps state
// per lowered program (a client's loads on its hosts) holds a weak_ptr from
// weak_from_this() and forgets that state once the program is gone.
class LoweredProgram : public std::enable_shared_from_this<LoweredProgram> {
 public:
  // Unique in this process (never reused): names the lowered program to
  // host processes, which keep it.
  uint64_t id() const { return id_; }
  const ProgramIr& ir() const { return *ir_; }
  const std::shared_ptr<const ProgramIr>& ir_ptr() const { return ir_; }
  const std::vector<ArgPlacement>& arg_placements() const { return arg_placements_; }
  const std::vector<LoweredStep>& steps() const { return steps_; }
  const std::vector<int>& output_slots() const { return output_slots_; }
  const std::vector<SlotType>& slot_types() const { return slot_types_; }
  // Bytes per device the steps' outputs take, per device list (each list
  // once): what a dispatch reserves besides its arguments' placements.
  const std::vector<MemoryRequest>& step_memory() const { return step_memory_; }
  // The steps' output buffers: their bytes over all shards, and their number.
  int64_t step_bytes() const { return step_bytes_; }
  int64_t step_buffers() const { return step_buffers_; }
  // The program's ownership label: every buffer a run allocates is charged
  // to it.
  const std::shared_ptr<MemoryAccount>& memory_account() const { return memory_account_; }
  int num_slots() const { return static_cast<int>(slot_types_.size()); }
  // The program as lowered for the slices' mappings now (paper §4.1:
  // virtual devices may be re-mapped): this, while no slice its functions
  // use was remapped since it was lowered (one atomic load, unless some
  // slice anywhere was); else its re-lowering, made once and kept (and
  // itself checked the same way). Lowering's error if the new mapping
  // cannot run it (e.g. a remap moved one node's devices onto two islands).
  absl::StatusOr<const LoweredProgram*> Current() const;
  int num_compute_steps() const;
  int num_transfer_steps() const;
  std::string ToText() const;

 private:
  friend absl::StatusOr<std::shared_ptr<const LoweredProgram>> Lower(std::shared_ptr<const ProgramIr> ir);
  uint64_t id_ = 0;
  std::shared_ptr<const ProgramIr> ir_;
  std::vector<ArgPlacement> arg_placements_;
  std::vector<LoweredStep> steps_;
  std::vector<int> output_slots_;
  std::vector<SlotType> slot_types_;
  std::vector<MemoryRequest> step_memory_;
  int64_t step_bytes_ = 0;
  int64_t step_buffers_ = 0;
  std::shared_ptr<MemoryAccount> memory_account_;
  // Each slice its functions use, with its epoch when lowered.
  std::vector<std::pair<const VirtualSlice*, uint64_t>> slice_epochs_;
  // MappingGeneration() when the mapping was last found unchanged.
  mutable std::atomic<uint64_t> generation_{0};
  // What Current() returns while generation_ is the mapping's.
  mutable std::atomic<const LoweredProgram*> current_{this};
  mutable Mutex relower_mu_;
  mutable std::shared_ptr<const LoweredProgram> relowered_ ABSL_GUARDED_BY(relower_mu_);
};

// InvalidArgument if a program output is a program argument (the caller
// returns those itself) or a compute node spans islands.
absl::StatusOr<std::shared_ptr<const LoweredProgram>> Lower(std::shared_ptr<const ProgramIr> ir);

}  // namespace pw

#endif  // PATHWAYS_PROGRAM_IR_LOWERING_H_
