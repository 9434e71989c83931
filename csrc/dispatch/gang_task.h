#ifndef PATHWAYS_DISPATCH_GANG_TASK_H_
#define PATHWAYS_DISPATCH_GANG_TASK_H_

// One dispatched program node: a compiled function over a gang of devices,
// with its input and output sharded buffers. It runs when three things have
// happened, counted down in one atomic: it is at the head of every device
// queue (GangScheduler), every input is done, and the dispatcher has released
// it. It owns itself and is deleted once finished.
//
// Running: the real kernels run at once on the executor thread; if the
// function has simulated compute time, the gang keeps its devices until
// start + that time (DelayQueue), then finishes: frees the devices, completes
// its outputs, records its timeline event and charges its client.

#include <atomic>
#include <memory>

#include "absl/container/inlined_vector.h"
#include "csrc/executor/delay_queue.h"
#include "csrc/executor/timeline.h"
#include "csrc/object_store/sharded_buffer.h"
#include "csrc/program_ir/program_ir.h"
#include "csrc/scheduler/gang_scheduler.h"

namespace pw {

// Runtime services a gang uses while running. Must outlive every task.
struct GangServices {
  ObjectStores* stores = nullptr;
  DelayQueue* delays = nullptr;
  Timeline* timeline = nullptr;
  int64_t control_latency_ns = 0;  // see TopologyOptions::control_latency_ns
  // When set and true, gangs that have not started yet are cancelled: they
  // skip their kernels and simulated time and fail their outputs with a
  // Cancelled error (the runtime is shutting down). Null: never.
  const std::atomic<bool>* cancelled = nullptr;
  // The most parts a gang's shards split into, to run on that many executor
  // threads at once (FunctionExecutable::RunStage): the executor's threads.
  int max_shard_parts = 1;
};

// A gang splits its shards across threads only when each shard has at least
// this much work (FunctionExecutable::work_per_shard(), about elements
// written): ~30 us of kernels, well above the cost of a hand-off between
// threads. Smaller gangs (a scalar psum chain) run on one thread.
inline constexpr int64_t kMinParallelWorkPerShard = 1 << 15;

class GangTask final : public Gang {
 public:
  // `program` keeps `fn` (one of its nodes) alive until the task is done,
  // so a program may be dropped while its nodes are in flight. `devices`:
  // where the lowered step runs (`fn`'s devices when it was lowered).
  GangTask(std::shared_ptr<const ProgramIr> program, const CompiledFunction* fn, const DeviceList* devices,
           GangScheduler* scheduler,
           SchedulingClient* client, const GangServices* services,
           absl::InlinedVector<std::shared_ptr<ShardedBuffer>, 4> inputs,
           absl::InlinedVector<std::shared_ptr<ShardedBuffer>, 2> outputs);

  // Registers the input waiters and submits the gang to its scheduler.
  void Submit(ReadyList* ready);
  // The dispatcher's hold: the task cannot run before this is called.
  void Release(ReadyList* ready) { CountDown(ready); }

  void Run(RunContext& ctx) override;

  // True if a device of the gang has failed (see Device::failed()): the
  // runtime then completes it early, with the failure, if it is in its
  // simulated time.
  bool OnFailedDevice() const { return gang_devices()->FailedDevice() != nullptr; }

 protected:
  void OnAtHeadOfAllQueues(ReadyList* ready) override { CountDown(ready); }
  bool InputsSequenced() const override;
  void OnSequenced() override;
  // Diagnosis (gang_task_diagnosis.cc).
  const std::string* program_name() const override { return &program_->name(); }
  const std::string* node_name() const override { return &fn_->name(); }
  int PendingInputs(std::vector<PendingInput>* out) const override;
  void AppendOutputs(std::vector<const void*>* out) const override;

 private:
  struct InputWaiter final : BufferWaiter {
    GangTask* task = nullptr;
    void OnBufferDone(const absl::Status&, ReadyList* ready) override { task->OnInputDone(ready); }
  };
  void OnInputDone(ReadyList* ready) {
    // Read before counting down: once the count reaches zero on another
    // thread, this task may run and be deleted.
    const bool waiting_for_admission = !sequenced();
    GangScheduler* scheduler = scheduler_;
    CountDown(ready);
    if (waiting_for_admission) scheduler->RetryAdmission(ready);
  }
  void CountDown(ReadyList* ready) {
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) ready->Push(this);
  }
  // Fails the gang (failed_) if one of its devices has failed.
  void CheckDevices();
  // The buffers' memory, as the kernels take it.
  struct BufferPointers {
    absl::InlinedVector<const void*, 4> inputs;
    absl::InlinedVector<void*, 2> outputs;
  };
  BufferPointers Pointers() const;
  // After the kernels: the simulated time, if any, then Finish.
  void KernelsDone(RunContext& ctx);
  void Finish(RunContext& ctx);

  // A shard-parallel run: parts_[i] runs shards [begin, end) of each stage;
  // the part that finishes a stage last runs its closing collective and
  // starts the next stage's parts.
  struct Part final : Runnable {
    GangTask* task = nullptr;
    int begin = 0, end = 0;
    void Run(RunContext& ctx) override { task->RunPart(ctx, *this); }
  };
  // How many parts this gang's run splits into (1: on this thread alone).
  int NumParts() const;
  void StartParts(RunContext& ctx, int num_parts);
  // Moves on to the next stage: its parts queued when it has enough work,
  // else run here (all shards) and on to the one after; after the last, the
  // scratch back to its pool and KernelsDone.
  void AdvanceStages(RunContext& ctx);
  void RunPart(RunContext& ctx, const Part& part);
  // ResourceExhausted: `bytes` of scratch could not be allocated.
  absl::Status ScratchError(int64_t bytes) const;

  ObjectStores::WorkInFlight in_flight_;  // first: ends after the buffers go
  std::shared_ptr<const ProgramIr> program_;
  const CompiledFunction* fn_;
  GangScheduler* scheduler_;
  const GangServices* services_;
  absl::InlinedVector<std::shared_ptr<ShardedBuffer>, 4> inputs_;
  absl::InlinedVector<std::shared_ptr<ShardedBuffer>, 2> outputs_;
  absl::InlinedVector<InputWaiter, 4> waiters_;
  std::atomic<int> pending_;
  bool kernels_done_ = false;  // Run() is called again after a simulated delay
  absl::InlinedVector<Part, 2> parts_;
  std::atomic<int> parts_left_{0};
  std::atomic<bool> scratch_failed_{false};  // a part had no tile scratch
  int stage_ = 0;                    // the stage the parts run
  void* shared_scratch_ = nullptr;   // from the executable's pool, during a parallel run
  int64_t start_ns_ = 0;
  absl::Status failed_;
};

}  // namespace pw

#endif  // PATHWAYS_DISPATCH_GANG_TASK_H_
