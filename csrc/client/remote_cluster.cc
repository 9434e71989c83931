#include "csrc/client/remote_cluster.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "csrc/base/status_macros.h"
#include "csrc/function_ir/function_ir_wire.h"

namespace pw {
namespace {

// How long the hosts may take to connect their data plane to each other.
constexpr int64_t kJoinTimeoutNs = int64_t{60} * 1'000'000'000;

std::string FreshGroupPrefix() {
  std::random_device device;
  return absl::StrFormat("cluster-%08x%08x", device(), device());
}

// Waits for a known number of replies.
class Replies {
 public:
  explicit Replies(int n) : left_(n) {}
  void Done(absl::Status status) {
    MutexLock lock(&mu_);
    if (first_error_.ok() && !status.ok()) first_error_ = std::move(status);
    if (--left_ == 0) cv_.SignalAll();
  }
  // The first error, or DeadlineExceeded after `timeout_ns`.
  absl::Status Wait(int64_t timeout_ns, absl::string_view what) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::nanoseconds(timeout_ns);
    MutexLock lock(&mu_);
    while (left_ > 0) {
      if (!cv_.WaitUntil(&mu_, deadline)) {
        return absl::DeadlineExceededError(absl::StrCat(what, ": ", left_, " hosts did not answer in time"));
      }
    }
    return first_error_;
  }

 private:
  Mutex mu_;
  CondVar cv_;
  int left_ ABSL_GUARDED_BY(mu_);
  absl::Status first_error_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

// What the hosts know of one lowered program.
struct RemoteCluster::Plan {
  std::vector<int> hosts;              // taking part, increasing
  absl::flat_hash_set<int> loaded;     // hosts that have its steps
  // Per step: its hosts and its wire form.
  std::vector<std::vector<int>> step_hosts;
  std::vector<wire::ProgramStep> step_wire;
  // Sequential dispatch: step k is program sequential_base + k, and the
  // arguments' copies program sequential_base + num_steps (0: not loaded).
  uint64_t sequential_base = 0;
  absl::flat_hash_set<int> args_loaded;
};

// One run in flight: its buffers complete once every host taking part has
// replied. Holds the buffers (as a gang task does), and counts as work in
// flight so a dispatch waiting for memory knows memory may come back.
struct RemoteCluster::Run {
  Run(ObjectStores* stores, TransferStats* stats) : in_flight(stores), stats(stats) {}
  ObjectStores::WorkInFlight in_flight;
  TransferStats* stats;
  std::vector<std::shared_ptr<ShardedBuffer>> made;
  // The buffers made by transfers (ICI or DCN), counted in the transfer
  // statistics once they are ready, as in process.
  absl::flat_hash_map<uint64_t, LinkKind> copies;
  std::atomic<int> pending{0};
  Mutex mu;
  absl::Status whole ABSL_GUARDED_BY(mu);  // a host's part failed as a whole
  absl::flat_hash_map<uint64_t, absl::Status> failed ABSL_GUARDED_BY(mu);

