#ifndef PATHWAYS_HOST_HOST_PROCESS_H_
#define PATHWAYS_HOST_HOST_PROCESS_H_

// The host process's end of the control plane (paper §4, Figure 3): a host
// process serves one host's devices to the client that configured it, and
// HostProcess takes that client's requests. It takes its configuration
// from the first Hello that carries one (a client of another build, whose
// Hello carries other versions than this one's, is refused:
// FailedPrecondition naming both; coordination/protocol_version.h),
// answers heartbeats with its incarnation (on the server's heartbeat thread,
// never behind a request), and knows which session owns it, so the process
// can exit when that client goes (see host_main.h). Once the client has
// configured every host, JoinCluster connects the hosts to each other
// (every host keeps a rendezvous store for the collective groups whose
// lowest host it is) and the owner's requests run programs on its
// HostExecutor. The owner may be a service (pathways-server) that takes
// many tenants: each of its program requests names the tenant whose ids it
// uses in Request.session (0: the owner's own, kOneSession; only the
// owner's session may send program requests, whichever session they
// name), and EndSession ends a tenant that has gone
// (HostExecutor::EndSession; its reply comes once all of it has taken
// effect; session 0 is refused: the owner's own ends with its stream). The
// owner gives a tenant a key (TenantKey, revoked by EndSession): a session
// that proves it ("tenant-<t>", auth.h) is that tenant's own and may put
// and fetch its buffers, nothing else (its bulk data, which does not go
// through the service). A tenant's requests of the service itself
// (Forward, Commit, ServiceControl) are refused here with InvalidArgument.
// When the client
// tells it that other hosts were lost
// (PeersLost), it stops waiting for them: its sessions with their stores
// end, rendezvous with them give up, and its transfers with them fail. When
// a new process takes a lost host's place (PeerJoined), this host takes it
// back: its new peer key and store, a new data plane connection, its groups
// anew. A host process may itself be such a replacement: its JoinCluster
// then gives the others' data plane addresses and which hosts are lost now.
//
// The rendezvous store and its scopes. JoinCluster gives this host its row
// of peer keys (auth.h): a session that proves host h's key is host h (the
// cluster's secret alone proves no host; such a session may not use the
// store at all). Every key lies under the cluster's group prefix P:
//   P/data/<h>           host h's data plane address: written by host h
//                        only, read by any host of the cluster;
//   P/hosts/<g>/.../<k>  a collective group of the hosts g (ascending ids,
//                        comma-separated, at least two, this host the
//                        lowest: a group meets in its lowest host's store)
//                        and whatever follows (a generation): read by the
//                        members of g only; written only under a last part
//                        "<r>" or "rank_<r>" (Gloo's addresses of rank r),
//                        by host g[r] only.
// Anything else is PermissionDenied naming the key and why, and so is a
// value over 1 MiB or a host's 65536th key: a host that is taken over can
// neither point others' connections elsewhere nor fill this host's memory.
//
// Thread-safe.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "csrc/base/mutex.h"
#include "csrc/coordination/collective_group.h"
#include "csrc/coordination/host_server.h"
#include "csrc/host/host_executor.h"
#include "csrc/host/peer_stores.h"

namespace pw {

// Whether host `peer` may write (or read) rendezvous key `key` in the store
// of host `self`, of a cluster of `num_hosts` with group prefix `prefix`
// (the scopes above; `peer` -1: a session of the cluster's secret). OK or
// PermissionDenied saying why.
absl::Status CheckRendezvousScope(absl::string_view prefix, int num_hosts, int self, int peer, absl::string_view key,
                                  bool write);
// Test hooks: a host slow at its work, as a loaded or throttled machine is
// (its heartbeats must still be answered at once). Set from the environment
// variable PATHWAYS_HOST_TEST_DELAYS by the host's main:
// "load_function=SECONDS,put=SECONDS" (either may be left out).
struct HostTestDelays {
  int64_t load_function_ns = 0;  // slept before compiling each function
  int64_t put_ns = 0;            // slept before taking each chunk of a put
};

class HostProcess final : public RequestHandler {
 public:
  using TestDelays = HostTestDelays;
  // InvalidArgument naming the part it does not understand.
  static absl::StatusOr<TestDelays> ParseTestDelays(absl::string_view text);

