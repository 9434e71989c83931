#include "csrc/cluster/cluster.h"

#include <algorithm>
#include <cmath>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "csrc/base/status_macros.h"

namespace pw {
namespace {

absl::Status CheckRange(absl::string_view key, int64_t value, int64_t min, int64_t max,
                        absl::string_view unit = "") {
  if (value < min) {
    return absl::InvalidArgumentError(absl::StrCat(key, " must be at least ", min, unit, ", got ", value, unit));
  }
  if (value > max) {
    return absl::InvalidArgumentError(absl::StrCat(key, " must be at most ", max, unit, ", got ", value, unit));
  }
  return absl::OkStatus();
}

// The integer keys and their ranges (the total device count is checked on its own).
struct IntKey {
  absl::string_view name;
  int TopologyOptions::*field;
  int64_t min, max;
};
constexpr IntKey kIntKeys[] = {
    {"islands", &TopologyOptions::num_islands, 1, kMaxDevices},
    {"hosts_per_island", &TopologyOptions::hosts_per_island, 1, kMaxDevices},
    {"devices_per_host", &TopologyOptions::devices_per_host, 1, kMaxDevices},
    {"executor_threads", &TopologyOptions::num_executor_threads, 0, kMaxExecutorThreads},
    {"intra_op_threads", &TopologyOptions::intra_op_threads, 0, kMaxExecutorThreads},
};

// The keys given as a finite number of some unit, kept in nanoseconds.
struct DurationKey {
  absl::string_view name;     // e.g. "control_latency_us"
  absl::string_view ns_name;  // the field, as ValidateTopology names it
  int64_t TopologyOptions::*field;
  int64_t ns_per_unit;
  int64_t max_ns;
};
constexpr DurationKey kDurationKeys[] = {
    {"control_latency_us", "control_latency_ns", &TopologyOptions::control_latency_ns, 1000, kMaxControlLatencyNs},
    {"hang_report_seconds", "hang_report_ns", &TopologyOptions::hang_report_ns, 1'000'000'000, kMaxHangReportNs},
    {"ici_latency_us", "ici_latency_ns", &TopologyOptions::ici_latency_ns, 1000, kMaxLinkLatencyNs},
    {"dcn_latency_us", "dcn_latency_ns", &TopologyOptions::dcn_latency_ns, 1000, kMaxLinkLatencyNs},
};

// The link bandwidths: given in Gbit/s, kept in bit/s; 0 is unlimited.
struct BandwidthKey {
  absl::string_view name;     // e.g. "dcn_bandwidth_gbps"
  absl::string_view bps_name; // the field, as ValidateTopology names it
  int64_t TopologyOptions::*field;
};
constexpr BandwidthKey kBandwidthKeys[] = {
    {"ici_bandwidth_gbps", "ici_bandwidth_bps", &TopologyOptions::ici_bandwidth_bps},
    {"dcn_bandwidth_gbps", "dcn_bandwidth_bps", &TopologyOptions::dcn_bandwidth_bps},
};
constexpr double kBitsPerGbit = 1e9;

absl::Status CheckBandwidth(absl::string_view name, int64_t bps) {
  if (bps == 0 || (bps >= kMinLinkBandwidthBps && bps <= kMaxLinkBandwidthBps)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(name, " must be 0 (unlimited) or from ", kMinLinkBandwidthBps,
                                                 " to ", kMaxLinkBandwidthBps, " bits/s, got ", bps));
}

}  // namespace

absl::StatusOr<int64_t> ParseBytes(absl::string_view text, absl::string_view name) {
  struct Unit {
    absl::string_view suffix;
    int64_t scale;
  };
  static constexpr Unit kUnits[] = {{"TiB", int64_t{1} << 40}, {"GiB", int64_t{1} << 30},
                                    {"MiB", int64_t{1} << 20}, {"KiB", int64_t{1} << 10}, {"B", 1}};
  const absl::string_view spec = text;
  int64_t scale = 1;
  for (const Unit& u : kUnits) {
    if (absl::ConsumeSuffix(&text, u.suffix)) {
      scale = u.scale;
      break;
    }
  }
  int64_t value = 0;
  if (!absl::SimpleAtoi(text, &value)) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, " must be a size from 1 byte to 1TiB like 512MiB or 1GiB (an integer, then B, KiB, MiB, "
        "GiB or TiB), got '",
        spec, "'"));
  }
  if (value < 1 || value > kMaxDeviceMemoryBytes / scale) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " must be at least 1 byte and at most 1TiB, got '", spec, "'"));
  }
  return value * scale;
}

