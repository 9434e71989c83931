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
// keep the devices busy across the round trips. Starvation is
// bounded by FairQueue's rule (a head passed over kMaxPassOvers times by
// higher priorities goes next).
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
  void Finished(std::vector<int> islands);
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

  // Accounting: the tenants' load tables and the flows' usage.
  mutable Mutex stats_mu_;

  // Finished runs, for the admission thread (replies come on gRPC threads,
  // which must not wait for mu_).
  Mutex done_mu_;
  CondVar done_cv_;
  std::vector<std::vector<int>> done_ ABSL_GUARDED_BY(done_mu_);
  bool stopping_ ABSL_GUARDED_BY(done_mu_) = false;
  std::thread admission_thread_;
};

}  // namespace pw

#endif  // PATHWAYS_SERVICE_SERVICE_H_
