#include "csrc/client/remote_cluster.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <limits>
#include <map>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "csrc/base/error_kind.h"
#include "csrc/base/spin.h"
#include "csrc/base/status_macros.h"
#include "csrc/client/remote_cluster_internal.h"
#include "csrc/coordination/auth.h"
#include "csrc/function_ir/function_ir_wire.h"

namespace pw {
namespace {

// How long the hosts may take to connect their data plane to each other.
constexpr int64_t kJoinTimeoutNs = int64_t{60} * 1'000'000'000;
// A host that shows no sign of life this long is lost (README: "Failure").
constexpr int64_t kHeartbeatTimeoutNs = int64_t{3} * 1'000'000'000;
// How long FailDevices waits for the hosts to take it.
constexpr int64_t kFailTimeoutNs = int64_t{5} * 1'000'000'000;


// Buffer data goes to and from hosts in chunks of this many bytes: each a
// message of its own, far below protobuf's 2 GiB limit per message.
constexpr int64_t kDataChunkBytes = int64_t{16} << 20;
// A read asks each host for at most this many chunks at a time.
constexpr int kReadChunksPerHost = 4;

// Calls fn(position, offset in its shard, offset in the range, length) for
// each piece of the bytes [offset, offset + n) of a host's shards: its
// positions of the list in order, `shard` bytes each.
template <typename Fn>
void ForEachPiece(const std::vector<int>& positions, int64_t shard, int64_t offset, int64_t n, Fn fn) {
  if (shard == 0) return;
  size_t k = static_cast<size_t>(offset / shard);
  int64_t in_shard = offset % shard;
  for (int64_t done = 0; done < n; ++k, in_shard = 0) {
    const int64_t len = std::min(shard - in_shard, n - done);
    fn(positions[k], in_shard, done, len);
    done += len;
  }
}

}  // namespace


absl::StatusOr<std::unique_ptr<RemoteCluster>> RemoteCluster::Connect(const Cluster& cluster,
                                                                      RemoteServices services,
                                                                      const std::vector<std::string>& addresses,
                                                                      const std::string& secret) {
  ChannelOptions options;
  options.secret = secret;
  options.clock_samples = 8;  // hosts on other machines: their parts' times on our clock
  // A host process that dies ends its stream at once; the heartbeat only
  // catches a host that hangs, stops or is cut off. Heartbeats travel on a
  // connection of their own and the host answers them on a thread that runs
  // no requests (host_channel.h), so a host busy with a long put or compile
  // still answers within milliseconds: the timeout only has to cover a
  // loaded machine's scheduling delays.
  options.heartbeat_timeout_ns = kHeartbeatTimeoutNs;
  // A lost host's devices are gone with it: new slices avoid them, and
  // work or buffers on them fail with the host's loss (HostLostError).
  auto sessions = HostSessions::Connect(cluster, addresses, options, [&cluster](int host, const absl::Status& why) {
    for (Device* d : cluster.devices()) {
      if (d->host()->id() == host) d->MarkFailed(why);
    }
  });
  if (!sessions.ok()) return sessions.status();
  HostSessions* joining = sessions->get();
  std::unique_ptr<RemoteCluster> rc = Attach(cluster, std::move(services), *std::move(sessions));
  PW_RETURN_IF_ERROR(joining->Join(addresses, kJoinTimeoutNs));
  return rc;
}

std::unique_ptr<RemoteCluster> RemoteCluster::Attach(const Cluster& cluster, RemoteServices services,
                                                     std::unique_ptr<HostLinks> links) {
  auto rc = std::unique_ptr<RemoteCluster>(new RemoteCluster());
  rc->cluster_ = &cluster;
  rc->stores_ = services.stores;
  rc->services_ = std::move(services);
  rc->links_ = std::move(links);
  const int num_hosts = rc->links_->num_hosts();
  rc->messages_ = std::make_unique<std::atomic<int64_t>[]>(num_hosts);
  {
    MutexLock lock(&rc->frees_mu_);
    rc->pending_frees_.resize(num_hosts);
  }
  {
    MutexLock lock(&rc->mu_);
    rc->known_.resize(num_hosts);
  }
  {
    MutexLock lock(&rc->admission_mu_);
    rc->admitted_.resize(cluster.islands().size(), 0);
  }
  rc->admission_thread_ = std::thread([r = rc.get()] { r->AdmissionLoop(); });
  return rc;
}

RemoteCluster::~RemoteCluster() {
  std::vector<std::unique_ptr<Waiting>> left;
  {
    MutexLock lock(&admission_mu_);
    stopping_ = true;
    admission_cv_.SignalAll();
    left = waiting_.Take(nullptr, /*all=*/true);
  }
  if (admission_thread_.joinable()) admission_thread_.join();
  // Runs never sent (the runtime shuts down without waiting for them).
  for (auto& w : left) Run::FinishUnsent(*w->run, "the pathways runtime shut down");
  // The sessions end first: replies still awaited fail now, and finishing
  // their runs uses this object's members.
  {
    MutexLock lock(&closing_mu_);
    closing_ = true;
  }
  links_.reset();
}

void RemoteCluster::SetPolicy(SchedulingPolicy policy) {
  MutexLock lock(&admission_mu_);
  policy_ = policy;
  if (!waiting_.empty()) {
    admission_wanted_ = true;
    admission_cv_.Signal();
  }
}

void RemoteCluster::Released(const std::vector<int>& islands) {
  MutexLock lock(&admission_mu_);
  for (int i : islands) --admitted_[i];
  if (!waiting_.empty()) {
    admission_wanted_ = true;
    admission_cv_.Signal();
  }
}

void RemoteCluster::AdmissionLoop() {
  while (true) {
    {
      MutexLock lock(&admission_mu_);
      while (!admission_wanted_ && !stopping_) admission_cv_.Wait(&admission_mu_);
      if (stopping_) return;
      admission_wanted_ = false;
    }
    MutexLock lock(&mu_);
    AdmitLocked();
  }
}

void RemoteCluster::SubmitRun(std::vector<int> hosts, uint64_t program_id, uint64_t first,
                              std::vector<wire::ArgBinding> bindings, std::shared_ptr<Run> run, double cost_ns,
                              std::vector<int> islands) {
  run->program_id = program_id;
  run->first = first;
  run->submitted_ns = NowNanos();
  run->hosts = std::move(hosts);
  run->cost_ns = cost_ns;
  run->islands = islands;
  {
    MutexLock lock(&runs_mu_);
    run->seq = next_run_seq_++;
    run->first_gang = next_gang_;
    next_gang_ += run->single_step >= 0 ? 1 : static_cast<int64_t>(run->plan->step_fns.size());
    runs_in_flight_.insert(run->seq);
    runs_by_id_[{program_id, first}] = run;
  }
  bool queued = false;
  {
    MutexLock lock(&admission_mu_);
    // FIFO with nothing queued sends at once (below, unlocked: a run with
    // no hosts finishes at once, and that takes admission_mu_), and so does
    // a tenant of a service, which admits the runs of all its tenants.
    if (!links_->admits_runs() && (policy_ != SchedulingPolicy::kFifo || !waiting_.empty())) {
      queued = true;
      auto w = std::make_unique<Waiting>();
      w->program_id = program_id;
      w->first = first;
      w->bindings = std::move(bindings);
      w->cost_ns = cost_ns;
      w->islands = std::move(islands);
      for (const auto& made : run->made) unsent_buffers_.insert(made->remote_id());
      w->run = std::move(run);
      const SchedulingClient* client = w->run->client;
      waiting_.Push(client, std::move(w));
    }
  }
  if (queued) {
    AdmitLocked();
    return;
  }
  if (CancelledBeforeSending(*run)) return;
  if (renew_pending_.load(std::memory_order_acquire)) SendRenewalsLocked();
  SendRun(program_id, first, bindings, std::move(run));
}

bool RemoteCluster::CancelledBeforeSending(Run& run) {
  std::string reason;
  if (cancel_all_.load(std::memory_order_acquire)) {
    reason = cancel_all_reason_;
  } else if (run.client != nullptr && run.client->closed()) {
    reason = absl::StrCat("its client '", run.client->name(), "' was closed");
  } else {
    return false;
  }
  Run::FinishUnsent(run, reason);
  return true;
}

void RemoteCluster::Cancel(const SchedulingClient* client, const std::string& reason, bool end_simulated_time) {
  std::vector<std::unique_ptr<Waiting>> unsent;
  std::vector<std::shared_ptr<Run>> sent;  // held until the lock is released
  {
    // No run is sent meanwhile: every run sent before is ahead of the
    // cancel on its hosts' streams, and every run after it sees the client
    // closed (or cancel_all_) in CancelledBeforeSending.
    MutexLock lock(&mu_);
    if (client == nullptr) {
      cancel_all_reason_ = reason;
      cancel_all_.store(true, std::memory_order_release);
    }
    {
      MutexLock admission(&admission_mu_);
      for (auto& w : waiting_.Take(client, /*all=*/client == nullptr)) {
        for (const auto& made : w->run->made) unsent_buffers_.erase(made->remote_id());
        unsent.push_back(std::move(w));
      }
    }
    wire::CancelRuns cancel;
    cancel.set_all(client == nullptr);
    cancel.set_reason(reason);
    cancel.set_end_simulated_time(end_simulated_time);
    if (client != nullptr) {
      MutexLock runs(&runs_mu_);
      for (const auto& [key, weak] : runs_by_id_) {
        std::shared_ptr<Run> run = weak.lock();
        if (run == nullptr || run->client != client) continue;
        cancel.add_program_ids(key.first);
        cancel.add_first_buffer_ids(key.second);
        sent.push_back(std::move(run));
      }
    }
    if (cancel.all() || cancel.program_ids_size() > 0) {
      for (int h = 0; h < links_->num_hosts(); ++h) {
        if (!links_->alive(h)) continue;
        wire::Request request;
        *request.mutable_cancel_runs() = cancel;
        Send(h, std::move(request));
        Flush(h);
      }
    }
  }
  for (auto& w : unsent) Run::FinishUnsent(*w->run, reason);
}

void RemoteCluster::Abandon(const absl::Status& why) {
  std::vector<std::shared_ptr<Run>> left;
  {
    MutexLock lock(&runs_mu_);
    for (const auto& [key, weak] : runs_by_id_) {
      if (std::shared_ptr<Run> run = weak.lock()) left.push_back(std::move(run));
    }
  }
  for (auto& run : left) {
    {
      MutexLock lock(&run->mu);
      if (run->whole.ok()) run->whole = why;
    }
    Run::Finish(*run);  // once: a host's reply after this finds it finished
  }
}

void RemoteCluster::GroupMayHaveBroken(const Run& run, int step) {
  const Plan& plan = *run.plan;
  if (step < 0 || step >= static_cast<int>(plan.step_fns.size()) || plan.step_fns[step] == nullptr) return;
  if (plan.step_hosts[step].size() < 2 ||
      plan.step_fns[step]->executable().first_collective().kind == FunctionExecutable::CollectiveCall::Kind::kNone) {
    return;
  }
  MutexLock lock(&renew_mu_);
  renew_.insert(plan.step_hosts[step]);
  renew_pending_.store(true, std::memory_order_release);
}

void RemoteCluster::SendRenewalsLocked() {
  std::set<std::vector<int>> sets;
  {
    MutexLock lock(&renew_mu_);
    sets.swap(renew_);
    renew_pending_.store(false, std::memory_order_release);
  }
  // Under mu_, as every run is sent: each host of a set sees the renewal at
  // the same place among the runs (they leave with the next flush).
  for (const std::vector<int>& hosts : sets) {
    // A set with a lost host has no next incarnation (its live hosts would
    // wait to make it with the lost one); its gangs fail with the loss.
    if (!std::all_of(hosts.begin(), hosts.end(), [&](int h) { return links_->alive(h); })) continue;
    for (int h : hosts) {
      wire::Request request;
      for (int k : hosts) request.mutable_renew_group()->add_hosts(k);
      Send(h, std::move(request));
    }
  }
}

void RemoteCluster::AdmitLocked() {
  while (true) {
    std::unique_ptr<Waiting> w;
    {
      MutexLock lock(&admission_mu_);
      if (waiting_.empty()) return;
      const bool fifo = policy_ == SchedulingPolicy::kFifo;
      // FIFO: dispatch order. Proportional share: the smallest start tag
      // (fair_queue.h), within each island's window of admitted runs.
      auto admissible = [&](const std::unique_ptr<Waiting>& head) {
        admission_mu_.AssertHeld();
        // Its arguments' producers go first (a host runs its device queues
        // in order: a gang ahead of its input's producer would never start).
        for (const wire::ArgBinding& b : head->bindings) {
          if (unsent_buffers_.contains(b.buffer_id())) return false;
        }
        if (!fifo) {
          for (int i : head->islands) {
            if (admitted_[i] >= kAdmissionWindow) return false;
          }
        }
        return true;
      };
      auto cost = [](const std::unique_ptr<Waiting>& head) { return head->cost_ns; };
      std::optional<std::unique_ptr<Waiting>> next = waiting_.Pop(/*fair=*/!fifo, admissible, cost);
      if (!next.has_value()) return;
      w = *std::move(next);
      if (!fifo) {
        for (int i : w->islands) ++admitted_[i];
        w->run->admitted_islands = w->islands;
      }
      for (const auto& made : w->run->made) unsent_buffers_.erase(made->remote_id());
    }
    if (CancelledBeforeSending(*w->run)) continue;
    if (renew_pending_.load(std::memory_order_acquire)) SendRenewalsLocked();
    SendRun(w->program_id, w->first, w->bindings, std::move(w->run));
  }
}

void RemoteCluster::Flush(int host) {
  messages_[host].fetch_add(1, std::memory_order_relaxed);
  links_->Flush(host);
}

std::vector<int64_t> RemoteCluster::messages_sent() const {
  std::vector<int64_t> out;
  for (int h = 0; h < links_->num_hosts(); ++h) out.push_back(messages_[h].load(std::memory_order_relaxed));
  return out;
}

const DeviceList* RemoteCluster::ListById(int id) const { return lists_by_id_.at(id); }

void RemoteCluster::Send(int host, wire::Request request, HostChannel::ReplyCallback done) {
  links_->Send(host, std::move(request), std::move(done));
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

const DeviceList* RemoteCluster::PartOn(const DeviceList* list, int host) const {
  MutexLock lock(&hosts_mu_);
  const DeviceList*& part = parts_on_[{list->id(), host}];
  if (part == nullptr) {
    std::vector<Device*> devices;
    for (Device* d : list->devices()) {
      if (d->host()->id() == host) devices.push_back(d);
    }
    // A sublist of an interned list: never empty here, never a new device.
    auto interned = services_.registry->Intern(devices);
    part = interned.ok() ? *interned : list;
  }
  return part;
}

void RemoteCluster::RecordPart(const Run& run, int host, int step, int64_t start_ns, int64_t end_ns) const {
  const Plan& plan = *run.plan;
  if (run.single_step >= 0) {
    if (step != 0) return;
    step = run.single_step;
  } else {
    const std::vector<int>& steps = plan.host_steps[host];
    if (step < 0 || step >= static_cast<int>(steps.size())) return;  // not a step of ours: ignore
    step = steps[step];
  }
  const CompiledFunction* fn = plan.step_fns[step];
  if (fn == nullptr) return;  // a transfer
  const DeviceList* gang = plan.step_devices[step];
  const DeviceList* part = PartOn(gang, host);
  const PartInterval ours = OnClientClock(start_ns, end_ns, links_->clock_offset_ns(host),
                                          run.submitted_ns, NowNanos());
  start_ns = ours.start_ns;
  const int64_t busy_ns = ours.end_ns - ours.start_ns;
  // The gang counts once: on its first host.
  const bool first = plan.step_hosts[step].front() == host;
  if (run.client != nullptr) run.client->AddUsage(busy_ns * part->size(), first ? 1 : 0);
  if (gang->island() != nullptr && gang->island()->id() < static_cast<int>(services_.schedulers.size())) {
    services_.schedulers[gang->island()->id()]->AddBusy(part, busy_ns);
  }
  if (services_.timeline != nullptr && services_.timeline->recording()) {
    TimelineEvent event{part, start_ns, start_ns + busy_ns,
                        run.client != nullptr ? &run.client->name() : &DefaultClientName(),
                        &run.program->name(), &fn->name(), run.program};
    // Every host's part of this step of this run is one gang: numbered by
    // both, negative so as not to meet the in-process numbers (steps < 2^24).
    event.gang = -((static_cast<int64_t>(run.seq) << 24) + step + 1);
    services_.timeline->Record(std::move(event));
  }
}

int64_t RemoteCluster::SubmissionMark() const {
  MutexLock lock(&runs_mu_);
  return next_run_seq_;
}

bool RemoteCluster::FinishedBefore(int64_t mark) const {
  MutexLock lock(&runs_mu_);
  return runs_in_flight_.empty() || *runs_in_flight_.begin() >= mark;
}

void RemoteCluster::Retire(const Run& run) {
  MutexLock lock(&runs_mu_);
  runs_in_flight_.erase(run.seq);
  runs_by_id_.erase({run.program_id, run.first});
}

std::vector<int> RemoteCluster::PositionsOn(const DeviceList* list, int host) const {
  std::vector<int> positions;
  for (int i = 0; i < list->size(); ++i) {
    if (list->devices()[i]->host()->id() == host) positions.push_back(i);
  }
  return positions;
}

std::shared_ptr<RemoteCluster::LoadReply> RemoteCluster::SendLoad(int host, wire::Request request, std::string what) {
  auto reply = std::make_shared<LoadReply>(host, std::move(what));
  Send(host, std::move(request), [reply](absl::StatusOr<wire::Reply> answer) { reply->Answer(answer); });
  return reply;
}

void RemoteCluster::EnsureList(int host, const DeviceList* list, Plan* plan) {
  lists_by_id_[list->id()] = list;
  auto [it, fresh] = known_[host].lists.try_emplace(list->id());
  if (fresh) {
    wire::Request request;
    wire::DefineDevices* define = request.mutable_define_devices();
    define->set_list_id(list->id());
    for (const Device* d : list->devices()) define->add_device_ids(d->id());
    it->second = SendLoad(host, std::move(request),
                          absl::StrCat("host ", host, " could not define device list ", list->id(), " (",
                                       list->size(), " devices)"));
  }
  if (plan != nullptr) plan->AddLoad(it->second);
}

uint64_t RemoteCluster::EnsureFunction(int host, const CompiledFunction& fn, Plan* plan) {
  const std::shared_ptr<const FunctionIr>& ir = fn.executable().ir_ptr();
  auto fit = function_ids_.find(ir.get());
  if (fit != function_ids_.end() && fit->second.ir.expired()) {
    // A new IR where a dropped one was: the sweep that unloads the dropped
    // one has not come yet. Its id is unloaded now; this IR gets its own.
    wire::Request request;
    for (int h = 0; h < static_cast<int>(known_.size()); ++h) {
      if (known_[h].functions.erase(fit->second.id) == 0) continue;
      request.mutable_unload()->add_function_ids(fit->second.id);
      Send(h, request);
      request.Clear();
    }
    function_ids_.erase(fit);
    fit = function_ids_.end();
  }
  if (fit == function_ids_.end()) {
    MaybeReclaimLocked();
    fit = function_ids_.emplace(ir.get(), FunctionEntry{next_function_id_++, ir}).first;
  }
  const uint64_t id = fit->second.id;
  auto [it, fresh] = known_[host].functions.try_emplace(id);
  if (fresh) {
    wire::Request request;
    request.mutable_load_function()->set_function_id(id);
    request.mutable_load_function()->set_ir(SerializeFunctionIr(*ir));
    it->second = SendLoad(host, std::move(request), absl::StrCat("host ", host, " could not load function '",
                                                                 ir->name(), "'"));
  }
  if (plan != nullptr) plan->AddLoad(it->second);
  return id;
}

absl::Status RemoteCluster::AwaitLoads(Plan& plan) {
  if (plan.loads_ok.load(std::memory_order_acquire)) return absl::OkStatus();
  std::vector<std::shared_ptr<LoadReply>> loads;
  {
    MutexLock lock(&plan.loads_mu);
    if (!plan.load_error.ok()) return plan.load_error;
    loads = plan.loads;
  }
  // The loads may still be queued on their hosts' sessions (nothing else
  // need be sent after them): they leave now, or nothing would answer.
  absl::flat_hash_set<int> unanswered;
  for (const auto& load : loads) {
    if (!load->is_answered()) unanswered.insert(load->host);
  }
  for (int h : unanswered) Flush(h);
  // In the order sent: a list or function before the program that names
  // it, so the first error is the cause.
  absl::Status error;
  for (const auto& load : loads) {
    error = load->Await();
    if (!error.ok()) break;
  }
  MutexLock lock(&plan.loads_mu);
  if (!error.ok()) {
    if (plan.load_error.ok()) {
      plan.load_error = Prefixed(absl::StrCat("program '", plan.name, "' cannot run: "), error);
    }
    return plan.load_error;
  }
  // Loads added meanwhile (a host that only holds an argument) are waited
  // for by the next dispatch.
  if (plan.loads.size() == loads.size()) plan.loads_ok.store(true, std::memory_order_release);
  return absl::OkStatus();
}

void RemoteCluster::CancelRunOn(Run& run, int refuser, const absl::Status& why) {
  {
    MutexLock lock(&run.mu);
    if (std::find(run.refusers.begin(), run.refusers.end(), refuser) != run.refusers.end()) return;
    run.refusers.push_back(refuser);
  }
  MutexLock lock(&closing_mu_);
  if (closing_) return;
  // The refuser too: its executor knows already if it refused the run, but
  // the refusal may have come from before it (the host's runtime), and then
  // the messages its peers send for the run must still be dropped there.
  for (int h : run.hosts) {
    wire::Request request;
    wire::CancelRun* cancel = request.mutable_cancel_run();
    cancel->set_program_id(run.program_id);
    cancel->set_first_buffer_id(run.first);
    cancel->set_refused_by(refuser);
    ToWire(why, cancel->mutable_status());
    Send(h, std::move(request));
    Flush(h);
  }
}

std::shared_ptr<RemoteCluster::Plan> RemoteCluster::PlanFor(const LoweredProgram& program) {
  if (auto it = plans_.find(program.id()); it != plans_.end()) return it->second;
  MaybeReclaimLocked();
  std::shared_ptr<Plan>& plan = plans_[program.id()];
  plan = std::make_shared<Plan>();
  plan->program = program.weak_from_this();
  plan->name = program.ir().name();
  // The devices of every slot: where its producer (a step or an argument
  // placement) puts it.
  std::vector<const DeviceList*> slot_devices(program.num_slots());
  for (const ArgPlacement& p : program.arg_placements()) slot_devices[p.slot] = p.devices;
  for (const LoweredStep& step : program.steps()) {
    for (int s : step.out_slots) slot_devices[s] = step.devices;
  }
  std::vector<wire::LoadProgram> loads(links_->num_hosts());
  std::vector<bool> takes_part(links_->num_hosts(), false);
  plan->host_steps.resize(links_->num_hosts());
  plan->slot_step.assign(program.num_slots(), -1);
  plan->slot_is_output.assign(program.num_slots(), false);
  for (int s : program.output_slots()) plan->slot_is_output[s] = true;
  for (size_t k = 0; k < program.steps().size(); ++k) {
    for (int s : program.steps()[k].out_slots) plan->slot_step[s] = static_cast<int>(k);
  }
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
        EnsureList(h, step.devices, plan.get());
        c->set_function_id(EnsureFunction(h, *step.fn, plan.get()));  // one id whatever the host
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
        EnsureList(h, src, plan.get());
        EnsureList(h, step.devices, plan.get());
      }
    }
    for (int h : hosts) {
      takes_part[h] = true;
      plan->host_steps[h].push_back(static_cast<int>(plan->step_wire.size()));
      *loads[h].add_steps() = ws;
    }
    plan->step_hosts.push_back(std::move(hosts));
    plan->step_wire.push_back(std::move(ws));
    plan->step_devices.push_back(step.devices);
    plan->step_fns.push_back(step.kind == LoweredStep::Kind::kCompute ? step.fn : nullptr);
    std::vector<int> islands;
    double cost_ns = 0;
    if (step.kind == LoweredStep::Kind::kCompute) {
      islands.push_back(step.devices->island()->id());
      cost_ns = static_cast<double>(std::max<int64_t>(step.fn->executable().ir().simulated_ns(), kNominalKernelNs)) *
                step.devices->size();
    } else {
      for (const DeviceList* list : {slot_devices[step.in_slots[0]], step.devices}) {
        for (const Device* d : list->devices()) islands.push_back(d->island()->id());
      }
      std::sort(islands.begin(), islands.end());
      islands.erase(std::unique(islands.begin(), islands.end()), islands.end());
    }
    plan->cost_ns += cost_ns;
    plan->islands.insert(plan->islands.end(), islands.begin(), islands.end());
    plan->step_cost_ns.push_back(cost_ns);
    plan->step_islands.push_back(std::move(islands));
  }
  // Hosts that only hold placed arguments take part too (they get puts).
  for (const ArgPlacement& p : program.arg_placements()) {
    for (int h : HostsOf(p.devices)) takes_part[h] = true;
    for (const Device* d : p.devices->devices()) plan->islands.push_back(d->island()->id());
  }
  std::sort(plan->islands.begin(), plan->islands.end());
  plan->islands.erase(std::unique(plan->islands.begin(), plan->islands.end()), plan->islands.end());
  for (int h = 0; h < links_->num_hosts(); ++h) {
    if (!takes_part[h]) continue;
    plan->hosts.push_back(h);
    plan->loaded.insert(h);
    wire::Request request;
    wire::LoadProgram* load = request.mutable_load_program();
    *load = std::move(loads[h]);
    load->set_program_id(program.id());
    load->set_name(program.ir().name());
    load->set_num_slots(program.num_slots());
    plan->AddLoad(SendLoad(h, std::move(request),
                           absl::StrCat("host ", h, " could not load program '", program.ir().name(), "'")));
  }
  return plan;
}

