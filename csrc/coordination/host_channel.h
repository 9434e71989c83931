#ifndef PATHWAYS_COORDINATION_HOST_CHANNEL_H_
#define PATHWAYS_COORDINATION_HOST_CHANNEL_H_

// The client's end of the control plane (paper §4, Figure 3): one session
// with one host process, over one long-lived bidirectional gRPC stream.
//
// Requests are queued with Send() and leave together, in one frame, at the
// next Flush(); while a frame is on the wire, what is queued waits and goes
// in the next one, so a burst of requests costs one write, not one each.
// Replies are matched to requests by id and handed to the request's callback
// on a gRPC thread.
//
// Authentication: Connect() runs the session's handshake (host_server.h,
// auth.h) before anything else: the host asks with a fresh nonce, the
// client proves it knows the secret (or, with `claim_host`, that host's peer
// key) and the host proves the same back; the secret itself never crosses
// the wire. A host that cannot prove it is refused (Unauthenticated).
// Transport: plaintext to a loopback address, TLS otherwise (grpc_options.h);
// the handshake binds the certificate the host presented.
//
// Liveness: the host is lost when its stream ends (its process died, or the
// connection broke) or when it showed no sign of life for
// `heartbeat_timeout_ns`. Signs of life are heartbeat answers, replies, and
// frames the stream finished writing (a long put in progress counts).
// Heartbeats travel on a connection of their own, as the Heartbeat rpc,
// which the host answers on a thread that never runs requests
// (host_server.h): a heartbeat never waits behind a large frame, and a host
// busy for seconds with a put or a compile still answers it at once. The
// secret does not go with them: each names the session and carries a
// counter that only grows and a MAC under the session's heartbeat key, which
// both ends derived from the handshake (auth.h); the host's answer carries
// a MAC too, so only the host can keep the channel alive. So the
// timeout only has to cover scheduling delays, not the host's work. Once
// the host is lost, every callback still waiting gets Unavailable naming
// the host, and so does every later request (Unavailable of kind kHostLost:
// pw.HostLostError). A lost channel stays lost.
//
// Thread-safe.

#include <atomic>
#include <functional>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "csrc/base/mutex.h"
#include "csrc/coordination/auth.h"
#include "csrc/coordination/control.pb.h"
#include "csrc/coordination/frame_queue.h"
#include "csrc/coordination/grpc_options.h"

namespace grpc {
class ClientContext;
}  // namespace grpc

namespace pw {

struct ChannelOptions {
  // The key the session proves it knows: the cluster's secret, or with
  // claim_host the peer key this host shares with the host it connects to.
  std::string secret;
  // -1: the session proves it knows the cluster's secret. A host id: the
  // session proves it is that host (with its peer key for the host at the
  // address), which the other host's rendezvous store asks for.
  int claim_host = -1;
  // Nonzero: the session proves it is this tenant of the host's service
  // (with `secret` the tenant's key; claim_host is ignored).
  uint64_t claim_tenant = 0;
  // Plaintext or TLS (kAuto: by the address; the host decides the same way).
  Transport transport = Transport::kAuto;
  // Names the host in errors ("host 3 (127.0.0.1:4567)").
  std::string host_name;
  // The client's name, sent in the Hello.
  std::string client_name = "pathways";
  // How long Connect() may take, the Hello round trip included.
  int64_t connect_timeout_ns = int64_t{10} * 1'000'000'000;
  // Polled while Connect() waits for the host (every few ms): once it
  // returns true, Connect() gives up with Unavailable (the host is known to
  // be lost). Null: never.
  std::function<bool()> abandon;
  // A heartbeat goes out every period; the host is lost after the timeout
  // without a sign of life (see above). 0: no heartbeats (the stream's end
  // still counts).
  int64_t heartbeat_period_ns = 250'000'000;
  int64_t heartbeat_timeout_ns = 3'000'000'000;
  // Called once, on a gRPC or heartbeat thread, when the host is lost (not
  // when the channel is closed by its owner): with the loss. Must not block,
  // nor send on this channel. Before any request fails with the loss (the
  // requests waiting for replies, and new ones), so that what it does (the
  // client marks the host's devices failed) is seen by whoever sees the
  // loss.
  std::function<void(const absl::Status&)> on_lost;
  // Connect() estimates the host's clock offset (clock_offset_ns()) from
  // this many ping round trips, unless the host runs on this kernel (same
  // boot id: one monotonic clock). 0: no estimate (offset 0).
  int clock_samples = 0;
  // False: estimate even for a host on this kernel (tests).
  bool trust_boot_id = true;
};

// This kernel's boot id (/proc/sys/kernel/random/boot_id), or "" if unknown.
const std::string& KernelBootId();

// A Status to and from its wire form (its code, message and error kind:
// base/error_kind.h).
void ToWire(const absl::Status& status, wire::Status* out);
absl::Status FromWire(const wire::Status& status);
// The status a reply carries (OK when it has none).
inline absl::Status ReplyStatus(const wire::Reply& reply) {
  return reply.has_status() ? FromWire(reply.status()) : absl::OkStatus();
}

class HostChannel {
 public:
  // Gets the reply to one request: OK with the host's reply, or the error
  // that ended the channel. Runs on a gRPC thread (or on the caller's, when
  // the channel is lost already): it must not block.
  using ReplyCallback = absl::AnyInvocable<void(absl::StatusOr<wire::Reply>) &&>;

