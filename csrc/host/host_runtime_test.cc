// A host runtime behind its server: configuration by the first client, the
// owner's session, heartbeats with the incarnation, and its flags.

#include "csrc/host/host_runtime.h"

#include <cstdlib>

#include "csrc/base/spin.h"
#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "csrc/coordination/host_channel.h"
#include "csrc/coordination/protocol_version.h"
#include "csrc/host/host_main.h"
#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace pw {
namespace {

constexpr char kSecret[] = "host-runtime-test";

wire::Hello HelloWith(int host_id, int island, std::vector<int> devices, int64_t memory = 1 << 20) {
  wire::Hello hello;
  hello.set_protocol_version(kControlProtocolVersion);  // as HostPool's
  hello.set_op_registry_version(kOpRegistryVersion);
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

// A client of another build (another control protocol, another op
// registry, or one from before versions were exchanged) is refused before
// it configures the host, with both sides' versions in the error; the
// reply to any Hello says the host's own.
TEST_F(HostRuntimeTest, AClientOfAnotherBuildIsRefusedNamingBothVersions) {
  struct Case {
    const char* name;
    uint32_t protocol;
    uint64_t op_registry;
  };
  for (const Case& c : {Case{"another protocol", kControlProtocolVersion + 1, kOpRegistryVersion},
                        Case{"another op registry", kControlProtocolVersion, kOpRegistryVersion ^ 0x5a5a},
                        Case{"no versions (an older client)", 0, 0}}) {
    SCOPED_TRACE(c.name);
    wire::Hello hello = HelloWith(1, 0, {4, 5});
    hello.set_protocol_version(c.protocol);
    hello.set_op_registry_version(c.op_registry);
    auto refused = Connect(hello);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
    const std::string theirs = DescribeVersions(c.protocol, c.op_registry);
    const std::string ours = DescribeVersions(kControlProtocolVersion, kOpRegistryVersion);
    EXPECT_TRUE(absl::StrContains(refused.status().message(), theirs)) << refused.status();
    EXPECT_TRUE(absl::StrContains(refused.status().message(), ours)) << refused.status();
    EXPECT_FALSE(runtime_.configured());
  }
  // An observer (no config) is answered, with the host's versions.
  auto observer = Connect(wire::Hello());
  ASSERT_TRUE(observer.ok()) << observer.status();
  EXPECT_EQ((*observer)->hello_reply().protocol_version(), kControlProtocolVersion);
  EXPECT_EQ((*observer)->hello_reply().op_registry_version(), kOpRegistryVersion);
  EXPECT_TRUE(Connect(HelloWith(1, 0, {4, 5})).ok());
}

TEST(ProtocolVersion, TheOpRegistryVersionIsAHashOfItsTable) {
  // Computed at compile time from the table (op_registry.h); a change of any
  // row changes it. Not 0, which means "no version" on the wire.
  static_assert(kOpRegistryVersion != 0);
  EXPECT_EQ(DescribeVersions(2, 0x0123456789abcdef), "control protocol 2, op registry 0123456789abcdef");
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

TEST(AdvertisedIp, AWildcardListenAdvertisesAnAddressOthersCanReach) {
  auto ip = [](std::vector<std::string> args) { return AdvertisedIp(*ParseHostArgs(args)); };
  EXPECT_EQ(*ip({}), "127.0.0.1");
  EXPECT_EQ(*ip({"--listen=10.1.2.3:7000"}), "10.1.2.3");
  EXPECT_EQ(*ip({"--listen=[::1]:7000"}), "::1");
  EXPECT_EQ(*ip({"--listen=0.0.0.0:7000", "--advertise=10.1.2.3"}), "10.1.2.3");
  // With a client to register with: the local IP that reaches it.
  EXPECT_EQ(*ip({"--listen=0.0.0.0:0", "--client=127.0.0.1:5000"}), "127.0.0.1");
  EXPECT_EQ(*ip({"--listen=[::]:0", "--client=[::1]:5000"}), "::1");
  // Before, a wildcard listen advertised 0.0.0.0 to the client and bound
  // the data plane to loopback: unreachable from any other machine.
  absl::StatusOr<std::string> none = ip({"--listen=0.0.0.0:7000"});
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(none.status().message(), "--advertise=IP")) << none.status();
  EXPECT_EQ(ip({"--listen=0.0.0.0:7000", "--advertise=0.0.0.0"}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ip({"--listen=10.1.2.3:7000", "--advertise=10.9.9.9"}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pw
