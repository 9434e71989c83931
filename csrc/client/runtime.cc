#include "csrc/client/runtime.h"

#include <cstdlib>
#include <limits>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "csrc/base/fork.h"
#include "csrc/base/mutex.h"
#include "csrc/base/spin.h"
#include "csrc/base/status_macros.h"

#ifndef PATHWAYS_WITH_HOSTS
#define PATHWAYS_WITH_HOSTS 0
#endif
#if PATHWAYS_WITH_HOSTS
#include <cstdio>

#include "absl/strings/numbers.h"
#include "csrc/client/host_registry.h"
#include "csrc/client/remote_cluster.h"
#include "csrc/client/service_link.h"
#endif

namespace pw {
namespace {

// Polls `done` every 100 us until it holds or `timeout_ns` passes.
template <typename Pred>
bool PollFor(Pred done, int64_t timeout_ns) {
  const int64_t deadline = NowNanos() + timeout_ns;
  while (!done()) {
    if (NowNanos() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return true;
}
constexpr int64_t kForever = std::numeric_limits<int64_t>::max() / 2;

// How long Shutdown() waits for the runs on host processes once it has
// cancelled what had not started: parts running real kernels may take that
// long to finish and report.
constexpr int64_t kRemoteShutdownWaitNs = int64_t{5} * 1'000'000'000;

absl::Status ClosedClientError(const SchedulingClient& client) {
  return absl::FailedPreconditionError(absl::StrCat("client '", client.name(), "' is closed"));
}

Mutex default_mu;
Runtime* default_runtime ABSL_GUARDED_BY(default_mu) = nullptr;
TopologyOptions* default_options ABSL_GUARDED_BY(default_mu) = nullptr;
TenantOptions* default_tenant ABSL_GUARDED_BY(default_mu) = nullptr;  // set: the default runtime is a tenant

Mutex launcher_mu;
HostLauncher* host_launcher ABSL_GUARDED_BY(launcher_mu) = nullptr;

#if PATHWAYS_WITH_HOSTS
absl::StatusOr<LaunchedHosts> LaunchHosts(const TopologyOptions& options, int num_hosts) {
  HostLauncher launcher;
  {
    MutexLock lock(&launcher_mu);
    if (host_launcher != nullptr) launcher = *host_launcher;
  }
  if (!launcher) {
    return absl::FailedPreconditionError(absl::StrCat(
        "hosts=", HostsModeName(options.hosts),
        ": nothing is set up to start host processes (Runtime::SetHostLauncher; the pathways Python package "
        "sets one up)"));
  }
  return launcher(options, num_hosts);
}

// hosts=external: the hosts are started by someone else and register here.
absl::StatusOr<LaunchedHosts> AwaitExternalHosts(int num_hosts) {
  const char* secret = std::getenv("PATHWAYS_SECRET");
  if (secret == nullptr || *secret == '\0') {
    return absl::FailedPreconditionError(
        "hosts=external: set PATHWAYS_SECRET to the cluster's secret (the same for the client and its hosts)");
  }
  const char* listen = std::getenv("PATHWAYS_CLIENT_ADDRESS");
  double timeout_s = 300;
  if (const char* t = std::getenv("PATHWAYS_HOSTS_TIMEOUT"); t != nullptr) {
    if (!absl::SimpleAtod(t, &timeout_s) || !(timeout_s > 0) || timeout_s > 86400) {
      return absl::InvalidArgumentError(
          absl::StrCat("PATHWAYS_HOSTS_TIMEOUT must be a number of seconds in (0, 86400], got '", t, "'"));
    }
  }
  auto registry = HostRegistry::Start(listen != nullptr && *listen != '\0' ? listen : "127.0.0.1:0", secret);
  if (!registry.ok()) return registry.status();
  std::fprintf(stderr,
               "pathways: waiting for %d hosts to register at %s: start each with\n"
               "  PATHWAYS_SECRET=... pathways-host --client=%s [--listen=THIS_HOSTS_IP:0]\n"
               "  (or python -m pathways.host with the same arguments)\n",
               num_hosts, (*registry)->address().c_str(), (*registry)->address().c_str());
  auto addresses = (*registry)->Await(num_hosts, static_cast<int64_t>(timeout_s * 1e9));
  if (!addresses.ok()) return addresses.status();
  // The registry outlives this call: the last host's registration reply may
  // still be on its way, and a host that loses it stops.
  return LaunchedHosts{*std::move(addresses), secret, std::shared_ptr<HostRegistry>(*std::move(registry))};
}
#endif

}  // namespace

void Runtime::SetHostLauncher(HostLauncher launcher) {
  MutexLock lock(&launcher_mu);
  delete host_launcher;
  host_launcher = new HostLauncher(std::move(launcher));
}

absl::StatusOr<std::unique_ptr<Runtime>> Runtime::Create(const TopologyOptions& options) {
  if (options.hosts == HostsMode::kService) {
    return absl::InvalidArgumentError("hosts=service: connect to the service (Runtime::CreateTenant)");
  }
  return CreateWith(options, nullptr);
}

absl::StatusOr<std::unique_ptr<Runtime>> Runtime::CreateTenant(const TenantOptions& tenant) {
#if PATHWAYS_WITH_HOSTS
  auto link = ServiceLink::Connect(tenant);
  if (!link.ok()) return link.status();
  auto options = ParseTopology((*link)->tenant().topology());
  if (!options.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("the service at ", tenant.address,
                                                      " sent a topology this build cannot read: ",
                                                      options.status().message()));
  }
  options->hosts = HostsMode::kService;
  // Its devices hold the memory it was granted, and its slices go on them only.
  const wire::Grant grant = (*link)->grant();
  options->device_memory_bytes = grant.memory_bytes();
  auto rt = CreateWith(*options, *std::move(link));
  if (!rt.ok()) return rt.status();
  (*rt)->resource_manager_->Restrict(std::vector<int>(grant.device_ids().begin(), grant.device_ids().end()));
  return rt;
#else
  return absl::FailedPreconditionError(
      "this build of pathways has no host processes (it was built without gRPC, protobuf or Gloo): it cannot be "
      "a service's tenant");
#endif
}

absl::StatusOr<std::unique_ptr<Runtime>> Runtime::CreateWith(const TopologyOptions& options,
                                                             std::unique_ptr<HostLinks> links) {
  auto cluster = Cluster::Create(options);
  if (!cluster.ok()) return cluster.status();
  auto rt = std::unique_ptr<Runtime>(new Runtime());
  rt->cluster_ = *std::move(cluster);
  rt->resource_manager_ = std::make_unique<ResourceManager>(rt->cluster_.get(), &rt->registry_);
  rt->stores_ = std::make_unique<ObjectStores>(rt->cluster_.get());
  rt->stores_->ListAccount(rt->device_put_memory_);
  for (Island* island : rt->cluster_->islands()) {
    rt->schedulers_.push_back(std::make_unique<GangScheduler>(island));
    rt->scheduler_ptrs_.push_back(rt->schedulers_.back().get());
  }
  rt->delays_ = std::make_unique<DelayQueue>();
  // A gang on a failed device (FailDevices) does not wait out its simulated
  // time, nor a transfer from or to one its modeled time.
  rt->delays_->SetHurryRule([](Runnable* job) {
    if (auto* gang = dynamic_cast<GangTask*>(job)) return gang->OnFailedDevice();
    auto* transfer = dynamic_cast<TransferTask*>(job);
    return transfer != nullptr && transfer->OnFailedDevice();
  });
  rt->interconnect_ = InterconnectModel::Create(*rt->cluster_);
  rt->executor_ = std::make_unique<WorkerPool>(rt->cluster_->options().num_executor_threads,
                                               WorkerPool::kDefaultSpinNs,
                                               rt->cluster_->options().intra_op_threads);
  rt->dispatcher_ = std::make_unique<ParallelDispatcher>(rt->stores_.get(), rt->scheduler_ptrs_,
                                                         rt->executor_.get(), &rt->stats_,
                                                         GangServices{rt->stores_.get(), rt->delays_.get(), &rt->timeline_,
                                                                      rt->cluster_->options().control_latency_ns,
                                                                      &rt->shut_down_,
                                                                      rt->executor_->num_threads()},
                                                         rt->interconnect_.get());
  if (options.hosts != HostsMode::kInProcess) {
#if PATHWAYS_WITH_HOSTS
    RemoteServices services;
    services.stores = rt->stores_.get();
    services.stats = &rt->stats_;
    services.timeline = &rt->timeline_;
    services.schedulers = rt->scheduler_ptrs_;
    services.registry = &rt->registry_;
    if (links != nullptr) {
      rt->service_ = dynamic_cast<ServiceLink*>(links.get());
      rt->remote_ = RemoteCluster::Attach(*rt->cluster_, std::move(services), std::move(links));
    } else {
      const int num_hosts = static_cast<int>(rt->cluster_->hosts().size());
      absl::StatusOr<LaunchedHosts> launched = options.hosts == HostsMode::kExternal
                                                   ? AwaitExternalHosts(num_hosts)
                                                   : LaunchHosts(options, num_hosts);
      if (!launched.ok()) return launched.status();
      rt->launcher_state_ = launched->keep_alive;
      auto remote = RemoteCluster::Connect(*rt->cluster_, std::move(services), launched->addresses, launched->secret);
      if (!remote.ok()) return remote.status();
      rt->remote_ = *std::move(remote);
    }
    rt->dispatcher_->set_remote(rt->remote_.get());
#else
    return absl::FailedPreconditionError(absl::StrCat(
        "hosts=", HostsModeName(options.hosts),
        ": this build of pathways has no host processes (it was built without gRPC, protobuf or Gloo)"));
#endif
  }
  if (const int64_t threshold = rt->cluster_->options().hang_report_ns; threshold > 0) {
    // The islands' gang schedulers, and with host processes the hosts'
    // device queues (asked only once a run in flight is that old; a host
    // that does not answer within 5 s is left out of that report).
    rt->watchdog_ = std::make_unique<HangWatchdog>(
        [r = rt.get()](int64_t threshold_ns) {
          Diagnosis report = pw::Diagnose(r->scheduler_ptrs_, threshold_ns, /*take=*/true);
#if PATHWAYS_WITH_HOSTS
          if (r->remote_ != nullptr) {
            r->remote_->Describe(report, int64_t{5'000'000'000}, threshold_ns, /*take=*/true);
          }
#endif
          return report;
        },
        threshold);
  }
  return rt;
}

Runtime::~Runtime() {
  if (watchdog_ != nullptr) watchdog_->Stop();
  AwaitQuiescence();
  executor_.reset();
  delays_.reset();
}

absl::StatusOr<SchedulingClient*> Runtime::CreateClient(std::string name, double weight) {
  if (!(weight > 0) || weight > 1e9) {
    return absl::InvalidArgumentError(absl::StrCat("client '", name, "': weight must be positive and at most 1e9, got ", weight));
  }
  MutexLock lock(&clients_mu_);
  clients_.push_back(std::make_unique<SchedulingClient>(static_cast<int>(clients_.size()), std::move(name), weight));
  return clients_.back().get();
}

std::vector<SchedulingClient*> Runtime::clients() {
  MutexLock lock(&clients_mu_);
  std::vector<SchedulingClient*> out;
  for (auto& c : clients_) out.push_back(c.get());
  return out;
}

Diagnosis Runtime::Diagnose() {
  Diagnosis diagnosis = pw::Diagnose(scheduler_ptrs_);
#if PATHWAYS_WITH_HOSTS
  // The hosts' queues; a host that does not describe them within 5 s is
  // left out (a diagnosis must not hang on what it diagnoses).
  if (remote_ != nullptr) remote_->Describe(diagnosis, int64_t{5'000'000'000});
#endif
  return diagnosis;
}

absl::Status Runtime::SetSchedulingPolicy(SchedulingPolicy policy) {
#if PATHWAYS_WITH_HOSTS
  if (service_ != nullptr) return service_->SetPolicy(std::string(SchedulingPolicyName(policy)));
#endif
  ReadyList ready;
  for (auto& s : schedulers_) s->SetPolicy(policy, &ready);
  executor_->Submit(ready);
#if PATHWAYS_WITH_HOSTS
  if (remote_ != nullptr) remote_->SetPolicy(policy);
#endif
  return absl::OkStatus();
}

absl::StatusOr<SchedulingPolicy> Runtime::scheduling_policy() {
#if PATHWAYS_WITH_HOSTS
  if (service_ != nullptr) {
    auto report = service_->Report();
    if (!report.ok()) return report.status();
    return ParseSchedulingPolicy(report->policy());
  }
#endif
  return schedulers_[0]->policy();
}

absl::StatusOr<Runtime*> Runtime::Default() {
  // Checked before the lock: a thread that held it at fork() is gone.
  if (InForkedChild()) {
    return absl::FailedPreconditionError(
        "the pathways runtime cannot be used in a process forked after it started (its threads do not survive "
        "fork()); start child processes with multiprocessing's 'spawn' or 'forkserver' method, or fork before "
        "the first use of pathways");
  }
  MutexLock lock(&default_mu);
  if (default_runtime != nullptr) return default_runtime;
  if (default_tenant != nullptr) {
    auto rt = CreateTenant(*default_tenant);
    if (!rt.ok()) return rt.status();
    WatchForFork();
    default_runtime = rt->release();  // intentionally never destroyed
    return default_runtime;
  }
  TopologyOptions options;
  if (default_options != nullptr) {
    options = *default_options;
  } else if (const char* env = std::getenv("PATHWAYS_TOPOLOGY"); env != nullptr && *env != '\0') {
    auto parsed = ParseTopology(env);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("PATHWAYS_TOPOLOGY: ", parsed.status().message()));
    }
    options = *parsed;
  }
  auto rt = Create(options);
  if (!rt.ok()) return rt.status();
  WatchForFork();
  default_runtime = rt->release();  // intentionally never destroyed
  return default_runtime;
}

absl::Status Runtime::ConfigureDefault(const TopologyOptions& options) {
  MutexLock lock(&default_mu);
  if (default_runtime != nullptr) {
    return absl::FailedPreconditionError(
        "the pathways runtime has already started; configure the topology before its first use");
  }
  if (default_tenant != nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this process is a tenant of the service at ", default_tenant->address,
        " (pw.configure(server=...) or PATHWAYS_SERVER): its topology is the service's"));
  }
  PW_RETURN_IF_ERROR(ValidateTopology(options));
  delete default_options;
  default_options = new TopologyOptions(options);
  return absl::OkStatus();
}

absl::Status Runtime::ConfigureDefaultTenant(const TenantOptions& tenant) {
  MutexLock lock(&default_mu);
  if (default_runtime != nullptr) {
    return absl::FailedPreconditionError(
        "the pathways runtime has already started; connect to a service before its first use");
  }
  delete default_tenant;
  default_tenant = new TenantOptions(tenant);
  return absl::OkStatus();
}

bool Runtime::DefaultExists() {
  MutexLock lock(&default_mu);
  return default_runtime != nullptr;
}

bool Runtime::DefaultIsShutDown() {
  if (InForkedChild()) return false;  // and default_mu may be held by a lost thread
  MutexLock lock(&default_mu);
  return default_runtime != nullptr && default_runtime->is_shut_down();
}

void Runtime::ShutdownDefault() {
  if (InForkedChild()) return;  // the parent's runtime; nothing of it runs here
  Runtime* rt;
  {
    MutexLock lock(&default_mu);
    rt = default_runtime;
  }
  if (rt != nullptr) {
    rt->Shutdown();
#if PATHWAYS_WITH_HOSTS
    // The process is exiting: the sessions with the hosts end now, so that
    // none of their threads (heartbeats, a stream's end as the host
    // processes stop) calls back while the process's statics are destroyed.
    // (Shutdown alone leaves them open: finished results stay readable.)
    if (rt->remote_ != nullptr) {
      rt->remote_->links().Close(absl::CancelledError("the pathways runtime shut down (the process is exiting)"));
    }
    // So does the server external hosts registered with (the others'
    // launcher state is their launcher's, Python's, and stops with it).
    if (rt->cluster_->options().hosts == HostsMode::kExternal) rt->launcher_state_.reset();
#endif
  }
}

// Counts a call into the runtime for the length of a scope, and says whether
// the runtime still takes calls. With Shutdown(), the two sequentially
// consistent operations on each side (here: count, then read the flag; there:
// set the flag, then read the count) guarantee that either the call sees the
// flag or Shutdown() sees the call and waits for it.
class ActiveCall {
 public:
  explicit ActiveCall(Runtime* rt) : rt_(rt) { rt_->active_calls_.fetch_add(1); }
  ~ActiveCall() { rt_->active_calls_.fetch_sub(1); }
  absl::Status status() const {
    if (!rt_->shut_down_.load()) return absl::OkStatus();
    return absl::CancelledError("the pathways runtime has shut down (the interpreter is exiting)");
  }