void RemoteCluster::MaybeReclaimLocked() {
  if (plans_.size() + function_ids_.size() < reclaim_at_) return;
  ReclaimLocked();
  reclaim_at_ = std::max(kMinReclaim, 2 * (plans_.size() + function_ids_.size()));
}

void RemoteCluster::AddUnloads(uint64_t program_id, const Plan& plan, std::vector<wire::Request>& unloads) {
  for (int h : plan.loaded) unloads[h].mutable_unload()->add_program_ids(program_id);
  if (plan.sequential_base != 0) {
    for (size_t k = 0; k < plan.step_hosts.size(); ++k) {
      for (int h : plan.step_hosts[k]) unloads[h].mutable_unload()->add_program_ids(plan.sequential_base + k);
    }
    for (int h : plan.args_loaded) {
      unloads[h].mutable_unload()->add_program_ids(plan.sequential_base + plan.step_hosts.size());
    }
  }
}

void RemoteCluster::ReclaimLocked() {
  std::vector<wire::Request> unloads(known_.size());
  // Plans first: a program gone, with no run holding its plan (use_count
  // can only fall meanwhile: no dispatch can name a program that is gone).
  for (auto it = plans_.begin(); it != plans_.end();) {
    const Plan& plan = *it->second;
    if (!plan.program.expired() || it->second.use_count() > 1) {
      ++it;
      continue;
    }
    AddUnloads(it->first, plan, unloads);
    plans_.erase(it++);
  }
  // Then functions whose IR is gone: every program that named one is gone,
  // and so is every run of one (a run holds its program's IR, which holds
  // its functions).
  for (auto it = function_ids_.begin(); it != function_ids_.end();) {
    if (!it->second.ir.expired()) {
      ++it;
      continue;
    }
    for (size_t h = 0; h < known_.size(); ++h) {
      if (known_[h].functions.erase(it->second.id) > 0) {
        unloads[h].mutable_unload()->add_function_ids(it->second.id);
      }
    }
    function_ids_.erase(it++);
  }
  for (size_t h = 0; h < unloads.size(); ++h) {
    if (!unloads[h].has_unload()) continue;
    Send(static_cast<int>(h), std::move(unloads[h]));
    Flush(static_cast<int>(h));
  }
}

