#include "csrc/coordination/host_channel.h"

#include <chrono>
#include <fstream>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "csrc/base/error_kind.h"
#include "csrc/base/spin.h"
#include "csrc/coordination/auth.h"
#include "csrc/coordination/control.grpc.pb.h"
#include "csrc/coordination/grpc_options.h"
#include "grpcpp/grpcpp.h"

namespace pw {

void ToWire(const absl::Status& status, wire::Status* out) {
  out->set_code(static_cast<int32_t>(status.code()));
  out->set_message(std::string(status.message()));
  out->set_kind(static_cast<int32_t>(GetErrorKind(status)));
}

absl::Status FromWire(const wire::Status& status) {
  const int code = status.code();
  // A code this build does not know is still an error, never OK.
  if (code <= 0 || code > static_cast<int>(absl::StatusCode::kUnauthenticated)) {
    if (code == 0) return absl::OkStatus();
    return absl::UnknownError(absl::StrCat("(status code ", code, ") ", status.message()));
  }
  absl::Status out(static_cast<absl::StatusCode>(code), status.message());
  // A kind this build does not know reads as none (GetErrorKind).
  const int kind = status.kind();
  return kind > 0 && kind < 256 ? WithErrorKind(std::move(out), static_cast<ErrorKind>(kind)) : out;
}

const std::string& KernelBootId() {
  static const std::string* const id = [] {
    std::string text;
    std::ifstream in("/proc/sys/kernel/random/boot_id");
    std::getline(in, text);
    return new std::string(in ? text : "");
  }();
  return *id;
}

// The gRPC stream of a channel, with the gRPC channel and stub it runs on.
// Reactions run on gRPC's threads and call back into the HostChannel, which
// outlives the stream (its destructor waits for OnDone).
class HostChannel::Stream final : public grpc::ClientBidiReactor<wire::ClientFrame, wire::HostFrame> {
 public:
  // Opens the stream with the handshake's first step: our nonce and claim.
  Stream(HostChannel* owner, std::shared_ptr<grpc::Channel> channel, const std::string& nonce, int64_t claim)
      : owner_(owner), channel_(std::move(channel)), stub_(wire::Host::NewStub(channel_)) {
    context_.AddMetadata(kAuthNonceMetadataKey, ToHex(nonce));
    context_.AddMetadata(kAuthClaimMetadataKey, claim >= 0                   ? absl::StrCat(claim)
                                                : ClaimedTenant(claim) != 0 ? absl::StrCat("tenant-", ClaimedTenant(claim))
                                                                            : std::string("cluster"));
    stub_->async()->Session(&context_, this);
    StartRead(&in_);
    // Writes start outside the reactions (Flush), so the write flow holds the
    // stream open: OnDone cannot come between a Flush's decision to write
    // and its StartWrite. The hold goes once no write can start any more.
    AddHold();
    StartCall();
  }

  void Write(const wire::ClientFrame* frame) { StartWrite(frame); }
  // The SHA-256 of the TLS certificate the host presented (once a message
  // of the host's came, the connection's TLS handshake is done).
  absl::StatusOr<std::string> PeerCertificateSha256() const {
    const std::shared_ptr<const grpc::AuthContext> auth = context_.auth_context();
    const std::vector<grpc::string_ref> pems =
        auth == nullptr ? std::vector<grpc::string_ref>() : auth->FindPropertyValues(GRPC_X509_PEM_CERT_PROPERTY_NAME);
    if (pems.empty()) return absl::UnauthenticatedError("the host presented no TLS certificate");
    return CertificateSha256(absl::string_view(pems.front().data(), pems.front().size()));
  }
  void Cancel() { context_.TryCancel(); }
  void ReleaseWriteHold() { RemoveHold(); }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the stream ended; OnDone follows once the write flow lets go
      if (owner_->OnReadEnded()) RemoveHold();
      return;
    }
    for (wire::Reply& reply : *in_.mutable_replies()) owner_->OnReply(std::move(reply));
    in_.Clear();
    StartRead(&in_);
  }
  void OnWriteDone(bool ok) override { owner_->OnWriteDone(ok); }
  void OnDone(const grpc::Status& status) override {
    absl::Status why;
    if (status.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
      why = absl::UnauthenticatedError(status.error_message());
    } else if (status.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
      why = absl::FailedPreconditionError(status.error_message());
    } else {
      why = absl::UnavailableError(absl::StrCat("its stream ended (", status.error_message(), ")"));
    }
    owner_->OnStreamDone(std::move(why));
  }

 private:
  HostChannel* owner_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<wire::Host::Stub> stub_;
  grpc::ClientContext context_;
  wire::HostFrame in_;
};

