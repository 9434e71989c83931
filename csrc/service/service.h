#ifndef PATHWAYS_SERVICE_SERVICE_H_
#define PATHWAYS_SERVICE_SERVICE_H_

// The Pathways service (pathways-server): one resource owner and one gang
// scheduler per island, shared by many client processes (paper §4.4, §5.2,
// Figure 9; "multi-tenancy"). The service is the one configuring session of
// every host (the hosts' owner); each client process that connects is a
// tenant with a session of its own here and a session id on the hosts,
// under which the hosts keep its ids apart from every other tenant's
// (host/host_executor.h, "Ids").
//
// A tenant's requests for a host come as wire::Forward requests, gathered
// into units by wire::Commit (control.proto). The service sends them on to
// the host under the tenant's session id and routes each reply back.
//
// One order. Every unit is sent to its hosts under one lock (mu_), so all
// hosts see every tenant's runs in one order, and each device queue holds
// its gangs in the same order on every host: the gang schedulers' order of
// §4.4, across processes. Runs wait in a FairQueue keyed by (tenant,
// client), and each island admits at most kServiceWindow unfinished runs:
// the next one is the head of the highest priority, then by start-time fair
// queueing over the clients' weights (proportional share) or first come
// (FIFO). The window is what lets a later run of higher priority go ahead
// of the runs queued before it: runs are preempted only at gang boundaries
// (a run sent is never recalled). While a tenant of higher priority is
// connected, a lower tenant keeps at most kYieldWindow runs on an island,
// so the higher one's next run waits for at most that one run, whenever it
// comes; tenants of one priority keep up to kServiceWindow, deep enough to
// keep the devices busy across the round trips. And when a tenant of
// higher priority than another connected one has no run left queued or
// unfinished, its islands are held for its next run for a while
// (anticipation, as in anticipatory disk scheduling): twice its usual gap
// between its last run's end and its next run's commit, at most
// max_anticipation_ns; lower runs are not admitted there meanwhile. Without
// that, a tenant stepping in a closed loop would find a lower run started in
// every gap between its steps and wait for it whole. The cost: the devices
// idle at most that long after each of its runs when it does not come back.
// Starvation is bounded: by FairQueue's rule (a head passed over
// kMaxPassOvers times by higher priorities goes next), and by holds: an
// island is held at most kMaxHoldsInARow times in a row while lower runs
// wait, and then not until a lower run has gone there.
//
// A tenant's units keep its own order where it matters: a run is admitted
// after the runs that make its arguments and after the tenant's
// pass-through units committed before it (puts, frees); a pass-through unit
// (a free, a put, a load) is sent after the tenant's runs committed before
// it.
//
// Isolation: tenants prove the service's secret (not the hosts': a tenant
// never owns a host). A tenant names only its own ids (the hosts key them
// by its session), so another tenant's buffers, functions and programs are
// not there for it ("no such buffer"); requests that configure hosts,
// inject faults or end sessions are the service's and are refused. A
// tenant's run must come in a run unit (admitted). Bulk data goes between a
// tenant and the hosts directly: the service gives every host a key for the
// tenant (wire::TenantKey) before the tenant's Hello is answered, and the
// tenant's own sessions, proving it, may only put and fetch its buffers
// (host/host_process.h; service_link.h orders the two paths). A cancel of
// the tenant's drops its runs still queued here at once.
//
// Quotas. A tenant holds devices, and memory on each of them, while it is
// connected: it asks for them once, first (wire::Reserve; pw.configure's
// devices, memory and wait_timeout), by default every device (at most
// max_tenant_devices) with tenant_memory_bytes on each. The grant is made
// when that many devices each have that much memory no other tenant holds;
// until then the request waits, in arrival order (a request waits for the
// ones before it, so a large one is not passed over forever), up to its
// wait, and then fails with ResourceExhausted naming what it waited for, how
// much is free and which tenants hold the rest. A request for more than a
// tenant may ever hold is refused at once (InvalidArgument). Devices go to a
// grant one island at a time where it fits (the island where the least is
// held first), least-held devices first, so tenants spread over the
// islands. A tenant names only its devices: a device list naming another is
// refused (PermissionDenied). Its runtime takes the grant's memory as its
// devices' memory (its object store's back-pressure and ResourceExhausted
// work within it) and its resource manager places slices on its devices
// only. The memory is held whether used or not (as Pathways on Cloud holds
// a client's devices), and comes back once every host has freed the
// tenant's session. What a tenant's runtime puts in its buffers is counted
// by that runtime: the hosts do not check it against the grant.
//
// A tenant that goes (its stream ends: closed, killed or cut off): its
// queued runs are dropped, and every host cancels its parts that have not
// started and, once its running parts end, frees everything of its session
// (wire::EndSession). The other tenants are not touched. The service does
// not survive its own restart: its tenants lose their hosts (every call
// fails with HostLostError) and must reconnect to a new service.
//
// Accounting (pw.client_stats): each run reply's step times, times the
// step's devices on that host (the service reads the tenants' DefineDevices
// and LoadProgram on their way), are the device time of the run's client.
//
// Thread-safe. Lock order: mu_, then stats_mu_; done_mu_ is a leaf.

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/node_hash_map.h"
#include "absl/status/statusor.h"
#include "csrc/base/mutex.h"
#include "csrc/client/host_sessions.h"
#include "csrc/cluster/cluster.h"
#include "csrc/coordination/host_server.h"
#include "csrc/scheduler/fair_queue.h"
#include "csrc/scheduler/gang_scheduler.h"

