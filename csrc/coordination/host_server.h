#ifndef PATHWAYS_COORDINATION_HOST_SERVER_H_
#define PATHWAYS_COORDINATION_HOST_SERVER_H_

// The host's end of the control plane: a gRPC server with one session per
// client stream (see host_channel.h for the client's end), and heartbeats
// answered on a thread of their own (never behind a session's requests, nor
// on a thread busy with one: a host that takes seconds over a put or a
// compile still answers them at once). It checks the
// cluster's secret when a stream opens and refuses the stream otherwise;
// anything that is not gRPC is dropped by gRPC itself; either way the host
// keeps serving. What the requests mean is the RequestHandler's business.
//
// Thread-safe.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "csrc/base/mutex.h"
#include "csrc/coordination/control.pb.h"

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

 protected:
  explicit HostSession(uint64_t id) : id_(id) {}

 private:
  const uint64_t id_;
};

// What a host does with requests: the host runtime.
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
  // Answers a heartbeat (the Heartbeat rpc), on the server's heartbeat
  // thread: must answer at once, without a lock that request handling may
  // hold for long. The default echoes sent_ns and reads the clock.
  virtual void Heartbeat(const wire::Ping& ping, wire::Pong* pong);
};

class HostServer {
 public:
  // Listens on `listen_address` ("127.0.0.1:0": port 0 picks a free port)
  // and serves sessions that present `secret` (nonempty) with `handler`,
  // which must outlive the server. InvalidArgument for an empty secret,
  // Unavailable if the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<HostServer>> Start(const std::string& listen_address, std::string secret,
                                                           RequestHandler* handler);
  // Shuts down: open sessions end (the handler hears of each).
  ~HostServer();
  HostServer(const HostServer&) = delete;
  HostServer& operator=(const HostServer&) = delete;

  // "127.0.0.1:4567", with the port actually bound.
  const std::string& address() const { return address_; }
  int port() const { return port_; }
  // Sessions open now, and refused so far (a wrong or missing secret).
  int open_sessions() const { return open_sessions_.load(std::memory_order_acquire); }
  int64_t refused_sessions() const { return refused_sessions_.load(std::memory_order_relaxed); }
  // Heartbeats answered so far (tests).
  int64_t heartbeats() const { return heartbeats_.load(std::memory_order_relaxed); }

 private:
  class Service;
  class SessionReactor;
  struct HeartbeatCall;
  friend class SessionState;
  HostServer() = default;
  // Answers heartbeats until the server shuts down (on heartbeat_thread_).
  void HeartbeatLoop();

  std::string address_;
  int port_ = 0;
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<grpc::ServerCompletionQueue> heartbeat_cq_;
  std::thread heartbeat_thread_;
  Mutex heartbeat_mu_;  // no heartbeat call is asked for once the server stops
  bool heartbeat_stopping_ ABSL_GUARDED_BY(heartbeat_mu_) = false;
  std::atomic<int> open_sessions_{0};
  std::atomic<int64_t> refused_sessions_{0};
  std::atomic<int64_t> heartbeats_{0};
};

}  // namespace pw

#endif  // PATHWAYS_COORDINATION_HOST_SERVER_H_
