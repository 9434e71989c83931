#include "csrc/coordination/host_server.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "csrc/base/spin.h"
#include "csrc/coordination/auth.h"
#include "csrc/coordination/control.grpc.pb.h"
#include "csrc/coordination/frame_queue.h"
#include "csrc/coordination/grpc_options.h"
#include "grpcpp/grpcpp.h"

namespace pw {
namespace {

// A stream refused before it had a session: finished at once.
class RefusedSession final : public grpc::ServerBidiReactor<wire::ClientFrame, wire::HostFrame> {
 public:
  explicit RefusedSession(grpc::Status why) { Finish(std::move(why)); }
  void OnDone() override { delete this; }
};

// The handshake's metadata value, or an empty view.
grpc::string_ref Metadata(const grpc::CallbackServerContext& context, const char* key) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(key);
  return it == metadata.end() ? grpc::string_ref() : it->second;
}

}  // namespace

absl::StatusOr<std::string> RequestHandler::PeerKey(int host) {
  return absl::PermissionDeniedError("this server takes sessions of the cluster's secret only, not of a host");
}

absl::StatusOr<std::string> RequestHandler::TenantKey(uint64_t tenant) {
  return absl::UnauthenticatedError(absl::StrCat("this host takes no tenant sessions (tenant ", tenant, ")"));
}

// A session's state shared with the handler; the reactor, which gRPC owns,
// is reachable from it until the stream is done.
// Internal to this file: its reactor reads and writes the fields directly.
class SessionState final : public HostSession {
 public:
  // `refused` counts the sessions refused (HostServer::refused_sessions).
  SessionState(uint64_t id, int64_t claim, std::atomic<int64_t>* refused)
      : HostSession(id, claim), refused_count_(refused) {}

  void Reply(wire::Reply reply) override;
  bool open() const override {
    MutexLock lock(&mu_);
    return reactor_ != nullptr && !read_done_ && !refused_;
  }
  // Ends the stream with `why` unless it ended already (or, with
  // `only_unauthenticated`, once it has proved itself), and counts it
  // refused before the dialer can hear of it. True if it did.
  bool Refuse(grpc::Status why, bool only_unauthenticated);
  bool authenticated() const {
    MutexLock lock(&mu_);
    return authenticated_;
  }

  mutable Mutex mu_;
  // Protects the reactor pointer (null once the stream is done), the frame
  // being assembled, the writing flag (one write at a time), whether the
  // client's side has ended, whether the stream was finished or refused
  // (then with the status it finishes with once no write is in flight),
  // and whether the session proved itself.
  HostServer::SessionReactor* reactor_ ABSL_GUARDED_BY(mu_) = nullptr;
  FrameQueue<wire::HostFrame, wire::Reply, &wire::HostFrame::add_replies> pending_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool read_done_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool refused_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status refusal_ ABSL_GUARDED_BY(mu_);
  bool authenticated_ ABSL_GUARDED_BY(mu_) = false;
  wire::HostFrame out_;  // the frame on the wire: touched only by whoever set writing_
  std::atomic<int64_t>* const refused_count_;
};

class HostServer::SessionReactor final : public grpc::ServerBidiReactor<wire::ClientFrame, wire::HostFrame> {
 public:
  // What the session must prove, and how.
  struct Handshake {
    std::string key;
    HandshakeTranscript transcript;
    std::string refused_text;  // the refusal for a wrong proof
  };

  SessionReactor(HostServer* server, RequestHandler* handler, uint64_t id, int64_t claim, Handshake handshake)
      : server_(server),
        handler_(handler),
        state_(std::make_shared<SessionState>(id, claim, &server->refused_sessions_)),
        handshake_(std::move(handshake)) {
    {
      MutexLock lock(&state_->mu_);
      state_->reactor_ = this;
    }
    server_->open_sessions_.fetch_add(1, std::memory_order_acq_rel);
    server_->AddPendingHandshake(state_);
    wire::Reply challenge;
    challenge.mutable_challenge()->set_nonce(handshake_.transcript.listener_nonce);
    state_->Reply(std::move(challenge));
    StartRead(&in_);
  }

  void Write(const wire::HostFrame* frame) { StartWrite(frame); }
  void FinishWith(grpc::Status status) { Finish(std::move(status)); }

  void OnReadDone(bool ok) override {
    if (!ok) {
      bool finish = false;
      {
        MutexLock lock(&state_->mu_);
        state_->read_done_ = true;
        state_->pending_.Clear();
        if (!state_->writing_ && !state_->finished_) finish = state_->finished_ = true;
      }
      if (finish) Finish(state_refusal_or_ok());
      return;
    }
    if (!authenticated_) {
      if (!TakeProof()) return;  // refused: no more reads
      in_.Clear();
      StartRead(&in_);
      return;
    }
    const std::shared_ptr<HostSession> session = state_;
    for (wire::Request& request : *in_.mutable_requests()) handler_->Handle(session, std::move(request));
    in_.Clear();
    StartRead(&in_);
  }