  static void HostDone(const std::shared_ptr<Run>& run, absl::StatusOr<wire::Reply> reply) {
    {
      MutexLock lock(&run->mu);
      absl::Status status = reply.ok() ? ReplyStatus(*reply) : reply.status();
      if (!status.ok()) {
        if (run->whole.ok()) run->whole = std::move(status);
      } else {
        for (const wire::FailedBuffer& f : reply->run().failed()) run->failed[f.buffer_id()] = FromWire(f.status());
      }
    }
    if (run->pending.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    Finish(*run);
  }

  // Completes the buffers the run made.
  static void Finish(Run& run) {
    ReadyList none;  // nothing in this process waits on a remote buffer's list
    std::vector<std::shared_ptr<ShardedBuffer>> made;
    absl::Status whole;
    absl::flat_hash_map<uint64_t, absl::Status> failed;
    {
      MutexLock lock(&run.mu);
      made.swap(run.made);
      whole = run.whole;
      failed.swap(run.failed);
    }
    for (auto& buffer : made) {
      absl::Status status = whole;
      if (status.ok()) {
        auto it = failed.find(buffer->remote_id());
        if (it != failed.end()) status = it->second;
      }
      if (status.ok()) {
        if (auto c = run.copies.find(buffer->remote_id()); c != run.copies.end() && run.stats != nullptr) {
          const bool dcn = c->second == LinkKind::kDcn;
          (dcn ? run.stats->dcn_bytes : run.stats->ici_bytes).fetch_add(buffer->total_bytes(), std::memory_order_relaxed);
          (dcn ? run.stats->dcn_transfers : run.stats->ici_transfers).fetch_add(1, std::memory_order_relaxed);
        }
        buffer->SetReady(&none);
      } else {
        buffer->SetError(std::move(status), &none);
      }
    }
  }
};

absl::StatusOr<std::unique_ptr<RemoteCluster>> RemoteCluster::Connect(const Cluster& cluster,
                                                                      ObjectStores* stores, TransferStats* stats,
                                                                      const std::vector<std::string>& addresses,
                                                                      const std::string& secret) {
  ChannelOptions options;
  options.secret = secret;
  // A host process that dies ends its stream at once; the heartbeat only
  // catches a host that hangs. Its timeout is generous: on a loaded
  // machine, or behind a large frame on the same stream, a live host's
  // answer can take over a second.
  options.heartbeat_timeout_ns = int64_t{10} * 1'000'000'000;
  auto pool = HostPool::Connect(cluster, addresses, options);
  if (!pool.ok()) return pool.status();
  auto rc = std::unique_ptr<RemoteCluster>(new RemoteCluster());
  rc->cluster_ = &cluster;
  rc->stores_ = stores;
  rc->stats_ = stats;
  rc->pool_ = *std::move(pool);
  rc->messages_ = std::make_unique<std::atomic<int64_t>[]>(rc->pool_->num_hosts());
  {
    MutexLock lock(&rc->frees_mu_);
    rc->pending_frees_.resize(rc->pool_->num_hosts());
  }
  {
    MutexLock lock(&rc->mu_);
    rc->known_.resize(rc->pool_->num_hosts());
  }
  wire::JoinCluster join;
  for (const Device* d : cluster.devices()) join.add_device_host(d->host()->id());
  join.set_rendezvous_address(addresses[0]);
  join.set_group_prefix(FreshGroupPrefix());
  // Every host at once: each one's join waits for all the others.
  Replies replies(rc->pool_->num_hosts());
  for (int h = 0; h < rc->pool_->num_hosts(); ++h) {
    wire::Request request;
    *request.mutable_join() = join;
    rc->pool_->channel(h).Send(std::move(request), [&replies, h](absl::StatusOr<wire::Reply> reply) {
      absl::Status status = reply.ok() ? ReplyStatus(*reply) : reply.status();
      if (!status.ok()) status = absl::Status(status.code(), absl::StrCat("host ", h, ": ", status.message()));
      replies.Done(std::move(status));
    });
    rc->Flush(h);
  }
  if (absl::Status joined = replies.Wait(kJoinTimeoutNs, "joining the hosts into one cluster"); !joined.ok()) {
    return joined;
  }
  return rc;
}

RemoteCluster::~RemoteCluster() = default;

void RemoteCluster::Flush(int host) {
  messages_[host].fetch_add(1, std::memory_order_relaxed);
  pool_->channel(host).Flush();
}

std::vector<int64_t> RemoteCluster::messages_sent() const {
  std::vector<int64_t> out;
  for (int h = 0; h < pool_->num_hosts(); ++h) out.push_back(messages_[h].load(std::memory_order_relaxed));
  return out;
}

const DeviceList* RemoteCluster::ListById(int id) const { return lists_by_id_.at(id); }

void RemoteCluster::Send(int host, wire::Request request, HostChannel::ReplyCallback done) {
  pool_->channel(host).Send(std::move(request), std::move(done));
}

const std::vector<int>& RemoteCluster::HostsOf(const DeviceList* list) const {
  // Per list once: a buffer's free or read then costs nothing per shard.
  MutexLock lock(&hosts_mu_);
  std::vector<int>& hosts = hosts_of_[list->id()];
  if (hosts.empty()) {
    for (const Device* d : list->devices()) hosts.push_back(d->host()->id());
    std::sort(hosts.begin(), hosts.end());
    hosts.erase(std::unique(hosts.begin(), hosts.end()), hosts.end());
  }
  return hosts;
}

std::vector<int> RemoteCluster::PositionsOn(const DeviceList* list, int host) const {
  std::vector<int> positions;
  for (int i = 0; i < list->size(); ++i) {
    if (list->devices()[i]->host()->id() == host) positions.push_back(i);
  }
  return positions;
}

void RemoteCluster::EnsureList(int host, const DeviceList* list) {
  lists_by_id_[list->id()] = list;
  if (!known_[host].lists.insert(list->id()).second) return;
  wire::Request request;
  wire::DefineDevices* define = request.mutable_define_devices();
  define->set_list_id(list->id());
  for (const Device* d : list->devices()) define->add_device_ids(d->id());
  Send(host, std::move(request));
}

uint64_t RemoteCluster::EnsureFunction(int host, const CompiledFunction& fn) {
  const std::shared_ptr<const FunctionIr>& ir = fn.executable().ir_ptr();
  auto [it, fresh] = function_ids_.try_emplace(ir.get());
  if (fresh) it->second = {function_ids_.size(), ir};
  const uint64_t id = it->second.first;
  if (known_[host].functions.insert(id).second) {
    wire::Request request;
    request.mutable_load_function()->set_function_id(id);
    request.mutable_load_function()->set_ir(SerializeFunctionIr(*ir));
    Send(host, std::move(request));
  }
  return id;
}

RemoteCluster::Plan& RemoteCluster::PlanFor(const LoweredProgram& program) {
  std::unique_ptr<Plan>& plan = plans_[program.id()];
  if (plan != nullptr) return *plan;
  plan = std::make_unique<Plan>();
  // The devices of every slot: where its producer (a step or an argument
  // placement) puts it.
  std::vector<const DeviceList*> slot_devices(program.num_slots());
  for (const ArgPlacement& p : program.arg_placements()) slot_devices[p.slot] = p.devices;
  for (const LoweredStep& step : program.steps()) {
    for (int s : step.out_slots) slot_devices[s] = step.devices;
  }
  std::vector<wire::LoadProgram> loads(pool_->num_hosts());
  std::vector<bool> takes_part(pool_->num_hosts(), false);
  for (const LoweredStep& step : program.steps()) {
    std::vector<int> hosts = HostsOf(step.devices);  // a copy: transfers add their sources
    wire::ProgramStep ws;
    if (step.kind == LoweredStep::Kind::kCompute) {
      wire::ComputeStep* c = ws.mutable_compute();
      c->set_devices(step.devices->id());
      for (int s : step.in_slots) c->add_in_slots(s);
      for (int s : step.out_slots) c->add_out_slots(s);
      c->set_gang_tag(next_gang_tag_++);
      for (int h : hosts) {
        EnsureList(h, step.devices);
        c->set_function_id(EnsureFunction(h, *step.fn));  // one id whatever the host
      }
    } else {
      const DeviceList* src = slot_devices[step.in_slots[0]];
      const std::vector<int>& src_hosts = HostsOf(src);
      hosts.insert(hosts.end(), src_hosts.begin(), src_hosts.end());
      std::sort(hosts.begin(), hosts.end());
      hosts.erase(std::unique(hosts.begin(), hosts.end()), hosts.end());
      wire::TransferStep* t = ws.mutable_transfer();
      t->set_src_slot(step.in_slots[0]);
      t->set_src_devices(src->id());
      t->set_dst_slot(step.out_slots[0]);
      t->set_dst_devices(step.devices->id());
      const SlotType& type = program.slot_types()[step.out_slots[0]];
      t->set_shard_bytes(ShardBytes(type.dtype, type.dims));
      for (int h : hosts) {
        EnsureList(h, src);
        EnsureList(h, step.devices);
      }
    }
    for (int h : hosts) {
      takes_part[h] = true;
      *loads[h].add_steps() = ws;
    }
    plan->step_hosts.push_back(std::move(hosts));
    plan->step_wire.push_back(std::move(ws));
  }
  // Hosts that only hold placed arguments take part too (they get puts).
  for (const ArgPlacement& p : program.arg_placements()) {
    for (int h : HostsOf(p.devices)) takes_part[h] = true;
  }
  for (int h = 0; h < pool_->num_hosts(); ++h) {
    if (!takes_part[h]) continue;
    plan->hosts.push_back(h);
    plan->loaded.insert(h);
    wire::Request request;
    wire::LoadProgram* load = request.mutable_load_program();
    *load = std::move(loads[h]);
    load->set_program_id(program.id());
    load->set_name(program.ir().name());
    load->set_num_slots(program.num_slots());
    Send(h, std::move(request));
  }
  return *plan;
}

void RemoteCluster::LoadOn(int host, uint64_t program_id, const LoweredProgram& program,
                           const wire::ProgramStep* step) {
  wire::Request request;
  wire::LoadProgram* load = request.mutable_load_program();
  load->set_program_id(program_id);
  load->set_name(program.ir().name());
  load->set_num_slots(program.num_slots());
  if (step != nullptr) *load->add_steps() = *step;
  Send(host, std::move(request));
}

void RemoteCluster::SendRun(const std::vector<int>& hosts, uint64_t program_id, uint64_t first,
                            const std::vector<wire::ArgBinding>& bindings, std::shared_ptr<Run> run) {
  if (hosts.empty()) {  // nothing to run anywhere
    Run::Finish(*run);
    return;
  }
  run->pending.store(static_cast<int>(hosts.size()), std::memory_order_relaxed);
  for (int h : hosts) {
    wire::Request request;
    wire::RunProgram* r = request.mutable_run();
    r->set_program_id(program_id);
    r->set_first_buffer_id(first);
    TakeFrees(h, r);
    for (const wire::ArgBinding& b : bindings) {
      EnsureList(h, ListById(b.src_devices()));
      EnsureList(h, ListById(b.dst_devices()));
      *r->add_args() = b;
    }
    Send(h, std::move(request), [run](absl::StatusOr<wire::Reply> reply) { Run::HostDone(run, std::move(reply)); });
  }
  for (int h : hosts) Flush(h);
}

absl::Status RemoteCluster::DispatchSteps(const LoweredProgram& program, absl::Span<const ProgramArg> args,
                                          const ExecuteOptions& options, const BufferOwner& owner,
                                          std::vector<std::shared_ptr<ShardedBuffer>>& slots) {
  const bool sequential = options.mode == DispatchMode::kSequential;
  MutexLock lock(&mu_);
  Plan& plan = PlanFor(program);
  const uint64_t first = next_buffer_id_.fetch_add(program.num_slots(), std::memory_order_relaxed);
  // Parallel: one run for the whole program. Sequential: one for the
  // arguments, then one per step, each sent once its inputs are ready.
  auto run = std::make_shared<Run>(stores_, stats_);
  BufferOwner slot_owner = owner;
  slot_owner.remote = this;
  auto allocate = [&](int slot, DType dtype, const Dims& dims, const DeviceList* devices) -> absl::Status {
    slot_owner.remote_id = first + static_cast<uint64_t>(slot);
    auto buffer = ShardedBuffer::Allocate(stores_, dtype, dims, devices, slot_owner);
    if (!buffer.ok()) return buffer.status();
    slots[slot] = *std::move(buffer);
    run->made.push_back(slots[slot]);
    return absl::OkStatus();
  };
  std::vector<wire::ArgBinding> bindings;  // in place (sequential: every run needs them)
  std::vector<wire::ArgBinding> copies;
  std::vector<int> hosts = plan.hosts;
  for (const ArgPlacement& p : program.arg_placements()) {
    const ProgramArg& arg = args[p.arg];
    if (arg.buffer == nullptr) {
      PW_RETURN_IF_ERROR(allocate(p.slot, arg.dtype, arg.dims, p.devices));
      WriteLocked(*slots[p.slot], arg.host_data, /*flush=*/false);  // leaves with the run
      continue;
    }
    if (!arg.buffer->is_remote()) {
      return absl::InvalidArgumentError(absl::StrCat("argument ", p.arg, " of program '", program.ir().name(),
                                                     "' is not a buffer of this cluster's hosts"));
    }
    wire::ArgBinding b;
    b.set_slot(p.slot);
    b.set_buffer_id(arg.buffer->remote_id());
    b.set_src_devices(arg.buffer->devices()->id());
    b.set_dst_devices(p.devices->id());
    b.set_shard_bytes(arg.buffer->shard_bytes());
    if (arg.buffer->devices() == p.devices) {
      slots[p.slot] = arg.buffer;
      bindings.push_back(std::move(b));
    } else {
      PW_RETURN_IF_ERROR(allocate(p.slot, arg.buffer->dtype(), arg.buffer->dims(), p.devices));
      run->copies[first + p.slot] = ClassifyLink(*arg.buffer->devices(), *p.devices);
      b.set_copy(true);
      for (int h : HostsOf(arg.buffer->devices())) hosts.push_back(h);  // they send
      copies.push_back(std::move(b));
    }
  }
  std::sort(hosts.begin(), hosts.end());
  hosts.erase(std::unique(hosts.begin(), hosts.end()), hosts.end());
  const auto& types = program.slot_types();
  if (!sequential) {
    for (const LoweredStep& step : program.steps()) {
      for (int s : step.out_slots) PW_RETURN_IF_ERROR(allocate(s, types[s].dtype, types[s].dims, step.devices));
      if (step.kind == LoweredStep::Kind::kTransfer) run->copies[first + step.out_slots[0]] = step.link;
    }
    for (int h : hosts) {
      if (plan.loaded.insert(h).second) LoadOn(h, program.id(), program, nullptr);  // it only sends an argument
    }
    bindings.insert(bindings.end(), copies.begin(), copies.end());
    SendRun(hosts, program.id(), first, bindings, std::move(run));
    return absl::OkStatus();
  }
  // Sequential (Figure 4a): the client sends a step only once its inputs are
  // ready, paying a round trip per node. Each step is a program of its own
  // on its hosts, loaded the first time.
  if (plan.sequential_base == 0) {
    plan.sequential_base = next_sequential_id_;
    next_sequential_id_ += program.steps().size() + 1;
    for (size_t k = 0; k < program.steps().size(); ++k) {
      for (int h : plan.step_hosts[k]) LoadOn(h, plan.sequential_base + k, program, &plan.step_wire[k]);
    }
  }
  const uint64_t args_id = plan.sequential_base + program.steps().size();
  if (!copies.empty()) {
    for (int h : hosts) {
      if (plan.args_loaded.insert(h).second) LoadOn(h, args_id, program, nullptr);
    }
    SendRun(hosts, args_id, first, copies, run);
  } else {
    Run::Finish(*run);  // puts are ready once sent
  }
  for (size_t k = 0; k < program.steps().size(); ++k) {
    const LoweredStep& step = program.steps()[k];
    if (step.kind == LoweredStep::Kind::kCompute) {
      for (int s : step.in_slots) slots[s]->Await().IgnoreError();  // errors flow to the outputs
    }
    run = std::make_shared<Run>(stores_, stats_);
    for (int s : step.out_slots) PW_RETURN_IF_ERROR(allocate(s, types[s].dtype, types[s].dims, step.devices));
    if (step.kind == LoweredStep::Kind::kTransfer) run->copies[first + step.out_slots[0]] = step.link;
    SendRun(plan.step_hosts[k], plan.sequential_base + k, first, bindings, std::move(run));
  }
  return absl::OkStatus();
}

absl::Status RemoteCluster::Write(const ShardedBuffer& buffer, const void* data) {
  MutexLock lock(&mu_);
  WriteLocked(buffer, data, /*flush=*/true);
  return absl::OkStatus();
}

void RemoteCluster::WriteLocked(const ShardedBuffer& buffer, const void* data, bool flush) {
  const DeviceList* list = buffer.devices();
  const int64_t shard = buffer.shard_bytes();
  for (int h : HostsOf(list)) {
    EnsureList(h, list);
    wire::Request request;
    wire::PutBuffer* put = request.mutable_put();
    put->set_buffer_id(buffer.remote_id());
    put->set_devices(list->id());
    put->set_shard_bytes(shard);
    std::string* bytes = put->mutable_data();
    const std::vector<int> positions = PositionsOn(list, h);
    bytes->resize(static_cast<size_t>(shard) * positions.size());
    for (size_t k = 0; k < positions.size(); ++k) {
      std::memcpy(bytes->data() + k * shard, static_cast<const uint8_t*>(data) + positions[k] * shard,
                  static_cast<size_t>(shard));
    }
    Send(h, std::move(request));
    if (flush) Flush(h);
  }
}

absl::Status RemoteCluster::Read(const ShardedBuffer& buffer, void* dst) {
  const DeviceList* list = buffer.devices();
  const std::vector<int> hosts = HostsOf(list);
  std::vector<absl::StatusOr<std::string>> data(hosts.size(), absl::UnknownError("no reply"));
  Replies replies(static_cast<int>(hosts.size()));
  {
    for (size_t k = 0; k < hosts.size(); ++k) {
      wire::Request request;
      request.mutable_fetch()->set_buffer_id(buffer.remote_id());
      Send(hosts[k], std::move(request), [&data, &replies, k](absl::StatusOr<wire::Reply> reply) {
        absl::Status status = reply.ok() ? ReplyStatus(*reply) : reply.status();
        if (status.ok()) {
          data[k] = std::move(*reply->mutable_fetch()->mutable_data());
        } else {
          data[k] = status;
        }
        replies.Done(std::move(status));
      });
      Flush(hosts[k]);
    }
  }
  // A lost host fails its fetch (HostChannel), so this wait ends.
  PW_RETURN_IF_ERROR(replies.Wait(std::numeric_limits<int64_t>::max() / 2, "reading a buffer"));
  const int64_t shard = buffer.shard_bytes();
  for (size_t k = 0; k < hosts.size(); ++k) {
    const std::vector<int> positions = PositionsOn(list, hosts[k]);
    const std::string& bytes = *data[k];
    if (static_cast<int64_t>(bytes.size()) != shard * static_cast<int64_t>(positions.size())) {
      return absl::InternalError(absl::StrCat("host ", hosts[k], " sent ", bytes.size(), " bytes of buffer ",
                                              buffer.remote_id(), ", expected ", shard * positions.size()));
    }
    for (size_t p = 0; p < positions.size(); ++p) {
      std::memcpy(static_cast<uint8_t*>(dst) + positions[p] * shard, bytes.data() + p * shard,
                  static_cast<size_t>(shard));
    }
  }
  return absl::OkStatus();
}

void RemoteCluster::Free(const ShardedBuffer& buffer) {
  // Not under mu_: a buffer may go while a dispatch holds it (its own error
  // path). Nothing names a buffer once it is gone, so its free may wait for
  // the host's next run, unless it holds much memory or many wait.
  const bool now = buffer.total_bytes() >= kFreeAtOnceBytes;
  for (int h : HostsOf(buffer.devices())) {
    std::vector<uint64_t> ids;
    {
      MutexLock lock(&frees_mu_);
      std::vector<uint64_t>& pending = pending_frees_[h];
      pending.push_back(buffer.remote_id());
      if (!now && pending.size() < kFreesPerMessage) continue;
      ids.swap(pending);
    }
    wire::Request request;
    for (uint64_t id : ids) request.mutable_free()->add_buffer_ids(id);
    Send(h, std::move(request));
    Flush(h);
  }
}

void RemoteCluster::TakeFrees(int host, wire::RunProgram* run) {
  MutexLock lock(&frees_mu_);
  for (uint64_t id : pending_frees_[host]) run->add_free_buffer_ids(id);
  pending_frees_[host].clear();
}

}  // namespace pw
