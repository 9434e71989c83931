// A host's rendezvous stores: sessions with other hosts' stores (served by
// their HostProcess over loopback), opened anew when they break, and given
// up at once when the client says a host was lost.

#include "csrc/host/peer_stores.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <future>
#include <thread>

#include "absl/strings/str_cat.h"
#include "csrc/base/error_kind.h"
#include "csrc/base/spin.h"
#include "csrc/coordination/host_server.h"
#include "csrc/host/host_process.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pw {
namespace {

using ::testing::HasSubstr;

constexpr char kSecret[] = "peer-stores-test";

// The key hosts a and b share (auth.h's peer keys): one per pair.
std::string PairKey(int a, int b) { return absl::StrCat("peer key of hosts ", std::min(a, b), ",", std::max(a, b)); }

// Host 0's rendezvous store, served as a HostProcess serves it but without
// its scopes: a session must prove a host identity with that host's peer
// key, which host 0 knows only once it "joined" (FailedPrecondition before).
class StoreHost final : public RequestHandler {
 public:
  void Handle(const std::shared_ptr<HostSession>& session, wire::Request request) override {
    wire::Reply reply;
    reply.set_id(request.id());
    if (session->peer_host() < 0) {
      ToWire(absl::PermissionDeniedError("not a host's session"), reply.mutable_status());
    } else if (request.has_kv_set()) {
      last_peer.store(session->peer_host());
      ToWire(store.Set(request.kv_set().key(), request.kv_set().value()), reply.mutable_status());
    } else if (request.has_kv_get()) {
      last_peer.store(session->peer_host());
      absl::StatusOr<std::string> value = store.Get(request.kv_get().key(), absl::Now());
      if (value.ok()) {
        reply.mutable_kv_value()->set_value(*std::move(value));
      } else {
        ToWire(absl::NotFoundError("not yet"), reply.mutable_status());  // as HostProcess::KvGet
      }
    }
    if (request.id() != 0) session->Reply(std::move(reply));
  }
  absl::StatusOr<std::string> PeerKey(int host) override {
    if (!joined.load()) return absl::FailedPreconditionError("host 0 has not joined yet");
    if (host <= 0 || host > 2) return absl::PermissionDeniedError(absl::StrCat("no host ", host));
    return PairKey(0, host);
  }
  InMemoryKeyValueStore store;
  std::atomic<bool> joined{true};
  std::atomic<int> last_peer{-2};
};

// An address where nothing listens, and nothing can while it lives: a
// loopback port bound and never listened on (connections to it are refused),
// so no server of a test running beside this one takes it meanwhile (a port
// bound a moment ago and closed could be, and then it answered for host 2).
class DeadAddress {
 public:
  DeadAddress() : fd_(socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    if (fd_ >= 0 && bind(fd_, reinterpret_cast<sockaddr*>(&addr), len) == 0 &&
        getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      address_ = absl::StrCat("127.0.0.1:", ntohs(addr.sin_port));
    }
  }
  ~DeadAddress() {
    if (fd_ >= 0) close(fd_);
  }
  DeadAddress(const DeadAddress&) = delete;
  DeadAddress& operator=(const DeadAddress&) = delete;
  const std::string& address() const { return address_; }

 private:
  const int fd_;
  std::string address_ = "127.0.0.1:1";
};

class PeerStoresTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = HostServer::Start("127.0.0.1:0", kSecret, &host0_);
    ASSERT_TRUE(server.ok()) << server.status();
    server0_ = *std::move(server);
  }
  // Host 0 serves its store; this is host `self` of three, with its row of
  // peer keys (`wrong_keys`: keys host 0 does not share with it).
  std::unique_ptr<PeerStores> Stores(int self, bool wrong_keys = false) {
    std::vector<std::string> keys(3);
    for (int h = 0; h < 3; ++h) {
      if (h != self) keys[h] = wrong_keys ? "not our key" : PairKey(self, h);
    }
    return std::make_unique<PeerStores>(
        self, &own_, std::vector<std::string>{server0_->address(), dead_.address(), dead_.address()}, keys);
  }
  StoreHost host0_;
  std::unique_ptr<HostServer> server0_;
  InMemoryKeyValueStore own_;
  const DeadAddress dead_;
};

// A session with another host's store proves this host's identity with the
// key the two share; one without that key is refused.
TEST_F(PeerStoresTest, ASessionProvesThisHostsIdentityWithItsPeerKey) {
  auto stores = Stores(2);
  ASSERT_TRUE((*stores->StoreOf(0))->Set("k", "v").ok());
  EXPECT_EQ(host0_.last_peer.load(), 2);
  auto impostor = Stores(1, /*wrong_keys=*/true);
  const absl::Status refused = (*impostor->StoreOf(0))->Set("k", "w");
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnauthenticated) << refused;
  EXPECT_EQ(host0_.last_peer.load(), 2);
}