// The heartbeats' connection: a gRPC channel of its own (ClientChannelArguments
// gives every channel its own subchannel, so its own TCP connection), which
// no frame of the session ever queues in front of.
// It speaks TLS wherever the session does.
struct HostChannel::HeartbeatPath {
  HeartbeatPath(const std::string& address, std::shared_ptr<grpc::ChannelCredentials> credentials)
      : channel(grpc::CreateCustomChannel(address, std::move(credentials), ClientChannelArguments())),
        stub(wire::Host::NewStub(channel)) {}
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<wire::Host::Stub> stub;
};

HostChannel::HostChannel(std::string address, ChannelOptions options)
    : address_(std::move(address)), options_(std::move(options)) {
  if (options_.host_name.empty()) options_.host_name = absl::StrCat("host at ", address_);
}

absl::StatusOr<std::unique_ptr<HostChannel>> HostChannel::Connect(const std::string& address, wire::Hello hello,
                                                                  const ChannelOptions& options) {
  const int64_t deadline_ns = NowNanos() + options.connect_timeout_ns;
  std::unique_ptr<HostChannel> channel(new HostChannel(address, options));
  const bool tls = UsesTls(options.transport, address);
  std::string error;
  std::shared_ptr<grpc::ChannelCredentials> credentials = ClientCredentials(tls, &error);
  if (credentials == nullptr) return absl::InternalError(absl::StrCat("TLS to ", address, ": ", error));
  auto grpc_channel = grpc::CreateCustomChannel(address, credentials, ClientChannelArguments());
  const auto deadline = std::chrono::system_clock::now() + std::chrono::nanoseconds(options.connect_timeout_ns);
  // In short waits, so that a host known to be lost is given up at once.
  constexpr auto kAbandonPoll = std::chrono::milliseconds(10);
  while (!grpc_channel->WaitForConnected(
      options.abandon ? std::min(deadline, std::chrono::system_clock::now() + kAbandonPoll) : deadline)) {
    if (options.abandon && options.abandon()) {
      return absl::UnavailableError(absl::StrCat("gave up connecting to ", channel->options_.host_name,
                                                 ": it was lost"));
    }
    if (std::chrono::system_clock::now() >= deadline) {
      return absl::UnavailableError(absl::StrCat("cannot reach ", channel->options_.host_name, " within ",
                                                 options.connect_timeout_ns / 1e9, " s",
                                                 tls ? " (over TLS: the address is not on loopback)"
                                                     : " (in plaintext: the address is on loopback; a host that "
                                                       "listens beyond it, on 0.0.0.0 say, speaks TLS there)"));
    }
  }
  absl::StatusOr<std::string> nonce = RandomBytes(kNonceBytes);
  if (!nonce.ok()) return nonce.status();
  channel->last_heard_ns_.store(NowNanos(), std::memory_order_relaxed);
  channel->stream_ = std::make_unique<Stream>(channel.get(), std::move(grpc_channel), *nonce, channel->claim());
  if (absl::Status authenticated = channel->Authenticate(*nonce, tls, deadline_ns); !authenticated.ok()) {
    return authenticated;
  }
  wire::Request request;
  hello.set_client_name(options.client_name);
  *request.mutable_hello() = std::move(hello);
  auto reply = channel->Call(std::move(request), std::max<int64_t>(deadline_ns - NowNanos(), 0));
  if (!reply.ok()) return reply.status();
  channel->hello_reply_ = std::move(*reply->mutable_hello());
  const bool same_kernel = options.trust_boot_id && !KernelBootId().empty() &&
                           channel->hello_reply_.boot_id() == KernelBootId();
  if (options.clock_samples > 0 && !same_kernel) {
    // Cristian's method: the host read its clock somewhere in the round
    // trip; the shortest round trip bounds the error best.
    int64_t best_rtt = std::numeric_limits<int64_t>::max();
    for (int i = 0; i < options.clock_samples; ++i) {
      wire::Request ping;
      const int64_t sent = NowNanos();
      ping.mutable_ping()->set_sent_ns(sent);
      auto pong = channel->Call(std::move(ping), std::max<int64_t>(deadline_ns - NowNanos(), 0));
      if (!pong.ok()) return pong.status();
      const int64_t received = NowNanos();
      if (received - sent < best_rtt) {
        best_rtt = received - sent;
        channel->clock_offset_ns_ = pong->pong().host_ns() - (sent + (received - sent) / 2);
      }
    }
  }
  if (options.heartbeat_period_ns > 0) {
    channel->heartbeat_path_ = std::make_unique<HeartbeatPath>(address, credentials);
    channel->last_heard_ns_.store(NowNanos(), std::memory_order_relaxed);
    channel->heartbeat_ = std::thread([c = channel.get()] { c->HeartbeatLoop(); });
  }
  return channel;
}

