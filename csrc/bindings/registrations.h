#ifndef PATHWAYS_BINDINGS_REGISTRATIONS_H_
#define PATHWAYS_BINDINGS_REGISTRATIONS_H_

#include "absl/status/statusor.h"
#include "csrc/client/runtime.h"
#include "pybind11/pybind11.h"

namespace pw::bindings {

void RegisterRuntime(pybind11::module_& m);        // runtime.cc: topology, devices, slices, stats
void RegisterShardedBuffer(pybind11::module_& m);  // sharded_buffer.cc: ShardedBuffer, device_put
void RegisterFunctionIr(pybind11::module_& m);     // function_ir.cc: FunctionBuilder, compile
void RegisterProgramIr(pybind11::module_& m);      // program_ir.cc: ProgramBuilder, lowering, execute
void RegisterDiagnosis(pybind11::module_& m);      // diagnosis.cc: diagnose
void RegisterHost(pybind11::module_& m);           // host.cc: a host process's entry point

// The default runtime, started on first use; raises on a bad topology.
Runtime& GetRuntime();
// The default runtime if a call has started it (never in a forked child),
// else null; does not start it.
Runtime* StartedRuntime();

}  // namespace pw::bindings

#endif  // PATHWAYS_BINDINGS_REGISTRATIONS_H_
