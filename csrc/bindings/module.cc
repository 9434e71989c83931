// pathways._core: the C++ runtime, bound for the Python package `pathways`.
// Each bound component registers itself from its own file.

#include "csrc/bindings/registrations.h"
#include "csrc/bindings/status_casters.h"

PYBIND11_MODULE(_core, m) {
  m.doc() = "The C++ core of pathways (private; use `import pathways`).";
  pw::bindings::RegisterExceptions(m);
  pw::bindings::RegisterRuntime(m);
  pw::bindings::RegisterShardedBuffer(m);
  pw::bindings::RegisterFunctionIr(m);
  pw::bindings::RegisterProgramIr(m);
  pw::bindings::RegisterDiagnosis(m);
  pw::bindings::RegisterHost(m);
}
