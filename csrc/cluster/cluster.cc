#include "csrc/cluster/cluster.h"

#include <thread>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace pw {
namespace {

absl::StatusOr<int64_t> ParseBytes(absl::string_view text) {
  struct Unit {
    absl::string_view suffix;
    int64_t scale;
  };
  static constexpr Unit kUnits[] = {{"GiB", int64_t{1} << 30}, {"MiB", int64_t{1} << 20},
                                    {"KiB", int64_t{1} << 10}, {"B", 1}};
  int64_t scale = 1;
  for (const Unit& u : kUnits) {
    if (absl::ConsumeSuffix(&text, u.suffix)) {
      scale = u.scale;
      break;
    }
  }
  int64_t value = 0;
  if (!absl::SimpleAtoi(text, &value) || value < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("device_memory must be a positive size like 1GiB or 512MiB, got '", text, "'"));
  }
  return value * scale;
}

}  // namespace

std::string TopologyOptions::ToString() const {
  return absl::StrCat("islands=", num_islands, ",hosts_per_island=", hosts_per_island,
                      ",devices_per_host=", devices_per_host, ",device_memory=", device_memory_bytes,
                      "B,executor_threads=", num_executor_threads, ",control_latency_us=",
                      control_latency_ns / 1000.0);
}

absl::StatusOr<TopologyOptions> ParseTopology(absl::string_view spec) {
  TopologyOptions options;
  for (absl::string_view item : absl::StrSplit(spec, ',', absl::SkipWhitespace())) {
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(item, absl::MaxSplits('=', 1));
    const absl::string_view key = absl::StripAsciiWhitespace(kv.first);
    const absl::string_view value = absl::StripAsciiWhitespace(kv.second);
    if (key == "control_latency_us") {
      double us = 0;
      if (!absl::SimpleAtod(value, &us) || us < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("control_latency_us needs a non-negative number, got '", value, "'"));
      }
      options.control_latency_ns = static_cast<int64_t>(us * 1000);
      continue;
    }
    if (key == "device_memory") {
      auto bytes = ParseBytes(value);
      if (!bytes.ok()) return bytes.status();
      options.device_memory_bytes = *bytes;
      continue;
    }
    int* field = nullptr;
    if (key == "islands") field = &options.num_islands;
    if (key == "hosts_per_island") field = &options.hosts_per_island;
    if (key == "devices_per_host") field = &options.devices_per_host;
    if (key == "executor_threads") field = &options.num_executor_threads;
    if (field == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown topology key '", key,
          "'; known keys: islands, hosts_per_island, devices_per_host, device_memory, executor_threads, "
          "control_latency_us"));
    }
    if (!absl::SimpleAtoi(value, field) || *field < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("topology key '", key, "' needs a non-negative integer, got '", value, "'"));
    }
  }
  return options;
}

std::string Device::ToString() const {
  std::string kind = *kind_;
  if (!kind.empty()) kind[0] = absl::ascii_toupper(kind[0]);
  return absl::StrCat(kind, "Device(id=", id_, ", island=", island_->id(), ", host=", host_->id(), ")");
}

absl::StatusOr<std::unique_ptr<Cluster>> Cluster::Create(const TopologyOptions& options) {
  if (options.num_islands < 1 || options.hosts_per_island < 1 || options.devices_per_host < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a cluster needs at least one island, host and device; got ", options.ToString()));
  }
  if (options.device_memory_bytes < 1) {
    return absl::InvalidArgumentError("device_memory must be at least 1 byte");
  }
  auto cluster = std::unique_ptr<Cluster>(new Cluster());
  cluster->options_ = options;
  if (cluster->options_.num_executor_threads == 0) {
    cluster->options_.num_executor_threads =
        std::max(1u, std::min(4u, std::thread::hardware_concurrency()));
  }
  cluster->kind_ = options.device_kind;
  int device_id = 0, host_id = 0;
  for (int i = 0; i < options.num_islands; ++i) {
    auto island = std::make_unique<Island>();
    island->id_ = i;
    for (int h = 0; h < options.hosts_per_island; ++h) {
      auto host = std::make_unique<Host>();
      host->id_ = host_id++;
      host->island_ = island.get();
      for (int d = 0; d < options.devices_per_host; ++d) {
        auto device = std::make_unique<Device>();
        device->id_ = device_id++;
        device->index_in_host_ = d;
        device->index_in_island_ = static_cast<int>(island->devices_.size());
        device->kind_ = &cluster->kind_;
        device->memory_capacity_ = options.device_memory_bytes;
        device->host_ = host.get();
        device->island_ = island.get();
        host->devices_.push_back(device.get());
        island->devices_.push_back(device.get());
        cluster->device_ptrs_.push_back(device.get());
        cluster->devices_.push_back(std::move(device));
      }
      island->hosts_.push_back(host.get());
      cluster->host_ptrs_.push_back(host.get());
      cluster->hosts_.push_back(std::move(host));
    }
    cluster->island_ptrs_.push_back(island.get());
    cluster->islands_.push_back(std::move(island));
  }
  return cluster;
}

absl::StatusOr<Device*> Cluster::device(int id) const {
  if (id < 0 || id >= num_devices()) {
    return absl::NotFoundError(absl::StrCat("unknown device id ", id, "; this cluster has devices 0..",
                                            num_devices() - 1));
  }
  return device_ptrs_[id];
}

}  // namespace pw
