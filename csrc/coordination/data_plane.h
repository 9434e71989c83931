#ifndef PATHWAYS_COORDINATION_DATA_PLANE_H_
#define PATHWAYS_COORDINATION_DATA_PLANE_H_

// The data plane: bulk transfers between host processes (the ICI and DCN
// copies of sharded buffers between slices) over plain TCP, in place of
// Gloo's send/recv. One `DataPlane` is one host's end: a point-to-point
// byte-message stream to and from every other host of the cluster.
//
// Why not Gloo (collective_group.h) for transfers:
//  - Gloo's listening ports accept anyone; here every connection must prove
//    it knows the cluster's secret before it carries a byte of data.
//  - One failed Gloo pair breaks the whole group; here each peer has its own
//    connections, so a host that dies fails only the transfers with it.
//  - Gloo's send/recv reached ~22% of raw loopback TCP on 64 MiB; here a
//    message goes with one sendmsg/recvmsg per kernel wake-up straight between
//    the caller's memory and the socket (data_plane_benchmark compares).
//
// Connections: one TCP connection per ordered pair of hosts. Host a's
// messages to host b go over the connection a dialed to b, so a Send and a
// Recv with the same peer never share a socket (nor a lock). The listener
// answers only the handshake and never writes on that connection again.
//
// Wire format (integers little-endian; a dialer and its listener must run
// the same version). The handshake is auth.h's challenge-response, mutual:
//   hello (dialer -> listener, 48 bytes): "pwdp-hi\n", u32 version,
//       u32 dialer host id, the dialer's 32-byte nonce.
//   challenge (listener -> dialer, 52 bytes): "pwdp-ch\n", u32 version,
//       u32 listener host id, u32 status, the listener's 32-byte nonce
//       (zeros if the status refuses: wrong version, bad host id).
//   proof (dialer -> listener, 40 bytes): "pwdp-pf\n", the dialer's proof
//       (HMAC-SHA256, auth.h, plane "data", claim the dialer's id, listener
//       the listener's id).
//   ack (listener -> dialer, 52 bytes): "pwdp-ak\n", u32 version,
//       u32 listener host id, u32 status (0 accepted; else why refused),
//       the listener's proof (zeros if refused). The dialer checks it before
//       it sends a byte of data.
//   message (dialer -> listener, repeated): a 48-byte header, then the
//       payload. Header, by byte offset: 0 u32 0x4d445750 ("PWDM"), 4 u8
//       flag, 5 three zero bytes, then the message's ids (DataMessageIds):
//       8 u64 session, 16 u64 program id, 24 u64 first buffer id, 32 u64
//       buffer id; then 40 u64 payload length.
//   Versions: 1 sent the secret in the clear and 16-byte message headers
//   (marker, flag, length); 2 had this handshake and those headers; 3 adds
//   the ids. (Status 5 of a challenge or ack, "not expecting that host
//   yet", came later within version 3: the bytes are the same.)
// Who a message is for travels in its header, so a receiver never has to
// know it from the order of the messages alone: it reads the header first
// (RecvHeader), then takes the payload where the ids say (RecvPayload) or
// drops it (Discard). A receiver that refused the work a message belongs to
// drops it; a later message of the same size still finds its own receive.
//
// Security: the handshake keeps out processes that do not know the key (a
// stray or hostile connection to the port, a host of another cluster), and
// the dialer knows it reached a peer that does; the key never crosses the
// wire, and a recorded handshake is worthless later (fresh nonces). With
// peer keys (Options::peer_keys) a dialer proves which host it is: a host
// that is taken over cannot pose as another. The data itself is not
// encrypted (bulk transfers at full speed), so the network must be trusted
// against eavesdroppers on the data, not on the key.
//
// Linux only (eventfd, POLLRDHUP, MSG_NOSIGNAL). Never raises SIGPIPE and
// leaves the process's signal dispositions alone.

#include <sys/uio.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "csrc/base/mutex.h"

