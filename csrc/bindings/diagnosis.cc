// Binds hang diagnosis (scheduler/diagnosis.h): pw.diagnose(), and the hang
// watchdog's reports, which become pw.HangWarning in a thread that waits.
// The watchdog's thread never calls Python: reports wait in its queue until
// a thread holding the GIL takes them here.

#include <optional>

#include "csrc/bindings/registrations.h"
#include "csrc/bindings/waiting.h"
#include "pybind11/stl.h"

namespace pw::bindings {
namespace py = pybind11;
using namespace pybind11::literals;

namespace {

py::list IdsOf(const DeviceList* list) {
  py::list ids;
  for (const Device* d : list->devices()) ids.append(d->id());
  return ids;
}

// A gang's names and state; with `running` for the gangs a waiting one
// waits behind or for.
py::dict GangDict(const GangRef& g, bool with_running) {
  py::dict d("island"_a = g.island, "id"_a = g.id, "program"_a = g.program, "node"_a = g.node,
             "client"_a = g.client, "state"_a = GangStateName(g.state));
  if (with_running) d["running"] = g.state == GangState::kRunning;
  return d;
}

// (gangs, islands, text): the arguments of pathways._diagnose.Diagnosis.
py::tuple ToPython(const Diagnosis& diagnosis) {
  py::list gangs;
  for (const WaitingGang& w : diagnosis.waiting) {
    py::dict g = GangDict(w.gang, /*with_running=*/false);
    g["devices"] = IdsOf(w.gang.devices);
    g["waited_seconds"] = static_cast<double>(w.waited_ns) / 1e9;
    py::list waiting_for;
    if (w.gang.state == GangState::kWaitingForAdmission) waiting_for.append("admission");
    if (!w.blocked_by.empty()) waiting_for.append("devices");
    if (!w.inputs.empty()) waiting_for.append("inputs");
    g["waiting_for"] = waiting_for;
    py::list blocked_by;
    for (const QueueHead& head : w.blocked_by) {
      py::dict b = GangDict(head.gang, /*with_running=*/true);
      b["devices"] = head.device_ids;  // this gang's devices whose queues it heads
      blocked_by.append(b);
    }
    g["blocked_by"] = blocked_by;
    py::list inputs;
    for (const PendingInput& in : w.inputs) {
      py::object producer = py::none();
      if (in.producer.has_value()) producer = GangDict(*in.producer, /*with_running=*/true);
      inputs.append(py::dict("index"_a = in.index, "type"_a = in.type, "devices"_a = IdsOf(in.devices),
                             "copy"_a = in.copy, "producer"_a = producer));
    }
    g["inputs"] = inputs;
    gangs.append(g);
  }
  py::list islands;
  for (const IslandCounts& c : diagnosis.islands) {
    islands.append(py::dict("island"_a = c.island, "running"_a = c.running, "queued"_a = c.queued,
                            "waiting_for_admission"_a = c.waiting_for_admission));
  }
  return py::make_tuple(gangs, islands, diagnosis.ToString());
}

// The default runtime's hang watchdog if it has a report queued; null if
// not, or if the runtime is not started, shut down or the parent's.
HangWatchdog* WatchdogWithReport() {
  Runtime* rt = StartedRuntime();
  HangWatchdog* watchdog = rt != nullptr ? rt->hang_watchdog() : nullptr;
  if (watchdog == nullptr || !watchdog->has_report() || rt->is_shut_down()) return nullptr;
  return watchdog;
}

}  // namespace

void SurfaceHangReports() {
  HangWatchdog* watchdog = WatchdogWithReport();
  if (watchdog == nullptr) return;
  py::object warn = py::module_::import("pathways._diagnose").attr("_warn_hang");
  const double threshold_s = static_cast<double>(watchdog->threshold_ns()) / 1e9;
  // One at a time: if a warning raises (a filter made it an error), the
  // reports after it stay queued for the next wait.
  while (std::optional<Diagnosis> report = watchdog->TakeReport()) warn(ToPython(*report), threshold_s);
}

void RegisterDiagnosis(py::module_& m) {
  m.def("diagnose", [] {
    Runtime& rt = GetRuntime();
    const Diagnosis diagnosis = WithoutGil([&] { return rt.Diagnose(); });
    return ToPython(diagnosis);
  });
  // For tests: whether a hang report waits to be issued (by the next wait).
  m.def("_has_hang_report", [] { return WatchdogWithReport() != nullptr; });
}

}  // namespace pw::bindings