absl::Status HostChannel::Authenticate(const std::string& nonce, bool tls, int64_t deadline_ns) {
  HandshakeTranscript transcript;
  transcript.plane = "control";
  transcript.claim = claim();
  transcript.dialer_nonce = nonce;
  {
    MutexLock lock(&mu_);
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::nanoseconds(std::max<int64_t>(deadline_ns - NowNanos(), 0));
    while (!challenge_.has_value() && !stream_done_) {
      if (!cv_.WaitUntil(&mu_, deadline) && !challenge_.has_value() && !stream_done_) {
        return absl::DeadlineExceededError(
            absl::StrCat(options_.host_name, " did not open the session's handshake in time"));
      }
    }
    if (!challenge_.has_value()) return lost_status_;  // refused at once
    transcript.listener_nonce = *challenge_;
  }
  auto fail = [&](std::string why) {
    absl::Status status = absl::UnauthenticatedError(absl::StrCat(options_.host_name, ": ", why));
    Lose(status);
    return status;
  };
  if (transcript.listener_nonce.size() != kNonceBytes) return fail("its challenge is not a nonce of 32 bytes");
  if (tls) {
    absl::StatusOr<std::string> binding = stream_->PeerCertificateSha256();
    if (!binding.ok()) return fail(std::string(binding.status().message()));
    transcript.binding = *std::move(binding);
  }
  wire::Request request;
  request.mutable_auth_proof()->set_proof(HandshakeProof(options_.secret, ProofBy::kDialer, transcript));
  absl::StatusOr<wire::Reply> reply = Call(std::move(request), std::max<int64_t>(deadline_ns - NowNanos(), 0));
  if (!reply.ok()) return reply.status();
  if (!ConstantTimeEquals(reply->host_proof().proof(),
                          HandshakeProof(options_.secret, ProofBy::kListener, transcript))) {
    return fail(claim() == -1 ? "it could not prove it knows the cluster's secret (a host of another cluster, or "
                                "someone in between)"
                : claim() >= 0 ? "it could not prove it knows our peer key"
                               : "it could not prove it knows our tenant key");
  }
  // The heartbeats' key and session (auth.h): the heartbeat thread starts
  // after this.
  heartbeat_key_ = HeartbeatKey(options_.secret, transcript);
  heartbeat_session_ = reply->host_proof().heartbeat_session();
  return absl::OkStatus();
}

HostChannel::~HostChannel() {
  Close(absl::CancelledError(absl::StrCat("the session with ", options_.host_name, " was closed")));
}

void HostChannel::Close(absl::Status why) {
  MutexLock closing(&close_mu_);
  if (closed_) return;
  closed_ = true;
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    if (heartbeat_call_ != nullptr) heartbeat_call_->TryCancel();
    cv_.SignalAll();
  }
  if (heartbeat_.joinable()) heartbeat_.join();
  if (stream_ == nullptr) return;
  Lose(std::move(why));
  MutexLock lock(&mu_);
  while (!stream_done_) cv_.Wait(&mu_);
}

void HostChannel::Send(wire::Request request, ReplyCallback done) {
  const uint64_t id = done ? next_id_.fetch_add(1, std::memory_order_relaxed) : 0;
  request.set_id(id);
  absl::Status lost;
  {
    MutexLock lock(&mu_);
    if (lost_.load(std::memory_order_relaxed)) {
      AwaitReportLocked();
      lost = lost_status_;
    } else {
      if (done) waiting_.emplace(id, std::move(done));
      pending_.Push(std::move(request));
      return;
    }
  }
  if (done) std::move(done)(std::move(lost));
}