  void OnWriteDone(bool ok) override {
    bool write = false, finish = false;
    grpc::Status status;
    {
      MutexLock lock(&state_->mu_);
      state_->writing_ = false;
      if (ok && !state_->read_done_ && !state_->refused_ && state_->pending_.Pop(&state_->out_)) {
        write = state_->writing_ = true;
      } else if ((state_->read_done_ || state_->refused_ || !ok) && !state_->finished_) {
        finish = state_->finished_ = true;
        status = state_->refused_ ? state_->refusal_ : grpc::Status::OK;
      }
    }
    if (write) Write(&state_->out_);
    if (finish) Finish(std::move(status));
  }

  void OnDone() override {
    bool authenticated;
    {
      MutexLock lock(&state_->mu_);
      state_->reactor_ = nullptr;
      authenticated = state_->authenticated_;
    }
    // The handler hears only of the sessions it was handed.
    if (authenticated) {
      server_->RemoveHeartbeatSession(state_->id());
      handler_->OnSessionEnd(state_);
    }
    server_->open_sessions_.fetch_sub(1, std::memory_order_acq_rel);
    delete this;
  }

 private:
  grpc::Status state_refusal_or_ok() {
    MutexLock lock(&state_->mu_);
    return state_->refused_ ? state_->refusal_ : grpc::Status::OK;
  }

  // The first frame: exactly the dialer's proof. True if it holds, and the
  // session is open; false if the stream was refused.
  bool TakeProof() {
    if (in_.requests_size() != 1 || in_.requests(0).kind_case() != wire::Request::kAuthProof) {
      Refuse("a request came before the session's handshake finished (the first frame must hold only the "
             "client's proof)");
      return false;
    }
    const wire::Request& request = in_.requests(0);
    const std::string expected = HandshakeProof(handshake_.key, ProofBy::kDialer, handshake_.transcript);
    if (!ConstantTimeEquals(request.auth_proof().proof(), expected)) {
      Refuse(handshake_.refused_text);
      return false;
    }
    {
      // Atomically with a refusal that only ends unauthenticated sessions
      // (the reaper's): either it came first, and the stream is ending, or
      // it will leave this session alone.
      MutexLock lock(&state_->mu_);
      if (state_->refused_) return false;
      state_->authenticated_ = true;
    }
    authenticated_ = true;
    // Its heartbeats count from now (until OnDone).
    server_->AddHeartbeatSession(state_->id(), HeartbeatKey(handshake_.key, handshake_.transcript));
    wire::Reply reply;
    reply.set_id(request.id());
    reply.mutable_host_proof()->set_proof(HandshakeProof(handshake_.key, ProofBy::kListener, handshake_.transcript));
    reply.mutable_host_proof()->set_heartbeat_session(state_->id());
    state_->Reply(std::move(reply));
    return true;
  }

  void Refuse(const std::string& why) {
    state_->Refuse(grpc::Status(grpc::StatusCode::UNAUTHENTICATED, why), /*only_unauthenticated=*/false);
  }

  HostServer* server_;
  RequestHandler* handler_;
  std::shared_ptr<SessionState> state_;
  const Handshake handshake_;
  bool authenticated_ = false;  // read and written by the reading reactions only
  wire::ClientFrame in_;
};