  // Opens a session with the host at `address` ("127.0.0.1:4567"), runs the
  // handshake and exchanges `hello` (its reply is in hello_reply()).
  // Unavailable if the host cannot be reached in time; Unauthenticated if
  // it refused our proof, or could not prove itself; FailedPrecondition if
  // it does not know the key of our claim yet (a host that has not joined
  // its cluster: try again); or the host's own error for the Hello.
  static absl::StatusOr<std::unique_ptr<HostChannel>> Connect(const std::string& address, wire::Hello hello,
                                                              const ChannelOptions& options);
  // Ends the session (the host frees what it held for it) and waits for the
  // stream to close. Callbacks still waiting get Cancelled.
  ~HostChannel();
  // The same, leaving the object to its owner: from now on no thread of the
  // channel runs (heartbeats stopped, the stream closed) and requests fail
  // with `why`; the loss is not reported (on_lost). Idempotent (the first
  // `why` stays); what a process does before it exits, so that no thread
  // of it calls back while the process's statics are destroyed.
  void Close(absl::Status why);
  HostChannel(const HostChannel&) = delete;
  HostChannel& operator=(const HostChannel&) = delete;

  const std::string& address() const { return address_; }
  const wire::HelloReply& hello_reply() const { return hello_reply_; }
  // The host's monotonic clock minus this process's (NowNanos()), as
  // estimated by Connect(): exact (0) for a host on this kernel, else from
  // the ping with the shortest round trip (error at most half of it).
  int64_t clock_offset_ns() const { return clock_offset_ns_; }

  // Queues `request` for the next frame; its id is set here. `done` gets
  // the reply; null: no reply is wanted (id 0), and the host sends none.
  void Send(wire::Request request, ReplyCallback done);
  // Sends what is queued (at once, or right after the frame on the wire).
  void Flush();
  // Send, Flush and wait up to `timeout_ns` for the reply; the reply's own
  // status is returned as an error. DeadlineExceeded on timeout.
  absl::StatusOr<wire::Reply> Call(wire::Request request, int64_t timeout_ns);

  // The claim this channel's session makes (auth.h's HandshakeTranscript).
  int64_t claim() const {
    return options_.claim_tenant != 0 ? TenantClaim(options_.claim_tenant) : options_.claim_host < 0 ? -1
                                                                                                    : options_.claim_host;
  }

