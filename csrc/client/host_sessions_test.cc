// A client's sessions with its hosts (HostSessions) against HostProcesses
// served in this process: configuration, the hosts' identities, and a lost
// host.

#include "csrc/client/host_sessions.h"

#include <atomic>
#include <thread>

#include "csrc/base/error_kind.h"
#include "csrc/base/spin.h"
#include "csrc/coordination/protocol_version.h"
#include "csrc/host/host_process.h"
#include "gtest/gtest.h"

namespace pw {
namespace {

constexpr char kSecret[] = "host-sessions-test";

class HostSessionsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TopologyOptions topology;
    topology.num_islands = 2;
    topology.hosts_per_island = 2;
    topology.devices_per_host = 2;
    cluster_ = *Cluster::Create(topology);
    for (int h = 0; h < 4; ++h) {
      processes_.push_back(std::make_unique<HostProcess>());
      auto server = HostServer::Start("127.0.0.1:0", kSecret, processes_.back().get());
      ASSERT_TRUE(server.ok()) << server.status();
      addresses_.push_back((*server)->address());
      servers_.push_back(*std::move(server));
    }
  }
  ChannelOptions Options(std::string secret = kSecret) {
    ChannelOptions options;
    options.secret = std::move(secret);
    options.heartbeat_period_ns = 0;
    return options;
  }
  std::unique_ptr<Cluster> cluster_;
  std::vector<std::unique_ptr<HostProcess>> processes_;
  std::vector<std::unique_ptr<HostServer>> servers_;
  std::vector<std::string> addresses_;
};

