#ifndef PATHWAYS_CLIENT_HOST_SESSIONS_H_
#define PATHWAYS_CLIENT_HOST_SESSIONS_H_

// The client's sessions with its host processes (paper §4, Figure 3): one
// control channel per host of the cluster, each host told which devices it
// serves. HostSessions watches every channel and records a lost host once, and
// tells every surviving host of it at once (PeersLost), so that none waits
// for the lost one: not for its transfers, its rendezvous store, nor the
// collective groups it belonged to.
//
// Thread-safe. The cluster must outlive the sessions.

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "csrc/base/mutex.h"
#include "csrc/client/host_links.h"
#include "csrc/cluster/cluster.h"
#include "csrc/coordination/host_channel.h"

namespace pw {

// Waits for a known number of hosts' replies (shared with their callbacks:
// a reply may come after a wait timed out).
class HostReplies {
 public:
  explicit HostReplies(int n) : left_(n) {}
  void Done(absl::Status status) {
    MutexLock lock(&mu_);
    if (first_error_.ok() && !status.ok()) first_error_ = std::move(status);
    if (--left_ == 0) cv_.SignalAll();
  }
  // The first error, or DeadlineExceeded after `timeout_ns`.
  absl::Status Wait(int64_t timeout_ns, absl::string_view what) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::nanoseconds(timeout_ns);
    MutexLock lock(&mu_);
    while (left_ > 0) {
      if (!cv_.WaitUntil(&mu_, deadline)) {
        return absl::DeadlineExceededError(absl::StrCat(what, ": ", left_, " hosts did not answer in time"));
      }
    }
    return first_error_;
  }

 private:
  Mutex mu_;
  CondVar cv_;
  int left_ ABSL_GUARDED_BY(mu_);
  absl::Status first_error_ ABSL_GUARDED_BY(mu_);
};

class HostSessions final : public HostLinks {
 public:
  // Called once per lost host, on a gRPC or heartbeat thread, after the
  // surviving hosts were told; must not block.
  using LostCallback = std::function<void(int host, const absl::Status& why)>;

  // Connects to `addresses[h]` for host h of `cluster` (one address per
  // host), presenting `options.secret`, and configures each host with its
  // devices. InvalidArgument if the counts differ; FailedPrecondition naming
  // both sides' versions if a host runs another build (another control
  // protocol or op registry: coordination/protocol_version.h; the host
  // refuses the Hello, or, if it is older than that check, its reply says
  // so); otherwise the first host's error, naming it (the channels opened
  // are closed again).
  static absl::StatusOr<std::unique_ptr<HostSessions>> Connect(const Cluster& cluster,
                                                           const std::vector<std::string>& addresses,
                                                           const ChannelOptions& options, LostCallback on_lost = {});
  // Closes every session: hosts started for this client stop.
  ~HostSessions() override;

  // Joins the hosts into one cluster (JoinCluster): their data planes and
  // rendezvous stores connect, each pair of hosts with a key of its own.
  // `addresses` as given to Connect. The first host's error, naming it, or
  // DeadlineExceeded after `timeout_ns`.
  absl::Status Join(const std::vector<std::string>& addresses, int64_t timeout_ns);

  // A new host process at `address` takes the place of lost host `host`
  // (its loss dealt with: hosts() lists it lost): a session with it is
  // opened and configured as host `host`; it joins the cluster with fresh
  // peer keys for its pairs, its buffer ids starting at `first_buffer_id`
  // (those below were the lost process's), and every live host takes it
  // back (wire::PeerJoined). Blocks until all have answered (the data
  // planes connected), or `timeout_ns`. The caller holds its dispatch lock
  // throughout (no run goes to any host meanwhile) and revives the host's
  // devices once this returns OK. FailedPrecondition if `host` is not
  // lost, or if the hosts were never joined; InvalidArgument for a host
  // not in the cluster; otherwise the first host's error, naming it: the
  // new session is lost then (reported as a loss of `host` again), and the
  // host stays lost.
  absl::Status ReplaceHost(int host, const std::string& address, uint64_t first_buffer_id, int64_t timeout_ns);

