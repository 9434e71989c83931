#include "csrc/bindings/waiting.h"

#include <chrono>
#include <thread>

namespace pw::bindings {
namespace {
// Ctrl-C is noticed within this long; each slice costs one GIL round trip.
constexpr int64_t kSliceNs = 50'000'000;
}  // namespace

void WaitInterruptibly(absl::FunctionRef<bool(int64_t)> done_within) {
  while (true) {
    SurfaceHangReports();
    if (WithoutGil([&] { return done_within(kSliceNs); })) return;
    if (PyErr_CheckSignals() != 0) throw pybind11::error_already_set();
  }
}

bool PyBlocker::Block(absl::FunctionRef<bool(int64_t)> done_within) {
  if (!PyGILState_Check()) {
    // Inside WithoutGil: take the GIL between slices only to run the
    // signal handlers.
    while (!done_within(kSliceNs)) {
      const PyGILState_STATE gil = PyGILState_Ensure();
      const bool raised = PyErr_CheckSignals() != 0;
      if (raised) interrupted_.emplace();  // takes the pending exception
      PyGILState_Release(gil);
      if (raised) return false;
    }
    return true;
  }
  try {
    WaitInterruptibly(done_within);
    return true;
  } catch (pybind11::error_already_set& e) {
    interrupted_.emplace(std::move(e));
    return false;
  }
}

void PyBlocker::RethrowIfInterrupted() {
  if (!interrupted_.has_value()) return;
  pybind11::error_already_set e = std::move(*interrupted_);
  interrupted_.reset();
  throw e;
}

void ParkDaemonThreadAtExit() {
  namespace py = pybind11;
  if (!py::module_::import("threading").attr("current_thread")().attr("daemon").cast<bool>()) return;
  // Each slice ends by taking the GIL, which ends this thread once the
  // interpreter finalizes (cleanly: not from a destructor, see the header).
  while (true) WithoutGil([] { std::this_thread::sleep_for(std::chrono::milliseconds(50)); });
}

}  // namespace pw::bindings
