#ifndef PATHWAYS_COORDINATION_COLLECTIVE_GROUP_H_
#define PATHWAYS_COORDINATION_COLLECTIVE_GROUP_H_

// Collectives across host processes: the cross-host half of a gang's
// hierarchical collectives (a host first reduces its local shards in-process,
// then its result meets the other hosts' here). One `CollectiveGroup` is one
// process's membership (its rank) in a group of `size` processes, connected
// over TCP by Gloo; the processes find each other's addresses through a
// `KeyValueStore` (in memory for tests, the client's control channel later).
//
// Gloo stays behind this header: no gloo type appears here, and every Gloo
// exception becomes an absl::Status.
//
// Security: Gloo's connections are neither authenticated nor encrypted. A
// member listens on a port of the bind address and takes the first
// connection that names the pair it expects; whoever reaches the port first
// with the right pair number (small, guessable) gets that pair's traffic
// and can inject into it. Gloo has a TLS transport (gloo/transport/tcp/tls,
// mutual TLS from PEM files), but Debian 12's libgloo-dev (0.0~git20220518)
// is built without it: its gloo/config.h says GLOO_HAVE_TRANSPORT_TCP_TLS 0,
// the tls headers are not installed and the library does not link OpenSSL
// (collective_group_test checks this, so a Gloo that has it is noticed).
// Building Gloo ourselves is outside what `make` installs. What limits the
// exposure: the addresses are published only in rendezvous stores that the
// group's own members may read (host_process.h), members bind the host's
// advertised IP (loopback on one machine), and bulk transfers between hosts
// go over the data plane (data_plane.h), whose connections prove themselves.
// Across machines, run the hosts on a network that only they can reach, or
// move the collectives onto the data plane.

#include <cstdint>
#include <functional>
#include <memory>
#include <stop_token>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "csrc/base/dtype.h"
#include "csrc/base/mutex.h"
#include "csrc/base/reduce_op.h"

namespace gloo::transport {
class UnboundBuffer;
}  // namespace gloo::transport

namespace pw {

// Where the processes of a group publish their addresses before they connect:
// the rendezvous. Keys are written once per group incarnation and read by
// every member. Implementations are thread-safe.
class KeyValueStore {
 public:
  virtual ~KeyValueStore() = default;

  // Publishes `value` (any bytes) under `key`, replacing an earlier value, and
  // wakes the readers waiting for it.
  virtual absl::Status Set(absl::string_view key, absl::string_view value) = 0;

  // The value under `key`, waiting until it is set or until `deadline`:
  // DeadlineExceeded naming the key if it is still missing then.
  virtual absl::StatusOr<std::string> Get(absl::string_view key, absl::Time deadline) = 0;
};

// A KeyValueStore in this process's memory: for tests (ranks as threads) and
// for a group whose members all live in one process.
class InMemoryKeyValueStore final : public KeyValueStore {
 public:
  absl::Status Set(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Time deadline) override;

