#ifndef PATHWAYS_HOST_HOST_TRANSFERS_H_
#define PATHWAYS_HOST_HOST_TRANSFERS_H_

// A host's transfers (see "Data" in host_executor.h): each shard moves from
// the host of its source device to the host of its destination device, a
// copy inside a host, else one message on the data plane
// (coordination/data_plane.h) straight from the source buffer into the
// destination. One sending and one receiving thread per other host (a
// Peer): sends go in the order they were started (the client's global
// order); each message names its run and its destination buffer, and the
// receiving thread takes it into the receive posted for that buffer, waits
// for that receive if its run has not reached this host yet, or drops it if
// the run is dead here (DeadRuns).
//
// Thread-safe. Lock order: the table of peers' lock, alone; a peer's lock,
// then DeadRuns' (the receiving thread asks under it). A destination's
// buffer completes, running its waiters, on whichever thread brought its
// last part, under no lock of this object.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "csrc/base/mutex.h"
#include "csrc/coordination/data_plane.h"
#include "csrc/host/host_buffers.h"
#include "csrc/host/host_health.h"
#include "csrc/host/host_layout.h"
#include "csrc/host/host_runs.h"

namespace pw {

class RendezvousStores;  // host_groups.h

class HostTransfers {
 public:
  // `layout`, `dead_runs` and `health` must outlive this. `bind_ip`: the
  // address the data plane binds and advertises. `secret`: the cluster's,
  // which every data plane connection must prove it knows (empty: the
  // cluster's group prefix stands in, for tests), or with `peer_keys` (this
  // host's row from the join, one per host), the key of the pair of hosts.
  // `stopping`: set by the owner when the host stops. `first_buffer_id`:
  // for a process that replaces a lost host (JoinCluster's), messages of
  // kOneSession's runs from before it (a first buffer id below this one)
  // are dropped on arrival: a survivor may still send one it queued for
  // the earlier process.
  HostTransfers(const HostLayout& layout, std::string bind_ip, std::string secret,
                std::vector<std::string> peer_keys, const DeadRuns& dead_runs, const HostHealth& health,
                const std::atomic<bool>& stopping, uint64_t first_buffer_id = 0);
  // Stop().
  ~HostTransfers();
  HostTransfers(const HostTransfers&) = delete;
  HostTransfers& operator=(const HostTransfers&) = delete;

  // Connects the data plane to every other host (blocks until they all
  // have joined, or fails after `timeout`); the hosts find each other's
  // addresses in host 0's rendezvous store. Before any transfer. For a
  // process that replaces a lost host, `data_addresses` holds every other
  // host's data plane address instead (JoinCluster's, empty for a host
  // lost now: it is neither dialed nor awaited), and this host's own
  // address goes into its own store, where the others read it (RejoinPeer).
  absl::Status Connect(RendezvousStores& stores, absl::Duration timeout,
                       const std::vector<std::string>& data_addresses = {});
  // Where this host's data plane listens, once connected (else empty).
  std::string address() const;
  // The rendezvous key of `host`'s data plane address.
  std::string AddressKey(int host) const;

  // A new process took `host`'s place (PeerJoined): its data plane listens
  // at `address`, and proves `key` (the pair's new peer key). The threads
  // that served the earlier process go (its queued sends are dropped, the
  // receives posted for its messages fail with HostLost), the data plane
  // connects with the new one, and a fresh sending and receiving thread
  // serve it. Blocks until connected, or fails at `deadline`.
  absl::Status RejoinPeer(int host, const std::string& address, const std::string& key, absl::Time deadline);

  // The transfer of one step or argument of `run`: `src` and `dst` are this
  // host's buffers, null where it holds no shard; `dst_id` the destination's
  // id (what its messages name). Queues this host's sends, posts its
  // receives and starts its local copies; `dst` completes once every part
  // of it is in (failed if one failed, or a device it needs has).
  void Start(const RunKey& run, const HostDeviceList& src_list, std::shared_ptr<HostBuffer> src,
             const HostDeviceList& dst_list, uint64_t dst_id, std::shared_ptr<HostBuffer> dst, int64_t shard_bytes);

  // A receiving thread for every other host, so that whatever a peer sends
  // for a run this host refused is read and dropped, not left on the wire.
  void EnsureReceivers();
  // A run was just marked dead (DeadRuns::MarkDead): a receiving thread
  // waiting for a receive of it drops the message instead.
  void WakeReceivers();
  // `run` was just marked dead: as WakeReceivers, and the receives posted
  // for it fail now with `why`. (Its later sends go as the error: the
  // sending threads ask DeadRuns.)
  void CancelRun(const RunKey& run, const absl::Status& why);
  // `session` just ended (DeadRuns::EndSession): as CancelRun for every run
  // of it. Nothing of it is left posted here; its later messages are
  // dropped, and its sends queued go as the error.
  void EndSession(SessionId session, const absl::Status& why);
  // Shuts the data plane's connections with `host` down (a host known to be
  // lost): transfers with it, in flight or queued, fail at once.
  void ShutdownPeer(int host);
  // Shuts the data plane down and joins the peers' threads (after `stopping`
  // is set). Idempotent.
  void Stop();

 private:
  struct DstParts;
  struct Peer;
  // Where a receive is posted: the session and the destination buffer.
  using RecvKey = std::pair<uint64_t, uint64_t>;

  Peer& PeerFor(int host);
  void SendLoop(Peer* peer);
  void RecvLoop(Peer* peer);
  // The receives posted for the runs `which` matches (they were just
  // marked dead) fail with `why`; the receiving threads look again.
  void FailRuns(absl::FunctionRef<bool(const RunKey&)> which, const absl::Status& why);
  // The receives from `peer` fail with `status`, and every later one at
  // once (its connection broke, or the host is stopping).
  void FailReceives(Peer* peer, const absl::Status& status);
  // The peers made so far (they live until Stop).
  std::vector<Peer*> Peers();
  // `host`'s peer, if there is one, stops serving it: its threads end (they
  // are joined at Stop), its sends are dropped and its receives fail with
  // `why`. The next PeerFor makes a fresh one.
  void RetirePeer(int host, const absl::Status& why);
  absl::Status CheckSizes(const HostBuffer& src, int64_t src_bytes, const HostBuffer& dst) const;

  const HostLayout& layout_;
  const std::string bind_ip_;
  const std::string secret_;
  // This host's row of peer keys from the join (auth.h), by host id; empty
  // if the client gave none (tests): the data plane then uses the secret.
  const std::vector<std::string> peer_keys_;
  const DeadRuns& dead_runs_;
  const HostHealth& health_;
  const std::atomic<bool>& stopping_;
  const uint64_t first_buffer_id_;
  std::unique_ptr<DataPlane> data_;  // set by Connect, before any transfer

  Mutex peers_mu_;
  absl::flat_hash_map<int, std::unique_ptr<Peer>> peers_ ABSL_GUARDED_BY(peers_mu_);
  // Peers that served a replaced host's earlier process (RetirePeer).
  std::vector<std::unique_ptr<Peer>> retired_ ABSL_GUARDED_BY(peers_mu_);
};

}  // namespace pw

#endif  // PATHWAYS_HOST_HOST_TRANSFERS_H_
