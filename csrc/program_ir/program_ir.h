#ifndef PATHWAYS_PROGRAM_IR_PROGRAM_IR_H_
#define PATHWAYS_PROGRAM_IR_PROGRAM_IR_H_

// The device-location-agnostic program IR (paper §3, §4.2): a sharded
// dataflow graph with ONE node per compiled-function call, however many
// shards the function has, and edges that carry sharded buffers. The program
// tracer (@pw.program) builds it; lowering.h turns it into physical steps.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "csrc/base/dtype.h"
#include "csrc/cluster/device_list.h"
#include "csrc/kernels/function_executable.h"
#include "csrc/resource_manager/resource_manager.h"

namespace pw {

// A compiled function placed on virtual devices (pmap over a slice): the
// computation of one program node. Immutable and thread-safe; where it runs
// follows its slices' mappings (ResourceManager::Remap), so a remap costs
// its programs a re-lowering, never a re-compilation.
class CompiledFunction {
 public:
  // InvalidArgument unless `devices` is nonempty, all on one island, and
  // maps to distinct physical devices (a gang cannot use a device twice).
  static absl::StatusOr<std::shared_ptr<const CompiledFunction>> Create(
      std::shared_ptr<const FunctionExecutable> executable, std::vector<VirtualDevice> devices,
      DeviceListRegistry* registry);

  const std::string& name() const { return executable_->ir().name(); }
  const FunctionExecutable& executable() const { return *executable_; }
  const std::vector<VirtualDevice>& virtual_devices() const { return devices_; }
  // The physical devices the virtual devices map to now, interned.
  // InvalidArgument if remaps made two of them one device (they came from
  // different slices), or moved them to different islands.
  absl::StatusOr<const DeviceList*> physical_devices() const;
  int num_shards() const { return static_cast<int>(devices_.size()); }
  // Global (sharded) types: the leading axis is the device axis.
  Dims param_dims(int i) const;
  Dims output_dims(int i) const;
  // "slice 3" when the devices are one whole slice in order, else a list.
  std::string PlacementString() const;

 private:
  CompiledFunction() = default;
  // Whether a slice of its devices has ever been remapped (for messages).
  bool Remapped() const;
  std::shared_ptr<const FunctionExecutable> executable_;
  std::vector<VirtualDevice> devices_;
  DeviceListRegistry* registry_ = nullptr;
};

// A value of the program: a sharded array (global type).
struct ProgramValue {
  DType dtype = DType::kF32;
  Dims dims;
  int producer = -1;  // node index, or -1 for a program argument
  int index = 0;      // output index of the producer, or argument index
};

struct ProgramNode {
  std::shared_ptr<const CompiledFunction> fn;
  std::vector<int> inputs;   // value ids
  std::vector<int> outputs;  // value ids
};

// Immutable after ProgramBuilder::Build; thread-safe.
class ProgramIr {
 public:
  const std::string& name() const { return name_; }
  int num_args() const { return num_args_; }
  const std::vector<ProgramValue>& values() const { return values_; }
  const std::vector<ProgramNode>& nodes() const { return nodes_; }
  const std::vector<int>& outputs() const { return outputs_; }
  int num_nodes() const { return static_cast<int>(nodes_.size()); }
  // e.g.
  //   program @f(%0: f64[2]) {
  //     %1 = call @a(%0) on slice 0 [2 x tpu] : f64[2]
  //     return %1
  //   }
  std::string ToText() const;

 private:
  friend class ProgramBuilder;
  std::string name_;
  int num_args_ = 0;
  std::vector<ProgramValue> values_;
  std::vector<ProgramNode> nodes_;
  std::vector<int> outputs_;
};

// Records a program node by node; nodes come in a valid dataflow order by
// construction (a call can only use values that exist). Not thread-safe.
class ProgramBuilder {
 public:
  explicit ProgramBuilder(std::string name);

  // The next program argument (all arguments must come before any call).
  absl::StatusOr<int> AddArg(DType dtype, Dims dims);

  // A call of `fn` on `inputs`; returns the output values. InvalidArgument
  // on wrong arity or input types, e.g. "pmap of 'f' over 2 devices got
  // leading axis of size 3 for argument 0".
  absl::StatusOr<std::vector<int>> AddCall(std::shared_ptr<const CompiledFunction> fn,
                                           absl::Span<const int> inputs);

  const ProgramValue& value(int v) const { return ir_->values_[v]; }
  int num_values() const { return static_cast<int>(ir_->values_.size()); }

  // Finishes the program; the builder must not be used afterwards.
  absl::StatusOr<std::shared_ptr<const ProgramIr>> Build(absl::Span<const int> outputs);

 private:
  std::unique_ptr<ProgramIr> ir_;
};

}  // namespace pw

#endif  // PATHWAYS_PROGRAM_IR_PROGRAM_IR_H_