TEST_F(HostSessionsTest, ConfiguresEveryHostAndListsThem) {
  auto sessions = HostSessions::Connect(*cluster_, addresses_, Options());
  ASSERT_TRUE(sessions.ok()) << sessions.status();
  const auto hosts = (*sessions)->hosts();
  ASSERT_EQ(hosts.size(), 4u);
  for (int h = 0; h < 4; ++h) {
    EXPECT_EQ(hosts[h].id, h);
    EXPECT_EQ(hosts[h].island, h / 2);
    EXPECT_EQ(hosts[h].address, addresses_[h]);
    EXPECT_EQ(hosts[h].pid, getpid());
    EXPECT_EQ(hosts[h].incarnation, processes_[h]->incarnation());
    EXPECT_TRUE(hosts[h].alive());
    EXPECT_TRUE(processes_[h]->configured());
    const wire::HostConfig& config = (*sessions)->channel(h).hello_reply().config();
    EXPECT_EQ(config.host_id(), h);
    EXPECT_EQ(config.island_id(), h / 2);
    ASSERT_EQ(config.device_ids_size(), 2);
    EXPECT_EQ(config.device_ids(0), 2 * h);
    EXPECT_EQ(config.device_ids(1), 2 * h + 1);
  }
  sessions->reset();  // the owner's sessions end
  for (auto& process : processes_) EXPECT_TRUE(process->AwaitOwnerGone(5'000'000'000));
}

TEST_F(HostSessionsTest, ALostHostIsReportedOnceAndTheOthersStay) {
  std::atomic<int> lost_host{-1}, reports{0};
  auto sessions = HostSessions::Connect(*cluster_, addresses_, Options(), [&](int host, const absl::Status& why) {
    EXPECT_EQ(GetErrorKind(why), ErrorKind::kHostLost);
    lost_host = host;
    reports.fetch_add(1);
  });
  ASSERT_TRUE(sessions.ok()) << sessions.status();
  servers_[2].reset();
  const int64_t deadline = NowNanos() + 10'000'000'000;
  while (reports.load() == 0 && NowNanos() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(reports.load(), 1);
  EXPECT_EQ(lost_host.load(), 2);
  const auto hosts = (*sessions)->hosts();
  EXPECT_FALSE(hosts[2].alive());
  EXPECT_NE(hosts[2].status.message().find("host 2 (" + addresses_[2] + ") was lost"), std::string::npos)
      << hosts[2].status;
  EXPECT_TRUE(hosts[0].alive() && hosts[1].alive() && hosts[3].alive());
  // Each survivor was told, before the report (so nothing of theirs waits
  // for the lost host).
  EXPECT_EQ((*sessions)->survivors_told(), 3);
}

// Whoever sees a request fail with a host's loss sees what the loss report
// did (a RemoteCluster marks the host's devices failed there): requests
// waiting for replies, and new ones, fail only once it has returned.
TEST_F(HostSessionsTest, RequestsFailWithALossOnlyOnceItWasReported) {
  std::atomic<bool> reported{false};
  auto sessions = HostSessions::Connect(*cluster_, addresses_, Options(), [&](int host, const absl::Status&) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // a slow report
    reported = true;
  });
  ASSERT_TRUE(sessions.ok()) << sessions.status();
  std::atomic<int> failed{0}, failed_before_report{0};
  auto send = [&] {
    wire::Request request;
    request.mutable_echo()->set_payload("x");
    (*sessions)->Send(2, std::move(request), [&](absl::StatusOr<wire::Reply> reply) {
      if (reply.ok()) return;
      EXPECT_EQ(GetErrorKind(reply.status()), ErrorKind::kHostLost) << reply.status();
      if (!reported.load()) failed_before_report.fetch_add(1);
      failed.fetch_add(1);
    });
    (*sessions)->Flush(2);
  };
  servers_[2].reset();
  const int64_t deadline = NowNanos() + 10'000'000'000;
  while (failed.load() < 20 && NowNanos() < deadline) send();
  EXPECT_GE(failed.load(), 20);
  EXPECT_EQ(failed_before_report.load(), 0);
  EXPECT_TRUE(reported.load());
}

TEST_F(HostSessionsTest, WrongCountsAndWrongSecretsAreRefused) {
  auto short_list = HostSessions::Connect(*cluster_, {addresses_[0]}, Options());
  EXPECT_EQ(short_list.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(short_list.status().message().find("4 hosts but 1 host addresses"), std::string::npos);
  auto refused = HostSessions::Connect(*cluster_, addresses_, Options("not the secret"));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnauthenticated) << refused.status();
  EXPECT_NE(refused.status().message().find("host 0 ("), std::string::npos) << refused.status();
  for (auto& process : processes_) EXPECT_FALSE(process->configured());
}

// A host of another build: one older than the version check (it answers
// the Hello with no versions), or one whose op registry differs. The client
// refuses it at connect time, naming both sides' versions.
class OtherBuildHost final : public RequestHandler {
 public:
  OtherBuildHost(uint32_t protocol, uint64_t op_registry) : protocol_(protocol), op_registry_(op_registry) {}
  void Handle(const std::shared_ptr<HostSession>& session, wire::Request request) override {
    wire::Reply reply;
    reply.set_id(request.id());
    if (request.kind_case() == wire::Request::kHello) {
      *reply.mutable_hello()->mutable_config() = request.hello().config();
      reply.mutable_hello()->set_protocol_version(protocol_);
      reply.mutable_hello()->set_op_registry_version(op_registry_);
    }
    if (request.id() != 0) session->Reply(std::move(reply));
  }

 private:
  const uint32_t protocol_;
  const uint64_t op_registry_;
};

TEST_F(HostSessionsTest, AHostOfAnotherBuildIsRefusedNamingBothVersions) {
  for (auto [protocol, op_registry] : {std::pair<uint32_t, uint64_t>{0, 0},
                                       {kControlProtocolVersion, kOpRegistryVersion + 1},
                                       {kControlProtocolVersion + 1, kOpRegistryVersion}}) {
    SCOPED_TRACE(DescribeVersions(protocol, op_registry));
    OtherBuildHost other(protocol, op_registry);
    auto server = HostServer::Start("127.0.0.1:0", kSecret, &other);
    ASSERT_TRUE(server.ok()) << server.status();
    std::vector<std::string> addresses = addresses_;
    addresses[1] = (*server)->address();
    auto sessions = HostSessions::Connect(*cluster_, addresses, Options());
    EXPECT_EQ(sessions.status().code(), absl::StatusCode::kFailedPrecondition) << sessions.status();
    const std::string message(sessions.status().message());
    EXPECT_NE(message.find("host 1 (" + addresses[1] + ")"), std::string::npos) << message;
    EXPECT_NE(message.find(DescribeVersions(protocol, op_registry)), std::string::npos) << message;
    EXPECT_NE(message.find(DescribeVersions(kControlProtocolVersion, kOpRegistryVersion)), std::string::npos)
        << message;
    sessions = absl::StatusOr<std::unique_ptr<HostSessions>>();
    server->reset();
  }
}

}  // namespace
}  // namespace pw
