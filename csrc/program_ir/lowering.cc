#include "csrc/program_ir/lowering.h"

#include <atomic>

#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace pw {

int LoweredProgram::num_compute_steps() const {
  int n = 0;
  for (const LoweredStep& s : steps_) n += s.kind == LoweredStep::Kind::kCompute;
  return n;
}

int LoweredProgram::num_transfer_steps() const {
  return static_cast<int>(steps_.size()) - num_compute_steps();
}

std::string LoweredProgram::ToText() const {
  auto slots = [](const absl::InlinedVector<int, 4>& s) {
    return absl::StrJoin(s, ", ", [](std::string* out, int v) { absl::StrAppend(out, "%", v); });
  };
  auto type = [this](int slot) { return TypeToString(slot_types_[slot].dtype, slot_types_[slot].dims); };
  std::string out = absl::StrCat("lowered program @", ir_->name(), " (", num_compute_steps(), " compute, ",
                                 num_transfer_steps(), " transfer) {\n");
  for (const ArgPlacement& p : arg_placements_) {
    absl::StrAppend(&out, "  %", p.slot, " = arg ", p.arg, " : ", type(p.slot), " -> ", p.devices->ToString(),
                    "\n");
  }
  for (const LoweredStep& s : steps_) {
    if (s.kind == LoweredStep::Kind::kCompute) {
      std::vector<std::string> outs, types;
      for (int o : s.out_slots) {
        outs.push_back(absl::StrCat("%", o));
        types.push_back(type(o));
      }
      absl::StrAppend(&out, "  ", absl::StrJoin(outs, ", "), " = compute @", s.fn->name(), "(",
                      slots(s.in_slots), ") on ", s.devices->ToString(), " : ", absl::StrJoin(types, ", "),
                      "\n");
    } else {
      absl::StrAppend(&out, "  %", s.out_slots[0], " = transfer.", LinkKindName(s.link), " %", s.in_slots[0],
                      " -> ", s.devices->ToString(), " : ", type(s.out_slots[0]), "\n");
    }
  }
  absl::StrAppend(&out, "  return ",
                  absl::StrJoin(output_slots_, ", ",
                                [](std::string* o, int v) { absl::StrAppend(o, "%", v); }),
                  "\n}\n");
  return out;
}

absl::StatusOr<const LoweredProgram*> LoweredProgram::Current() const {
  if (generation_.load(std::memory_order_acquire) == MappingGeneration()) {
    return current_.load(std::memory_order_acquire);
  }
  MutexLock lock(&relower_mu_);
  // The generation before the epochs: a remap after this read is seen by
  // the next run.
  const uint64_t generation = MappingGeneration();
  const LoweredProgram* current = this;
  if (relowered_ != nullptr) {
    auto latest = relowered_->Current();
    if (!latest.ok()) return latest.status();
    current = *latest;
  } else {
    for (const auto& [slice, epoch] : slice_epochs_) {
      if (slice->epoch() == epoch) continue;
      auto again = Lower(ir_);
      if (!again.ok()) return again.status();
      relowered_ = *std::move(again);
      current = relowered_.get();
      break;
    }
  }
  current_.store(current, std::memory_order_release);
  generation_.store(generation, std::memory_order_release);
  return current;
}

