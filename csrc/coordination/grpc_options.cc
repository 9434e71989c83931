#include "csrc/coordination/grpc_options.h"

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
constexpr int kMinReconnectMs = 100;
constexpr int kMaxReconnectMs = 1000;
}  // namespace

grpc::ChannelArguments ClientChannelArguments() {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, kKeepaliveMs);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kKeepaliveTimeoutMs);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, kMinReconnectMs);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, kMinReconnectMs);
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
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  builder.SetMaxReceiveMessageSize(-1);
  builder.SetMaxSendMessageSize(-1);
}

}  // namespace pw
