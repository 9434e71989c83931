#ifndef PATHWAYS_COORDINATION_GRPC_OPTIONS_H_
#define PATHWAYS_COORDINATION_GRPC_OPTIONS_H_

// The gRPC settings both ends of the control plane agree on.

#include <memory>
#include <string>

#include "grpcpp/support/channel_arguments.h"

namespace grpc {
class ChannelCredentials;
class ServerBuilder;
}  // namespace grpc

namespace pw {

// The call metadata that opens a session's handshake (host_server.h): the
// dialer's nonce (hex) and whom it claims to be ("cluster" or a host id).
inline constexpr char kAuthNonceMetadataKey[] = "pw-auth-nonce";
inline constexpr char kAuthClaimMetadataKey[] = "pw-auth-claim";

// How a control plane connection is carried (both ends must agree; both
// decide by the address unless told).
enum class Transport {
  kAuto,       // plaintext on a loopback address, TLS otherwise
  kPlaintext,
  kTls,
};

// Whether `address` ("ip:port", "[ip]:port", "localhost:port") is on
// loopback (127.0.0.0/8, ::1, localhost): the one place kAuto is plaintext.
bool IsLoopbackAddress(const std::string& address);

// Whether a connection to or from `address` uses TLS under `transport`.
bool UsesTls(Transport transport, const std::string& address);

// The client's credentials: plaintext, or TLS that takes any certificate the
// host presents. Checking the certificate is the handshake's business: it
// binds the certificate's SHA-256 (auth.h), so a certificate other than the
// host's own fails it. nullptr (with *error set) if TLS cannot be set up.
std::shared_ptr<grpc::ChannelCredentials> ClientCredentials(bool tls, std::string* error);

// Keepalive every second on an idle connection, so a host that vanished
// without closing its socket is noticed (within 10 s, as the heartbeats);
// reconnects while connecting every 0.1-1 s; no message size limit (frames
// carry arrays); a connection of its own per channel, never shared with
// another channel to the same address.
grpc::ChannelArguments ClientChannelArguments();

// Lets clients ping as often as ClientChannelArguments() does, and no more:
// with no data flowing, a ping sooner than 0.5 s after the last is a strike,
// and the third strike drops the connection ("too many pings"; a connection
// that only pings, before any session proved itself, gets no more than
// that). Keepalive from the host's side too.
void ApplyServerArguments(grpc::ServerBuilder& builder);

}  // namespace pw

#endif  // PATHWAYS_COORDINATION_GRPC_OPTIONS_H_
