#ifndef PATHWAYS_COORDINATION_GRPC_OPTIONS_H_
#define PATHWAYS_COORDINATION_GRPC_OPTIONS_H_

// The gRPC settings both ends of the control plane agree on.

#include "grpcpp/support/channel_arguments.h"

namespace grpc {
class ServerBuilder;
}  // namespace grpc

namespace pw {

// The call metadata that carries the cluster's secret.
inline constexpr char kSecretMetadataKey[] = "pw-secret";

// Keepalive every second on an idle connection, so a host that vanished
// without closing its socket is noticed (within 10 s, as the heartbeats);
// reconnects while connecting every 0.1-1 s; no message size limit (frames
// carry arrays); a connection of its own per channel, never shared with
// another channel to the same address.
grpc::ChannelArguments ClientChannelArguments();

// Lets clients ping as often as ClientChannelArguments() does (gRPC's
// default would answer that with "too many pings" and drop the
// connection), and keepalive from the host's side too.
void ApplyServerArguments(grpc::ServerBuilder& builder);

}  // namespace pw

#endif  // PATHWAYS_COORDINATION_GRPC_OPTIONS_H_
