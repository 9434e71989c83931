// Binds function_ir/function_ir.h (tracing target of pw.pmap) and compiling
// a function onto virtual devices.

#include "absl/strings/str_cat.h"
#include "csrc/bindings/registrations.h"
#include "csrc/bindings/sharded_buffer.h"
#include "csrc/bindings/status_casters.h"
#include "csrc/codegen/native_compiler.h"
#include "csrc/kernels/function_executable.h"
#include "csrc/program_ir/program_ir.h"
#include "pybind11/numpy.h"
#include "pybind11/stl.h"

#include <optional>

namespace pw::bindings {
namespace py = pybind11;
namespace {

Dims ToDims(const std::vector<int64_t>& shape) { return Dims(shape.begin(), shape.end()); }

// RuntimeError (FailedPrecondition) for a builder that Build emptied: its
// values are gone, and reading them must not touch freed memory.
void ThrowIfBuilt(const FunctionBuilder& b, absl::string_view what) {
  if (b.built()) ThrowIfError(absl::FailedPreconditionError(absl::StrCat(what, ": builder already built")));
}

py::tuple ShapeTuple(const Dims& dims) {
  return py::tuple(py::cast(std::vector<int64_t>(dims.begin(), dims.end())));
}

// The op named `op` among those `is_kind` accepts (by the registry's
// names); ValueError lists them otherwise.
OpKind KindByName(const std::string& op, bool (*is_kind)(OpKind), const char* what) {
  if (std::optional<OpKind> kind = OpKindFromName(op); kind && is_kind(*kind)) return *kind;
  std::string known;
  for (const OpInfo& info : kOpRegistry) {
    if (is_kind(info.kind)) absl::StrAppend(&known, known.empty() ? "" : ", ", info.name);
  }
  throw py::value_error(absl::StrCat("unknown ", what, " op '", op, "'; known: ", known));
}

bool IsPcollective(OpKind kind) {
  return kind == OpKind::kPmean || kind == OpKind::kPmax || kind == OpKind::kPmin;
}

absl::string_view OpClassName(OpClass c) {
  switch (c) {
    case OpClass::kSource: return "source";
    case OpClass::kElementwise: return "elementwise";
    case OpClass::kSimulated: return "simulated";
    case OpClass::kReduction: return "reduction";
    case OpClass::kDataMovement: return "data_movement";
    case OpClass::kIndexing: return "indexing";
    case OpClass::kContraction: return "contraction";
    case OpClass::kCollective: return "collective";
    case OpClass::kControl: return "control";
    case OpClass::kLinalg: return "linalg";
  }
  return "unknown";
}

absl::string_view TypeRuleName(TypeRule r) {
  switch (r) {
    case TypeRule::kArithmetic: return "arithmetic";
    case TypeRule::kComparison: return "comparison";
    case TypeRule::kBitwise: return "bitwise";
    case TypeRule::kShift: return "shift";
    case TypeRule::kNumeric: return "numeric";
    case TypeRule::kFloating: return "floating";
    case TypeRule::kInvert: return "invert";
    case TypeRule::kSame: return "same";
    case TypeRule::kIndices: return "indices";
    case TypeRule::kOwn: return "own";
  }
  return "unknown";
}

// The combiner named `name` ("add", "mul", "max", "min", "set"), or
// ValueError naming the op and what it takes.
Combiner CombinerByName(const std::string& name, const char* op, bool with_set) {
  for (Combiner c : {Combiner::kAdd, Combiner::kMul, Combiner::kMax, Combiner::kMin, Combiner::kSet}) {
    if ((with_set || c != Combiner::kSet) && CombinerName(c) == name) return c;
  }
  throw py::value_error(absl::StrCat("unknown ", op, " combiner '", name, "'; known: add, mul, max, min",
                                     with_set ? ", set" : ""));
}

// Holder for the immutable IR objects (pybind11 wants non-const holders).
template <typename T>
std::shared_ptr<T> Mutable(std::shared_ptr<const T> p) {
  return std::const_pointer_cast<T>(std::move(p));
}

}  // namespace

void RegisterFunctionIr(py::module_& m) {
  m.def(
      "wait_for_native_kernels",
      [] {
        py::gil_scoped_release release;
        codegen::NativeCompiler::Default().WaitIdle();
      },
      "Blocks until the native code of every compiled function that has run often enough\n"
      "to be compiled (PATHWAYS_NATIVE_AFTER_RUNS) is loaded or has failed to build.");
  m.def(
      "native_kernel_stats",
      [] {
        const codegen::NativeCompiler& c = codegen::NativeCompiler::Default();
        const auto s = c.stats();
        py::dict d;
        d["enabled"] = c.enabled();
        d["compiled"] = s.compiled;
        d["cache_hits"] = s.cache_hits;
        d["rebuilt"] = s.rebuilt;
        d["failed"] = s.failed;
        d["cache_dir"] = c.options().cache_dir;
        return d;
      },
      "Counts of the native compiler (compiled, cache_hits, rebuilt, failed), whether it is\n"
      "on, and its cache directory.");
  m.def("op_registry", [] {
    py::list rows;
    for (const OpInfo& info : kOpRegistry) {
      rows.append(py::make_tuple(std::string(info.name), info.arity,
                                 std::string(OpClassName(info.op_class)),
                                 std::string(TypeRuleName(info.type_rule))));
    }
    return rows;
  }, "The op registry (csrc/function_ir/op_registry.h), in enum order: one "
     "(name, arity, op_class, type_rule) tuple per op; arity -1 is variadic.");
  py::class_<FunctionIr, std::shared_ptr<FunctionIr>>(m, "Function", "A traced compiled function (one shard's IR).")
      .def_property_readonly("name", &FunctionIr::name)
      .def_property_readonly("axis_name", &FunctionIr::axis_name)
      .def_property_readonly("num_params", &FunctionIr::num_params)
      .def_property_readonly("num_outputs", &FunctionIr::num_outputs)
      .def_property_readonly("simulated_microseconds",
                             [](const FunctionIr& f) { return f.simulated_ns() / 1000.0; })
      .def_property_readonly("nesting_depth", &FunctionIr::nesting_depth,
                             "How deeply loops nest (0: no scan or while).")
      .def("as_text", &FunctionIr::ToText)
      .def("__repr__", &FunctionIr::ToText);

  py::class_<FunctionBuilder>(m, "FunctionBuilder", "Records one shard's computation op by op.")
      .def(py::init<std::string, std::string>(), py::arg("name"), py::arg("axis_name"))
      .def("parameter", [](FunctionBuilder& b, const std::string& dtype, const std::vector<int64_t>& shape) {
        ThrowIfBuilt(b, "parameter");
        return b.Parameter(ValueOrThrow(DTypeFromName(dtype)), ToDims(shape));
      }, py::arg("dtype"), py::arg("shape"))
      .def("constant", [](FunctionBuilder& b, py::array array) {
        const DType dtype = FromNumpyDType(array.dtype(), "a constant");
        py::array c = py::array::ensure(array, py::array::c_style | py::array::forcecast);
        const auto* bytes = static_cast<const uint8_t*>(c.data());
        return ValueOrThrow(b.Constant(dtype, Dims(c.shape(), c.shape() + c.ndim()),
                                       absl::MakeConstSpan(bytes, static_cast<size_t>(c.nbytes()))));
      }, py::arg("array"))
      .def("convert", [](FunctionBuilder& b, int32_t x, const std::string& dtype) {
        return ValueOrThrow(b.Convert(x, ValueOrThrow(DTypeFromName(dtype))));
      })
      .def("bitcast_convert_type", [](FunctionBuilder& b, int32_t x, const std::string& dtype) {
        return ValueOrThrow(b.BitcastConvert(x, ValueOrThrow(DTypeFromName(dtype))));
      }, py::arg("x"), py::arg("dtype"))
      .def("binary", [](FunctionBuilder& b, const std::string& op, int32_t x, int32_t y) {
        return ValueOrThrow(b.Binary(KindByName(op, IsBinaryOp, "binary"), x, y));
      }, py::arg("op"), py::arg("a"), py::arg("b"))
      .def("unary", [](FunctionBuilder& b, const std::string& op, int32_t x) {
        return ValueOrThrow(b.Unary(KindByName(op, IsUnaryOp, "unary"), x));
      }, py::arg("op"), py::arg("x"))
      .def("select", [](FunctionBuilder& b, int32_t cond, int32_t x, int32_t y) {
        return ValueOrThrow(b.Select(cond, x, y));
      }, py::arg("cond"), py::arg("x"), py::arg("y"))
      .def("neg", [](FunctionBuilder& b, int32_t x) { return ValueOrThrow(b.Unary(OpKind::kNeg, x)); })
      .def("psum", [](FunctionBuilder& b, int32_t x, const std::string& axis) {
        return ValueOrThrow(b.Psum(x, axis));
      }, py::arg("x"), py::arg("axis_name"))
      .def("reduce", [](FunctionBuilder& b, const std::string& op, int32_t x,
                        std::optional<std::vector<int64_t>> axes, bool keepdims) {
        ReduceKind kind;
        if (op == "sum") kind = ReduceKind::kSum;
        else if (op == "mean") kind = ReduceKind::kMean;
        else if (op == "max") kind = ReduceKind::kMax;
        else if (op == "min") kind = ReduceKind::kMin;
        else if (op == "argmax") kind = ReduceKind::kArgmax;
        else throw py::value_error(absl::StrCat("unknown reduction '", op,
                                                "'; known: sum, mean, max, min, argmax"));
        return ValueOrThrow(b.Reduce(kind, x, axes ? &*axes : nullptr, keepdims));
      }, py::arg("op"), py::arg("x"), py::arg("axes"), py::arg("keepdims"))
      .def("pcollective", [](FunctionBuilder& b, const std::string& op, int32_t x,
                             const std::string& axis) {
        return ValueOrThrow(b.Pcollective(KindByName(op, IsPcollective, "collective"), x, axis));
      }, py::arg("op"), py::arg("x"), py::arg("axis_name"))
      .def("axis_index", [](FunctionBuilder& b, const std::string& axis) {
        return ValueOrThrow(b.AxisIndex(axis));
      }, py::arg("axis_name"))
      .def("set_axis_size", [](FunctionBuilder& b, int64_t n) { ThrowIfError(b.SetAxisSize(n)); },
           py::arg("n"))
      .def("all_gather", [](FunctionBuilder& b, int32_t x, const std::string& axis, int64_t a) {
        return ValueOrThrow(b.AllGather(x, axis, a));
      }, py::arg("x"), py::arg("axis_name"), py::arg("axis"))
      .def("ppermute", [](FunctionBuilder& b, int32_t x, const std::string& axis,
                          const std::vector<std::pair<int64_t, int64_t>>& perm) {
        return ValueOrThrow(b.Ppermute(x, axis, perm));
      }, py::arg("x"), py::arg("axis_name"), py::arg("perm"))
      .def("copy", [](FunctionBuilder& b, int32_t x) { return ValueOrThrow(b.Copy(x)); },
           py::arg("x"))
      .def("reshape", [](FunctionBuilder& b, int32_t x, const std::vector<int64_t>& shape) {
        return ValueOrThrow(b.Reshape(x, ToDims(shape)));
      }, py::arg("x"), py::arg("shape"))
      .def("broadcast_to", [](FunctionBuilder& b, int32_t x, const std::vector<int64_t>& shape) {
        return ValueOrThrow(b.BroadcastTo(x, ToDims(shape)));
      }, py::arg("x"), py::arg("shape"))
      .def("transpose", [](FunctionBuilder& b, int32_t x, const std::vector<int64_t>& perm) {
        return ValueOrThrow(b.Transpose(x, perm));
      }, py::arg("x"), py::arg("perm"))
      .def("slice", [](FunctionBuilder& b, int32_t x, const std::vector<int64_t>& start,
                       const std::vector<int64_t>& limit, const std::vector<int64_t>& step) {
        return ValueOrThrow(b.Slice(x, start, limit, step));
      }, py::arg("x"), py::arg("start"), py::arg("limit"), py::arg("step"))
      .def("rev", [](FunctionBuilder& b, int32_t x, const std::vector<int64_t>& axes) {
        return ValueOrThrow(b.Rev(x, axes));
      }, py::arg("x"), py::arg("axes"))
      .def("pad", [](FunctionBuilder& b, int32_t x, const std::vector<int64_t>& lo,
                     const std::vector<int64_t>& hi, const std::vector<int64_t>& interior) {
        return ValueOrThrow(b.Pad(x, lo, hi, interior));
      }, py::arg("x"), py::arg("lo"), py::arg("hi"), py::arg("interior"))
      .def("concatenate", [](FunctionBuilder& b, const std::vector<int32_t>& xs, int64_t axis) {
        return ValueOrThrow(b.Concatenate(xs, axis));
      }, py::arg("xs"), py::arg("axis"))
      .def("take", [](FunctionBuilder& b, int32_t x, int32_t indices, int64_t axis) {
        return ValueOrThrow(b.Take(x, indices, axis));
      }, py::arg("x"), py::arg("indices"), py::arg("axis"))
      .def("scatter", [](FunctionBuilder& b, const std::string& combiner, int32_t operand,
                         int32_t indices, int32_t updates, int64_t axis, int64_t size) {
        return ValueOrThrow(b.Scatter(CombinerByName(combiner, "scatter", true), operand, indices,
                                      updates, axis, size));
      }, py::arg("combiner"), py::arg("operand"), py::arg("indices"), py::arg("updates"),
         py::arg("axis"), py::arg("size"))
      .def("scatter_add", [](FunctionBuilder& b, int32_t updates, int32_t indices, int64_t axis,
                             int64_t size) {
        return ValueOrThrow(b.ScatterAdd(updates, indices, axis, size));
      }, py::arg("updates"), py::arg("indices"), py::arg("axis"), py::arg("size"))
      .def("top_k", [](FunctionBuilder& b, int32_t x, int64_t k) {
        return ValueOrThrow(b.TopK(x, k));
      }, py::arg("x"), py::arg("k"))
      .def("sort", [](FunctionBuilder& b, int32_t x, bool descending) {
        return ValueOrThrow(b.Sort(x, descending));
      }, py::arg("x"), py::arg("descending"))
      .def("cumulative", [](FunctionBuilder& b, const std::string& combiner, int32_t x,
                            int64_t axis, bool reverse) {
        return ValueOrThrow(b.Cumulative(CombinerByName(combiner, "cumulative", false), x, axis,
                                         reverse));
      }, py::arg("combiner"), py::arg("x"), py::arg("axis"), py::arg("reverse"))
      .def("matmul", [](FunctionBuilder& b, int32_t x, int32_t y) {
        return ValueOrThrow(b.Matmul(x, y));
      }, py::arg("a"), py::arg("b"))
      .def("all_to_all", [](FunctionBuilder& b, int32_t x, const std::string& axis,
                            int64_t split_axis, int64_t concat_axis) {
        return ValueOrThrow(b.AllToAll(x, axis, split_axis, concat_axis));
      }, py::arg("x"), py::arg("axis_name"), py::arg("split_axis"), py::arg("concat_axis"))
      .def("psum_scatter", [](FunctionBuilder& b, int32_t x, const std::string& axis,
                              int64_t scatter_dimension) {
        return ValueOrThrow(b.PsumScatter(x, axis, scatter_dimension));
      }, py::arg("x"), py::arg("axis_name"), py::arg("scatter_dimension"))
      .def("simulated_compute", [](FunctionBuilder& b, int32_t x, double microseconds) {
        return ValueOrThrow(b.SimulatedComputeMicros(x, microseconds));
      }, py::arg("x"), py::arg("microseconds"))
      .def("scan", [](FunctionBuilder& b, std::shared_ptr<FunctionIr> body,
                      const std::vector<int32_t>& operands, int32_t num_carries, int32_t num_xs,
                      int64_t length, bool reverse) {
        ThrowIfBuilt(b, "scan");
        return ValueOrThrow(b.ScanResults(std::move(body), operands, num_carries, num_xs, length,
                                          reverse));
      }, py::arg("body"), py::arg("operands"), py::arg("num_carries"), py::arg("num_xs"),
         py::arg("length"), py::arg("reverse"),
         "A scan of `body` (function_ir.h, \"Loops\"); returns the values of its results: "
         "the final carries, then the stacked ys.")
      .def("while_loop", [](FunctionBuilder& b, std::shared_ptr<FunctionIr> cond,
                            std::shared_ptr<FunctionIr> body, const std::vector<int32_t>& operands,
                            int32_t num_carries) {
        ThrowIfBuilt(b, "while");
        return ValueOrThrow(b.WhileResults(std::move(cond), std::move(body), operands,
                                           num_carries));
      }, py::arg("cond"), py::arg("body"), py::arg("operands"), py::arg("num_carries"),
         "A while loop (function_ir.h, \"Loops\"): runs `body` on `operands` (the first "
         "`num_carries` carries, the rest consts) while `cond` of them is true; returns the "
         "values of the final carries.")
      .def("svd", [](FunctionBuilder& b, int32_t x, bool full_matrices) {
        ThrowIfBuilt(b, "svd");
        return ValueOrThrow(b.SvdResults(x, full_matrices));
      }, py::arg("x"), py::arg("full_matrices"),
         "The singular value decomposition of each matrix of x's last two dims; returns "
         "the values of u, s and vt.")
      .def("lu", [](FunctionBuilder& b, int32_t x) {
        ThrowIfBuilt(b, "lu");
        return ValueOrThrow(b.LuResults(x));
      }, py::arg("x"),
         "The LU decomposition of each square matrix of x's last two dims; returns the "
         "values of lu, pivots and permutation.")
      .def("eigh", [](FunctionBuilder& b, int32_t x) {
        ThrowIfBuilt(b, "eigh");
        return ValueOrThrow(b.EighResults(x));
      }, py::arg("x"),
         "The eigendecomposition of the symmetric matrices of x's lower triangles; returns "
         "the values of w and v.")
      .def("qr", [](FunctionBuilder& b, int32_t x, bool full_matrices) {
        ThrowIfBuilt(b, "qr");
        return ValueOrThrow(b.QrResults(x, full_matrices));
      }, py::arg("x"), py::arg("full_matrices"),
         "The QR decomposition of each matrix of x's last two dims; returns the values of q "
         "and r.")
      .def("cholesky", [](FunctionBuilder& b, int32_t x) {
        return ValueOrThrow(b.Cholesky(x));
      }, py::arg("x"))
      .def("triangular_solve", [](FunctionBuilder& b, int32_t a, int32_t rhs, bool lower,
                                  bool unit_diagonal, bool transpose_a) {
        return ValueOrThrow(b.TriangularSolve(a, rhs, lower, unit_diagonal, transpose_a));
      }, py::arg("a"), py::arg("b"), py::arg("lower"), py::arg("unit_diagonal"),
         py::arg("transpose_a"))
      .def("get_element", [](FunctionBuilder& b, int32_t tuple, int64_t index) {
        return ValueOrThrow(b.GetElement(tuple, index));
      }, py::arg("tuple"), py::arg("index"))
      .def_property_readonly("axis_size", [](const FunctionBuilder& b) {
        ThrowIfBuilt(b, "axis_size");
        return b.axis_size();
      })
      .def("num_values", [](const FunctionBuilder& b) {
        ThrowIfBuilt(b, "num_values");
        return b.num_values();
      })
      .def("shape", [](const FunctionBuilder& b, int32_t v) {
        ThrowIfBuilt(b, "shape");
        if (v < 0 || v >= b.num_values()) throw py::value_error(absl::StrCat("%", v, " is not a value"));
        if (b.type(v).is_tuple()) throw py::value_error(absl::StrCat("%", v, " is a tuple"));
        return ShapeTuple(b.type(v).dims);
      })
      .def("dtype", [](const FunctionBuilder& b, int32_t v) {
        ThrowIfBuilt(b, "dtype");
        if (v < 0 || v >= b.num_values()) throw py::value_error(absl::StrCat("%", v, " is not a value"));
        if (b.type(v).is_tuple()) throw py::value_error(absl::StrCat("%", v, " is a tuple"));
        return std::string(DTypeName(b.type(v).dtype));
      })
      .def("build", [](FunctionBuilder& b, const std::vector<int32_t>& outputs) {
        return Mutable(ValueOrThrow(b.Build(outputs)));
      }, py::arg("outputs"));

  py::class_<CompiledFunction, std::shared_ptr<CompiledFunction>>(
      m, "CompiledFunction", "A compiled function placed on virtual devices (one program node).")
      .def_property_readonly("name", &CompiledFunction::name)
      .def_property_readonly("num_shards", &CompiledFunction::num_shards)
      .def_property_readonly("scratch_bytes_per_shard", [](const CompiledFunction& f) {
        return f.executable().scratch_bytes(1) - f.executable().tile_bytes();
      }, "Bytes of scratch one shard's intermediate values take at most at once (the "
         "executable's memory plan).")
      .def_property_readonly("virtual_devices", &CompiledFunction::virtual_devices)
      .def_property_readonly("devices", [](const CompiledFunction& f) {
        return ValueOrThrow(f.physical_devices())->devices();  // as mapped now
      }, py::return_value_policy::reference)
      .def("param_types", [](const CompiledFunction& f) {
        py::list out;
        for (int i = 0; i < f.executable().ir().num_params(); ++i) {
          out.append(py::make_tuple(ShapeTuple(f.param_dims(i)),
                                    std::string(DTypeName(f.executable().ir().param_type(i).dtype))));
        }
        return out;
      })
      .def("output_types", [](const CompiledFunction& f) {
        py::list out;
        for (int i = 0; i < f.executable().ir().num_outputs(); ++i) {
          out.append(py::make_tuple(ShapeTuple(f.output_dims(i)),
                                    std::string(DTypeName(f.executable().ir().output_type(i).dtype))));
        }
        return out;
      })
      .def("__repr__", [](const CompiledFunction& f) {
        return absl::StrCat("CompiledFunction(@", f.name(), " on ", f.PlacementString(), ")");
      });

  m.def("compile", [](const std::shared_ptr<FunctionIr>& function, const std::vector<VirtualDevice>& devices) {
    auto exe = ValueOrThrow(FunctionExecutable::Compile(function));
    return Mutable(ValueOrThrow(CompiledFunction::Create(exe, devices, &GetRuntime().registry())));
  }, py::arg("function"), py::arg("devices"));
}

}  // namespace pw::bindings
