#include "csrc/dispatch/gang_task.h"

#include "absl/strings/str_cat.h"
#include "csrc/base/spin.h"

namespace pw {

GangTask::GangTask(std::shared_ptr<const ProgramIr> program, const CompiledFunction* fn, const DeviceList* devices,
                   GangScheduler* scheduler,
                   SchedulingClient* client, const GangServices* services,
                   absl::InlinedVector<std::shared_ptr<ShardedBuffer>, 4> inputs,
                   absl::InlinedVector<std::shared_ptr<ShardedBuffer>, 2> outputs)
    : Gang(devices, client,
           std::max<int64_t>(fn->executable().ir().simulated_ns(), kNominalKernelNs)),
      in_flight_(services->stores),
      program_(std::move(program)),
      fn_(fn),
      scheduler_(scheduler),
      services_(services),
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

bool GangTask::InputsSequenced() const {
  const int island = gang_devices()->island()->id();
  for (const auto& in : inputs_) {
    if (!in->IsSequencedOn(island)) return false;
  }
  return true;
}

void GangTask::OnSequenced() {
  const int island = gang_devices()->island()->id();
  for (const auto& out : outputs_) out->MarkSequenced(island);
}

void GangTask::Run(RunContext& ctx) {
  if (kernels_done_) {  // back from the delay queue
    Finish(ctx);
    return;
  }
  kernels_done_ = true;
  start_ns_ = NowNanos();
  if (services_->cancelled != nullptr && services_->cancelled->load(std::memory_order_acquire)) {
    failed_ = absl::CancelledError(absl::StrCat("'", fn_->name(), "' in program '", program_->name(),
                                                "' was cancelled: the pathways runtime shut down"));
  } else if (client() != nullptr && client()->closed()) {
    failed_ = absl::CancelledError(absl::StrCat("'", fn_->name(), "' in program '", program_->name(),
                                                "' was cancelled: its client '", client()->name(), "' was closed"));
  }
  CheckDevices();
  for (const auto& in : inputs_) {
    if (!failed_.ok()) break;
    if (absl::Status s = in->status(); !s.ok()) failed_ = std::move(s);
  }
  if (failed_.ok()) {
    if (const int parts = NumParts(); parts > 1) {
      StartParts(ctx, parts);
      return;
    }
    const FunctionExecutable& exe = fn_->executable();
    const int n = gang_devices()->size();
    if (void* scratch = ctx.Scratch(exe.scratch_bytes(n)); scratch == nullptr) {
      failed_ = ScratchError(exe.scratch_bytes(n));
    } else {
      const BufferPointers p = Pointers();
      exe.Run(n, p.inputs, p.outputs, scratch);
    }
  }
  KernelsDone(ctx);
}

absl::Status GangTask::ScratchError(int64_t bytes) const {
  return absl::ResourceExhaustedError(absl::StrCat("'", fn_->name(), "' in program '", program_->name(),
                                                   "' failed: cannot allocate ", bytes,
                                                   " bytes of scratch for its intermediate values"));
}

GangTask::BufferPointers GangTask::Pointers() const {
  BufferPointers p;
  for (const auto& in : inputs_) p.inputs.push_back(in->data());
  for (const auto& out : outputs_) p.outputs.push_back(out->data());
  return p;
}

void GangTask::KernelsDone(RunContext& ctx) {
  if (failed_.ok()) {
    if (const int64_t simulated = fn_->executable().ir().simulated_ns(); simulated > 0) {
      services_->delays->RunAt(start_ns_ + simulated, this);
      return;
    }
  }
  Finish(ctx);
}

int GangTask::NumParts() const {
  const FunctionExecutable& exe = fn_->executable();
  const int n = gang_devices()->size();
  if (services_->max_shard_parts < 2 || n < 2 ||
      exe.work_per_shard() < kMinParallelWorkPerShard) {
    return 1;
  }
  return std::min(n, services_->max_shard_parts);
}

void GangTask::StartParts(RunContext& ctx, int num_parts) {
  const FunctionExecutable& exe = fn_->executable();
  const int n = gang_devices()->size();
  shared_scratch_ = exe.AcquireSharedScratch(exe.shared_scratch_bytes(n));
  if (shared_scratch_ == nullptr) {
    failed_ = ScratchError(exe.shared_scratch_bytes(n));
    KernelsDone(ctx);
    return;
  }
  parts_.resize(static_cast<size_t>(num_parts));
  for (int i = 0; i < num_parts; ++i) {
    parts_[i].task = this;
    parts_[i].begin = static_cast<int>(int64_t{n} * i / num_parts);
    parts_[i].end = static_cast<int>(int64_t{n} * (i + 1) / num_parts);
  }
  stage_ = -1;
  AdvanceStages(ctx);
}

void GangTask::AdvanceStages(RunContext& ctx) {
  const FunctionExecutable& exe = fn_->executable();
  const int n = gang_devices()->size();
  while (++stage_ < exe.num_stages()) {
    if (exe.stage_work_per_shard(stage_) >= kMinParallelWorkPerShard) {
      // This thread runs the first part next; the executor offers the
      // others to its other threads once this job returns.
      parts_left_.store(static_cast<int>(parts_.size()), std::memory_order_relaxed);
      for (Part& p : parts_) ctx.ready->Push(&p);
      return;
    }
    // A small stage: every shard on this thread, no hand-off.
    void* tiles = ctx.Scratch(exe.tile_bytes());
    if (tiles == nullptr) {
      scratch_failed_.store(true, std::memory_order_relaxed);
      break;
    }
    const BufferPointers p = Pointers();
    exe.RunStage(stage_, n, 0, n, p.inputs, p.outputs, shared_scratch_, tiles);
    exe.RunStageCollective(stage_, n, p.inputs, shared_scratch_);
  }
  // A part whose thread had no memory for its tiles skipped its shards:
  // the gang fails, and the stages after that one never run.
  if (scratch_failed_.load(std::memory_order_relaxed)) failed_ = ScratchError(exe.tile_bytes());
  exe.ReleaseSharedScratch(shared_scratch_, exe.shared_scratch_bytes(n));
  shared_scratch_ = nullptr;
  KernelsDone(ctx);
}

void GangTask::RunPart(RunContext& ctx, const Part& part) {
  const FunctionExecutable& exe = fn_->executable();
  const int n = gang_devices()->size();
  const BufferPointers p = Pointers();
  if (void* tiles = ctx.Scratch(exe.tile_bytes()); tiles == nullptr) {
    scratch_failed_.store(true, std::memory_order_relaxed);
  } else {
    exe.RunStage(stage_, n, part.begin, part.end, p.inputs, p.outputs, shared_scratch_, tiles);
  }
  // The last part of the stage to finish closes it; its acquire sees every
  // other part's writes.
  if (parts_left_.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  if (scratch_failed_.load(std::memory_order_relaxed)) {
    stage_ = exe.num_stages() - 1;  // AdvanceStages ends the run
  } else {
    exe.RunStageCollective(stage_, n, p.inputs, shared_scratch_);
  }
  AdvanceStages(ctx);
}

void GangTask::CheckDevices() {
  if (!failed_.ok()) return;
  if (absl::Status health = gang_devices()->CheckHealthy(); !health.ok()) {
    failed_ = absl::Status(health.code(), absl::StrCat("'", fn_->name(), "' in program '", program_->name(),
                                                       "' failed: ", health.message()));
  }
}

void GangTask::Finish(RunContext& ctx) {
  CheckDevices();  // a device may have failed during the simulated time
  const int64_t end_ns = NowNanos();
  // Record and charge before completing: once the outputs are ready a waiter
  // may stop the timeline or read the stats, and must see this gang.
  if (client() != nullptr) client()->AddUsage((end_ns - start_ns_) * gang_devices()->size());
  if (services_->timeline->recording()) {
    services_->timeline->Record(TimelineEvent{gang_devices(), start_ns_, end_ns,
                                              client() ? &client()->name() : &DefaultClientName(),
                                              &program_->name(), &fn_->name(), program_});
  }
  // Free the devices first so the next gang in the island order can start.
  scheduler_->Complete(this, ctx.ready, end_ns - start_ns_);
  // Drop the inputs before completing the outputs: whoever sees an output
  // ready also sees the memory of inputs nobody else holds returned.
  inputs_.clear();
  for (const auto& out : outputs_) {
    if (failed_.ok()) {
      out->SetReady(ctx.ready);
    } else {
      out->SetError(failed_, ctx.ready);
    }
  }
  delete this;
}

}  // namespace pw
