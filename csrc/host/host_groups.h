#ifndef PATHWAYS_HOST_HOST_GROUPS_H_
#define PATHWAYS_HOST_HOST_GROUPS_H_

// The collective groups through which a host's parts of cross-host gangs
// meet the other hosts' (over Gloo, coordination/collective_group.h): one
// group per client session and set of hosts that shares a gang (a gang's
// tag and its meetings are unique only within its session, so two sessions
// never share a group), in incarnations (generations: wire::RenewGroup) each
// made at its first use; where the hosts of a group meet to make it
// (RendezvousStores); and how a gang's collectives run through its group,
// agreeing in the first one whether every host's part runs
// (GroupCollectives).
//
// Thread-safe. Lock order: the table of sets' lock, then a set's, then
// (never under the set's) an incarnation's, which is held while that
// incarnation is made (it waits for the other hosts).

#include <atomic>
#include <cstdint>
#include <memory>
#include <stop_token>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "csrc/base/mutex.h"
#include "csrc/coordination/collective_group.h"
#include "csrc/host/host_layout.h"
#include "csrc/host/host_runs.h"
#include "csrc/kernels/function_executable.h"

namespace pw {

// Where the hosts of a collective group meet (CollectiveGroup::Create's
// rendezvous): in the store kept by the group's lowest host, so that making
// a group needs only its own members alive (with one store on host 0, a
// lost host 0 would keep every other island from making new groups).
class RendezvousStores {
 public:
  virtual ~RendezvousStores() = default;
  // The store kept by `host`; it lives as long as this object. Unavailable
  // if that host cannot be reached. Thread-safe; may block while it
  // connects (bounded).
  virtual absl::StatusOr<KeyValueStore*> StoreOf(int host) = 0;
  // The store where the group of `members` (host ids, increasing) meets,
  // for one rendezvous (it must outlive only that): the one kept by its
  // lowest member. An implementation that learns of lost hosts ends its
  // waits at once (Unavailable) when a member is lost, so a group with a
  // lost member fails to form at once instead of after its timeout. The
  // default: StoreOf(members.front()) as it is.
  virtual absl::StatusOr<std::unique_ptr<KeyValueStore>> GroupStore(absl::Span<const int> members);
};

// One store for every host: hosts as threads of one process (tests).
class SharedRendezvous final : public RendezvousStores {
 public:
  explicit SharedRendezvous(KeyValueStore* store) : store_(store) {}
  absl::StatusOr<KeyValueStore*> StoreOf(int) override { return store_; }

 private:
  KeyValueStore* const store_;
};

// The collective groups of one session's set of hosts (host_groups.cc);
// the session's lists of that set point to it (HostDeviceList::groups).
struct HostSetGroups;
// One incarnation of a set's group, made or being made (host_groups.cc).
struct GroupIncarnation;

// This host's collective groups, by session and set of hosts.
class HostGroups {
 public:
  // `layout` and `stores` must outlive this. `bind_ip`: the address Gloo
  // binds and advertises. `stopping`: set by the owner when the host stops
  // (a group being made gives up then). `host_epochs`: how many times each
  // host was replaced so far, by host id (JoinCluster's; missing: 0).
  HostGroups(const HostLayout& layout, RendezvousStores* stores, std::string bind_ip,
             const std::atomic<bool>& stopping, std::vector<int> host_epochs = {});
  HostGroups(const HostGroups&) = delete;
  HostGroups& operator=(const HostGroups&) = delete;
  ~HostGroups();

  // The timeouts (before any group is made; a zero duration keeps one as
  // it is): see HostExecutor::SetCollectiveTimeouts.
  void SetTimeouts(absl::Duration timeout, absl::Duration arrival_timeout);
  // Bounds every collective operation once the gang's hosts have arrived
  // (and the data plane's connecting).
  absl::Duration timeout() const { return options_.timeout; }
  // How long a gang's part waits for its other hosts' parts to arrive
  // (CollectiveGroup::Arrive, and making its group).
  absl::Duration arrival_timeout() const { return arrival_timeout_; }

  // The groups of `session`'s gangs across `host_set` (increasing, this
  // host and another among them): made at the first call, and removed only
  // when the session ends (EndSession), so they live as long as the
  // session's lists that point to them. They meet under the rendezvous key
  // "<group prefix>/hosts/<set>", and a session other than kOneSession adds
  // "/s<session>" (every host of the set must name the session alike); once
  // a host of the set was replaced (PeerJoined), "/e<epochs>" follows, the
  // members' epochs in order.
  HostSetGroups* ForSet(SessionId session, const std::vector<int>& host_set);

