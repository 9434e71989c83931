// Binds object_store/sharded_buffer.h and device_put.

#include "csrc/bindings/sharded_buffer.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "csrc/base/fork.h"
#include "csrc/bindings/registrations.h"
#include "csrc/bindings/status_casters.h"
#include "csrc/bindings/waiting.h"
#include "pybind11/stl.h"

namespace pw::bindings {
namespace py = pybind11;

std::shared_ptr<ShardedBuffer> PyShardedBuffer::Get(const char* use) const {
  if (buffer == nullptr && suspended != nullptr) {
    throw std::runtime_error(absl::StrCat("ShardedBuffer ", TypeToString(dtype, dims), " is suspended with its client '",
                                          suspended->client, "'; resume() the client before you ", use, " it"));
  }
  if (buffer == nullptr) {
    ThrowDeleted(absl::StrCat("ShardedBuffer ", TypeToString(dtype, dims), " has been deleted", DeletedWhy(),
                              "; cannot ", use, " it"));
  }
  return buffer;
}

namespace {
enum class ClientState { kActive, kSuspending, kSuspended, kResuming };

struct ClientHandles {
  std::vector<std::weak_ptr<PyShardedBuffer>> handles;
  size_t compact_at = 64;  // drop expired entries when the list reaches this
  ClientState state = ClientState::kActive;
  int dispatching = 0;  // ClientDispatches under way
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
    if (h == nullptr || h->is_deleted()) continue;
    h->deleted_why = absl::StrCat("its client '", client->name(), "' was closed");
    // Readers that began before hold their own reference (Get), so this
    // only drops the handle's; memory returns when running work is done.
    h->buffer.reset();
    h->suspended.reset();  // a suspended client's host copy
    ++deleted;
  }
  return deleted;
}

namespace {

const char* StateName(ClientState state) {
  switch (state) {
    case ClientState::kActive:
      return "active";
    case ClientState::kSuspending:
      return "being suspended";
    case ClientState::kSuspended:
      return "suspended";
    case ClientState::kResuming:
      return "being resumed";
  }
  return "?";
}

// The client's entry, or null once close() dropped it. Entries move when
// the map grows: look again after anything that released the GIL.
ClientHandles* FindHandles(const SchedulingClient* client) {
  auto it = HandlesByClient().find(client);
  return it == HandlesByClient().end() ? nullptr : &it->second;
}

[[noreturn]] void ThrowRuntime(const std::string& message) { throw std::runtime_error(message); }

// close() from another thread while the GIL was released.
void CheckNotClosedMeanwhile(const SchedulingClient* client, const char* what) {
  if (client->closed() || FindHandles(client) == nullptr) {
    ThrowRuntime(absl::StrCat(what, ": client '", client->name(), "' was closed meanwhile"));
  }
}

// Sets the client's state back to `state` on scope exit unless Commit()ed
// (an error or interrupt leaves the client as it was).
class StateRollback {
 public:
  StateRollback(const SchedulingClient* client, ClientState state) : client_(client), state_(state) {}
  ~StateRollback() {
    if (committed_) return;
    if (ClientHandles* c = FindHandles(client_)) c->state = state_;
  }
  void Commit(ClientState state) {
    if (ClientHandles* c = FindHandles(client_)) c->state = state;
    committed_ = true;
  }

 private:
  const SchedulingClient* client_;
  ClientState state_;
  bool committed_ = false;
};

// The client's live handles for which `held(handle)` (their buffer, or
// their suspended value) is not null, grouped by it: groups in the order
// their first handle was registered.
template <typename Key, typename Held>
std::vector<std::pair<Key, std::vector<std::shared_ptr<PyShardedBuffer>>>> GroupHandles(ClientHandles& c,
                                                                                      Held held) {
  std::vector<std::pair<Key, std::vector<std::shared_ptr<PyShardedBuffer>>>> groups;
  absl::flat_hash_map<const void*, size_t> index;
  for (const auto& weak : c.handles) {
    std::shared_ptr<PyShardedBuffer> h = weak.lock();
    if (h == nullptr) continue;
    Key key = held(*h);
    if (key == nullptr) continue;
    auto [it, added] = index.try_emplace(key.get(), groups.size());
    if (added) groups.emplace_back(key, std::vector<std::shared_ptr<PyShardedBuffer>>{});
    groups[it->second].second.push_back(std::move(h));
  }
  return groups;
}

py::list DeviceIds(const DeviceList* list) {
  py::list ids;
  for (const Device* d : list->devices()) ids.append(d->id());
  return ids;
}

// Gives up on the first wait: resume takes memory that is free now, or
// none, and never waits behind another client's buffers (back-pressure).
class NoWaitBlocker final : public Blocker {
 public:
  bool Block(absl::FunctionRef<bool(int64_t)> done_within) override {
    if (done_within(0)) return true;
    gave_up_ = true;
    return false;
  }
  bool gave_up() const { return gave_up_; }