void HostChannel::Flush() {
  {
    MutexLock lock(&mu_);
    if (writing_ || read_ended_ || !pending_.Pop(&out_)) return;
    writing_ = true;
  }
  frames_sent_.fetch_add(1, std::memory_order_relaxed);
  stream_->Write(&out_);
}

bool HostChannel::OnReadEnded() {
  MutexLock lock(&mu_);
  read_ended_ = true;
  return !writing_;  // else the write in flight lets go when it is done
}

void HostChannel::OnWriteDone(bool ok) {
  // A frame the host's end took whole (flow control lets a large one go
  // only as fast as the host reads it): the host is making progress.
  if (ok) last_heard_ns_.store(NowNanos(), std::memory_order_relaxed);
  bool release = false, write = false;
  {
    MutexLock lock(&mu_);
    writing_ = false;
    if (read_ended_) {
      // No write starts any more: the write flow's hold goes, and OnDone
      // (which fails the callbacks) may come.
      release = true;
    } else if (ok && pending_.Pop(&out_)) {
      // (A failed write means the stream is ending: OnReadDone follows.)
      write = writing_ = true;
    }
  }
  if (release) stream_->ReleaseWriteHold();
  if (!write) return;
  frames_sent_.fetch_add(1, std::memory_order_relaxed);
  stream_->Write(&out_);
}

absl::StatusOr<wire::Reply> HostChannel::Call(wire::Request request, int64_t timeout_ns) {
  struct Result {
    Mutex mu;
    CondVar cv;
    bool done ABSL_GUARDED_BY(mu) = false;
    absl::StatusOr<wire::Reply> reply ABSL_GUARDED_BY(mu);
  };
  auto result = std::make_shared<Result>();
  Send(std::move(request), [result](absl::StatusOr<wire::Reply> reply) {
    MutexLock lock(&result->mu);
    result->reply = std::move(reply);
    result->done = true;
    result->cv.SignalAll();
  });
  Flush();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::nanoseconds(timeout_ns);
  MutexLock lock(&result->mu);
  while (!result->done) {
    if (!result->cv.WaitUntil(&result->mu, deadline) && !result->done) {
      return absl::DeadlineExceededError(
          absl::StrCat(options_.host_name, " did not answer within ", timeout_ns / 1e9, " s"));
    }
  }
  if (!result->reply.ok()) return result->reply.status();
  if (absl::Status s = ReplyStatus(*result->reply); !s.ok()) return s;
  return std::move(result->reply);
}

absl::Status HostChannel::status() const {
  MutexLock lock(&mu_);
  return lost_status_;
}

void HostChannel::AwaitReportLocked() {
  // Bounded: on_lost must not wait for this channel, but if it ever did,
  // its requests would fail a little early rather than hang.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (reporting_) {
    if (!cv_.WaitUntil(&mu_, deadline)) break;
  }
}

void HostChannel::Report(const absl::Status& why) {
  if (options_.on_lost) options_.on_lost(why);
  MutexLock lock(&mu_);
  reporting_ = false;
  cv_.SignalAll();
}

void HostChannel::Lose(absl::Status why) {
  bool report;
  {
    MutexLock lock(&mu_);
    if (lost_.load(std::memory_order_relaxed)) return;
    lost_status_ = why;
    lost_.store(true, std::memory_order_release);
    report = !stopping_;  // else the owner is closing the channel
    reporting_ = report;
  }
  if (report) Report(why);
  if (stream_ != nullptr) stream_->Cancel();  // OnDone fails the callbacks still waiting
}

void HostChannel::OnReply(wire::Reply reply) {
  last_heard_ns_.store(NowNanos(), std::memory_order_relaxed);
  if (reply.id() == 0) {
    if (reply.kind_case() == wire::Reply::kChallenge) {
      MutexLock lock(&mu_);
      if (!challenge_.has_value()) challenge_ = std::move(*reply.mutable_challenge()->mutable_nonce());
      cv_.SignalAll();
    }
    return;
  }
  ReplyCallback done;
  {
    MutexLock lock(&mu_);
    auto it = waiting_.find(reply.id());
    if (it == waiting_.end()) return;  // not ours: a confused host is ignored
    done = std::move(it->second);
    waiting_.erase(it);
  }
  std::move(done)(std::move(reply));
}

