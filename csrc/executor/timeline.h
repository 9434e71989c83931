#ifndef PATHWAYS_EXECUTOR_TIMELINE_H_
#define PATHWAYS_EXECUTOR_TIMELINE_H_

// What each device ran and when (paper Figure 9, Appendix D): one event per
// gang, naming its devices, start and end, client, program and node; and one
// per transfer between slices, naming its source and destination devices,
// link and bytes. Cheap enough to leave on in benchmarks: an event is
// recorded per gang or transfer, not per device (expanding to per-device
// tracks happens at export), and recording is off unless started.
//
// Thread-safe.

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "csrc/base/mutex.h"
#include "csrc/cluster/device_list.h"

namespace pw {

struct TimelineEvent {
  const DeviceList* devices = nullptr;  // a gang's; a transfer's destination
  int64_t start_ns = 0;  // NowNanos() clock
  int64_t end_ns = 0;
  // A gang's (null for a transfer):
  const std::string* client = nullptr;   // lives as long as the runtime
  const std::string* program = nullptr;  // kept alive by `owner`
  const std::string* node = nullptr;     // kept alive by `owner`
  std::shared_ptr<const void> owner;
  // Which gang: the same for every event of one gang, and for no other.
  // With host processes a gang spanning hosts is recorded once per host (its
  // part there, with that host's start and end), so it is how they group. 0:
  // Record numbers the event as a gang of its own (gangs run in process).
  int64_t gang = 0;
  // A transfer's (`source` null for a gang): from when it took its links
  // (or began its copy) until its destination was ready.
  const DeviceList* source = nullptr;
  absl::string_view link = "";  // LinkKindName: "ici" or "dcn", a literal
  int64_t bytes = 0;       // over all shards
};

// Recording happens in sessions, which may overlap (nested scopes, several
// threads): each session gets every event recorded while it is open, and
// events are kept only while a session that wants them is open.
class Timeline {
 public:
  // Opens a recording session; returns its id for Stop().
  int64_t Start();
  // Closes session `session` and returns the events recorded since its
  // Start(). NotFound if it is not open.
  absl::StatusOr<std::vector<TimelineEvent>> Stop(int64_t session);
  bool recording() const { return recording_.load(std::memory_order_relaxed); }
  // Keeps `event` for the open sessions; a gang's event with `gang` 0 gets a
  // number of its own (positive).
  void Record(TimelineEvent event);

 private:
  std::atomic<bool> recording_{false};
  Mutex mu_;
  // events_[i] is the event recorded (first_event_ + i)-th since construction.
  std::deque<TimelineEvent> events_ ABSL_GUARDED_BY(mu_);
  int64_t first_event_ ABSL_GUARDED_BY(mu_) = 0;
  // Open sessions: id -> number of the first event it wants.
  absl::flat_hash_map<int64_t, int64_t> sessions_ ABSL_GUARDED_BY(mu_);
  int64_t next_session_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t next_gang_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace pw

#endif  // PATHWAYS_EXECUTOR_TIMELINE_H_
