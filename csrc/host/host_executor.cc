#include "csrc/host/host_executor.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <stop_token>

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "csrc/base/error_kind.h"
#include "csrc/base/status_macros.h"
#include "csrc/base/spin.h"
#include "csrc/coordination/host_channel.h"
#include "csrc/function_ir/function_ir_wire.h"
#include "csrc/host/shard_reader.h"
#include "csrc/host/shard_writer.h"

namespace pw {
namespace {

// Bounds what a client may ask of one host: a program's slots (a shard's
// bytes: kMaxShardBytes, host_buffers.h).
constexpr int kMaxSlots = 1 << 22;

uint8_t* AlignedAlloc(int64_t bytes) {
  if (bytes < 0 || bytes > kMaxShardBytes * 65536) return nullptr;
  const size_t size = (static_cast<size_t>(std::max<int64_t>(bytes, 1)) + 63) / 64 * 64;
  return static_cast<uint8_t*>(std::aligned_alloc(64, size));
}

// A device list's key in its session (list ids are int32 on the wire).
SessionKey ListKey(SessionId session, int list_id) { return SessionKey{session, static_cast<uint64_t>(list_id)}; }

}  // namespace

// Scratch memory of one device thread, 64-byte aligned, grown on demand.
class HostExecutor::Scratch {
 public:
  ~Scratch() { std::free(data_); }
  // Null if `bytes` cannot be allocated (a later call may try again). Never
  // null for 0 bytes: a function without scratch still runs.
  uint8_t* Get(int64_t bytes) {
    if (bytes > capacity_ || data_ == nullptr) {
      std::free(data_);
      const int64_t size = std::max<int64_t>(bytes, 64);
      data_ = AlignedAlloc(size);
      capacity_ = data_ != nullptr ? size : 0;
    }
    return data_;
  }

