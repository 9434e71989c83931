#include "csrc/service/service.h"

#include <unistd.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "csrc/base/spin.h"
#include "csrc/coordination/auth.h"
#include "csrc/base/status_macros.h"
#include "csrc/coordination/protocol_version.h"

namespace pw {
namespace {

constexpr int64_t kJoinTimeoutNs = int64_t{60} * 1'000'000'000;
constexpr int64_t kHeartbeatTimeoutNs = int64_t{3} * 1'000'000'000;

// "134217728 bytes (128 MiB)": what errors say of memory.
std::string Bytes(int64_t bytes) {
  constexpr int64_t kMiB = int64_t{1} << 20;
  if (bytes >= kMiB && bytes % kMiB == 0) return absl::StrCat(bytes, " bytes (", bytes / kMiB, " MiB)");
  return absl::StrCat(bytes, " bytes");
}

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
  // Anticipation (mu_): its runs sent and not finished, when it last had
  // none (and none queued), and its usual gap from then to its next run.
  int in_flight = 0;
  int64_t idle_since_ns = 0;
  int64_t gap_ns = 0;
  // Its grant (Reserve; mu_): `mine` by device id; empty until granted.
  bool asked = false;
  std::vector<int> devices;
  std::vector<bool> mine;
  int64_t memory_bytes = 0;
  bool released = false;
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
  const int num_devices = static_cast<int>(service->cluster_->devices().size());
  const int64_t capacity = topology.device_memory_bytes;
  if (config.max_tenant_devices < 0 || config.max_tenant_devices > num_devices) {
    return absl::InvalidArgumentError(absl::StrCat("max_tenant_devices (--max-tenant-devices) must be from 0 (every device) to ",
                                                   num_devices, " (the cluster's), got ", config.max_tenant_devices));
  }
  if (config.max_tenant_memory_bytes < 0 || config.max_tenant_memory_bytes > capacity) {
    return absl::InvalidArgumentError(absl::StrCat("max_tenant_memory (--max-tenant-memory) must be from 0 (a device's whole memory) to a device's ",
                                                   Bytes(capacity), ", got ", config.max_tenant_memory_bytes));
  }
  if (config.max_anticipation_ns < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_anticipation_ns must be at least 0, got ", config.max_anticipation_ns));
  }
  service->max_anticipation_ns_ = config.max_anticipation_ns;
  service->max_tenant_devices_ = config.max_tenant_devices == 0 ? num_devices : config.max_tenant_devices;
  service->max_tenant_memory_bytes_ =
      config.max_tenant_memory_bytes == 0 ? capacity : config.max_tenant_memory_bytes;
  service->tenant_memory_bytes_ =
      config.tenant_memory_bytes == 0 ? std::max<int64_t>(1, capacity / 8) : config.tenant_memory_bytes;
  if (service->tenant_memory_bytes_ < 0 || service->tenant_memory_bytes_ > service->max_tenant_memory_bytes_) {
    return absl::InvalidArgumentError(absl::StrCat("tenant_memory (--tenant-memory) must be from 0 (an eighth of a device's) to ",
                                                   "max_tenant_memory, ", Bytes(service->max_tenant_memory_bytes_),
                                                   ", got ", config.tenant_memory_bytes));
  }
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
    service->held_.assign(cluster->devices().size(), 0);
    service->holds_.assign(cluster->islands().size(), Hold{});
    service->holds_in_a_row_.assign(cluster->islands().size(), 0);
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

int64_t Service::held_bytes(int device) const {
  MutexLock lock(&mu_);
  return device >= 0 && device < static_cast<int>(held_.size()) ? held_[device] : 0;
}

int Service::waiting_reservations() const {
  MutexLock lock(&mu_);
  return static_cast<int>(waiting_.size());
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
      s->set_devices(static_cast<int>(t.devices.size()));
      s->set_memory_bytes(t.memory_bytes);
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
      if (refused = CheckDevices(*tenant, f.request()); !refused.ok()) {
        if (id != 0) session->Reply(ErrorReply(id, refused));
        return;
      }
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
      if (request.service_control().has_reserve()) {
        Reserve(tenant, id, request.service_control().reserve());
        return;
      }
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

absl::Status Service::CheckDevices(const Tenant& tenant, const wire::Request& request) const {
  if (tenant.devices.empty()) {
    return absl::FailedPreconditionError(
        "a tenant reserves its devices (ServiceControl.reserve) before it sends the hosts anything");
  }
  if (request.kind_case() != wire::Request::kDefineDevices) return absl::OkStatus();
  for (int d : request.define_devices().device_ids()) {
    if (d < 0 || d >= static_cast<int>(tenant.mine.size()) || !tenant.mine[d]) {
      return absl::PermissionDeniedError(absl::StrCat("device ", d, " is not this tenant's: it holds devices ",
                                                      absl::StrJoin(tenant.devices, ","),
                                                      " (pw.configure(devices=...) asks for a number)"));
    }
  }
  return absl::OkStatus();
}

void Service::Reserve(const std::shared_ptr<Tenant>& tenant, uint64_t reply_id, const wire::Reserve& reserve) {
  const int num_devices = static_cast<int>(cluster_->devices().size());
  const int64_t capacity = cluster_->options().device_memory_bytes;
  const int devices = reserve.devices() == 0 ? max_tenant_devices_ : reserve.devices();
  const int64_t bytes = reserve.memory_bytes() == 0 ? tenant_memory_bytes_ : reserve.memory_bytes();
  absl::Status refused;
  if (reserve.devices() < 0 || devices > max_tenant_devices_) {
    refused = absl::InvalidArgumentError(absl::StrCat(
        "devices=", reserve.devices(), ": a tenant of this service holds 1 to ", max_tenant_devices_,
        " devices (pathways-server --max-tenant-devices; the cluster has ", num_devices, ")"));
  } else if (reserve.memory_bytes() < 0 || bytes > max_tenant_memory_bytes_) {
    refused = absl::InvalidArgumentError(absl::StrCat(
        "memory=", reserve.memory_bytes(), ": a tenant of this service holds at most ",
        Bytes(max_tenant_memory_bytes_), " on each of its devices (pathways-server --max-tenant-memory; a device has ",
        Bytes(capacity), ")"));
  } else if (reserve.wait_ns() < 0) {
    refused = absl::InvalidArgumentError(
        absl::StrCat("wait_timeout must be at least 0 seconds, got ", static_cast<double>(reserve.wait_ns()) * 1e-9));
  }
  MutexLock lock(&mu_);
  if (refused.ok() && tenant->asked) {
    refused = absl::FailedPreconditionError(
        "this tenant has asked for its devices already: it holds one grant while it is connected");
  }
  if (!refused.ok()) {
    if (reply_id != 0) tenant->session->Reply(ErrorReply(reply_id, refused));
    return;
  }
  tenant->asked = true;
  constexpr int64_t kMaxWaitNs = int64_t{86400} * 1'000'000'000;  // a day
  Waiting w;
  w.tenant = tenant;
  w.reply_id = reply_id;
  w.devices = devices;
  w.bytes = bytes;
  w.asked_ns = NowNanos();
  w.deadline_ns = w.asked_ns + std::min(reserve.wait_ns(), kMaxWaitNs);
  waiting_.push_back(std::move(w));
  GrantLocked();
}

std::vector<int> Service::ChooseDevicesLocked(int devices, int64_t bytes) const {
  const int64_t capacity = cluster_->options().device_memory_bytes;
  auto fits = [&](const Device* d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !d->failed() && capacity - held_[d->id()] >= bytes;
  };
  // An island that has them all, where the least is held; else the islands
  // with the most free devices first (slices live on one island).
  const Island* best = nullptr;
  int64_t best_held = 0;
  std::vector<int> free_on(cluster_->islands().size(), 0);
  for (const Island* island : cluster_->islands()) {
    int64_t held = 0;
    for (const Device* d : island->devices()) {
      free_on[island->id()] += fits(d) ? 1 : 0;
      held += held_[d->id()];
    }
    if (free_on[island->id()] >= devices && (best == nullptr || held < best_held)) {
      best = island;
      best_held = held;
    }
  }
  std::vector<const Device*> pool;
  for (const Device* d : cluster_->devices()) {
    if (fits(d) && (best == nullptr || d->island() == best)) pool.push_back(d);
  }
  if (static_cast<int>(pool.size()) < devices) return {};
  std::stable_sort(pool.begin(), pool.end(), [&](const Device* a, const Device* b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const int fa = free_on[a->island()->id()], fb = free_on[b->island()->id()];
    if (fa != fb) return fa > fb;
    return held_[a->id()] < held_[b->id()];
  });
  std::vector<int> chosen;
  for (int i = 0; i < devices; ++i) chosen.push_back(pool[i]->id());
  std::sort(chosen.begin(), chosen.end());
  return chosen;
}

std::string Service::WaitingForLocked(int devices, int64_t bytes) const {
  const int64_t capacity = cluster_->options().device_memory_bytes;
  int free = 0;
  for (const Device* d : cluster_->devices()) free += !d->failed() && capacity - held_[d->id()] >= bytes ? 1 : 0;
  std::string out = absl::StrCat(devices, " devices with ", Bytes(bytes), " free on each (", free, " of the ",
                                 cluster_->devices().size(), " devices have that much free now");
  std::vector<const Tenant*> holders;
  for (const auto& [id, t] : tenants_) {
    if (!t->devices.empty()) holders.push_back(t.get());
  }
  for (const auto& t : ended_) {
    if (!t->devices.empty() && !t->released) holders.push_back(t.get());
  }
  std::sort(holders.begin(), holders.end(), [](const Tenant* a, const Tenant* b) { return a->id < b->id; });
  constexpr size_t kNamed = 8;
  std::vector<std::string> named;
  for (size_t i = 0; i < holders.size() && i < kNamed; ++i) {
    const Tenant& t = *holders[i];
    named.push_back(absl::StrCat("'", t.name, "' (tenant ", t.id, t.ended ? ", gone, its hosts still freeing" : "",
                                 "): ", t.devices.size(), " devices x ", Bytes(t.memory_bytes)));
  }
  if (holders.size() > kNamed) named.push_back(absl::StrCat("and ", holders.size() - kNamed, " more"));
  absl::StrAppend(&out, named.empty() ? "" : "; held by ", absl::StrJoin(named, ", "), ")");
  return out;
}

void Service::GrantLocked() {
  bool changed = true;
  while (changed) {
    changed = false;
    // In arrival order, up to the first that does not fit.
    while (!waiting_.empty()) {
      Waiting& w = waiting_.front();
      std::vector<int> chosen = ChooseDevicesLocked(w.devices, w.bytes);
      if (chosen.empty()) break;
      Tenant& t = *w.tenant;
      t.mine.assign(held_.size(), false);
      for (int d : chosen) {
        t.mine[d] = true;
        held_[d] += w.bytes;
      }
      t.devices = std::move(chosen);
      t.memory_bytes = w.bytes;
      if (w.reply_id != 0) {
        wire::Reply reply;
        reply.set_id(w.reply_id);
        for (int d : t.devices) reply.mutable_grant()->add_device_ids(d);
        reply.mutable_grant()->set_memory_bytes(t.memory_bytes);
        t.session->Reply(std::move(reply));
      }
      waiting_.pop_front();
    }
    // Those whose wait is over fail, saying what they waited for.
    const int64_t now = NowNanos();
    for (size_t i = 0; i < waiting_.size();) {
      Waiting& w = waiting_[i];
      if (w.deadline_ns > now) {
        ++i;
        continue;
      }
      std::string ahead = i == 0 ? "" : absl::StrCat("; ", i, " tenants asked before it and wait too");
      absl::Status why = absl::ResourceExhaustedError(absl::StrCat(
          "waited ", static_cast<double>(now - w.asked_ns) * 1e-9, " s (pw.configure(wait_timeout=...)) for ",
          WaitingForLocked(w.devices, w.bytes), ahead,
          ". Ask for fewer devices or less memory (pw.configure(devices=..., memory=...)), or wait longer"));
      if (w.reply_id != 0) w.tenant->session->Reply(ErrorReply(w.reply_id, why));
      w.tenant->asked = false;
      waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(i));
      changed = i == 0 || changed;  // the head gone: the next may fit
    }
  }
  UpdateWakeLocked();
}

void Service::ReleaseGrantLocked(Tenant& tenant) {
  if (tenant.released || tenant.devices.empty()) return;
  tenant.released = true;
  for (int d : tenant.devices) held_[d] -= tenant.memory_bytes;
  GrantLocked();
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
  if (tenant->idle_since_ns != 0) {
    // Its gap from idle to this run (each at most the cap: an idle spell
    // counts as no more than one).
    const int64_t gap = std::min(NowNanos() - tenant->idle_since_ns, max_anticipation_ns_);
    tenant->gap_ns = tenant->gap_ns == 0 ? gap : (tenant->gap_ns * 3 + gap) / 4;
    tenant->idle_since_ns = 0;
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
  const int64_t now = NowNanos();
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
        if (i < 0 || i >= static_cast<int>(admitted_.size())) continue;
        if (admitted_[i] >= window) return false;
        if (holds_[i].priority > t.priority && holds_[i].until_ns > now) return false;
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
    const bool lower = !priorities_.empty() && priorities_.rbegin()->first > t.priority;
    for (int i : unit->admission.islands()) {
      if (i < 0 || i >= static_cast<int>(admitted_.size())) continue;
      ++admitted_[i];
      // The run held for has come (the window keeps the lower ones out now).
      if (holds_[i].priority <= t.priority) holds_[i] = Hold{};
      if (lower) holds_in_a_row_[i] = 0;
    }
    ++t.in_flight;
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
      Finished(std::move(run->islands), tenant);
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
                       Finished(std::move(part->islands), part->tenant);
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

void Service::Finished(std::vector<int> islands, std::shared_ptr<Tenant> tenant) {
  MutexLock lock(&done_mu_);
  done_.push_back(Done{std::move(islands), std::move(tenant)});
  done_cv_.Signal();
}

void Service::UpdateWakeLocked() {
  int64_t next = 0;
  auto consider = [&next](int64_t t) { next = next == 0 ? t : std::min(next, t); };
  for (const Waiting& w : waiting_) consider(w.deadline_ns);
  const int64_t now = NowNanos();
  for (const Hold& h : holds_) {
    if (h.until_ns > now) consider(h.until_ns);
  }
  MutexLock lock(&done_mu_);
  wake_at_ns_ = next;
  done_cv_.Signal();
}

void Service::AdmissionLoop() {
  while (true) {
    std::vector<Done> done;
    std::vector<std::shared_ptr<Tenant>> released;
    bool expired = false;
    {
      MutexLock lock(&done_mu_);
      while (done_.empty() && released_.empty() && !stopping_) {
        if (wake_at_ns_ == 0) {
          done_cv_.Wait(&done_mu_);
        } else if (NowNanos() >= wake_at_ns_) {
          break;
        } else {
          done_cv_.WaitUntil(&done_mu_,
                             std::chrono::steady_clock::time_point(std::chrono::nanoseconds(wake_at_ns_)));
        }
      }
      if (stopping_) return;
      done.swap(done_);
      released.swap(released_);
      expired = wake_at_ns_ != 0 && NowNanos() >= wake_at_ns_;
    }
    MutexLock lock(&mu_);
    const int64_t now = NowNanos();
    bool held = false;
    for (const Done& d : done) {
      for (int i : d.islands) {
        if (i >= 0 && i < static_cast<int>(admitted_.size())) --admitted_[i];
      }
      Tenant& t = *d.tenant;
      if (--t.in_flight > 0 || !t.queued_runs.empty() || t.ended) continue;
      t.idle_since_ns = now;
      // Its islands wait a while for its next run, if it outranks anyone.
      if (t.gap_ns == 0 || priorities_.empty() || priorities_.begin()->first >= t.priority) continue;
      const int64_t until = now + std::min(2 * t.gap_ns, max_anticipation_ns_);
      bool lower_waits = false;
      for (const auto& [id, other] : tenants_) lower_waits |= other->priority < t.priority && !other->queued_runs.empty();
      for (int i : d.islands) {
        if (i < 0 || i >= static_cast<int>(holds_.size())) continue;
        if (lower_waits && holds_in_a_row_[i]++ >= kMaxHoldsInARow) continue;  // a lower run's turn
        Hold& h = holds_[i];
        if (h.until_ns <= now || h.priority <= t.priority) h = Hold{t.priority, std::max(until, h.until_ns)};
        held = true;
      }
    }
    for (const auto& tenant : released) ReleaseGrantLocked(*tenant);
    if (expired) GrantLocked();
    AdmitLocked();
    if (held || expired) UpdateWakeLocked();
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
  for (auto w = waiting_.begin(); w != waiting_.end(); ++w) {
    if (w->tenant == tenant) {
      waiting_.erase(w);
      break;
    }
  }
  // Every host cancels what of it has not started, then drops its session
  // once its running parts end.
  const std::string reason = absl::StrCat("its tenant '", tenant->name, "' ended");
  bool nothing_to_free = false;
  {
    MutexLock stats(&stats_mu_);
    tenant->ended_ns = NowNanos();
    tenant->hosts_to_free = 0;
    for (int h = 0; h < hosts_->num_hosts(); ++h) tenant->hosts_to_free += hosts_->alive(h) ? 1 : 0;
    if (tenant->hosts_to_free == 0) tenant->freed_after_s = 0;
    nothing_to_free = tenant->hosts_to_free == 0;
  }
  if (nothing_to_free) ReleaseGrantLocked(*tenant);
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
      {
        MutexLock stats(&stats_mu_);
        if (--tenant->hosts_to_free != 0) return;
        tenant->freed_after_s = static_cast<double>(NowNanos() - tenant->ended_ns) * 1e-9;
      }
      // Its memory is free on every host: its grant comes back (under mu_,
      // which a reply's thread must not wait for).
      MutexLock lock(&done_mu_);
      released_.push_back(tenant);
      done_cv_.Signal();
    });
    hosts_->Flush(h);
  }
  ended_.push_back(tenant);
  if (ended_.size() > kKeptEnded) ended_.pop_front();
  // Its reservation waits no more: those behind it may fit.
  GrantLocked();
  // Its queued runs no longer hold others back.
  AdmitLocked();
}

}  // namespace pw