void SessionState::Reply(wire::Reply reply) {
  HostServer::SessionReactor* reactor;
  {
    MutexLock lock(&mu_);
    if (reactor_ == nullptr || read_done_ || finished_ || refused_) return;  // the session ended: dropped
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

bool SessionState::Refuse(grpc::Status why, bool only_unauthenticated) {
  HostServer::SessionReactor* reactor = nullptr;
  {
    MutexLock lock(&mu_);
    if (reactor_ == nullptr || finished_ || refused_ || (only_unauthenticated && authenticated_)) return false;
    refused_ = true;
    refusal_ = why;
    pending_.Clear();
    refused_count_->fetch_add(1, std::memory_order_relaxed);
    if (writing_) return true;  // the write's OnWriteDone finishes the stream
    finished_ = true;
    reactor = reactor_;
  }
  // OnDone (which deletes the reactor) cannot come before this Finish.
  reactor->FinishWith(std::move(why));
  return true;
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
    auto refuse = [&](grpc::StatusCode code, std::string why) {
      server_->refused_sessions_.fetch_add(1, std::memory_order_relaxed);
      return new RefusedSession(grpc::Status(code, std::move(why)));
    };
    const grpc::string_ref nonce_hex = Metadata(*context, kAuthNonceMetadataKey);
    const grpc::string_ref claim = Metadata(*context, kAuthClaimMetadataKey);
    absl::StatusOr<SessionOpening> opening = ParseSessionOpening(
        absl::string_view(nonce_hex.data(), nonce_hex.size()), absl::string_view(claim.data(), claim.size()));
    if (!opening.ok()) return refuse(grpc::StatusCode::UNAUTHENTICATED, std::string(opening.status().message()));
    SessionReactor::Handshake handshake;
    const int64_t claimed = opening->claim;
    const int peer_host = claimed >= 0 ? static_cast<int>(claimed) : -1;  // ParseSessionOpening parsed an int
    if (const uint64_t tenant = ClaimedTenant(claimed); tenant != 0) {
      absl::StatusOr<std::string> key = handler_->TenantKey(tenant);
      if (!key.ok()) return refuse(grpc::StatusCode::UNAUTHENTICATED, std::string(key.status().message()));
      handshake.key = *std::move(key);
      handshake.refused_text = absl::StrCat("the session did not prove it is tenant ", tenant);
    } else if (peer_host < 0) {
      handshake.key = secret_;
      handshake.refused_text = "the cluster's secret does not match";
    } else {
      absl::StatusOr<std::string> key = handler_->PeerKey(peer_host);
      if (!key.ok()) {
        // Not yet known: the dialer may try again. Anything else: refused.
        return refuse(absl::IsFailedPrecondition(key.status()) ? grpc::StatusCode::FAILED_PRECONDITION
                                                               : grpc::StatusCode::UNAUTHENTICATED,
                      std::string(key.status().message()));
      }
      handshake.key = *std::move(key);
      handshake.refused_text = absl::StrCat("the session did not prove it is host ", peer_host);
    }
    absl::StatusOr<std::string> own_nonce = RandomBytes(kNonceBytes);
    if (!own_nonce.ok()) return refuse(grpc::StatusCode::INTERNAL, std::string(own_nonce.status().message()));
    handshake.transcript.plane = "control";
    handshake.transcript.claim = claimed;
    handshake.transcript.dialer_nonce = std::move(opening->nonce);
    handshake.transcript.listener_nonce = *std::move(own_nonce);
    handshake.transcript.binding = server_->certificate_sha256_;
    return new SessionReactor(server_, handler_, next_id_.fetch_add(1, std::memory_order_relaxed), claimed,
                              std::move(handshake));
  }

  RequestHandler* handler() const { return handler_; }

 private:
  HostServer* server_;
  const std::string secret_;
  RequestHandler* handler_;
  std::atomic<uint64_t> next_id_{1};
};

void HostServer::AddPendingHandshake(const std::shared_ptr<SessionState>& session) {
  std::shared_ptr<SessionState> evicted;
  {
    MutexLock lock(&pending_mu_);
    // Drop the ones that proved themselves or ended.
    for (auto it = pending_.begin(); it != pending_.end();) {
      std::shared_ptr<SessionState> s = it->second.lock();
      it = (s == nullptr || s->authenticated()) ? pending_.erase(it) : it + 1;
    }
    if (static_cast<int>(pending_.size()) >= options_.max_pending_handshakes) {
      evicted = pending_.front().second.lock();
      pending_.pop_front();
    }
    pending_.emplace_back(NowNanos() + options_.handshake_timeout_ns, session);
    pending_cv_.SignalAll();
  }
  if (evicted != nullptr) {
    evicted->Refuse(grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                                 "too many sessions waiting for their handshake: the oldest was ended"),
                    /*only_unauthenticated=*/true);
  }
}

void HostServer::ReapLoop() {
  for (;;) {
    std::shared_ptr<SessionState> late;
    {
      MutexLock lock(&pending_mu_);
      while (!stopping_ && late == nullptr) {
        if (pending_.empty()) {
          pending_cv_.Wait(&pending_mu_);
          continue;
        }
        const int64_t wait_ns = pending_.front().first - NowNanos();
        if (wait_ns > 0) {
          pending_cv_.WaitUntil(&pending_mu_, std::chrono::steady_clock::now() + std::chrono::nanoseconds(wait_ns));
          continue;
        }
        late = pending_.front().second.lock();
        pending_.pop_front();
      }
      if (stopping_) return;
    }
    late->Refuse(grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                              absl::StrCat("the session did not finish its handshake within ",
                                           options_.handshake_timeout_ns / 1e9, " s")),
                 /*only_unauthenticated=*/true);
  }
}

void HostServer::AddHeartbeatSession(uint64_t session, std::string key) {
  MutexLock lock(&heartbeat_sessions_mu_);
  heartbeat_sessions_[session] = HeartbeatSession{std::move(key), 0};
}

