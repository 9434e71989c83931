#include "csrc/host/host_runs.h"

#include <algorithm>

namespace pw {

absl::Status DeadRuns::DeadStatus(const RunKey& run) const {
  if (!any_.load(std::memory_order_acquire)) return absl::OkStatus();
  MutexLock lock(&mu_);
  auto it = runs_.find(run);
  return it == runs_.end() ? absl::OkStatus() : it->second.why;
}

bool DeadRuns::RefusedByAnyOf(const RunKey& run, absl::Span<const int> hosts) const {
  MutexLock lock(&mu_);
  auto it = runs_.find(run);
  if (it == runs_.end()) return false;
  for (int h : it->second.refusers) {
    if (std::find(hosts.begin(), hosts.end(), h) != hosts.end()) return true;
  }
  return false;
}

bool DeadRuns::MarkDead(const RunKey& run, const absl::Status& why, int refuser) {
  MutexLock lock(&mu_);
  auto [it, fresh] = runs_.try_emplace(run, DeadRun{why, {}});
  std::vector<int>& refusers = it->second.refusers;
  if (refuser >= 0 && std::find(refusers.begin(), refusers.end(), refuser) == refusers.end()) {
    refusers.push_back(refuser);
  }
  if (!fresh) return false;
  order_.push_back(run);
  if (order_.size() > kMaxDeadRuns) {
    runs_.erase(order_.front());
    order_.pop_front();
  }
  any_.store(true, std::memory_order_release);
  return true;
}

}  // namespace pw
