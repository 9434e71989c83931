// Binds host/host_main.h: `python -m pathways.host` runs a host process.

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "csrc/bindings/registrations.h"
#include "csrc/bindings/status_casters.h"
#include "pybind11/numpy.h"
#include "pybind11/stl.h"

#ifndef PATHWAYS_WITH_HOSTS
#define PATHWAYS_WITH_HOSTS 0
#endif
#include <unistd.h>

#include "csrc/client/runtime.h"
#if PATHWAYS_WITH_HOSTS
#include "csrc/client/host_sessions.h"
#include "csrc/client/remote_cluster.h"
#include "csrc/client/service_link.h"
#include "csrc/coordination/auth.h"
#include "csrc/host/host_main.h"
#include "csrc/host/shard_reader.h"
#include "csrc/host/shard_writer.h"
#include "csrc/service/service.h"
#endif
#include "csrc/bindings/sharded_buffer.h"
#include "csrc/bindings/waiting.h"

namespace pw::bindings {
namespace py = pybind11;

#if PATHWAYS_WITH_HOSTS
namespace {
// Sessions with the cluster they were made for (internal: pathways._hosts).
struct PyHostSessions {
  std::unique_ptr<Cluster> cluster;
  std::unique_ptr<HostSessions> sessions;
};

// A service's report (wire::ServiceReport) as Python: {"policy", "flows": [...]}.
py::dict ReportDict(const wire::ServiceReport& report) {
  py::dict out;
  out["policy"] = report.policy();
  py::list flows;
  for (const wire::FlowStats& f : report.flows()) {
    py::dict d;
    d["tenant"] = f.tenant();
    d["tenant_name"] = f.tenant_name();
    d["name"] = f.name();
    d["weight"] = f.weight();
    d["priority"] = f.priority();
    d["device_seconds"] = f.device_seconds();
    d["gangs"] = f.gangs();
    d["queued"] = f.queued();
    d["ended"] = f.ended();
    d["freed"] = f.freed();
    d["freed_after_seconds"] = f.freed_after_seconds();
    d["devices"] = f.devices();
    d["memory"] = f.memory_bytes();
    flows.append(std::move(d));
  }
  out["flows"] = std::move(flows);
  return out;
}

py::list HostInfos(const std::vector<RemoteHostInfo>& hosts) {
  py::list out;
  for (const RemoteHostInfo& h : hosts) {
    py::dict d;
    d["id"] = h.id;
    d["island"] = h.island;
    d["address"] = h.address;
    d["pid"] = h.pid;
    d["incarnation"] = absl::StrFormat("%016x", h.incarnation);
    d["alive"] = h.alive();
    d["status"] = h.alive() ? py::object(py::none()) : py::object(py::str(std::string(h.status.message())));
    out.append(std::move(d));
  }
  return out;
}
}  // namespace
#endif

void RegisterHost(py::module_& m) {
  m.attr("has_host_processes") = py::bool_(PATHWAYS_WITH_HOSTS == 1);
  // hosts="local_processes": the runtime starts its hosts through
  // pathways._hosts (a process per host, on this machine).
  Runtime::SetHostLauncher([](const TopologyOptions& options, int num_hosts) -> absl::StatusOr<LaunchedHosts> {
    py::gil_scoped_acquire gil;
    try {
      py::tuple started = py::module_::import("pathways._hosts")
                              .attr("launch_for_runtime")(num_hosts, std::string(HostsModeName(options.hosts)));
      LaunchedHosts out;
      out.addresses = started[0].cast<std::vector<std::string>>();
      out.secret = started[1].cast<std::string>();
      return out;
    } catch (py::error_already_set& e) {
      return absl::UnavailableError(absl::StrCat("starting the host processes failed: ", e.what()));
    }
  });
  m.def("hosts", [] {
    Runtime& rt = GetRuntime();
#if PATHWAYS_WITH_HOSTS
    if (rt.remote() != nullptr) return HostInfos(rt.remote()->hosts());
#endif
    py::list out;  // in process: every host is this process
    for (const Host* h : rt.cluster().hosts()) {
      py::dict d;
      d["id"] = h->id();
      d["island"] = h->island()->id();
      d["address"] = py::none();
      d["pid"] = static_cast<int64_t>(getpid());
      d["incarnation"] = py::none();
      d["alive"] = true;
      d["status"] = py::none();
      out.append(std::move(d));
    }
    return out;
  }, "Every host of the runtime: id, island, address, pid, incarnation, alive, status.");
  m.def(
      "configure_service",
      [](const std::string& address, const std::string& secret, const std::string& name, int priority, int devices,
         int64_t memory, double wait_timeout_s) {
        TenantOptions tenant;
        tenant.address = address;
        tenant.secret = secret;
        tenant.name = name;
        tenant.priority = priority;
        tenant.devices = devices;
        tenant.memory_bytes = memory;
        tenant.wait_timeout_ns = static_cast<int64_t>(wait_timeout_s * 1e9);
        ThrowIfError(Runtime::ConfigureDefaultTenant(tenant));
      },
      py::arg("address"), py::arg("secret"), py::arg("name"), py::arg("priority"), py::arg("devices") = 0,
      py::arg("memory") = 0, py::arg("wait_timeout") = 60.0,
      "The default runtime will be a tenant of the service at `address` (internal; see pw.configure(server=...)).");
  m.def("service_report", []() -> py::object {
#if PATHWAYS_WITH_HOSTS
    Runtime& rt = GetRuntime();
    if (rt.service() != nullptr) {
      absl::StatusOr<wire::ServiceReport> report;
      {
        py::gil_scoped_release release;
        report = rt.service()->Report();
      }
      return ReportDict(ValueOrThrow(std::move(report)));
    }
#endif
    return py::none();
  }, "The service's report (policy, every tenant's clients), or None when this process is not a tenant.");
  m.def("tenant_session", []() -> py::object {
#if PATHWAYS_WITH_HOSTS
    Runtime& rt = GetRuntime();
    if (rt.service() != nullptr) return py::int_(rt.service()->tenant().session());
#endif
    return py::none();
  }, "This process's tenant id at its service, or None when it is not a tenant.");
  m.def("save_shards", [](int host, const std::string& database, const std::vector<py::tuple>& buffers) {
#if PATHWAYS_WITH_HOSTS
    Runtime& rt = GetRuntime();
    if (rt.remote() == nullptr) throw py::value_error("save_shards: the hosts are in this process");
    wire::SaveShards request;
    request.set_database(database);
    std::vector<std::shared_ptr<ShardedBuffer>> held;
    for (const py::tuple& t : buffers) {
      if (t.size() != 2) throw py::value_error("save_shards: each buffer is (ShardedBuffer, spec_json)");
      std::shared_ptr<ShardedBuffer> b = t[0].cast<const PyShardedBuffer&>().Get("save");
      wire::ShardsToSave* s = request.add_buffers();
      s->set_buffer_id(b->remote_id());
      s->set_spec_json(t[1].cast<std::string>());
      held.push_back(std::move(b));
    }
    absl::Status status;
    {
      py::gil_scoped_release release;
      // Done here means done on the hosts (a run not sent yet has no buffer there).
      for (const auto& b : held) status.Update(b->Await());
      if (status.ok()) status = rt.remote()->SaveShards(host, std::move(request));
    }
    ThrowIfError(status);
#else
    throw py::value_error("save_shards: this build has no host processes");
#endif
  }, py::arg("host"), py::arg("database"), py::arg("buffers"),
     "Has host `host` write its shards of `buffers` ((ShardedBuffer, spec_json) pairs) into the checkpoint "
     "database `database`, once they are done (internal: pathways.checkpointing).");
  m.def("set_shard_writer", [](py::object writer) {
#if PATHWAYS_WITH_HOSTS
    if (writer.is_none()) {
      SetShardWriter(nullptr);
      return;
    }
    // Kept for the process's life: a writer may be called until it exits.
    auto* fn = new py::object(std::move(writer));
    SetShardWriter([fn](const std::string& database, std::vector<ShardsToWrite> shards) -> absl::Status {
      py::gil_scoped_acquire gil;
      try {
        py::list items;
        for (ShardsToWrite& s : shards) {
          // The host buffer's memory itself, not a copy: a read-only array
          // that holds the buffer.
          auto* held = new std::shared_ptr<const void>(std::move(s.data));
          py::capsule owner(held, [](void* p) { delete static_cast<std::shared_ptr<const void>*>(p); });
          py::array data(py::dtype::of<uint8_t>(), {static_cast<py::ssize_t>(s.bytes)}, {py::ssize_t{1}},
                         static_cast<const uint8_t*>(held->get()), owner);
          data.attr("setflags")(py::arg("write") = false);
          items.append(py::make_tuple(py::str(s.spec_json), std::move(data)));
        }
        (*fn)(database, items);
        return absl::OkStatus();
      } catch (py::error_already_set& e) {
        return absl::InternalError(absl::StrCat("the checkpoint writer failed: ", e.what()));
      } catch (const std::exception& e) {  // nothing may escape into the host's storage thread
        return absl::InternalError(absl::StrCat("the checkpoint writer failed: ", e.what()));
      }
    });
#else
    (void)writer;
#endif
  }, py::arg("writer"),
     "This host process's checkpoint writer: writer(database, [(spec_json, data)]), data a read-only uint8 "
     "array of the shards' bytes (internal: pathways.host).");
  m.def("load_shards", [](const std::string& database, const std::vector<py::tuple>& buffers,
                          SchedulingClient* client) -> py::list {
#if PATHWAYS_WITH_HOSTS
    Runtime& rt = GetRuntime();
    if (rt.remote() == nullptr) throw py::value_error("load_shards: the hosts are in this process");
    std::vector<Runtime::ShardsLoad> loads;
    std::vector<bool> replicated;
    for (const py::tuple& t : buffers) {
      if (t.size() != 6) {
        throw py::value_error("load_shards: each buffer is (name, dtype, shape, devices, replicated, spec_json)");
      }
      // Named as restore's: its caller's (pw.checkpointing.restore) errors.
      const std::string what = absl::StrCat("restore: the array '", t[0].cast<std::string>(), "'");
      Runtime::ShardsLoad& load = loads.emplace_back();
      load.dtype = FromNumpyDType(py::dtype::from_args(t[1]), what.c_str());
      const auto shape = t[2].cast<std::vector<int64_t>>();
      for (int64_t d : shape) {
        if (d < 0) throw py::value_error(absl::StrCat(what, " has a negative dimension: ", d));
      }
      std::vector<Device*> physical = ToPhysical(t[3].cast<py::sequence>());
      if (physical.empty()) throw py::value_error(absl::StrCat(what, " needs at least one device"));
      load.devices = ValueOrThrow(rt.registry().Intern(physical));
      const bool rep = t[4].cast<bool>();
      // A replicated buffer holds the whole array on each device: its
      // device axis comes first. A split one's leading axis is the devices'.
      if (rep) {
        load.dims.push_back(load.devices->size());
      } else if (shape.empty() || shape[0] != load.devices->size()) {
        throw py::value_error(absl::StrCat(what, " split over ", load.devices->size(),
                                           " devices needs a leading axis of that size, got shape ",
                                           DimsToString(Dims(shape.begin(), shape.end()))));
      }
      load.dims.insert(load.dims.end(), shape.begin(), shape.end());
      load.spec_json = t[5].cast<std::string>();
      replicated.push_back(rep);
    }
    PyBlocker blocker;  // waiting for device memory, as device_put does
    auto made = WithoutGil([&] { return rt.LoadShards(database, loads, client, &blocker); });
    blocker.RethrowIfInterrupted();
    std::vector<std::shared_ptr<ShardedBuffer>> out = ValueOrThrow(std::move(made));
    py::list handles;
    for (size_t i = 0; i < out.size(); ++i) {
      auto handle = std::make_shared<PyShardedBuffer>(std::move(out[i]), replicated[i]);
      if (client != nullptr) RegisterClientHandle(client, handle);
      handles.append(handle);
    }
    return handles;
#else
    (void)database;
    (void)buffers;
    (void)client;
    throw py::value_error("load_shards: this build has no host processes");
#endif
  }, py::arg("database"), py::arg("buffers"), py::arg("client") = static_cast<SchedulingClient*>(nullptr),
     "Has the host processes read new buffers ((name, dtype, shape, devices, replicated, spec_json) each) from the "
     "checkpoint in `database`, each host its own shards; returns them pending (internal: pathways.checkpointing).");
  m.def("set_shard_reader", [](py::object reader) {
#if PATHWAYS_WITH_HOSTS
    if (reader.is_none()) {
      SetShardReader(nullptr);
      return;
    }
    // Kept for the process's life: a reader may be called until it exits.
    auto* fn = new py::object(std::move(reader));
    SetShardReader([fn](const std::string& database, std::vector<ShardsToRead> shards) -> absl::Status {
      py::gil_scoped_acquire gil;
      absl::Status status;
      std::vector<py::memoryview> views;  // the buffers' memory, the reader's only during the call
      try {
        py::list items;
        for (ShardsToRead& s : shards) {
          static char none[1];
          void* data = s.data != nullptr ? static_cast<void*>(s.data) : none;
          views.push_back(py::memoryview::from_memory(data, static_cast<py::ssize_t>(s.bytes), /*readonly=*/false));
          items.append(py::make_tuple(py::str(s.spec_json), py::cast(s.positions), views.back()));
        }
        (*fn)(database, items);
      } catch (py::error_already_set& e) {
        // The reader's ValueError says what is wrong with the checkpoint
        // (pw.checkpointing.restore raises it at the client).
        status = e.matches(PyExc_ValueError)
                     ? absl::InvalidArgumentError(std::string(py::str(e.value())))
                     : absl::InternalError(absl::StrCat("the checkpoint reader failed: ", e.what()));
      } catch (const std::exception& e) {  // nothing may escape into the host's storage thread
        status = absl::InternalError(absl::StrCat("the checkpoint reader failed: ", e.what()));
      }
      // No view of the memory may outlive the call (the buffer may be freed
      // next): released here, after a collection if a cycle still holds one.
      for (py::memoryview& view : views) {
        for (int attempt = 0; attempt < 2; ++attempt) {
          try {
            view.attr("release")();
            break;
          } catch (py::error_already_set&) {
            if (attempt == 0) {
              py::module_::import("gc").attr("collect")();
              continue;
            }
            // Still exported: the reader kept an array on it, which would
            // outlive the memory. The load fails, saying so.
            status = absl::InternalError("the checkpoint reader kept a view of a buffer's memory after it returned");
          }
        }
      }
      return status;
    });
#else
    (void)reader;
#endif
  }, py::arg("reader"),
     "This host process's checkpoint reader: reader(database, [(spec_json, positions, memoryview)]) fills each "
     "writable memoryview with this host's shards at those positions (internal: pathways.host).");
  m.def("control_messages", []() -> py::object {
#if PATHWAYS_WITH_HOSTS
    Runtime& rt = GetRuntime();
    if (rt.remote() != nullptr) return py::cast(rt.remote()->messages_sent());
#endif
    return py::none();
  }, "Control messages sent to each host process so far (None when hosts are in process).");
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
#if PATHWAYS_WITH_HOSTS
  m.def(
      "_seal_secret",
      [](const std::string& public_key_hex, const std::string& secret) {
        const std::string key = ValueOrThrow(FromHex(public_key_hex));
        return ToHex(ValueOrThrow(SealSecret(key, secret)));
      },
      py::arg("public_key_hex"), py::arg("secret"),
      "`secret` sealed to a host's public key (hex, from `pathways-host --sealed-secret-stdin`), in hex: only "
      "that host process can open it (internal; see pathways._ray_hosts).");
  py::class_<PyHostSessions>(m, "_HostSessions", "Sessions with host processes (internal; see pathways._hosts).")
      .def(py::init([](const std::vector<std::string>& addresses, const std::string& secret,
                       const std::vector<std::pair<std::string, std::string>>& topology) {
             auto p = std::make_unique<PyHostSessions>();
             p->cluster = ValueOrThrow(Cluster::Create(ValueOrThrow(ParseTopology(topology))));
             ChannelOptions options;
             options.secret = secret;
             absl::StatusOr<std::unique_ptr<HostSessions>> sessions;
             {
               py::gil_scoped_release release;
               sessions = HostSessions::Connect(*p->cluster, addresses, options);
             }
             p->sessions = ValueOrThrow(std::move(sessions));
             return p;
           }),
           py::arg("addresses"), py::arg("secret"), py::arg("topology"))
      .def("hosts", [](const PyHostSessions& p) {
        if (p.sessions == nullptr) throw std::runtime_error("the host sessions are closed");
        return HostInfos(p.sessions->hosts());
      })
      .def("close", [](PyHostSessions& p) {
        py::gil_scoped_release release;
        p.sessions.reset();
      });
  py::class_<Service>(m, "_Service", "A running pathways service (internal; see pathways.server).")
      .def(py::init([](const std::vector<std::pair<std::string, std::string>>& topology,
                       const std::vector<std::string>& host_addresses, const std::string& host_secret,
                       const std::string& listen, const std::string& secret, const std::string& policy,
                       int max_tenant_devices, int64_t tenant_memory, int64_t max_tenant_memory,
                       double max_anticipation_ms) {
             ServiceConfig config;
             config.listen_address = listen;
             config.secret = secret;
             config.policy = ValueOrThrow(ParseSchedulingPolicy(policy));
             config.max_tenant_devices = max_tenant_devices;
             config.tenant_memory_bytes = tenant_memory;
             config.max_tenant_memory_bytes = max_tenant_memory;
             if (!(max_anticipation_ms >= 0 && max_anticipation_ms <= 1000)) {
               throw py::value_error("max_anticipation_ms must be from 0 to 1000");
             }
             config.max_anticipation_ns = static_cast<int64_t>(max_anticipation_ms * 1e6);
             const TopologyOptions options = ValueOrThrow(ParseTopology(topology));
             absl::StatusOr<std::unique_ptr<Service>> service;
             {
               py::gil_scoped_release release;
               service = Service::Start(options, host_addresses, host_secret, std::move(config));
             }
             return ValueOrThrow(std::move(service));
           }),
           py::arg("topology"), py::arg("host_addresses"), py::arg("host_secret"), py::arg("listen"),
           py::arg("secret"), py::arg("policy"), py::arg("max_tenant_devices") = 0, py::arg("tenant_memory") = 0,
           py::arg("max_tenant_memory") = 0, py::arg("max_anticipation_ms") = 5.0)
      .def_property_readonly("address", &Service::address)
      .def_property_readonly("waiting_reservations", &Service::waiting_reservations)
      .def("held_bytes", &Service::held_bytes, py::arg("device"), "Memory tenants hold on `device` now.")
      .def_property_readonly("num_tenants", &Service::num_tenants)
      .def_property_readonly("queued_runs", &Service::queued_runs)
      .def_property_readonly("topology", [](const Service& s) { return s.cluster().options().ToString(); })
      .def("report", [](const Service& s) { return ReportDict(s.Report()); })
      .def("set_policy", [](Service& s, const std::string& policy) {
        s.SetPolicy(ValueOrThrow(ParseSchedulingPolicy(policy)));
      });
#endif
}

}  // namespace pw::bindings
