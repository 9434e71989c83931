// The control plane over loopback: sessions, the secret, batching, replies
// in order and out of order, and the loss of a host.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "csrc/base/error_kind.h"
#include "csrc/base/spin.h"
#include "csrc/coordination/control.grpc.pb.h"
#include "csrc/coordination/frame_queue.h"
#include "csrc/coordination/grpc_options.h"
#include "csrc/coordination/host_channel.h"
#include "csrc/coordination/host_server.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace pw {
namespace {

constexpr char kSecret[] = "s3cret-for-tests";

wire::Request PutOf(int64_t bytes) {
  wire::Request request;
  request.mutable_put()->set_data(std::string(static_cast<size_t>(bytes), 'x'));
  return request;
}

TEST(FrameQueueTest, BatchesSmallMessagesAndStartsAFrameAtTheLimit) {
  using Queue = FrameQueue<wire::ClientFrame, wire::Request, &wire::ClientFrame::add_requests>;
  constexpr int64_t kMiB = int64_t{1} << 20;
  Queue queue;
  wire::ClientFrame frame;
  EXPECT_TRUE(queue.empty());
  EXPECT_FALSE(queue.Pop(&frame));
  for (int i = 0; i < 100; ++i) queue.Push(PutOf(10));
  ASSERT_TRUE(queue.Pop(&frame));
  EXPECT_EQ(frame.requests_size(), 100);
  EXPECT_FALSE(queue.Pop(&frame));
  // 40 MiB each: two never share a frame of at most 64 MiB; a message
  // larger than the limit goes alone; small ones join the frame before.
  queue.Push(PutOf(40 * kMiB));
  queue.Push(PutOf(10));
  queue.Push(PutOf(40 * kMiB));
  queue.Push(PutOf(Queue::kMaxFrameBytes + 1));
  queue.Push(PutOf(10));
  std::vector<int> sizes;
  while (queue.Pop(&frame)) {
    sizes.push_back(frame.requests_size());
    EXPECT_TRUE(frame.requests_size() == 1 || frame.ByteSizeLong() <= static_cast<size_t>(Queue::kMaxFrameBytes));
  }
  EXPECT_EQ(sizes, (std::vector<int>{2, 1, 1, 1}));
  EXPECT_TRUE(queue.empty());
}

// Answers Hello, Ping, Echo and heartbeats at once; with `stalled`, answers
// nothing but the Hello (a host whose process hangs: its heartbeats wait up
// to 2 s); with `busy_ns`, takes that long over each Echo on the session's
// gRPC thread (a host busy with a slow compile or a large put).
class EchoHandler final : public RequestHandler {
 public:
  void Heartbeat(const wire::Ping& ping, wire::Pong* pong) override {
    const int64_t until = NowNanos() + 2'000'000'000;
    while (stalled.load() && NowNanos() < until) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    pong->set_sent_ns(ping.sent_ns());
    pong->set_incarnation(42);
  }
  void Handle(const std::shared_ptr<HostSession>& session, wire::Request request) override {
    handled.fetch_add(1);
    if (request.kind_case() == wire::Request::kEcho && busy_ns.load() > 0) {
      std::this_thread::sleep_for(std::chrono::nanoseconds(busy_ns.load()));
    }
    if (request.id() == 0) return;
    wire::Reply reply;
    reply.set_id(request.id());
    switch (request.kind_case()) {
      case wire::Request::kHello:
        reply.mutable_hello()->set_incarnation(42);
        reply.mutable_hello()->set_pid(getpid());
        break;
      case wire::Request::kPing:
        if (stalled.load()) return;
        reply.mutable_pong()->set_sent_ns(request.ping().sent_ns());
        break;
      case wire::Request::kEcho:
        if (stalled.load()) return;
        if (request.echo().payload() == "fail") {
          ToWire(absl::InvalidArgumentError("asked to fail"), reply.mutable_status());
        } else {
          *reply.mutable_echo() = request.echo();
        }
        break;
      default:
        ToWire(absl::UnimplementedError("unknown request"), reply.mutable_status());
    }
    session->Reply(std::move(reply));
  }
  void OnSessionEnd(const std::shared_ptr<HostSession>& session) override {
    EXPECT_FALSE(session->open());
    ended.fetch_add(1);
  }
  std::atomic<int> handled{0}, ended{0};
  std::atomic<bool> stalled{false};
  std::atomic<int64_t> busy_ns{0};
};

ChannelOptions Options(std::string secret = kSecret) {
  ChannelOptions options;
  options.secret = std::move(secret);
  options.host_name = "host 0";
  options.connect_timeout_ns = 5'000'000'000;
  options.heartbeat_period_ns = 0;
  return options;
}

wire::Request EchoRequest(std::string payload) {
  wire::Request r;
  r.mutable_echo()->set_payload(std::move(payload));
  return r;
}

// Waits up to 10 s for `done`.
template <typename F>
bool Eventually(F done) {
  const int64_t deadline = NowNanos() + 10'000'000'000;
  while (!done()) {
    if (NowNanos() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

class ControlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = HostServer::Start("127.0.0.1:0", kSecret, &handler_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }
  std::unique_ptr<HostChannel> Connect(ChannelOptions options = Options()) {
    auto channel = HostChannel::Connect(server_->address(), wire::Hello(), options);
    EXPECT_TRUE(channel.ok()) << channel.status();
    return channel.ok() ? *std::move(channel) : nullptr;
  }
  EchoHandler handler_;
  std::unique_ptr<HostServer> server_;
};

TEST_F(ControlTest, HelloAndEchoRoundTrip) {
  EXPECT_GT(server_->port(), 0);
  auto channel = Connect();
  ASSERT_NE(channel, nullptr);
  EXPECT_EQ(channel->hello_reply().incarnation(), 42u);
  auto reply = channel->Call(EchoRequest("abc"), 5'000'000'000);
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->echo().payload(), "abc");
  // The host's error comes back as the call's error, with its code.
  auto failed = channel->Call(EchoRequest("fail"), 5'000'000'000);
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(failed.status().message(), "asked to fail");
  EXPECT_TRUE(channel->alive());
  EXPECT_EQ(server_->open_sessions(), 1);
}

TEST_F(ControlTest, WrongOrMissingSecretIsRefusedAndTheHostKeepsServing) {
  for (const std::string secret : {"wrong", "s3cret-for-test", "s3cret-for-testsX", ""}) {
    auto channel = HostChannel::Connect(server_->address(), wire::Hello(), Options(secret));
    ASSERT_FALSE(channel.ok()) << secret;
    EXPECT_EQ(channel.status().code(), absl::StatusCode::kUnauthenticated) << channel.status();
    EXPECT_NE(channel.status().message().find("host 0 refused the session"), std::string::npos)
        << channel.status();
  }
  EXPECT_EQ(server_->refused_sessions(), 4);
  EXPECT_EQ(handler_.handled.load(), 0);  // nothing reached the handler
  auto good = Connect();
  ASSERT_NE(good, nullptr);
  EXPECT_TRUE(good->Call(EchoRequest("still here"), 5'000'000'000).ok());
}

TEST_F(ControlTest, GarbageOnThePortIsDroppedAndTheHostKeepsServing) {
  for (const std::string& garbage :
       {std::string("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), std::string(4096, '\xff'),
        std::string("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n") + std::string(100, '\x00')}) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(server_->port()));
    inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    ASSERT_EQ(write(fd, garbage.data(), garbage.size()), static_cast<ssize_t>(garbage.size()));
    // The host closes the connection (read returns 0 or an error), or we
    // give up reading after a while; either way it must keep serving.
    timeval tv{2, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    char buf[256];
    while (read(fd, buf, sizeof(buf)) > 0) {
    }
    close(fd);
  }
  EXPECT_EQ(handler_.handled.load(), 0);
  auto good = Connect();
  ASSERT_NE(good, nullptr);
  EXPECT_TRUE(good->Call(EchoRequest("still here"), 5'000'000'000).ok());
}

TEST_F(ControlTest, RequestsQueuedTogetherLeaveInOneFrame) {
  auto channel = Connect();
  ASSERT_NE(channel, nullptr);
  const int64_t frames_before = channel->frames_sent();
  constexpr int kRequests = 100;
  std::atomic<int> answered{0};
  std::vector<std::string> got(kRequests);
  for (int i = 0; i < kRequests; ++i) {
    channel->Send(EchoRequest(absl::StrCat(i)), [&, i](absl::StatusOr<wire::Reply> reply) {
      ASSERT_TRUE(reply.ok()) << reply.status();
      got[i] = reply->echo().payload();
      answered.fetch_add(1);
    });
  }
  channel->Send(EchoRequest("no reply wanted"), nullptr);
  channel->Flush();
  ASSERT_TRUE(Eventually([&] { return answered.load() == kRequests; }));
  for (int i = 0; i < kRequests; ++i) EXPECT_EQ(got[i], absl::StrCat(i));
  EXPECT_EQ(channel->frames_sent(), frames_before + 1);
  ASSERT_TRUE(Eventually([&] { return handler_.handled.load() == 1 + kRequests + 1; }));
}

TEST_F(ControlTest, ManyThreadsCallAtOnce) {
  auto channel = Connect();
  ASSERT_NE(channel, nullptr);
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        const std::string payload = absl::StrCat(t, ":", i);
        auto reply = channel->Call(EchoRequest(payload), 10'000'000'000);
        if (reply.ok() && reply->echo().payload() == payload) ok.fetch_add(1);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 800);
}

TEST_F(ControlTest, ALostHostFailsWaitingAndLaterRequests) {
  std::atomic<int> reported{0};
  absl::Status reported_status;
  ChannelOptions options = Options();
  options.on_lost = [&](const absl::Status& s) {
    reported_status = s;
    reported.fetch_add(1);
  };
  auto channel = Connect(options);
  ASSERT_NE(channel, nullptr);
  handler_.stalled = true;  // requests stay unanswered...
  std::atomic<int> failed{0};
  absl::Status seen;
  for (int i = 0; i < 3; ++i) {
    channel->Send(EchoRequest("x"), [&](absl::StatusOr<wire::Reply> reply) {
      if (!reply.ok()) {
        seen = reply.status();
        failed.fetch_add(1);
      }
    });
  }
  channel->Flush();
  ASSERT_TRUE(Eventually([&] { return handler_.handled.load() == 4; }));
  server_.reset();  // ...until the host goes away
  ASSERT_TRUE(Eventually([&] { return failed.load() == 3; }));
  EXPECT_EQ(seen.code(), absl::StatusCode::kUnavailable) << seen;
  EXPECT_EQ(GetErrorKind(seen), ErrorKind::kHostLost);
  EXPECT_NE(seen.message().find("host 0 was lost"), std::string::npos) << seen;
  ASSERT_TRUE(Eventually([&] { return reported.load() == 1; }));
  EXPECT_EQ(reported_status, seen);
  EXPECT_FALSE(channel->alive());
  EXPECT_EQ(channel->status().code(), absl::StatusCode::kUnavailable);
  // Later requests fail at once, on the caller's thread.
  bool called = false;
  channel->Send(EchoRequest("y"), [&](absl::StatusOr<wire::Reply> reply) {
    EXPECT_EQ(reply.status().code(), absl::StatusCode::kUnavailable);
    called = true;
  });
  EXPECT_TRUE(called);
  EXPECT_EQ(channel->Call(EchoRequest("z"), 1'000'000'000).status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(ControlTest, AHostThatStopsAnsweringHeartbeatsIsLost) {
  ChannelOptions options = Options();
  options.heartbeat_period_ns = 20'000'000;
  options.heartbeat_timeout_ns = 200'000'000;
  auto channel = Connect(options);
  ASSERT_NE(channel, nullptr);
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  EXPECT_TRUE(channel->alive()) << channel->status();  // heartbeats answered
  handler_.stalled = true;
  const int64_t start = NowNanos();
  ASSERT_TRUE(Eventually([&] { return !channel->alive(); }));
  EXPECT_LT(NowNanos() - start, 5'000'000'000);
  EXPECT_EQ(channel->status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(GetErrorKind(channel->status()), ErrorKind::kHostLost);
  EXPECT_NE(channel->status().message().find("no sign of life"), std::string::npos) << channel->status();
  // The host hears that the session ended.
  ASSERT_TRUE(Eventually([&] { return handler_.ended.load() == 1; }));
  handler_.stalled = false;
}

TEST_F(ControlTest, HeartbeatsWithoutTheSecretAreRefused) {
  auto grpc_channel = grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());
  auto stub = wire::Host::NewStub(grpc_channel);
  for (const char* secret : {"", "not-the-secret"}) {
    grpc::ClientContext context;
    if (*secret != '\0') context.AddMetadata(kSecretMetadataKey, secret);
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    wire::Pong pong;
    const grpc::Status status = stub->Heartbeat(&context, wire::Ping(), &pong);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED) << secret;
  }
  EXPECT_EQ(server_->heartbeats(), 0);
}

TEST_F(ControlTest, HeartbeatsGoOnTheirOwnPathAndAnswerWhileTheHostIsBusy) {
  // The host takes 1.5 s over each of three requests on the session's
  // thread, and 1 MiB frames queue behind them: heartbeats on the session's
  // stream would wait 4.5 s. On their own path they are answered all along,
  // so a 400 ms timeout never fires.
  ChannelOptions options = Options();
  options.heartbeat_period_ns = 20'000'000;
  options.heartbeat_timeout_ns = 400'000'000;
  options.on_lost = [](const absl::Status& s) { ADD_FAILURE() << "a busy host is not lost: " << s; };
  auto channel = Connect(options);
  ASSERT_NE(channel, nullptr);
  handler_.busy_ns = 1'500'000'000;
  std::atomic<int> replies{0};
  for (int i = 0; i < 3; ++i) {
    channel->Send(EchoRequest(std::string(1 << 20, 'x')), [&](absl::StatusOr<wire::Reply> reply) {
      EXPECT_TRUE(reply.ok()) << reply.status();
      replies.fetch_add(1);
    });
    channel->Flush();
  }
  const int64_t heartbeats_before = server_->heartbeats();
  const int64_t deadline = NowNanos() + 60'000'000'000;  // 4.5 s of work, slow under sanitizers
  while (replies.load() < 3 && NowNanos() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_EQ(replies.load(), 3);
  EXPECT_TRUE(channel->alive()) << channel->status();
  // About one heartbeat per period went through meanwhile.
  EXPECT_GT(server_->heartbeats() - heartbeats_before, 20);
  EXPECT_GT(channel->heartbeats_answered(), 20);
  handler_.busy_ns = 0;
}

TEST_F(ControlTest, ClosingTheChannelEndsTheSessionAndCancelsWaiters) {
  ChannelOptions options = Options();
  options.on_lost = [](const absl::Status& s) { ADD_FAILURE() << "closing is not a loss: " << s; };
  auto channel = Connect(options);
  ASSERT_NE(channel, nullptr);
  handler_.stalled = true;
  absl::Status seen;
  channel->Send(EchoRequest("x"), [&](absl::StatusOr<wire::Reply> reply) { seen = reply.status(); });
  channel->Flush();
  ASSERT_TRUE(Eventually([&] { return handler_.handled.load() == 2; }));
  channel.reset();
  EXPECT_EQ(seen.code(), absl::StatusCode::kCancelled) << seen;
  ASSERT_TRUE(Eventually([&] { return handler_.ended.load() == 1 && server_->open_sessions() == 0; }));
}

TEST_F(ControlTest, NoHostAtTheAddress) {
  const std::string address = server_->address();
  server_.reset();
  ChannelOptions options = Options();
  options.connect_timeout_ns = 300'000'000;
  auto channel = HostChannel::Connect(address, wire::Hello(), options);
  EXPECT_EQ(channel.status().code(), absl::StatusCode::kUnavailable) << channel.status();
}

TEST(HostServer, RefusesAnEmptySecretAndABadAddress) {
  EchoHandler handler;
  EXPECT_EQ(HostServer::Start("127.0.0.1:0", "", &handler).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(HostServer::Start("127.0.0.1", kSecret, &handler).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(HostServer::Start("256.1.1.1:0", kSecret, &handler).status().code(), absl::StatusCode::kUnavailable);
}

TEST(WireStatus, RoundTripsAndNeverTurnsAnUnknownCodeIntoOk) {
  wire::Status w;
  ToWire(absl::NotFoundError("gone"), &w);
  EXPECT_EQ(FromWire(w), absl::NotFoundError("gone"));
  ToWire(absl::OkStatus(), &w);
  EXPECT_TRUE(FromWire(w).ok());
  w.set_code(999);
  EXPECT_EQ(FromWire(w).code(), absl::StatusCode::kUnknown);
  w.set_code(-3);
  EXPECT_EQ(FromWire(w).code(), absl::StatusCode::kUnknown);
}

}  // namespace
}  // namespace pw