namespace pw {

// Who a data plane message is for, in its sender's words: carried in its
// header and read by the receiver before the payload, so that it can match
// messages to what it expects by id rather than by order. The data plane
// gives them no meaning. The host's transfers' (host/host_transfers.h): `session`,
// the client session the work belongs to (the hosts key every id by it:
// two sessions' ids may collide; 0 while one client owns a set of hosts);
// the run, as `program_id` + `first_buffer_id` (unique within a session);
// `buffer_id`, the buffer the payload lands in (unique among one run's
// transfers, and naming its step: each step makes its own).
struct DataMessageIds {
  uint64_t session = 0;
  uint64_t program_id = 0;
  uint64_t first_buffer_id = 0;
  uint64_t buffer_id = 0;
  friend bool operator==(const DataMessageIds&, const DataMessageIds&) = default;
};
// A data plane message's header, as DataPlane::RecvHeader reads it.
struct DataMessageHeader {
  uint8_t flag = 0;  // the sender's, for the receiver: what kind of payload
  DataMessageIds ids;
  uint64_t length = 0;  // payload bytes
  friend bool operator==(const DataMessageHeader&, const DataMessageHeader&) = default;
};

// The wire format above as pure functions of bytes, which DataPlane reads
// and writes the wire with: what a host makes of the bytes a peer sends
// before it has proved itself (the hello and proof message a listener
// reads, the challenge and ack a dialer reads), and message headers. Here
// for their fuzzer (data_plane_wire_fuzzer.cc) and tests.
namespace data_wire {

inline constexpr uint32_t kVersion = 3;
inline constexpr size_t kHelloBytes = 48;
inline constexpr size_t kProofMessageBytes = 40;
inline constexpr size_t kAnswerBytes = 52;  // a challenge or an ack
inline constexpr size_t kHeaderBytes = 48;
inline constexpr size_t kHandshakeBytes = 32;  // a nonce or a proof (auth.h)

// Where a listener stands with the bytes of a hello (or of a proof message)
// that have arrived so far, `in`: kNotOurs as soon as they stray from the
// message's magic (another protocol, garbage), kOtherVersion as soon as a
// hello's version is in and is not kVersion, kNeedMore while bytes are
// missing, and kWhole once all are in. Bytes past the message's size are
// not looked at. A verdict other than kNeedMore is final: more bytes never
// change it.
enum class Progress { kNeedMore, kNotOurs, kOtherVersion, kWhole };

struct Hello {
  uint32_t version = kVersion;
  uint32_t dialer = 0;  // the host id the dialer claims
  std::string nonce;    // kHandshakeBytes
  friend bool operator==(const Hello&, const Hello&) = default;
};
// *hello is set on kWhole.
Progress ReadHello(absl::Span<const uint8_t> in, Hello* hello);
// The nonce's first kHandshakeBytes bytes (zeros past its end).
std::array<uint8_t, kHelloBytes> WriteHello(const Hello& hello);

// The dialer's proof (kHandshakeBytes), set on kWhole.
Progress ReadProof(absl::Span<const uint8_t> in, std::string* proof);
std::array<uint8_t, kProofMessageBytes> WriteProof(absl::string_view proof);

// The listener's two answers, of one layout: its challenge (with its nonce)
// and its ack (with its proof), told apart by their magic.
enum class AnswerKind { kChallenge, kAck };
struct Answer {
  uint32_t version = kVersion;
  uint32_t host_id = 0;  // the listener's
  uint32_t status = 0;   // 0: accepted; else why it refused (data_plane.cc)
  std::string bytes;     // the nonce or proof, kHandshakeBytes (zeros when refused)
  friend bool operator==(const Answer&, const Answer&) = default;
};
// Nullopt unless `in` is kAnswerBytes long and an answer of `kind`.
std::optional<Answer> ReadAnswer(AnswerKind kind, absl::Span<const uint8_t> in);
// The bytes' first kHandshakeBytes (zeros past their end).
std::array<uint8_t, kAnswerBytes> WriteAnswer(AnswerKind kind, const Answer& answer);

// Nullopt unless `in` is kHeaderBytes long and a message header (its marker
// and zero bytes). The length is the sender's word, unbounded: a receiver
// bounds what it does with it.
std::optional<DataMessageHeader> ReadHeader(absl::Span<const uint8_t> in);
std::array<uint8_t, kHeaderBytes> WriteHeader(const DataMessageHeader& header);

}  // namespace data_wire

// One host's end of the data plane: point-to-point byte messages to and from
// every other host of a cluster of `num_hosts`.
//
// Life cycle: Listen (binds a port and starts the accept thread) -> hand
// address() to the other hosts (the control plane's business) -> Connect
// with every host's address -> Send/Recv -> Shutdown and/or destroy.
//
// Thread safety: every method may be called from any thread. Sends to
// different peers run in parallel, as do Recvs from different peers, and a
// Send and a Recv with the same peer. Two Sends to one peer are serialized
// (each message is written whole, in the order the Sends take the peer's
// lock), and so are two Recvs from one peer (a RecvHeader and the
// RecvPayload or Discard that follows it are one receive in two calls: meant
// for one receiving thread per peer). Shutdown may be called at any
// time, also while other calls block, and so may ShutdownPeer and
// ReplacePeer (one at a time per peer). The destructor must not run while
// another thread is inside a method: Shutdown, let the calls return, then
// destroy.
//
// Failure isolation: each peer's two connections fail on their own. Once a
// connection breaks (the peer closed it or died, or a transfer error left
// the stream mid-message) every later Send (or Recv) with that peer returns
// the same Unavailable error naming the peer; the other peers keep working.
// A broken connection is never mended in place: the peer's host is lost.
//
// Replacement hosts: a NEW process may take a lost host's id. It makes a
// plane of its own (Listen, then Connect with the survivors' addresses),
// and each survivor calls ReplacePeer(id, its address, its key), which
// drops the old connections (their broken state goes with them) and makes
// two new ones with the new process; either side may start first. Until a
// survivor has called ReplacePeer, it refuses the new process's hellos with
// a refusal that the dialer retries (status 5, "not expecting that host
// yet"), as it retries a refused TCP connection; so does a survivor not yet
// told of the loss whose connection from the old process was closed by its
// end (a process that exits or is killed). A host may also be absent
// from the start (an empty address in Connect) and be replaced later the
// same way. With peer keys, each replacement comes with a fresh key for
// each pair, so a process holding an older key (a stale process of that
// host, back from a hang) fails its proofs: it cannot take the place back.
// With the cluster's secret alone nothing tells the two processes apart:
// the first to prove the secret once ReplacePeer has started is taken.
//
// Dead-peer detection: a peer process that exits or is killed is noticed at
// once (its kernel closes the connections: a blocked Recv returns, and a
// Send fails before writing or while blocked). A peer machine that vanishes
// from the network is noticed by TCP keepalive on idle connections (about
// 25 s), and by TCP's retransmission timeout for a Send with unacknowledged
// data (minutes). A peer that is alive but never calls Recv blocks our Send
// (backpressure) until it does, or until either of us shuts down.
class DataPlane {
 public:
  struct Options {
    // The local IP (v4 or v6, numeric) to listen on, port chosen by the
    // kernel. address() reports it, so it must be one the peers can reach.
    std::string bind_ip = "127.0.0.1";
    // The cluster's secret, 1 to 256 bytes (any bytes): every connection
    // must prove it knows it. Hand it to the hosts over an authenticated
    // channel.
    std::string secret;
    // Or, by host id, the key this host shares with host h alone (auth.h's
    // peer keys; this host's own entry unused): the connections with h prove
    // knowledge of it instead, so they prove they are host h. Empty: every
    // peer uses `secret`.
    std::vector<std::string> peer_keys;
    // Bound on Connect: dialing every peer and being dialed by every peer.
    absl::Duration connect_timeout = absl::Seconds(30);
    // A connection that has not completed its hello this long after being
    // accepted is closed. Hellos proceed side by side, so a slow one holds
    // up no other; of more than 64 incomplete at once, the oldest is closed.
    absl::Duration handshake_timeout = absl::Seconds(5);
  };

