// Binds object_store/sharded_buffer.h and device_put.

#include "csrc/bindings/sharded_buffer.h"

#include <algorithm>
#include <cstring>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "csrc/base/fork.h"
#include "csrc/bindings/registrations.h"
#include "csrc/bindings/status_casters.h"
#include "csrc/bindings/waiting.h"
#include "pybind11/stl.h"

namespace pw::bindings {
namespace py = pybind11;

std::shared_ptr<ShardedBuffer> PyShardedBuffer::Get(const char* use) const {
  if (buffer == nullptr) {
    ThrowDeleted(absl::StrCat("ShardedBuffer ", TypeToString(dtype, dims), " has been deleted", DeletedWhy(),
                              "; cannot ", use, " it"));
  }
  return buffer;
}

namespace {
struct ClientHandles {
  std::vector<std::weak_ptr<PyShardedBuffer>> handles;
  size_t compact_at = 64;  // drop expired entries when the list reaches this
};
// Guarded by the GIL; never destroyed (handles may outlive module teardown).
absl::flat_hash_map<const SchedulingClient*, ClientHandles>& HandlesByClient() {
  static auto* map = new absl::flat_hash_map<const SchedulingClient*, ClientHandles>();
  return *map;
}
}  // namespace

void RegisterClientHandle(const SchedulingClient* client, const std::shared_ptr<PyShardedBuffer>& handle) {
  ClientHandles& c = HandlesByClient()[client];
  c.handles.push_back(handle);
  if (c.handles.size() >= c.compact_at) {
    c.handles.erase(std::remove_if(c.handles.begin(), c.handles.end(),
                                   [](const std::weak_ptr<PyShardedBuffer>& h) { return h.expired(); }),
                    c.handles.end());
    c.compact_at = std::max<size_t>(64, 2 * c.handles.size());
  }
}

int DeleteClientHandles(const SchedulingClient* client) {
  auto it = HandlesByClient().find(client);
  if (it == HandlesByClient().end()) return 0;
  std::vector<std::weak_ptr<PyShardedBuffer>> handles = std::move(it->second.handles);
  HandlesByClient().erase(it);
  int deleted = 0;
  for (const auto& weak : handles) {
    std::shared_ptr<PyShardedBuffer> h = weak.lock();
    if (h == nullptr || h->buffer == nullptr) continue;
    h->deleted_why = absl::StrCat("its client '", client->name(), "' was closed");
    // Readers that began before hold their own reference (Get), so this
    // only drops the handle's; memory returns when running work is done.
    h->buffer.reset();
    ++deleted;
  }
  return deleted;
}

py::dtype NumpyDType(DType dtype) { return py::dtype(std::string(DTypeName(dtype))); }

DType FromNumpyDType(const py::dtype& dtype, const char* what) {
  const std::string name = py::str(static_cast<const py::object&>(dtype));
  auto parsed = DTypeFromName(name);
  if (!parsed.ok()) {
    throw py::type_error(absl::StrCat(what, " has dtype ", name, "; supported dtypes: ", kSupportedDTypeNames));
  }
  return *parsed;
}

void AwaitDone(const ShardedBuffer& buffer) {
  if (buffer.IsDone()) return;
  if (InForkedChild()) ThrowStatus(Runtime::Default().status());  // says why
  WaitInterruptibly([&](int64_t timeout_ns) { return buffer.AwaitFor(timeout_ns); });
}

void AwaitOrThrow(const ShardedBuffer& buffer) {
  AwaitDone(buffer);
  ThrowIfError(buffer.status());
  ThrowIfError(buffer.devices()->CheckHealthy());  // its shards went with a failed device
}

std::vector<Device*> ToPhysical(const py::sequence& devices) {
  std::vector<Device*> out;
  for (const py::handle& d : devices) {
    if (py::isinstance<VirtualDevice>(d)) {
      out.push_back(d.cast<const VirtualDevice&>().physical());
    } else if (py::isinstance<Device>(d)) {
      out.push_back(d.cast<Device*>());
    } else {
      throw py::type_error(absl::StrCat("expected a Device or VirtualDevice, got ",
                                        std::string(py::str(py::type::of(d)))));
    }
  }
  return out;
}

namespace {

void CopyBytes(void* dst, const void* src, size_t bytes) {
  if (bytes >= kReleaseGilBytes) {
    WithoutGil([&] { std::memcpy(dst, src, bytes); });
  } else {
    std::memcpy(dst, src, bytes);
  }
}

// The value of a handle on `b` (the caller's own reference, see
// PyShardedBuffer::Get): every shard, or shard 0 of a replicated handle.
py::array ToNumpy(const std::shared_ptr<ShardedBuffer>& b, bool replicated) {
  AwaitOrThrow(*b);
  const Dims& dims = b->dims();
  std::vector<py::ssize_t> shape(dims.begin() + (replicated ? 1 : 0), dims.end());
  py::array out(NumpyDType(b->dtype()), shape);
  const size_t bytes = static_cast<size_t>(replicated ? b->shard_bytes() : b->total_bytes());
  if (b->is_remote()) {  // fetched from the host processes, every shard
    if (!replicated) {
      void* dst = out.mutable_data();
      ThrowIfError(WithoutGil([&] { return b->ReadInto(dst); }));
      return out;
    }
    std::vector<char> all(static_cast<size_t>(b->total_bytes()));
    ThrowIfError(WithoutGil([&] { return b->ReadInto(all.data()); }));
    std::memcpy(out.mutable_data(), all.data(), bytes);
    return out;
  }
  CopyBytes(out.mutable_data(), b->data(), bytes);
  return out;
}

// numpy's conversion of the buffer's value: bool(), float(), int() behave
// as on np.asarray(buffer) (ValueError for more than one element).
py::object AsNumpy(py::handle self) { return py::module_::import("numpy").attr("asarray")(self); }

// The one element of a one-element buffer, as a Python scalar; TypeError
// naming `conversion` and the shape otherwise (as numpy's for an array).
py::object ScalarOf(py::handle self, const char* conversion) {
  const auto& s = self.cast<const PyShardedBuffer&>();
  if (NumElements(s.dims) != 1) {
    throw py::type_error(absl::StrCat(conversion, "() of a ShardedBuffer of shape ", DimsToString(s.dims),
                                      ": only a buffer of one element converts to a Python scalar "
                                      "(use .item(index) or np.asarray)"));
  }
  return AsNumpy(self).attr("item")();
}

}  // namespace

void RegisterShardedBuffer(py::module_& m) {
  py::class_<PyShardedBuffer, std::shared_ptr<PyShardedBuffer>>(
      m, "ShardedBuffer",
      "A logical array sharded over devices (leading axis split over them); a future of its producer.")
      .def_property_readonly("shape", [](const PyShardedBuffer& s) {
        return py::tuple(py::cast(std::vector<int64_t>(s.dims.begin(), s.dims.end())));
      })
      .def_property_readonly("dtype", [](const PyShardedBuffer& s) { return NumpyDType(s.dtype); })
      .def_property_readonly("ndim", [](const PyShardedBuffer& s) { return s.dims.size(); })
      .def_property_readonly("size", [](const PyShardedBuffer& s) { return NumElements(s.dims); })
      .def_property_readonly("nbytes", [](const PyShardedBuffer& s) {
        return NumElements(s.dims) * DTypeSize(s.dtype);
      })
      .def_property_readonly("devices", [](const PyShardedBuffer& s) {
        return s.Get("list the devices of")->devices()->devices();
      }, py::return_value_policy::reference)
      .def("block_until_ready", [](py::object self) {
        AwaitOrThrow(*self.cast<const PyShardedBuffer&>().Get("wait for"));
        return self;
      })
      // bool() is numpy's (one element: its truth; more: ValueError). float()
      // and int() convert a buffer of one element, although it has a leading
      // (device) axis, where numpy 2 converts only 0-d arrays: float(loss) of
      // a one-device program's loss.
      .def("__bool__", [](py::object self) { return py::bool_(AsNumpy(self)); })
      .def("__float__", [](py::object self) { return py::float_(ScalarOf(self, "float")); })
      .def("__int__", [](py::object self) { return py::int_(ScalarOf(self, "int")); })
      // numpy's item: the one element (or the one at the given index) as a
      // Python scalar, read back from the devices.
      .def("item", [](py::object self, py::args index) { return AsNumpy(self).attr("item")(*index); })
      // JAX arrays have .at[...] updates; a ShardedBuffer's data lives on
      // devices, where only compiled functions compute, so say where they are.
      .def_property_readonly("at", [](py::object) -> py::object {
        throw py::type_error(
            "ShardedBuffer.at: indexed updates (x.at[index].set(v), .add, ...) run inside "
            "compiled functions: apply them to the traced value in the function given to "
            "pw.pmap, or to np.asarray(buffer) with numpy indexing on the host");
      })
      .def("is_ready", [](const PyShardedBuffer& s) { return s.Get("query")->IsDone(); })
      .def_property_readonly("is_replicated", [](const PyShardedBuffer& s) { return s.replicated; },
                             "True for one value held whole by every device (pmap's out_axes=None, "
                             "pw.jit); False for a value whose leading axis runs over the devices.")
      .def("is_deleted", [](const PyShardedBuffer& s) { return s.buffer == nullptr; })
      .def_property_readonly("owner", [](const PyShardedBuffer& s) {
        const std::shared_ptr<ShardedBuffer> b = s.Get("read the owner of");
        py::dict d;
        d["client"] = b->client_account() ? py::object(py::str(b->client_account()->name())) : py::none();
        d["program"] = b->program_account() ? py::object(py::str(b->program_account()->name())) : py::none();
        return d;
      }, "The ownership labels: {'client': name, 'program': name} (None where unlabeled).")
      .def("delete", [](PyShardedBuffer& s) {
        s.Get("delete");
        s.buffer.reset();
      })
      .def("__array__", [](const PyShardedBuffer& s, py::object dtype, py::object copy) {
        if (!copy.is_none() && !copy.cast<bool>()) {
          throw py::value_error("a ShardedBuffer lives in device memory: converting it to numpy always copies");
        }
        py::array out = ToNumpy(s.Get("read"), s.replicated);
        if (!dtype.is_none()) return py::array(out.attr("astype")(dtype));
        return out;
      }, py::arg("dtype") = py::none(), py::arg("copy") = py::none())
      .def("__len__", [](const PyShardedBuffer& s) {
        if (s.dims.empty()) throw py::type_error("len() of unsized object");  // numpy's words
        return s.dims[0];
      })
      // Indexing reads the buffer back, like np.asarray(buffer)[index]: the
      // result is a numpy value on the host.
      .def("__getitem__", [](py::object self, py::object index) -> py::object {
        return AsNumpy(self).attr("__getitem__")(index);
      })
      .def("__repr__", [](const PyShardedBuffer& s) -> std::string {
        const std::string type = TypeToString(s.dtype, s.dims);
        const std::shared_ptr<ShardedBuffer> b = s.buffer;
        if (b == nullptr) return absl::StrCat("ShardedBuffer(<deleted>, ", type, ")");
        AwaitDone(*b);
        if (absl::Status st = b->status(); !st.ok()) {
          return absl::StrCat("ShardedBuffer(<failed: ", st.message(), ">, ", type, ")");
        }
        return py::repr(ToNumpy(b, s.replicated));
      });

  // A replicated handle on a mapped buffer whose shards are all equal (the
  // caller's promise, as JAX's out_axes=None): no copy, the same buffer.
  m.def("replicated_view", [](const PyShardedBuffer& s, SchedulingClient* client) {
    std::shared_ptr<ShardedBuffer> b = s.Get("view");
    if (s.replicated) throw py::value_error("replicated_view: the ShardedBuffer is replicated already");
    if (b->dims().empty()) throw py::value_error("replicated_view: the ShardedBuffer has no device axis");
    auto handle = std::make_shared<PyShardedBuffer>(std::move(b), /*is_replicated=*/true);
    if (client != nullptr) RegisterClientHandle(client, handle);
    return handle;
  }, py::arg("buffer"), py::arg("client") = static_cast<SchedulingClient*>(nullptr));

  // Another handle on the same buffer (a checkpoint being written holds one:
  // delete() of the user's handle leaves the buffer to it).
  m.def("another_handle", [](const PyShardedBuffer& s) {
    return std::make_shared<PyShardedBuffer>(s.Get("hold"), s.replicated);
  }, py::arg("buffer"));

  m.def("device_put", [](py::array array, const py::sequence& devices, SchedulingClient* client) {
    const DType dtype = FromNumpyDType(array.dtype(), "device_put: the array");
    py::array c = py::array::ensure(array, py::array::c_style | py::array::forcecast);
    std::vector<Device*> physical = ToPhysical(devices);
    if (physical.empty()) throw py::value_error("device_put needs at least one device");
    Runtime& rt = GetRuntime();
    const DeviceList* list = ValueOrThrow(rt.registry().Intern(physical));
    Dims dims(c.shape(), c.shape() + c.ndim());
    if (dims.empty() || dims[0] != list->size()) {
      throw py::value_error(absl::StrCat("device_put over ", list->size(), " devices needs a leading axis of size ",
                                         list->size(), ", got shape ", DimsToString(dims)));
    }
    PyBlocker blocker;
    auto put = [&] { return rt.DevicePut(dtype, dims, c.data(), list, client, &blocker); };
    // `c` stays alive meanwhile; a thread writing to the array during the copy
    // races with it, as with any asynchronous device_put.
    const bool large = static_cast<size_t>(c.nbytes()) >= kReleaseGilBytes;
    auto put_buffer = large ? WithoutGil(put) : put();
    blocker.RethrowIfInterrupted();
    auto handle = std::make_shared<PyShardedBuffer>(ValueOrThrow(std::move(put_buffer)));
    if (client != nullptr) RegisterClientHandle(client, handle);
    return handle;
  }, py::arg("array"), py::arg("devices"), py::arg("client") = static_cast<SchedulingClient*>(nullptr));
}

}  // namespace pw::bindings
