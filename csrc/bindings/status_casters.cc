#include "csrc/bindings/status_casters.h"

#include <string>

#include "csrc/base/error_kind.h"
#include "csrc/bindings/waiting.h"
#include "csrc/client/runtime.h"

namespace pw::bindings {
namespace py = pybind11;
namespace {

PyObject* pathways_error = nullptr;
PyObject* not_found_error = nullptr;
PyObject* resource_exhausted_error = nullptr;
PyObject* deleted_buffer_error = nullptr;
PyObject* device_failed_error = nullptr;
PyObject* host_lost_error = nullptr;

PyObject* NewException(py::module_& m, const char* name, PyObject* base, const char* doc) {
  const std::string qualified = std::string("pathways.") + name;
  PyObject* type = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, base, nullptr);
  if (type == nullptr) throw py::error_already_set();
  m.attr(name) = py::handle(type);
  return type;
}

// The exception type for `status`: its ErrorKind's if it has one, else its
// code's (the table in status_casters.h).
PyObject* ExceptionType(const absl::Status& status) {
  switch (GetErrorKind(status)) {
    case ErrorKind::kUnsupportedType:
      return PyExc_TypeError;
    case ErrorKind::kUnboundName:
      return PyExc_NameError;
    case ErrorKind::kHostLost:
      return host_lost_error;
    case ErrorKind::kNone:
      break;
  }
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
      return PyExc_ValueError;
    case absl::StatusCode::kNotFound:
      return not_found_error;
    case absl::StatusCode::kResourceExhausted:
      return resource_exhausted_error;
    case absl::StatusCode::kFailedPrecondition:
      return PyExc_RuntimeError;
    case absl::StatusCode::kUnimplemented:
      return PyExc_NotImplementedError;
    case absl::StatusCode::kUnavailable:
      return device_failed_error;
    default:
      return pathways_error;
  }
}

}  // namespace

void RegisterExceptions(py::module_& m) {
  pathways_error = NewException(m, "PathwaysError", PyExc_RuntimeError, "An error from the pathways runtime.");
  not_found_error = NewException(m, "NotFoundError", PyExc_ValueError,
                                 "A request named a device, device kind or object that does not exist.");
  resource_exhausted_error = NewException(m, "ResourceExhaustedError", pathways_error,
                                          "Device memory or devices ran out for a request.");
  device_failed_error = NewException(m, "DeviceFailedError", pathways_error,
                                     "A device (or the host holding it) failed under a computation or a buffer.");
  host_lost_error = NewException(m, "HostLostError", device_failed_error,
                                 "A host process died or could not be reached; its devices are gone with it.");
  deleted_buffer_error =
      NewException(m, "DeletedBufferError", PyExc_RuntimeError, "A ShardedBuffer was used after delete().");
}

void ThrowStatus(const absl::Status& status) {
  if (status.code() == absl::StatusCode::kCancelled && Runtime::DefaultIsShutDown()) ParkDaemonThreadAtExit();
  PyObject* type = ExceptionType(status);
  const std::string message(status.message());
  absl::StatusOr<Runtime*> runtime =
      (type == device_failed_error || type == host_lost_error) && Runtime::DefaultExists() &&
              !Runtime::DefaultIsShutDown()
          ? Runtime::Default()  // FailedPrecondition in a forked child
          : absl::StatusOr<Runtime*>(absl::FailedPreconditionError("none"));
  if (runtime.ok()) {
    // What is lost (paper §4.1; pw.elastic): the failed devices and the
    // slices with a virtual device on one, when the error is raised.
    Runtime* rt = *runtime;
    py::list failed, slices;
    for (const Device* d : rt->cluster().devices()) {
      if (d->failed()) failed.append(d->id());
    }
    for (const auto& s : rt->resource_manager().SlicesOnFailedDevices()) slices.append(s->id());
    py::object error = py::reinterpret_steal<py::object>(PyObject_CallFunction(type, "s", message.c_str()));
    if (!error) throw py::error_already_set();
    error.attr("failed_devices") = std::move(failed);
    error.attr("lost_slices") = std::move(slices);
    PyErr_SetObject(type, error.ptr());
    throw py::error_already_set();
  }
  PyErr_SetString(type, message.c_str());
  throw py::error_already_set();
}

void ThrowDeleted(const std::string& message) {
  PyErr_SetString(deleted_buffer_error, message.c_str());
  throw py::error_already_set();
}

}  // namespace pw::bindings
