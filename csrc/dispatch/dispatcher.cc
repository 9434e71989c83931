#include "csrc/dispatch/dispatcher.h"

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "csrc/base/spin.h"
#include "csrc/dispatch/gang_task.h"

namespace pw {
namespace {

// The modeled control message of a parallel dispatch: it reaches every host
// at once, `control_latency_ns` after the call, and releases the program's
// nodes there. Owns itself.
class ReleaseMessage final : public Runnable {
 public:
  void Add(GangTask* task) { tasks_.push_back(task); }
  bool empty() const { return tasks_.empty(); }
  void Run(RunContext& ctx) override {
    for (GangTask* task : tasks_) task->Release(ctx.ready);
    delete this;
  }

 private:
  std::vector<GangTask*> tasks_;
};

// Waits `ns` on the calling thread (the client's side of a sequential
// dispatch message).
void WaitNanos(int64_t ns) {
  if (ns <= 0) return;
  const int64_t deadline = NowNanos() + ns;
  if (ns > 200'000) std::this_thread::sleep_for(std::chrono::nanoseconds(ns - 100'000));
  SpinUntil([&] { return NowNanos() >= deadline; }, ns);
}

}  // namespace

absl::Status MemoryWaitCancelled(const std::atomic<bool>* shut_down, const SchedulingClient* client,
                                 absl::string_view what) {
  if (shut_down != nullptr && shut_down->load(std::memory_order_acquire)) {
    return absl::CancelledError(
        absl::StrCat(what, " was cancelled while it waited for device memory: the pathways runtime shut down"));
  }
  if (client != nullptr && client->closed()) {
    return absl::CancelledError(absl::StrCat(what, " was cancelled while it waited for device memory: its client '",
                                             client->name(), "' was closed"));
  }
  return absl::OkStatus();
}

ParallelDispatcher::ParallelDispatcher(ObjectStores* stores, std::vector<GangScheduler*> schedulers,
                                       WorkerPool* executor, TransferStats* stats, GangServices services,
                                       InterconnectModel* interconnect)
    : stores_(stores),
      schedulers_(std::move(schedulers)),
      executor_(executor),
      services_(services),
      transfer_services_{stats, services.timeline, interconnect, services.delays} {}

absl::StatusOr<std::vector<std::shared_ptr<ShardedBuffer>>> ParallelDispatcher::Execute(
    const LoweredProgram& program, absl::Span<const ProgramArg> args, const ExecuteOptions& options) {
  const ProgramIr& ir = program.ir();
  if (static_cast<int>(args.size()) != ir.num_args()) {
    return absl::InvalidArgumentError(absl::StrCat("program '", ir.name(), "' takes ", ir.num_args(),
                                                   " arguments, got ", args.size()));
  }
  for (int a = 0; a < ir.num_args(); ++a) {
    const ProgramValue& want = ir.values()[a];
    const ProgramArg& arg = args[a];
    const DType dtype = arg.buffer ? arg.buffer->dtype() : arg.dtype;
    const Dims& dims = arg.buffer ? arg.buffer->dims() : arg.dims;
    if (dtype != want.dtype || dims != want.dims) {
      return absl::InvalidArgumentError(absl::StrCat("argument ", a, " of program '", ir.name(), "' must be ",
                                                     TypeToString(want.dtype, want.dims), ", got ",
                                                     TypeToString(dtype, dims)));
    }
  }
  // All the memory of the run at once: the steps' outputs, and arguments
  // placed on devices other than their own.
  absl::InlinedVector<MemoryRequest, 4> requests(program.step_memory().begin(), program.step_memory().end());
  int64_t run_bytes = program.step_bytes();  // over all shards
  int64_t run_buffers = program.step_buffers();
  for (const ArgPlacement& p : program.arg_placements()) {
    const ProgramArg& arg = args[p.arg];
    if (arg.buffer != nullptr && arg.buffer->devices() == p.devices) continue;
    const DType dtype = arg.buffer ? arg.buffer->dtype() : arg.dtype;
    const Dims& dims = arg.buffer ? arg.buffer->dims() : arg.dims;
    if (dims.empty() || dims[0] != p.devices->size()) {
      return absl::InvalidArgumentError(absl::StrCat("argument ", p.arg, " of program '", ir.name(), "' of shape ",
                                                     DimsToString(dims), " needs a leading axis of size ",
                                                     p.devices->size(), ", one entry per device"));
    }
    requests.push_back(MemoryRequest{p.devices, ShardBytes(dtype, dims)});
    run_bytes += requests.back().bytes_per_device * p.devices->size();
    ++run_buffers;
  }
  auto cancelled = [&] {  // only while waiting: off the fast path
    return MemoryWaitCancelled(services_.cancelled, options.client, absl::StrCat("program '", ir.name(), "'"));
  };
  auto reservation = stores_->Reserve(requests, options.blocker != nullptr ? options.blocker : Blocker::Plain(),
                                      cancelled, ir.name());
  if (!reservation.ok()) return reservation.status();
  // The ownership labels: the run's buffers are charged to the client and
  // the program at once, not one by one.
  MemoryAccount* program_account = program.memory_account().get();
  stores_->ListAccount(program.memory_account());
  if (options.client_account != nullptr) options.client_account->Charge(run_bytes, run_buffers);
  program_account->Charge(run_bytes, run_buffers);
  const BufferOwner owner{&*reservation, options.client_account, program_account, /*precharged=*/true};
  std::vector<std::shared_ptr<ShardedBuffer>> slots(program.num_slots());
  ReadyList ready;
  absl::Status status = remote_ != nullptr ? remote_->DispatchSteps(program, args, options, owner, slots)
                                           : DispatchSteps(program, args, options, owner, slots, &ready);
  // Whatever was dispatched runs, even if a later step failed to dispatch.
  executor_->Submit(ready);
  if (!status.ok()) {
    // Give back the charge of the buffers the run did not make: every slot
    // filled holds one it made, except arguments used where they are.
    for (const ArgPlacement& p : program.arg_placements()) {
      if (args[p.arg].buffer != nullptr && args[p.arg].buffer->devices() == p.devices) slots[p.slot] = nullptr;
    }
    for (const auto& made : slots) {
      if (made == nullptr) continue;
      run_bytes -= made->total_bytes();
      --run_buffers;
    }
    if (options.client_account != nullptr) options.client_account->Discharge(run_bytes, run_buffers);
    program_account->Discharge(run_bytes, run_buffers);
    return status;
  }
  std::vector<std::shared_ptr<ShardedBuffer>> outputs;
  outputs.reserve(program.output_slots().size());
  for (int slot : program.output_slots()) outputs.push_back(slots[slot]);
  return outputs;
}

