// A HostProcess behind its server: configuration by the first client, the
// owner's session, heartbeats with the incarnation, and its flags.

#include "csrc/host/host_process.h"

#include <cstdlib>
#include <thread>
#include <vector>

#include "csrc/base/spin.h"
#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "csrc/coordination/auth.h"
#include "csrc/coordination/host_channel.h"
#include "csrc/coordination/protocol_version.h"
#include "csrc/host/host_main.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace pw {
namespace {

constexpr char kSecret[] = "host-process-test";

wire::Hello HelloWith(int host_id, int island, std::vector<int> devices, int64_t memory = 1 << 20) {
  wire::Hello hello;
  hello.set_protocol_version(kControlProtocolVersion);  // as HostSessions's
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

class HostProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = HostServer::Start("127.0.0.1:0", kSecret, &process_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }
  absl::StatusOr<std::unique_ptr<HostChannel>> Connect(wire::Hello hello) {
    return HostChannel::Connect(server_->address(), std::move(hello), Options());
  }
  HostProcess process_;
  std::unique_ptr<HostServer> server_;
};

TEST_F(HostProcessTest, ClockOffsetIsExactOnThisKernelAndEstimatedOtherwise) {
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

TEST_F(HostProcessTest, TheFirstClientConfiguresItAndOwnsIt) {
  EXPECT_FALSE(process_.configured());
  auto owner = Connect(HelloWith(1, 0, {4, 5, 6, 7}));
  ASSERT_TRUE(owner.ok()) << owner.status();
  const wire::HelloReply& hello = (*owner)->hello_reply();
  EXPECT_EQ(hello.incarnation(), process_.incarnation());
  EXPECT_EQ(hello.pid(), getpid());
  EXPECT_EQ(hello.config().host_id(), 1);
  EXPECT_EQ(hello.config().device_ids_size(), 4);
  EXPECT_TRUE(process_.configured());

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
  EXPECT_FALSE(process_.AwaitOwnerGone(50'000'000));
  owner->reset();
  EXPECT_TRUE(process_.AwaitOwnerGone(5'000'000'000));
}

TEST_F(HostProcessTest, ABadConfigIsRefusedAndLeavesTheHostFree) {
  EXPECT_EQ(Connect(HelloWith(-1, 0, {0})).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Connect(HelloWith(0, 0, {})).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Connect(HelloWith(0, 0, {0}, 0)).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(process_.configured());
  EXPECT_TRUE(Connect(HelloWith(0, 0, {0})).ok());
}

// A client of another build (another control protocol, another op
// registry, or one from before versions were exchanged) is refused before
// it configures the host, with both sides' versions in the error; the
// reply to any Hello says the host's own.
TEST_F(HostProcessTest, AClientOfAnotherBuildIsRefusedNamingBothVersions) {
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
    EXPECT_FALSE(process_.configured());
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

TEST_F(HostProcessTest, AJoinWithoutPeerKeysIsRefused) {
  auto owner = Connect(HelloWith(0, 0, {0}));
  ASSERT_TRUE(owner.ok()) << owner.status();
  wire::Request request;
  wire::JoinCluster* join = request.mutable_join();
  join->add_device_host(0);
  join->add_device_host(1);
  join->add_host_addresses(server_->address());
  join->add_host_addresses("127.0.0.1:1");
  join->set_group_prefix("no-keys");
  absl::Status status = (*owner)->Call(request, 5'000'000'000).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "peer keys")) << status;
  join->add_peer_keys("");
  join->add_peer_keys("short");
  status = (*owner)->Call(request, 5'000'000'000).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "the peer key for host 1 has 5 bytes")) << status;
}

TEST_F(HostProcessTest, HeartbeatsCarryTheIncarnation) {
  auto channel = Connect(wire::Hello());
  ASSERT_TRUE(channel.ok());
  wire::Request ping;
  ping.mutable_ping()->set_sent_ns(123);
  auto pong = (*channel)->Call(ping, 5'000'000'000);
  ASSERT_TRUE(pong.ok()) << pong.status();
  EXPECT_EQ(pong->pong().sent_ns(), 123u);
  EXPECT_EQ(pong->pong().incarnation(), process_.incarnation());
  EXPECT_NE(HostProcess().incarnation(), process_.incarnation());
}

// Two HostProcesses of one cluster, configured and joined by their owner.
class RendezvousScopeTest : public ::testing::Test {
 protected:
  static constexpr int kHosts = 2;
  void SetUp() override {
    prefix_ = absl::StrCat("cluster-scope-test-", getpid());
    keys_.assign(kHosts, std::vector<std::string>(kHosts));
    for (int a = 0; a < kHosts; ++a) {
      for (int b = a + 1; b < kHosts; ++b) keys_[a][b] = keys_[b][a] = *RandomBytes(kPeerKeyBytes);
    }
    for (int h = 0; h < kHosts; ++h) {
      processes_.push_back(std::make_unique<HostProcess>(kSecret));
      auto server = HostServer::Start("127.0.0.1:0", kSecret, processes_.back().get());
      ASSERT_TRUE(server.ok()) << server.status();
      servers_.push_back(*std::move(server));
    }
    for (int h = 0; h < kHosts; ++h) {
      auto owner = HostChannel::Connect(servers_[h]->address(), HelloWith(h, 0, {h}), Options());
      ASSERT_TRUE(owner.ok()) << owner.status();
      owners_.push_back(*std::move(owner));
    }
    std::vector<std::thread> joins;
    std::vector<absl::Status> joined(kHosts);
    for (int h = 0; h < kHosts; ++h) {
      joins.emplace_back([this, h, &joined] {
        wire::Request request;
        wire::JoinCluster* join = request.mutable_join();
        for (int d = 0; d < kHosts; ++d) join->add_device_host(d);
        for (int g = 0; g < kHosts; ++g) join->add_host_addresses(servers_[g]->address());
        join->set_group_prefix(prefix_);
        for (const std::string& key : keys_[h]) join->add_peer_keys(key);
        joined[h] = owners_[h]->Call(std::move(request), int64_t{30} * 1'000'000'000).status();
      });
    }
    for (auto& t : joins) t.join();
    for (int h = 0; h < kHosts; ++h) ASSERT_TRUE(joined[h].ok()) << "host " << h << ": " << joined[h];
  }
  void TearDown() override {
    owners_.clear();
    servers_.clear();
    processes_.clear();
  }
  static wire::Request KvSet(std::string key, std::string value) {
    wire::Request request;
    request.mutable_kv_set()->set_key(std::move(key));
    request.mutable_kv_set()->set_value(std::move(value));
    return request;
  }
  static wire::Request KvGet(std::string key) {
    wire::Request request;
    request.mutable_kv_get()->set_key(std::move(key));
    return request;
  }
  // A session with host `at`'s store that proves it is host `as`, with `key`.
  absl::StatusOr<std::unique_ptr<HostChannel>> AsHost(int at, int as, std::string key) {
    ChannelOptions options = Options();
    options.secret = std::move(key);
    options.claim_host = as;
    return HostChannel::Connect(servers_[at]->address(), wire::Hello(), options);
  }
  std::string prefix_;
  std::vector<std::vector<std::string>> keys_;  // keys_[a][b]: the key of hosts a and b
  std::vector<std::unique_ptr<HostProcess>> processes_;
  std::vector<std::unique_ptr<HostServer>> servers_;
  std::vector<std::unique_ptr<HostChannel>> owners_;
};

// A session with only the cluster's secret (a client, or a host that claims
// no host identity) may neither move a host's rendezvous entry elsewhere nor
// read one, nor use the store for keys of no group of this cluster.
TEST_F(RendezvousScopeTest, ASessionWithTheClustersSecretCannotTouchTheHostsEntries) {
  auto session = HostChannel::Connect(servers_[0]->address(), wire::Hello(), Options());
  ASSERT_TRUE(session.ok()) << session.status();
  const int64_t timeout = int64_t{5} * 1'000'000'000;
  const std::string entry = absl::StrCat(prefix_, "/data/1");
  absl::Status set = (*session)->Call(KvSet(entry, "10.6.6.6:666"), timeout).status();
  EXPECT_EQ(set.code(), absl::StatusCode::kPermissionDenied) << set;
  absl::Status get = (*session)->Call(KvGet(entry), timeout).status();
  EXPECT_EQ(get.code(), absl::StatusCode::kPermissionDenied) << get;
  absl::Status gloo = (*session)->Call(KvSet(absl::StrCat(prefix_, "/hosts/0,1/rank_1"), "x"), timeout).status();
  EXPECT_EQ(gloo.code(), absl::StatusCode::kPermissionDenied) << gloo;
  absl::Status elsewhere = (*session)->Call(KvSet("some-other-cluster/data/0", "x"), timeout).status();
  EXPECT_EQ(elsewhere.code(), absl::StatusCode::kPermissionDenied) << elsewhere;
}

TEST_F(RendezvousScopeTest, AHostWritesOnlyItsOwnEntriesAndReadsOnlyItsGroups) {
  const int64_t timeout = int64_t{5} * 1'000'000'000;
  auto host1 = AsHost(0, 1, keys_[1][0]);
  ASSERT_TRUE(host1.ok()) << host1.status();
  auto call = [&](wire::Request r) { return (*host1)->Call(std::move(r), timeout).status(); };
  // Its own entries: its data plane address, its rank in a group with host 0.
  EXPECT_TRUE(call(KvSet(absl::StrCat(prefix_, "/data/1"), "127.0.0.1:1")).ok());
  EXPECT_TRUE(call(KvSet(absl::StrCat(prefix_, "/hosts/0,1/1"), "addr")).ok());
  EXPECT_TRUE(call(KvSet(absl::StrCat(prefix_, "/hosts/0,1/g2/1"), "addr")).ok());
  EXPECT_TRUE(call(KvGet(absl::StrCat(prefix_, "/data/0"))).ok());
  EXPECT_TRUE(call(KvGet(absl::StrCat(prefix_, "/hosts/0,1/1"))).ok());
  // Not host 0's, nor keys outside its scopes.
  for (const std::string& key : {absl::StrCat(prefix_, "/data/0"), absl::StrCat(prefix_, "/hosts/0,1/0"),
                                 absl::StrCat(prefix_, "/hosts/0,1/rank_0"),
                                 absl::StrCat(prefix_, "/hosts/0,1/other"), absl::StrCat(prefix_, "/elsewhere"),
                                 std::string("another-cluster/data/1")}) {
    const absl::Status set = call(KvSet(key, "10.6.6.6:666"));
    EXPECT_EQ(set.code(), absl::StatusCode::kPermissionDenied) << key << ": " << set;
  }
  EXPECT_EQ(call(KvSet(absl::StrCat(prefix_, "/data/1"), std::string((1 << 20) + 1, 'x'))).code(),
            absl::StatusCode::kPermissionDenied);
  // Host 0's entry is still its own.
  auto entry = (*host1)->Call(KvGet(absl::StrCat(prefix_, "/data/0")), timeout);
  ASSERT_TRUE(entry.ok()) << entry.status();
  EXPECT_NE(entry->kv_value().value(), "10.6.6.6:666");
  EXPECT_TRUE(absl::StartsWith(entry->kv_value().value(), "127.0.0.1:")) << entry->kv_value().value();
}

TEST_F(RendezvousScopeTest, AHostCannotProveItIsAnotherHost) {
  // Host 1's key for host 0 proves host 1 only; the cluster's secret proves
  // no host; an unknown host id is refused.
  auto as_other = AsHost(0, 1, "not host 1's key");
  EXPECT_EQ(as_other.status().code(), absl::StatusCode::kUnauthenticated) << as_other.status();
  auto secret_as_host = AsHost(0, 1, kSecret);
  EXPECT_EQ(secret_as_host.status().code(), absl::StatusCode::kUnauthenticated) << secret_as_host.status();
  auto unknown = AsHost(0, 7, keys_[1][0]);
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kUnauthenticated) << unknown.status();
  auto itself = AsHost(0, 0, keys_[1][0]);
  EXPECT_EQ(itself.status().code(), absl::StatusCode::kUnauthenticated) << itself.status();
}

TEST(RendezvousScope, KeysByWhoAsks) {
  const std::string p = "cluster-x";
  auto ok = [&](int self, int peer, const std::string& key, bool write) {
    return CheckRendezvousScope(p, 4, self, peer, key, write).ok();
  };
  // Data plane entries: the owner writes, every host reads.
  EXPECT_TRUE(ok(0, 2, "cluster-x/data/2", true));
  EXPECT_FALSE(ok(0, 2, "cluster-x/data/3", true));
  EXPECT_TRUE(ok(0, 2, "cluster-x/data/3", false));
  EXPECT_FALSE(ok(0, 2, "cluster-x/data/4", false));   // no host 4
  EXPECT_FALSE(ok(0, 2, "cluster-x/data/02", true));   // one spelling per host
  EXPECT_FALSE(ok(0, 2, "cluster-x/data/2/x", true));
  // Groups: members only, each writes its own rank, in the lowest's store.
  EXPECT_TRUE(ok(1, 3, "cluster-x/hosts/1,3/1", true));  // Gloo's key of rank 1
  EXPECT_TRUE(ok(1, 3, "cluster-x/hosts/1,3/rank_1", true));
  EXPECT_TRUE(ok(1, 3, "cluster-x/hosts/1,3/g7/1", true));
  EXPECT_FALSE(ok(1, 3, "cluster-x/hosts/1,3/0", true));
  EXPECT_FALSE(ok(1, 3, "cluster-x/hosts/1,3/rank_0", true));
  EXPECT_FALSE(ok(1, 3, "cluster-x/hosts/1,3/rank_2", true));
  EXPECT_FALSE(ok(1, 3, "cluster-x/hosts/1,3/anything", true));
  EXPECT_TRUE(ok(1, 3, "cluster-x/hosts/1,3/rank_0", false));
  EXPECT_FALSE(ok(1, 2, "cluster-x/hosts/1,3/rank_0", false));  // not a member
  EXPECT_FALSE(ok(0, 3, "cluster-x/hosts/1,3/rank_1", true));   // not host 1's store
  EXPECT_FALSE(ok(1, 3, "cluster-x/hosts/3,1/rank_0", true));   // not ascending
  EXPECT_FALSE(ok(1, 1, "cluster-x/hosts/1/rank_0", true));     // not a group
  EXPECT_FALSE(ok(1, 3, "cluster-x/hosts/1,3,9/rank_1", true)); // no host 9
  // Nothing for a session without a host identity, nor outside the prefix.
  EXPECT_FALSE(ok(0, -1, "cluster-x/data/0", false));
  EXPECT_FALSE(ok(0, 2, "cluster-y/data/2", true));
  EXPECT_FALSE(ok(0, 2, "cluster-x2/data/2", true));
  EXPECT_FALSE(ok(0, 2, "cluster-x", false));
  EXPECT_FALSE(CheckRendezvousScope("", 0, 0, 2, "x/data/2", true).ok());  // not joined
  const absl::Status why = CheckRendezvousScope(p, 4, 0, 2, "cluster-x/data/3", true);
  EXPECT_EQ(why.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(absl::StrContains(why.message(), "host 3's entry")) << why;
}

// A client session's group of a set of hosts meets under the set's key with
// "/s<session>" after the set (HostGroups::ForSet): the same rules hold.
TEST(RendezvousScope, ASessionsGroupMeetsUnderItsSet) {
  auto ok = [&](int self, int peer, const std::string& key, bool write) {
    return CheckRendezvousScope("cluster-x", 4, self, peer, key, write).ok();
  };
  EXPECT_TRUE(ok(1, 3, "cluster-x/hosts/1,3/s7/1", true));
  EXPECT_TRUE(ok(1, 3, "cluster-x/hosts/1,3/s7/rank_1", true));
  EXPECT_TRUE(ok(1, 3, "cluster-x/hosts/1,3/s7/g2/1", true));
  EXPECT_TRUE(ok(1, 3, "cluster-x/hosts/1,3/s7/rank_0", false));
  EXPECT_FALSE(ok(1, 3, "cluster-x/hosts/1,3/s7/0", true));    // rank 0 is host 1
  EXPECT_FALSE(ok(1, 2, "cluster-x/hosts/1,3/s7/0", false));   // not a member
  EXPECT_FALSE(ok(0, 3, "cluster-x/hosts/1,3/s7/1", true));    // not host 1's store
}

// ---- A service's tenants (issue 27) ----

// The same two joined hosts, driven by host 0's owner as a service drives
// its hosts: each program request names the tenant whose ids it uses
// (Request.session; 0: the owner's own).
class TenantSessionsTest : public RendezvousScopeTest {
 protected:
  static constexpr int64_t kTimeout = int64_t{10} * 1'000'000'000;
  // `request` in `session`, to host 0 from its owner (or from `channel`).
  absl::StatusOr<wire::Reply> Call(wire::Request request, SessionId session, HostChannel* channel = nullptr) {
    request.set_session(session);
    return (channel != nullptr ? channel : owners_[0].get())->Call(std::move(request), kTimeout);
  }
  static wire::Request Define(int list, int device) {
    wire::Request request;
    request.mutable_define_devices()->set_list_id(list);
    request.mutable_define_devices()->add_device_ids(device);
    return request;
  }
  // Buffer `id` on list `list` of one device, all of it in one chunk.
  static wire::Request Put(uint64_t id, int list, const std::string& data) {
    wire::Request request;
    wire::PutBuffer* put = request.mutable_put();
    put->set_buffer_id(id);
    put->set_devices(list);
    put->set_shard_bytes(static_cast<int64_t>(data.size()));
    put->set_data(data);
    return request;
  }
  static wire::Request Fetch(uint64_t id) {
    wire::Request request;
    request.mutable_fetch()->set_buffer_id(id);
    return request;
  }
  static wire::Request EndSession(std::string reason) {
    wire::Request request;
    request.mutable_end_session()->set_reason(std::move(reason));
    return request;
  }
  absl::StatusOr<std::string> FetchData(uint64_t id, SessionId session) {
    absl::StatusOr<wire::Reply> reply = Call(Fetch(id), session);
    if (!reply.ok()) return reply.status();
    return reply->fetch().data();
  }
};

// The owner's requests use the session they name: three sessions (the
// owner's own and two tenants') put buffer 5 on list 1, each its own, and
// each fetches its own; a session that made none finds none. Ending a
// tenant's session frees its buffer (the reply comes once it has), and its
// ids name nothing afterwards; the others' stay.
TEST_F(TenantSessionsTest, ProgramRequestsUseTheSessionTheyNameAndEndSessionDropsOne) {
  const std::vector<std::pair<SessionId, std::string>> sessions = {{0, "own!"}, {7, "ten7"}, {8, "ten8"}};
  for (const auto& [session, data] : sessions) {
    ASSERT_TRUE(Call(Define(1, 0), session).ok()) << session;
    ASSERT_TRUE(Call(Put(5, 1, data), session).ok()) << session;
  }
  for (const auto& [session, data] : sessions) {
    absl::StatusOr<std::string> got = FetchData(5, session);
    ASSERT_TRUE(got.ok()) << session << ": " << got.status();
    EXPECT_EQ(*got, data) << session;
  }
  EXPECT_EQ(FetchData(5, 9).status().code(), absl::StatusCode::kNotFound);
  ASSERT_NE(processes_[0]->executor(), nullptr);
  EXPECT_EQ(processes_[0]->executor()->num_buffers(), 3);

  ASSERT_TRUE(Call(EndSession("tenant 7 closed"), 7).ok());
  EXPECT_EQ(processes_[0]->executor()->num_buffers(), 2);
  EXPECT_EQ(FetchData(5, 7).status().code(), absl::StatusCode::kNotFound);
  for (SessionId session : {0, 8}) {
    absl::StatusOr<std::string> got = FetchData(5, session);
    ASSERT_TRUE(got.ok()) << session << ": " << got.status();
    EXPECT_EQ(*got, session == 0 ? "own!" : "ten8");
  }
  // A session that has ended loads nothing more.
  const absl::Status defined = Call(Define(2, 0), 7).status();
  EXPECT_EQ(defined.code(), absl::StatusCode::kFailedPrecondition) << defined;
}

// Only the owner may name sessions (as only it may run programs); the
// owner's own session ends with its stream, not with EndSession; and a
// service's own requests are no host's.
TEST_F(TenantSessionsTest, WhatAHostRefuses) {
  auto observer = HostChannel::Connect(servers_[0]->address(), wire::Hello(), Options());
  ASSERT_TRUE(observer.ok()) << observer.status();
  for (SessionId session : {0, 7}) {
    const absl::Status put = Call(Put(5, 1, "abcd"), session, observer->get()).status();
    EXPECT_EQ(put.code(), absl::StatusCode::kPermissionDenied) << session << ": " << put;
    const absl::Status ended = Call(EndSession("no"), session, observer->get()).status();
    EXPECT_EQ(ended.code(), absl::StatusCode::kPermissionDenied) << session << ": " << ended;
  }
  const absl::Status owners = Call(EndSession("the owner's own"), 0).status();
  EXPECT_EQ(owners.code(), absl::StatusCode::kInvalidArgument) << owners;
  EXPECT_TRUE(absl::StrContains(owners.message(), "session 0")) << owners;

  wire::Request forward;
  forward.mutable_forward()->set_host(0);
  *forward.mutable_forward()->mutable_request() = Fetch(5);
  wire::Request commit;
  commit.mutable_commit();  // a unit without a run
  wire::Request control;
  control.mutable_service_control()->set_stats(true);
  for (const wire::Request& request : {forward, commit, control}) {
    for (HostChannel* channel : {owners_[0].get(), observer->get()}) {
      const absl::Status status = Call(request, 0, channel).status();
      EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
      EXPECT_TRUE(absl::StrContains(status.message(), "is for a service (pathways-server), not a host")) << status;
    }
  }
  // The owner's session still works.
  ASSERT_TRUE(Call(Define(1, 0), 0).ok());
  ASSERT_TRUE(Call(Put(5, 1, "abcd"), 0).ok());
  absl::StatusOr<std::string> got = FetchData(5, 0);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "abcd");
}

// A service's tenant opens a session of its own with a host, proving the
// key the owner gave for it (wire::TenantKey): that session puts and fetches
// the tenant's buffers, and nothing else. Without the key, with another
// tenant's, or once the tenant has ended, the session is refused.
TEST_F(TenantSessionsTest, ATenantsOwnSessionMovesItsDataOnly) {
  const std::string key(kPeerKeyBytes, 'k');
  auto tenant_session = [&](uint64_t tenant, const std::string& secret) {
    ChannelOptions options = Options();
    options.secret = secret;
    options.claim_tenant = tenant;
    options.connect_timeout_ns = 2'000'000'000;
    return HostChannel::Connect(servers_[0]->address(), wire::Hello(), options);
  };
  EXPECT_EQ(tenant_session(7, key).status().code(), absl::StatusCode::kUnauthenticated);  // no key yet
  wire::Request give;
  give.mutable_tenant_key()->set_key(key);
  ASSERT_TRUE(Call(give, 7).ok());
  wire::Request short_key;
  short_key.mutable_tenant_key()->set_key("short");
  EXPECT_EQ(Call(short_key, 8).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(tenant_session(7, std::string(kPeerKeyBytes, 'x')).status().code(),
            absl::StatusCode::kUnauthenticated);                                     // a wrong key
  EXPECT_EQ(tenant_session(8, key).status().code(), absl::StatusCode::kUnauthenticated);  // another tenant's claim
  auto own = tenant_session(7, key);
  ASSERT_TRUE(own.ok()) << own.status();
  // The owner defines the list in the tenant's session; the tenant puts and
  // fetches there, which the owner's requests for the tenant see.
  ASSERT_TRUE(Call(Define(1, 0), 7).ok());
  ASSERT_TRUE(Call(Put(5, 1, "mine"), /*session: the claim's*/ 99, own->get()).ok());
  absl::StatusOr<std::string> got = FetchData(5, 7);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "mine");
  absl::StatusOr<wire::Reply> fetched = Call(Fetch(5), 0, own->get());
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_EQ(fetched->fetch().data(), "mine");
  EXPECT_EQ(FetchData(5, 0).status().code(), absl::StatusCode::kNotFound);  // the owner's own has none
  // Nothing else: no loads, runs, frees or session ends of its own.
  for (const wire::Request& request : {Define(2, 0), EndSession("mine")}) {
    const absl::Status status = Call(request, 7, own->get()).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied) << status;
  }
  // Once the tenant has ended, its key is gone: no new session, and the
  // open one moves nothing more.
  ASSERT_TRUE(Call(EndSession("gone"), 7).ok());
  EXPECT_EQ(tenant_session(7, key).status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(Call(Fetch(5), 0, own->get()).status().code(), absl::StatusCode::kPermissionDenied);
}

TEST_F(HostProcessTest, HeartbeatsOnTheirOwnPathCarryTheIncarnation) {
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
  auto delays = HostProcess::ParseTestDelays("load_function=2.5, put=0.25");
  ASSERT_TRUE(delays.ok()) << delays.status();
  EXPECT_EQ(delays->load_function_ns, 2'500'000'000);
  EXPECT_EQ(delays->put_ns, 250'000'000);
  delays = HostProcess::ParseTestDelays("put=1");
  ASSERT_TRUE(delays.ok());
  EXPECT_EQ(delays->load_function_ns, 0);
  EXPECT_TRUE(HostProcess::ParseTestDelays("").ok());
  for (const char* bad : {"compile=1", "put", "put=-1", "put=x", "put=7200"}) {
    EXPECT_EQ(HostProcess::ParseTestDelays(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(ParseHostArgs, FlagsAndErrors) {
  auto options = ParseHostArgs({"--listen=0.0.0.0:7000", "--secret-stdin", "--stay", "--configure-timeout=2.5"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->listen, "0.0.0.0:7000");
  EXPECT_TRUE(options->secret_from_stdin);
  EXPECT_TRUE(options->stay);
  EXPECT_EQ(options->configure_timeout_ns, 2'500'000'000);
  EXPECT_FALSE(options->sealed_secret_from_stdin);
  auto sealed = ParseHostArgs({"--sealed-secret-stdin"});
  ASSERT_TRUE(sealed.ok()) << sealed.status();
  EXPECT_TRUE(sealed->sealed_secret_from_stdin);
  EXPECT_EQ(ParseHostArgs({"--secret-stdin", "--sealed-secret-stdin"}).status().code(),
            absl::StatusCode::kInvalidArgument);
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
