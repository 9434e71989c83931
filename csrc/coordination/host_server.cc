#include "csrc/coordination/host_server.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "csrc/base/spin.h"
#include "csrc/coordination/control.grpc.pb.h"
#include "csrc/coordination/frame_queue.h"
#include "csrc/coordination/grpc_options.h"
#include "grpcpp/grpcpp.h"

namespace pw {
namespace {

// Compares in time independent of where the strings differ.
bool SecretMatches(grpc::string_ref given, const std::string& secret) {
  unsigned char diff = given.size() == secret.size() ? 0 : 1;
  for (size_t i = 0; i < secret.size(); ++i) {
    diff |= static_cast<unsigned char>(secret[i]) ^ static_cast<unsigned char>(i < given.size() ? given.data()[i] : 0);
  }
  return diff == 0;
}

// A stream without the secret: finished at once.
class RefusedSession final : public grpc::ServerBidiReactor<wire::ClientFrame, wire::HostFrame> {
 public:
  explicit RefusedSession(const char* why) { Finish(grpc::Status(grpc::StatusCode::UNAUTHENTICATED, why)); }
  void OnDone() override { delete this; }
};

}  // namespace

// A session's state shared with the handler; the reactor, which gRPC owns,
// is reachable from it until the stream is done.
// Internal to this file: its reactor reads and writes the fields directly.
class SessionState final : public HostSession {
 public:
  explicit SessionState(uint64_t id) : HostSession(id) {}

  void Reply(wire::Reply reply) override;
  bool open() const override {
    MutexLock lock(&mu_);
    return reactor_ != nullptr && !read_done_;
  }

  mutable Mutex mu_;
  // Protects the reactor pointer (null once the stream is done), the frame
  // being assembled, the writing flag (one write at a time), and whether
  // the client's side has ended.
  HostServer::SessionReactor* reactor_ ABSL_GUARDED_BY(mu_) = nullptr;
  FrameQueue<wire::HostFrame, wire::Reply, &wire::HostFrame::add_replies> pending_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool read_done_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  wire::HostFrame out_;  // the frame on the wire: touched only by whoever set writing_
};

class HostServer::SessionReactor final : public grpc::ServerBidiReactor<wire::ClientFrame, wire::HostFrame> {
 public:
  SessionReactor(HostServer* server, RequestHandler* handler, uint64_t id)
      : server_(server), handler_(handler), state_(std::make_shared<SessionState>(id)) {
    {
      MutexLock lock(&state_->mu_);
      state_->reactor_ = this;
    }
    server_->open_sessions_.fetch_add(1, std::memory_order_acq_rel);
    StartRead(&in_);
  }

  void Write(const wire::HostFrame* frame) { StartWrite(frame); }

  void OnReadDone(bool ok) override {
    if (!ok) {
      bool finish = false;
      {
        MutexLock lock(&state_->mu_);
        state_->read_done_ = true;
        state_->pending_.Clear();
        if (!state_->writing_ && !state_->finished_) finish = state_->finished_ = true;
      }
      if (finish) Finish(grpc::Status::OK);
      return;
    }
    const std::shared_ptr<HostSession> session = state_;
    for (wire::Request& request : *in_.mutable_requests()) handler_->Handle(session, std::move(request));
    in_.Clear();
    StartRead(&in_);
  }

  void OnWriteDone(bool ok) override {
    bool write = false, finish = false;
    {
      MutexLock lock(&state_->mu_);
      state_->writing_ = false;
      if (ok && !state_->read_done_ && state_->pending_.Pop(&state_->out_)) {
        write = state_->writing_ = true;
      } else if ((state_->read_done_ || !ok) && !state_->finished_) {
        finish = state_->finished_ = true;
      }
    }
    if (write) Write(&state_->out_);
    if (finish) Finish(grpc::Status::OK);
  }

  void OnDone() override {
    {
      MutexLock lock(&state_->mu_);
      state_->reactor_ = nullptr;
    }
    handler_->OnSessionEnd(state_);
    server_->open_sessions_.fetch_sub(1, std::memory_order_acq_rel);
    delete this;
  }

