#include "csrc/scheduler/diagnosis.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "csrc/scheduler/gang_scheduler.h"

namespace pw {
namespace {

// Per GangState: its name, and what a waiting gang in it is doing.
struct StateText {
  const char* name;
  const char* doing;
};
constexpr StateText kStateText[] = {
    {"waiting_for_admission", "waiting for admission (proportional share)"},
    {"queued", "queued behind other gangs"},
    {"holding_devices", "holds its devices, waiting for inputs"},
    {"running", "running"},
};
const StateText& TextOf(GangState state) { return kStateText[static_cast<int>(state)]; }

std::string InputLine(const PendingInput& in) {
  std::string line = absl::StrCat("input ", in.index, " (", in.type, " on ", in.devices->ToString(), ") not ready: ");
  if (in.producer.has_value()) {
    absl::StrAppend(&line, in.copy ? "a copy of the output of " : "produced by ", in.producer->ToString(), ", ",
                    GangStateName(in.producer->state));
  } else if (in.copy) {
    absl::StrAppend(&line, in.source_done ? "a copy in flight" : "a copy of an output whose producer is finishing");
  } else {
    absl::StrAppend(&line, "its producer is finishing");
  }
  return line;
}

}  // namespace

const char* GangStateName(GangState state) { return TextOf(state).name; }

std::string GangRef::ToString() const {
  std::string out;
  if (!node.empty()) absl::StrAppend(&out, "'", node, "'");
  if (!program.empty()) absl::StrAppend(&out, out.empty() ? "" : " of ", "program '", program, "'");
  absl::StrAppend(&out, out.empty() ? "" : ", ", "client '", client, "' (island ", island, ", gang #", id, ")");
  return out;
}

std::string Diagnosis::ToString() const {
  std::string out = absl::StrCat("pathways: ", waiting.size(), waiting.size() == 1 ? " gang" : " gangs",
                                 " waiting to start.");
  for (const IslandCounts& c : islands) {
    absl::StrAppend(&out, c.island == islands.front().island ? " " : "; ", "island ", c.island, ": ");
    if (c.running == 0 && c.queued == 0) {
      absl::StrAppend(&out, "idle");
      continue;
    }
    absl::StrAppend(&out, c.running, " running, ", c.queued, " queued");
    if (c.waiting_for_admission > 0) absl::StrAppend(&out, " (", c.waiting_for_admission, " not admitted)");
  }
  for (const WaitingGang& w : waiting) {
    absl::StrAppend(&out, "\n- ", w.gang.ToString(), " on ", w.gang.devices->ToString(),
                    absl::StrFormat(", waiting %.1f s: ", static_cast<double>(w.waited_ns) / 1e9),
                    TextOf(w.gang.state).doing);
    for (const QueueHead& head : w.blocked_by) {
      absl::StrAppend(&out, "\n    devices ", DeviceIdsToString(head.device_ids), ": queue headed by ",
                      head.gang.ToString(), ", ", GangStateName(head.gang.state));
    }
    for (const PendingInput& in : w.inputs) absl::StrAppend(&out, "\n    ", InputLine(in));
  }
  return out;
}

Diagnosis Diagnose(absl::Span<GangScheduler* const> schedulers, int64_t min_wait_ns, bool take) {
  Diagnosis d;
  for (GangScheduler* s : schedulers) s->Snapshot(min_wait_ns, take, &d);
  // Producers may be on any island (an input copied across islands).
  for (GangScheduler* s : schedulers) s->FindProducers(&d.waiting);
  for (WaitingGang& w : d.waiting) {
    for (PendingInput& in : w.inputs) {
      in.buffer.reset();
      in.source.reset();
    }
  }
  std::stable_sort(d.waiting.begin(), d.waiting.end(),
                   [](const WaitingGang& a, const WaitingGang& b) { return a.waited_ns > b.waited_ns; });
  return d;
}

}  // namespace pw