  // Handshake constants (see the wire format above), for tests that speak it.
  static constexpr uint32_t kVersion = data_wire::kVersion;
  static constexpr size_t kMaxSecretBytes = 256;

  // Binds options.bind_ip:0, listens, and starts the accept thread, which
  // from now on takes the hellos of the peers (they may dial before this
  // host calls Connect). InvalidArgument for host_id outside [0, num_hosts),
  // num_hosts < 1, a secret that is empty or longer than kMaxSecretBytes
  // (without peer keys), peer keys that are not one per host (each other
  // host's nonempty), or a bind_ip that is not a numeric IP; Unavailable if
  // the socket cannot be bound or listened on.
  static absl::StatusOr<std::unique_ptr<DataPlane>> Listen(int host_id, int num_hosts, Options options);

  // Shutdown(), joins the accept thread and closes every socket.
  ~DataPlane();
  DataPlane(const DataPlane&) = delete;
  DataPlane& operator=(const DataPlane&) = delete;

  int host_id() const { return host_id_; }
  int num_hosts() const { return num_hosts_; }

  // "ip:port" ("[ip]:port" for IPv6): where the peers dial this host.
  std::string address() const { return address_; }

  // Dials every other host (`addresses` holds every host's address() by
  // host id, this host's own included and ignored), sends the hello, waits
  // for its ack, and waits until every other host has dialed in. Dials run
  // in parallel and retry a refused or dropped connection (the peer may not
  // be listening yet), and a peer's "not expecting this host yet" (a
  // survivor that has not called ReplacePeer for this host yet), until
  // options.connect_timeout.
  // An empty address names an absent peer (a lost host): it is neither
  // dialed nor waited for, its hellos are refused for retry, and Send/Recv
  // with it fail with Unavailable ("not connected (lost)") until
  // ReplacePeer connects a process of it.
  // Errors: InvalidArgument (wrong number of addresses, or one that does
  // not parse); FailedPrecondition (called twice, or an address answers
  // that is not the expected host's data plane); PermissionDenied (a peer
  // refused our proof, or could not prove itself: a different secret or
  // peer key; the message says which peer);
  // DeadlineExceeded naming the hosts not reached (with their last error)
  // and the hosts that have not dialed in; Cancelled after Shutdown. After
  // an error the plane is unusable (Send/Recv: FailedPrecondition): shut
  // it down.
  absl::Status Connect(const std::vector<std::string>& addresses);