namespace pw {

struct ServiceConfig {
  // Where tenants connect: loopback by default (port 0 picks one).
  std::string listen_address = "127.0.0.1:0";
  // What tenants prove they know (nonempty). Not the hosts' secret.
  std::string secret;
  SchedulingPolicy policy = SchedulingPolicy::kFifo;
  // Quotas ("Quotas" above). The most devices a tenant may hold (0: every
  // device), which is also what it gets when it asks for no number.
  int max_tenant_devices = 0;
  // Memory a tenant holds on each of its devices when it asks for no
  // amount (0: an eighth of a device's), and the most it may ask for (0: a
  // device's whole memory).
  int64_t tenant_memory_bytes = 0;
  int64_t max_tenant_memory_bytes = 0;
  // The longest an island is held for a higher tenant's next run
  // ("anticipation" above; 0: never held).
  int64_t max_anticipation_ns = 5'000'000;  // 5 ms
};

class Service final : public RequestHandler {
 public:
  // Unfinished runs an island admits at once: deeper than an island's own
  // (kAdmissionWindow, 3), since a run's reply comes back through one more
  // hop, and shallow enough that a run of higher priority waits for few.
  static constexpr int kServiceWindow = 8;
  // The window of a tenant's runs while a tenant of higher priority is
  // connected (idle or not): what that tenant's next run may find ahead.
  static constexpr int kYieldWindow = 1;
  // Holds of an island in a row while lower runs wait ("anticipation").
  static constexpr int kMaxHoldsInARow = 16;
  // Requests one unit may gather before its Commit.
  static constexpr size_t kMaxOpenForwards = size_t{1} << 16;
  // Connects to the hosts of `topology` at `host_addresses` (one per host,
  // proving `host_secret`), configures and joins them, then listens for
  // tenants. InvalidArgument for a bad topology or config; the hosts' or the
  // listener's error otherwise.
  static absl::StatusOr<std::unique_ptr<Service>> Start(const TopologyOptions& topology,
                                                        const std::vector<std::string>& host_addresses,
                                                        const std::string& host_secret, ServiceConfig config);
  // Stops listening (tenants lose their hosts) and closes the hosts'
  // sessions.
  ~Service() override;

  const std::string& address() const { return server_->address(); }
  const Cluster& cluster() const { return *cluster_; }
  // Tenants connected now.
  int num_tenants() const;
  // Every tenant's clients (those gone too) and the policy.
  wire::ServiceReport Report() const;
  void SetPolicy(SchedulingPolicy policy);
  // Runs queued for admission now, over every tenant.
  int64_t queued_runs() const;
  // Memory tenants hold on `device` now (Reserve), and the reservations
  // waiting.
  int64_t held_bytes(int device) const;
  int waiting_reservations() const;

  // RequestHandler: the tenants' sessions.
  void Handle(const std::shared_ptr<HostSession>& session, wire::Request request) override;
  void OnSessionEnd(const std::shared_ptr<HostSession>& session) override;

 private:
  struct Tenant;
  struct Unit;
  // A tenant's client (pw.Client): a FairQueue client.
  struct Flow {
    Tenant* tenant = nullptr;
    uint64_t id = 0;
    std::string name;
    double weight_ = 1;
    int priority_ = 0;
    double weight() const { return weight_; }
    int priority() const { return priority_; }
    // Guarded by stats_mu_.
    int64_t device_ns = 0;
    int64_t gangs = 0;
    int64_t queued = 0;  // guarded by mu_
  };
  // A run sent to its hosts: what its replies finish.
  struct InFlight;

