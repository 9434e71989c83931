#include "csrc/bindings/status_casters.h"

#include <string>

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

PyObject* NewException(py::module_& m, const char* name, PyObject* base, const char* doc) {
  const std::string qualified = std::string("pathways.") + name;
  PyObject* type = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, base, nullptr);
  if (type == nullptr) throw py::error_already_set();
  m.attr(name) = py::handle(type);
  return type;
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
  deleted_buffer_error =
      NewException(m, "DeletedBufferError", PyExc_RuntimeError, "A ShardedBuffer was used after delete().");
}

void ThrowStatus(const absl::Status& status) {
  if (status.code() == absl::StatusCode::kCancelled && Runtime::DefaultIsShutDown()) ParkDaemonThreadAtExit();
  PyObject* type = pathways_error;
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
      type = PyExc_ValueError;
      break;
    case absl::StatusCode::kNotFound:
      type = not_found_error;
      break;
    case absl::StatusCode::kResourceExhausted:
      type = resource_exhausted_error;
      break;
    case absl::StatusCode::kFailedPrecondition:
      type = PyExc_RuntimeError;
      break;
    case absl::StatusCode::kUnimplemented:
      type = PyExc_NotImplementedError;
      break;
    case absl::StatusCode::kUnavailable:
      type = device_failed_error;
      break;
    default:
      break;
  }
  PyErr_SetString(type, std::string(status.message()).c_str());
  throw py::error_already_set();
}

void ThrowDeleted(const std::string& message) {
  PyErr_SetString(deleted_buffer_error, message.c_str());
  throw py::error_already_set();
}

}  // namespace pw::bindings
