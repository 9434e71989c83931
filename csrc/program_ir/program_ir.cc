#include "csrc/program_ir/program_ir.h"

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace pw {
namespace {

Dims WithLeadingAxis(int n, const Dims& shard_dims) {
  Dims dims;
  dims.reserve(shard_dims.size() + 1);
  dims.push_back(n);
  dims.insert(dims.end(), shard_dims.begin(), shard_dims.end());
  return dims;
}

std::string ValueList(const std::vector<int>& ids) {
  return absl::StrJoin(ids, ", ", [](std::string* out, int v) { absl::StrAppend(out, "%", v); });
}

}  // namespace

absl::StatusOr<std::shared_ptr<const CompiledFunction>> CompiledFunction::Create(
    std::shared_ptr<const FunctionExecutable> executable, std::vector<VirtualDevice> devices,
    DeviceListRegistry* registry) {
  if (devices.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("pmap of '", executable->ir().name(), "' needs at least one device"));
  }
  const int64_t axis_size = executable->ir().axis_size();
  if (axis_size > 0 && axis_size != static_cast<int64_t>(devices.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pmap of '", executable->ir().name(), "' was traced for ", axis_size,
        " shards but is placed on ", devices.size(), " devices"));
  }
  auto fn = std::shared_ptr<CompiledFunction>(new CompiledFunction());
  fn->executable_ = std::move(executable);
  fn->devices_ = std::move(devices);
  fn->registry_ = registry;
  auto list = fn->physical_devices();
  if (!list.ok()) return list.status();
  // Intermediates live in device memory too: a function whose scratch
  // cannot fit on its devices can never run (it would only exhaust the
  // host's memory trying).
  const int64_t scratch = fn->executable_->scratch_bytes(/*num_shards=*/1);
  if (scratch > (*list)->devices()[0]->memory_capacity()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "pmap of '", fn->name(), "' needs ", scratch, " bytes of device memory per device for its "
        "intermediate values; its devices have ", (*list)->devices()[0]->memory_capacity()));
  }
  return std::shared_ptr<const CompiledFunction>(std::move(fn));
}

absl::StatusOr<const DeviceList*> CompiledFunction::physical_devices() const {
  absl::InlinedVector<Device*, 8> physical;
  physical.reserve(devices_.size());
  for (const VirtualDevice& v : devices_) physical.push_back(v.physical());
  for (Device* d : physical) {
    if (d->island() != physical[0]->island()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "pmap of '", name(), "': its devices span islands ", physical[0]->island()->id(), " and ",
          d->island()->id(), "; a compiled function runs on one island (use one slice)",
          Remapped() ? " (a remap of one of its slices moved it)" : ""));
    }
  }
  auto list = registry_->Intern(physical);
  if (!list.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("pmap of '", name(),
                                                   "': its virtual devices must map to distinct physical "
                                                   "devices: ",
                                                   list.status().message(),
                                                   Remapped() ? " (a remap of one of its slices moved them)" : ""));
  }
  return *list;
}

bool CompiledFunction::Remapped() const {
  for (const VirtualDevice& v : devices_) {
    if (v.slice->epoch() > 0) return true;
  }
  return false;
}

Dims CompiledFunction::param_dims(int i) const {
  return WithLeadingAxis(num_shards(), executable_->ir().param_type(i).dims);
}

Dims CompiledFunction::output_dims(int i) const {
  return WithLeadingAxis(num_shards(), executable_->ir().output_type(i).dims);
}

std::string CompiledFunction::PlacementString() const {
  const VirtualSlice* slice = devices_[0].slice.get();
  bool whole_slice = static_cast<int>(devices_.size()) == slice->size();
  for (size_t i = 0; i < devices_.size() && whole_slice; ++i) {
    whole_slice = devices_[i].slice.get() == slice && devices_[i].index == static_cast<int>(i);
  }
  const std::string kind = devices_[0].physical()->kind();
  if (whole_slice) return absl::StrCat("slice ", slice->id(), " [", slice->size(), " x ", kind, "]");
  return absl::StrCat("virtual devices [",
                      absl::StrJoin(devices_, ",",
                                    [](std::string* out, const VirtualDevice& v) {
                                      absl::StrAppend(out, v.slice->id(), ":", v.index);
                                    }),
                      "] [", devices_.size(), " x ", kind, "]");
}

