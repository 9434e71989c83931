#ifndef PATHWAYS_HOST_HOST_RUNS_H_
#define PATHWAYS_HOST_HOST_RUNS_H_

// Runs as the hosts name them (RunKey), and the runs that are dead on this
// host (DeadRuns): refused here, or cancelled by the client (see "Refusals
// and cancellation" in host_executor.h). The executor marks runs dead; its
// device threads and its transfers' threads (host_transfers.h) ask.
//
// Thread-safe. DeadRuns' lock is a leaf: it is taken under a peer's lock
// (HostTransfers' receiving thread) and never holds another.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "csrc/base/mutex.h"

namespace pw {

// A run as the hosts name it: the client session (0: the one client of
// today; several clients would each get theirs), the program, and the
// run's first buffer id (unique per run within a session).
struct RunKey {
  uint64_t session = 0;
  uint64_t program_id = 0;
  uint64_t first_buffer_id = 0;
  friend bool operator==(const RunKey&, const RunKey&) = default;
  template <typename H>
  friend H AbslHashValue(H h, const RunKey& k) {
    return H::combine(std::move(h), k.session, k.program_id, k.first_buffer_id);
  }
};

// The session of every run today: the one client that configured this
// host. Several clients on one set of hosts would each get theirs (from
// their control session), and the ids they choose would count per session.
inline constexpr uint64_t kOneSession = 0;

// The dead runs, and why; the last kMaxDeadRuns of them (a message for a
// run forgotten since would wait for its receive: the set is large enough
// that none is still on its way).
class DeadRuns {
 public:
  // OK unless the run is dead here (refused or cancelled): then why. One
  // atomic load while no run ever was.
  absl::Status DeadStatus(const RunKey& run) const;
  // Whether one of `hosts` refused the dead run (it will join none of the
  // run's collectives).
  bool RefusedByAnyOf(const RunKey& run, absl::Span<const int> hosts) const;
  // Marks the run dead with `why` (the first reason stays) and `refuser`
  // (-1: none known) among the hosts that refused it; false if it was dead
  // already. The caller wakes whoever waits for the run's messages
  // (HostTransfers::WakeReceivers), who drop them from then on.
  bool MarkDead(const RunKey& run, const absl::Status& why, int refuser);

 private:
  static constexpr size_t kMaxDeadRuns = size_t{1} << 16;
  struct DeadRun {
    absl::Status why;
    std::vector<int> refusers;  // hosts that refused it, as the client said
  };
  mutable Mutex mu_;
  absl::flat_hash_map<RunKey, DeadRun> runs_ ABSL_GUARDED_BY(mu_);
  std::deque<RunKey> order_ ABSL_GUARDED_BY(mu_);  // oldest first
  std::atomic<bool> any_{false};
};

}  // namespace pw

#endif  // PATHWAYS_HOST_HOST_RUNS_H_