  // A new process of host `peer` replaces the old one (lost; ShutdownPeer
  // may or may not have been called), at `address` (its address()), with
  // `key` for the handshakes with it both ways from now on (its peer key;
  // may be empty on a plane without Options::peer_keys: the secret stays).
  // In order: the key changes; both old connections with `peer` are shut
  // down (a Send or Recv blocked on them fails with Unavailable; their
  // sockets are closed by the destructor); its broken state is forgotten;
  // then `address` is dialed (retried as Connect's dials are, until
  // `deadline`) and the new process's dial-in is awaited, which must prove
  // `key`. Meanwhile Send/Recv with `peer` fail at once (Unavailable, "not
  // connected"); those with other peers go on. Returns OK once both new
  // connections are up; Send/Recv with `peer` then use them.
  // May be called after Connect succeeded (also for a peer absent there),
  // and again later (each time a new process replaces the host). Calls for
  // different peers may run at once.
  // Errors: InvalidArgument (peer out of range or this host, an address
  // that does not parse, an empty key on a plane with peer keys);
  // FailedPrecondition (Connect has not succeeded, or a ReplacePeer of
  // `peer` is under way; or `address` answers as another host's plane);
  // PermissionDenied (a proof failed, either way, as in Connect);
  // DeadlineExceeded naming what is missing (the dial, with its last error,
  // and/or the dial-in); Unavailable if ShutdownPeer(peer) is called
  // meanwhile (the new process is lost too); Cancelled after Shutdown.
  // After an error `peer` is lost (as after ShutdownPeer: Send/Recv fail,
  // its hellos are refused for retry) until a later ReplacePeer succeeds.
  absl::Status ReplacePeer(int peer, const std::string& address, const std::string& key, absl::Time deadline);

