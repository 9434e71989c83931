#ifndef PATHWAYS_CLIENT_HOST_POOL_H_
#define PATHWAYS_CLIENT_HOST_POOL_H_

// The client's sessions with its host processes (paper §4, Figure 3): one
// control channel per host of the cluster, each host told which devices it
// serves. The pool watches every channel and records a lost host once.
//
// Thread-safe. The cluster must outlive the pool.

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "csrc/cluster/cluster.h"
#include "csrc/coordination/host_channel.h"

namespace pw {

struct RemoteHostInfo {
  int id = 0;
  int island = 0;
  std::string address;
  int64_t pid = 0;
  uint64_t incarnation = 0;
  absl::Status status;  // OK while reachable; the loss (kHostLost) after
  bool alive() const { return status.ok(); }
};

class HostPool {
 public:
  // Called once per lost host, on a gRPC or heartbeat thread; must not block.
  using LostCallback = std::function<void(int host, const absl::Status& why)>;

  // Connects to `addresses[h]` for host h of `cluster` (one address per
  // host), presenting `options.secret`, and configures each host with its
  // devices. InvalidArgument if the counts differ; FailedPrecondition naming
  // both sides' versions if a host runs another build (another control
  // protocol or op registry: coordination/protocol_version.h; the host
  // refuses the Hello, or, if it is older than that check, its reply says
  // so); otherwise the first host's error, naming it (the channels opened
  // are closed again).
  static absl::StatusOr<std::unique_ptr<HostPool>> Connect(const Cluster& cluster,
                                                           const std::vector<std::string>& addresses,
                                                           const ChannelOptions& options, LostCallback on_lost = {});
  // Closes every session: hosts started for this client stop.
  ~HostPool();

  int num_hosts() const { return static_cast<int>(channels_.size()); }
  HostChannel& channel(int host) { return *channels_[host]; }
  std::vector<RemoteHostInfo> hosts() const;

 private:
  HostPool() = default;
  void OnLost(int host, const absl::Status& why);

  const Cluster* cluster_ = nullptr;
  LostCallback on_lost_;
  std::vector<std::unique_ptr<HostChannel>> channels_;
};

}  // namespace pw

#endif  // PATHWAYS_CLIENT_HOST_POOL_H_