  // OK while the host is reachable; Unavailable once it is lost.
  absl::Status status() const;
  bool alive() const { return !lost_.load(std::memory_order_acquire); }
  // Frames written so far (for tests and stats: batching).
  int64_t frames_sent() const { return frames_sent_.load(std::memory_order_relaxed); }
  // Heartbeats the host answered so far (tests).
  int64_t heartbeats_answered() const { return heartbeats_answered_.load(std::memory_order_relaxed); }

  // Marks the host lost with `why` (idempotent) and cancels the stream.
  void Lose(absl::Status why);

 private:
  class Stream;
  HostChannel(std::string address, ChannelOptions options);
  // The handshake's part of Connect: waits for the host's challenge,
  // proves, and checks the host's proof.
  absl::Status Authenticate(const std::string& nonce, bool tls, int64_t deadline_ns);
  void OnReply(wire::Reply reply);
  void OnWriteDone(bool ok);
  // The stream's reading side ended: no write starts from now on. True if
  // no write is in flight, so the write flow's hold may go now.
  bool OnReadEnded();
  void OnStreamDone(absl::Status status);
  void HeartbeatLoop();
  // One heartbeat on the heartbeat connection, waiting at most until
  // `deadline_ns`; true if the host answered (as the same incarnation).
  bool Heartbeat(int64_t deadline_ns);

  const std::string address_;
  ChannelOptions options_;  // set before the channel is shared
  wire::HelloReply hello_reply_;
  int64_t clock_offset_ns_ = 0;
  std::unique_ptr<Stream> stream_;
  std::atomic<bool> lost_{false};
  std::atomic<int64_t> last_heard_ns_{0};
  std::atomic<int64_t> frames_sent_{0};
  std::atomic<int64_t> heartbeats_answered_{0};
  std::atomic<uint64_t> next_id_{1};

  mutable Mutex mu_;
  // Protects the loss status, the callbacks of requests in flight by id,
  // the frame being assembled and the writing flag (one write at a time on
  // a gRPC stream), whether the stream's reading side has ended (then no
  // write starts), and the done flag the destructor waits for.
  absl::Status lost_status_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, ReplyCallback> waiting_ ABSL_GUARDED_BY(mu_);
  FrameQueue<wire::ClientFrame, wire::Request, &wire::ClientFrame::add_requests> pending_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool read_ended_ ABSL_GUARDED_BY(mu_) = false;
  bool stream_done_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // The loss is being reported (on_lost runs): requests and replies that
  // would fail with it wait until it has been (AwaitReportLocked), so that
  // whoever sees a HostLostError sees what on_lost did (the host's devices
  // failed).
  bool reporting_ ABSL_GUARDED_BY(mu_) = false;
  void AwaitReportLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // on_lost(why), then the waiters of the report woken.
  void Report(const absl::Status& why);
  // The host's challenge (its nonce), once it came.
  std::optional<std::string> challenge_ ABSL_GUARDED_BY(mu_);
  // The frame on the wire: touched only by whoever set writing_.
  wire::ClientFrame out_;
  // The heartbeat call in flight (cancelled when the channel closes).
  grpc::ClientContext* heartbeat_call_ ABSL_GUARDED_BY(mu_) = nullptr;
  CondVar cv_;  // stream_done_, stopping_, challenge_, reporting_
  // The heartbeats' own connection and stub, the session's heartbeat key and
  // id (from the handshake, auth.h) and the last counter sent: used by the
  // heartbeat thread only (set before it starts).
  struct HeartbeatPath;
  std::unique_ptr<HeartbeatPath> heartbeat_path_;
  std::string heartbeat_key_;
  uint64_t heartbeat_session_ = 0;
  uint64_t heartbeat_counter_ = 0;
  std::thread heartbeat_;
  // Close() runs once, whole, before any other caller returns from it.
  Mutex close_mu_;
  bool closed_ ABSL_GUARDED_BY(close_mu_) = false;
};

}  // namespace pw

#endif  // PATHWAYS_COORDINATION_HOST_CHANNEL_H_