  using MessageIds = DataMessageIds;
  using MessageHeader = DataMessageHeader;
  static constexpr size_t kHeaderBytes = data_wire::kHeaderBytes;

  // Sends one message to `peer`: the bytes of `pieces` back to back
  // (gathered by the kernel, no packing copy), preceded by a 48-byte header
  // (total length, `flag` and `ids`, which the receiver reads first). Blocks
  // until every byte is handed to the kernel (not until the peer received
  // it). Messages to one peer arrive in the order they were sent. The
  // caller keeps `pieces` and their memory alive until Send returns.
  // Errors: InvalidArgument (peer out of range or this host);
  // FailedPrecondition (Connect did not succeed); Unavailable naming the
  // peer if its connection is (or becomes) broken (this peer only);
  // Cancelled after Shutdown.
  absl::Status Send(int peer, absl::Span<const iovec> pieces, uint8_t flag = 0, const MessageIds& ids = {});

  // Receiving in two steps, for a receiver that decides where a message
  // goes from its ids. RecvHeader blocks until the next message's header
  // from `peer` is in and returns it; its payload is then still on the
  // connection, and must be taken with RecvPayload or dropped with Discard
  // before the next RecvHeader or Recv from `peer` (those fail with
  // FailedPrecondition until then). Between the two the caller may take its
  // time (wait until it knows where the payload goes): nothing else is read
  // from `peer` meanwhile, and the sender's later messages wait in TCP's
  // buffers, then hold its Sends back (backpressure).
  // RecvPayload scatters the payload into `pieces`, whose total must be the
  // header's length: else the payload is read into a small scratch buffer
  // and dropped, the connection stays usable, and the result is
  // InvalidArgument with both sizes. Discard reads and drops it (a fixed
  // scratch buffer, whatever the length claims).
  // Errors of all three as Send's (InvalidArgument for the peer,
  // FailedPrecondition, Unavailable naming the peer: closed, also
  // mid-message, or a corrupt stream; Cancelled), and FailedPrecondition
  // for RecvPayload or Discard with no header taken.
  absl::StatusOr<MessageHeader> RecvHeader(int peer);
  absl::Status RecvPayload(int peer, absl::Span<const iovec> pieces);
  absl::Status Discard(int peer);

  // Receives the next message from `peer` in one call, whatever its ids,
  // scattered into `pieces` (written in order, without an intermediate
  // copy), and returns the sender's flag (its ids in *ids, if given). For a
  // receiver that pairs messages by order. Blocks until the whole message
  // is in. If the message's length differs from the pieces' total: with
  // `other` given and a length of at most kMaxOtherBytes, the message goes
  // into *other instead (nothing lands in `pieces`) and Recv returns its
  // flag, so a sender may send something else than the bytes expected, an
  // error report say (*other is reset when the message lands in `pieces`);
  // otherwise the message is read into a small scratch buffer and
  // discarded (nothing of it lands in `pieces`), the connection stays
  // usable, and the result is InvalidArgument with both sizes. Other errors
  // as RecvHeader.
  static constexpr uint64_t kMaxOtherBytes = 64 << 10;
  absl::StatusOr<uint8_t> Recv(int peer, absl::Span<const iovec> pieces,
                               std::optional<std::string>* other = nullptr, MessageIds* ids = nullptr);

  // Unblocks every Connect, Send and Recv (they return Cancelled, as will
  // every later call), stops accepting, and shuts the connections down so
  // that the peers' transfers with this host fail (Unavailable) at once.
  // Idempotent; does not wait for the accept thread (the destructor does).
  void Shutdown();

  // Shuts both connections with `peer` down (a host known to be lost, which
  // may never close them itself: stopped, hung or cut off), so that a Send
  // or Recv with it blocked now, and every later one, fails (Unavailable
  // naming the peer) at once. The other peers keep working. On a connected
  // plane the peer is lost from now on: its hellos are refused for retry
  // until ReplacePeer(peer) starts, and a ReplacePeer(peer) under way fails
  // (Unavailable). Idempotent; an unknown peer is ignored, and so is an
  // unconnected plane but for shutting down what connections it has.
  void ShutdownPeer(int peer);

