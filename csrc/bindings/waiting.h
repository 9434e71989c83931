#ifndef PATHWAYS_BINDINGS_WAITING_H_
#define PATHWAYS_BINDINGS_WAITING_H_

// How bound calls block: with the GIL released, interruptible, and safe at
// interpreter exit.
//
// The GIL is taken back by a plain call, never by a destructor. At
// interpreter exit, a daemon thread that takes the GIL is ended by
// pthread_exit, whose forced unwinding terminates the process ("terminate
// called without an active exception") when it passes a destructor, which
// is noexcept, such as py::gil_scoped_release's. Through plain frames it
// unwinds cleanly (pybind11 rethrows abi::__forced_unwind).

#include <cstddef>
#include <cstdint>
#include <exception>
#include <type_traits>
#include <utility>

#include <optional>

#include "absl/functional/function_ref.h"
#include "csrc/base/blocker.h"
#include "pybind11/pybind11.h"
#if defined(__GLIBCXX__)
#include <cxxabi.h>
#endif

namespace pw::bindings {

// Copies between host arrays and buffers of at least this size run without
// the GIL, so other Python threads go on meanwhile.
inline constexpr size_t kReleaseGilBytes = size_t{1} << 20;

// Runs `fn` with the GIL released and returns what it returns. `fn` must not
// touch Python objects.
template <typename F>
auto WithoutGil(F&& fn) -> decltype(fn()) {
  PyThreadState* state = PyEval_SaveThread();
  try {
    if constexpr (std::is_void_v<decltype(fn())>) {
      fn();
      PyEval_RestoreThread(state);
    } else {
      auto result = fn();
      PyEval_RestoreThread(state);
      return result;
    }
#if defined(__GLIBCXX__)
  } catch (abi::__forced_unwind&) {
    throw;  // the thread is being ended while taking the GIL back
#endif
  } catch (...) {
    PyEval_RestoreThread(state);
    throw;
  }
}

// Blocks until `done_within(timeout_ns)` returns true. It is called with the
// GIL released and should wait up to `timeout_ns` for its condition; between
// calls the GIL is taken and Python's signal handlers run, so Ctrl-C raises
// KeyboardInterrupt (or whatever a handler raises) within one slice (50 ms).
// Before each slice, the hang watchdog's reports are surfaced
// (SurfaceHangReports), so a wait that hangs reports why.
// `done_within` must not throw or touch Python objects.
void WaitInterruptibly(absl::FunctionRef<bool(int64_t)> done_within);

// The Blocker (base/blocker.h) that bound calls hand to the core. Called
// with the GIL held, it waits as WaitInterruptibly() does; when a signal
// handler raises (Ctrl-C), it gives up and keeps the exception, which
// RethrowIfInterrupted() raises once the core call has returned (the core
// unwinds by status, never by a Python exception). Called without the GIL
// (inside WithoutGil), it takes the GIL between slices only to run the
// signal handlers.
class PyBlocker final : public Blocker {
 public:
  bool Block(absl::FunctionRef<bool(int64_t)> done_within) override;
  // With the GIL held: raises the exception that made Block() give up.
  void RethrowIfInterrupted();

 private:
  std::optional<pybind11::error_already_set> interrupted_;
};

// Issues a pw.HangWarning for each report the default runtime's hang
// watchdog has queued (diagnosis.cc); a warnings filter may make it raise.
// With the GIL held. Costs one atomic load when there is none.
void SurfaceHangReports();

// Called before raising the default runtime's shutdown error: in a daemon
// thread (only those outlive the start of interpreter exit) it waits until
// the interpreter ends the thread, as Python 3.14 does with daemon threads at
// exit, rather than raise a traceback out of a thread that is about to die.
// Returns at once in any other thread.
void ParkDaemonThreadAtExit();

}  // namespace pw::bindings

#endif  // PATHWAYS_BINDINGS_WAITING_H_
