// Binds the runtime (client/runtime.h), the cluster's devices and the
// resource manager's virtual slices.

#include <atomic>

#include "absl/strings/str_cat.h"
#include "csrc/base/fork.h"
#include "csrc/base/spin.h"
#include "csrc/bindings/registrations.h"
#include "csrc/bindings/sharded_buffer.h"
#include "csrc/bindings/status_casters.h"
#include "csrc/bindings/waiting.h"
#include "pybind11/stl.h"

namespace pw::bindings {
namespace py = pybind11;

namespace {
// The default runtime once a call started it, cached so the hot path does
// not take Default()'s lock on every call.
std::atomic<Runtime*> started_runtime{nullptr};
}  // namespace

Runtime& GetRuntime() {
  Runtime* rt = started_runtime.load(std::memory_order_acquire);
  if (rt == nullptr || InForkedChild()) {  // Default() says why a child may not
    absl::StatusOr<Runtime*> started;
    if (PyGILState_Check()) {
      // Without the GIL: the first call starts the runtime under Default()'s
      // lock, and starting host processes takes the GIL back (pathways._hosts).
      // Another thread's first call, blocked on that lock with the GIL held,
      // would deadlock the two.
      py::gil_scoped_release release;
      started = Runtime::Default();
    } else {
      started = Runtime::Default();
    }
    rt = ValueOrThrow(std::move(started));
    started_runtime.store(rt, std::memory_order_release);
  }
  return *rt;
}

Runtime* StartedRuntime() { return InForkedChild() ? nullptr : started_runtime.load(std::memory_order_acquire); }

namespace {

std::vector<Device*> PhysicalOf(const DeviceList* list) { return list->devices(); }

std::vector<VirtualDevice> VirtualDevicesOf(const std::shared_ptr<VirtualSlice>& slice) {
  std::vector<VirtualDevice> devices;
  devices.reserve(slice->size());
  for (int i = 0; i < slice->size(); ++i) devices.push_back(VirtualDevice{slice, i});
  return devices;
}

}  // namespace

void RegisterRuntime(py::module_& m) {
  // pw.configure's keywords as (key, value text) pairs: each value is parsed
  // as its key's type alone, with the same checks as PATHWAYS_TOPOLOGY.
  m.def("configure", [](const std::vector<std::pair<std::string, std::string>>& items) {
    absl::StatusOr<TopologyOptions> options = ParseTopology(items);
    if (!options.ok()) {
      ThrowStatus(absl::Status(options.status().code(), absl::StrCat("configure: ", options.status().message())));
    }
    ThrowIfError(Runtime::ConfigureDefault(*options));
  }, py::arg("items"));
  m.def("parse_bytes", [](const std::string& text, const std::string& name) {
    return ValueOrThrow(ParseBytes(text, name));
  }, py::arg("text"), py::arg("name"), "A size like '512MiB' in bytes (ValueError naming `name` if malformed).");
  m.def("is_started", &Runtime::DefaultExists);
  m.def("topology", [] {
    const TopologyOptions& o = GetRuntime().cluster().options();
    py::dict d;
    d["islands"] = o.num_islands;
    d["hosts_per_island"] = o.hosts_per_island;
    d["devices_per_host"] = o.devices_per_host;
    d["device_memory"] = o.device_memory_bytes;
    d["executor_threads"] = o.num_executor_threads;
    d["intra_op_threads"] = o.intra_op_threads;
    d["control_latency_us"] = o.control_latency_ns / 1000.0;
    d["hang_report_seconds"] = o.hang_report_ns / 1e9;
    d["ici_latency_us"] = o.ici_latency_ns / 1000.0;
    d["ici_bandwidth_gbps"] = o.ici_bandwidth_bps / 1e9;
    d["dcn_latency_us"] = o.dcn_latency_ns / 1000.0;
    d["dcn_bandwidth_gbps"] = o.dcn_bandwidth_bps / 1e9;
    d["hosts"] = std::string(HostsModeName(o.hosts));
    return d;
  });
  // A tenant's are the devices its service granted it.
  m.def("devices", [] {
    Runtime& rt = GetRuntime();
    std::vector<Device*> out;
    for (int d : rt.resource_manager().UsableDevices()) out.push_back(rt.cluster().devices()[d]);
    return out;
  }, py::return_value_policy::reference);
  m.def("memory_stats", [] {
    Runtime& rt = GetRuntime();
    py::dict d;
    d["bytes_in_use"] = rt.object_stores().TotalLiveBytes();
    d["bytes_reserved"] = rt.object_stores().TotalBytesCharged();
    d["live_buffers"] = rt.object_stores().live_buffers();
    // By owner (§4.6's labels); owners with the same name are summed.
    auto add = [](py::dict& by, const MemoryAccount& a) {
      const py::str name(a.name());
      if (!by.contains(name)) {
        py::dict e;
        e["bytes_in_use"] = 0;
        e["live_buffers"] = 0;
        e["peak_bytes_in_use"] = 0;
        by[name] = e;
      }
      py::dict e = by[name];
      e["bytes_in_use"] = e["bytes_in_use"].cast<int64_t>() + a.live_bytes();
      e["live_buffers"] = e["live_buffers"].cast<int64_t>() + a.live_buffers();
      e["peak_bytes_in_use"] = e["peak_bytes_in_use"].cast<int64_t>() + a.peak_bytes();
    };
    py::dict by_client, by_program;
    add(by_client, rt.default_client_memory());
    for (SchedulingClient* c : rt.clients()) add(by_client, c->memory());
    for (const auto& a : rt.object_stores().ProgramAccounts()) {
      if (a->live_buffers() > 0 || a->peak_bytes() > 0) add(by_program, *a);
    }
    d["by_client"] = by_client;
    d["by_program"] = by_program;
    d["dispatches_waiting_for_memory"] = rt.object_stores().memory_waiters();
    return d;
  });
  m.def("transfer_stats", [] {
    const TransferStats& s = GetRuntime().transfer_stats();
    py::dict d;
    d["ici_bytes"] = s.ici_bytes.load();
    d["dcn_bytes"] = s.dcn_bytes.load();
    d["host_bytes"] = s.host_bytes.load();
    d["ici_transfers"] = s.ici_transfers.load();
    d["dcn_transfers"] = s.dcn_transfers.load();
    d["host_transfers"] = s.host_transfers.load();
    return d;
  });
  m.def("scheduler_stats", [] {
    Runtime& rt = GetRuntime();
    py::list out;
    for (Island* island : rt.cluster().islands()) {
      py::dict d;
      d["island"] = island->id();
      d["enqueued"] = rt.scheduler(island->id()).num_enqueued();
      d["in_flight"] = rt.scheduler(island->id()).num_in_flight();
      out.append(d);
    }
    return out;
  });
  m.def("await_quiescence", [] {
    Runtime& rt = GetRuntime();
    WaitInterruptibly([&](int64_t timeout_ns) { return rt.AwaitQuiescenceFor(timeout_ns); });
  });
  m.def("await_submitted", [] {
    Runtime& rt = GetRuntime();
    const std::vector<int64_t> marks = rt.SubmissionMarks();
    WaitInterruptibly([&](int64_t timeout_ns) { return rt.AwaitSubmittedBefore(marks, timeout_ns); });
  });
  m.def("shutdown", [] { WithoutGil(&Runtime::ShutdownDefault); });

  py::class_<Device, std::unique_ptr<Device, py::nodelete>>(m, "Device",
                                                           "A physical simulated accelerator.")
      .def_property_readonly("id", &Device::id)
      .def_property_readonly("kind", &Device::kind)
      .def_property_readonly("island", [](const Device& d) { return d.island()->id(); })
      .def_property_readonly("host", [](const Device& d) { return d.host()->id(); })
      .def_property_readonly("memory_capacity", &Device::memory_capacity)
      .def_property_readonly("failed", &Device::failed)
      .def("bytes_in_use", [](const Device& d) { return GetRuntime().object_stores().LiveBytesOn(&d); })
      .def("bytes_reserved", [](const Device& d) { return GetRuntime().object_stores().For(&d).bytes_in_use(&d); })
      .def("__eq__", [](const Device& a, py::object b) {
        return py::isinstance<Device>(b) && &a == b.cast<const Device*>();
      })
      .def("__hash__", [](const Device& d) { return py::hash(py::make_tuple("Device", d.id())); })
      .def("__repr__", &Device::ToString);

  py::class_<VirtualSlice, std::shared_ptr<VirtualSlice>>(m, "VirtualSlice",
                                                          "A slice of an island, from the resource manager.")
      .def_property_readonly("id", &VirtualSlice::id)
      .def_property_readonly("size", &VirtualSlice::size)
      .def_property_readonly("island", [](const VirtualSlice& s) { return s.island()->id(); })
      .def_property_readonly("kind", [](const VirtualSlice& s) { return s.devices()->devices()[0]->kind(); })
      .def_property_readonly("virtual_devices", [](const std::shared_ptr<VirtualSlice>& s) {
        return VirtualDevicesOf(s);
      })
      .def_property_readonly("devices", [](const VirtualSlice& s) { return PhysicalOf(s.devices()); },
                             py::return_value_policy::reference)
      .def_property_readonly("epoch", &VirtualSlice::epoch)
      .def("__repr__", &VirtualSlice::ToString);

  py::class_<VirtualDevice>(m, "VirtualDevice", "Virtual device `index` of a VirtualSlice.")
      .def_property_readonly("slice", [](const VirtualDevice& v) { return v.slice; })
      .def_property_readonly("index", [](const VirtualDevice& v) { return v.index; })
      .def_property_readonly("physical", &VirtualDevice::physical, py::return_value_policy::reference)
      .def_property_readonly("kind", [](const VirtualDevice& v) { return v.physical()->kind(); })
      .def("__eq__", [](const VirtualDevice& a, py::object b) {
        if (!py::isinstance<VirtualDevice>(b)) return false;
        const VirtualDevice& o = b.cast<const VirtualDevice&>();
        return a.slice == o.slice && a.index == o.index;
      })
      .def("__hash__", [](const VirtualDevice& v) { return py::hash(py::make_tuple(v.slice->id(), v.index)); })
      .def("__repr__", &VirtualDevice::ToString);

  py::class_<SchedulingClient, std::unique_ptr<SchedulingClient, py::nodelete>>(
      m, "SchedulingClient", "A tenant of the islands: unit of proportional share and device-time accounting.")
      .def_property_readonly("id", &SchedulingClient::id)
      .def_property_readonly("name", &SchedulingClient::name)
      .def_property_readonly("weight", &SchedulingClient::weight)
      .def_property_readonly("device_seconds", [](const SchedulingClient& c) { return c.device_ns() * 1e-9; })
      .def_property_readonly("gangs", &SchedulingClient::gangs)
      .def_property_readonly("closed", &SchedulingClient::closed)
      .def_property_readonly("bytes_in_use", [](const SchedulingClient& c) { return c.memory().live_bytes(); })
      .def_property_readonly("live_buffers", [](const SchedulingClient& c) { return c.memory().live_buffers(); })
      .def_property_readonly("peak_bytes_in_use", [](const SchedulingClient& c) { return c.memory().peak_bytes(); })
      .def("__repr__", [](const SchedulingClient& c) {
        return "SchedulingClient(" + c.name() + ", weight=" + std::to_string(c.weight()) + ")";
      });
  m.def("create_client", [](const std::string& name, double weight) {
    return ValueOrThrow(GetRuntime().CreateClient(name, weight));
  }, py::arg("name"), py::arg("weight"), py::return_value_policy::reference);
  m.def("close_client", [](SchedulingClient* client) {
    Runtime& rt = GetRuntime();
    WithoutGil([&] { rt.CloseClient(client); });  // it takes the dispatch lock
    return DeleteClientHandles(client);
  }, py::arg("client"));
  // Suspend and resume (pw.Client.suspend/resume): sharded_buffer.h.
  m.def("suspend_client", &SuspendClientHandles, py::arg("client"), py::arg("save") = py::none());
  m.def("resume_client", &ResumeClientHandles, py::arg("client"), py::arg("loaded") = py::none());
  m.def("client_suspended", &IsClientSuspended, py::arg("client"));
  m.def("clients", [] { return GetRuntime().clients(); }, py::return_value_policy::reference);
  m.def("set_scheduling_policy", [](const std::string& policy) {
    const SchedulingPolicy p = ValueOrThrow(ParseSchedulingPolicy(policy));
    Runtime& rt = GetRuntime();
    absl::Status status;
    {
      py::gil_scoped_release release;  // a tenant asks its service
      status = rt.SetSchedulingPolicy(p);
    }
    ThrowIfError(status);
  }, py::arg("policy"));
  m.def("scheduling_policy", [] {
    Runtime& rt = GetRuntime();
    absl::StatusOr<SchedulingPolicy> policy;
    {
      py::gil_scoped_release release;
      policy = rt.scheduling_policy();
    }
    return std::string(SchedulingPolicyName(ValueOrThrow(std::move(policy))));
  });

  // Timeline: events come back per gang, and per transfer between slices;
  // device lists by id (expand with device_list()). Sessions may overlap
  // (nested scopes, several threads); each gets all events recorded while open.
  m.def("timeline_start", [] { return GetRuntime().timeline().Start(); });
  m.def("timeline_stop", [](int64_t session) {
    std::vector<TimelineEvent> events = ValueOrThrow(GetRuntime().timeline().Stop(session));
    py::list gangs, transfers;
    for (const TimelineEvent& e : events) {
      if (e.source != nullptr) {
        transfers.append(py::make_tuple(e.source->id(), e.devices->id(), e.start_ns, e.end_ns, std::string(e.link),
                                        e.bytes));
      } else {
        gangs.append(py::make_tuple(e.devices->id(), e.start_ns, e.end_ns, *e.client, *e.program, *e.node, e.gang));
      }
    }
    return py::make_tuple(gangs, transfers);
  }, py::arg("session"));
  m.def("device_list", [](int id) {
    return GetRuntime().registry().DeviceIds(id);
  }, py::arg("id"));
  m.def("now_ns", &NowNanos);
  m.def("device_busy_seconds", [] {
    Runtime& rt = GetRuntime();
    std::vector<double> busy(rt.cluster().num_devices(), 0.0);
    for (Island* island : rt.cluster().islands()) {
      std::vector<int64_t> ns = rt.scheduler(island->id()).DeviceBusyNs();
      for (Device* d : island->devices()) busy[d->id()] = ns[d->index_in_island()] * 1e-9;
    }
    return busy;
  });

  // Any Python int: counts beyond int64 get the error of counts beyond the limit.
  m.def("fail_devices", [](const std::vector<int>& ids) {
    Runtime& rt = GetRuntime();
    if (rt.cluster().options().hosts == HostsMode::kService) {
      ThrowStatus(absl::FailedPreconditionError(
          "fail_devices: fault injection is the service's, not a tenant's: the devices are shared by every tenant "
          "of the service"));
    }
    std::vector<Device*> devices;
    for (int id : ids) devices.push_back(ValueOrThrow(rt.cluster().device(id)));
    py::gil_scoped_release release;  // with host processes it waits for them to take it
    rt.FailDevices(devices);
  }, py::arg("ids"));
  m.def("remap_slice", [](const std::shared_ptr<VirtualSlice>& slice, bool share) {
    RemapResult r = ValueOrThrow(GetRuntime().resource_manager().Remap(slice.get(), /*spare_only=*/!share));
    return r.moved;  // indices of the virtual devices that moved
  }, py::arg("slice"), py::arg("share") = false);
  m.def("slices_on_failed_devices", [] { return GetRuntime().resource_manager().SlicesOnFailedDevices(); });
  m.def("replace_host", [](int host, const std::string& address) {
    Runtime& rt = GetRuntime();
    absl::Status status;
    {
      py::gil_scoped_release release;  // it waits for the hosts
      status = rt.ReplaceHost(host, address);
    }
    ThrowIfError(status);
  }, py::arg("host"), py::arg("address"));
  m.def("add_slice", [](const py::int_& num_devices, const std::string& kind) {
    int overflow = 0;
    const long long n = PyLong_AsLongLongAndOverflow(num_devices.ptr(), &overflow);
    if (overflow != 0) {
      ThrowStatus(absl::InvalidArgumentError(absl::StrCat("add_slice(", kind, "_devices=",
                                                          std::string(py::str(num_devices)),
                                                          "): a slice needs from 1 to ", kMaxDevices, " devices")));
    }
    return ValueOrThrow(GetRuntime().resource_manager().AddSlice(n, kind));
  }, py::arg("num_devices"), py::arg("kind"));
}

}  // namespace pw::bindings
