// Not a test: the round trip of a small request over the control plane on
// loopback (a HostServer and a HostChannel in this process), printed.
//   build/cpp/csrc/coordination/control_benchmark

#include <algorithm>
#include <cstdio>
#include <vector>

#include "csrc/base/spin.h"
#include "csrc/coordination/host_channel.h"
#include "csrc/coordination/host_server.h"

namespace {

class Echo final : public pw::RequestHandler {
 public:
  void Handle(const std::shared_ptr<pw::HostSession>& session, pw::wire::Request request) override {
    if (request.id() == 0) return;
    pw::wire::Reply reply;
    reply.set_id(request.id());
    if (request.has_echo()) *reply.mutable_echo() = request.echo();
    session->Reply(std::move(reply));
  }
};

}  // namespace

int main() {
  Echo handler;
  auto server = pw::HostServer::Start("127.0.0.1:0", "benchmark", &handler);
  if (!server.ok()) return 1;
  pw::ChannelOptions options;
  options.secret = "benchmark";
  options.heartbeat_period_ns = 0;
  auto channel = pw::HostChannel::Connect((*server)->address(), pw::wire::Hello(), options);
  if (!channel.ok()) return 1;
  std::vector<int64_t> ns;
  for (int i = 0; i < 2000; ++i) {
    pw::wire::Request request;
    request.mutable_echo()->set_payload("p");
    const int64_t start = pw::NowNanos();
    if (!(*channel)->Call(std::move(request), 5'000'000'000).ok()) return 1;
    if (i >= 100) ns.push_back(pw::NowNanos() - start);  // after warm-up
  }
  std::sort(ns.begin(), ns.end());
  std::printf("control round trip over loopback (gRPC, %zu calls): p50 %.1f us, p90 %.1f us, p99 %.1f us\n",
              ns.size(), ns[ns.size() / 2] / 1e3, ns[ns.size() * 9 / 10] / 1e3, ns[ns.size() * 99 / 100] / 1e3);
  return 0;
}
