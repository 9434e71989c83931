#include "csrc/coordination/grpc_options.h"

#include "absl/strings/match.h"
#include "csrc/coordination/auth.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_certificate_verifier.h"
#include "grpcpp/security/tls_credentials_options.h"
#include "grpcpp/server_builder.h"

namespace pw {
namespace {
constexpr int kKeepaliveMs = 1000;
// How long a keepalive ping may go unanswered before the connection is
// dropped. A host whose process dies ends its stream at once anyway, and one
// that stops answering is lost by its heartbeats first (3 s, see
// RemoteCluster::Connect); this only ends connections nobody watches. On 2
// cores loaded by a client and several hosts, a live host's transport can
// take over a second to answer, and a 1 s limit here lost it spuriously.
constexpr int kKeepaliveTimeoutMs = 10'000;
// Reconnect backoff while a channel connects: gRPC's default (1 s, growing
// by 1.6x) let one refused or dropped first attempt under load use up a
// 10 s connect deadline in a few retries; a host that registered is
// listening, so retry soon.
constexpr int kInitialReconnectMs = 100;
constexpr int kMaxReconnectMs = 1000;
// The least time one connection attempt (TCP, TLS, HTTP/2 settings) is
// given, which gRPC reads from GRPC_ARG_MIN_RECONNECT_BACKOFF_MS despite
// its name: an attempt gets this or its backoff, whichever is longer. gRPC's
// default; at 100 ms (which this was) a connection that took over ~1.2 s to
// set up (the longest backoff and its jitter) was cut every time, so a
// loaded host was never reached, and a call that does not wait for its
// channel (the heartbeats') failed whenever one took over 100 ms.
constexpr int kMinConnectAttemptMs = 20'000;
// Pings too soon (see ApplyServerArguments) a connection may send before it
// is dropped: gRPC's default. 0 (which this was) means unlimited.
constexpr int kMaxPingStrikes = 2;
}  // namespace

bool IsLoopbackAddress(const std::string& address) {
  std::string host = address.substr(0, address.rfind(':'));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return host == "localhost" || host == "::1" || absl::StartsWith(host, "127.");
}

bool UsesTls(Transport transport, const std::string& address) {
  return transport == Transport::kTls || (transport == Transport::kAuto && !IsLoopbackAddress(address));
}

std::shared_ptr<grpc::ChannelCredentials> ClientCredentials(bool tls, std::string* error) {
  if (!tls) return grpc::InsecureChannelCredentials();
  // gRPC's TLS wants root certificates even when it verifies nothing; a
  // certificate of our own stands in, so the system's store (which a fresh
  // machine may lack) is never read.
  static const absl::StatusOr<TlsIdentity>* const stand_in_roots =
      new absl::StatusOr<TlsIdentity>(MakeSelfSignedTlsIdentity());
  if (!stand_in_roots->ok()) {
    *error = std::string(stand_in_roots->status().message());
    return nullptr;
  }
  grpc::experimental::TlsChannelCredentialsOptions options;
  options.set_certificate_provider(std::make_shared<grpc::experimental::StaticDataCertificateProvider>(
      (*stand_in_roots)->certificate_pem));
  options.watch_root_certs();
  options.set_verify_server_certs(false);
  options.set_check_call_host(false);
  options.set_certificate_verifier(std::make_shared<grpc::experimental::NoOpCertificateVerifier>());
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::experimental::TlsCredentials(options);
  if (credentials == nullptr) *error = "gRPC could not make TLS credentials";
  return credentials;
}

grpc::ChannelArguments ClientChannelArguments() {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, kKeepaliveMs);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kKeepaliveTimeoutMs);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, kInitialReconnectMs);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, kMinConnectAttemptMs);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, kMaxReconnectMs);
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return args;
}

void ApplyServerArguments(grpc::ServerBuilder& builder) {
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, kKeepaliveMs);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kKeepaliveTimeoutMs);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, kKeepaliveMs / 2);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, kMaxPingStrikes);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  builder.SetMaxReceiveMessageSize(-1);
  builder.SetMaxSendMessageSize(-1);
}

}  // namespace pw
