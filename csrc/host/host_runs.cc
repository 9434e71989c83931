#include "csrc/host/host_runs.h"

#include <algorithm>

namespace pw {

absl::Status DeadRuns::DeadStatus(const RunKey& run) const {
  if (!any_.load(std::memory_order_acquire)) return absl::OkStatus();
  MutexLock lock(&mu_);
  if (auto it = runs_.find(run); it != runs_.end()) return it->second.why;
  auto ended = ended_.find(run.session);
  return ended == ended_.end() ? absl::OkStatus() : ended->second;
}

absl::Status DeadRuns::EndedStatus(SessionId session) const {
  if (!any_.load(std::memory_order_acquire)) return absl::OkStatus();
  MutexLock lock(&mu_);
  auto it = ended_.find(session);
  return it == ended_.end() ? absl::OkStatus() : it->second;
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
  if (ended_.contains(run.session)) return false;
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

void DeadRuns::EndSession(SessionId session, const absl::Status& why) {
  MutexLock lock(&mu_);
  if (!ended_.try_emplace(session, why).second) return;
  ended_order_.push_back(session);
  if (ended_order_.size() > kMaxEndedSessions) {
    ended_.erase(ended_order_.front());
    ended_order_.pop_front();
  }
  absl::erase_if(runs_, [session](const auto& entry) { return entry.first.session == session; });
  std::erase_if(order_, [session](const RunKey& run) { return run.session == session; });
  any_.store(true, std::memory_order_release);
}

}  // namespace pw