 private:
  bool gave_up_ = false;
};

int64_t FreeBytes(Runtime& rt, const Device* d) {
  return d->memory_capacity() - rt.object_stores().For(d).bytes_in_use(d);
}

// Where a value of `shard_bytes` per shard that was on `old` may go, best
// first: `old` itself if its devices are usable (a tenant's grant) and
// healthy (the put says whether they have room: an arena of `old` may hold
// room that FreeBytes does not show); the same island with the devices of
// `old` that can take it kept in place and the others replaced by the least
// used ones that can; then each other island's least used devices. A
// device can take it when it is usable, healthy, of the same kind, and
// has room now.
std::vector<const DeviceList*> Placements(Runtime& rt, const DeviceList* old, int64_t shard_bytes) {
  const std::vector<Device*>& all = rt.cluster().devices();
  const std::string& kind = old->devices()[0]->kind();
  absl::flat_hash_map<int, std::vector<Device*>> fitting;  // by island, least used first
  absl::flat_hash_set<const Device*> usable, fits;
  for (int id : rt.resource_manager().UsableDevices()) {
    Device* d = all[id];
    usable.insert(d);
    if (d->failed() || d->kind() != kind || FreeBytes(rt, d) < shard_bytes) continue;
    fitting[d->island()->id()].push_back(d);
    fits.insert(d);
  }
  std::vector<const DeviceList*> out;
  if (old->CheckHealthy().ok() &&
      std::all_of(old->devices().begin(), old->devices().end(), [&](const Device* d) { return usable.contains(d); })) {
    out.push_back(old);
  }
  for (auto& [island, devices] : fitting) {
    std::sort(devices.begin(), devices.end(), [&](const Device* a, const Device* b) {
      const int64_t ua = rt.object_stores().For(a).bytes_in_use(a), ub = rt.object_stores().For(b).bytes_in_use(b);
      return ua != ub ? ua < ub : a->id() < b->id();
    });
  }
  auto add = [&](const std::vector<Device*>& devices) {
    absl::StatusOr<const DeviceList*> list = rt.registry().Intern(devices);
    if (list.ok() && std::find(out.begin(), out.end(), *list) == out.end()) out.push_back(*list);
  };
  const int n = old->size();
  const int home = old->devices()[0]->island()->id();
  // The same island: keep what can stay.
  std::vector<Device*> mixed = old->devices();
  absl::flat_hash_set<const Device*> taken;
  for (Device* d : mixed) {
    if (fits.contains(d) && d->island()->id() == home) taken.insert(d);
  }
  auto spare = fitting[home].begin();
  bool complete = true;
  for (Device*& d : mixed) {
    if (taken.contains(d)) continue;
    while (spare != fitting[home].end() && taken.contains(*spare)) ++spare;
    if (spare == fitting[home].end()) {
      complete = false;
      break;
    }
    d = *spare++;
    taken.insert(d);
  }
  if (complete) add(mixed);
  std::vector<int> islands;
  for (const auto& [island, devices] : fitting) {
    if (island != home && static_cast<int>(devices.size()) >= n) islands.push_back(island);
  }
  std::sort(islands.begin(), islands.end());
  for (int island : islands) {
    std::vector<Device*> least(fitting[island].begin(), fitting[island].begin() + n);
    std::sort(least.begin(), least.end(), [](const Device* a, const Device* b) { return a->id() < b->id(); });
    add(least);
  }
  return out;
}

}  // namespace

ClientDispatch::ClientDispatch(const SchedulingClient* client, absl::string_view what, absl::string_view name)
    : client_(client) {
  if (client_ == nullptr) return;
  // (An entry even before its first buffer, so that a first suspend counts
  // this dispatch; a closed client's comes back, and the runtime refuses it.)
  ClientHandles* c = &HandlesByClient()[client_];
  if (c->state != ClientState::kActive) {
    client_ = nullptr;
    ThrowRuntime(absl::StrCat("client '", client->name(), "' is ", StateName(c->state), ": resume() it before it ",
                              what, name, name.empty() ? "" : "'"));
  }
  ++c->dispatching;
}

ClientDispatch::~ClientDispatch() {
  if (client_ == nullptr) return;
  if (ClientHandles* c = FindHandles(client_)) --c->dispatching;
}

bool IsClientSuspended(const SchedulingClient* client) {
  const ClientHandles* c = FindHandles(client);
  return c != nullptr && c->state != ClientState::kActive;
}

py::dict SuspendClientHandles(SchedulingClient* client, const py::object& save) {
  if (client->closed()) ThrowRuntime(absl::StrCat("suspend: client '", client->name(), "' is closed"));
  ClientHandles& entry = HandlesByClient()[client];
  if (entry.state != ClientState::kActive) {
    ThrowRuntime(absl::StrCat("suspend: client '", client->name(), "' is ", StateName(entry.state),
                              entry.state == ClientState::kSuspended ? " already (resume() it first)" : ""));
  }
  entry.state = ClientState::kSuspending;  // from now on it dispatches nothing
  StateRollback rollback(client, ClientState::kActive);
  // Dispatches that passed their check before: their outputs are the client's too.
  while (FindHandles(client) != nullptr && FindHandles(client)->dispatching > 0) {
    WithoutGil([] { std::this_thread::sleep_for(std::chrono::microseconds(200)); });
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  }
  CheckNotClosedMeanwhile(client, "suspend");
  auto groups = GroupHandles<std::shared_ptr<ShardedBuffer>>(
      *FindHandles(client), [](const PyShardedBuffer& h) { return h.buffer; });
  // Its work in flight: every buffer done (the GIL released meanwhile).
  for (const auto& [buffer, handles] : groups) AwaitDone(*buffer);
  CheckNotClosedMeanwhile(client, "suspend");

  struct Copy {
    std::shared_ptr<ShardedBuffer> buffer;
    std::shared_ptr<SuspendedValue> value;
    const std::vector<std::shared_ptr<PyShardedBuffer>>* handles;
  };
  std::vector<Copy> copies;
  int failed = 0;
  for (const auto& [buffer, handles] : groups) {
    // A failed buffer holds no memory (its producer failed) or cannot be
    // read (its devices failed): it stays, and keeps its error.
    if (!buffer->status().ok() || !buffer->CheckDevices().ok()) {
      ++failed;
      continue;
    }
    auto value = std::make_shared<SuspendedValue>();
    value->dtype = buffer->dtype();
    value->dims = buffer->dims();
    value->devices = buffer->devices();
    value->client = client->name();
    value->index = static_cast<int>(copies.size());
    value->total_bytes = buffer->total_bytes();
    copies.push_back(Copy{buffer, std::move(value), &handles});
  }
  if (save.is_none()) {
    for (Copy& c : copies) {
      c.value->bytes.reset(new char[static_cast<size_t>(c.value->total_bytes)]);
      char* dst = c.value->bytes.get();
      ThrowIfError(WithoutGil([&] { return c.buffer->ReadInto(dst); }));
    }
  } else {
    py::list buffers;
    for (const Copy& c : copies) buffers.append(std::make_shared<PyShardedBuffer>(c.buffer));
    save(buffers);
  }
  CheckNotClosedMeanwhile(client, "suspend");
  int64_t bytes = 0;
  for (Copy& c : copies) {
    for (const auto& h : *c.handles) {
      if (h->buffer != c.buffer) continue;  // deleted meanwhile
      h->suspended = c.value;
      h->buffer.reset();
    }
    bytes += c.value->total_bytes;
    c.buffer.reset();  // the last reference, unless work in flight still reads it
  }
  rollback.Commit(ClientState::kSuspended);
  py::dict summary;
  summary["buffers"] = copies.size();
  summary["bytes"] = bytes;
  summary["failed_buffers"] = failed;
  return summary;
}

py::dict ResumeClientHandles(SchedulingClient* client, const py::object& loaded) {
  if (client->closed()) ThrowRuntime(absl::StrCat("resume: client '", client->name(), "' is closed"));
  ClientHandles* entry = FindHandles(client);
  if (entry == nullptr || entry->state != ClientState::kSuspended) {
    ThrowRuntime(absl::StrCat("resume: client '", client->name(), "' is ",
                              entry == nullptr ? "active" : StateName(entry->state),
                              entry == nullptr || entry->state == ClientState::kActive ? ", not suspended" : ""));
  }
  entry->state = ClientState::kResuming;
  StateRollback rollback(client, ClientState::kSuspended);
  auto groups = GroupHandles<std::shared_ptr<const SuspendedValue>>(
      *entry, [](const PyShardedBuffer& h) { return h.suspended; });
  Runtime& rt = GetRuntime();
  // The new buffers, dropped if any value fits nowhere: all or nothing.
  std::vector<std::shared_ptr<ShardedBuffer>> placed;
  py::list moved;
  int64_t bytes = 0;
  for (const auto& [value, handles] : groups) {
    const char* data = value->bytes.get();
    py::array from_checkpoint;
    if (data == nullptr) {
      const std::string key = absl::StrCat("b", value->index);
      if (loaded.is_none() || !loaded.contains(py::str(key))) {
        ThrowRuntime(absl::StrCat("resume: client '", client->name(), "': the value of buffer ", value->index,
                                  " is not in the checkpoint it was suspended to"));
      }
      from_checkpoint = py::array::ensure(loaded[py::str(key)], py::array::c_style);
      if (!from_checkpoint ||
          FromNumpyDType(from_checkpoint.dtype(), "resume: a checkpointed value") != value->dtype ||
          Dims(from_checkpoint.shape(), from_checkpoint.shape() + from_checkpoint.ndim()) != value->dims) {
        ThrowRuntime(absl::StrCat("resume: client '", client->name(), "': the checkpoint's array '", key,
                                  "' is not the ", TypeToString(value->dtype, value->dims),
                                  " it was suspended as (was the checkpoint changed?)"));
      }
      data = static_cast<const char*>(from_checkpoint.data());
    }
    const int64_t shard_bytes = ShardBytes(value->dtype, value->dims);
    std::shared_ptr<ShardedBuffer> buffer;
    for (const DeviceList* list : Placements(rt, value->devices, shard_bytes)) {
      NoWaitBlocker no_wait;
      auto put = [&] { return rt.DevicePut(value->dtype, value->dims, data, list, client, &no_wait); };
      absl::StatusOr<std::shared_ptr<ShardedBuffer>> b = WithoutGil(put);
      if (b.ok()) {
        buffer = *std::move(b);
        break;
      }
      const bool no_room = b.status().code() == absl::StatusCode::kResourceExhausted ||
                           (b.status().code() == absl::StatusCode::kCancelled && no_wait.gave_up());
      if (!no_room) ThrowStatus(b.status());  // still suspended, every value kept
    }
    if (buffer == nullptr) {
      ThrowStatus(absl::ResourceExhaustedError(absl::StrCat(
          "resume: client '", client->name(), "' stays suspended: its buffer ", value->index, " (",
          TypeToString(value->dtype, value->dims), ", ", shard_bytes, " bytes per device over ", value->devices->size(),
          " devices) fits on no healthy devices now, neither ", value->devices->ToString(),
          " nor as many others of one island; free device memory (or wait for other clients' work) and resume "
          "again")));
    }
    if (buffer->devices() != value->devices) {
      py::dict m;
      m["buffer"] = value->index;
      m["shape"] = py::tuple(py::cast(std::vector<int64_t>(value->dims.begin(), value->dims.end())));
      m["dtype"] = NumpyDType(value->dtype);
      m["from"] = DeviceIds(value->devices);
      m["to"] = DeviceIds(buffer->devices());
      moved.append(m);
    }
    bytes += value->total_bytes;
    placed.push_back(std::move(buffer));
  }
  CheckNotClosedMeanwhile(client, "resume");
  for (size_t i = 0; i < groups.size(); ++i) {
    for (const auto& h : groups[i].second) {
      if (h->suspended != groups[i].first) continue;  // deleted meanwhile
      h->buffer = placed[i];
      h->suspended.reset();
    }
  }
  rollback.Commit(ClientState::kActive);
  py::dict summary;
  summary["buffers"] = groups.size();
  summary["bytes"] = bytes;
  summary["moved"] = moved;
  return summary;
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
  ThrowIfError(buffer.CheckDevices());  // its shards went with a failed device, or a lost host process
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

// The value of a suspended handle, from its host copy: every shard, or
// shard 0 of a replicated handle.
py::array SuspendedToNumpy(const PyShardedBuffer& s) {
  // Held: another thread may delete() the handle while this one copies.
  const std::shared_ptr<const SuspendedValue> held = s.suspended;
  const SuspendedValue& v = *held;
  if (v.bytes == nullptr) {
    throw std::runtime_error(absl::StrCat("ShardedBuffer ", TypeToString(s.dtype, s.dims), " is suspended with its client '",
                                          v.client, "' in a checkpoint; resume() the client to read it"));
  }
  py::array out(NumpyDType(s.dtype), std::vector<py::ssize_t>(s.dims.begin(), s.dims.end()));
  const int64_t bytes = s.replicated ? ShardBytes(v.dtype, v.dims) : v.total_bytes;
  CopyBytes(out.mutable_data(), v.bytes.get(), static_cast<size_t>(bytes));
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
        const auto& s = self.cast<const PyShardedBuffer&>();
        if (s.buffer == nullptr && s.suspended != nullptr) return self;  // its host copy is there
        AwaitOrThrow(*s.Get("wait for"));
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
      .def("is_ready", [](const PyShardedBuffer& s) {
        return (s.buffer == nullptr && s.suspended != nullptr) || s.Get("query")->IsDone();
      })
      .def_property_readonly("is_replicated", [](const PyShardedBuffer& s) { return s.replicated; },
                             "True for one value held whole by every device (pmap's out_axes=None, "
                             "pw.jit); False for a value whose leading axis runs over the devices.")
      .def("is_deleted", &PyShardedBuffer::is_deleted)
      .def("is_suspended", [](const PyShardedBuffer& s) { return s.buffer == nullptr && s.suspended != nullptr; },
           "True while its client is suspended (Client.suspend): its value is in host memory or a checkpoint.")
      .def_property_readonly("owner", [](const PyShardedBuffer& s) {
        const std::shared_ptr<ShardedBuffer> b = s.Get("read the owner of");
        py::dict d;
        d["client"] = b->client_account() ? py::object(py::str(b->client_account()->name())) : py::none();
        d["program"] = b->program_account() ? py::object(py::str(b->program_account()->name())) : py::none();
        return d;
      }, "The ownership labels: {'client': name, 'program': name} (None where unlabeled).")
      .def("delete", [](PyShardedBuffer& s) {
        if (s.suspended != nullptr) {  // its client is suspended: its host copy goes
          s.suspended.reset();
          return;
        }
        s.Get("delete");
        s.buffer.reset();
      })
      .def("__array__", [](const PyShardedBuffer& s, py::object dtype, py::object copy) {
        if (!copy.is_none() && !copy.cast<bool>()) {
          throw py::value_error("a ShardedBuffer lives in device memory: converting it to numpy always copies");
        }
        py::array out = s.buffer == nullptr && s.suspended != nullptr ? SuspendedToNumpy(s) : ToNumpy(s.Get("read"), s.replicated);
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
        if (b == nullptr && s.suspended != nullptr) {
          return absl::StrCat("ShardedBuffer(<suspended with client '", s.suspended->client, "'>, ", type, ")");
        }
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
  // pw.elastic.is_lost: its shards went with a failed device, or with a
  // host process that a new one has replaced since (false while suspended:
  // its value is in host memory; and once deleted).
  m.def("buffer_lost", [](const PyShardedBuffer& s) {
    return s.buffer != nullptr && !s.buffer->CheckDevices().ok();
  });
  m.def("another_handle", [](const PyShardedBuffer& s) {
    return std::make_shared<PyShardedBuffer>(s.Get("hold"), s.replicated);
  }, py::arg("buffer"));
  // In process, the value of a buffer where it is, not a copy (every shard,
  // or shard 0 of a replicated handle): a read-only array that holds the
  // buffer, once it is ready (a ready buffer's memory does not change until
  // its last reference goes). ValueError for a buffer of host processes,
  // whose value is not in this process's memory (internal: pw.checkpointing
  // writes from it).
  m.def("value_view", [](const PyShardedBuffer& s) -> py::array {
    std::shared_ptr<ShardedBuffer> b = s.Get("read");
    if (b->is_remote()) throw py::value_error("value_view: the buffer is on host processes");
    AwaitOrThrow(*b);
    std::vector<py::ssize_t> shape(s.dims.begin(), s.dims.end());
    auto* held = new std::shared_ptr<ShardedBuffer>(b);
    py::capsule owner(held, [](void* p) { delete static_cast<std::shared_ptr<ShardedBuffer>*>(p); });
    py::array out(NumpyDType(b->dtype()), shape, b->data(), owner);
    out.attr("setflags")(py::arg("write") = false);
    return out;
  }, py::arg("buffer"));

  m.def("device_put", [](py::array array, const py::sequence& devices, SchedulingClient* client) {
    const DType dtype = FromNumpyDType(array.dtype(), "device_put: the array");
    py::array c = py::array::ensure(array, py::array::c_style | py::array::forcecast);
    std::vector<Device*> physical = ToPhysical(devices);
    if (physical.empty()) throw py::value_error("device_put needs at least one device");
    ClientDispatch dispatch(client, "places buffers with device_put");
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
