#ifndef PATHWAYS_COORDINATION_HOST_SERVER_H_
#define PATHWAYS_COORDINATION_HOST_SERVER_H_

// The host's end of the control plane: a gRPC server with one session per
// client stream (see host_channel.h for the client's end), and heartbeats
// answered on a thread of their own (never behind a session's requests, nor
// on a thread busy with one: a host that takes seconds over a put or a
// compile still answers them at once). What the requests mean is the
// RequestHandler's business; the server only lets authenticated sessions
// reach it.
//
// Authentication (auth.h's challenge-response, on the stream itself):
//   - the stream opens with the dialer's nonce and claim in its metadata
//     ("pw-auth-nonce": 64 hex digits; "pw-auth-claim": "cluster", a host
//     id for a host that proves itself with its peer key, which the handler
//     gives: RequestHandler::PeerKey, or "tenant-<t>" for a service's tenant
//     that proves itself with the key the service gave: TenantKey);
//   - the host's first message is its challenge (a Reply with id 0 and
//     `challenge`, its nonce);
//   - the dialer's first frame must hold exactly one request, its
//     `auth_proof`; the host checks it in constant time, answers with its
//     own proof (a Reply with the request's id and `auth_proof`, with the
//     session's heartbeat_session), and from then on hands the session's
//     requests to the handler.
// Anything else is refused with UNAUTHENTICATED and never reaches the
// handler: a stream without the metadata, a wrong proof, a request before
// the proof, or no proof within ServerOptions::handshake_timeout_ns. A
// claim whose key is not there yet (a host that has not joined its cluster)
// is refused with FAILED_PRECONDITION: the dialer may try again.
//
// Heartbeats (the Heartbeat rpc) carry no secret: each names an
// authenticated session that is still open, carries a counter above the
// last one answered for it and a MAC under the session's heartbeat key
// (auth.h), checked in constant time; otherwise it is refused with
// UNAUTHENTICATED. The answer carries a MAC too.
//
// Bounds before authentication: at most max_pending_handshakes streams wait
// for their proof at once (a new one beyond that ends the oldest: a real
// dialer answers within a round trip, so it is never the oldest for long);
// HTTP/2 pings on a connection are answered at most one per 0.5 s while no
// data flows, and a connection that sends them faster is dropped after two
// (gRPC's ping strikes); a connection without any stream is closed after
// idle_connection_timeout_ns. Anything that is not gRPC is dropped by gRPC
// itself. Either way the host keeps serving.
//
// Transport: plaintext on loopback; TLS beyond it (gRPC's own), with a key
// and self-signed certificate the server makes at start. Nobody needs to
// trust that certificate beforehand: the handshake binds its SHA-256 (see
// auth.h), so a man in the middle with another certificate fails it.
//
// Thread-safe.

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>

#include "absl/status/statusor.h"
#include "csrc/base/mutex.h"
#include "csrc/coordination/auth.h"
#include "csrc/coordination/control.pb.h"
#include "csrc/coordination/grpc_options.h"

namespace grpc {
class Server;
class ServerCompletionQueue;
}  // namespace grpc

namespace pw {

class SessionState;

// One client's session on this host. Replies queued with Reply() leave
// batched, like the client's requests. Shared: the handler may keep it past
// the session's end, and replies to an ended session are dropped.
class HostSession {
 public:
  virtual ~HostSession() = default;
  // Numbered from 1 in the order sessions opened.
  uint64_t id() const { return id_; }
  // Sends `reply` (now, or right after the frame on the wire). Any thread.
  virtual void Reply(wire::Reply reply) = 0;
  // False once the stream has ended.
  virtual bool open() const = 0;
  // Whom the session proved to be: a host id (it proved itself with that
  // host's peer key), or -1 (it proved it knows the cluster's secret: the
  // client, or a host that claims no identity; or it is a tenant's).
  int peer_host() const { return claim_ >= 0 ? static_cast<int>(claim_) : -1; }
  // The service's tenant it proved to be (with the tenant's key), or 0.
  uint64_t tenant() const { return ClaimedTenant(claim_); }

 protected:
  // `claim` as auth.h's HandshakeTranscript::claim.
  HostSession(uint64_t id, int64_t claim) : id_(id), claim_(claim) {}

