#include "csrc/executor/timeline.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace pw {

int64_t Timeline::Start() {
  MutexLock lock(&mu_);
  const int64_t session = next_session_++;
  sessions_[session] = first_event_ + static_cast<int64_t>(events_.size());
  recording_.store(true, std::memory_order_relaxed);
  return session;
}

absl::StatusOr<std::vector<TimelineEvent>> Timeline::Stop(int64_t session) {
  MutexLock lock(&mu_);
  auto it = sessions_.find(session);
  if (it == sessions_.end()) {
    return absl::NotFoundError(absl::StrCat("timeline session ", session, " is not recording"));
  }
  const int64_t first = it->second;
  sessions_.erase(it);
  std::vector<TimelineEvent> out(events_.begin() + (first - first_event_), events_.end());
  // Drop the events no open session wants.
  int64_t keep_from = first_event_ + static_cast<int64_t>(events_.size());
  for (const auto& [id, from] : sessions_) keep_from = std::min(keep_from, from);
  events_.erase(events_.begin(), events_.begin() + (keep_from - first_event_));
  first_event_ = keep_from;
  if (sessions_.empty()) recording_.store(false, std::memory_order_relaxed);
  return out;
}

void Timeline::Record(TimelineEvent event) {
  MutexLock lock(&mu_);
  if (!recording_.load(std::memory_order_relaxed)) return;
  if (event.source == nullptr && event.gang == 0) event.gang = ++next_gang_;
  events_.push_back(std::move(event));
}

}  // namespace pw
