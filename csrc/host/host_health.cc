#include "csrc/host/host_health.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "csrc/base/error_kind.h"

namespace pw {

HostHealth::HostHealth(const HostLayout& layout)
    : layout_(layout),
      failed_(new std::atomic<bool>[layout.num_local_devices()]),
      lost_peers_(new std::atomic<bool>[layout.num_hosts]) {
  for (int d = 0; d < layout.num_local_devices(); ++d) failed_[d].store(false, std::memory_order_relaxed);
  for (int h = 0; h < layout.num_hosts; ++h) lost_peers_[h].store(false, std::memory_order_relaxed);
}

absl::Status HostHealth::FailDevices(const wire::FailDevices& request) {
  for (int d : request.device_ids()) {
    if (d < 0 || d >= static_cast<int>(layout_.local_index.size()) || layout_.local_index[d] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("fail_devices: device ", d, " is not on host ", layout_.host_id));
    }
  }
  for (int d : request.device_ids()) failed_[layout_.local_index[d]].store(true, std::memory_order_release);
  any_failed_.store(true, std::memory_order_release);
  Wake();
  return absl::OkStatus();
}

absl::Status HostHealth::CheckHealthy(absl::Span<const int> local_devices) const {
  if (!any_failed_.load(std::memory_order_acquire)) return absl::OkStatus();
  for (int d : local_devices) {
    if (failed_[d].load(std::memory_order_acquire)) {
      return absl::UnavailableError(absl::StrCat("device ", layout_.local_device_ids[d], " (island ",
                                                 layout_.island_id, ", host ", layout_.host_id, ") has failed"));
    }
  }
  return absl::OkStatus();
}

absl::Status HostHealth::PeersLost(const wire::PeersLost& request, absl::FunctionRef<void(int host)> newly_lost) {
  for (int h : request.host_ids()) {
    if (h < 0 || h >= layout_.num_hosts || h == layout_.host_id) {
      return absl::InvalidArgumentError(
          absl::StrCat("peers_lost: no other host ", h, " in this cluster of ", layout_.num_hosts, " hosts"));
    }
  }
  for (int h : request.host_ids()) {
    if (lost_peers_[h].exchange(true, std::memory_order_acq_rel)) continue;
    any_peer_lost_.store(true, std::memory_order_release);
    newly_lost(h);
  }
  return absl::OkStatus();
}

void HostHealth::PeerJoined(int host) {
  if (host < 0 || host >= layout_.num_hosts || host == layout_.host_id) return;
  lost_peers_[host].store(false, std::memory_order_release);
  // any_peer_lost_ only makes CheckPeers look: left set, it costs a look
  // at the gang's hosts, never a wrong answer.
}

bool HostHealth::PeerLost(int host) const {
  return host >= 0 && host < layout_.num_hosts && lost_peers_[host].load(std::memory_order_acquire);
}

absl::Status HostHealth::CheckPeers(const HostDeviceList& gang) const {
  if (!any_peer_lost_.load(std::memory_order_acquire)) return absl::OkStatus();
  for (int h : gang.host_set) {
    if (h != layout_.host_id && PeerLost(h)) {
      return HostLostError(absl::StrCat("host ", h, " of the gang (", absl::StrJoin(gang.host_set, ","),
                                        ") was lost"));
    }
  }
  return absl::OkStatus();
}

void HostHealth::WaitWhileHealthy(absl::Span<const int> local_devices,
                                  std::chrono::steady_clock::time_point deadline, absl::FunctionRef<bool()> ended) {
  MutexLock lock(&mu_);
  while (CheckHealthy(local_devices).ok() && !ended() && cv_.WaitUntil(&mu_, deadline)) {
  }
}

void HostHealth::Wake() {
  MutexLock lock(&mu_);
  cv_.SignalAll();
}

}  // namespace pw
