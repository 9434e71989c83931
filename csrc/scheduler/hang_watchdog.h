#ifndef PATHWAYS_SCHEDULER_HANG_WATCHDOG_H_
#define PATHWAYS_SCHEDULER_HANG_WATCHDOG_H_

// The hang watchdog (issue 9): a thread that, once a period, takes from
// every island the gangs that have not started `threshold_ns` after their
// submission and were not reported before (Diagnose() with `take`; with
// host processes, the hosts' device queues too: RemoteCluster::Describe),
// and queues one report of them. Each gang is reported at most once. Nothing is
// called out of the thread: readers take the reports (the Python bindings
// turn them into warnings in a thread that holds the GIL).
//
// It costs nothing on the dispatch path: it reads each scheduler under its
// lock once a period (threshold / 4, from 10 ms to 1 s), work per gang in
// flight.
//
// Thread-safe. The schedulers must outlive the watchdog or Stop().

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <thread>
#include <vector>

#include "csrc/base/mutex.h"
#include "csrc/scheduler/diagnosis.h"

namespace pw {

class HangWatchdog {
 public:
  // Unread reports kept; later ones are dropped (and counted) until some are taken.
  static constexpr size_t kMaxQueuedReports = 64;

  // Where the watchdog looks: called once a period on its thread with the
  // threshold, it returns the gangs that have waited at least that long and
  // that no earlier call returned (each gang once).
  using Source = std::function<Diagnosis(int64_t threshold_ns)>;

  // Starts the thread; `threshold_ns` > 0. `source` must stay callable until
  // Stop() returns.
  HangWatchdog(Source source, int64_t threshold_ns);
  // Watching the islands' gang schedulers (Diagnose with `take`).
  HangWatchdog(std::vector<GangScheduler*> schedulers, int64_t threshold_ns);
  ~HangWatchdog();  // Stop()
  HangWatchdog(const HangWatchdog&) = delete;
  HangWatchdog& operator=(const HangWatchdog&) = delete;

  // Stops and joins the thread (promptly: it waits on a condition variable).
  // Idempotent; queued reports stay readable.
  void Stop();

  int64_t threshold_ns() const { return threshold_ns_; }
  // Whether a report is queued: one relaxed load, for polling.
  bool has_report() const { return num_queued_.load(std::memory_order_relaxed) > 0; }
  // The oldest queued report, or nullopt.
  std::optional<Diagnosis> TakeReport();
  // Reports dropped because kMaxQueuedReports were queued unread.
  int64_t dropped() const;

 private:
  void Loop();

  const Source source_;
  const int64_t threshold_ns_;
  mutable Mutex mu_;
  CondVar cv_;
  // Protects the stop flag and the queue of unread reports.
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<Diagnosis> queue_ ABSL_GUARDED_BY(mu_);
  int64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<int> num_queued_{0};
  Mutex join_mu_;  // serializes Stop()'s join
  std::thread thread_;
};

}  // namespace pw

#endif  // PATHWAYS_SCHEDULER_HANG_WATCHDOG_H_
