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

// The default runtime, started on first use; raises on a bad topology.
Runtime& GetRuntime();

}  // namespace pw::bindings

#endif  // PATHWAYS_BINDINGS_REGISTRATIONS_H_
