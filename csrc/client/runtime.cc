#include "csrc/client/runtime.h"

#include <cstdlib>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "csrc/base/mutex.h"

namespace pw {
namespace {

Mutex default_mu;
Runtime* default_runtime ABSL_GUARDED_BY(default_mu) = nullptr;
TopologyOptions* default_options ABSL_GUARDED_BY(default_mu) = nullptr;

}  // namespace

absl::StatusOr<std::unique_ptr<Runtime>> Runtime::Create(const TopologyOptions& options) {
  auto cluster = Cluster::Create(options);
  if (!cluster.ok()) return cluster.status();
  auto rt = std::unique_ptr<Runtime>(new Runtime());
  rt->cluster_ = *std::move(cluster);
  rt->resource_manager_ = std::make_unique<ResourceManager>(rt->cluster_.get(), &rt->registry_);
  rt->stores_ = std::make_unique<ObjectStores>(rt->cluster_.get());
  std::vector<GangScheduler*> schedulers;
  for (Island* island : rt->cluster_->islands()) {
    rt->schedulers_.push_back(std::make_unique<GangScheduler>(island));
    schedulers.push_back(rt->schedulers_.back().get());
  }
  rt->delays_ = std::make_unique<DelayQueue>();
  rt->executor_ = std::make_unique<Executor>(rt->cluster_->options().num_executor_threads);
  rt->dispatcher_ = std::make_unique<ParallelDispatcher>(rt->stores_.get(), std::move(schedulers),
                                                         rt->executor_.get(), &rt->stats_,
                                                         GangServices{rt->delays_.get(), &rt->timeline_,
                                                                      rt->cluster_->options().control_latency_ns});
  return rt;
}

Runtime::~Runtime() {
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

void Runtime::SetSchedulingPolicy(SchedulingPolicy policy) {
  ReadyList ready;
  for (auto& s : schedulers_) s->SetPolicy(policy, &ready);
  executor_->Submit(ready);
}

absl::StatusOr<Runtime*> Runtime::Default() {
  MutexLock lock(&default_mu);
  if (default_runtime != nullptr) return default_runtime;
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
  default_runtime = rt->release();  // intentionally never destroyed
  return default_runtime;
}

absl::Status Runtime::ConfigureDefault(const TopologyOptions& options) {
  MutexLock lock(&default_mu);
  if (default_runtime != nullptr) {
    return absl::FailedPreconditionError(
        "the pathways runtime has already started; configure the topology before its first use");
  }
  auto check = Cluster::Create(options);
  if (!check.ok()) return check.status();
  delete default_options;
  default_options = new TopologyOptions(options);
  return absl::OkStatus();
}

bool Runtime::DefaultExists() {
  MutexLock lock(&default_mu);
  return default_runtime != nullptr;
}

void Runtime::ShutdownDefault() {
  Runtime* rt;
  {
    MutexLock lock(&default_mu);
    rt = default_runtime;
  }
  if (rt != nullptr) {
    rt->AwaitQuiescence();
    rt->executor_.reset();
    rt->delays_.reset();
  }
}

absl::StatusOr<std::shared_ptr<ShardedBuffer>> Runtime::DevicePut(DType dtype, Dims dims, const void* data,
                                                                  const DeviceList* devices) {
  return CopyFromHost(stores_.get(), dtype, std::move(dims), data, devices, &stats_);
}

void Runtime::AwaitSubmittedSoFar() {
  std::vector<int64_t> submitted;
  for (auto& s : schedulers_) submitted.push_back(s->num_submitted());
  for (size_t i = 0; i < schedulers_.size(); ++i) {
    while (schedulers_[i]->MinSubmissionInFlight() < submitted[i]) {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
}

void Runtime::AwaitQuiescence() {
  auto busy = [this] {
    for (auto& s : schedulers_) {
      if (s->num_in_flight() > 0) return true;
    }
    return false;
  };
  while (busy()) std::this_thread::sleep_for(std::chrono::microseconds(100));
}

}  // namespace pw