 private:
  const uint64_t id_;
  const int64_t claim_;
};

// What a host does with requests: the host process's end of the control
// plane (HostProcess, host/host_process.h).
class RequestHandler {
 public:
  virtual ~RequestHandler() = default;
  // Called for every request of `session`, in order, on a gRPC thread: must
  // not block for long (hand long work to other threads). Reply with
  // session->Reply(), from any thread, with the request's id (requests with
  // id 0 want no reply).
  virtual void Handle(const std::shared_ptr<HostSession>& session, wire::Request request) = 0;
  // Called once when `session`'s stream has ended, for whatever reason (the
  // client closed it, died, or lost its connection): free what it held.
  virtual void OnSessionEnd(const std::shared_ptr<HostSession>& session) {}
  // The key host `host` proves itself with to this host (auth.h's peer
  // keys), for a session that claims to be that host. Called on a gRPC
  // thread when such a session opens. FailedPrecondition while the key is
  // not known yet (the session is refused, and the dialer may retry); any
  // other error refuses the claim. The default takes no host claims.
  virtual absl::StatusOr<std::string> PeerKey(int host);
  // The key tenant `tenant` of this host's service proves itself with (its
  // bulk data comes directly, service/service.h), for a session that claims
  // to be that tenant. Any error refuses the claim (Unauthenticated). The
  // default takes no tenant claims.
  virtual absl::StatusOr<std::string> TenantKey(uint64_t tenant);
  // Answers a heartbeat (the Heartbeat rpc) the server has authenticated,
  // on the server's heartbeat thread: must answer at once, without a lock
  // that request handling may hold for long. The default echoes sent_ns and
  // reads the clock. (The server sets the Pong's counter and MAC.)
  virtual void Heartbeat(const wire::Ping& ping, wire::Pong* pong);
};

struct ServerOptions {
  Transport transport = Transport::kAuto;  // kAuto: by the listen address
  // A stream must prove itself within this long after it opens.
  int64_t handshake_timeout_ns = int64_t{10} * 1'000'000'000;
  // Streams waiting for their proof at once; a new one beyond this ends
  // the oldest.
  int max_pending_handshakes = 64;
  // A connection with no stream open is closed after this long (0: never).
  int64_t idle_connection_timeout_ns = int64_t{20} * 1'000'000'000;
};

class HostServer {
 public:
  // Listens on `listen_address` ("127.0.0.1:0": port 0 picks a free port)
  // and serves sessions that prove they know `secret` (nonempty), or a
  // host's peer key, with `handler`, which must outlive the server.
  // InvalidArgument for an empty secret or bad options, Unavailable if the
  // address cannot be bound, Internal if no TLS identity can be made.
  static absl::StatusOr<std::unique_ptr<HostServer>> Start(const std::string& listen_address, std::string secret,
                                                           RequestHandler* handler, ServerOptions options = {});
  // Shuts down: open sessions end (the handler hears of each).
  ~HostServer();
  HostServer(const HostServer&) = delete;
  HostServer& operator=(const HostServer&) = delete;

  // "127.0.0.1:4567", with the port actually bound.
  const std::string& address() const { return address_; }
  int port() const { return port_; }
  // Whether sessions come over TLS, and then the SHA-256 of the server's
  // certificate (what the handshake binds); empty without TLS.
  bool tls() const { return tls_; }
  const std::string& certificate_sha256() const { return certificate_sha256_; }
  // Streams open now, authenticated or not, and refused so far (no
  // handshake, a wrong proof, a request before the proof, too slow).
  int open_sessions() const { return open_sessions_.load(std::memory_order_acquire); }
  int64_t refused_sessions() const { return refused_sessions_.load(std::memory_order_relaxed); }
  // Heartbeats answered so far (tests).
  int64_t heartbeats() const { return heartbeats_.load(std::memory_order_relaxed); }
  // Heartbeats refused so far (no valid MAC, a replayed counter, no such
  // session) (tests).
  int64_t refused_heartbeats() const { return refused_heartbeats_.load(std::memory_order_relaxed); }

 private:
  class Service;
  class SessionReactor;
  struct HeartbeatCall;
  friend class SessionState;
  HostServer() = default;
  // A stream opened and waits for its proof: it is ended if it has not
  // proved itself by the handshake timeout, or when it is the oldest of
  // too many waiting.
  void AddPendingHandshake(const std::shared_ptr<SessionState>& session);
  // Ends the handshakes that ran out of time, until the server stops.
  void ReapLoop();
  // Answers heartbeats until the server shuts down (on heartbeat_thread_).
  void HeartbeatLoop();
  // A session proved itself: its heartbeats are checked with `key` (auth.h's
  // heartbeat key) from now until it ends.
  void AddHeartbeatSession(uint64_t session, std::string key);
  void RemoveHeartbeatSession(uint64_t session);
  // Whether `ping` is a valid heartbeat (see above): an authenticated open
  // session's, with a MAC that holds and a counter above its last one; then
  // its key is put in `key`. Otherwise the refusal.
  absl::Status CheckHeartbeat(const wire::Ping& ping, std::string* key);

  std::string address_;
  int port_ = 0;
  ServerOptions options_;
  bool tls_ = false;
  std::string certificate_sha256_;
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<grpc::ServerCompletionQueue> heartbeat_cq_;
  std::thread heartbeat_thread_;
  Mutex heartbeat_mu_;  // no heartbeat call is asked for once the server stops
  bool heartbeat_stopping_ ABSL_GUARDED_BY(heartbeat_mu_) = false;
  std::atomic<int> open_sessions_{0};
  std::atomic<int64_t> refused_sessions_{0};

  Mutex pending_mu_;
  // Protects the streams waiting for their proof, oldest first, with their
  // deadlines, and whether the server is stopping; pending_cv_ wakes the
  // reaper for either.
  std::deque<std::pair<int64_t, std::weak_ptr<SessionState>>> pending_ ABSL_GUARDED_BY(pending_mu_);
  bool stopping_ ABSL_GUARDED_BY(pending_mu_) = false;
  CondVar pending_cv_;
  std::thread reaper_;
  std::atomic<int64_t> heartbeats_{0};
  std::atomic<int64_t> refused_heartbeats_{0};

  // The authenticated sessions' heartbeat keys and the last counter each
  // answered (held briefly, never while a request is handled).
  struct HeartbeatSession {
    std::string key;
    uint64_t last_counter = 0;
  };
  Mutex heartbeat_sessions_mu_;
  std::unordered_map<uint64_t, HeartbeatSession> heartbeat_sessions_ ABSL_GUARDED_BY(heartbeat_sessions_mu_);
};

}  // namespace pw

#endif  // PATHWAYS_COORDINATION_HOST_SERVER_H_
