#ifndef PATHWAYS_HOST_HOST_RUNS_H_
#define PATHWAYS_HOST_HOST_RUNS_H_

// Client sessions and the ids they name (SessionId, SessionKey), runs as
// the hosts name them (RunKey), and the runs that are dead on this host
// (DeadRuns): refused here, or cancelled by the client (see "Refusals and
// cancellation" in host_executor.h), or of a session that ended here
// (HostExecutor::EndSession). The executor marks runs and sessions dead;
// its device threads and its transfers' threads (host_transfers.h) ask.
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

// A client's session on this host: the scope of every id the client names
// (device lists, functions, programs, buffers, gang tags). Two sessions may
// use the same id for different things.
using SessionId = uint64_t;

// The session of the client that configured the host (its owner: a client
// process, or a service, pathways-server, that owns the hosts). A service's
// tenants have ids of their own, the same on every host, which the owner's
// requests carry (wire::Request::session; see HostProcess); a request
// without one is the owner's own, this.
inline constexpr SessionId kOneSession = 0;

// An id as a session names it (a list, a function, a program, a buffer):
// how the executor's tables key what a client loads and makes.
struct SessionKey {
  SessionId session = kOneSession;
  uint64_t id = 0;
  friend bool operator==(const SessionKey&, const SessionKey&) = default;
  template <typename H>
  friend H AbslHashValue(H h, const SessionKey& k) {
    return H::combine(std::move(h), k.session, k.id);
  }
};

// A run as the hosts name it: the client session, the program, and the
// run's first buffer id (unique per run within a session).
struct RunKey {
  SessionId session = kOneSession;
  uint64_t program_id = 0;
  uint64_t first_buffer_id = 0;
  friend bool operator==(const RunKey&, const RunKey&) = default;
  template <typename H>
  friend H AbslHashValue(H h, const RunKey& k) {
    return H::combine(std::move(h), k.session, k.program_id, k.first_buffer_id);
  }
};

// The dead runs, and why; the last kMaxDeadRuns of them (a message for a
// run forgotten since would wait for its receive: the set is large enough
// that none is still on its way). And the sessions that ended here, the
// last kMaxEndedSessions of them: every run of one is dead, so that what
// other hosts still send for it is dropped, not waited for.
class DeadRuns {
 public:
  // OK unless the run is dead here (refused or cancelled, or its session
  // ended): then why. One atomic load while no run ever was.
  absl::Status DeadStatus(const RunKey& run) const;
  // OK unless `session` ended here: then why.
  absl::Status EndedStatus(SessionId session) const;
  // Whether one of `hosts` refused the dead run (it will join none of the
  // run's collectives).
  bool RefusedByAnyOf(const RunKey& run, absl::Span<const int> hosts) const;
  // Marks the run dead with `why` (the first reason stays) and `refuser`
  // (-1: none known) among the hosts that refused it; false if it was dead
  // already. The caller wakes whoever waits for the run's messages
  // (HostTransfers::WakeReceivers), who drop them from then on.
  // (A run of a session that ended is dead already.)
  bool MarkDead(const RunKey& run, const absl::Status& why, int refuser);
  // Marks every run of `session` dead with `why` (the first reason stays),
  // now and from now on, and forgets the session's runs marked one by one
  // (this covers them). The caller wakes the receivers, as for MarkDead.
  void EndSession(SessionId session, const absl::Status& why);

 private:
  static constexpr size_t kMaxDeadRuns = size_t{1} << 16;
  static constexpr size_t kMaxEndedSessions = size_t{1} << 16;
  struct DeadRun {
    absl::Status why;
    std::vector<int> refusers;  // hosts that refused it, as the client said
  };
  mutable Mutex mu_;
  absl::flat_hash_map<RunKey, DeadRun> runs_ ABSL_GUARDED_BY(mu_);
  std::deque<RunKey> order_ ABSL_GUARDED_BY(mu_);  // oldest first
  absl::flat_hash_map<SessionId, absl::Status> ended_ ABSL_GUARDED_BY(mu_);
  std::deque<SessionId> ended_order_ ABSL_GUARDED_BY(mu_);  // oldest first
  std::atomic<bool> any_{false};  // a run or a session was ever marked
};

}  // namespace pw

#endif  // PATHWAYS_HOST_HOST_RUNS_H_