// The other host refuses our key until it has joined the cluster
// (FailedPrecondition): the session is tried again meanwhile.
TEST_F(PeerStoresTest, ASessionWaitsForTheOtherHostToJoin) {
  host0_.joined = false;
  auto stores = Stores(1);
  auto setting = std::async(std::launch::async, [&] { return (*stores->StoreOf(0))->Set("k", "v"); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_GT(server0_->refused_sessions(), 0);
  host0_.joined = true;
  const absl::Status status = setting.get();
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_EQ(stores->sessions_opened(0), 1);
  EXPECT_EQ(host0_.last_peer.load(), 1);
}

TEST_F(PeerStoresTest, ASessionThatBrokeIsOpenedAnewAtTheNextUse) {
  auto stores = Stores(1);
  KeyValueStore* store0 = *stores->StoreOf(0);
  EXPECT_EQ(*stores->StoreOf(1), &own_);
  EXPECT_EQ(stores->sessions_opened(0), 0);  // none before its first use
  ASSERT_TRUE(store0->Set("k", "v").ok());
  EXPECT_EQ(stores->sessions_opened(0), 1);
  // Host 0's server restarts at the same address (its store, in its
  // handler, stays): the session broke, but host 0 is not lost.
  const std::string address = server0_->address();
  server0_.reset();
  auto server = HostServer::Start(address, kSecret, &host0_);
  ASSERT_TRUE(server.ok()) << server.status();
  server0_ = *std::move(server);
  auto value = store0->Get("k", absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "v");
  EXPECT_EQ(stores->sessions_opened(0), 2);
}

TEST_F(PeerStoresTest, ARendezvousWithALostMemberGivesUpAtOnce) {
  for (int self : {0, 1}) {  // the group's store: this host's own, or host 0's through a session
    SCOPED_TRACE(self);
    auto stores = Stores(self);
    auto store = stores->GroupStore({0, 1, 2});
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->Set("here", "1").ok());
    const int64_t start = NowNanos();
    auto waiting = std::async(std::launch::async, [&] {
      return (*store)->Get("host 2's address", absl::Now() + absl::Seconds(30)).status();
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    stores->Lose(2, "it stopped answering");
    const absl::Status status = waiting.get();
    EXPECT_LT(NowNanos() - start, 5'000'000'000);
    EXPECT_EQ(GetErrorKind(status), ErrorKind::kHostLost) << status;
    EXPECT_THAT(status.message(), HasSubstr("host 2"));
    EXPECT_EQ(GetErrorKind(stores->Lost(2)), ErrorKind::kHostLost);
    EXPECT_TRUE(stores->Lost(0).ok());
    // A new rendezvous with it fails at once; one without it still works.
    auto again = stores->GroupStore({0, 2});
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(GetErrorKind((*again)->Set("x", "y")), ErrorKind::kHostLost);
    auto without = stores->GroupStore({0, 1});
    ASSERT_TRUE(without.ok());
    EXPECT_TRUE((*without)->Get("here", absl::Now() + absl::Seconds(5)).ok());
  }
}

TEST_F(PeerStoresTest, ALostHostsSessionEndsAndAConnectionAttemptGivesUp) {
  auto stores = Stores(1);
  // Host 2 is not there: connecting to it would take its 10 s timeout.
  const int64_t start = NowNanos();
  auto connecting = std::async(std::launch::async, [&] { return (*stores->StoreOf(2))->Set("k", "v"); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  stores->Lose(2, "it died");
  absl::Status status = connecting.get();
  EXPECT_LT(NowNanos() - start, 5'000'000'000);
  EXPECT_EQ(GetErrorKind(status), ErrorKind::kHostLost) << status;
  EXPECT_THAT(status.message(), HasSubstr("host 2 was lost: it died"));
  // A Get polling host 0's store for a key that never comes ends at once.
  KeyValueStore* store0 = *stores->StoreOf(0);
  auto polling = std::async(std::launch::async, [&] {
    return store0->Get("never", absl::Now() + absl::Seconds(30)).status();
  });
  // Lost once the Get polls through its session (not after a guess at how
  // long opening one takes: under TSan on a loaded machine, over 100 ms).
  const int64_t open_by = NowNanos() + 10'000'000'000;
  while (stores->sessions_opened(0) == 0 && NowNanos() < open_by) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(stores->sessions_opened(0), 1);
  stores->Lose(0, "its stream ended");
  status = polling.get();
  EXPECT_EQ(GetErrorKind(status), ErrorKind::kHostLost) << status;
  // Every later use fails at once, and no session is opened again.
  EXPECT_EQ(GetErrorKind(store0->Set("k", "v")), ErrorKind::kHostLost);
  EXPECT_EQ(stores->sessions_opened(0), 1);
  stores->Lose(0, "again");  // idempotent; this host and unknown hosts are ignored
  stores->Lose(1, "self");
  stores->Lose(9, "unknown");
  EXPECT_TRUE(stores->Lost(1).ok());
}

}  // namespace
}  // namespace pw