void RemoteCluster::LoadOn(int host, uint64_t program_id, const LoweredProgram& program,
                           const wire::ProgramStep* step, Plan& plan) {
  wire::Request request;
  wire::LoadProgram* load = request.mutable_load_program();
  load->set_program_id(program_id);
  load->set_name(program.ir().name());
  load->set_num_slots(program.num_slots());
  if (step != nullptr) *load->add_steps() = *step;
  plan.AddLoad(SendLoad(host, std::move(request),
                        absl::StrCat("host ", host, " could not load program '", program.ir().name(), "'")));
}

void RemoteCluster::SendRun(uint64_t program_id, uint64_t first, const std::vector<wire::ArgBinding>& bindings,
                            std::shared_ptr<Run> run) {
  const std::vector<int>& hosts = run->hosts;
  if (hosts.empty()) {  // nothing to run anywhere
    Run::Finish(*run);
    return;
  }
  // A run that needs a lost host fails here, whole, with the host's loss,
  // and nothing of it is sent: the surviving hosts would only wait for the
  // lost one (its rendezvous store, its collectives, its transfers). One
  // atomic load per host. (A host lost after this check is told to the
  // survivors, which then fail its part at once: HostSessions.)
  for (int h : hosts) {
    if (links_->alive(h)) continue;
    absl::Status lost = links_->status(h);
    const std::string what = absl::StrCat("program '", run->program->name(), "' was not run: ", lost.message());
    {
      MutexLock lock(&run->mu);
      run->whole = GetErrorKind(lost) == ErrorKind::kHostLost ? HostLostError(what)
                                                               : absl::Status(lost.code(), what);
    }
    run->args.clear();
    Run::Finish(*run);
    return;
  }
  // Frees of the arguments may go once the run is on its way (behind it).
  const std::vector<std::shared_ptr<ShardedBuffer>> args = std::move(run->args);
  run->pending.store(static_cast<int>(hosts.size()), std::memory_order_relaxed);
  std::vector<wire::Request> requests;
  std::vector<HostChannel::ReplyCallback> done;
  requests.reserve(hosts.size());
  done.reserve(hosts.size());
  for (int h : hosts) {
    wire::RunProgram* r = requests.emplace_back().mutable_run();
    r->set_program_id(program_id);
    r->set_first_buffer_id(first);
    TakeFrees(h, r);
    for (const wire::ArgBinding& b : bindings) {
      EnsureList(h, ListById(b.src_devices()));
      EnsureList(h, ListById(b.dst_devices()));
      *r->add_args() = b;
    }
    done.push_back([run, h](absl::StatusOr<wire::Reply> reply) { Run::HostDone(run, h, std::move(reply)); });
  }
  RunAdmissionInfo admission;
  if (links_->admits_runs()) {
    if (run->client != nullptr) {
      admission.flow = static_cast<uint64_t>(run->client->id()) + 1;
      admission.flow_name = run->client->name();
      admission.weight = run->client->weight();
    }
    admission.cost_ns = run->cost_ns;
    admission.islands = &run->islands;
    const auto& fns = run->plan->step_fns;
    if (run->single_step >= 0) {
      admission.gangs = run->single_step < static_cast<int>(fns.size()) && fns[run->single_step] != nullptr;
    } else {
      admission.gangs = static_cast<int>(std::count_if(fns.begin(), fns.end(), [](auto* f) { return f != nullptr; }));
    }
    for (const auto& made : run->made) admission.made_buffer_ids.push_back(made->remote_id());
    for (const wire::ArgBinding& b : bindings) admission.used_buffer_ids.push_back(b.buffer_id());
  }
  for (int h : hosts) messages_[h].fetch_add(1, std::memory_order_relaxed);
  links_->SendRun(hosts, std::move(requests), std::move(done), admission);
}

