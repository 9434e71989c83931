#ifndef PATHWAYS_HOST_HOST_HEALTH_H_
#define PATHWAYS_HOST_HOST_HEALTH_H_

// What has failed around one host: its devices marked failed (fault
// injection, wire::FailDevices) and the other hosts the client said were
// lost (wire::PeersLost). The executor's device threads and transfers ask
// before they use a device or meet a host (one atomic load each while
// nothing has failed); a part in its simulated time waits here, so that a
// device failing ends that time at once.
//
// Thread-safe: the marks are atomics; a device's is never cleared, a lost
// host's only when a new process takes its place (PeerJoined). The lock
// only orders the simulated-time waits with their wake-ups, and is a leaf.

#include <atomic>
#include <chrono>
#include <memory>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "csrc/base/mutex.h"
#include "csrc/coordination/control.pb.h"
#include "csrc/host/host_layout.h"

namespace pw {

class HostHealth {
 public:
  // `layout` must outlive this.
  explicit HostHealth(const HostLayout& layout);
  HostHealth(const HostHealth&) = delete;
  HostHealth& operator=(const HostHealth&) = delete;

  // Marks these devices (all of this host's: else InvalidArgument, and
  // none is marked) failed for good, and wakes the simulated-time waits.
  absl::Status FailDevices(const wire::FailDevices& request);
  // Unavailable naming the first failed device among `local_devices`
  // (indices in this host's devices), else OK. One atomic load while no
  // device has failed.
  absl::Status CheckHealthy(absl::Span<const int> local_devices) const;

  // Marks the hosts of `request` lost, calling `newly_lost` (on this
  // thread) for each one not marked before. InvalidArgument for a host
  // that is not another host of the cluster (nothing is marked then).
  absl::Status PeersLost(const wire::PeersLost& request, absl::FunctionRef<void(int host)> newly_lost);
  // A new process took `host`'s place: it is not lost any more. This host
  // and one outside the cluster are ignored.
  void PeerJoined(int host);
  // Whether this host was told that `host` was lost (and not that it was
  // replaced since).
  bool PeerLost(int host) const;
  // HostLost naming a host of `gang` this host was told was lost, else OK.
  // One atomic load while no peer was lost.
  absl::Status CheckPeers(const HostDeviceList& gang) const;

  // Waits until `deadline`, until one of `local_devices` fails, or until
  // `ended()` (asked at every wake-up, under this object's lock: it must
  // not block) is true.
  void WaitWhileHealthy(absl::Span<const int> local_devices, std::chrono::steady_clock::time_point deadline,
                        absl::FunctionRef<bool()> ended);
  // Wakes the waits above to look again (a device failed, the host is
  // stopping, a part's simulated time was ended).
  void Wake();

 private:
  const HostLayout& layout_;
  // Failed local devices, by index in this host.
  std::unique_ptr<std::atomic<bool>[]> failed_;
  std::atomic<bool> any_failed_{false};
  // Hosts this host was told were lost, by host id.
  std::unique_ptr<std::atomic<bool>[]> lost_peers_;
  std::atomic<bool> any_peer_lost_{false};
  Mutex mu_;    // orders WaitWhileHealthy with Wake
  CondVar cv_;
};

}  // namespace pw

#endif  // PATHWAYS_HOST_HOST_HEALTH_H_
