#ifndef PATHWAYS_HOST_PEER_STORES_H_
#define PATHWAYS_HOST_PEER_STORES_H_

// The rendezvous stores of a host process (see RendezvousStores in
// host_groups.h): its own in memory, and every other host's through a
// session with that host, opened at first use (a host meets only the hosts
// it shares gangs with). The client tells the host which other hosts were
// lost (PeersLost); from then on nothing here waits for them.
//
// Thread-safe.

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "csrc/base/mutex.h"
#include "csrc/coordination/collective_group.h"
#include "csrc/coordination/host_channel.h"
#include "csrc/host/host_groups.h"

namespace pw {

// Another host's rendezvous store, seen through a session with that host
// (its HostProcess answers KvSet and KvGet), opened at first use. A session
// that broke while the host is not known to be lost (a connection reset, a
// heartbeat missed on a loaded machine) is opened anew at the next use;
// once the host is known to be lost (Lose), every use fails at once, a
// connection attempt in progress gives up, and a call in flight fails. A
// session that the host refuses with FailedPrecondition (it has not joined
// its cluster yet, so it does not know our peer key) is tried again. A
// Get asks again every few milliseconds until the key is there: a
// rendezvous happens once per group, so this costs nothing that matters.
class PeerStore final : public KeyValueStore {
 public:
  // `options` name the host and carry the key this host proves itself with
  // (secret: the peer key; claim_host: this host).
  PeerStore(std::string address, ChannelOptions options);
  // Closes the session, if one is open.
  ~PeerStore() override;

  absl::Status Set(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Time deadline) override;

  // The host is lost (until Revive): the session ends (a call in flight fails at
  // once) and every later use fails with `why`. Does not block: the session
  // is freed with this store, never on the caller's thread, which may be a
  // gRPC thread its end needs.
  void Lose(const absl::Status& why);
  bool lost() const;
  // A new process took the host's place (PeerJoined) at `address`, where
  // this host proves itself with `key`: the store is usable again, through
  // a session with the new process opened at first use. The lost session
  // is kept until this store goes (never freed on the caller's thread).
  void Revive(std::string address, std::string key);
  // Sessions opened so far (tests: a broken one is opened anew).
  int sessions_opened() const;

 private:
  // The session, opened now if there is none or it broke.
  absl::StatusOr<std::shared_ptr<HostChannel>> Session();

  Mutex connect_mu_;  // one connection attempt at a time
  mutable Mutex mu_;  // the host's address and key, the session, the loss and the count below
  std::string address_ ABSL_GUARDED_BY(mu_);
  ChannelOptions options_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<HostChannel> channel_ ABSL_GUARDED_BY(mu_);
  // Sessions with the host's earlier processes (Revive), freed with this.
  std::vector<std::shared_ptr<HostChannel>> retired_ ABSL_GUARDED_BY(mu_);
  absl::Status lost_ ABSL_GUARDED_BY(mu_);
  int sessions_opened_ ABSL_GUARDED_BY(mu_) = 0;
};

// Every host's rendezvous store as host `self` sees it, and which hosts the
// client said were lost.
class PeerStores final : public RendezvousStores {
 public:
  // `own`: this host's store, which must outlive this object. `addresses`:
  // every host's control address, by host id. `peer_keys`: this host's row
  // of the peer keys (JoinCluster), by host id: a session with host h's
  // store proves it is host `self` with peer_keys[h] (auth.h); host h
  // refuses it with FailedPrecondition until it has joined the cluster
  // itself, and the session is tried again meanwhile (up to 30 s).
  PeerStores(int self, KeyValueStore* own, const std::vector<std::string>& addresses,
             const std::vector<std::string>& peer_keys);

  // `host`'s store: `own` for this host, else its PeerStore (no session is
  // opened here). InvalidArgument for a host not in the cluster.
  absl::StatusOr<KeyValueStore*> StoreOf(int host) override;
  // The store of the lowest member, seen for one rendezvous: its waits go
  // in short slices and give up (HostLost) as soon as a member is lost, so
  // a group with a lost member fails to form at once instead of waiting
  // out its timeout for the member's address.
  absl::StatusOr<std::unique_ptr<KeyValueStore>> GroupStore(absl::Span<const int> members) override;

  // The client says `host` was lost (`why`: its account): the session with
  // its store ends and every wait for it gives up. Idempotent; this host
  // and unknown hosts are ignored. Does not block.
  void Lose(int host, absl::string_view why);
  // A new process took `host`'s place (PeerJoined) at control address
  // `address`, sharing `key` with this host: its store is reached there
  // from now on, and it is not lost any more. This host and unknown hosts
  // are ignored. Does not block.
  void Rejoin(int host, std::string address, std::string key);
  // HostLost if the client said `host` was lost, else OK.
  absl::Status Lost(int host) const;
  // Sessions opened with `host`'s store so far (0 for this host).
  int sessions_opened(int host) const;

 private:
  absl::Status CheckHost(int host) const;

  const int self_;
  KeyValueStore* const own_;
  // By host id (this host's entries unused); the vector never changes (a
  // replaced host's PeerStore is revived, not replaced).
  std::vector<std::unique_ptr<PeerStore>> peers_;
  std::unique_ptr<std::atomic<bool>[]> lost_;
};

}  // namespace pw

#endif  // PATHWAYS_HOST_PEER_STORES_H_