absl::Status RemoteCluster::DispatchSteps(const LoweredProgram& program, absl::Span<const ProgramArg> args,
                                          const ExecuteOptions& options, const BufferOwner& owner,
                                          std::vector<std::shared_ptr<ShardedBuffer>>& slots) {
  const bool sequential = options.mode == DispatchMode::kSequential;
  const uint64_t first = next_buffer_id_.fetch_add(program.num_slots(), std::memory_order_relaxed);
  // Parallel: one run for the whole program. Sequential: one for the
  // arguments, then one per step, each sent once its inputs are ready.
  std::shared_ptr<Run> run;
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
  // Host data for the arguments, in put requests built before the lock is
  // taken: copying a large array must not hold up other dispatches.
  absl::flat_hash_map<int, std::vector<HostPuts>> host_data_puts;  // by slot
  for (const ArgPlacement& p : program.arg_placements()) {
    const ProgramArg& arg = args[p.arg];
    if (arg.buffer != nullptr || arg.dims.empty() || arg.dims[0] != p.devices->size()) continue;  // (Allocate says why)
    host_data_puts[p.slot] = MakePuts(p.devices, ShardBytes(arg.dtype, arg.dims), first + p.slot, arg.host_data);
  }
  std::vector<wire::ArgBinding> bindings;  // in place (sequential: every run needs them)
  std::vector<std::shared_ptr<ShardedBuffer>> arg_buffers;  // every run holds them until sent
  const auto& types = program.slot_types();
  std::shared_ptr<Plan> plan;  // its steps never change once made
  // Under mu_: the run's buffers, and the run sent or queued (sequential:
  // its arguments' run). Returns at once on an error.
  auto dispatch = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::Status {
    run = std::make_shared<Run>(this, plan, program.ir_ptr(), options.client);
    run->first = first;  // its slots' buffer ids count from it
    std::vector<wire::ArgBinding> copies;
    std::vector<int> hosts = plan->hosts;
    for (const ArgPlacement& p : program.arg_placements()) {
      const ProgramArg& arg = args[p.arg];
      if (arg.buffer == nullptr) {
        PW_RETURN_IF_ERROR(allocate(p.slot, arg.dtype, arg.dims, p.devices));
        SendPutsLocked(p.devices, std::move(host_data_puts[p.slot]), /*flush=*/false);  // leaves with the run
        continue;
      }
      if (!arg.buffer->is_remote()) {
        return absl::InvalidArgumentError(absl::StrCat("argument ", p.arg, " of program '", program.ir().name(),
                                                       "' is not a buffer of this cluster's hosts"));
      }
      arg_buffers.push_back(arg.buffer);
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
    if (!sequential) {
      for (const LoweredStep& step : program.steps()) {
        for (int s : step.out_slots) PW_RETURN_IF_ERROR(allocate(s, types[s].dtype, types[s].dims, step.devices));
        if (step.kind == LoweredStep::Kind::kTransfer) run->copies[first + step.out_slots[0]] = step.link;
      }
      for (int h : hosts) {
        // A host that only sends an argument.
        if (plan->loaded.insert(h).second) LoadOn(h, program.id(), program, nullptr, *plan);
      }
      bindings.insert(bindings.end(), copies.begin(), copies.end());
      run->args = std::move(arg_buffers);
      SubmitRun(std::move(hosts), program.id(), first, std::move(bindings), std::move(run), plan->cost_ns,
                plan->islands);
      return absl::OkStatus();
    }
    // Sequential (Figure 4a): the client sends a step only once its inputs are
    // ready, paying a round trip per node. Each step is a program of its own
    // on its hosts, loaded the first time.
    if (plan->sequential_base == 0) {
      plan->sequential_base = next_sequential_id_;
      next_sequential_id_ += program.steps().size() + 1;
      for (size_t k = 0; k < program.steps().size(); ++k) {
        for (int h : plan->step_hosts[k]) LoadOn(h, plan->sequential_base + k, program, &plan->step_wire[k], *plan);
      }
    }
    const uint64_t args_id = plan->sequential_base + program.steps().size();
    if (!copies.empty()) {
      for (int h : hosts) {
        if (plan->args_loaded.insert(h).second) LoadOn(h, args_id, program, nullptr, *plan);
      }
      std::vector<int> islands;
      for (const ArgPlacement& p : program.arg_placements()) {
        for (const Device* d : p.devices->devices()) islands.push_back(d->island()->id());
      }
      std::sort(islands.begin(), islands.end());
      islands.erase(std::unique(islands.begin(), islands.end()), islands.end());
      run->args = arg_buffers;
      SubmitRun(hosts, args_id, first, copies, run, 0, std::move(islands));
    } else {
      Run::Finish(*run);  // puts are ready once sent
    }
    return absl::OkStatus();
  };
  absl::Status dispatched;
  bool loaded = false;
  {
    MutexLock lock(&mu_);
    plan = PlanFor(program);
    // Usually so: one lock per dispatch, no wait.
    loaded = plan->loads_ok.load(std::memory_order_acquire);
    if (loaded) dispatched = dispatch();
  }
  if (!loaded) {
    // The program's first dispatch (or one after new loads): the hosts'
    // answers to its loads first, so that a refused load fails this call
    // with the host's error rather than a run that can never complete.
    PW_RETURN_IF_ERROR(AwaitLoads(*plan));
    MutexLock lock(&mu_);
    dispatched = dispatch();
  }
  PW_RETURN_IF_ERROR(dispatched);
  if (!sequential) return absl::OkStatus();
  // Each step waits for its inputs unlocked: other dispatches go on
  // meanwhile (the order hosts see is that of the sends, each under mu_).
  for (size_t k = 0; k < program.steps().size(); ++k) {
    const LoweredStep& step = program.steps()[k];
    if (step.kind == LoweredStep::Kind::kCompute) {
      for (int s : step.in_slots) slots[s]->Await().IgnoreError();  // errors flow to the outputs
    }
    PW_RETURN_IF_ERROR(AwaitLoads(*plan));  // the steps' own programs, the first time
    run = std::make_shared<Run>(this, plan, program.ir_ptr(), options.client, static_cast<int>(k));
    run->first = first;
    for (int s : step.out_slots) PW_RETURN_IF_ERROR(allocate(s, types[s].dtype, types[s].dims, step.devices));
    if (step.kind == LoweredStep::Kind::kTransfer) run->copies[first + step.out_slots[0]] = step.link;
    // The step reads earlier steps' outputs too: held until it is sent, as
    // the arguments are, since it may wait for admission after this call
    // has returned and dropped them.
    run->args = arg_buffers;
    for (int s : step.in_slots) run->args.push_back(slots[s]);
    MutexLock lock(&mu_);
    SubmitRun(plan->step_hosts[k], plan->sequential_base + k, first, bindings, std::move(run), plan->step_cost_ns[k],
              plan->step_islands[k]);
  }
  return absl::OkStatus();
}

absl::Status RemoteCluster::Write(const ShardedBuffer& buffer, const void* data) {
  std::vector<HostPuts> puts = MakePuts(buffer.devices(), buffer.shard_bytes(), buffer.remote_id(), data);
  MutexLock lock(&mu_);
  SendPutsLocked(buffer.devices(), std::move(puts), /*flush=*/true);
  return absl::OkStatus();
}

std::vector<RemoteCluster::HostPuts> RemoteCluster::MakePuts(const DeviceList* list, int64_t shard, uint64_t id,
                                                             const void* data) const {
  std::vector<HostPuts> puts;
  const auto* from = static_cast<const uint8_t*>(data);
  for (int h : HostsOf(list)) {
    HostPuts& host = puts.emplace_back();
    host.host = h;
    const std::vector<int> positions = PositionsOn(list, h);
    const int64_t total = shard * static_cast<int64_t>(positions.size());
    // In chunks, in order; an empty buffer still gets its one (empty) put.
    for (int64_t offset = 0; offset == 0 || offset < total; offset += kDataChunkBytes) {
      const int64_t n = std::min(kDataChunkBytes, total - offset);
      wire::PutBuffer* put = host.requests.emplace_back().mutable_put();
      put->set_buffer_id(id);
      put->set_devices(list->id());
      put->set_shard_bytes(shard);
      put->set_offset(offset);
      std::string* bytes = put->mutable_data();
      bytes->resize(static_cast<size_t>(n));
      ForEachPiece(positions, shard, offset, n, [&](int position, int64_t in_shard, int64_t at, int64_t len) {
        std::memcpy(bytes->data() + at, from + position * shard + in_shard, static_cast<size_t>(len));
      });
    }
  }
  return puts;
}

void RemoteCluster::SendPutsLocked(const DeviceList* list, std::vector<HostPuts> puts, bool flush) {
  for (HostPuts& host : puts) {
    EnsureList(host.host, list);
    for (wire::Request& request : host.requests) Send(host.host, std::move(request));
    if (flush) Flush(host.host);
  }
}

absl::Status RemoteCluster::Read(const ShardedBuffer& buffer, void* dst) {
  // A service's tenant fetches from the hosts directly, while the run that
  // makes the buffer goes through the service: the fetch could overtake it,
  // so it waits for the run's reply (the hosts have the buffer then). A put
  // buffer is done once sent, and its fetch follows it on the same session.
  if (links_->admits_runs()) PW_RETURN_IF_ERROR(buffer.Await());
  const DeviceList* list = buffer.devices();
  const std::vector<int> hosts = HostsOf(list);
  const int64_t shard = buffer.shard_bytes();
  auto* to = static_cast<uint8_t*>(dst);
  // The hosts' chunks are asked for a few at a time per host (a window), so
  // neither a host nor this process queues a whole large buffer's replies
  // at once; each reply lands in place.
  struct Chunk {
    int host;
    const std::vector<int>* positions;
    int64_t offset, bytes;
  };
  std::vector<std::vector<int>> positions(hosts.size());
  std::vector<std::deque<Chunk>> chunks(hosts.size());  // per host, in order
  size_t num_chunks = 0;
  for (size_t k = 0; k < hosts.size(); ++k) {
    positions[k] = PositionsOn(list, hosts[k]);
    const int64_t total = shard * static_cast<int64_t>(positions[k].size());
    for (int64_t offset = 0; offset == 0 || offset < total; offset += kDataChunkBytes) {
      chunks[k].push_back(Chunk{hosts[k], &positions[k], offset, std::min(kDataChunkBytes, total - offset)});
      ++num_chunks;
    }
  }
  // Shared with the callbacks: the last one may still hold its lock as
  // this call returns. Each callback is done with `to` and the chunk before
  // it counts itself done, and this call waits for every one of them.
  struct Window {
    Mutex mu;
    CondVar cv;
    std::vector<int> in_flight ABSL_GUARDED_BY(mu);  // per host
    size_t done ABSL_GUARDED_BY(mu) = 0;
    absl::Status first_error ABSL_GUARDED_BY(mu);
  };
  auto window = std::make_shared<Window>();
  {
    MutexLock lock(&window->mu);
    window->in_flight.assign(hosts.size(), 0);
  }
  size_t sent = 0;
  while (true) {
    std::vector<size_t> ready;  // hosts with room in their window and chunks left
    {
      MutexLock lock(&window->mu);
      while (true) {
        // A failed chunk ends the read: the rest are not asked for.
        if (window->done == sent && (sent == num_chunks || !window->first_error.ok())) return window->first_error;
        ready.clear();
        if (window->first_error.ok()) {
          for (size_t k = 0; k < hosts.size(); ++k) {
            if (!chunks[k].empty() && window->in_flight[k] < kReadChunksPerHost) ready.push_back(k);
          }
        }
        if (!ready.empty()) break;
        // A lost host fails its fetches (HostChannel), so this wait ends.
        window->cv.Wait(&window->mu);
      }
      for (size_t k : ready) ++window->in_flight[k];
    }
    for (size_t k : ready) {
      const Chunk c = chunks[k].front();
      chunks[k].pop_front();
      ++sent;
      wire::Request request;
      wire::FetchBuffer* fetch = request.mutable_fetch();
      fetch->set_buffer_id(buffer.remote_id());
      fetch->set_offset(c.offset);
      fetch->set_max_bytes(std::max<int64_t>(c.bytes, 1));  // 0 would mean "to the end"
      Send(c.host, std::move(request),
           [window, k, c, shard, to, id = buffer.remote_id()](absl::StatusOr<wire::Reply> reply) {
             absl::Status status = reply.ok() ? ReplyStatus(*reply) : reply.status();
             if (status.ok()) {
               const std::string& bytes = reply->fetch().data();
               if (static_cast<int64_t>(bytes.size()) != c.bytes) {
                 status = absl::InternalError(absl::StrCat("host ", c.host, " sent ", bytes.size(), " bytes of buffer ",
                                                           id, " at offset ", c.offset, ", expected ", c.bytes));
               } else {
                 ForEachPiece(*c.positions, shard, c.offset, c.bytes,
                              [&](int position, int64_t in_shard, int64_t at, int64_t len) {
                                std::memcpy(to + position * shard + in_shard, bytes.data() + at,
                                            static_cast<size_t>(len));
                              });
               }
             }
             MutexLock lock(&window->mu);
             if (window->first_error.ok() && !status.ok()) window->first_error = std::move(status);
             --window->in_flight[k];
             ++window->done;
             window->cv.SignalAll();
           });
      Flush(c.host);
    }
  }
}

absl::Status RemoteCluster::ReplaceHost(int host, const std::string& address) {
  auto* sessions = dynamic_cast<HostSessions*>(links_.get());
  if (sessions == nullptr || links_->admits_runs()) {
    return absl::FailedPreconditionError(
        "a service's tenant cannot replace a host (the hosts are the service's)");
  }
  MutexLock lock(&mu_);
  // Renewals asked for before go now, to the sets without a lost host (a
  // set with one is renewed by the replacement itself).
  SendRenewalsLocked();
  // Ids are taken without mu_ (NewBufferId): one taken before this load
  // and used after is below it, and the new process answers for it as
  // lost, never as another buffer.
  const uint64_t first = next_buffer_id_.load(std::memory_order_relaxed);
  PW_RETURN_IF_ERROR(sessions->ReplaceHost(host, address, first, kJoinTimeoutNs));
  // The new process knows no list, function or program of the old one's.
  known_[host] = HostState{};
  std::vector<wire::Request> unloads(known_.size());
  for (auto it = plans_.begin(); it != plans_.end();) {
    const Plan& plan = *it->second;
    const bool on_host = plan.loaded.contains(host) || plan.args_loaded.contains(host) ||
                         std::any_of(plan.step_hosts.begin(), plan.step_hosts.end(), [host](const std::vector<int>& s) {
                           return std::find(s.begin(), s.end(), host) != s.end();
                         });
    if (!on_host) {
      ++it;
      continue;
    }
    // Planned anew at its next dispatch (runs in flight keep this plan):
    // the other hosts unload it first, as ReclaimLocked would.
    AddUnloads(it->first, plan, unloads);
    plans_.erase(it++);
  }
  for (size_t h = 0; h < unloads.size(); ++h) {
    if (static_cast<int>(h) == host || !unloads[h].has_unload()) continue;
    Send(static_cast<int>(h), std::move(unloads[h]));
    Flush(static_cast<int>(h));
  }
  {
    MutexLock frees(&frees_mu_);
    pending_frees_[host].clear();  // the old process's buffers
  }
  for (Device* d : cluster_->hosts()[host]->devices()) d->Revive(first);
  return absl::OkStatus();
}

void RemoteCluster::FailDevices(absl::Span<Device* const> devices) {
  absl::flat_hash_map<int, wire::FailDevices> by_host;
  for (const Device* d : devices) by_host[d->host()->id()].add_device_ids(d->id());
  auto replies = std::make_shared<HostReplies>(static_cast<int>(by_host.size()));
  for (auto& [host, request] : by_host) {
    wire::Request r;
    *r.mutable_fail_devices() = std::move(request);
    // A lost host's devices are gone anyway: its error is not the caller's.
    Send(host, std::move(r), [replies](absl::StatusOr<wire::Reply>) { replies->Done(absl::OkStatus()); });
    Flush(host);
  }
  (void)replies->Wait(kFailTimeoutNs, "failing devices");
}

absl::Status RemoteCluster::SaveShards(int host, wire::SaveShards request) {
  if (links_->admits_runs()) {
    return absl::PermissionDeniedError(
        "a service's tenant cannot have the hosts write a checkpoint (the hosts are the service's)");
  }
  if (host < 0 || host >= links_->num_hosts()) {
    return absl::InvalidArgumentError(absl::StrCat("save_shards: no host ", host));
  }
  constexpr int64_t kDayNs = int64_t{86400} * 1'000'000'000;  // a write takes what it takes; a lost host fails it
  auto replies = std::make_shared<HostReplies>(1);
  wire::Request r;
  *r.mutable_save_shards() = std::move(request);
  Send(host, std::move(r), [replies](absl::StatusOr<wire::Reply> reply) {
    replies->Done(reply.ok() ? ReplyStatus(*reply) : reply.status());
  });
  Flush(host);
  return replies->Wait(kDayNs, "writing a checkpoint");
}

absl::Status RemoteCluster::LoadShards(const std::string& database,
                                       absl::Span<const std::shared_ptr<ShardedBuffer>> buffers,
                                       absl::Span<const std::string> specs) {
  if (links_->admits_runs()) {
    return absl::PermissionDeniedError(
        "a service's tenant cannot have the hosts read a checkpoint (the hosts are the service's)");
  }
  if (specs.size() != buffers.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("load_shards: ", buffers.size(), " buffers and ", specs.size(), " specs"));
  }
  for (const auto& b : buffers) {
    if (b == nullptr || b->remote_id() == 0 || b->IsDone()) {
      return absl::InvalidArgumentError("load_shards: a buffer that is not a fresh (pending) buffer of the hosts");
    }
  }
  // A buffer is done once each of its hosts has answered (the first error
  // wins); the replies come on gRPC threads.
  struct Loading {
    std::vector<std::shared_ptr<ShardedBuffer>> buffers;
    Mutex mu;
    std::vector<int> left ABSL_GUARDED_BY(mu);
    std::vector<absl::Status> status ABSL_GUARDED_BY(mu);
  };
  auto loading = std::make_shared<Loading>();
  loading->buffers.assign(buffers.begin(), buffers.end());
  struct HostLoad {
    wire::Request request;
    std::vector<int> indices;  // of its buffers in `buffers`
  };
  std::map<int, HostLoad> by_host;  // in host order
  {
    MutexLock lock(&loading->mu);
    loading->left.assign(buffers.size(), 0);
    loading->status.assign(buffers.size(), absl::OkStatus());
    for (size_t i = 0; i < buffers.size(); ++i) {
      const ShardedBuffer& b = *buffers[i];
      for (int h : HostsOf(b.devices())) {
        HostLoad& load = by_host[h];
        wire::LoadShards* request = load.request.mutable_load_shards();
        request->set_database(database);
        wire::ShardsToLoad* s = request->add_buffers();
        s->set_buffer_id(b.remote_id());
        s->set_devices(b.devices()->id());
        s->set_shard_bytes(b.shard_bytes());
        s->set_spec_json(specs[i]);
        load.indices.push_back(static_cast<int>(i));
        ++loading->left[i];
      }
    }
  }
  // In the one order of sends (mu_), after the lists each host needs: the
  // runs dispatched after this call reach every host after their buffers.
  MutexLock lock(&mu_);
  for (auto& [h, load] : by_host) {
    for (int i : load.indices) EnsureList(h, buffers[i]->devices());
    Send(h, std::move(load.request), [loading, indices = std::move(load.indices)](absl::StatusOr<wire::Reply> reply) {
      const absl::Status status = reply.ok() ? ReplyStatus(*reply) : reply.status();
      std::vector<std::pair<int, absl::Status>> done;
      {
        MutexLock held(&loading->mu);
        for (int i : indices) {
          if (!status.ok() && loading->status[i].ok()) loading->status[i] = status;
          if (--loading->left[i] == 0) done.emplace_back(i, loading->status[i]);
        }
      }
      ReadyList none;  // nothing in this process waits on a remote buffer's list
      for (auto& [i, s] : done) {
        std::shared_ptr<ShardedBuffer> buffer = std::move(loading->buffers[i]);
        if (s.ok()) {
          buffer->SetReady(&none);
        } else {
          buffer->SetError(std::move(s), &none);
        }
      }
    });
    Flush(h);
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