absl::StatusOr<std::shared_ptr<const LoweredProgram>> Lower(std::shared_ptr<const ProgramIr> ir) {
  auto lowered = std::shared_ptr<LoweredProgram>(new LoweredProgram());
  // Before reading any mapping: a remap during the lowering makes the next
  // run look again.
  lowered->generation_.store(MappingGeneration(), std::memory_order_relaxed);
  static std::atomic<uint64_t> next_id{1};
  lowered->id_ = next_id.fetch_add(1, std::memory_order_relaxed);
  const auto& values = ir->values();
  // Per program value: the slot holding it on each set of devices.
  std::vector<absl::flat_hash_map<const DeviceList*, int>> placed(values.size());
  // The devices each value is produced on (nullptr for arguments).
  std::vector<const DeviceList*> home(values.size(), nullptr);
  std::vector<int> home_slot(values.size(), -1);
  auto new_slot = [&](int value) {
    lowered->slot_types_.push_back(SlotType{values[value].dtype, values[value].dims});
    return static_cast<int>(lowered->slot_types_.size()) - 1;
  };
  // The slot holding `value` on `devices`, adding a placement or transfer.
  auto slot_on = [&](int value, const DeviceList* devices) {
    auto it = placed[value].find(devices);
    if (it != placed[value].end()) return it->second;
    const int slot = new_slot(value);
    placed[value].emplace(devices, slot);
    if (values[value].producer < 0) {
      lowered->arg_placements_.push_back(ArgPlacement{values[value].index, devices, slot});
    } else {
      LoweredStep step;
      step.kind = LoweredStep::Kind::kTransfer;
      step.devices = devices;
      step.link = ClassifyLink(*home[value], *devices);
      step.in_slots.push_back(home_slot[value]);
      step.out_slots.push_back(slot);
      lowered->steps_.push_back(std::move(step));
    }
    return slot;
  };

  for (int n = 0; n < ir->num_nodes(); ++n) {
    const ProgramNode& node = ir->nodes()[n];
    auto mapped = node.fn->physical_devices();
    if (!mapped.ok()) return mapped.status();
    const DeviceList* devices = *mapped;
    for (const VirtualDevice& v : node.fn->virtual_devices()) {
      const VirtualSlice* s = v.slice.get();
      if (std::none_of(lowered->slice_epochs_.begin(), lowered->slice_epochs_.end(),
                       [s](const auto& e) { return e.first == s; })) {
        lowered->slice_epochs_.emplace_back(s, s->epoch());
      }
    }
    if (devices->island() == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("node '", node.fn->name(), "' spans islands"));
    }
    LoweredStep step;
    step.kind = LoweredStep::Kind::kCompute;
    step.devices = devices;
    step.fn = node.fn.get();
    step.node = n;
    for (int v : node.inputs) step.in_slots.push_back(slot_on(v, devices));
    for (int v : node.outputs) {
      const int slot = new_slot(v);
      home[v] = devices;
      home_slot[v] = slot;
      placed[v].emplace(devices, slot);
      step.out_slots.push_back(slot);
    }
    lowered->steps_.push_back(std::move(step));
  }
  for (int v : ir->outputs()) {
    if (values[v].producer < 0) {
      return absl::InvalidArgumentError(absl::StrCat("output %", v, " of program '", ir->name(),
                                                     "' is its argument ", values[v].index,
                                                     "; return the input directly"));
    }
    lowered->output_slots_.push_back(home_slot[v]);
  }
  // What the steps' outputs need, per device list, reserved at once by each
  // dispatch (ObjectStores::Reserve).
  for (const LoweredStep& step : lowered->steps_) {
    int64_t bytes = 0;
    for (int slot : step.out_slots) bytes += ShardBytes(lowered->slot_types_[slot].dtype, lowered->slot_types_[slot].dims);
    lowered->step_bytes_ += bytes * step.devices->size();
    lowered->step_buffers_ += static_cast<int64_t>(step.out_slots.size());
    auto it = std::find_if(lowered->step_memory_.begin(), lowered->step_memory_.end(),
                           [&](const MemoryRequest& r) { return r.devices == step.devices; });
    if (it == lowered->step_memory_.end()) {
      lowered->step_memory_.push_back(MemoryRequest{step.devices, bytes});
    } else {
      it->bytes_per_device += bytes;
    }
  }
  lowered->memory_account_ = std::make_shared<MemoryAccount>(ir->name());
  lowered->ir_ = std::move(ir);
  return std::shared_ptr<const LoweredProgram>(std::move(lowered));
}

}  // namespace pw