 private:
  // One other host: the connection this host dialed to it (our Sends) and
  // the one it dialed to us (our Recvs).
  //
  // The state of a connection's stream (broken, mid-message) belongs to one
  // pair of connections, one generation: `send_generation` and
  // `recv_generation` say which. Each ReplacePeer starts a new generation
  // (generations_, under mu_); the first transfer that finds the new one
  // forgets the old state, and a transfer that read an older generation's
  // socket before the replacement (and only now got the lock) fails without
  // touching the new state.
  struct Peer {
    Mutex send_mu;  // held by a Send for its whole message
    absl::Status send_broken ABSL_GUARDED_BY(send_mu);
    uint64_t send_generation ABSL_GUARDED_BY(send_mu) = 0;
    // Held by a Recv for its whole message, by RecvHeader, RecvPayload and
    // Discard for their part of one.
    Mutex recv_mu;
    absl::Status recv_broken ABSL_GUARDED_BY(recv_mu);
    uint64_t recv_generation ABSL_GUARDED_BY(recv_mu) = 0;
    // RecvHeader took a header: the payload's bytes are next on the wire.
    bool header_taken ABSL_GUARDED_BY(recv_mu) = false;
    uint64_t payload_left ABSL_GUARDED_BY(recv_mu) = 0;
  };

  // Where a peer stands, for the listener (whose hellos it takes) and for
  // Send/Recv (whether they may use its connections).
  enum class Standing {
    kJoining,    // Connect has not succeeded: hellos taken, once each
    kConnected,  // hellos refused for good (it has its connection), unless
                 // its connection was closed by its end (then as kLost)
    kLost,       // absent in Connect, or ShutdownPeer, or a failed
                 // ReplacePeer: hellos refused for retry
    kReplacing,  // ReplacePeer under way: a hello proving the new key is
                 // taken (in place of any earlier one of this replacement)
  };

  DataPlane(int host_id, int num_hosts, Options options, int listen_fd, int wake_fd, std::string address);

  // The accept thread: accepts connections and runs their hellos, many at
  // once, none blocking the others; registers accepted peers' connections.
  void AcceptLoop();

  // Connect's and ReplacePeer's parts: makes the outgoing connections (all
  // at once, retrying until `deadline`; ReplacePeer's also stops when
  // `interrupt_fd` turns readable: ShutdownPeer); takes one's complete ack
  // (OK: registered; else the error that ends the call); waits until every
  // peer has dialed in.
  struct Dial;  // one outgoing connection in the making, defined in the .cc
  absl::Status DialAll(std::vector<Dial>& dials, absl::Time deadline, int interrupt_fd = -1);
  // The listener's answer in dial.answer: it if it is of `kind`, from the
  // expected host, with status accepted; Unavailable for a refusal worth
  // retrying ("not expecting this host yet"); else the error that ends the
  // call.
  absl::StatusOr<data_wire::Answer> CheckAnswer(const Dial& dial, data_wire::AnswerKind kind);
  // Its challenge: sends our proof (or, if that fails, retries later).
  absl::Status TakeChallenge(Dial& dial, absl::Time now);
  // Its ack: checks its proof and registers the connection.
  absl::Status TakeAck(Dial& dial, absl::Time now);
  absl::Status AwaitDialIns(absl::Status dialed, absl::Time deadline);
  // ReplacePeer's end, once its dial is done (`dialed`): waits for the
  // dial-in until `deadline`, then keeps both new connections (OK) or
  // drops what came of them and leaves the peer lost.
  absl::Status AwaitReplacement(int peer, const std::string& address, absl::Status dialed, absl::Time deadline);