 private:
  Runtime* rt_;
};

void Runtime::Shutdown() {
  // Held throughout, so a second caller returns only once the threads stop.
  MutexLock lock(&shutdown_mu_);
  if (shut_down_.exchange(true)) return;
  if (watchdog_ != nullptr) watchdog_->Stop();  // cancelled gangs are no hangs
  delays_->Hurry();  // simulated time of running gangs and modeled messages ends now
  stores_->NotifyMemoryWaiters();  // dispatches waiting for memory give up
  while (active_calls_.load() > 0) std::this_thread::sleep_for(std::chrono::microseconds(50));
#if PATHWAYS_WITH_HOSTS
  if (remote_ != nullptr) {
    // The same on the hosts: their parts that have not started are
    // cancelled, the running ones' simulated time ends. Parts running real
    // kernels get a bounded time to finish; runs whose hosts have not
    // answered by then fail here, so that nothing waits on them.
    remote_->Cancel(nullptr, "the pathways runtime shut down", /*end_simulated_time=*/true);
    if (!PollFor([this] { return remote_->Quiescent(); }, kRemoteShutdownWaitNs)) {
      remote_->Abandon(absl::CancelledError(absl::StrCat(
          "the pathways runtime shut down before the hosts finished this run (waited ",
          kRemoteShutdownWaitNs / 1'000'000'000, " s)")));
    }
    // A tenant ends its sessions now: its service frees what it held at
    // once, and none of their threads runs on while the process exits.
    if (service_ != nullptr) service_->Close(absl::CancelledError("the pathways runtime shut down"));
  }
#endif
  // Gangs still queued now run cancelled (microseconds each), in order.
  AwaitQuiescence();
  executor_->Stop();
  delays_->Stop();
}

absl::StatusOr<std::shared_ptr<ShardedBuffer>> Runtime::DevicePut(DType dtype, Dims dims, const void* data,
                                                                  const DeviceList* devices,
                                                                  SchedulingClient* client, Blocker* blocker) {
  ActiveCall call(this);
  PW_RETURN_IF_ERROR(call.status());
  if (client != nullptr && client->closed()) return ClosedClientError(*client);
  if (dims.empty() || dims[0] != devices->size()) {
    return absl::InvalidArgumentError(absl::StrCat("device_put over ", devices->size(),
                                                   " devices needs a leading axis of size ", devices->size(),
                                                   ", got shape ", DimsToString(dims)));
  }
  const MemoryRequest request{devices, ShardBytes(dtype, dims)};
  auto cancelled = [&] { return MemoryWaitCancelled(&shut_down_, client, "device_put"); };
  auto reservation = stores_->Reserve(absl::MakeConstSpan(&request, 1), blocker != nullptr ? blocker : Blocker::Plain(),
                                      cancelled, "device_put");
  if (!reservation.ok()) return reservation.status();
  BufferOwner owner{&*reservation, client != nullptr ? &client->memory() : &default_memory_,
                    device_put_memory_.get()};
#if PATHWAYS_WITH_HOSTS
  owner.remote = remote_.get();
#endif
  return CopyFromHost(stores_.get(), dtype, std::move(dims), data, devices, &stats_, owner);
}

absl::StatusOr<std::vector<std::shared_ptr<ShardedBuffer>>> Runtime::LoadShards(const std::string& database,
                                                                                absl::Span<const ShardsLoad> loads,
                                                                                SchedulingClient* client,
                                                                                Blocker* blocker) {
  ActiveCall call(this);
  PW_RETURN_IF_ERROR(call.status());
  if (client != nullptr && client->closed()) return ClosedClientError(*client);
#if PATHWAYS_WITH_HOSTS
  if (remote_ == nullptr) {
    return absl::FailedPreconditionError("load_shards: the hosts are in this process (they read nothing themselves)");
  }
  std::vector<MemoryRequest> requests;
  for (const ShardsLoad& load : loads) {
    if (load.devices == nullptr || load.dims.empty() || load.dims[0] != load.devices->size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "load_shards: a buffer of shape ", DimsToString(load.dims), " over ",
          load.devices == nullptr ? 0 : load.devices->size(), " devices (its leading axis must be their number)"));
    }
    requests.push_back(MemoryRequest{load.devices, ShardBytes(load.dtype, load.dims)});
  }
  auto cancelled = [&] { return MemoryWaitCancelled(&shut_down_, client, "restore"); };
  auto reservation = stores_->Reserve(requests, blocker != nullptr ? blocker : Blocker::Plain(), cancelled, "restore");
  if (!reservation.ok()) return reservation.status();
  // Labeled as device_put's: data that came from outside the programs.
  BufferOwner owner{&*reservation, client != nullptr ? &client->memory() : &default_memory_,
                    device_put_memory_.get()};
  owner.remote = remote_.get();
  std::vector<std::shared_ptr<ShardedBuffer>> buffers;
  std::vector<std::string> specs;
  for (const ShardsLoad& load : loads) {
    auto buffer = ShardedBuffer::Allocate(stores_.get(), load.dtype, load.dims, load.devices, owner);
    if (!buffer.ok()) return buffer.status();  // those made go, never sent
    buffers.push_back(*std::move(buffer));
    specs.push_back(load.spec_json);
  }
  absl::Status sent = remote_->LoadShards(database, buffers, specs);
  if (!sent.ok()) {
    ReadyList none;  // nobody has seen them
    for (const auto& b : buffers) b->SetError(sent, &none);
    return sent;
  }
  return buffers;
#else
  (void)database;
  (void)loads;
  (void)blocker;
  return absl::FailedPreconditionError("load_shards: this build has no host processes");
#endif
}

absl::StatusOr<std::vector<std::shared_ptr<ShardedBuffer>>> Runtime::Execute(const LoweredProgram& program,
                                                                             absl::Span<const ProgramArg> args,
                                                                             const ExecuteOptions& options) {
  ActiveCall call(this);
  PW_RETURN_IF_ERROR(call.status());
  if (options.client != nullptr && options.client->closed()) return ClosedClientError(*options.client);
  ExecuteOptions labeled = options;
  if (labeled.client_account == nullptr) {
    labeled.client_account = options.client != nullptr ? &options.client->memory() : &default_memory_;
  }
  // Lowered for the slices' mappings now (a remap re-lowers it).
  auto current = program.Current();
  if (!current.ok()) return current.status();
  return dispatcher_->Execute(**current, args, labeled);
}

void Runtime::CloseClient(SchedulingClient* client) {
  client->Close();
  // Its gangs waiting in the queues run cancelled; wake whoever waits for
  // memory on its behalf so the wait sees it.
  stores_->NotifyMemoryWaiters();
#if PATHWAYS_WITH_HOSTS
  // Its runs on the hosts too (their parts that have not started).
  if (remote_ != nullptr) {
    remote_->Cancel(client, absl::StrCat("its client '", client->name(), "' was closed"),
                    /*end_simulated_time=*/false);
  }
#endif
}

void Runtime::FailDevices(absl::Span<Device* const> devices) {
  bool any = false;
  for (Device* d : devices) any = d->MarkFailed() || any;
#if PATHWAYS_WITH_HOSTS
  if (remote_ != nullptr && any) remote_->FailDevices(devices);  // their work fails on the hosts too
#endif
  // Gangs on those devices in their simulated time finish now, failed
  // (the delay queue's hurry rule, set in Create()).
  if (any) delays_->ApplyHurryRule();
}

absl::Status Runtime::ReplaceHost(int host, const std::string& address) {
#if PATHWAYS_WITH_HOSTS
  if (remote_ != nullptr) return remote_->ReplaceHost(host, address);
#endif
  return absl::FailedPreconditionError(
      absl::StrCat("hosts=", HostsModeName(cluster_->options().hosts),
                   ": there is no host process to replace (the hosts run in this process)"));
}

std::vector<int64_t> Runtime::SubmissionMarks() {
  std::vector<int64_t> marks;
  marks.reserve(schedulers_.size());
  for (auto& s : schedulers_) marks.push_back(s->num_submitted());
#if PATHWAYS_WITH_HOSTS
  if (remote_ != nullptr) marks.push_back(remote_->SubmissionMark());  // after the islands' marks
#endif
  return marks;
}


bool Runtime::AwaitSubmittedBefore(const std::vector<int64_t>& marks, int64_t timeout_ns) {
  return PollFor(
      [&] {
        for (size_t i = 0; i < schedulers_.size(); ++i) {
          if (schedulers_[i]->MinSubmissionInFlight() < marks[i]) return false;
        }
#if PATHWAYS_WITH_HOSTS
        if (remote_ != nullptr && marks.size() > schedulers_.size() && !remote_->FinishedBefore(marks.back())) {
          return false;
        }
#endif
        return true;
      },
      timeout_ns);
}

void Runtime::AwaitSubmittedSoFar() { AwaitSubmittedBefore(SubmissionMarks(), kForever); }

bool Runtime::AwaitQuiescenceFor(int64_t timeout_ns) {
  return PollFor(
      [this] {
        for (auto& s : schedulers_) {
          if (s->num_in_flight() > 0) return false;
        }
#if PATHWAYS_WITH_HOSTS
        if (remote_ != nullptr && !remote_->Quiescent()) return false;
#endif
        return true;
      },
      timeout_ns);
}

void Runtime::AwaitQuiescence() { AwaitQuiescenceFor(kForever); }

}  // namespace pw
