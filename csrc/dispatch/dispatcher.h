#ifndef PATHWAYS_DISPATCH_DISPATCHER_H_
#define PATHWAYS_DISPATCH_DISPATCHER_H_

// Parallel asynchronous dispatch (paper §4.5, Figure 4b). Compiled functions
// have static shapes, so all the host-side work of a program (allocating
// every node's output buffers in the object stores, ordering every node in
// its island's gang scheduler, wiring inputs to producers' futures) is done
// at submission, for all nodes, without waiting for any predecessor to run.
// Execute() returns the output buffers as futures at once; executors run the
// nodes as their inputs become ready.
//
// The dispatch path is the product: per node it makes one task object and
// one allocation per output buffer, never anything per shard, takes each
// island scheduler's lock once per node, and wakes at most one executor
// thread per program. No Python, no blocking.

#include <atomic>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "csrc/coordination/transfer.h"
#include "csrc/dispatch/gang_task.h"
#include "csrc/executor/worker_pool.h"
#include "csrc/object_store/object_store.h"
#include "csrc/object_store/sharded_buffer.h"
#include "csrc/program_ir/lowering.h"
#include "csrc/scheduler/gang_scheduler.h"

namespace pw {

// A program argument: a sharded buffer, or host data to be placed.
struct ProgramArg {
  std::shared_ptr<ShardedBuffer> buffer;  // if set, the argument
  const void* host_data = nullptr;        // else: row-major host array
  DType dtype = DType::kF32;              // of host_data
  Dims dims;                              // of host_data
};

enum class DispatchMode : uint8_t {
  // All nodes' host-side work at submission (paper §4.5, Figure 4b).
  kParallel,
  // Each node's host-side work only once its inputs are ready, as a system
  // must when shapes depend on data (Figure 4a). Execute() then blocks until
  // the last node is dispatched.
  kSequential,
};

struct ExecuteOptions {
  DispatchMode mode = DispatchMode::kParallel;
  SchedulingClient* client = nullptr;  // null: the default client
  // The client's ownership label: its buffers are charged to it. May be null.
  MemoryAccount* client_account = nullptr;
  // How the caller waits for device memory (back-pressure); null: plainly.
  Blocker* blocker = nullptr;
};

// Why a call waiting for device memory must give up, if it must: the
// runtime shut down (`shut_down` may be null) or its client (may be null)
// was closed. `what` names the call ("program 'f'", "device_put").
absl::Status MemoryWaitCancelled(const std::atomic<bool>* shut_down, const SchedulingClient* client,
                                 absl::string_view what);

// Where dispatches go when hosts are processes (client/remote_cluster.h):
// it makes the run's buffers into `slots` (as DispatchSteps does, one per
// slot it fills, drawing on `owner`) and sends each host its part.
class RemoteDispatch {
 public:
  virtual absl::Status DispatchSteps(const LoweredProgram& program, absl::Span<const ProgramArg> args,
                                     const ExecuteOptions& options, const BufferOwner& owner,
                                     std::vector<std::shared_ptr<ShardedBuffer>>& slots) = 0;

 protected:
  ~RemoteDispatch() = default;
};

class ParallelDispatcher {
 public:
  // All pointers must outlive the dispatcher. `schedulers` is indexed by
  // island id. `interconnect` (may be null: no model) times the transfers
  // between slices; their recording goes to `services.timeline` and their
  // modeled ends to `services.delays`.
  ParallelDispatcher(ObjectStores* stores, std::vector<GangScheduler*> schedulers, WorkerPool* executor,
                     TransferStats* stats, GangServices services, InterconnectModel* interconnect = nullptr);

  // Dispatches every step of `program` and returns its outputs (pending).
  // InvalidArgument if the arguments do not match the program's. First it
  // reserves all the device memory the run needs (ObjectStores::Reserve):
  // when that does not fit, it waits through `options.blocker` while work
  // in flight may free memory; ResourceExhausted if it can never fit, and
  // Cancelled if the wait is interrupted or the runtime shuts down; nothing
  // is dispatched then. Every buffer is labeled with the program and the
  // client. Thread-safe; `program` must stay alive until this returns
  // (running steps keep what they need alive themselves).
  absl::StatusOr<std::vector<std::shared_ptr<ShardedBuffer>>> Execute(const LoweredProgram& program,
                                                                      absl::Span<const ProgramArg> args,
                                                                      const ExecuteOptions& options = {});

  ObjectStores* stores() const { return stores_; }
  TransferStats* transfer_stats() const { return transfer_services_.stats; }
  // Sends every later dispatch to host processes (set once, before use).
  void set_remote(RemoteDispatch* remote) { remote_ = remote; }

 private:
  absl::Status DispatchSteps(const LoweredProgram& program, absl::Span<const ProgramArg> args,
                             const ExecuteOptions& options, const BufferOwner& owner,
                             std::vector<std::shared_ptr<ShardedBuffer>>& slots, ReadyList* ready);

  ObjectStores* stores_;
  std::vector<GangScheduler*> schedulers_;
  WorkerPool* executor_;
  GangServices services_;
  TransferServices transfer_services_;
  RemoteDispatch* remote_ = nullptr;
};

}  // namespace pw

#endif  // PATHWAYS_DISPATCH_DISPATCHER_H_
