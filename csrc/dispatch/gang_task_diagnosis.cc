// GangTask's answers to the gang scheduler's diagnosis (scheduler/diagnosis.h),
// apart from gang_task.cc: never on the dispatch path. Called with the
// scheduler's lock held while the task is queued, so it is alive and its
// inputs and outputs are fixed.

#include "csrc/dispatch/gang_task.h"

namespace pw {

int GangTask::PendingInputs(std::vector<PendingInput>* out) const {
  int pending = 0;
  for (size_t i = 0; i < inputs_.size(); ++i) {
    const std::shared_ptr<ShardedBuffer>& in = inputs_[i];
    if (in->IsDone()) continue;
    ++pending;
    if (out == nullptr) continue;
    PendingInput& p = out->emplace_back();
    p.index = static_cast<int>(i);
    p.type = TypeToString(in->dtype(), in->dims());
    p.devices = in->devices();
    p.buffer = in;
    if (std::shared_ptr<ShardedBuffer> source = in->copied_from()) {
      p.copy = true;
      p.source_done = source->IsDone();
      p.source = std::move(source);
    }
  }
  return pending;
}

void GangTask::AppendOutputs(std::vector<const void*>* out) const {
  for (const auto& output : outputs_) out->push_back(output.get());
}

}  // namespace pw
