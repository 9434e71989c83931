#include "csrc/dispatch/gang_task.h"

namespace pw {

GangTask::GangTask(std::shared_ptr<const CompiledFunction> fn, GangScheduler* scheduler,
                   absl::InlinedVector<std::shared_ptr<ShardedBuffer>, 4> inputs,
                   absl::InlinedVector<std::shared_ptr<ShardedBuffer>, 2> outputs)
    : Gang(fn->physical_devices()),
      fn_(std::move(fn)),
      scheduler_(scheduler),
      inputs_(std::move(inputs)),
      outputs_(std::move(outputs)),
      waiters_(inputs_.size()),
      // Each input, the head of all queues, and the dispatcher's hold.
      pending_(static_cast<int>(inputs_.size()) + 2) {}

void GangTask::Submit(ReadyList* ready) {
  for (size_t i = 0; i < inputs_.size(); ++i) {
    waiters_[i].task = this;
    if (!inputs_[i]->AddWaiter(&waiters_[i])) CountDown(ready);
  }
  scheduler_->Enqueue(this, ready);
}

void GangTask::Run(RunContext& ctx) {
  absl::Status failed;
  for (const auto& in : inputs_) {
    if (absl::Status s = in->status(); !s.ok()) {
      failed = std::move(s);
      break;
    }
  }
  if (failed.ok()) {
    const FunctionExecutable& exe = fn_->executable();
    const int n = gang_devices()->size();
    absl::InlinedVector<const void*, 4> in_ptrs;
    absl::InlinedVector<void*, 2> out_ptrs;
    for (const auto& in : inputs_) in_ptrs.push_back(in->data());
    for (const auto& out : outputs_) out_ptrs.push_back(out->data());
    exe.Run(n, in_ptrs, out_ptrs, ctx.Scratch(exe.scratch_bytes(n)));
  }
  // Free the devices first so the next gang in the island order can start.
  scheduler_->Complete(this, ctx.ready);
  for (const auto& out : outputs_) {
    if (failed.ok()) {
      out->SetReady(ctx.ready);
    } else {
      out->SetError(failed, ctx.ready);
    }
  }
  delete this;
}

}  // namespace pw
