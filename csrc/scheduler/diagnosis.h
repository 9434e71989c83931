#ifndef PATHWAYS_SCHEDULER_DIAGNOSIS_H_
#define PATHWAYS_SCHEDULER_DIAGNOSIS_H_

// Hang diagnosis: which gangs are enqueued but not running, and what each
// still waits for (issue 9). Taken on demand (pw.diagnose()) or by the hang
// watchdog, never on the dispatch path: each island's scheduler describes
// its gangs under its lock (GangScheduler::Snapshot), and Diagnose() joins
// the islands and names the producers of inputs that are not ready.
//
// A gang waits for up to three things:
//  - admission: under proportional share it is not in the island order yet;
//  - devices: another gang heads the queue of some of its devices (it is
//    named, with whether it is running);
//  - inputs: some input buffers are not ready (each is named with the gang
//    that produces it, when that gang is still in flight).

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "csrc/cluster/device_list.h"

namespace pw {

class GangScheduler;

// Where a gang is on its way to running.
enum class GangState : uint8_t {
  kWaitingForAdmission,  // not in the island order yet (proportional share)
  kQueued,               // ordered; another gang heads one of its devices' queues
  kHoldingDevices,       // at the head of all its queues, waiting for inputs
  kRunning,              // at the head of all its queues, inputs ready: running (or about to)
};
// "waiting_for_admission", "queued", "holding_devices", "running".
const char* GangStateName(GangState state);

// Names one gang. The strings are copies.
struct GangRef {
  int island = 0;
  int64_t id = 0;       // its submission number on its island
  std::string program;  // empty for a gang that is no program's node
  std::string node;     // the compiled function it runs
  std::string client;
  const DeviceList* devices = nullptr;
  GangState state = GangState::kQueued;

  // "'node' of program 'p', client 'c' (island 0, gang #5)".
  std::string ToString() const;
};

// An input of a waiting gang that is not ready yet.
struct PendingInput {
  int index = 0;                        // among the gang's inputs
  std::string type;                     // e.g. "f64[2]"
  const DeviceList* devices = nullptr;  // where it lives
  bool copy = false;                    // a transfer's destination (from another slice)
  bool source_done = false;             // for a copy: whether its source is ready
  // The gang in flight that produces it (for a copy: its source), if any.
  std::optional<GangRef> producer;
  // Identities for finding the producer; held only until Diagnose() returns,
  // so a Diagnosis keeps no buffer (nor its device memory) alive.
  std::shared_ptr<const void> buffer;
  std::shared_ptr<const void> source;  // for a copy: the buffer copied

  // The buffer whose producer this input waits for.
  const void* awaited() const { return copy && !source_done ? source.get() : buffer.get(); }
};

// The gang at the head of the queues of some of a waiting gang's devices.
struct QueueHead {
  GangRef gang;
  std::vector<int> device_ids;  // the waiting gang's devices whose queues it heads
};

// A gang that is enqueued but not running.
struct WaitingGang {
  GangRef gang;  // its state is never kRunning
  int64_t waited_ns = 0;            // since it was submitted
  std::vector<PendingInput> inputs;  // those not ready
  std::vector<QueueHead> blocked_by;
};

struct IslandCounts {
  int island = 0;
  int64_t running = 0;
  int64_t queued = 0;                 // in flight and not running (admitted or not)
  int64_t waiting_for_admission = 0;  // of those, not admitted yet
};

struct Diagnosis {
  std::vector<IslandCounts> islands;
  std::vector<WaitingGang> waiting;  // the longest wait first

  // Readable text: the counts, then each waiting gang and what it waits for.
  std::string ToString() const;
};

// Every island's waiting gangs with what they wait for (producers named
// across islands). Islands are read one after another, each under its
// scheduler's lock: consistent per island, not one cut across islands. With `min_wait_ns`, only gangs that have waited that long;
// with `take`, only gangs no earlier take reported, which are marked
// reported (the hang watchdog's report-once).
Diagnosis Diagnose(absl::Span<GangScheduler* const> schedulers, int64_t min_wait_ns = 0, bool take = false);

}  // namespace pw

#endif  // PATHWAYS_SCHEDULER_DIAGNOSIS_H_