absl::Status ParallelDispatcher::DispatchSteps(const LoweredProgram& program, absl::Span<const ProgramArg> args,
                                               const ExecuteOptions& options, const BufferOwner& owner,
                                               std::vector<std::shared_ptr<ShardedBuffer>>& slots,
                                               ReadyList* ready) {
  for (const ArgPlacement& p : program.arg_placements()) {
    const ProgramArg& arg = args[p.arg];
    if (arg.buffer == nullptr) {
      auto placed = CopyFromHost(stores_, arg.dtype, arg.dims, arg.host_data, p.devices, transfer_services_.stats, owner);
      if (!placed.ok()) return placed.status();
      slots[p.slot] = *std::move(placed);
    } else if (arg.buffer->devices() == p.devices) {
      slots[p.slot] = arg.buffer;
    } else {
      auto dst = ShardedBuffer::Allocate(stores_, arg.buffer->dtype(), arg.buffer->dims(), p.devices, owner);
      if (!dst.ok()) return dst.status();
      (*dst)->SetCopiedFrom(arg.buffer);
      slots[p.slot] = *dst;
      (new TransferTask(arg.buffer, *std::move(dst), ClassifyLink(*arg.buffer->devices(), *p.devices),
                        &transfer_services_))
          ->Start(ready);
    }
  }
  const auto& types = program.slot_types();
  const int64_t latency = services_.control_latency_ns;
  const bool sequential = options.mode == DispatchMode::kSequential;
  // Parallel dispatch with a modeled control latency: nodes are released by
  // one message that arrives after the latency.
  ReleaseMessage* message = (!sequential && latency > 0) ? new ReleaseMessage() : nullptr;
  // Sent on every path out, so nodes dispatched before an error still run.
  absl::Cleanup send = [&] {
    if (message == nullptr) return;
    if (message->empty()) {
      delete message;
    } else {
      services_.delays->RunAt(NowNanos() + latency, message);
    }
  };
  for (const LoweredStep& step : program.steps()) {
    if (sequential && step.kind == LoweredStep::Kind::kCompute) {
      // The traditional model: this node's host-side work (allocation,
      // scheduling) waits for its inputs, then for the control message that
      // carries them to its host. Hand over what is ready, then wait.
      executor_->Submit(*ready);
      for (int slot : step.in_slots) slots[slot]->Await().IgnoreError();  // errors flow to the outputs
      WaitNanos(latency);
    }
    absl::InlinedVector<std::shared_ptr<ShardedBuffer>, 2> outputs;
    for (int slot : step.out_slots) {
      auto out = ShardedBuffer::Allocate(stores_, types[slot].dtype, types[slot].dims, step.devices, owner);
      if (!out.ok()) return out.status();
      slots[slot] = *out;
      outputs.push_back(*std::move(out));
    }
    if (step.kind == LoweredStep::Kind::kTransfer) {
      outputs[0]->SetCopiedFrom(slots[step.in_slots[0]]);
      (new TransferTask(slots[step.in_slots[0]], std::move(outputs[0]), step.link, &transfer_services_))
          ->Start(ready);
      continue;
    }
    absl::InlinedVector<std::shared_ptr<ShardedBuffer>, 4> inputs;
    for (int slot : step.in_slots) inputs.push_back(slots[slot]);
    auto* task = new GangTask(program.ir_ptr(), step.fn, step.devices, schedulers_[step.devices->island()->id()],
                              options.client, &services_, std::move(inputs), std::move(outputs));
    task->Submit(ready);
    if (message != nullptr) {
      message->Add(task);
    } else {
      task->Release(ready);
    }
  }
  return absl::OkStatus();
}

}  // namespace pw