 private:
  HostServer* server_;
  RequestHandler* handler_;
  std::shared_ptr<SessionState> state_;
  wire::ClientFrame in_;
};

void SessionState::Reply(wire::Reply reply) {
  HostServer::SessionReactor* reactor;
  {
    MutexLock lock(&mu_);
    if (reactor_ == nullptr || read_done_ || finished_) return;  // the session ended: dropped
    pending_.Push(std::move(reply));
    if (writing_) return;  // goes with the next frame
    pending_.Pop(&out_);
    writing_ = true;
    reactor = reactor_;
  }
  // The reactor lives until OnDone, which cannot come before this write's
  // OnWriteDone: the stream is finished only when no write is in flight.
  reactor->Write(&out_);
}

void RequestHandler::Heartbeat(const wire::Ping& ping, wire::Pong* pong) {
  pong->set_sent_ns(ping.sent_ns());
  pong->set_host_ns(NowNanos());
}

// Sessions through the callback API (reactions on gRPC's threads, where the
// handler's requests run); heartbeats through the async API, served by
// HeartbeatLoop on a thread of their own.
class HostServer::Service final
    : public wire::Host::WithAsyncMethod_Heartbeat<wire::Host::WithCallbackMethod_Session<wire::Host::Service>> {
 public:
  Service(HostServer* server, std::string secret, RequestHandler* handler)
      : server_(server), secret_(std::move(secret)), handler_(handler) {}

  grpc::ServerBidiReactor<wire::ClientFrame, wire::HostFrame>* Session(
      grpc::CallbackServerContext* context) override {
    const auto& metadata = context->client_metadata();
    auto it = metadata.find(kSecretMetadataKey);
    if (it == metadata.end() || !SecretMatches(it->second, secret_)) {
      server_->refused_sessions_.fetch_add(1, std::memory_order_relaxed);
      return new RefusedSession(it == metadata.end() ? "the cluster's secret is missing"
                                                     : "the cluster's secret does not match");
    }
    return new SessionReactor(server_, handler_, next_id_.fetch_add(1, std::memory_order_relaxed));
  }

  bool Authorized(const grpc::ServerContext& context) const {
    const auto& metadata = context.client_metadata();
    auto it = metadata.find(kSecretMetadataKey);
    return it != metadata.end() && SecretMatches(it->second, secret_);
  }
  RequestHandler* handler() const { return handler_; }

 private:
  HostServer* server_;
  const std::string secret_;
  RequestHandler* handler_;
  std::atomic<uint64_t> next_id_{1};
};

// One heartbeat call: asked for, then answered, then done.
struct HostServer::HeartbeatCall {
  grpc::ServerContext context;
  wire::Ping ping;
  grpc::ServerAsyncResponseWriter<wire::Pong> responder{&context};
  bool answered = false;
};

void HostServer::HeartbeatLoop() {
  // gRPC must not be asked for a call once it is shutting down: the
  // destructor flags that, under the same lock, before it shuts down.
  auto request = [this] {
    MutexLock lock(&heartbeat_mu_);
    if (heartbeat_stopping_) return;
    auto* call = new HeartbeatCall();
    service_->RequestHeartbeat(&call->context, &call->ping, &call->responder, heartbeat_cq_.get(),
                               heartbeat_cq_.get(), call);
  };
  request();
  void* tag;
  bool ok;
  while (heartbeat_cq_->Next(&tag, &ok)) {
    auto* call = static_cast<HeartbeatCall*>(tag);
    if (call->answered || !ok) {  // finished, or the server is shutting down
      delete call;
      continue;
    }
    request();  // the next one may come while this one is answered
    call->answered = true;
    if (!service_->Authorized(call->context)) {
      call->responder.FinishWithError(grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "the cluster's secret is wrong"),
                                      call);
      continue;
    }
    wire::Pong pong;
    service_->handler()->Heartbeat(call->ping, &pong);
    heartbeats_.fetch_add(1, std::memory_order_relaxed);
    call->responder.Finish(pong, grpc::Status::OK, call);
  }
}

absl::StatusOr<std::unique_ptr<HostServer>> HostServer::Start(const std::string& listen_address, std::string secret,
                                                              RequestHandler* handler) {
  if (secret.empty()) return absl::InvalidArgumentError("a host needs the cluster's secret; got an empty one");
  const size_t colon = listen_address.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("listen address '", listen_address, "' has no port (use e.g. 127.0.0.1:0)"));
  }
  std::unique_ptr<HostServer> server(new HostServer());
  server->service_ = std::make_unique<Service>(server.get(), std::move(secret), handler);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(listen_address, grpc::InsecureServerCredentials(), &server->port_);
  ApplyServerArguments(builder);
  builder.RegisterService(server->service_.get());
  server->heartbeat_cq_ = builder.AddCompletionQueue();
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", listen_address));
  }
  server->heartbeat_thread_ = std::thread([s = server.get()] { s->HeartbeatLoop(); });
  server->address_ = absl::StrCat(listen_address.substr(0, colon), ":", server->port_);
  return server;
}

HostServer::~HostServer() {
  if (server_ != nullptr) {
    {
      MutexLock lock(&heartbeat_mu_);
      heartbeat_stopping_ = true;
    }
    // Cancels the open streams at once; returns when every session is done.
    server_->Shutdown(std::chrono::system_clock::now());
    server_->Wait();
  }
  // Then the heartbeats' queue, which must be drained before it goes: by
  // the loop, or here if it never started.
  if (heartbeat_cq_ == nullptr) return;
  heartbeat_cq_->Shutdown();
  if (heartbeat_thread_.joinable()) {
    heartbeat_thread_.join();
    return;
  }
  void* tag;
  bool ok;
  while (heartbeat_cq_->Next(&tag, &ok)) delete static_cast<HeartbeatCall*>(tag);
}

}  // namespace pw