 private:
  uint8_t* data_ = nullptr;
  int64_t capacity_ = 0;
};

// ---- The executor's records ----

struct HostExecutor::Function {
  std::shared_ptr<const FunctionExecutable> exe;
};

struct HostExecutor::Program {
  struct Step {
    bool compute = true;
    std::shared_ptr<const Function> fn;      // compute
    const HostDeviceList* gang = nullptr;    // compute
    std::vector<int> in_slots, out_slots;    // compute
    uint32_t tag = 0;                        // compute
    int src_slot = 0, dst_slot = 0;          // transfer
    const HostDeviceList* src = nullptr;     // transfer
    const HostDeviceList* dst = nullptr;     // transfer
    int64_t shard_bytes = 0;                 // transfer
  };
  std::string name;
  int num_slots = 0;
  std::vector<Step> steps;
};

// The local part of one gang.
struct HostExecutor::Part {
  std::shared_ptr<const Function> fn;
  const HostDeviceList* gang = nullptr;
  uint32_t tag = 0;
  RunState* run = nullptr;  // holds it until the part's time is in its reply
  uint32_t step = 0;        // index in the program's steps on this host
  std::shared_ptr<const Program> program;  // for its name in errors
  RunKey run_key;  // its run as the hosts name it: its session's, its program, its first buffer
  std::vector<std::shared_ptr<HostBuffer>> inputs, outputs;
  absl::Status error;  // set before enqueueing: fail without running
  uint64_t generation = 0;  // of its collective group, when it meets other hosts
  // Its start (DeviceLoop) against CancelParts, one atomic step each, so
  // that exactly one of them wins: kStarted, kCancelled, kEndSimulatedTime.
  std::atomic<int> state{0};
  std::string cancel_reason;  // written before kCancelled is set, once
  // Stops its meeting with the other hosts (making its group, Arrive) if
  // its run is refused by a host of its gang (CancelRun).
  std::stop_source stop_meeting;
  // Inputs not done, devices whose queue head it is not yet, and the
  // enqueuer's hold.
  std::atomic<int> pending{0};
};

constexpr int kStarted = 1;
constexpr int kCancelled = 2;
constexpr int kEndSimulatedTime = 4;

// One run on this host: replies once every buffer it makes here is done.
struct HostExecutor::RunState {
  explicit RunState(absl::AnyInvocable<void(absl::StatusOr<wire::RunReply>) &&> d) : done(std::move(d)) {}
  void Track(const std::shared_ptr<HostBuffer>& buffer) {
    pending.fetch_add(1, std::memory_order_relaxed);
    buffer->OnDone([this, id = buffer->id()](const absl::Status& status) {
      if (!status.ok()) {
        MutexLock lock(&mu);
        wire::FailedBuffer* f = reply.add_failed();
        f->set_buffer_id(id);
        ToWire(status, f->mutable_status());
      }
      Release();
    });
  }
  void Hold() { pending.fetch_add(1, std::memory_order_relaxed); }
  void AddTime(uint32_t step, int64_t start_ns, int64_t end_ns) {
    MutexLock lock(&mu);
    wire::StepTime* t = reply.add_times();
    t->set_step(step);
    t->set_start_ns(start_ns);
    t->set_end_ns(end_ns);
  }
  void Release() {
    if (pending.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    wire::RunReply out;
    {
      MutexLock lock(&mu);  // the last hold is gone: uncontended, for the analysis
      out = std::move(reply);
    }
    std::move(done)(std::move(out));
    delete this;
  }
  std::atomic<int> pending{1};  // the dispatching thread's hold
  Mutex mu;
  wire::RunReply reply ABSL_GUARDED_BY(mu);
  absl::AnyInvocable<void(absl::StatusOr<wire::RunReply>) &&> done;
};

// ---- HostExecutor ----

HostExecutor::HostExecutor(const wire::HostConfig& config, const wire::JoinCluster& join,
                           RendezvousStores* stores, std::string bind_ip, std::string secret)
    : layout_(config, join),
      host_id_(layout_.host_id),
      stores_(stores),
      health_(layout_),
      buffers_(layout_.host_id, join.first_buffer_id()),
      groups_(layout_, stores, bind_ip, stopping_, std::vector<int>(join.host_epochs().begin(), join.host_epochs().end())),
      transfers_(layout_, bind_ip, std::move(secret),
                 std::vector<std::string>(join.peer_keys().begin(), join.peer_keys().end()), dead_runs_, health_,
                 stopping_, join.first_buffer_id()),
      data_addresses_(join.data_addresses().begin(), join.data_addresses().end()),
      order_(layout_.num_local_devices()) {
  const int num_local_devices = layout_.num_local_devices();
  for (int d = 0; d < num_local_devices; ++d) {
    workers_.push_back(std::make_unique<Worker>());
  }
  for (int d = 0; d < num_local_devices; ++d) {
    workers_[d]->thread = std::thread([this, d] { DeviceLoop(d); });
  }
}

HostExecutor::~HostExecutor() {
  stopping_.store(true, std::memory_order_release);
  // The sessions still being ended are not: their callers hear Cancelled.
  std::thread ender;
  {
    MutexLock lock(&sessions_mu_);
    sessions_cv_.SignalAll();
    ender.swap(ender_);
  }
  if (ender.joinable()) ender.join();
  // Checkpoint writes under way finish; those queued are dropped (their
  // callers hear Cancelled).
  std::thread storage;
  std::deque<absl::AnyInvocable<void(bool run) &&>> dropped;
  {
    MutexLock lock(&storage_mu_);
    storage_stopping_ = true;
    storage_cv_.SignalAll();
    storage.swap(storage_);
  }
  if (storage.joinable()) storage.join();
  {
    MutexLock lock(&storage_mu_);
    dropped.swap(storage_jobs_);
  }
  for (auto& job : dropped) std::move(job)(false);
  dropped.clear();
  health_.Wake();  // parts in their simulated time stop
  // Parts waiting in a collective for other hosts stop too.
  AbortGroupsWith(-1, absl::CancelledError(absl::StrCat("host ", host_id_, " is stopping")));
  for (auto& w : workers_) {
    {
      MutexLock lock(&w->mu);
      w->cv.SignalAll();
    }
    w->thread.join();
  }
  transfers_.Stop();
  // Parts still queued never ran; they only hold buffers.
  MutexLock lock(&queue_mu_);
  order_.ForEach([](const GangOrder<Part*>::Ordered& o, int) { delete o.gang; });
}

absl::Status HostExecutor::ConnectDataPlane() {
  return transfers_.Connect(*stores_, groups_.timeout(), data_addresses_);
}

absl::Status HostExecutor::DefineDevices(const wire::DefineDevices& request, SessionId session) {
  PW_RETURN_IF_ERROR(BeginDispatch(session, "define_devices"));
  absl::Cleanup dispatched = [this, session] { EndDispatch(session); };
  absl::Status status = DefineDevicesChecked(request, session);
  const SessionKey key = ListKey(session, request.list_id());
  MutexLock lock(&mu_);
  if (status.ok()) {
    list_errors_.erase(key);
  } else if (!lists_.contains(key)) {  // a list that exists stays usable
    list_errors_[key] = status;
  }
  return status;
}

absl::Status HostExecutor::DefineDevicesChecked(const wire::DefineDevices& request, SessionId session) {
  auto list = std::make_unique<HostDeviceList>();
  if (request.device_ids_size() == 0) return absl::InvalidArgumentError("define_devices: an empty device list");
  for (int i = 0; i < request.device_ids_size(); ++i) {
    const int d = request.device_ids(i);
    if (d < 0 || d >= static_cast<int>(layout_.device_host.size())) {
      return absl::InvalidArgumentError(absl::StrCat("define_devices: no device ", d, " in this cluster"));
    }
    const int h = layout_.device_host[d];
    list->device_ids.push_back(d);
    list->hosts.push_back(h);
    if (h == host_id_) {
      list->local_positions.push_back(i);
      list->local_devices.push_back(layout_.local_index[d]);
    }
    auto it = std::find(list->host_set.begin(), list->host_set.end(), h);
    if (it == list->host_set.end()) list->host_set.push_back(h);
  }
  std::sort(list->host_set.begin(), list->host_set.end());
  list->positions_by_host.resize(list->host_set.size());
  for (int i = 0; i < request.device_ids_size(); ++i) {
    const size_t r = std::lower_bound(list->host_set.begin(), list->host_set.end(), list->hosts[i]) -
                     list->host_set.begin();
    list->positions_by_host[r].push_back(i);
  }
  if (!list->local_positions.empty()) {
    auto local = LocalShards::Create(static_cast<int>(list->device_ids.size()), list->local_positions);
    if (!local.ok()) return local.status();
    list->local = *std::move(local);
  }
  std::vector<int> sorted = list->local_devices;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
    return absl::InvalidArgumentError("define_devices: a device appears twice in the list");
  }
  if (!list->local_positions.empty() && list->host_set.size() > 1) {
    list->groups = groups_.ForSet(session, list->host_set);
  }
  if (!list->local_devices.empty()) {
    MutexLock lock(&queue_mu_);
    list->order_list = order_.ListOf(list->local_devices);
  }
  MutexLock lock(&mu_);
  std::unique_ptr<HostDeviceList>& entry = lists_[ListKey(session, request.list_id())];
  if (entry != nullptr) {
    return absl::AlreadyExistsError(absl::StrCat("define_devices: list ", request.list_id(), " exists"));
  }
  entry = std::move(list);
  return absl::OkStatus();
}

absl::StatusOr<const HostDeviceList*> HostExecutor::List(SessionId session, int id) const {
  const SessionKey key = ListKey(session, id);
  auto it = lists_.find(key);
  if (it != lists_.end()) return it->second.get();
  if (auto failed = list_errors_.find(key); failed != list_errors_.end()) {
    return absl::Status(failed->second.code(), absl::StrCat("device list ", id, " could not be defined on host ",
                                                            host_id_, ": ", failed->second.message()));
  }
  return absl::InvalidArgumentError(absl::StrCat("no device list ", id, " on host ", host_id_));
}

absl::Status HostExecutor::LoadFunction(const wire::LoadFunction& request, SessionId session) {
  PW_RETURN_IF_ERROR(BeginDispatch(session, "load_function"));
  absl::Cleanup dispatched = [this, session] { EndDispatch(session); };
  absl::StatusOr<std::shared_ptr<const FunctionExecutable>> exe = [&]() -> decltype(exe) {
    auto ir = ParseFunctionIr(request.ir());
    if (!ir.ok()) return ir.status();
    const std::string name = (*ir)->name();
    auto compiled = FunctionExecutable::Compile(*std::move(ir));
    if (!compiled.ok()) {
      return absl::Status(compiled.status().code(), absl::StrCat("'", name, "': ", compiled.status().message()));
    }
    return compiled;
  }();
  const SessionKey key{session, request.function_id()};
  MutexLock lock(&mu_);
  if (!exe.ok()) {
    function_errors_[key] = exe.status();
    return exe.status();
  }
  auto fn = std::make_shared<Function>();
  fn->exe = *std::move(exe);
  functions_[key] = std::move(fn);
  function_errors_.erase(key);
  return absl::OkStatus();
}

absl::Status HostExecutor::LoadProgram(const wire::LoadProgram& request, SessionId session) {
  PW_RETURN_IF_ERROR(BeginDispatch(session, "load_program"));
  absl::Cleanup dispatched = [this, session] { EndDispatch(session); };
  const SessionKey key{session, request.program_id()};
  MutexLock lock(&mu_);
  absl::Status status = LoadProgramLocked(request, session);
  if (status.ok()) {
    program_errors_.erase(key);
  } else {
    programs_.erase(key);  // a run of it is refused with this error, not an older program's
    program_errors_[key] = status;
  }
  return status;
}

absl::Status HostExecutor::LoadProgramLocked(const wire::LoadProgram& request, SessionId session) {
  auto program = std::make_shared<Program>();
  program->name = request.name();
  program->num_slots = request.num_slots();
  if (program->num_slots < 0 || program->num_slots > kMaxSlots) {
    return absl::InvalidArgumentError(absl::StrCat("load_program: bad num_slots ", program->num_slots));
  }
  auto slot_ok = [&](int s) { return s >= 0 && s < program->num_slots; };
  for (const wire::ProgramStep& ws : request.steps()) {
    Program::Step step;
    if (ws.has_compute()) {
      const wire::ComputeStep& c = ws.compute();
      const SessionKey fn_key{session, c.function_id()};
      auto fn = functions_.find(fn_key);
      if (fn == functions_.end()) {
        if (auto failed = function_errors_.find(fn_key); failed != function_errors_.end()) {
          return absl::Status(failed->second.code(),
                              absl::StrCat("load_program: function ", c.function_id(), " could not be loaded on host ",
                                           host_id_, ": ", failed->second.message()));
        }
        return absl::InvalidArgumentError(
            absl::StrCat("load_program: no function ", c.function_id(), " on host ", host_id_));
      }
      auto gang = List(session, c.devices());
      if (!gang.ok()) return gang.status();
      const FunctionIr& ir = fn->second->exe->ir();
      if (c.in_slots_size() != ir.num_params() || c.out_slots_size() != ir.num_outputs()) {
        return absl::InvalidArgumentError(absl::StrCat("load_program: '", ir.name(), "' takes ", ir.num_params(),
                                                       " inputs and gives ", ir.num_outputs(), " outputs"));
      }
      if (ir.axis_size() >= 1 && ir.axis_size() != static_cast<int64_t>((*gang)->device_ids.size())) {
        return absl::InvalidArgumentError(absl::StrCat("load_program: '", ir.name(), "' runs on ", ir.axis_size(),
                                                       " devices, not ", (*gang)->device_ids.size()));
      }
      step.compute = true;
      step.fn = fn->second;
      step.gang = *gang;
      step.in_slots.assign(c.in_slots().begin(), c.in_slots().end());
      step.out_slots.assign(c.out_slots().begin(), c.out_slots().end());
      step.tag = c.gang_tag();
      for (int s : step.in_slots) {
        if (!slot_ok(s)) return absl::InvalidArgumentError(absl::StrCat("load_program: bad slot ", s));
      }
      for (int s : step.out_slots) {
        if (!slot_ok(s)) return absl::InvalidArgumentError(absl::StrCat("load_program: bad slot ", s));
      }
    } else if (ws.has_transfer()) {
      const wire::TransferStep& t = ws.transfer();
      auto src = List(session, t.src_devices());
      if (!src.ok()) return src.status();
      auto dst = List(session, t.dst_devices());
      if (!dst.ok()) return dst.status();
      if ((*src)->device_ids.size() != (*dst)->device_ids.size() || !ShardBytesOk(t.shard_bytes()) ||
          !slot_ok(t.src_slot()) || !slot_ok(t.dst_slot())) {
        return absl::InvalidArgumentError("load_program: a malformed transfer step");
      }
      step.compute = false;
      step.src_slot = t.src_slot();
      step.dst_slot = t.dst_slot();
      step.src = *src;
      step.dst = *dst;
      step.shard_bytes = t.shard_bytes();
    } else {
      return absl::InvalidArgumentError("load_program: a step of unknown kind");
    }
    program->steps.push_back(std::move(step));
  }
  programs_[SessionKey{session, request.program_id()}] = std::move(program);
  return absl::OkStatus();
}

void HostExecutor::Unload(const wire::Unload& request, SessionId session) {
  // Freed outside the lock: a function's executable can be large.
  std::vector<std::shared_ptr<const Function>> functions;
  std::vector<std::shared_ptr<const Program>> programs;
  MutexLock lock(&mu_);
  for (uint64_t id : request.program_ids()) {
    const SessionKey key{session, id};
    if (auto it = programs_.find(key); it != programs_.end()) {
      programs.push_back(std::move(it->second));
      programs_.erase(it);
    }
    program_errors_.erase(key);
  }
  for (uint64_t id : request.function_ids()) {
    const SessionKey key{session, id};
    if (auto it = functions_.find(key); it != functions_.end()) {
      functions.push_back(std::move(it->second));
      functions_.erase(it);
    }
    function_errors_.erase(key);
  }
}

int HostExecutor::num_functions() const {
  MutexLock lock(&mu_);
  return static_cast<int>(functions_.size() + function_errors_.size());
}

int HostExecutor::num_programs() const {
  MutexLock lock(&mu_);
  return static_cast<int>(programs_.size() + program_errors_.size());
}

int HostExecutor::num_lists() const {
  MutexLock lock(&mu_);
  return static_cast<int>(lists_.size() + list_errors_.size());
}

absl::Status HostExecutor::CheckSizes(const Part& part) const {
  const FunctionExecutable& exe = *part.fn->exe;
  const int64_t n = static_cast<int64_t>(part.gang->local_positions.size());
  for (size_t i = 0; i < part.inputs.size(); ++i) {
    const int64_t want = exe.param_bytes(static_cast<int>(i)) * n;
    if (part.inputs[i]->bytes() != want) {
      return absl::InternalError(absl::StrCat("'", exe.ir().name(), "' input ", i, " has ", part.inputs[i]->bytes(),
                                              " bytes on host ", host_id_, ", expected ", want));
    }
  }
  for (const auto& out : part.outputs) {
    if (!out->allocated()) return out->AllocationError();
  }
  return absl::OkStatus();
}

absl::Status HostExecutor::Put(wire::PutBuffer& request, SessionId session) {
  PW_RETURN_IF_ERROR(BeginDispatch(session, "put"));
  absl::Cleanup dispatched = [this, session] { EndDispatch(session); };
  absl::StatusOr<int64_t> local_shards;
  {
    MutexLock lock(&mu_);
    absl::StatusOr<const HostDeviceList*> list = List(session, request.devices());
    if (list.ok()) {
      local_shards = static_cast<int64_t>((*list)->local_positions.size());
    } else {
      local_shards = list.status();
    }
  }
  return buffers_.Put(session, request, local_shards);
}

void HostExecutor::Run(const wire::RunProgram& request,
                       absl::AnyInvocable<void(absl::StatusOr<wire::RunReply>) &&> done, SessionId session) {
  // What to start once the tables are unlocked, in program order.
  struct Transfer {
    const HostDeviceList* src_list;
    std::shared_ptr<HostBuffer> src;
    const HostDeviceList* dst_list;
    uint64_t dst_id;
    std::shared_ptr<HostBuffer> dst;
    int64_t shard_bytes;
  };
  const RunKey key{session, request.program_id(), request.first_buffer_id()};
  const SessionKey program_key{session, request.program_id()};
  std::vector<Transfer> transfers;
  std::vector<Part*> parts;
  // Counted from here until its reply, for EndSession; refused if its
  // session ended.
  absl::Status early = BeginDispatch(session, "run", /*run=*/true);
  const bool counted = early.ok();
  auto* run = new RunState(std::move(done));
  std::vector<std::shared_ptr<HostBuffer>> dropped;  // freed once unlocked
  // The run is refused (replied to outside the lock): the client cancelled
  // it already, or its session ended, or it cannot start here.
  if (early.ok()) early = dead_runs_.DeadStatus(key);
  {
    MutexLock lock(&mu_);
    if (request.free_buffer_ids_size() > 0) {
      MutexLock buffers_lock(&buffers_.mu());
      for (uint64_t id : request.free_buffer_ids()) buffers_.DropLocked(SessionKey{session, id}, dropped);
    }
    auto pit = programs_.find(program_key);
    if (!early.ok()) {
      // Refused as a whole (below).
    } else if (pit == programs_.end()) {
      auto failed = program_errors_.find(program_key);
      early = failed != program_errors_.end()
                  ? absl::Status(failed->second.code(),
                                 absl::StrCat("run: program ", request.program_id(), " could not be loaded on host ",
                                              host_id_, ": ", failed->second.message()))
                  : absl::InvalidArgumentError(
                        absl::StrCat("run: no program ", request.program_id(), " on host ", host_id_));
    }
    // Every binding is checked before anything is made: a run refused
    // leaves nothing behind that would never complete.
    for (const wire::ArgBinding& a : request.args()) {
      if (!early.ok()) break;
      auto src = List(session, a.src_devices());
      auto dst = List(session, a.dst_devices());
      if (!src.ok() || !dst.ok()) {
        early = absl::Status((src.ok() ? dst : src).status().code(),
                             absl::StrCat("run: argument binding of slot ", a.slot(), " of program '",
                                          pit->second->name, "': ", (src.ok() ? dst : src).status().message()));
      } else if (a.slot() < 0 || a.slot() >= pit->second->num_slots || !ShardBytesOk(a.shard_bytes()) ||
                 (*src)->device_ids.size() != (*dst)->device_ids.size()) {
        early = absl::InvalidArgumentError(absl::StrCat("run: a malformed argument binding (slot ", a.slot(),
                                                        ") of program '", pit->second->name, "' on host ",
                                                        host_id_));
      }
    }
  }
  if (!early.ok()) {
    // Dead here: whatever the other hosts send for it is dropped (they may
    // have queued their side before the client cancels the run on them).
    if (dead_runs_.MarkDead(key, early, host_id_)) transfers_.WakeReceivers();
    transfers_.EnsureReceivers();
    // Uncounted first: the caller may destroy the executor once replied to.
    if (counted) EndDispatch(session, /*run_ended=*/true);
    std::move(run->done)(early);
    delete run;
    return;
  }
  run->done = [this, session, done = std::move(run->done)](absl::StatusOr<wire::RunReply> reply) mutable {
    std::move(done)(std::move(reply));
    RunEnded(session);
  };
  {
    MutexLock lock(&mu_);
    // The run's buffers are found and made under one lock (a missing one
    // is an error the run reports: HostBuffers::LookupLocked).
    MutexLock buffers_lock(&buffers_.mu());
    auto pit = programs_.find(program_key);
    const std::shared_ptr<const Program> program_ref = pit->second;
    const Program& program = *program_ref;
    const uint64_t first = request.first_buffer_id();
    std::vector<std::shared_ptr<HostBuffer>> slots(program.num_slots);
    for (const wire::ArgBinding& a : request.args()) {
      auto src = List(session, a.src_devices());  // checked above; lists are never removed
      auto dst = List(session, a.dst_devices());
      if (!a.copy()) {
        if (!(*dst)->local_positions.empty()) slots[a.slot()] = buffers_.LookupLocked({session, a.buffer_id()});
        continue;
      }
      std::shared_ptr<HostBuffer> s =
          (*src)->local_positions.empty() ? nullptr : buffers_.LookupLocked({session, a.buffer_id()});
      std::shared_ptr<HostBuffer> d;
      if (!(*dst)->local_positions.empty()) {
        d = buffers_.NewLocked({session, first + a.slot()},
                               static_cast<int64_t>((*dst)->local_positions.size()) * a.shard_bytes());
        slots[a.slot()] = d;
        run->Track(d);
      }
      transfers.push_back(Transfer{*src, std::move(s), *dst, first + a.slot(), std::move(d), a.shard_bytes()});
    }
    for (size_t k = 0; k < program.steps.size(); ++k) {
      const Program::Step& step = program.steps[k];
      if (!step.compute) {
        std::shared_ptr<HostBuffer> s = step.src->local_positions.empty() ? nullptr : slots[step.src_slot];
        std::shared_ptr<HostBuffer> d;
        if (!step.dst->local_positions.empty()) {
          d = buffers_.NewLocked({session, first + step.dst_slot},
                                 static_cast<int64_t>(step.dst->local_positions.size()) * step.shard_bytes);
          slots[step.dst_slot] = d;
          run->Track(d);
        }
        if (s == nullptr && !step.src->local_positions.empty()) {
          s = buffers_.LookupLocked({session, first + step.src_slot});
        }
        transfers.push_back(
            Transfer{step.src, std::move(s), step.dst, first + step.dst_slot, std::move(d), step.shard_bytes});
        continue;
      }
      if (step.gang->local_positions.empty()) continue;
      auto* part = new Part();
      part->fn = step.fn;
      part->gang = step.gang;
      part->tag = step.tag;
      part->run = run;
      part->step = static_cast<uint32_t>(k);
      part->program = program_ref;
      part->run_key = key;
      run->Hold();
      const FunctionExecutable& exe = *step.fn->exe;
      const int64_t n = static_cast<int64_t>(step.gang->local_positions.size());
      for (size_t i = 0; i < step.in_slots.size(); ++i) {
        std::shared_ptr<HostBuffer> in = slots[step.in_slots[i]];
        if (in == nullptr) in = buffers_.LookupLocked({session, first + step.in_slots[i]});
        part->inputs.push_back(std::move(in));
      }
      for (size_t i = 0; i < step.out_slots.size(); ++i) {
        auto out = buffers_.NewLocked({session, first + step.out_slots[i]}, exe.output_bytes(static_cast<int>(i)) * n);
        slots[step.out_slots[i]] = out;
        run->Track(out);
        part->outputs.push_back(std::move(out));
      }
      parts.push_back(part);
    }
  }
  for (Transfer& t : transfers) {
    transfers_.Start(key, *t.src_list, std::move(t.src), *t.dst_list, t.dst_id, std::move(t.dst), t.shard_bytes);
  }
  for (Part* part : parts) Enqueue(part);
  EndDispatch(session);  // all of it is queued: EndSession may cancel it now
  run->Release();
}

void HostExecutor::CancelRun(const wire::CancelRun& request, SessionId session) {
  const RunKey run{session, request.program_id(), request.first_buffer_id()};
  absl::Status why = FromWire(request.status());
  if (why.ok()) {
    why = absl::CancelledError(absl::StrCat("the client cancelled the run of program ", run.program_id,
                                            " from buffer ", run.first_buffer_id));
  }
  const int refuser = request.has_refused_by() ? request.refused_by() : -1;
  if (dead_runs_.MarkDead(run, why, refuser)) {
    // Its parts not started fail when their turn comes (DeviceLoop asks);
    // its receives posted fail now; its sends go as the error (SendLoop asks).
    transfers_.CancelRun(run, why);
  }
  if (refuser < 0) return;
  // Its parts whose gang has the refuser, which never comes: one that
  // started waits for it (making their group, or in Arrive), and gives up
  // there (one that starts later does not meet: DeviceLoop asks
  // RefusedByAnyOf).
  MutexLock lock(&queue_mu_);
  order_.ForEach([&](const GangOrder<Part*>::Ordered& o, int) {
    Part* part = o.gang;
    if (!(part->run_key == run)) return;
    const std::vector<int>& hosts = part->gang->host_set;
    if (std::find(hosts.begin(), hosts.end(), refuser) != hosts.end()) part->stop_meeting.request_stop();
  });
}

bool HostExecutor::MeetsOtherHosts(const Part& part) {
  return part.gang->groups != nullptr &&
         part.fn->exe->first_collective().kind != FunctionExecutable::CollectiveCall::Kind::kNone;
}

void HostExecutor::Enqueue(Part* part) {
  // Its gang's group incarnation: the one of the runs at this place in the
  // client's order (RenewGroup), the same on every host of the gang.
  if (MeetsOtherHosts(*part)) part->generation = groups_.Enter(*part->gang);
  // Its inputs, heading its devices' queues, and the enqueuer's hold.
  part->pending.store(static_cast<int>(part->inputs.size()) + 2, std::memory_order_relaxed);
  for (const auto& in : part->inputs) {
    in->OnDone([this, part](const absl::Status&) { CountDown(part); });
  }
  bool at_head = false;  // (only `part` can be reported: GangOrder::Append)
  {
    MutexLock lock(&queue_mu_);
    order_.Append(part->gang->order_list, part, [&](Part*) { at_head = true; });
  }
  if (at_head) CountDown(part);
  CountDown(part);  // the hold
}

void HostExecutor::CountDown(Part* part) {
  if (part->pending.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  Worker& w = *workers_[part->gang->local_devices[0]];
  MutexLock lock(&w.mu);
  w.ready.push_back(part);
  w.cv.Signal();
}

void HostExecutor::DeviceLoop(int device) {
  Worker& w = *workers_[device];
  Scratch scratch;
  while (true) {
    Part* part;
    {
      MutexLock lock(&w.mu);
      while (w.ready.empty() && !stopping_.load(std::memory_order_acquire)) w.cv.Wait(&w.mu);
      if (stopping_.load(std::memory_order_acquire)) return;
      part = w.ready.front();
      w.ready.pop_front();
    }
    absl::Status status = part->error;
    // A cancelled run's part fails without running: a host of the run
    // refused it (its error, which comes first, is the part's).
    const absl::Status dead = dead_runs_.DeadStatus(part->run_key);
    status.Update(dead);
    // It starts now, unless CancelParts came first.
    if (part->state.fetch_or(kStarted, std::memory_order_acq_rel) & kCancelled) {
      status.Update(absl::CancelledError(absl::StrCat("'", part->fn->exe->ir().name(), "' in program '",
                                                      part->program->name, "' was cancelled: ",
                                                      part->cancel_reason)));
    }
    for (const auto& in : part->inputs) {
      if (!status.ok()) break;
      absl::Status s = in->Await(stopping_);
      if (!s.ok()) status = s;
    }
    status.Update(CheckSizes(*part));
    const int64_t start_ns = NowNanos();
    const bool refused_in_gang = !dead.ok() && dead_runs_.RefusedByAnyOf(part->run_key, part->gang->host_set);
    RunPart(*part, status, refused_in_gang, scratch);
    part->run->AddTime(part->step, start_ns, NowNanos());
    if (MeetsOtherHosts(*part)) groups_.Leave(*part->gang, part->generation);
    // Free the devices first, so the next gang in order can start.
    absl::InlinedVector<Part*, 4> heads;
    {
      MutexLock lock(&queue_mu_);
      order_.PopFront(part->gang->order_list, [&](Part* p) { heads.push_back(p); });
    }
    for (Part* next : heads) CountDown(next);
    part->inputs.clear();
    for (const auto& out : part->outputs) out->Complete(status);
    part->run->Release();
    delete part;
  }
}

uint64_t HostExecutor::MeetingOf(const Part& part) {
  // Its first output's id: a run's buffers are the client's fresh ones, and
  // every function has an output. (Not the gang's tag, which every run of
  // its program shares: a meeting a host gave up still listens.)
  return part.outputs[0]->id() % CollectiveGroup::kMaxMeetings;
}

absl::Status HostExecutor::RefusalOf(const Part& part) const {
  if (!part.stop_meeting.stop_requested()) return absl::OkStatus();
  return dead_runs_.DeadStatus(part.run_key);
}

void HostExecutor::RunPart(Part& part, absl::Status& status, bool refused_in_gang, Scratch& scratch) {
  const FunctionExecutable& exe = *part.fn->exe;
  const HostDeviceList& gang = *part.gang;
  const int gang_size = static_cast<int>(gang.device_ids.size());
  const auto start = std::chrono::steady_clock::now();
  // An input's error passes on as it is (a chain of failed steps does not
  // repeat itself); the part's own is named.
  bool failed_before = !status.ok();  // (a cancelled run's error too)
  // A refusal of the run that stopped it meeting its gang passes on too.
  auto stopped_meeting = [&](const absl::Status& why) {
    if (absl::Status refusal = RefusalOf(part); !refusal.ok() && status.ok()) {
      status = refusal;
      failed_before = true;
    }
    status.Update(why);
  };
  // A gang on a failed device fails when its turn comes, without running
  // (an input's error, which came first, stays the one reported).
  status.Update(health_.CheckHealthy(gang.local_devices));
  const int num_local = static_cast<int>(gang.local_positions.size());
  // local_scratch_bytes is scratch_bytes(gang_size) for a gang all on this host.
  auto local_scratch = [&] { return scratch.Get(exe.local_scratch_bytes(num_local, gang_size)); };
  auto scratch_error = [&] {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", exe.local_scratch_bytes(num_local, gang_size), " bytes of scratch"));
  };
  auto run = [&](auto&& body) {
    if (!status.ok()) return;
    std::vector<const void*> ins;
    std::vector<void*> outs;
    for (const auto& in : part.inputs) ins.push_back(in->data());
    for (const auto& out : part.outputs) outs.push_back(out->data());
    status = body(ins, outs);
  };
  if (gang.all_local()) {
    run([&](const std::vector<const void*>& ins, const std::vector<void*>& outs) {
      uint8_t* all = local_scratch();
      if (all == nullptr) return scratch_error();
      exe.Run(gang_size, ins, outs, all);
      return absl::OkStatus();
    });
  } else if (refused_in_gang) {
    // Its gang would wait for the host that refused the run, which never
    // arrives (Arrive: up to the arrival timeout), and leave the group
    // broken: the part fails without meeting. (A cancelled part whose gang
    // the refuser is not in meets and joins without running, below, so that
    // its hosts agree to stop.)
  } else if (exe.first_collective().kind == FunctionExecutable::CollectiveCall::Kind::kNone) {
    // The parts need nothing from each other (elementwise, or cross-shard
    // ops on constants and positions only): each runs or fails alone.
    run([&](const std::vector<const void*>& ins, const std::vector<void*>& outs) {
      uint8_t* local = local_scratch();
      if (local == nullptr) return scratch_error();
      return exe.RunLocal(*gang.local, ins, outs, local, nullptr);
    });
  } else if (absl::Status lost = health_.CheckPeers(gang); !lost.ok()) {
    status.Update(lost);  // its collectives would wait for a host that is gone
  } else if (auto group = groups_.GroupFor(gang, part.generation, part.stop_meeting.get_token()); !group.ok()) {
    stopped_meeting(group.status());
  } else if (absl::Status arrived = (*group)->Arrive(MeetingOf(part), groups_.arrival_timeout(),
                                                     part.stop_meeting.get_token());
             !arrived.ok()) {
    // The gang's parts meet here first: a host still busy with earlier
    // gangs comes late, and only once all are here do the collectives'
    // own timeouts start. A failed wait broke the group on every host; a
    // stopped one (a host of the gang refused the run) left it usable.
    stopped_meeting(arrived);
  } else {
    // A part that cannot run (a failed input, no scratch) must not leave
    // the others waiting in a collective it never joins, which would break
    // their group for good: the hosts agree in the gang's first collective
    // (see GroupCollectives), with no round of their own.
    uint8_t* local = status.ok() ? local_scratch() : nullptr;
    if (status.ok() && local == nullptr) status = scratch_error();
    GroupCollectives collectives(group->get(), &gang, part.tag, /*cannot_run=*/!status.ok());
    if (!status.ok()) {
      status.Update(collectives.JoinWithoutRunning(exe.first_collective()));
    } else {
      run([&](const std::vector<const void*>& ins, const std::vector<void*>& outs) {
        return exe.RunLocal(*gang.local, ins, outs, local, &collectives);
      });
    }
  }
  // Simulated compute (pw.simulated_compute): the gang keeps its devices for
  // that long, as in process; this thread is its device's, so it waits.
  // A device that fails meanwhile ends that time at once, failed.
  if (const int64_t simulated = exe.ir().simulated_ns(); simulated > 0 && status.ok()) {
    const auto deadline = start + std::chrono::nanoseconds(simulated);
    health_.WaitWhileHealthy(gang.local_devices, deadline, [&] {
      return stopping_.load(std::memory_order_acquire) ||
             (part.state.load(std::memory_order_acquire) & kEndSimulatedTime) != 0;
    });
    status.Update(health_.CheckHealthy(gang.local_devices));
  }
  if (!status.ok() && !failed_before) {
    status = absl::Status(status.code(), absl::StrCat("'", exe.ir().name(), "' in program '", part.program->name,
                                                      "' failed on host ", host_id_, ": ",
                                                      status.message()));
  }
}

absl::Status HostExecutor::RenewGroup(absl::Span<const int> hosts, SessionId session) {
  return groups_.RenewGroup(session, hosts);
}

void HostExecutor::AbortGroupsWith(int host, const absl::Status& why) { groups_.AbortGroupsWith(host, why); }

void HostExecutor::SetCollectiveTimeouts(absl::Duration timeout, absl::Duration arrival_timeout) {
  groups_.SetTimeouts(timeout, arrival_timeout);
}

int HostExecutor::CancelParts(absl::FunctionRef<bool(const RunKey& run)> which,
                              absl::string_view reason, bool end_simulated_time) {
  int cancelled = 0;
  {
    MutexLock lock(&queue_mu_);
    order_.ForEach([&](const GangOrder<Part*>::Ordered& o, int) {
      Part* part = o.gang;
      if (!which(part->run_key)) return;
      // The reason first, once (only this function, under queue_mu_, sets
      // kCancelled); DeviceLoop reads it only if it sees kCancelled.
      if ((part->state.load(std::memory_order_acquire) & kCancelled) == 0) part->cancel_reason = std::string(reason);
      const int before =
          part->state.fetch_or(kCancelled | (end_simulated_time ? kEndSimulatedTime : 0), std::memory_order_acq_rel);
      if ((before & (kStarted | kCancelled)) == 0) ++cancelled;
    });
  }
  if (end_simulated_time) health_.Wake();  // parts in their simulated time look again
  return cancelled;
}

wire::CancelRunsReply HostExecutor::CancelRuns(const wire::CancelRuns& request, SessionId session) {
  absl::flat_hash_set<std::pair<uint64_t, uint64_t>> runs;
  for (int i = 0; i < request.program_ids_size() && i < request.first_buffer_ids_size(); ++i) {
    runs.insert({request.program_ids(i), request.first_buffer_ids(i)});
  }
  wire::CancelRunsReply reply;
  reply.set_parts_cancelled(CancelParts(
      [&](const RunKey& run) {
        return run.session == session && (request.all() || runs.contains({run.program_id, run.first_buffer_id}));
      },
      request.reason(), request.end_simulated_time()));
  return reply;
}

// ---- Sessions that end ----

absl::Status HostExecutor::BeginDispatch(SessionId session, absl::string_view what, bool run) {
  // Marked ended (EndSession) before its ending is entered: a request that
  // passes both checks is counted before the ending's first step looks.
  absl::Status ended = dead_runs_.EndedStatus(session);
  if (ended.ok()) {
    MutexLock lock(&sessions_mu_);
    if (auto it = endings_.find(session); it != endings_.end()) {
      ended = it->second.why;
    } else {
      SessionRuns& runs = session_runs_[session];
      ++runs.dispatching;
      if (run) ++runs.in_flight;
      return absl::OkStatus();
    }
  }
  if (run) return ended;
  return absl::FailedPreconditionError(
      absl::StrCat(what, ": session ", session, " has ended on host ", host_id_, " (", ended.message(), ")"));
}

void HostExecutor::EndDispatch(SessionId session, bool run_ended) {
  MutexLock lock(&sessions_mu_);
  auto it = session_runs_.find(session);
  if (run_ended) --it->second.in_flight;
  if (--it->second.dispatching == 0 && it->second.in_flight == 0) session_runs_.erase(it);
  if (endings_.contains(session)) sessions_cv_.SignalAll();
}

void HostExecutor::RunEnded(SessionId session) {
  MutexLock lock(&sessions_mu_);
  auto it = session_runs_.find(session);
  if (--it->second.in_flight == 0 && it->second.dispatching == 0) session_runs_.erase(it);
  if (endings_.contains(session)) sessions_cv_.SignalAll();
}

void HostExecutor::EndSession(SessionId session, std::string reason,
                              absl::AnyInvocable<void(absl::Status) &&> done) {
  std::string text = reason.empty() ? "its tenant ended" : absl::StrCat("its tenant ended: ", reason);
  absl::Status why = absl::CancelledError(text);
  // Every run of it is dead from now on, and the receiving threads that
  // wait for one of its runs drop its message instead.
  dead_runs_.EndSession(session, why);
  transfers_.WakeReceivers();
  MutexLock lock(&sessions_mu_);
  auto [it, fresh] = endings_.try_emplace(session);
  if (fresh) {
    it->second.reason = std::move(text);
    it->second.why = std::move(why);
  }
  it->second.done.push_back(std::move(done));
  if (!ender_.joinable()) ender_ = std::thread([this] { EndSessionsLoop(); });
  sessions_cv_.SignalAll();
}

void HostExecutor::EndSessionsLoop() {
  while (true) {
    enum class Step { kNone, kCancel, kForget } step = Step::kNone;
    SessionId session = kOneSession;
    std::string reason;
    absl::Status why;
    std::vector<absl::AnyInvocable<void(absl::Status) &&>> stopped;
    {
      MutexLock lock(&sessions_mu_);
      while (!stopping_.load(std::memory_order_acquire)) {
        for (auto& [s, ending] : endings_) {
          auto runs = session_runs_.find(s);
          const SessionRuns counts = runs == session_runs_.end() ? SessionRuns{} : runs->second;
          // Its queued work is cancelled once nothing of it is being made
          // (a Run half dispatched would queue more), and the rest goes
          // once every run of it has finished.
          if (!ending.cancelled && counts.dispatching == 0) {
            step = Step::kCancel;
            ending.cancelled = true;
          } else if (ending.cancelled && !ending.forgetting && counts.in_flight == 0 && counts.dispatching == 0) {
            step = Step::kForget;
            ending.forgetting = true;
          } else {
            continue;
          }
          session = s;
          reason = ending.reason;
          why = ending.why;
          break;
        }
        if (step != Step::kNone) break;
        sessions_cv_.Wait(&sessions_mu_);
      }
      if (step == Step::kNone) {  // the executor is being destroyed
        for (auto& [s, ending] : endings_) {
          for (auto& d : ending.done) stopped.push_back(std::move(d));
        }
        endings_.clear();
      }
    }
    if (step == Step::kNone) {
      for (auto& d : stopped) {
        std::move(d)(absl::CancelledError(absl::StrCat("host ", host_id_, " stopped before its session ended")));
      }
      return;
    }
    if (step == Step::kCancel) {
      CancelSession(session, reason, why);
      continue;
    }
    ForgetSession(session, why);
    std::vector<absl::AnyInvocable<void(absl::Status) &&>> done;
    {
      MutexLock lock(&sessions_mu_);
      auto it = endings_.find(session);
      done = std::move(it->second.done);
      endings_.erase(it);
    }
    for (auto& d : done) std::move(d)(absl::OkStatus());
  }
}

void HostExecutor::CancelSession(SessionId session, const std::string& reason, const absl::Status& why) {
  // Its parts not started fail without running; those in their simulated
  // time end it (nobody waits for their results).
  CancelParts([session](const RunKey& run) { return run.session == session; }, reason,
              /*end_simulated_time=*/true);
  // A part of it waiting for another host of its gang (making their group,
  // or in Arrive) stops waiting: no client is left to cancel a run that
  // host refused, which never comes.
  {
    MutexLock lock(&queue_mu_);
    order_.ForEach([&](const GangOrder<Part*>::Ordered& o, int) {
      if (o.gang->run_key.session == session) o.gang->stop_meeting.request_stop();
    });
  }
  // Its posted receives fail (a message for them may never come), and so
  // do its puts in progress; its buffers are forgotten, each freed once
  // whatever running holds it lets go. Its runs can then all finish.
  transfers_.EndSession(session, why);
  buffers_.EndSession(session, why);
}

void HostExecutor::ForgetSession(SessionId session, const absl::Status& why) {
  // Freed unlocked, the programs (which point into the lists) first.
  std::vector<std::unique_ptr<HostDeviceList>> lists;
  std::vector<std::shared_ptr<const Function>> functions;
  std::vector<std::shared_ptr<const Program>> programs;
  {
    MutexLock lock(&mu_);
    auto of_session = [session](const auto& entry) { return entry.first.session == session; };
    for (auto it = lists_.begin(); it != lists_.end();) {
      if (!of_session(*it)) {
        ++it;
        continue;
      }
      lists.push_back(std::move(it->second));
      lists_.erase(it++);
    }
    for (auto it = functions_.begin(); it != functions_.end();) {
      if (!of_session(*it)) {
        ++it;
        continue;
      }
      functions.push_back(std::move(it->second));
      functions_.erase(it++);
    }
    for (auto it = programs_.begin(); it != programs_.end();) {
      if (!of_session(*it)) {
        ++it;
        continue;
      }
      programs.push_back(std::move(it->second));
      programs_.erase(it++);
    }
    absl::erase_if(list_errors_, of_session);
    absl::erase_if(function_errors_, of_session);
    absl::erase_if(program_errors_, of_session);
  }
  programs.clear();
  // No list of the session points to its groups any more, and no part of
  // it is left to use them.
  groups_.EndSession(session, why);
}

absl::Status HostExecutor::PeersLost(const wire::PeersLost& request) {
  absl::Status status = health_.PeersLost(request, [&](int h) {
    // Transfers: the peer threads' Send or Recv with it (in flight, or the
    // next ones) fail at once, each failing its destination as a broken
    // connection does; none waits for a host that may never answer.
    transfers_.ShutdownPeer(h);
    // Its groups break: a part waiting in Arrive for it, or making a group
    // with it, stops now, and no group with it is made again.
    AbortGroupsWith(h, HostLostError(request.why().empty()
                                         ? absl::StrCat("host ", h, " was lost")
                                         : absl::StrCat("host ", h, " was lost (", request.why(), ")")));
  });
  // Besides: a part of a gang with it that starts from now on fails
  // without joining their collectives (CheckPeers); one still forming gives
  // up at once (its rendezvous store ends its waits: GroupStore, and the
  // abort above); a part already inside a collective with it fails as soon
  // as its connections close (at once for a process that died; for a
  // stopped one, after the collective timeout: Gloo wakes no waiter for a
  // close on this side).
  return status;
}

bool HostExecutor::PeerLost(int host) const { return health_.PeerLost(host); }

absl::Status HostExecutor::CheckOtherHost(int host) const {
  if (host < 0 || host >= layout_.num_hosts || host == host_id_) {
    return absl::InvalidArgumentError(
        absl::StrCat("peer_joined: no other host ", host, " in this cluster of ", layout_.num_hosts, " hosts"));
  }
  return absl::OkStatus();
}

absl::Status HostExecutor::PeerJoined(int host, int epoch) {
  PW_RETURN_IF_ERROR(CheckOtherHost(host));
  groups_.PeerJoined(host, epoch);
  health_.PeerJoined(host);
  return absl::OkStatus();
}

absl::Status HostExecutor::ConnectPeer(int host, const std::string& key) {
  PW_RETURN_IF_ERROR(CheckOtherHost(host));
  const absl::Time deadline = absl::Now() + groups_.timeout();
  // The new process put its data plane's address in its own store
  // (HostTransfers::Connect).
  PW_ASSIGN_OR_RETURN(KeyValueStore * store, stores_->StoreOf(host));
  PW_ASSIGN_OR_RETURN(std::string address, store->Get(transfers_.AddressKey(host), deadline));
  return transfers_.RejoinPeer(host, address, key, deadline);
}

absl::Status HostExecutor::FailDevices(const wire::FailDevices& request) { return health_.FailDevices(request); }

void HostExecutor::Free(const wire::FreeBuffers& request, SessionId session) { buffers_.Free(session, request); }

void HostExecutor::Fetch(const wire::FetchBuffer& request,
                         absl::AnyInvocable<void(absl::StatusOr<std::string>) &&> done, SessionId session) {
  buffers_.Fetch(session, request, std::move(done));
}

void HostExecutor::SaveShards(const wire::SaveShards& request, absl::AnyInvocable<void(absl::Status) &&> done,
                              SessionId session) {
  ShardWriter writer = GetShardWriter();
  if (!writer) {
    std::move(done)(absl::UnimplementedError(absl::StrCat(
        "host ", host_id_, " has no checkpoint writer (a host process started by `python -m pathways.host` has one)")));
    return;
  }
  // The buffers held here once each is done (their memory, not a copy),
  // then the write on the storage thread.
  struct Job {
    Mutex mu;
    int left ABSL_GUARDED_BY(mu) = 0;
    absl::Status status ABSL_GUARDED_BY(mu);
    std::vector<ShardsToWrite> shards;
    std::string database;
    ShardWriter writer;
    absl::AnyInvocable<void(absl::Status) &&> done;
  };
  auto job = std::make_shared<Job>();
  job->database = request.database();
  job->writer = std::move(writer);
  job->done = std::move(done);
  job->shards.resize(request.buffers_size());
  auto write = [this, job] {
    absl::Status status;
    {
      MutexLock lock(&job->mu);
      status = job->status;
    }
    if (!status.ok()) {
      std::move(job->done)(status);
      return;
    }
    QueueStorageJob([this, job](bool run) mutable {
      if (!run) {
        std::move(job->done)(absl::CancelledError(absl::StrCat("host ", host_id_, " stopped before it wrote")));
        return;
      }
      absl::Status written = job->writer(job->database, std::move(job->shards));
      std::move(job->done)(std::move(written));
    });
  };
  if (request.buffers_size() == 0) {
    write();
    return;
  }
  {
    MutexLock lock(&job->mu);
    job->left = request.buffers_size();
  }
  for (int i = 0; i < request.buffers_size(); ++i) {
    job->shards[i].spec_json = request.buffers(i).spec_json();
    buffers_.Hold(session, request.buffers(i).buffer_id(),
                  [job, i, write](absl::StatusOr<std::shared_ptr<const HostBuffer>> buffer) {
      bool last = false;
      {
        MutexLock lock(&job->mu);
        if (buffer.ok()) {
          const std::shared_ptr<const HostBuffer>& held = *buffer;
          job->shards[i].bytes = held->bytes();
          job->shards[i].data = std::shared_ptr<const void>(held, held->data());  // holds the buffer
        } else {
          job->status.Update(buffer.status());
        }
        last = --job->left == 0;
      }
      if (last) write();
    });
  }
}

void HostExecutor::LoadShards(const wire::LoadShards& request, absl::AnyInvocable<void(absl::Status) &&> done,
                              SessionId session) {
  if (absl::Status begun = BeginDispatch(session, "load_shards"); !begun.ok()) {
    std::move(done)(std::move(begun));
    return;
  }
  absl::Cleanup dispatched = [this, session] { EndDispatch(session); };
  const int n = request.buffers_size();
  // Where each buffer's shards are here: the positions of the list as this
  // host knows it (not the client's word), or why not.
  std::vector<absl::StatusOr<std::vector<int>>> positions;
  positions.reserve(n);
  {
    MutexLock lock(&mu_);
    for (const wire::ShardsToLoad& b : request.buffers()) {
      absl::StatusOr<const HostDeviceList*> list = List(session, b.devices());
      if (list.ok()) {
        positions.emplace_back((*list)->local_positions);
      } else {
        positions.emplace_back(list.status());
      }
    }
  }
  // The reader's work, on the storage thread; the buffers are its to write
  // until it completes them.
  struct Job {
    std::string database;
    ShardReader reader;
    std::vector<std::shared_ptr<HostBuffer>> buffers;
    std::vector<ShardsToRead> shards;  // parallel to buffers
    absl::AnyInvocable<void(absl::Status) &&> done;
  };
  auto job = std::make_shared<Job>();
  job->database = request.database();
  job->reader = GetShardReader();
  job->done = std::move(done);
  absl::Status refused;
  if (!job->reader) {
    refused = absl::UnimplementedError(absl::StrCat(
        "host ", host_id_, " has no checkpoint reader (a host process started by `python -m pathways.host` has one)"));
  }
  auto on_host = [this](const absl::Status& status) {
    return absl::Status(status.code(), absl::StrCat(status.message(), " (on host ", host_id_, ")"));
  };
  // Every buffer is made now, pending, as a put's first chunk makes it: the
  // requests after this one that use it wait for it here. A buffer that
  // cannot be read fails the whole request, as the client sees it.
  {
    MutexLock lock(&buffers_.mu());
    for (int i = 0; i < n; ++i) {
      const wire::ShardsToLoad& b = request.buffers(i);
      absl::Status status = refused;
      int64_t bytes = 0;
      if (status.ok() && !positions[i].ok()) {
        status = absl::Status(positions[i].status().code(), absl::StrCat("load_shards: buffer ", b.buffer_id(), ": ",
                                                                        positions[i].status().message()));
      } else if (status.ok() && !ShardBytesOk(b.shard_bytes())) {
        status = absl::InvalidArgumentError(
            absl::StrCat("load_shards: buffer ", b.buffer_id(), ": bad shard_bytes ", b.shard_bytes()));
      } else if (status.ok()) {
        bytes = static_cast<int64_t>(positions[i]->size()) * b.shard_bytes();
      }
      std::shared_ptr<HostBuffer> buffer = buffers_.NewLocked(SessionKey{session, b.buffer_id()}, bytes);
      if (status.ok() && !buffer->allocated()) status = buffer->AllocationError();
      if (!status.ok()) refused.Update(on_host(status));
      ShardsToRead& shards = job->shards.emplace_back();
      shards.spec_json = b.spec_json();
      if (positions[i].ok()) shards.positions = *positions[i];
      shards.data = buffer->data();
      shards.bytes = bytes;
      job->buffers.push_back(std::move(buffer));
    }
    if (!refused.ok()) {
      for (const auto& buffer : job->buffers) buffer->Complete(refused);
    }
  }
  if (!refused.ok()) {
    std::move(job->done)(std::move(refused));
    return;
  }
  QueueStorageJob([this, job, on_host](bool run) {
    absl::Status status = run ? job->reader(job->database, std::move(job->shards))
                              : absl::CancelledError(absl::StrCat("host ", host_id_, " stopped before it read"));
    if (!status.ok()) status = on_host(status);
    for (const auto& buffer : job->buffers) buffer->Complete(status);
    job->buffers.clear();
    std::move(job->done)(std::move(status));
  });
}

void HostExecutor::QueueStorageJob(absl::AnyInvocable<void(bool run) &&> job) {
  {
    MutexLock lock(&storage_mu_);
    if (!storage_stopping_) {
      storage_jobs_.push_back(std::move(job));
      if (!storage_.joinable()) storage_ = std::thread([this] { StorageLoop(); });
      storage_cv_.Signal();
      return;
    }
  }
  std::move(job)(false);
}

void HostExecutor::StorageLoop() {
  while (true) {
    absl::AnyInvocable<void(bool run) &&> job;
    {
      MutexLock lock(&storage_mu_);
      while (storage_jobs_.empty() && !storage_stopping_) storage_cv_.Wait(&storage_mu_);
      if (storage_stopping_) return;
      job = std::move(storage_jobs_.front());
      storage_jobs_.pop_front();
    }
    std::move(job)(true);
  }
}

wire::QueuesReply HostExecutor::DescribeQueues(SessionId session) {
  wire::QueuesReply reply;
  absl::flat_hash_map<const Part*, uint32_t> index;
  // A part in a queue still has its inputs: its device's thread drops them
  // only after taking it out of every queue, under this lock.
  MutexLock lock(&queue_mu_);
  // Each device's queue: the parts of the lists holding it, in order.
  std::vector<std::vector<std::pair<uint64_t, const Part*>>> queues(layout_.num_local_devices());
  order_.ForEach([&](const GangOrder<Part*>::Ordered& o, int list) {
    queue_mu_.AssertHeld();
    for (int d : order_.list(list).devices) queues[d].emplace_back(o.sequence, o.gang);
  });
  for (int d = 0; d < layout_.num_local_devices(); ++d) {
    wire::DeviceQueue* q = reply.add_queues();
    q->set_device_id(layout_.local_device_ids[d]);
    std::sort(queues[d].begin(), queues[d].end());
    for (const auto& [sequence, part] : queues[d]) {
      auto [it, fresh] = index.try_emplace(part, static_cast<uint32_t>(reply.parts_size()));
      if (fresh) {
        wire::QueuedPart* p = reply.add_parts();
        if (part->run_key.session != session) {
          p->set_another_session(true);  // its place only: its ids are its session's
          q->add_parts(it->second);
          continue;
        }
        p->set_program_id(part->run_key.program_id);
        p->set_first_buffer_id(part->run_key.first_buffer_id);
        p->set_step(part->step);
        for (size_t i = 0; i < part->inputs.size(); ++i) {
          if (part->inputs[i]->done()) continue;
          p->add_pending_buffer_ids(part->inputs[i]->id());
          p->add_pending_inputs(static_cast<uint32_t>(i));
        }
      }
      q->add_parts(it->second);
    }
  }
  return reply;
}

int HostExecutor::num_buffers() const { return buffers_.size(); }

}  // namespace pw