  // `secret` is the cluster's: the host presents it to the other hosts at
  // the rendezvous.
  // `bind_ip`: the address its data plane (Gloo) binds and advertises.
  explicit HostProcess(std::string secret = "", std::string bind_ip = "127.0.0.1", TestDelays delays = {});
  ~HostProcess() override;

  // Random, fixed for the life of this process (see wire::HelloReply).
  uint64_t incarnation() const { return incarnation_; }

  void Handle(const std::shared_ptr<HostSession>& session, wire::Request request) override;
  void OnSessionEnd(const std::shared_ptr<HostSession>& session) override;
  // Host `host`'s peer key, once this host has joined its cluster
  // (FailedPrecondition before: the other host may try again).
  absl::StatusOr<std::string> PeerKey(int host) override;
  // A service's tenant's key (wire::TenantKey), while its session lasts.
  absl::StatusOr<std::string> TenantKey(uint64_t tenant) override;
  void Heartbeat(const wire::Ping& ping, wire::Pong* pong) override;

  // Sessions this host opened with `host`'s rendezvous store so far, 0
  // before it joined its cluster (tests: a broken one is opened anew).
  int store_sessions_opened(int host) const;

  // Whether a session configured this host, and whether that session has
  // ended since (the host's client is gone).
  bool configured() const;
  bool owner_gone() const;
  // Blocks until the owner's session ends or `timeout_ns` passes; true if
  // it ended.
  bool AwaitOwnerGone(int64_t timeout_ns) const;

  // What runs this host's programs, once it has joined its cluster (null
  // before).
  std::shared_ptr<HostExecutor> executor() const;

 private:
  wire::Reply HandleHello(const std::shared_ptr<HostSession>& session, const wire::Hello& hello);
  // Connects to the other hosts on a thread of its own, then replies (with
  // this host's data plane address: JoinClusterReply).
  void Join(const std::shared_ptr<HostSession>& session, wire::Request request);
  // A new process replaced another host (wire::PeerJoined): its new peer
  // key and store at once, its groups and health in the order of the
  // owner's requests; the data plane connects on a thread of its own, then
  // replies.
  void PeerJoined(const std::shared_ptr<HostSession>& session, wire::Request request);
  // The owner's requests for its programs; false if `request` is not one.
  bool HandleProgramRequest(const std::shared_ptr<HostSession>& session, wire::Request& request);
  // The rendezvous store's requests, within the session's scopes.
  absl::Status KvSet(const HostSession& session, const wire::KvSet& request);
  absl::StatusOr<std::string> KvGet(const HostSession& session, const wire::KvGet& request);
  // The client says these hosts were lost (see PeersLost in control.proto).
  absl::Status HandlePeersLost(const wire::PeersLost& request);


  const uint64_t incarnation_;
  const std::string secret_;
  const std::string bind_ip_;
  const TestDelays delays_;
  // The rendezvous stores: this host's (kept for the groups whose lowest
  // host it is) and the other hosts', each through a session with its host
  // made at first use (see RendezvousStores).
  InMemoryKeyValueStore kv_;
  // Set once, by the join thread, before executor_ is.
  std::unique_ptr<PeerStores> stores_;
  std::atomic<bool> stores_ready_{false};
  std::thread join_thread_;
  mutable Mutex mu_;
  mutable CondVar cv_;
  // PeerJoined's connecting threads, joined when this host stops.
  std::vector<std::thread> peer_threads_ ABSL_GUARDED_BY(mu_);
  // Protects the configuration, the owning session's id (0: none yet) and
  // whether it has ended.
  wire::HostConfig config_ ABSL_GUARDED_BY(mu_);
  uint64_t owner_ ABSL_GUARDED_BY(mu_) = 0;
  bool owner_gone_ ABSL_GUARDED_BY(mu_) = false;
  bool joining_ ABSL_GUARDED_BY(mu_) = false;
  // Set by Join: the cluster's group prefix and size, this host's row of
  // peer keys (empty before), and how many rendezvous keys each host wrote.
  std::string group_prefix_ ABSL_GUARDED_BY(mu_);
  int num_hosts_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::string> peer_keys_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> keys_written_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<HostExecutor> executor_ ABSL_GUARDED_BY(mu_);
  // The service's tenants' keys, by session (wire::TenantKey).
  absl::flat_hash_map<uint64_t, std::string> tenant_keys_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pw

#endif  // PATHWAYS_HOST_HOST_PROCESS_H_
