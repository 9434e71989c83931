#include "csrc/executor/timeline.h"

namespace pw {

void Timeline::Start() {
  MutexLock lock(&mu_);
  events_.clear();
  recording_.store(true, std::memory_order_relaxed);
}

std::vector<TimelineEvent> Timeline::Stop() {
  MutexLock lock(&mu_);
  recording_.store(false, std::memory_order_relaxed);
  return std::move(events_);
}

void Timeline::Record(TimelineEvent event) {
  MutexLock lock(&mu_);
  if (recording_.load(std::memory_order_relaxed)) events_.push_back(std::move(event));
}

}  // namespace pw