std::string ProgramIr::ToText() const {
  std::string out = absl::StrCat("program @", name_, "(");
  for (int a = 0; a < num_args_; ++a) {
    absl::StrAppend(&out, a ? ", " : "", "%", a, ": ", TypeToString(values_[a].dtype, values_[a].dims));
  }
  absl::StrAppend(&out, ") {\n");
  for (const ProgramNode& node : nodes_) {
    std::vector<std::string> types;
    for (int v : node.outputs) types.push_back(TypeToString(values_[v].dtype, values_[v].dims));
    absl::StrAppend(&out, "  ", ValueList(node.outputs), " = call @", node.fn->name(), "(",
                    ValueList(node.inputs), ") on ", node.fn->PlacementString(), " : ",
                    absl::StrJoin(types, ", "), "\n");
  }
  absl::StrAppend(&out, "  return ", ValueList(outputs_), "\n}\n");
  return out;
}

ProgramBuilder::ProgramBuilder(std::string name) : ir_(new ProgramIr()) { ir_->name_ = std::move(name); }

absl::StatusOr<int> ProgramBuilder::AddArg(DType dtype, Dims dims) {
  if (!ir_->nodes_.empty()) {
    return absl::FailedPreconditionError("program arguments must be added before any call");
  }
  ir_->values_.push_back(ProgramValue{dtype, std::move(dims), -1, ir_->num_args_});
  return ir_->num_args_++;
}

absl::StatusOr<std::vector<int>> ProgramBuilder::AddCall(std::shared_ptr<const CompiledFunction> fn,
                                                         absl::Span<const int> inputs) {
  const FunctionIr& f = fn->executable().ir();
  if (static_cast<int>(inputs.size()) != f.num_params()) {
    return absl::InvalidArgumentError(absl::StrCat("'", f.name(), "' takes ", f.num_params(),
                                                   " arguments, got ", inputs.size()));
  }
  const int n = fn->num_shards();
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i] < 0 || inputs[i] >= static_cast<int>(ir_->values_.size())) {
      return absl::InvalidArgumentError(absl::StrCat("argument ", i, " of '", f.name(),
                                                     "' is not a value of program '", ir_->name_, "'"));
    }
    const ProgramValue& v = ir_->values_[inputs[i]];
    if (v.dims.empty() || v.dims[0] != n) {
      return absl::InvalidArgumentError(absl::StrCat(
          "pmap of '", f.name(), "' over ", n, " devices got ",
          v.dims.empty() ? std::string("a scalar") : absl::StrCat("leading axis of size ", v.dims[0]),
          " for argument ", i));
    }
    const Dims want = fn->param_dims(static_cast<int>(i));
    if (v.dtype != f.param_type(static_cast<int>(i)).dtype || v.dims != want) {
      return absl::InvalidArgumentError(absl::StrCat(
          "argument ", i, " of '", f.name(), "' is ", TypeToString(v.dtype, v.dims),
          " but the function was compiled for ", TypeToString(f.param_type(static_cast<int>(i)).dtype, want)));
    }
  }
  const int node = static_cast<int>(ir_->nodes_.size());
  ProgramNode pn;
  pn.fn = fn;
  pn.inputs.assign(inputs.begin(), inputs.end());
  for (int o = 0; o < f.num_outputs(); ++o) {
    pn.outputs.push_back(static_cast<int>(ir_->values_.size()));
    ir_->values_.push_back(ProgramValue{f.output_type(o).dtype, fn->output_dims(o), node, o});
  }
  std::vector<int> outs = pn.outputs;
  ir_->nodes_.push_back(std::move(pn));
  return outs;
}

absl::StatusOr<std::shared_ptr<const ProgramIr>> ProgramBuilder::Build(absl::Span<const int> outputs) {
  for (int v : outputs) {
    if (v < 0 || v >= static_cast<int>(ir_->values_.size())) {
      return absl::InvalidArgumentError(absl::StrCat("program output %", v, " is not a value of program '",
                                                     ir_->name_, "'"));
    }
  }
  ir_->outputs_.assign(outputs.begin(), outputs.end());
  return std::shared_ptr<const ProgramIr>(std::move(ir_));
}

}  // namespace pw