  // Why the listener would refuse a hello from `peer` now before its proof
  // (0 if it would not): kLost, or kConnected with its connection closed.
  uint32_t HelloRefusalLocked(int peer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Shuts down both of `peer`'s connections and moves them to retired_fds_.
  void RetireLocked(int peer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The socket of `peer`'s connection in one direction and its generation,
  // or an error status for the caller's argument/state (see Send's errors).
  struct Connection {
    int fd;
    uint64_t generation;
  };
  absl::StatusOr<Connection> ConnectionFd(int peer, bool outgoing);
  // With p.send_mu / p.recv_mu held: the peer's stream state made that of
  // `generation` (forgetting an older one's), or Unavailable if
  // `generation` is older than the state's (the connection was replaced).
  absl::Status SendGenerationLocked(Peer& p, int peer, uint64_t generation) ABSL_EXCLUSIVE_LOCKS_REQUIRED(p.send_mu);
  absl::Status RecvGenerationLocked(Peer& p, int peer, uint64_t generation) ABSL_EXCLUSIVE_LOCKS_REQUIRED(p.recv_mu);

  // After a failed read from `peer` (on `fd`): Cancelled if shutting down;
  // otherwise marks the connection broken by `why` for good, shuts it down,
  // and returns that Unavailable error.
  absl::Status BreakRecv(Peer& p, int peer, int fd, absl::string_view why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(p.recv_mu);
  // The parts of a receive, with p.recv_mu held: the next header (marks it
  // taken), the taken header's payload into `pieces` (of exactly its
  // length), or dropped.
  absl::StatusOr<MessageHeader> ReadHeaderLocked(Peer& p, int peer, int fd) ABSL_EXCLUSIVE_LOCKS_REQUIRED(p.recv_mu);
  absl::Status ReadPayloadLocked(Peer& p, int peer, int fd, absl::Span<const iovec> pieces)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(p.recv_mu);
  absl::Status DrainLocked(Peer& p, int peer, int fd) ABSL_EXCLUSIVE_LOCKS_REQUIRED(p.recv_mu);

  // "data plane host <id>" for messages.
  std::string Name() const;

  const int host_id_;
  const int num_hosts_;
  const Options options_;
  const int listen_fd_;
  const int wake_fd_;  // eventfd, readable forever once Shutdown wrote it
  const std::string address_;
  std::unique_ptr<Peer[]> peers_;  // by host id; this host's entry unused
  std::atomic<bool> shutting_down_{false};

  // Guards the fields below; changed_ is signalled when in_fds_ or a
  // standing changes, and on Shutdown.
  Mutex mu_;
  CondVar changed_;
  // Sockets by host id, -1 until connected (and while a ReplacePeer makes
  // new ones). Closed only by the destructor, also once replaced (then kept
  // in retired_fds_), so a thread that read one under mu_ may use it after
  // unlocking: at worst it finds it shut down.
  std::vector<int> out_fds_ ABSL_GUARDED_BY(mu_);  // we dialed (Sends)
  std::vector<int> in_fds_ ABSL_GUARDED_BY(mu_);   // they dialed (Recvs)
  std::vector<int> retired_fds_ ABSL_GUARDED_BY(mu_);  // replaced, shut down
  // By host id (this host's own unused): the key of the handshakes with it
  // (its peer key, or the secret; ReplacePeer may change it), its standing,
  // its connections' generation (ReplacePeer counts it up), whether a
  // ReplacePeer of it is under way (until it returns, even once
  // ShutdownPeer made the standing kLost), and that call's eventfd, which
  // ShutdownPeer writes to stop its dialing (-1 when none).
  std::vector<std::string> keys_ ABSL_GUARDED_BY(mu_);
  std::vector<Standing> standing_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> generations_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> replacing_ ABSL_GUARDED_BY(mu_);
  std::vector<int> interrupt_fds_ ABSL_GUARDED_BY(mu_);
  bool connect_called_ ABSL_GUARDED_BY(mu_) = false;
  bool connected_ ABSL_GUARDED_BY(mu_) = false;  // Connect succeeded

  std::thread accept_thread_;
};

}  // namespace pw

#endif  // PATHWAYS_COORDINATION_DATA_PLANE_H_