namespace {

// Parses `value` as `key`'s type into `options`, checking its range.
absl::Status SetTopologyValue(absl::string_view key, absl::string_view value, TopologyOptions* options) {
  value = absl::StripAsciiWhitespace(value);
  for (const DurationKey& k : kDurationKeys) {
    if (key != k.name) continue;
    const int64_t max_units = k.max_ns / k.ns_per_unit;
    double units = 0;
    if (!absl::SimpleAtod(value, &units) || !(units >= 0 && units <= max_units)) {
      return absl::InvalidArgumentError(
          absl::StrCat(key, " must be a finite number from 0 to ", max_units, ", got '", value, "'"));
    }
    options->*k.field = std::llround(units * k.ns_per_unit);
    return absl::OkStatus();
  }
  for (const BandwidthKey& k : kBandwidthKeys) {
    if (key != k.name) continue;
    const double min_gbps = kMinLinkBandwidthBps / kBitsPerGbit;
    const int64_t max_gbps = kMaxLinkBandwidthBps / 1'000'000'000;
    double gbps = 0;
    if (!absl::SimpleAtod(value, &gbps) || !(gbps == 0 || (gbps >= min_gbps && gbps <= max_gbps))) {
      return absl::InvalidArgumentError(absl::StrCat(key, " must be 0 (unlimited) or a finite number of Gbit/s from ",
                                                     min_gbps, " to ", max_gbps, ", got '", value, "'"));
    }
    options->*k.field = std::llround(gbps * kBitsPerGbit);
    return absl::OkStatus();
  }
  if (key == "device_memory") {
    PW_ASSIGN_OR_RETURN(options->device_memory_bytes, ParseBytes(value, "device_memory"));
    return absl::OkStatus();
  }
  if (key == "hosts") {
    for (HostsMode mode : {HostsMode::kInProcess, HostsMode::kLocalProcesses, HostsMode::kRay, HostsMode::kExternal}) {
      if (value == HostsModeName(mode)) {
        options->hosts = mode;
        return absl::OkStatus();
      }
    }
    if (value == HostsModeName(HostsMode::kService)) {
      return absl::InvalidArgumentError(
          "hosts=service is not a topology of its own: connect to a running service with "
          "pw.configure(server=...) or PATHWAYS_SERVER, and its topology is yours");
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "hosts must be 'in_process', 'local_processes', 'ray' or 'external', got '", value, "'"));
  }
  for (const IntKey& k : kIntKeys) {
    if (key != k.name) continue;
    int64_t n = 0;
    if (!absl::SimpleAtoi(value, &n)) {
      return absl::InvalidArgumentError(
          absl::StrCat(key, " must be an integer from ", k.min, " to ", k.max, ", got '", value, "'"));
    }
    PW_RETURN_IF_ERROR(CheckRange(key, n, k.min, k.max));
    options->*k.field = static_cast<int>(n);
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown topology key '", key,
      "'; known keys: islands, hosts_per_island, devices_per_host, device_memory, executor_threads, "
      "intra_op_threads, control_latency_us, hang_report_seconds, ici_latency_us, ici_bandwidth_gbps, dcn_latency_us, "
      "dcn_bandwidth_gbps, hosts"));
}

}  // namespace

std::string TopologyOptions::ToString() const {
  return absl::StrCat("islands=", num_islands, ",hosts_per_island=", hosts_per_island,
                      ",devices_per_host=", devices_per_host, ",device_memory=", device_memory_bytes,
                      "B,executor_threads=", num_executor_threads,
                      // Only when set, so that specs without it read as before.
                      intra_op_threads != 0 ? absl::StrCat(",intra_op_threads=", intra_op_threads) : "",
                      ",control_latency_us=",
                      control_latency_ns / 1000.0, ",hang_report_seconds=", hang_report_ns / 1e9,
                      // Only when set, so that specs without them read as before.
                      models_interconnect()
                          ? absl::StrCat(",ici_latency_us=", ici_latency_ns / 1000.0, ",ici_bandwidth_gbps=",
                                         ici_bandwidth_bps / kBitsPerGbit, ",dcn_latency_us=", dcn_latency_ns / 1000.0,
                                         ",dcn_bandwidth_gbps=", dcn_bandwidth_bps / kBitsPerGbit)
                          : "",
                      hosts == HostsMode::kInProcess ? "" : absl::StrCat(",hosts=", HostsModeName(hosts)));
}

