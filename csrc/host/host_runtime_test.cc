// A host runtime behind its server: configuration by the first client, the
// owner's session, heartbeats with the incarnation, and its flags.

#include "csrc/host/host_runtime.h"

#include <cstdlib>
#include <thread>

#include "csrc/base/spin.h"
#include "csrc/coordination/host_channel.h"
#include "csrc/host/host_main.h"
#include "gtest/gtest.h"

namespace pw {
namespace {

constexpr char kSecret[] = "host-runtime-test";

wire::Hello HelloWith(int host_id, int island, std::vector<int> devices, int64_t memory = 1 << 20) {
  wire::Hello hello;
  wire::HostConfig* c = hello.mutable_config();
  c->set_host_id(host_id);
  c->set_island_id(island);
  for (int d : devices) c->add_device_ids(d);
  c->set_device_memory_bytes(memory);
  return hello;
}

ChannelOptions Options() {
  ChannelOptions options;
  options.secret = kSecret;
  options.heartbeat_period_ns = 0;
  return options;
}

class HostRuntimeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = HostServer::Start("127.0.0.1:0", kSecret, &runtime_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }
  absl::StatusOr<std::unique_ptr<HostChannel>> Connect(wire::Hello hello) {
    return HostChannel::Connect(server_->address(), std::move(hello), Options());
  }
  HostRuntime runtime_;
  std::unique_ptr<HostServer> server_;
};

TEST_F(HostRuntimeTest, ClockOffsetIsExactOnThisKernelAndEstimatedOtherwise) {
  ChannelOptions options = Options();
  options.clock_samples = 4;
  auto same = HostChannel::Connect(server_->address(), wire::Hello(), options);
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_EQ((*same)->hello_reply().boot_id(), KernelBootId());
  EXPECT_FALSE(KernelBootId().empty());
  EXPECT_EQ((*same)->clock_offset_ns(), 0);

  // Estimated from pings: the host's clock is ours here, so the estimate
  // is off by at most half a round trip (far below a second).
  options.trust_boot_id = false;
  auto estimated = HostChannel::Connect(server_->address(), wire::Hello(), options);
  ASSERT_TRUE(estimated.ok()) << estimated.status();
  EXPECT_LT(std::abs((*estimated)->clock_offset_ns()), int64_t{1'000'000'000});

  // A pong carries the host's clock, read between the ping and its reply.
  wire::Request ping;
  const int64_t sent = NowNanos();
  ping.mutable_ping()->set_sent_ns(sent);
  auto pong = (*same)->Call(std::move(ping), int64_t{10'000'000'000});
  const int64_t received = NowNanos();
  ASSERT_TRUE(pong.ok()) << pong.status();
  EXPECT_GE(pong->pong().host_ns(), sent);
  EXPECT_LE(pong->pong().host_ns(), received);
}

TEST_F(HostRuntimeTest, TheFirstClientConfiguresItAndOwnsIt) {
  EXPECT_FALSE(runtime_.configured());
  auto owner = Connect(HelloWith(1, 0, {4, 5, 6, 7}));
  ASSERT_TRUE(owner.ok()) << owner.status();
  const wire::HelloReply& hello = (*owner)->hello_reply();
  EXPECT_EQ(hello.incarnation(), runtime_.incarnation());
  EXPECT_EQ(hello.pid(), getpid());
  EXPECT_EQ(hello.config().host_id(), 1);
  EXPECT_EQ(hello.config().device_ids_size(), 4);
  EXPECT_TRUE(runtime_.configured());

  // Another session may look (no config), or repeat the same config.
  auto observer = Connect(wire::Hello());
  ASSERT_TRUE(observer.ok()) << observer.status();
  EXPECT_EQ((*observer)->hello_reply().config().host_id(), 1);
  EXPECT_TRUE(Connect(HelloWith(1, 0, {4, 5, 6, 7})).ok());
  // A different role is refused with the reason.
  auto other = Connect(HelloWith(2, 0, {8}));
  EXPECT_EQ(other.status().code(), absl::StatusCode::kFailedPrecondition) << other.status();
  EXPECT_NE(other.status().message().find("for another client already"), std::string::npos);

  // Only the owner's end counts.
  observer->reset();
  EXPECT_FALSE(runtime_.AwaitOwnerGone(50'000'000));
  owner->reset();
  EXPECT_TRUE(runtime_.AwaitOwnerGone(5'000'000'000));
}

TEST_F(HostRuntimeTest, ABadConfigIsRefusedAndLeavesTheHostFree) {
  EXPECT_EQ(Connect(HelloWith(-1, 0, {0})).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Connect(HelloWith(0, 0, {})).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Connect(HelloWith(0, 0, {0}, 0)).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(runtime_.configured());
  EXPECT_TRUE(Connect(HelloWith(0, 0, {0})).ok());
}

TEST_F(HostRuntimeTest, HeartbeatsCarryTheIncarnation) {
  auto channel = Connect(wire::Hello());
  ASSERT_TRUE(channel.ok());
  wire::Request ping;
  ping.mutable_ping()->set_sent_ns(123);
  auto pong = (*channel)->Call(ping, 5'000'000'000);
  ASSERT_TRUE(pong.ok()) << pong.status();
  EXPECT_EQ(pong->pong().sent_ns(), 123u);
  EXPECT_EQ(pong->pong().incarnation(), runtime_.incarnation());
  EXPECT_NE(HostRuntime().incarnation(), runtime_.incarnation());
}

TEST_F(HostRuntimeTest, HeartbeatsOnTheirOwnPathCarryTheIncarnation) {
  ChannelOptions options = Options();
  options.heartbeat_period_ns = 10'000'000;
  auto channel = HostChannel::Connect(server_->address(), wire::Hello(), options);
  ASSERT_TRUE(channel.ok()) << channel.status();
  // Answered (an answer with another incarnation would not count).
  const int64_t deadline = NowNanos() + 10'000'000'000;
  while ((*channel)->heartbeats_answered() < 3 && NowNanos() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_GE((*channel)->heartbeats_answered(), 3);
  EXPECT_GE(server_->heartbeats(), 3);
}

TEST(HostTestDelays, ParsedFromTheEnvironmentsText) {
  auto delays = HostRuntime::ParseTestDelays("load_function=2.5, put=0.25");
  ASSERT_TRUE(delays.ok()) << delays.status();
  EXPECT_EQ(delays->load_function_ns, 2'500'000'000);
  EXPECT_EQ(delays->put_ns, 250'000'000);
  delays = HostRuntime::ParseTestDelays("put=1");
  ASSERT_TRUE(delays.ok());
  EXPECT_EQ(delays->load_function_ns, 0);
  EXPECT_TRUE(HostRuntime::ParseTestDelays("").ok());
  for (const char* bad : {"compile=1", "put", "put=-1", "put=x", "put=7200"}) {
    EXPECT_EQ(HostRuntime::ParseTestDelays(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(ParseHostArgs, FlagsAndErrors) {
  auto options = ParseHostArgs({"--listen=0.0.0.0:7000", "--secret-stdin", "--stay", "--configure-timeout=2.5"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->listen, "0.0.0.0:7000");
  EXPECT_TRUE(options->secret_from_stdin);
  EXPECT_TRUE(options->stay);
  EXPECT_EQ(options->configure_timeout_ns, 2'500'000'000);
  EXPECT_EQ(ParseHostArgs({"--port=3"}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseHostArgs({"--configure-timeout=-1"}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseHostArgs({"--configure-timeout=nan"}).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pw