  // A part of `gang` (a list with groups) that will meet the other hosts
  // is enqueued: the generation it meets in (the one of the runs at this
  // place in the client's order, the same on every host of the gang),
  // where it counts until Leave.
  uint64_t Enter(const HostDeviceList& gang);
  // That part has run: its generation counts it no more (and goes once
  // a newer one exists and no part of its own is left).
  void Leave(const HostDeviceList& gang, uint64_t generation);
  // The incarnation `generation` of the group of `gang`'s hosts (made from
  // its first use, by a thread of its own: waits for the other hosts, up to
  // the arrival timeout). Cancelled once a stop of `stop` is requested
  // before it is made (the group is still made, for the gangs after).
  absl::StatusOr<std::shared_ptr<CollectiveGroup>> GroupFor(const HostDeviceList& gang, uint64_t generation,
                                                            std::stop_token stop = {});

  // See HostExecutor::RenewGroup and HostExecutor::AbortGroupsWith (every
  // session's groups with the host).
  absl::Status RenewGroup(SessionId session, absl::Span<const int> hosts);
  void AbortGroupsWith(int host, const absl::Status& why);
  // A new process took `host`'s place, its `epoch`-th: every group of a set
  // with it starts over at a fresh generation, under a key that names the
  // new epoch, where the new process meets it at its own first generation.
  // A part enqueued before this fails (HostLost) instead of meeting it. On
  // the thread that takes the client's requests in order, as RenewGroup.
  void PeerJoined(int host, int epoch);
  // Tears down every group of `session` (a session that ended: HostExecutor
  // ::EndSession), once no list of it is left and no part of it will use
  // them again: a group still being made gives up, and each goes with its
  // last holder. A later ForSet of the session starts afresh.
  void EndSession(SessionId session, const absl::Status& why);

 private:
  const HostLayout& layout_;
  RendezvousStores* const stores_;
  const std::atomic<bool>& stopping_;
  // Set before any run (SetTimeouts), read unlocked afterwards.
  CollectiveOptions options_;
  // Long, since a peer may be busy with earlier gangs on its devices. A
  // peer that dies closes its connections, which ends the wait at once;
  // one known to be lost ends it through AbortGroupsWith.
  absl::Duration arrival_timeout_ = absl::Hours(1);

  // By session and set ("0,1"): entries are made by ForSet (DefineDevices)
  // and removed only with their session (EndSession), so lists point to
  // them. A maker refers to its entry's key and hosts by copy, not to it.
  Mutex mu_;
  absl::flat_hash_map<std::pair<SessionId, std::string>, std::unique_ptr<HostSetGroups>> sets_ ABSL_GUARDED_BY(mu_);
  // How many times each host was replaced, by host id (PeerJoined).
  std::vector<int> epochs_ ABSL_GUARDED_BY(mu_);

  // Starts the thread that makes `entry`, an incarnation of `groups`' group
  // that meets under `key`.
  void StartMaker(HostSetGroups& groups, std::string key, std::shared_ptr<GroupIncarnation> entry);
  // The key of `groups`' set (its base_key and its hosts' epochs now).
  std::string KeyFor(const HostSetGroups& groups) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  struct Maker {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> finished;  // joined without waiting once set
  };
  std::vector<Maker> makers_ ABSL_GUARDED_BY(mu_);
};

// A cross-host gang's collectives: the local shards meet the other hosts'
// through the group of the gang's hosts.
//
// Agreement. The gang's first collective also carries each host's "cannot
// run" flag (one more byte of its AllGatherV contribution, or one more
// element of its AllReduce), so the hosts agree whether every part runs at
// no extra round: a host whose part cannot run (a failed input, no memory)
// still makes that first call, through JoinWithoutRunning, with its flag
// set and no kernel run; every host that can run gets Aborted from that
// call, and RunLocal ends with it. Every host makes the same calls up to
// and including that first one, and none makes a later one, so none is left
// waiting in a collective another host never joins.
//
// One part's, used from its device's thread only.
class GroupCollectives final : public GangCollectives {
 public:
  GroupCollectives(CollectiveGroup* group, const HostDeviceList* gang, uint32_t tag, bool cannot_run)
      : group_(group), gang_(gang), tag_(tag), cannot_run_(cannot_run) {}

  absl::Status AllGather(const void* local, void* full, int64_t shard_bytes) override;
  absl::Status AllReduce(DType dtype, ReduceOp op, void* data, int64_t count) override;

  // For a host whose part cannot run (made with cannot_run): makes the
  // function's first collective call, as RunLocal would, with zeros for its
  // data; OK if the group worked (every host then knows), else its error.
  absl::Status JoinWithoutRunning(const FunctionExecutable::CollectiveCall& call);

 private:
  CollectiveGroup* group_;
  const HostDeviceList* gang_;
  uint32_t tag_;
  const bool cannot_run_;
  bool agreed_ = false;  // the first call (which carries the flags) is made
  std::vector<int64_t> bytes_per_rank_;
  std::vector<uint8_t> gathered_, reduced_;
};

}  // namespace pw

#endif  // PATHWAYS_HOST_HOST_GROUPS_H_