absl::string_view HostsModeName(HostsMode mode) {
  switch (mode) {
    case HostsMode::kInProcess:
      return "in_process";
    case HostsMode::kLocalProcesses:
      return "local_processes";
    case HostsMode::kRay:
      return "ray";
    case HostsMode::kExternal:
      return "external";
    case HostsMode::kService:
      return "service";
  }
  return "?";
}

absl::Status ValidateTopology(const TopologyOptions& options) {
  for (const IntKey& k : kIntKeys) PW_RETURN_IF_ERROR(CheckRange(k.name, options.*k.field, k.min, k.max));
  // Each count is at most kMaxDevices, so the product fits in int64.
  const int64_t devices =
      int64_t{options.num_islands} * options.hosts_per_island * options.devices_per_host;
  if (devices > kMaxDevices) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a topology has at most ", kMaxDevices, " devices (islands x hosts_per_island x devices_per_host), got ",
        options.num_islands, " x ", options.hosts_per_island, " x ", options.devices_per_host, " = ", devices));
  }
  PW_RETURN_IF_ERROR(CheckRange("device_memory", options.device_memory_bytes, 1, kMaxDeviceMemoryBytes, " bytes"));
  for (const DurationKey& k : kDurationKeys) PW_RETURN_IF_ERROR(CheckRange(k.ns_name, options.*k.field, 0, k.max_ns));
  for (const BandwidthKey& k : kBandwidthKeys) PW_RETURN_IF_ERROR(CheckBandwidth(k.bps_name, options.*k.field));
  if (options.models_interconnect() && options.hosts != HostsMode::kInProcess) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ici_latency_us, ici_bandwidth_gbps, dcn_latency_us and dcn_bandwidth_gbps model the interconnect of "
        "hosts=in_process only; with hosts=",
        HostsModeName(options.hosts), " transfers cross real sockets: leave them 0"));
  }
  return absl::OkStatus();
}

absl::StatusOr<TopologyOptions> ParseTopology(
    const std::vector<std::pair<std::string, std::string>>& items) {
  TopologyOptions options;
  for (const auto& [key, value] : items) PW_RETURN_IF_ERROR(SetTopologyValue(key, value, &options));
  PW_RETURN_IF_ERROR(ValidateTopology(options));
  return options;
}

absl::StatusOr<TopologyOptions> ParseTopology(absl::string_view spec) {
  std::vector<std::pair<std::string, std::string>> items;
  for (absl::string_view item : absl::StrSplit(spec, ',', absl::SkipWhitespace())) {
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(item, absl::MaxSplits('=', 1));
    items.emplace_back(absl::StripAsciiWhitespace(kv.first), kv.second);
  }
  return ParseTopology(items);
}

std::string Device::ToString() const {
  std::string kind = *kind_;
  if (!kind.empty()) kind[0] = absl::ascii_toupper(kind[0]);
  return absl::StrCat(kind, "Device(id=", id_, ", island=", island_->id(), ", host=", host_->id(), ")");
}

bool Device::MarkFailed(absl::Status why) {
  {
    MutexLock lock(&failure_mu_);
    if (failed_.load(std::memory_order_acquire)) return false;
    failure_ = why.ok() ? absl::UnavailableError(absl::StrCat("device ", id_, " (island ", island_->id(), ", host ",
                                                              host_->id(), ") has failed"))
                        : std::move(why);
    failed_.store(true, std::memory_order_release);
  }
  island_->num_failed_.fetch_add(1, std::memory_order_acq_rel);
  return true;
}

std::atomic<bool> Device::any_revived_{false};

bool Device::Revive(uint64_t first_buffer_id) {
  {
    MutexLock lock(&failure_mu_);
    if (!failed_.load(std::memory_order_acquire)) return false;
    // Before the device reads as healthy: whoever sees it so sees which
    // buffers went with the earlier process.
    if (first_buffer_id > 0) {
      first_buffer_id_.store(first_buffer_id, std::memory_order_release);
      any_revived_.store(true, std::memory_order_release);
    }
    failure_ = absl::OkStatus();
    failed_.store(false, std::memory_order_release);
  }
  island_->num_failed_.fetch_sub(1, std::memory_order_acq_rel);
  return true;
}

absl::Status Device::failure() const {
  if (!failed()) return absl::OkStatus();
  MutexLock lock(&failure_mu_);
  return failure_;
}

absl::StatusOr<std::unique_ptr<Cluster>> Cluster::Create(const TopologyOptions& options) {
  PW_RETURN_IF_ERROR(ValidateTopology(options));
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