void HostChannel::OnStreamDone(absl::Status why) {
  absl::flat_hash_map<uint64_t, ReplyCallback> waiting;
  absl::Status lost;
  bool report = false;
  {
    MutexLock lock(&mu_);
    if (!lost_.load(std::memory_order_relaxed)) {
      const bool refused =
          why.code() == absl::StatusCode::kUnauthenticated || why.code() == absl::StatusCode::kFailedPrecondition;
      lost_status_ = refused ? absl::Status(why.code(), absl::StrCat(options_.host_name, " refused the session: ",
                                                                      why.message()))
                             : HostLostError(absl::StrCat(options_.host_name, " was lost: ", why.message()));
      lost_.store(true, std::memory_order_release);
      report = !stopping_;
      reporting_ = report;
    }
    lost = lost_status_;
  }
  // The loss is reported before the requests waiting fail with it.
  if (report) Report(lost);
  {
    MutexLock lock(&mu_);
    AwaitReportLocked();  // Lose() may be reporting it
    waiting.swap(waiting_);
    pending_.Clear();
  }
  for (auto& [id, done] : waiting) std::move(done)(lost);
  // Last: once the destructor sees this, the channel may be gone, so the
  // callbacks above have all run by then.
  MutexLock lock(&mu_);
  stream_done_ = true;
  cv_.SignalAll();
}

bool HostChannel::Heartbeat(int64_t deadline_ns) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::nanoseconds(std::max<int64_t>(deadline_ns - NowNanos(), 1'000'000)));
  {
    MutexLock lock(&mu_);
    if (stopping_) return false;
    heartbeat_call_ = &context;
  }
  wire::Ping ping;
  ping.set_sent_ns(NowNanos());
  ping.set_session(heartbeat_session_);
  ping.set_counter(++heartbeat_counter_);
  ping.set_mac(HeartbeatPingMac(heartbeat_key_, ping.session(), ping.counter(), ping.sent_ns()));
  wire::Pong pong;
  const grpc::Status status = heartbeat_path_->stub->Heartbeat(&context, ping, &pong);
  {
    MutexLock lock(&mu_);
    heartbeat_call_ = nullptr;
  }
  if (!status.ok()) return false;
  // Only the host that holds the session's key can answer; another process
  // at the same address (the host restarted) is no answer either.
  return pong.counter() == ping.counter() &&
         ConstantTimeEquals(pong.mac(), HeartbeatPongMac(heartbeat_key_, ping.session(), ping.counter(),
                                                         ping.sent_ns(), pong.incarnation(), pong.host_ns())) &&
         pong.incarnation() == hello_reply_.incarnation();
}

void HostChannel::HeartbeatLoop() {
  const auto period = std::chrono::nanoseconds(options_.heartbeat_period_ns);
  auto next = std::chrono::steady_clock::now();
  while (true) {
    {
      MutexLock lock(&mu_);
      while (!stopping_ && std::chrono::steady_clock::now() < next) cv_.WaitUntil(&mu_, next);
      if (stopping_) return;
    }
    next = std::chrono::steady_clock::now() + period;
    if (!alive()) return;
    const int64_t silent_ns = NowNanos() - last_heard_ns_.load(std::memory_order_relaxed);
    if (silent_ns > options_.heartbeat_timeout_ns) {
      Lose(HostLostError(absl::StrCat(options_.host_name, " was lost: no sign of life (heartbeat, reply or write) for ",
                                      silent_ns / 1e9, " s")));
      return;
    }
    // Waits at most until the host would be lost without an answer.
    const int64_t deadline_ns =
        last_heard_ns_.load(std::memory_order_relaxed) + options_.heartbeat_timeout_ns + options_.heartbeat_period_ns;
    if (Heartbeat(deadline_ns)) {
      last_heard_ns_.store(NowNanos(), std::memory_order_relaxed);
      heartbeats_answered_.fetch_add(1, std::memory_order_relaxed);
    }
  }
}

}  // namespace pw
