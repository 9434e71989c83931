// Binds host/host_main.h: `python -m pathways.host` runs a host process.

#include <string>
#include <vector>

#include "csrc/bindings/registrations.h"
#include "csrc/bindings/status_casters.h"
#include "pybind11/stl.h"

#ifndef PATHWAYS_WITH_HOSTS
#define PATHWAYS_WITH_HOSTS 0
#endif
#if PATHWAYS_WITH_HOSTS
#include "csrc/host/host_main.h"
#endif

namespace pw::bindings {
namespace py = pybind11;

void RegisterHost(py::module_& m) {
  m.attr("has_host_processes") = py::bool_(PATHWAYS_WITH_HOSTS == 1);
  m.def(
      "run_host",
      [](const std::vector<std::string>& args) -> int {
#if PATHWAYS_WITH_HOSTS
        const HostMainOptions options = ValueOrThrow(ParseHostArgs(args));
        py::gil_scoped_release release;
        return RunHost(options);
#else
        throw std::runtime_error(
            "this build of pathways has no host processes: it was built without gRPC, protobuf or Gloo "
            "(on Debian: apt-get install libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev libgloo-dev, "
            "then reinstall pathways)");
#endif
      },
      py::arg("args"),
      "Runs a host process until it is told to stop (see `python -m pathways.host --help`); returns its exit code.");
}

}  // namespace pw::bindings
