// Binds the program IR (program_ir/program_ir.h), its lowering, and the
// parallel dispatcher's Execute: the dispatch path from Python.

#include "absl/strings/str_cat.h"
#include "csrc/bindings/registrations.h"
#include "csrc/bindings/sharded_buffer.h"
#include "csrc/bindings/status_casters.h"
#include "csrc/bindings/waiting.h"
#include "csrc/program_ir/lowering.h"
#include "pybind11/numpy.h"
#include "pybind11/stl.h"

namespace pw::bindings {
namespace py = pybind11;
namespace {

template <typename T>
std::shared_ptr<T> Mutable(std::shared_ptr<const T> p) {
  return std::const_pointer_cast<T>(std::move(p));
}

py::tuple ShapeTuple(const Dims& dims) {
  return py::tuple(py::cast(std::vector<int64_t>(dims.begin(), dims.end())));
}

// Runs `program` on Python arguments: ShardedBuffers or numpy arrays.
py::list Execute(const LoweredProgram& program, const py::sequence& args, bool sequential,
                 SchedulingClient* client) {
  ClientDispatch dispatch(client, "runs program '", program.ir().name());
  const size_t n = py::len(args);
  absl::InlinedVector<ProgramArg, 4> converted(n);
  absl::InlinedVector<py::array, 4> keep_alive;  // host data must live through dispatch
  size_t host_bytes = 0;
  for (size_t i = 0; i < n; ++i) {
    py::handle a = args[i];
    if (py::isinstance<PyShardedBuffer>(a)) {
      const auto& holder = a.cast<const PyShardedBuffer&>();
      if (holder.buffer == nullptr && holder.suspended != nullptr) {
        throw std::runtime_error(absl::StrCat("argument ", i, " of program '", program.ir().name(),
                                              "' is a ShardedBuffer ", TypeToString(holder.dtype, holder.dims),
                                              " of client '", holder.suspended->client,
                                              "', which is suspended: resume() the client first"));
      }
      if (holder.buffer == nullptr) {
        ThrowDeleted(absl::StrCat("argument ", i, " of program '", program.ir().name(), "' is a ShardedBuffer ",
                                  TypeToString(holder.dtype, holder.dims), " that has been deleted",
                                  holder.DeletedWhy()));
      }
      converted[i].buffer = holder.buffer;
      continue;
    }
    py::array array = py::array::ensure(a);
    if (!array) {
      throw py::type_error(absl::StrCat("argument ", i, " of program '", program.ir().name(),
                                        "' must be a ShardedBuffer or a numpy array"));
    }
    const std::string what = absl::StrCat("argument ", i, " of program '", program.ir().name(), "'");
    converted[i].dtype = FromNumpyDType(array.dtype(), what.c_str());
    array = py::array::ensure(array, py::array::c_style);
    converted[i].dims = Dims(array.shape(), array.shape() + array.ndim());
    converted[i].host_data = array.data();
    host_bytes += static_cast<size_t>(array.nbytes());
    keep_alive.push_back(std::move(array));
  }
  PyBlocker blocker;  // waits for device memory interruptibly
  ExecuteOptions options;
  options.client = client;
  options.blocker = &blocker;
  options.mode = sequential ? DispatchMode::kSequential : DispatchMode::kParallel;
  Runtime& rt = GetRuntime();
  auto execute = [&] { return rt.Execute(program, converted, options); };
  // Sequential dispatch waits for each node's inputs, and large host
  // arguments are copied in: both without the GIL (`keep_alive` holds the
  // arrays meanwhile).
  const bool release = sequential || host_bytes >= kReleaseGilBytes;
  absl::StatusOr<std::vector<std::shared_ptr<ShardedBuffer>>> dispatched = release ? WithoutGil(execute) : execute();
  blocker.RethrowIfInterrupted();
  auto outputs = ValueOrThrow(std::move(dispatched));
  py::list result(outputs.size());
  for (size_t i = 0; i < outputs.size(); ++i) {
    auto handle = std::make_shared<PyShardedBuffer>(std::move(outputs[i]));
    if (client != nullptr) RegisterClientHandle(client, handle);
    result[i] = py::cast(std::move(handle));
  }
  return result;
}

}  // namespace

void RegisterProgramIr(py::module_& m) {
  py::class_<LoweredProgram, std::shared_ptr<LoweredProgram>>(
      m, "LoweredProgram", "A program lowered to physical devices, with its transfers; runnable.")
      .def_property_readonly("num_compute_steps", &LoweredProgram::num_compute_steps)
      .def_property_readonly("num_transfer_steps", &LoweredProgram::num_transfer_steps)
      .def_property_readonly("name", [](const LoweredProgram& p) { return p.ir().name(); })
      .def("as_text", &LoweredProgram::ToText)
      .def("execute", &Execute, py::arg("args"), py::arg("sequential") = false,
           py::arg("client") = static_cast<SchedulingClient*>(nullptr))
      .def("__repr__", &LoweredProgram::ToText);

  py::class_<ProgramIr, std::shared_ptr<ProgramIr>>(m, "Program",
                                                    "A sharded dataflow program: one node per compiled-function call.")
      .def_property_readonly("name", &ProgramIr::name)
      .def_property_readonly("num_nodes", &ProgramIr::num_nodes)
      .def_property_readonly("num_args", &ProgramIr::num_args)
      .def("as_text", &ProgramIr::ToText)
      .def("lower", [](const std::shared_ptr<ProgramIr>& ir) { return Mutable(ValueOrThrow(Lower(ir))); })
      .def("__repr__", &ProgramIr::ToText);

  py::class_<ProgramBuilder>(m, "ProgramBuilder", "Records a program node by node (used by @pw.program).")
      .def(py::init<std::string>(), py::arg("name"))
      .def("add_arg", [](ProgramBuilder& b, const std::string& dtype, const std::vector<int64_t>& shape) {
        return ValueOrThrow(b.AddArg(ValueOrThrow(DTypeFromName(dtype)), Dims(shape.begin(), shape.end())));
      }, py::arg("dtype"), py::arg("shape"))
      .def("add_call", [](ProgramBuilder& b, const std::shared_ptr<CompiledFunction>& fn,
                          const std::vector<int>& inputs) { return ValueOrThrow(b.AddCall(fn, inputs)); },
           py::arg("fn"), py::arg("inputs"))
      .def("value_type", [](const ProgramBuilder& b, int v) {
        if (v < 0 || v >= b.num_values()) throw py::value_error(absl::StrCat("%", v, " is not a program value"));
        const ProgramValue& value = b.value(v);
        return py::make_tuple(ShapeTuple(value.dims), std::string(DTypeName(value.dtype)));
      })
      .def("build", [](ProgramBuilder& b, const std::vector<int>& outputs) {
        return Mutable(ValueOrThrow(b.Build(outputs)));
      }, py::arg("outputs"));
}

}  // namespace pw::bindings
