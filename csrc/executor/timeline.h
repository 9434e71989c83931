#ifndef PATHWAYS_EXECUTOR_TIMELINE_H_
#define PATHWAYS_EXECUTOR_TIMELINE_H_

// What each device ran and when (paper Figure 9, Appendix D): one event per
// gang, naming its devices, start and end, client, program and node. Cheap
// enough to leave on in benchmarks: an event is recorded per gang, not per
// device (expanding to per-device tracks happens at export), and recording
// is off unless started.
//
// Thread-safe.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "csrc/base/mutex.h"
#include "csrc/cluster/device_list.h"

namespace pw {

struct TimelineEvent {
  const DeviceList* devices = nullptr;
  int64_t start_ns = 0;  // NowNanos() clock
  int64_t end_ns = 0;
  const std::string* client = nullptr;   // lives as long as the runtime
  const std::string* program = nullptr;  // kept alive by `owner`
  const std::string* node = nullptr;     // kept alive by `owner`
  std::shared_ptr<const void> owner;
};

class Timeline {
 public:
  // Starts (or restarts) recording, dropping earlier events.
  void Start();
  // Stops recording and returns the events recorded since Start().
  std::vector<TimelineEvent> Stop();
  bool recording() const { return recording_.load(std::memory_order_relaxed); }
  void Record(TimelineEvent event);

 private:
  std::atomic<bool> recording_{false};
  Mutex mu_;
  std::vector<TimelineEvent> events_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pw

#endif  // PATHWAYS_EXECUTOR_TIMELINE_H_