  // HostLinks: the hosts' sessions, directly.
  int num_hosts() const override { return num_hosts_; }
  void Send(int host, wire::Request request, HostChannel::ReplyCallback done) override {
    channel(host).Send(std::move(request), std::move(done));
  }
  void Flush(int host) override { channel(host).Flush(); }
  void SendRun(const std::vector<int>& hosts, std::vector<wire::Request> requests,
               std::vector<HostChannel::ReplyCallback> done, const RunAdmissionInfo& admission) override;
  bool alive(int host) const override { return channel(host).alive(); }
  absl::Status status(int host) const override { return channel(host).status(); }
  int64_t clock_offset_ns(int host) const override { return channel(host).clock_offset_ns(); }
  // Surviving hosts told of a loss so far (PeersLost requests sent; tests).
  int64_t survivors_told() const { return survivors_told_.load(std::memory_order_relaxed); }
  // Host `host`'s session now (a replaced host's new one).
  HostChannel& channel(int host) const { return *current_[host].load(std::memory_order_acquire); }
  void Close(const absl::Status& why) override;
  // Every host, by id. A host is listed lost once its loss has been dealt
  // with (the survivors told, the LostCallback returned: its devices are
  // failed by then in a RemoteCluster), so whoever sees it lost also sees
  // what follows from that; a host whose loss is being dealt with now is
  // waited for (microseconds: that never blocks), so whoever saw its loss
  // elsewhere (a request's HostLostError) sees it lost here too.
  std::vector<RemoteHostInfo> hosts() const override;

 private:
  HostSessions() = default;
  void OnLost(int host, const absl::Status& why);
  // Opens and configures the session of host `host` of the cluster at
  // `address` (Connect's, and ReplaceHost's).
  absl::StatusOr<std::unique_ptr<HostChannel>> ConnectHost(const Host& host, const std::string& address);

  const Cluster* cluster_ = nullptr;
  ChannelOptions options_;  // Connect's, for the sessions of replacements
  int num_hosts_ = 0;
  LostCallback on_lost_;
  std::atomic<int64_t> survivors_told_{0};
  // By host id: whether its loss has been dealt with (see hosts()).
  std::unique_ptr<std::atomic<bool>[]> loss_handled_;
  // Protects the list of channels while it grows (Connect, ReplaceHost) and
  // while a loss is told to the others, and whether the sessions are
  // closing (then no loss is told: the channels are going); loss_handled_
  // is set under it, and so is a host's session replaced.
  mutable Mutex mu_;
  mutable CondVar handled_cv_;  // a loss was dealt with (loss_handled_)
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  // Every session opened, a replaced host's earlier ones included: kept
  // until the destructor, so a reference taken from current_ stays valid.
  std::vector<std::unique_ptr<HostChannel>> channels_ ABSL_GUARDED_BY(mu_);
  // Each host's session now, by host id (complete once Connect returns).
  std::unique_ptr<std::atomic<HostChannel*>[]> current_;
  // Set by Join: what a replacement's JoinCluster repeats (the cluster's
  // group prefix, every host's control and data plane addresses) and how
  // many times each host was replaced. One ReplaceHost at a time.
  Mutex replace_mu_;
  std::string group_prefix_ ABSL_GUARDED_BY(replace_mu_);
  std::vector<std::string> addresses_ ABSL_GUARDED_BY(replace_mu_);
  std::vector<std::string> data_addresses_ ABSL_GUARDED_BY(replace_mu_);
  std::vector<int> epochs_ ABSL_GUARDED_BY(replace_mu_);
};

}  // namespace pw

#endif  // PATHWAYS_CLIENT_HOST_SESSIONS_H_