 private:
  Mutex mu_;  // guards values_; changed_ is signalled on every Set
  CondVar changed_;
  absl::flat_hash_map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
};

// AllReduce's reductions are ReduceOp (csrc/base/reduce_op.h); kSum of bool
// is InvalidArgument.

struct CollectiveOptions {
  // The local address this member listens on and its peers connect to; must
  // be reachable from every other member (loopback only for one machine).
  std::string bind_address = "127.0.0.1";
  // Bound on the rendezvous plus connection in Create, and on every operation
  // (end to end). A peer that died or never arrives gives an error by then.
  absl::Duration timeout = absl::Seconds(30);
  // Create's bound instead, if not zero: how long a member waits for the
  // others to join (they may be busy elsewhere before they come).
  absl::Duration join_timeout = absl::ZeroDuration();
  // If set, Create gives up (Cancelled) once it returns true while it waits
  // for the others' addresses (it is asked every 50 ms or so): a process
  // that stops, a member known to be lost.
  std::function<bool()> join_cancelled;
  // Before each operation, the members exchange what they are about to do
  // (kind and sizes) and return InvalidArgument on every member if they
  // disagree, leaving the group usable. Without it a size disagreement aborts
  // a process inside Gloo (see Send); with it each operation costs one more
  // small message round (about 2x the latency of a small AllReduce). For
  // tests and debugging; compiled programs agree by construction.
  bool check_agreement = false;
};

// One member (rank) of a group of `size` processes that run collectives
// together. Every member calls the same operations in the same order with the
// same sizes, as in MPI. Members that disagree on sizes (AllReduce counts,
// AllGatherV byte counts, Send/Recv sizes) abort a process inside Gloo unless
// CollectiveOptions::check_agreement is set; other disagreements (a member
// that skips an operation, or calls another kind) end in a timeout.
//
// Tags: each operation takes a `tag`. Messages are matched by (operation
// kind, tag, peer) in FIFO order, so operations with different tags (or of
// different kinds) never mix their messages, while two operations of the same
// kind and tag must not be in flight at once.
//
// Thread safety: operations with distinct tags may run concurrently from
// different threads (Gloo's TCP transport locks per connection); destroying
// the group while an operation runs is not allowed.
//
// Failure: a transport error or timeout in any operation *breaks* the group:
// its connections are closed (so the peers' pending and next operations fail
// promptly instead of waiting for their timeout) and every later operation
// returns Unavailable naming the first failure. A broken group cannot be
// repaired, since the members may disagree on which messages were delivered;
// create a new one under a new group key.
class CollectiveGroup {
 public:
  // Joins the group `group_key` as `rank` (0 <= rank < size): publishes this
  // member's addresses in `store` under keys prefixed by "<group_key>/",
  // waits for every other member's, and connects to all of them. Blocks
  // until all `size` members have joined, or fails after options.timeout:
  // DeadlineExceeded (a member never published its address) or Unavailable
  // (a connection failed), both naming the group and rank. InvalidArgument
  // for bad arguments or an address this host cannot bind.
  //
  // The first Create sets SIGPIPE to ignored if its action was the default:
  // Gloo writes to sockets without MSG_NOSIGNAL, and a write to a peer that
  // has gone would otherwise end this process.
  //
  // `store` must outlive only this call. A group key must be fresh for every
  // incarnation of a group: keys of an earlier, failed group with the same
  // key would point the members to dead addresses.
  static absl::StatusOr<std::unique_ptr<CollectiveGroup>> Create(KeyValueStore* store, std::string group_key,
                                                                 int rank, int size,
                                                                 const CollectiveOptions& options = {});