void HostServer::RemoveHeartbeatSession(uint64_t session) {
  MutexLock lock(&heartbeat_sessions_mu_);
  heartbeat_sessions_.erase(session);
}

absl::Status HostServer::CheckHeartbeat(const wire::Ping& ping, std::string* key) {
  MutexLock lock(&heartbeat_sessions_mu_);
  auto it = heartbeat_sessions_.find(ping.session());
  if (it == heartbeat_sessions_.end()) {
    return absl::UnauthenticatedError("the heartbeat names no authenticated session open on this host");
  }
  HeartbeatSession& session = it->second;
  if (!ConstantTimeEquals(ping.mac(), HeartbeatPingMac(session.key, ping.session(), ping.counter(), ping.sent_ns()))) {
    return absl::UnauthenticatedError("the heartbeat's MAC does not hold for its session");
  }
  // Checked after the MAC, so only the session's client can move it on.
  if (ping.counter() <= session.last_counter) {
    return absl::UnauthenticatedError(absl::StrCat("the heartbeat's counter (", ping.counter(),
                                                   ") is not above the session's last (", session.last_counter,
                                                   "): a replay"));
  }
  session.last_counter = ping.counter();
  *key = session.key;
  return absl::OkStatus();
}

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
    std::string key;
    if (absl::Status checked = CheckHeartbeat(call->ping, &key); !checked.ok()) {
      refused_heartbeats_.fetch_add(1, std::memory_order_relaxed);
      call->responder.FinishWithError(
          grpc::Status(grpc::StatusCode::UNAUTHENTICATED, std::string(checked.message())), call);
      continue;
    }
    wire::Pong pong;
    service_->handler()->Heartbeat(call->ping, &pong);
    pong.set_counter(call->ping.counter());
    pong.set_mac(HeartbeatPongMac(key, call->ping.session(), call->ping.counter(), call->ping.sent_ns(),
                                  pong.incarnation(), pong.host_ns()));
    heartbeats_.fetch_add(1, std::memory_order_relaxed);
    call->responder.Finish(pong, grpc::Status::OK, call);
  }
}

absl::StatusOr<std::unique_ptr<HostServer>> HostServer::Start(const std::string& listen_address, std::string secret,
                                                              RequestHandler* handler, ServerOptions options) {
  if (secret.empty()) return absl::InvalidArgumentError("a host needs the cluster's secret; got an empty one");
  const size_t colon = listen_address.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("listen address '", listen_address, "' has no port (use e.g. 127.0.0.1:0)"));
  }
  if (options.handshake_timeout_ns <= 0 || options.max_pending_handshakes < 1 ||
      options.idle_connection_timeout_ns < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("server options: handshake_timeout_ns (", options.handshake_timeout_ns,
                     ") and max_pending_handshakes (", options.max_pending_handshakes,
                     ") must be positive, idle_connection_timeout_ns (", options.idle_connection_timeout_ns,
                     ") not negative"));
  }
  std::unique_ptr<HostServer> server(new HostServer());
  server->options_ = options;
  server->tls_ = UsesTls(options.transport, listen_address);
  std::shared_ptr<grpc::ServerCredentials> credentials = grpc::InsecureServerCredentials();
  if (server->tls_) {
    absl::StatusOr<TlsIdentity> identity = MakeSelfSignedTlsIdentity();
    if (!identity.ok()) return identity.status();
    grpc::SslServerCredentialsOptions ssl;
    ssl.pem_key_cert_pairs.push_back({identity->private_key_pem, identity->certificate_pem});
    credentials = grpc::SslServerCredentials(ssl);
    server->certificate_sha256_ = identity->certificate_sha256;
  }
  server->service_ = std::make_unique<Service>(server.get(), std::move(secret), handler);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(listen_address, credentials, &server->port_);
  ApplyServerArguments(builder);
  if (options.idle_connection_timeout_ns > 0) {
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS,
                               static_cast<int>(std::max<int64_t>(options.idle_connection_timeout_ns / 1'000'000, 1)));
  }
  builder.RegisterService(server->service_.get());
  server->heartbeat_cq_ = builder.AddCompletionQueue();
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", listen_address));
  }
  server->heartbeat_thread_ = std::thread([s = server.get()] { s->HeartbeatLoop(); });
  server->address_ = absl::StrCat(listen_address.substr(0, colon), ":", server->port_);
  server->reaper_ = std::thread([s = server.get()] { s->ReapLoop(); });
  return server;
}

HostServer::~HostServer() {
  {
    MutexLock lock(&pending_mu_);
    stopping_ = true;
    pending_cv_.SignalAll();
  }
  if (reaper_.joinable()) reaper_.join();
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
