#include "csrc/service/service.h"

#include <unistd.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "csrc/base/spin.h"
#include "csrc/coordination/auth.h"
#include "csrc/base/status_macros.h"
#include "csrc/coordination/protocol_version.h"

namespace pw {
namespace {

constexpr int64_t kJoinTimeoutNs = int64_t{60} * 1'000'000'000;
constexpr int64_t kHeartbeatTimeoutNs = int64_t{3} * 1'000'000'000;

wire::Reply ErrorReply(uint64_t id, const absl::Status& status) {
  wire::Reply reply;
  reply.set_id(id);
  ToWire(status, reply.mutable_status());
  return reply;
}

// What a tenant may ask of a host, through the service. The rest (Hello,
// JoinCluster, the rendezvous store, RegisterHost, PeersLost, EndSession,
// fault injection) is the owner's, which is the service.
bool TenantMayForward(const wire::Request& request) {
  switch (request.kind_case()) {
    case wire::Request::kEcho:
    case wire::Request::kDefineDevices:
    case wire::Request::kLoadFunction:
    case wire::Request::kLoadProgram:
    case wire::Request::kPut:
    case wire::Request::kRun:
    case wire::Request::kFetch:
    case wire::Request::kFree:
    case wire::Request::kDescribeQueues:
    case wire::Request::kCancelRun:
    case wire::Request::kCancelRuns:
    case wire::Request::kRenewGroup:
    case wire::Request::kUnload:
      return true;
    default:
      return false;
  }
}

}  // namespace

struct Service::Tenant {
  uint64_t id = 0;  // its session id on the hosts
  std::string name;
  int priority = 0;
  std::shared_ptr<HostSession> session;
  bool ended = false;
  // Once it has gone (stats_mu_): hosts yet to drop its session, and how
  // long they all took (-1 until then).
  int64_t ended_ns = 0;
  int hosts_to_free = 0;
  double freed_after_s = -1;
  // Forwards since its last Commit (each with its id: the reply's).
  std::vector<wire::Request> open;
  absl::node_hash_map<uint64_t, Flow> flows;  // stable addresses (FairQueue keys)
  int64_t next_seq = 0;
  std::set<int64_t> queued_runs;                // seqs of its runs waiting for admission
  std::deque<std::unique_ptr<Unit>> held;       // pass-through units behind them
  absl::flat_hash_set<uint64_t> unsent_buffers;  // made by its queued runs
  // Accounting (stats_mu_): per host, a device list's devices there, and a
  // program's steps' devices there (0: a transfer).
  std::vector<absl::flat_hash_map<int, int>> list_devices;
  std::vector<absl::flat_hash_map<uint64_t, std::vector<int>>> step_devices;
};

struct Service::Unit {
  std::shared_ptr<Tenant> tenant;
  std::vector<wire::Request> forwards;
  bool run = false;
  wire::RunAdmission admission;
  Flow* flow = nullptr;
  int64_t seq = 0;
};

struct Service::InFlight {
  std::atomic<int> pending{0};
  std::vector<int> islands;  // whose windows it counts in (empty: none)
  Flow* flow = nullptr;
  std::shared_ptr<Tenant> tenant;  // keeps the flow alive
  int gangs = 0;
};

absl::StatusOr<std::unique_ptr<Service>> Service::Start(const TopologyOptions& topology,
                                                        const std::vector<std::string>& host_addresses,
                                                        const std::string& host_secret, ServiceConfig config) {
  if (config.secret.empty()) return absl::InvalidArgumentError("the service needs a secret for its tenants");
  if (config.secret == host_secret) {
    return absl::InvalidArgumentError("the tenants' secret must not be the hosts' (tenants never own the hosts)");
  }
  auto service = std::unique_ptr<Service>(new Service());
  PW_ASSIGN_OR_RETURN(service->cluster_, Cluster::Create(topology));
  service->topology_ = topology.ToString();
  ChannelOptions options;
  options.secret = host_secret;
  options.client_name = "pathways-server";
  options.heartbeat_timeout_ns = kHeartbeatTimeoutNs;
  const Cluster* cluster = service->cluster_.get();
  PW_ASSIGN_OR_RETURN(service->hosts_,
                      HostSessions::Connect(*cluster, host_addresses, options, [cluster](int host, const absl::Status& why) {
                        for (Device* d : cluster->devices()) {
                          if (d->host()->id() == host) d->MarkFailed(why);
                        }
                      }));
  PW_RETURN_IF_ERROR(service->hosts_->Join(host_addresses, kJoinTimeoutNs));
  {
    MutexLock lock(&service->mu_);
    service->policy_ = config.policy;
    service->admitted_.assign(cluster->islands().size(), 0);
  }
  service->admission_thread_ = std::thread([s = service.get()] { s->AdmissionLoop(); });
  PW_ASSIGN_OR_RETURN(service->server_, HostServer::Start(config.listen_address, config.secret, service.get()));
  return service;
}

Service::~Service() {
  server_.reset();  // no tenant from now on
  {
    MutexLock lock(&done_mu_);
    stopping_ = true;
    done_cv_.SignalAll();
  }
  if (admission_thread_.joinable()) admission_thread_.join();
  hosts_.reset();
}

int Service::num_tenants() const {
  MutexLock lock(&mu_);
  return static_cast<int>(tenants_.size());
}

int64_t Service::queued_runs() const {
  MutexLock lock(&mu_);
  return queue_.size();
}

void Service::SetPolicy(SchedulingPolicy policy) {
  MutexLock lock(&mu_);
  policy_ = policy;
  AdmitLocked();
}

wire::ServiceReport Service::Report() const {
  wire::ServiceReport report;
  MutexLock lock(&mu_);
  report.set_policy(std::string(SchedulingPolicyName(policy_)));
  auto add = [&](const Tenant& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<const Flow*> flows;
    for (const auto& [id, flow] : t.flows) flows.push_back(&flow);
    std::sort(flows.begin(), flows.end(), [](const Flow* a, const Flow* b) { return a->id < b->id; });
    MutexLock stats(&stats_mu_);
    for (const Flow* f : flows) {
      wire::FlowStats* s = report.add_flows();
      s->set_tenant(t.id);
      s->set_tenant_name(t.name);
      s->set_name(f->name);
      s->set_weight(f->weight_);
      s->set_priority(f->priority_);
      s->set_device_seconds(static_cast<double>(f->device_ns) * 1e-9);
      s->set_gangs(f->gangs);
      s->set_queued(f->queued);
      s->set_ended(t.ended);
      s->set_freed(t.freed_after_s >= 0);
      s->set_freed_after_seconds(t.freed_after_s);
    }
  };
  for (const auto& t : ended_) add(*t);
  std::vector<const Tenant*> live;
  for (const auto& [id, t] : tenants_) live.push_back(t.get());
  std::sort(live.begin(), live.end(), [](const Tenant* a, const Tenant* b) { return a->id < b->id; });
  for (const Tenant* t : live) add(*t);
  return report;
}

wire::Reply Service::Hello(const std::shared_ptr<HostSession>& session, const wire::Hello& hello) {
  wire::Reply reply;
  const std::string who = absl::StrCat("the client '", hello.client_name(), "'");
  if (absl::Status versions = CheckPeerVersions(who, hello.protocol_version(), hello.op_registry_version());
      !versions.ok()) {
    return ErrorReply(0, versions);
  }
  if (!hello.tenant()) {
    return ErrorReply(0, absl::FailedPreconditionError(
                             "this is a pathways service, not a host: connect to it with "
                             "pw.configure(server=...) (a tenant's Hello)"));
  }
  wire::HelloReply* out = reply.mutable_hello();
  out->set_protocol_version(kControlProtocolVersion);
  out->set_op_registry_version(kOpRegistryVersion);
  out->set_pid(getpid());
  out->set_boot_id(KernelBootId());
  auto tenant = std::make_shared<Tenant>();
  tenant->name = hello.client_name();
  tenant->priority = hello.priority();
  tenant->session = session;
  const int n = hosts_->num_hosts();
  tenant->list_devices.resize(n);
  tenant->step_devices.resize(n);
  wire::TenantInfo* info = out->mutable_tenant();
  MutexLock lock(&mu_);
  if (tenants_.contains(session->id())) {
    return ErrorReply(0, absl::FailedPreconditionError("this session said Hello already"));
  }
  absl::StatusOr<std::string> key = RandomBytes(kPeerKeyBytes);
  if (!key.ok()) return ErrorReply(0, key.status());
  tenant->id = next_tenant_++;
  tenants_[session->id()] = tenant;
  info->set_host_key(*std::move(key));
  ++priorities_[tenant->priority];
  info->set_session(tenant->id);
  info->set_topology(topology_);
  info->set_policy(std::string(SchedulingPolicyName(policy_)));
  for (const RemoteHostInfo& h : hosts_->hosts()) {
    info->add_host_addresses(h.address);
    info->add_host_pids(h.pid);
    info->add_host_incarnations(h.incarnation);
    info->add_host_islands(h.island);
    info->add_host_boot_ids(hosts_->channel(h.id).hello_reply().boot_id());
  }
  return reply;
}

void Service::Handle(const std::shared_ptr<HostSession>& session, wire::Request request) {
  const uint64_t id = request.id();
  if (request.kind_case() == wire::Request::kHello) {
    wire::Reply reply = Hello(session, request.hello());
    reply.set_id(id);
    if (reply.has_status() || !reply.hello().has_tenant()) {
      session->Reply(std::move(reply));
      return;
    }
    // The tenant may open sessions of its own with the hosts for its bulk
    // data, with a key of its own: every host has it before the answer.
    const uint64_t tenant = reply.hello().tenant().session();
    auto left = std::make_shared<std::atomic<int>>(hosts_->num_hosts());
    auto answer = std::make_shared<wire::Reply>(std::move(reply));
    for (int h = 0; h < hosts_->num_hosts(); ++h) {
      wire::Request key;
      key.set_session(tenant);
      key.mutable_tenant_key()->set_key(answer->hello().tenant().host_key());
      // A host that refuses (or is lost) leaves the tenant to send its data
      // to it through the service (service_link.h).
      hosts_->Send(h, std::move(key), [left, answer, session](absl::StatusOr<wire::Reply>) {
        if (left->fetch_sub(1, std::memory_order_acq_rel) == 1) session->Reply(std::move(*answer));
      });
      hosts_->Flush(h);
    }
    return;
  }
  std::shared_ptr<Tenant> tenant;
  {
    MutexLock lock(&mu_);
    auto it = tenants_.find(session->id());
    if (it != tenants_.end()) tenant = it->second;
  }
  if (tenant == nullptr) {
    if (id != 0) session->Reply(ErrorReply(id, absl::FailedPreconditionError("say Hello first, as a tenant")));
    return;
  }
  switch (request.kind_case()) {
    case wire::Request::kForward: {
      const wire::Forward& f = request.forward();
      absl::Status refused;
      if (f.host() < 0 || f.host() >= hosts_->num_hosts()) {
        refused = absl::InvalidArgumentError(
            absl::StrCat("forward to host ", f.host(), ": the cluster has hosts 0 to ", hosts_->num_hosts() - 1));
      } else if (!TenantMayForward(f.request())) {
        refused = absl::PermissionDeniedError(absl::StrCat(
            "a tenant may not send a host this request (kind ", static_cast<int>(f.request().kind_case()),
            "): the hosts are the service's"));
      }
      if (!refused.ok()) {
        if (id != 0) session->Reply(ErrorReply(id, refused));
        return;
      }
      MutexLock lock(&mu_);
      if (tenant->open.size() >= kMaxOpenForwards) {
        // A unit never committed would hold the service's memory.
        if (id != 0) {
          session->Reply(ErrorReply(id, absl::ResourceExhaustedError(absl::StrCat(
                                            "a unit may hold at most ", kMaxOpenForwards, " requests: commit it"))));
        }
        return;
      }
      tenant->open.push_back(std::move(request));
      return;
    }
    case wire::Request::kCommit:
      Commit(tenant, request.commit());
      return;
    case wire::Request::kServiceControl:
      Control(session, request);
      return;
    case wire::Request::kEcho: {
      wire::Reply reply;
      reply.set_id(id);
      *reply.mutable_echo() = request.echo();
      session->Reply(std::move(reply));
      return;
    }
    default:
      if (id != 0) {
        session->Reply(ErrorReply(id, absl::InvalidArgumentError(absl::StrCat(
                                          "the service takes Forward, Commit and ServiceControl requests, not kind ",
                                          static_cast<int>(request.kind_case())))));
      }
  }
}

void Service::Control(const std::shared_ptr<HostSession>& session, const wire::Request& request) {
  const wire::ServiceControl& c = request.service_control();
  wire::Reply reply;
  reply.set_id(request.id());
  if (!c.set_policy().empty()) {
    absl::StatusOr<SchedulingPolicy> policy = ParseSchedulingPolicy(c.set_policy());
    if (!policy.ok()) {
      ToWire(policy.status(), reply.mutable_status());
    } else {
      SetPolicy(*policy);
    }
  }
  if (c.stats()) *reply.mutable_service() = Report();
  if (request.id() != 0) session->Reply(std::move(reply));
}

Service::Flow* Service::FlowOf(Tenant& tenant, const wire::RunAdmission& run) {
  Flow& flow = tenant.flows[run.flow()];
  if (flow.tenant == nullptr) {
    flow.tenant = &tenant;
    flow.id = run.flow();
    // Flow 0 is the tenant's work outside any pw.Client: named after it.
    flow.name = run.flow() == 0 || run.flow_name().empty() ? tenant.name : run.flow_name();
    // A weight out of range (a client of another build) counts as 1.
    flow.weight_ = run.weight() > 0 && run.weight() <= 1e9 ? run.weight() : 1.0;
    flow.priority_ = tenant.priority;
  }
  return &flow;
}

void Service::Commit(const std::shared_ptr<Tenant>& tenant, const wire::Commit& commit) {
  MutexLock lock(&mu_);
  if (tenant->ended) return;
  auto unit = std::make_unique<Unit>();
  unit->tenant = tenant;
  unit->forwards.swap(tenant->open);
  unit->seq = tenant->next_seq++;
  unit->run = commit.has_run();
  if (!unit->run) {
    // A run outside a run unit would skip admission: refused.
    std::vector<wire::Request> kept;
    for (wire::Request& r : unit->forwards) {
      if (r.forward().request().kind_case() != wire::Request::kRun) {
        kept.push_back(std::move(r));
      } else if (r.id() != 0) {
        tenant->session->Reply(ErrorReply(
            r.id(), absl::PermissionDeniedError("a run must come in a run unit (Commit with a run), to be admitted")));
      }
    }
    unit->forwards.swap(kept);
    if (unit->forwards.empty()) return;
    // A cancel (a client closed, the runtime shutting down) drops the runs
    // it names that still wait here, and goes at once: it must not wait
    // behind the very runs it cancels.
    bool cancels = false;
    for (const wire::Request& r : unit->forwards) {
      if (r.forward().request().kind_case() == wire::Request::kCancelRuns) {
        DropQueuedLocked(*tenant, r.forward().request().cancel_runs());
        cancels = true;
      }
    }
    if (cancels || tenant->queued_runs.empty()) {
      SendUnitLocked(*unit);
    } else {
      tenant->held.push_back(std::move(unit));
    }
    return;
  }
  unit->admission = commit.run();
  unit->flow = FlowOf(*tenant, unit->admission);
  tenant->queued_runs.insert(unit->seq);
  for (uint64_t b : unit->admission.made_buffer_ids()) tenant->unsent_buffers.insert(b);
  ++unit->flow->queued;
  Flow* flow = unit->flow;
  queue_.Push(flow, std::move(unit));
  AdmitLocked();
}

void Service::DropQueuedLocked(Tenant& tenant, const wire::CancelRuns& cancel) {
  absl::flat_hash_set<std::pair<uint64_t, uint64_t>> named;
  for (int i = 0; i < cancel.program_ids_size() && i < cancel.first_buffer_ids_size(); ++i) {
    named.insert({cancel.program_ids(i), cancel.first_buffer_ids(i)});
  }
  const absl::Status why = absl::CancelledError(absl::StrCat("cancelled before it ran: ", cancel.reason()));
  for (auto& [id, flow] : tenant.flows) {
    std::vector<std::unique_ptr<Unit>> units = queue_.Take(&flow);
    for (std::unique_ptr<Unit>& unit : units) {
      bool drop = cancel.all();
      for (const wire::Request& r : unit->forwards) {
        const wire::Request& inner = r.forward().request();
        if (inner.kind_case() == wire::Request::kRun &&
            named.contains({inner.run().program_id(), inner.run().first_buffer_id()})) {
          drop = true;
        }
      }
      if (!drop) {
        queue_.Push(&flow, std::move(unit));  // its flow's order kept
        continue;
      }
      --flow.queued;
      tenant.queued_runs.erase(unit->seq);
      for (uint64_t b : unit->admission.made_buffer_ids()) tenant.unsent_buffers.erase(b);
      // Its parts are answered as the hosts answer a cancelled run.
      for (const wire::Request& r : unit->forwards) {
        if (r.id() != 0 && r.forward().request().kind_case() == wire::Request::kRun) {
          tenant.session->Reply(ErrorReply(r.id(), why));
        }
      }
    }
  }
  ReleaseHeldLocked(tenant);
}

void Service::AdmitLocked() {
  const bool fair = policy_ == SchedulingPolicy::kProportionalShare;
  while (!queue_.empty()) {
    auto admissible = [&](const std::unique_ptr<Unit>& u) {
      mu_.AssertHeld();
      const Tenant& t = *u->tenant;
      // After the tenant's pass-through units committed before it.
      if (!t.held.empty() && t.held.front()->seq < u->seq) return false;
      // After the runs that make its arguments.
      for (uint64_t b : u->admission.used_buffer_ids()) {
        if (t.unsent_buffers.contains(b)) return false;
      }
      // While a tenant of higher priority is connected, lower ones keep
      // at most kYieldWindow runs on an island: its next run waits for
      // little, even when it comes after their queue was admitted.
      const int window = !priorities_.empty() && priorities_.rbegin()->first > t.priority ? kYieldWindow
                                                                                            : kServiceWindow;
      for (int i : u->admission.islands()) {
        if (i >= 0 && i < static_cast<int>(admitted_.size()) && admitted_[i] >= window) return false;
      }
      return true;
    };
    auto cost = [](const std::unique_ptr<Unit>& u) { return u->admission.cost_ns(); };
    std::optional<std::unique_ptr<Unit>> next = queue_.Pop(fair, admissible, cost);
    if (!next.has_value()) return;
    std::unique_ptr<Unit> unit = *std::move(next);
    Tenant& t = *unit->tenant;
    --unit->flow->queued;
    t.queued_runs.erase(unit->seq);
    for (uint64_t b : unit->admission.made_buffer_ids()) t.unsent_buffers.erase(b);
    for (int i : unit->admission.islands()) {
      if (i >= 0 && i < static_cast<int>(admitted_.size())) ++admitted_[i];
    }
    SendUnitLocked(*unit);
    ReleaseHeldLocked(t);
  }
}

void Service::ReleaseHeldLocked(Tenant& tenant) {
  while (!tenant.held.empty() &&
         (tenant.queued_runs.empty() || *tenant.queued_runs.begin() > tenant.held.front()->seq)) {
    std::unique_ptr<Unit> unit = std::move(tenant.held.front());
    tenant.held.pop_front();
    SendUnitLocked(*unit);
  }
}

void Service::NoteLoad(Tenant& tenant, int host, const wire::Request& request) {
  switch (request.kind_case()) {
    case wire::Request::kDefineDevices: {
      int here = 0;
      for (int d : request.define_devices().device_ids()) {
        if (d >= 0 && d < static_cast<int>(cluster_->devices().size()) && cluster_->devices()[d]->host()->id() == host) {
          ++here;
        }
      }
      MutexLock lock(&stats_mu_);
      tenant.list_devices[host][request.define_devices().list_id()] = here;
      return;
    }
    case wire::Request::kLoadProgram: {
      MutexLock lock(&stats_mu_);
      std::vector<int>& steps = tenant.step_devices[host][request.load_program().program_id()];
      steps.clear();
      for (const wire::ProgramStep& step : request.load_program().steps()) {
        int devices = 0;
        if (step.has_compute()) {
          auto it = tenant.list_devices[host].find(step.compute().devices());
          if (it != tenant.list_devices[host].end()) devices = it->second;
        }
        steps.push_back(devices);
      }
      return;
    }
    case wire::Request::kUnload: {
      MutexLock lock(&stats_mu_);
      for (uint64_t p : request.unload().program_ids()) tenant.step_devices[host].erase(p);
      return;
    }
    default:
      return;
  }
}

void Service::SendUnitLocked(Unit& unit) {
  const std::shared_ptr<Tenant>& tenant = unit.tenant;
  std::shared_ptr<InFlight> run;
  if (unit.run) {
    run = std::make_shared<InFlight>();
    // Every run was admitted through the queue: it counts in its islands' windows.
    run->islands.assign(unit.admission.islands().begin(), unit.admission.islands().end());
    run->flow = unit.flow;
    run->tenant = tenant;
    run->gangs = unit.admission.gangs();
    for (const wire::Request& r : unit.forwards) {
      if (r.forward().request().kind_case() == wire::Request::kRun) run->pending.fetch_add(1);
    }
    if (run->pending.load() == 0) {
      Finished(std::move(run->islands));
      run = nullptr;
    }
  }
  std::vector<bool> touched(hosts_->num_hosts(), false);
  for (wire::Request& outer : unit.forwards) {
    const uint64_t reply_id = outer.id();
    const int host = outer.forward().host();
    wire::Request request = std::move(*outer.mutable_forward()->mutable_request());
    request.set_session(tenant->id);
    NoteLoad(*tenant, host, request);
    touched[host] = true;
    const bool is_run = request.kind_case() == wire::Request::kRun;
    const uint64_t program = is_run ? request.run().program_id() : 0;
    if (reply_id == 0 && !is_run) {
      hosts_->Send(host, std::move(request), nullptr);
      continue;
    }
    std::shared_ptr<HostSession> session = tenant->session;
    std::shared_ptr<InFlight> part = is_run ? run : nullptr;
    hosts_->Send(host, std::move(request),
                 [this, session, reply_id, host, program, part](absl::StatusOr<wire::Reply> reply) {
                   if (part != nullptr) {
                     if (reply.ok() && reply->has_run()) {
                       // Its device time: each step's span times its devices on this host.
                       int64_t device_ns = 0;
                       MutexLock lock(&stats_mu_);
                       const auto& programs = part->tenant->step_devices[host];
                       auto it = programs.find(program);
                       for (const wire::StepTime& t : reply->run().times()) {
                         const int devices = it != programs.end() && t.step() < it->second.size() ? it->second[t.step()] : 0;
                         device_ns += std::max<int64_t>(0, t.end_ns() - t.start_ns()) * devices;
                       }
                       part->flow->device_ns += device_ns;
                     }
                     if (part->pending.fetch_sub(1, std::memory_order_acq_rel) == 1) {
                       {
                         MutexLock lock(&stats_mu_);
                         part->flow->gangs += part->gangs;
                       }
                       Finished(std::move(part->islands));
                     }
                   }
                   if (reply_id == 0) return;
                   if (!reply.ok()) {
                     session->Reply(ErrorReply(reply_id, reply.status()));
                     return;
                   }
                   wire::Reply out = *std::move(reply);
                   out.set_id(reply_id);
                   session->Reply(std::move(out));
                 });
  }
  for (int h = 0; h < hosts_->num_hosts(); ++h) {
    if (touched[h]) hosts_->Flush(h);
  }
}

void Service::Finished(std::vector<int> islands) {
  if (islands.empty()) return;
  MutexLock lock(&done_mu_);
  done_.push_back(std::move(islands));
  done_cv_.Signal();
}

void Service::AdmissionLoop() {
  while (true) {
    std::vector<std::vector<int>> done;
    {
      MutexLock lock(&done_mu_);
      while (done_.empty() && !stopping_) done_cv_.Wait(&done_mu_);
      if (stopping_) return;
      done.swap(done_);
    }
    MutexLock lock(&mu_);
    for (const std::vector<int>& islands : done) {
      for (int i : islands) {
        if (i >= 0 && i < static_cast<int>(admitted_.size())) --admitted_[i];
      }
    }
    AdmitLocked();
  }
}

void Service::OnSessionEnd(const std::shared_ptr<HostSession>& session) {
  std::vector<std::unique_ptr<Unit>> dropped;  // destroyed unlocked
  MutexLock lock(&mu_);
  auto it = tenants_.find(session->id());
  if (it == tenants_.end()) return;
  std::shared_ptr<Tenant> tenant = it->second;
  tenants_.erase(it);
  tenant->ended = true;
  if (--priorities_[tenant->priority] == 0) priorities_.erase(tenant->priority);
  for (auto& [id, flow] : tenant->flows) {
    for (auto& unit : queue_.Take(&flow)) dropped.push_back(std::move(unit));
    flow.queued = 0;
  }
  for (auto& unit : tenant->held) dropped.push_back(std::move(unit));
  tenant->held.clear();
  tenant->queued_runs.clear();
  tenant->unsent_buffers.clear();
  tenant->open.clear();
  // Every host cancels what of it has not started, then drops its session
  // once its running parts end.
  const std::string reason = absl::StrCat("its tenant '", tenant->name, "' ended");
  {
    MutexLock stats(&stats_mu_);
    tenant->ended_ns = NowNanos();
    tenant->hosts_to_free = 0;
    for (int h = 0; h < hosts_->num_hosts(); ++h) tenant->hosts_to_free += hosts_->alive(h) ? 1 : 0;
    if (tenant->hosts_to_free == 0) tenant->freed_after_s = 0;
  }
  for (int h = 0; h < hosts_->num_hosts(); ++h) {
    if (!hosts_->alive(h)) continue;
    wire::Request cancel;
    cancel.set_session(tenant->id);
    cancel.mutable_cancel_runs()->set_all(true);
    cancel.mutable_cancel_runs()->set_reason(reason);
    cancel.mutable_cancel_runs()->set_end_simulated_time(true);
    hosts_->Send(h, std::move(cancel), nullptr);
    wire::Request end;
    end.set_session(tenant->id);
    end.mutable_end_session()->set_reason(reason);
    // A lost host's reply (an error) counts too: nothing of the tenant is left there.
    hosts_->Send(h, std::move(end), [this, tenant](absl::StatusOr<wire::Reply>) {
      MutexLock stats(&stats_mu_);
      if (--tenant->hosts_to_free == 0) tenant->freed_after_s = static_cast<double>(NowNanos() - tenant->ended_ns) * 1e-9;
    });
    hosts_->Flush(h);
  }
  ended_.push_back(tenant);
  if (ended_.size() > kKeptEnded) ended_.pop_front();
  // Its queued runs no longer hold others back.
  AdmitLocked();
}

}  // namespace pw
