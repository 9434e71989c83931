#ifndef PATHWAYS_DISPATCH_GANG_TASK_H_
#define PATHWAYS_DISPATCH_GANG_TASK_H_

// One dispatched program node: a compiled function over a gang of devices,
// with its input and output sharded buffers. It runs when three things have
// happened, counted down in one atomic: it is at the head of every device
// queue (GangScheduler), every input is done, and the dispatcher has released
// it. It owns itself and is deleted after it runs.

#include <atomic>
#include <memory>

#include "absl/container/inlined_vector.h"
#include "csrc/object_store/sharded_buffer.h"
#include "csrc/program_ir/program_ir.h"
#include "csrc/scheduler/gang_scheduler.h"

namespace pw {

class GangTask final : public Gang {
 public:
  // The task keeps `fn` alive until it has run, so a program may be dropped
  // while its nodes are in flight.
  GangTask(std::shared_ptr<const CompiledFunction> fn, GangScheduler* scheduler,
           absl::InlinedVector<std::shared_ptr<ShardedBuffer>, 4> inputs,
           absl::InlinedVector<std::shared_ptr<ShardedBuffer>, 2> outputs);

  // Registers the input waiters and enqueues the gang. After this the task
  // may run (and be deleted) at any time once Release() is called.
  void Submit(ReadyList* ready);
  // The dispatcher's hold: the task cannot run before this is called.
  void Release(ReadyList* ready) { CountDown(ready); }

  void Run(RunContext& ctx) override;

 protected:
  void OnAtHeadOfAllQueues(ReadyList* ready) override { CountDown(ready); }

 private:
  struct InputWaiter final : BufferWaiter {
    GangTask* task = nullptr;
    void OnBufferDone(const absl::Status&, ReadyList* ready) override { task->CountDown(ready); }
  };
  void CountDown(ReadyList* ready) {
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) ready->Push(this);
  }

  std::shared_ptr<const CompiledFunction> fn_;
  GangScheduler* scheduler_;
  absl::InlinedVector<std::shared_ptr<ShardedBuffer>, 4> inputs_;
  absl::InlinedVector<std::shared_ptr<ShardedBuffer>, 2> outputs_;
  absl::InlinedVector<InputWaiter, 4> waiters_;
  std::atomic<int> pending_;
};

}  // namespace pw

#endif  // PATHWAYS_DISPATCH_GANG_TASK_H_