  // Closes the connections; peers' later operations fail (Unavailable).
  ~CollectiveGroup();
  CollectiveGroup(const CollectiveGroup&) = delete;
  CollectiveGroup& operator=(const CollectiveGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& group_key() const { return group_key_; }

  // In place: `data` holds `count` elements of `dtype` (this member's
  // contribution) and receives the reduction over all members. InvalidArgument
  // for kSum of bool or a negative/too large count; count 0 does nothing.
  absl::Status AllReduce(DType dtype, ReduceOp op, void* data, int64_t count, uint32_t tag);

  // Concatenates every member's bytes in rank order into `out`, which holds
  // sum(bytes_per_rank) bytes. `bytes_per_rank` (one entry per rank) must be
  // the same on every member and `in_bytes` must equal bytes_per_rank[rank()]
  // (InvalidArgument otherwise). `in` may be exactly this member's slot of
  // `out` (in-place gather); any other overlap is not allowed.
  absl::Status AllGatherV(const void* in, int64_t in_bytes, void* out, absl::Span<const int64_t> bytes_per_rank,
                          uint32_t tag);

  // Point to point with rendezvous: Send returns once `peer` has posted the
  // matching Recv (same tag) and the bytes are written, so a Send that no Recv
  // meets fails after the timeout, and every member sending before receiving
  // deadlocks (use SendRecv for that). Messages between two members on one
  // tag arrive in order.
  //
  // Caveat (Gloo): the sender's and receiver's byte counts must agree. A Recv
  // of more bytes than sent completes with the rest of `data` untouched; a
  // Recv of fewer bytes aborts the receiving process (Gloo checks it with an
  // exception on its event-loop thread, where nothing can catch it). With
  // check_agreement both return InvalidArgument instead.
  absl::Status Send(int peer, const void* data, int64_t bytes, uint32_t tag);
  absl::Status Recv(int peer, void* data, int64_t bytes, uint32_t tag);

  // Sends to `send_peer` and receives from `recv_peer` at once, so a
  // permutation where every member sends and receives cannot deadlock
  // (ppermute). Both peers may be this member (a copy, sizes must match);
  // exactly one of them being this member is InvalidArgument.
  absl::Status SendRecv(int send_peer, const void* send_data, int64_t send_bytes, int recv_peer, void* recv_data,
                        int64_t recv_bytes, uint32_t tag);

  // Returns once every member has entered the barrier with this tag.
  absl::Status Barrier(uint32_t tag);

  // Returns once every member has arrived at the Arrive with this
  // `meeting` (an id below 2^56; not to be used again once an Arrive with
  // it was cancelled, since that one keeps listening on it),
  // waiting up to `timeout` (not the group's): members that come late (busy
  // elsewhere) are waited for, and the operations after it, which find
  // everyone there, keep the group's own timeout. Unlike those, an Arrive
  // that waits ends at once, with Unavailable, when the group is aborted;
  // and with Cancelled, leaving the group as it is, when a stop is requested
  // of `cancel`, before it starts or while it waits: for a member whose gang
  // will not meet, as when another member refused the run. A cancelled
  // Arrive's messages (those sent to it later too) are kept by the group
  // until it is destroyed, so that members that come later still reach it.
  // One small message to each other member.
  absl::Status Arrive(uint64_t meeting, absl::Duration timeout, std::stop_token cancel = {});
  // Meetings are below this (Arrive's slots: a prefix byte, then the meeting).
  static constexpr uint64_t kMaxMeetings = uint64_t{1} << 56;

  // Breaks the group with `why` (if it is not broken already): Arrives
  // waiting here end, its connections close (so the peers' operations in
  // flight fail promptly), and later operations fail at once. For a member
  // known to be lost, or a process that stops. Thread-safe, also while
  // operations run; an operation other than Arrive in flight here still
  // runs until its own timeout or its peers' failure.
  void Abort(const absl::Status& why) { Break(why); }
  // OK, or what broke the group.
  absl::Status broken() const;

 private:
  struct Gloo;  // Gloo's context and device, defined in the .cc

  CollectiveGroup(std::string group_key, int rank, int size, const CollectiveOptions& options,
                  std::unique_ptr<Gloo> gloo);

  // Runs `body` (which calls Gloo and returns a Status) as operation `op`
  // with `tag`: Unavailable if the group is already broken; otherwise body's
  // status, named, and its Gloo exceptions become Unavailable and break the
  // group.
  template <typename Body>
  absl::Status Run(absl::string_view op, uint64_t tag, Body body);

  // Marks the group broken by `error` (first failure wins) and closes the
  // connections.
  void Break(const absl::Status& error);

  // "collective group 'k' rank r of n" for error messages.
  std::string Name() const;

  const std::string group_key_;
  const int rank_;
  const int size_;
  const absl::Duration timeout_;
  const bool check_agreement_;
  std::unique_ptr<Gloo> gloo_;

  mutable Mutex mu_;  // guards broken_: OK until the first failure, then that failure
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
  // One Arrive's messages: what it sends, what it hears, and Gloo's buffers
  // over them.
  struct Arrival;
  // The waits of the Arrives under way, which Break ends.
  std::vector<Arrival*> arrivals_ ABSL_GUARDED_BY(mu_);
  // The cancelled Arrives, which members that come later still write into.
  std::vector<std::unique_ptr<Arrival>> abandoned_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pw

#endif  // PATHWAYS_COORDINATION_COLLECTIVE_GROUP_H_