  Service() = default;
  wire::Reply Hello(const std::shared_ptr<HostSession>& session, const wire::Hello& hello);
  void Commit(const std::shared_ptr<Tenant>& tenant, const wire::Commit& commit);
  void Control(const std::shared_ptr<HostSession>& session, const wire::Request& request);
  // A tenant's Reserve: queued, then granted (GrantLocked) or expired.
  void Reserve(const std::shared_ptr<Tenant>& tenant, uint64_t reply_id, const wire::Reserve& reserve);
  // Grants the waiting reservations that fit, in order, up to the first
  // that does not; then fails those whose wait is over (and wakes the
  // admission thread for the next deadline).
  void GrantLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Devices for `devices` x `bytes` now, or empty if they are not free.
  std::vector<int> ChooseDevicesLocked(int devices, int64_t bytes) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What a reservation waits for, and who holds the rest (its error).
  std::string WaitingForLocked(int devices, int64_t bytes) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The tenant's grant comes back (every host has freed its session).
  void ReleaseGrantLocked(Tenant& tenant) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Refusal of a forward naming devices that are not the tenant's.
  absl::Status CheckDevices(const Tenant& tenant, const wire::Request& request) const;
  // Sends the queued runs that may go now, and what their tenants held
  // behind them.
  void AdmitLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends `unit` to its hosts under the tenant's session, now.
  void SendUnitLocked(Unit& unit) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops the tenant's queued runs that `cancel` names (all, with `all`),
  // answering their parts with Cancelled.
  void DropQueuedLocked(Tenant& tenant, const wire::CancelRuns& cancel) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends the tenant's held pass-through units no queued run of it precedes.
  void ReleaseHeldLocked(Tenant& tenant) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What the service reads of a tenant's loads on their way (accounting).
  void NoteLoad(Tenant& tenant, int host, const wire::Request& request);
  // A run's replies are all in: its islands' windows have room again.
  void Finished(std::vector<int> islands, std::shared_ptr<Tenant> tenant);
  // When the admission thread must look again: the first reservation's wait
  // or island hold to end.
  void UpdateWakeLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AdmissionLoop();
  Flow* FlowOf(Tenant& tenant, const wire::RunAdmission& run) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::unique_ptr<Cluster> cluster_;
  std::unique_ptr<HostSessions> hosts_;
  std::unique_ptr<HostServer> server_;
  std::string topology_;  // the cluster's, for tenants

  mutable Mutex mu_;
  SchedulingPolicy policy_ ABSL_GUARDED_BY(mu_) = SchedulingPolicy::kFifo;
  // Tenants by their session here (HostSession::id).
  absl::flat_hash_map<uint64_t, std::shared_ptr<Tenant>> tenants_ ABSL_GUARDED_BY(mu_);
  // Tenants gone, for the report (the last kKeptEnded).
  std::deque<std::shared_ptr<Tenant>> ended_ ABSL_GUARDED_BY(mu_);
  static constexpr size_t kKeptEnded = 256;
  uint64_t next_tenant_ ABSL_GUARDED_BY(mu_) = 1;
  // Connected tenants by priority (kYieldWindow).
  std::map<int, int> priorities_ ABSL_GUARDED_BY(mu_);
  FairQueue<std::unique_ptr<Unit>, Flow> queue_ ABSL_GUARDED_BY(mu_);
  std::vector<int> admitted_ ABSL_GUARDED_BY(mu_);  // per island: unfinished runs admitted from the queue
  // Quotas: the config's limits (resolved), memory held per device, and the
  // reservations waiting, in arrival order.
  int max_tenant_devices_ = 0;
  int64_t tenant_memory_bytes_ = 0;
  int64_t max_tenant_memory_bytes_ = 0;
  int64_t max_anticipation_ns_ = 0;
  std::vector<int64_t> held_ ABSL_GUARDED_BY(mu_);
  struct Waiting {
    std::shared_ptr<Tenant> tenant;
    uint64_t reply_id = 0;
    int devices = 0;
    int64_t bytes = 0;
    int64_t asked_ns = 0;     // NowNanos() when it came
    int64_t deadline_ns = 0;  // NowNanos() then + its wait
  };
  std::deque<Waiting> waiting_ ABSL_GUARDED_BY(mu_);
  // Per island: held for a tenant of this priority's next run until then
  // (anticipation; 0: not held).
  struct Hold {
    int priority = 0;
    int64_t until_ns = 0;
  };
  std::vector<Hold> holds_ ABSL_GUARDED_BY(mu_);
  std::vector<int> holds_in_a_row_ ABSL_GUARDED_BY(mu_);  // per island, while lower runs waited

  // Accounting: the tenants' load tables and the flows' usage.
  mutable Mutex stats_mu_;

  // Finished runs, for the admission thread (replies come on gRPC threads,
  // which must not wait for mu_).
  Mutex done_mu_;
  CondVar done_cv_;
  struct Done {
    std::vector<int> islands;
    std::shared_ptr<Tenant> tenant;
  };
  std::vector<Done> done_ ABSL_GUARDED_BY(done_mu_);
  // Tenants whose grants come back (their sessions freed on every host).
  std::vector<std::shared_ptr<Tenant>> released_ ABSL_GUARDED_BY(done_mu_);
  // When the first reservation's wait or island hold ends (0: none).
  int64_t wake_at_ns_ ABSL_GUARDED_BY(done_mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(done_mu_) = false;
  std::thread admission_thread_;
};

}  // namespace pw

#endif  // PATHWAYS_SERVICE_SERVICE_H_
