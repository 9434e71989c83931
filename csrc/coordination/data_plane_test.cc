#include "csrc/coordination/data_plane.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "csrc/coordination/auth.h"
#include "csrc/coordination/tap_proxy_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pw {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// Every wait in these tests is bounded by this (a hang is a failure, not a
// stuck test binary).
constexpr auto kWait = std::chrono::seconds(10);

#define ASSERT_OK(expr)                          \
  do {                                           \
    const absl::Status pw_s = (expr);            \
    ASSERT_TRUE(pw_s.ok()) << #expr << ": " << pw_s; \
  } while (0)

DataPlane::Options TestOptions() {
  DataPlane::Options options;
  options.secret = "s3cret of the test cluster";
  options.connect_timeout = absl::Seconds(10);
  options.handshake_timeout = absl::Seconds(2);
  return options;
}

iovec Piece(const void* data, size_t size) { return iovec{const_cast<void*>(data), size}; }

absl::Status SendString(DataPlane& plane, int peer, const std::string& bytes, uint8_t flag = 0) {
  const iovec piece = Piece(bytes.data(), bytes.size());
  return plane.Send(peer, {&piece, 1}, flag);
}

// Receives a message of exactly `size` bytes into *out.
absl::StatusOr<uint8_t> RecvString(DataPlane& plane, int peer, size_t size, std::string* out) {
  out->assign(size, '\0');
  const iovec piece = Piece(out->data(), size);
  return plane.Recv(peer, {&piece, 1});
}

// Bytes that depend on every coordinate, so a misplaced or mixed-up byte
// shows.
std::string Pattern(size_t size, uint32_t seed) {
  std::string bytes(size, '\0');
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < size; ++i) {
    x = x * 1103515245u + 12345u;
    bytes[i] = static_cast<char>(x >> 24);
  }
  return bytes;
}

// A cluster of planes as threads of this process, plus the threads a test
// runs against it. The destructor shuts every plane down first (which
// unblocks whatever a failed test left blocked) and then joins the threads.
class Cluster {
 public:
  ~Cluster() {
    for (auto& plane : planes) {
      if (plane != nullptr) plane->Shutdown();
    }
    for (auto& thread : threads_) thread.join();
  }

  // Listens `n` planes (with `options`), without connecting them.
  absl::Status Listen(int n, const DataPlane::Options& options = TestOptions()) {
    for (int h = 0; h < n; ++h) {
      absl::StatusOr<std::unique_ptr<DataPlane>> plane = DataPlane::Listen(h, n, options);
      if (!plane.ok()) return plane.status();
      planes.push_back(*std::move(plane));
    }
    return absl::OkStatus();
  }

  std::vector<std::string> Addresses() const {
    std::vector<std::string> addresses;
    for (const auto& plane : planes) addresses.push_back(plane->address());
    return addresses;
  }

  // Connects the given planes (all by default) at once; the first error.
  absl::Status Connect(std::vector<int> hosts = {}) {
    if (hosts.empty()) {
      for (size_t h = 0; h < planes.size(); ++h) hosts.push_back(static_cast<int>(h));
    }
    std::vector<std::future<absl::Status>> connects;
    for (int h : hosts) connects.push_back(Async([this, h] { return planes[h]->Connect(Addresses()); }));
    absl::Status first;
    for (auto& c : connects) {
      if (c.wait_for(kWait) != std::future_status::ready) return absl::DeadlineExceededError("Connect hangs");
      first.Update(c.get());
    }
    return first;
  }

  absl::Status Start(int n, const DataPlane::Options& options = TestOptions()) {
    if (absl::Status s = Listen(n, options); !s.ok()) return s;
    return Connect();
  }

  // Runs fn on a new thread (joined by the destructor); its result.
  template <typename Fn>
  auto Async(Fn fn) -> std::future<decltype(fn())> {
    auto task = std::make_shared<std::packaged_task<decltype(fn())()>>(std::move(fn));
    auto result = task->get_future();
    threads_.emplace_back([task] { (*task)(); });
    return result;
  }

  DataPlane& operator[](int h) { return *planes[h]; }

  std::vector<std::unique_ptr<DataPlane>> planes;

 private:
  std::vector<std::thread> threads_;
};

template <typename T>
T Get(std::future<T>& future) {
  if (future.wait_for(kWait) != std::future_status::ready) {
    ADD_FAILURE() << "a call did not return within " << kWait.count() << " s";
    std::abort();  // the destructor's join would hang otherwise
  }
  return future.get();
}

// ---------------------------------------------------------------------------
// Raw sockets that speak (or fail to speak) the wire format of data_plane.h.

void Put32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}
void Put64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}

std::string Hello(uint32_t host_id, const std::string& nonce, uint32_t version = DataPlane::kVersion) {
  std::string hello = "pwdp-hi\n";
  Put32(&hello, version);
  Put32(&hello, host_id);
  hello += nonce;
  hello.resize(16 + kNonceBytes, '\0');
  return hello;
}

// The listener's challenge or ack: 52 bytes.
std::string Answer(const std::string& magic, uint32_t host_id, uint32_t status, const std::string& bytes) {
  std::string answer = magic;
  Put32(&answer, DataPlane::kVersion);
  Put32(&answer, host_id);
  Put32(&answer, status);
  answer += bytes;
  answer.resize(20 + 32, '\0');
  return answer;
}
std::string Ack(uint32_t host_id, uint32_t status, const std::string& proof = "") {
  return Answer("pwdp-ak\n", host_id, status, proof);
}
std::string Challenge(uint32_t host_id, uint32_t status, const std::string& nonce = "") {
  return Answer("pwdp-ch\n", host_id, status, nonce);
}

HandshakeTranscript DataTranscript(uint32_t dialer, uint32_t listener, const std::string& dialer_nonce,
                                   const std::string& listener_nonce) {
  return {.plane = "data", .claim = dialer, .listener = listener, .dialer_nonce = dialer_nonce,
          .listener_nonce = listener_nonce, .binding = {}};
}
std::string ProofMessage(const std::string& key, ProofBy by, const HandshakeTranscript& t) {
  return "pwdp-pf\n" + HandshakeProof(key, by, t);
}

std::string FreshNonce() { return *RandomBytes(kNonceBytes); }

// Fields of a 52-byte answer.
uint32_t AnswerStatus(const std::string& answer) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<uint8_t>(answer[16 + i])) << (8 * i);
  return v;
}
std::string AnswerBytes(const std::string& answer) { return answer.substr(20, 32); }

std::string MessageHeader(uint64_t length, uint8_t flag = 0, const DataMessageIds& ids = {}) {
  std::string header;
  Put32(&header, 0x4d445750);
  header.push_back(static_cast<char>(flag));
  header.append(3, '\0');
  Put64(&header, ids.session);
  Put64(&header, ids.program_id);
  Put64(&header, ids.first_buffer_id);
  Put64(&header, ids.buffer_id);
  Put64(&header, length);
  return header;
}

// A blocking TCP socket connected to "127.0.0.1:port", or -1.
int DialRaw(const std::string& address) { return testing_util::DialLoopback(address); }

// A listening socket on 127.0.0.1:0; *address receives "127.0.0.1:port".
// A loopback socket on a port of its own: listening, or (`listen_too`
// false) only bound, which refuses connections and keeps any other process
// (a test running beside this one) from taking the port while it is open.
int ListenRaw(std::string* address, bool listen_too = true) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in at{};
  at.sin_family = AF_INET;
  at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(at);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&at), sizeof(at)) < 0 || (listen_too && listen(fd, 16) < 0) ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&at), &len) < 0) {
    return -1;
  }
  *address = absl::StrCat("127.0.0.1:", ntohs(at.sin_port));
  return fd;
}

bool WriteRaw(int fd, const std::string& bytes) {
  return send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size());
}

// Reads exactly n bytes (waiting at most kWait); empty on EOF or timeout.
std::string ReadRaw(int fd, size_t n) {
  std::string bytes(n, '\0');
  size_t got = 0;
  const auto deadline = std::chrono::steady_clock::now() + kWait;
  while (got < n) {
    pollfd p = {fd, POLLIN, 0};
    const int ms = static_cast<int>(
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count());
    if (ms <= 0 || poll(&p, 1, ms) <= 0) return "";
    const ssize_t r = recv(fd, bytes.data() + got, n - got, 0);
    if (r <= 0) return "";
    got += static_cast<size_t>(r);
  }
  return bytes;
}

// Waits until the other end closes `fd` (EOF or reset), collecting what it
// sent before; false if it is still open after `timeout`.
bool ClosedWithin(int fd, std::chrono::milliseconds timeout, std::string* received = nullptr) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const int ms = static_cast<int>(
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count());
    pollfd p = {fd, POLLIN, 0};
    if (ms <= 0 || poll(&p, 1, ms) <= 0) return false;
    char buffer[512];
    const ssize_t r = recv(fd, buffer, sizeof(buffer), 0);
    if (r <= 0) return true;
    if (received != nullptr) received->append(buffer, static_cast<size_t>(r));
  }
}

// ---------------------------------------------------------------------------
// Arguments and states

// ---------------------------------------------------------------------------
// The wire format's bytes (data_wire), against this file's own encoders.

absl::Span<const uint8_t> Bytes(const std::string& s) {
  return absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(s.data()), s.size());
}

// A listener reads a hello as it arrives: it waits while bytes are missing,
// and refuses at the first byte that is not the magic, or at the version.
TEST(DataWireTest, AHelloIsReadAsItArrives) {
  const std::string nonce(kNonceBytes, '\x6e');
  const std::string hello = Hello(2, nonce);
  data_wire::Hello read;
  for (size_t n = 0; n < hello.size(); ++n) {
    EXPECT_EQ(data_wire::ReadHello(Bytes(hello.substr(0, n)), &read), data_wire::Progress::kNeedMore) << n;
  }
  ASSERT_EQ(data_wire::ReadHello(Bytes(hello + "more"), &read), data_wire::Progress::kWhole);
  EXPECT_EQ(read.dialer, 2u);
  EXPECT_EQ(read.nonce, nonce);
  const std::array<uint8_t, data_wire::kHelloBytes> written = data_wire::WriteHello(read);
  EXPECT_EQ(std::string(written.begin(), written.end()), hello);
  EXPECT_EQ(data_wire::ReadHello(Bytes("pwdp-hX"), &read), data_wire::Progress::kNotOurs);
  EXPECT_EQ(data_wire::ReadHello(Bytes("GET / HTTP/1.1\r\n"), &read), data_wire::Progress::kNotOurs);
  const std::string other = Hello(2, nonce, DataPlane::kVersion + 1);
  EXPECT_EQ(data_wire::ReadHello(Bytes(other.substr(0, 11)), &read), data_wire::Progress::kNeedMore);
  EXPECT_EQ(data_wire::ReadHello(Bytes(other.substr(0, 12)), &read), data_wire::Progress::kOtherVersion);
  // A proof message likewise.
  std::string proof;
  const std::string message = "pwdp-pf\n" + std::string(kProofBytes, '\x70');
  EXPECT_EQ(data_wire::ReadProof(Bytes(message.substr(0, 39)), &proof), data_wire::Progress::kNeedMore);
  ASSERT_EQ(data_wire::ReadProof(Bytes(message), &proof), data_wire::Progress::kWhole);
  EXPECT_EQ(proof, message.substr(8));
  EXPECT_EQ(data_wire::ReadProof(Bytes(hello), &proof), data_wire::Progress::kNotOurs);
}

// A dialer reads the listener's answers whole, each of its own kind only;
// a receiver reads message headers whole.
TEST(DataWireTest, AnswersAndHeadersAreReadWhole) {
  const std::string nonce(kNonceBytes, '\x6e');
  const std::string challenge = Challenge(1, 0, nonce);
  std::optional<data_wire::Answer> read = data_wire::ReadAnswer(data_wire::AnswerKind::kChallenge, Bytes(challenge));
  ASSERT_TRUE(read.has_value());
  EXPECT_EQ(read->version, DataPlane::kVersion);
  EXPECT_EQ(read->host_id, 1u);
  EXPECT_EQ(read->status, 0u);
  EXPECT_EQ(read->bytes, nonce);
  const std::array<uint8_t, data_wire::kAnswerBytes> written =
      data_wire::WriteAnswer(data_wire::AnswerKind::kChallenge, *read);
  EXPECT_EQ(std::string(written.begin(), written.end()), challenge);
  EXPECT_FALSE(data_wire::ReadAnswer(data_wire::AnswerKind::kAck, Bytes(challenge)).has_value());
  EXPECT_FALSE(data_wire::ReadAnswer(data_wire::AnswerKind::kChallenge, Bytes(challenge.substr(1))).has_value());
  EXPECT_TRUE(data_wire::ReadAnswer(data_wire::AnswerKind::kAck, Bytes(Ack(1, 1))).has_value());

  const DataMessageIds ids{1, 2, 3, 4};
  std::optional<DataMessageHeader> header = data_wire::ReadHeader(Bytes(MessageHeader(1ull << 40, 9, ids)));
  ASSERT_TRUE(header.has_value());
  EXPECT_EQ(header->flag, 9);
  EXPECT_EQ(header->ids, ids);
  EXPECT_EQ(header->length, 1ull << 40);
  std::string corrupt = MessageHeader(5);
  corrupt[6] = 1;  // a byte that must be zero
  EXPECT_FALSE(data_wire::ReadHeader(Bytes(corrupt)).has_value());
  EXPECT_FALSE(data_wire::ReadHeader(Bytes(MessageHeader(5).substr(0, 47))).has_value());
}

TEST(DataPlaneTest, ListenRejectsBadArguments) {
  DataPlane::Options options = TestOptions();
  EXPECT_TRUE(absl::IsInvalidArgument(DataPlane::Listen(2, 2, options).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(DataPlane::Listen(-1, 2, options).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(DataPlane::Listen(0, 0, options).status()));
  options.secret = "";
  EXPECT_TRUE(absl::IsInvalidArgument(DataPlane::Listen(0, 2, options).status()));
  options.secret = std::string(DataPlane::kMaxSecretBytes + 1, 'x');
  EXPECT_TRUE(absl::IsInvalidArgument(DataPlane::Listen(0, 2, options).status()));
  options = TestOptions();
  options.bind_ip = "localhost";
  EXPECT_TRUE(absl::IsInvalidArgument(DataPlane::Listen(0, 2, options).status()));
  options.bind_ip = "::1";  // IPv6 loopback, where the kernel has it
  if (absl::StatusOr<std::unique_ptr<DataPlane>> v6 = DataPlane::Listen(0, 1, options); v6.ok()) {
    EXPECT_THAT((*v6)->address(), HasSubstr("[::1]:"));
  }
}

TEST(DataPlaneTest, CallsOutOfOrderOrWithBadPeersFail) {
  Cluster c;
  ASSERT_OK(c.Listen(2));
  std::string got;
  EXPECT_TRUE(absl::IsFailedPrecondition(SendString(c[0], 1, "x")));
  EXPECT_TRUE(absl::IsFailedPrecondition(RecvString(c[0], 1, 1, &got).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(c[0].Connect({c[0].address()})));
  EXPECT_TRUE(absl::IsInvalidArgument(c[0].Connect({c[0].address(), "127.0.0.1"})));
  EXPECT_TRUE(absl::IsInvalidArgument(c[0].Connect({c[0].address(), "nohost:80"})));
  ASSERT_OK(c.Connect());
  EXPECT_TRUE(absl::IsFailedPrecondition(c[0].Connect(c.Addresses())));
  EXPECT_TRUE(absl::IsInvalidArgument(SendString(c[0], 0, "x")));  // itself
  EXPECT_TRUE(absl::IsInvalidArgument(SendString(c[0], 2, "x")));
  EXPECT_TRUE(absl::IsInvalidArgument(RecvString(c[0], -1, 1, &got).status()));
  ASSERT_OK(SendString(c[0], 1, "still fine"));
  ASSERT_TRUE(RecvString(c[1], 0, 10, &got).ok());
  EXPECT_EQ(got, "still fine");
}

// ---------------------------------------------------------------------------
// Transfers

TEST(DataPlaneTest, RoundTripsOfZeroAndOneByte) {
  Cluster c;
  ASSERT_OK(c.Start(2));
  ASSERT_OK(c[0].Send(1, {}));  // no pieces at all
  const iovec empty = Piece(nullptr, 0);
  ASSERT_OK(c[0].Send(1, {&empty, 1}));  // one empty piece
  ASSERT_OK(SendString(c[0], 1, "x"));
  absl::StatusOr<uint8_t> flag = c[1].Recv(0, {});
  ASSERT_TRUE(flag.ok()) << flag.status();
  flag = c[1].Recv(0, {&empty, 1});
  ASSERT_TRUE(flag.ok()) << flag.status();
  std::string got;
  flag = RecvString(c[1], 0, 1, &got);
  ASSERT_TRUE(flag.ok()) << flag.status();
  EXPECT_EQ(got, "x");
  // And back the other way.
  ASSERT_OK(SendString(c[1], 0, "y"));
  ASSERT_TRUE(RecvString(c[0], 1, 1, &got).ok());
  EXPECT_EQ(got, "y");
}

TEST(DataPlaneTest, PiecesAreGatheredAndScatteredAsOneStream) {
  Cluster c;
  ASSERT_OK(c.Start(2));
  const std::string message = Pattern(109, 7);
  // Sent as 3 + 0 + 5 + 100 + 1 bytes, received as 50 + 0 + 58 + 1.
  std::vector<iovec> out = {Piece(message.data(), 3), Piece(message.data() + 3, 0), Piece(message.data() + 3, 5),
                            Piece(message.data() + 8, 100), Piece(message.data() + 108, 1)};
  ASSERT_OK(c[0].Send(1, out, 42));
  std::string a(50, '\0'), b(58, '\0'), d(1, '\0');
  std::vector<iovec> in = {Piece(a.data(), a.size()), Piece(nullptr, 0), Piece(b.data(), b.size()),
                           Piece(d.data(), d.size())};
  absl::StatusOr<uint8_t> flag = c[1].Recv(0, in);
  ASSERT_TRUE(flag.ok()) << flag.status();
  EXPECT_EQ(*flag, 42);
  EXPECT_EQ(a + b + d, message);
}

TEST(DataPlaneTest, PiecesBeyondIovMaxGoInSeveralCalls) {
  Cluster c;
  ASSERT_OK(c.Start(2));
  const std::string message = Pattern(5000, 3);  // 5000 one-byte pieces > IOV_MAX (1024)
  std::vector<iovec> out;
  for (size_t i = 0; i < message.size(); ++i) out.push_back(Piece(message.data() + i, 1));
  auto sent = c.Async([&] { return c[0].Send(1, out); });
  std::string got(message.size(), '\0');
  std::vector<iovec> in;
  for (size_t i = 0; i < got.size(); i += 2) in.push_back(Piece(got.data() + i, 2));
  absl::StatusOr<uint8_t> flag = c[1].Recv(0, in);
  ASSERT_TRUE(flag.ok()) << flag.status();
  ASSERT_OK(Get(sent));
  EXPECT_EQ(got, message);
}

TEST(DataPlaneTest, FlagsArriveWithTheirMessages) {
  Cluster c;
  ASSERT_OK(c.Start(2));
  auto sender = c.Async([&] {
    for (int flag = 0; flag < 256; ++flag) {
      absl::Status s = SendString(c[0], 1, std::string(flag % 3, 'f'), static_cast<uint8_t>(flag));
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  });
  for (int flag = 0; flag < 256; ++flag) {
    std::string got;
    absl::StatusOr<uint8_t> received = RecvString(c[1], 0, flag % 3, &got);
    ASSERT_TRUE(received.ok()) << received.status();
    EXPECT_EQ(*received, flag);
  }
  ASSERT_OK(Get(sender));
}

TEST(DataPlaneTest, ManyMessagesArriveInOrderBothWays) {
  Cluster c;
  ASSERT_OK(c.Start(2));
  constexpr int kMessages = 2000;
  auto send_all = [&](int from, int to) {
    for (int i = 0; i < kMessages; ++i) {
      absl::Status s = SendString(c[from], to, Pattern(i % 300, i));
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  };
  auto sent01 = c.Async([&] { return send_all(0, 1); });
  auto sent10 = c.Async([&] { return send_all(1, 0); });
  auto recv_all = [&](int at, int from) {
    for (int i = 0; i < kMessages; ++i) {
      std::string got;
      absl::StatusOr<uint8_t> flag = RecvString(c[at], from, i % 300, &got);
      if (!flag.ok()) return flag.status();
      if (got != Pattern(i % 300, i)) return absl::DataLossError(absl::StrCat("message ", i, " differs"));
    }
    return absl::OkStatus();
  };
  auto got01 = c.Async([&] { return recv_all(1, 0); });
  ASSERT_OK(recv_all(0, 1));
  ASSERT_OK(Get(got01));
  ASSERT_OK(Get(sent01));
  ASSERT_OK(Get(sent10));
}

TEST(DataPlaneTest, SixtyFourMiBArriveByteExact) {
  Cluster c;
  ASSERT_OK(c.Start(2));
  constexpr size_t kBytes = size_t{64} << 20;
  const std::string message = Pattern(kBytes, 64);
  // Three unequal pieces out, two in.
  std::vector<iovec> out = {Piece(message.data(), 1), Piece(message.data() + 1, kBytes / 3),
                            Piece(message.data() + 1 + kBytes / 3, kBytes - 1 - kBytes / 3)};
  auto sent = c.Async([&] { return c[0].Send(1, out, 9); });
  std::string got(kBytes, '\0');
  std::vector<iovec> in = {Piece(got.data(), kBytes / 2 + 5), Piece(got.data() + kBytes / 2 + 5, kBytes / 2 - 5)};
  absl::StatusOr<uint8_t> flag = c[1].Recv(0, in);
  ASSERT_TRUE(flag.ok()) << flag.status();
  ASSERT_OK(Get(sent));
  EXPECT_EQ(*flag, 9);
  EXPECT_TRUE(got == message);  // not EXPECT_EQ: no 64 MiB diff on failure
}

TEST(DataPlaneTest, SizeMismatchIsDrainedReportedAndTheConnectionStaysUsable) {
  Cluster c;
  ASSERT_OK(c.Start(2));
  // Larger than the pieces (and than the drain scratch), then smaller.
  const std::string big = Pattern(1 << 20, 1);
  auto sent = c.Async([&] {
    absl::Status s = SendString(c[0], 1, big);
    s.Update(SendString(c[0], 1, "tiny"));
    s.Update(SendString(c[0], 1, "exact", 5));
    return s;
  });
  std::string got(10, '-');
  const iovec piece = Piece(got.data(), got.size());
  absl::StatusOr<uint8_t> flag = c[1].Recv(0, {&piece, 1});
  EXPECT_TRUE(absl::IsInvalidArgument(flag.status())) << flag.status();
  EXPECT_THAT(flag.status().message(), AllOf(HasSubstr("host 0"), HasSubstr("1048576"), HasSubstr(" 10")));
  EXPECT_EQ(got, std::string(10, '-'));  // nothing landed in the pieces
  flag = c[1].Recv(0, {&piece, 1});
  EXPECT_TRUE(absl::IsInvalidArgument(flag.status())) << flag.status();
  EXPECT_THAT(flag.status().message(), AllOf(HasSubstr(" 4 "), HasSubstr(" 10")));
  flag = RecvString(c[1], 0, 5, &got);
  ASSERT_TRUE(flag.ok()) << flag.status();
  EXPECT_EQ(got, "exact");
  EXPECT_EQ(*flag, 5);
  ASSERT_OK(Get(sent));
}

// A sender may send something else than the bytes the receiver expects (an
// error report instead of a buffer's shards): with `other`, a message of
// another length up to kMaxOtherBytes lands there, with its flag; a longer
// one is still drained and reported.
TEST(DataPlaneTest, AMessageOfAnotherLengthCanBeTakenAsOther) {
  Cluster c;
  ASSERT_OK(c.Start(2));
  const std::string report = "the source failed";
  const std::string big = Pattern(DataPlane::kMaxOtherBytes + 1, 3);
  auto sent = c.Async([&] {
    absl::Status s = SendString(c[0], 1, report, 1);
    s.Update(SendString(c[0], 1, big, 1));
    s.Update(SendString(c[0], 1, "0123456789", 0));
    return s;
  });
  std::string got(10, '-');
  std::optional<std::string> other;
  const iovec piece = Piece(got.data(), got.size());
  absl::StatusOr<uint8_t> flag = c[1].Recv(0, {&piece, 1}, &other);
  ASSERT_TRUE(flag.ok()) << flag.status();
  EXPECT_EQ(*flag, 1);
  ASSERT_TRUE(other.has_value());
  EXPECT_EQ(*other, report);
  EXPECT_EQ(got, std::string(10, '-'));
  flag = c[1].Recv(0, {&piece, 1}, &other);
  EXPECT_TRUE(absl::IsInvalidArgument(flag.status())) << flag.status();
  flag = c[1].Recv(0, {&piece, 1}, &other);
  ASSERT_TRUE(flag.ok()) << flag.status();
  EXPECT_EQ(*flag, 0);
  EXPECT_EQ(got, "0123456789");
  EXPECT_FALSE(other.has_value());  // it landed in the pieces
  ASSERT_OK(Get(sent));
}

// A receiver that places each message by its ids: the header first, then
// the payload where the ids say, or nowhere. Nothing else is read from that
// peer in between, and the stream stays in step whatever is dropped.
TEST(DataPlaneTest, TheHeaderFirstThenThePayloadWhereItsIdsSayOrNowhere) {
  Cluster c;
  ASSERT_OK(c.Start(2));
  const DataMessageIds first{0, 20, 100, 101}, second{0, 21, 200, 201}, third{7, 21, 300, 301};
  const std::string big = Pattern(1 << 20, 4);  // larger than the drain's scratch
  auto sent = c.Async([&] {
    const iovec a = Piece(big.data(), big.size());
    absl::Status s = c[0].Send(1, {&a, 1}, 0, first);
    const iovec b = Piece("bbbb", 4);
    s.Update(c[0].Send(1, {&b, 1}, 0, second));
    const iovec cc = Piece("cc", 2);
    s.Update(c[0].Send(1, {&cc, 1}, 1, third));
    s.Update(SendString(c[0], 1, "dd"));
    return s;
  });
  absl::StatusOr<DataMessageHeader> h = c[1].RecvHeader(0);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_TRUE(h->ids == first);
  EXPECT_EQ(h->length, big.size());
  EXPECT_EQ(h->flag, 0);
  // Its payload is next on the wire: no other header, no other receive.
  EXPECT_TRUE(absl::IsFailedPrecondition(c[1].RecvHeader(0).status()));
  std::string got;
  EXPECT_TRUE(absl::IsFailedPrecondition(RecvString(c[1], 0, 4, &got).status()));
  ASSERT_OK(c[1].Discard(0));  // the receiver has no place for it
  // Nothing taken now: neither a payload nor a discard.
  EXPECT_TRUE(absl::IsFailedPrecondition(c[1].Discard(0)));
  EXPECT_TRUE(absl::IsFailedPrecondition(c[1].RecvPayload(0, {})));

  h = c[1].RecvHeader(0);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_TRUE(h->ids == second);
  char small[3];
  const iovec wrong = Piece(small, sizeof(small));
  absl::Status mismatch = c[1].RecvPayload(0, {&wrong, 1});
  EXPECT_TRUE(absl::IsInvalidArgument(mismatch)) << mismatch;
  EXPECT_THAT(mismatch.message(), AllOf(HasSubstr("has 4 bytes"), HasSubstr("hold 3")));

  h = c[1].RecvHeader(0);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_TRUE(h->ids == third);
  EXPECT_EQ(h->flag, 1);
  char two[2];
  const iovec right = Piece(two, sizeof(two));
  ASSERT_OK(c[1].RecvPayload(0, {&right, 1}));
  EXPECT_EQ(std::string(two, 2), "cc");
  // Still in step for a receiver that takes messages in order.
  absl::StatusOr<uint8_t> flag = RecvString(c[1], 0, 2, &got);
  ASSERT_TRUE(flag.ok()) << flag.status();
  EXPECT_EQ(got, "dd");
  ASSERT_OK(Get(sent));
}

// Shutdown wakes a receiver waiting for a header, and one that took a
// header and has not taken its payload sees Cancelled next.
TEST(DataPlaneTest, ShutdownUnblocksAReceiverWaitingForAHeader) {
  Cluster c;
  ASSERT_OK(c.Start(2));
  auto waiting = c.Async([&] { return c[1].RecvHeader(0).status(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  c[1].Shutdown();
  absl::Status s = Get(waiting);
  EXPECT_TRUE(absl::IsCancelled(s)) << s;
}

TEST(DataPlaneTest, ConcurrentTrafficAmongFourPlanesInAllDirections) {
  constexpr int kHosts = 4;
  constexpr int kMessages = 60;
  Cluster c;
  ASSERT_OK(c.Start(kHosts));
  auto size_of = [](int from, int to, int i) { return static_cast<size_t>((from * 7 + to * 13 + i * 2011) % 65536); };
  auto seed_of = [](int from, int to, int i) { return static_cast<uint32_t>(from * 1000000 + to * 10000 + i); };
  std::vector<std::future<absl::Status>> results;
  for (int from = 0; from < kHosts; ++from) {
    for (int to = 0; to < kHosts; ++to) {
      if (from == to) continue;
      // One sending and one receiving thread per ordered pair, as the host
      // executor will run them.
      results.push_back(c.Async([&, from, to] {
        for (int i = 0; i < kMessages; ++i) {
          absl::Status s = SendString(c[from], to, Pattern(size_of(from, to, i), seed_of(from, to, i)), i % 256);
          if (!s.ok()) return s;
        }
        return absl::OkStatus();
      }));
      results.push_back(c.Async([&, from, to] {
        for (int i = 0; i < kMessages; ++i) {
          std::string got;
          absl::StatusOr<uint8_t> flag = RecvString(c[to], from, size_of(from, to, i), &got);
          if (!flag.ok()) return flag.status();
          if (*flag != i % 256 || got != Pattern(size_of(from, to, i), seed_of(from, to, i))) {
            return absl::DataLossError(absl::StrCat("message ", i, " from ", from, " to ", to, " differs"));
          }
        }
        return absl::OkStatus();
      }));
    }
  }
  for (auto& r : results) ASSERT_OK(Get(r));
}

TEST(DataPlaneTest, ConcurrentSendsToOnePeerStayWhole) {
  constexpr int kThreads = 3;
  constexpr int kMessages = 200;
  constexpr size_t kBody = 8192;
  Cluster c;
  ASSERT_OK(c.Start(2));
  // Each message: (thread, index) in 8 bytes, then a body that depends on
  // both, as two pieces; messages of different threads must not interleave.
  auto body = [](int t, int i) { return Pattern(kBody, static_cast<uint32_t>(t * 100000 + i)); };
  std::vector<std::future<absl::Status>> sent;
  for (int t = 0; t < kThreads; ++t) {
    sent.push_back(c.Async([&, t] {
      for (int i = 0; i < kMessages; ++i) {
        const int32_t head[2] = {t, i};
        const std::string b = body(t, i);
        const std::vector<iovec> pieces = {Piece(head, sizeof(head)), Piece(b.data(), b.size())};
        absl::Status s = c[0].Send(1, pieces);
        if (!s.ok()) return s;
      }
      return absl::OkStatus();
    }));
  }
  std::vector<int> next(kThreads, 0);
  for (int m = 0; m < kThreads * kMessages; ++m) {
    int32_t head[2] = {-1, -1};
    std::string got(kBody, '\0');
    const std::vector<iovec> pieces = {Piece(head, sizeof(head)), Piece(got.data(), got.size())};
    absl::StatusOr<uint8_t> flag = c[1].Recv(0, pieces);
    ASSERT_TRUE(flag.ok()) << flag.status();
    ASSERT_TRUE(head[0] >= 0 && head[0] < kThreads) << head[0];
    ASSERT_EQ(head[1], next[head[0]]) << "thread " << head[0];  // each thread's own order holds
    ASSERT_TRUE(got == body(head[0], head[1])) << "message " << head[1] << " of thread " << head[0];
    ++next[head[0]];
  }
  for (auto& s : sent) ASSERT_OK(Get(s));
}

// ---------------------------------------------------------------------------
// Authentication: connections that are not a cluster's peers

// A dialer by hand: sends the hello (claiming `claim`, with `version`), and
// if the listener challenges it (status 0), what `respond` makes of the
// listener's nonce and ours. What the listener sent until it closed.
struct ByHand {
  std::string challenge;  // 52 bytes, or what came before the close
  std::string rest;       // after the challenge: the ack, if any
  bool closed = false;
};
ByHand DialByHand(const std::string& target, uint32_t claim,
                  const std::function<std::string(const std::string& ours, const std::string& theirs)>& respond,
                  uint32_t version = DataPlane::kVersion) {
  ByHand out;
  const int fd = DialRaw(target);
  if (fd < 0) return out;
  const std::string nonce = FreshNonce();
  if (!WriteRaw(fd, Hello(claim, nonce, version))) {
    close(fd);
    return out;
  }
  out.challenge = ReadRaw(fd, 52);
  if (out.challenge.size() == 52 && out.challenge.substr(0, 8) == "pwdp-ch\n" && AnswerStatus(out.challenge) == 0 &&
      respond != nullptr) {
    const std::string response = respond(nonce, AnswerBytes(out.challenge));
    if (!response.empty()) WriteRaw(fd, response);
  }
  out.closed = ClosedWithin(fd, std::chrono::milliseconds(5000), &out.rest);
  close(fd);
  return out;
}

TEST(DataPlaneTest, BadPeersAreRefusedAndGoodPeersStillConnectAndTransfer) {
  // A handshake timeout far beyond the waits below: every refusal here is
  // for what the connection sent, not for being slow.
  DataPlane::Options options = TestOptions();
  options.handshake_timeout = absl::Seconds(60);
  Cluster c;
  ASSERT_OK(c.Listen(3, options));
  const std::string target = c[0].address();
  const auto kPrompt = std::chrono::milliseconds(5000);

  // Three that stall, opened first: they must not hold up anyone after them.
  const int silent = DialRaw(target);
  ASSERT_GE(silent, 0);
  const int truncated = DialRaw(target);
  ASSERT_GE(truncated, 0);
  ASSERT_TRUE(WriteRaw(truncated, Hello(1, FreshNonce()).substr(0, 30)));
  const int unproven = DialRaw(target);  // challenged, never answers
  ASSERT_GE(unproven, 0);
  ASSERT_TRUE(WriteRaw(unproven, Hello(1, FreshNonce())));
  ASSERT_EQ(ReadRaw(unproven, 52).substr(0, 8), "pwdp-ch\n");

  auto proof_with = [&](const std::string& key, uint32_t as) {
    return [key, as](const std::string& ours, const std::string& theirs) {
      return ProofMessage(key, ProofBy::kDialer, DataTranscript(as, 0, ours, theirs));
    };
  };
  struct Case {
    std::string name;
    uint32_t claim;
    std::function<std::string(const std::string&, const std::string&)> respond;
    uint32_t version;
    int challenge_status;  // -1: no challenge at all (closed without an answer)
    int ack_status;        // -1: no ack
  };
  const std::vector<Case> cases = {
      {"a proof with another key", 1, proof_with("not the secret", 1), DataPlane::kVersion, 0, 1},
      {"a proof for another claim", 1, proof_with(options.secret, 2), DataPlane::kVersion, 0, 1},
      {"a proof for another nonce", 1,
       [&](const std::string&, const std::string& theirs) {
         return ProofMessage(options.secret, ProofBy::kDialer, DataTranscript(1, 0, FreshNonce(), theirs));
       },
       DataPlane::kVersion, 0, 1},
      {"the listener's proof reflected back", 1,
       [&](const std::string& ours, const std::string& theirs) {
         return ProofMessage(options.secret, ProofBy::kListener, DataTranscript(1, 0, ours, theirs));
       },
       DataPlane::kVersion, 0, 1},
      {"something else than a proof", 1,
       [](const std::string&, const std::string&) { return std::string("GET / HTTP/1.1\r\n\r\n") + std::string(30, 'x'); },
       DataPlane::kVersion, 0, -1},
      {"host id out of range", 3, nullptr, DataPlane::kVersion, 2, -1},
      {"the listener's own host id", 0, nullptr, DataPlane::kVersion, 2, -1},
      {"another version", 1, nullptr, DataPlane::kVersion + 1, 4, -1},
      {"version 2 (messages without ids)", 1, nullptr, 2, 4, -1},
  };
  for (const Case& bad : cases) {
    SCOPED_TRACE(bad.name);
    const ByHand got = DialByHand(target, bad.claim, bad.respond, bad.version);
    EXPECT_TRUE(got.closed);
    ASSERT_EQ(got.challenge.size(), 52u);
    EXPECT_EQ(got.challenge.substr(0, 8), "pwdp-ch\n");
    EXPECT_EQ(AnswerStatus(got.challenge), static_cast<uint32_t>(bad.challenge_status));
    if (bad.challenge_status != 0) {
      EXPECT_EQ(AnswerBytes(got.challenge), std::string(32, '\0'));
    }
    if (bad.ack_status < 0) {
      EXPECT_EQ(got.rest, "");
    } else {
      EXPECT_EQ(got.rest, Ack(0, bad.ack_status));  // no proof of the listener's for a refused dialer
    }
  }
  for (const std::string& bytes : {std::string("GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"), Pattern(1000, 5),
                                   std::string()}) {
    const int fd = DialRaw(target);
    ASSERT_GE(fd, 0);
    if (bytes.empty()) {
      shutdown(fd, SHUT_WR);
    } else {
      ASSERT_TRUE(WriteRaw(fd, bytes));
    }
    std::string received;
    EXPECT_TRUE(ClosedWithin(fd, kPrompt, &received));
    EXPECT_EQ(received, "");
    close(fd);
  }

  // The real peers connect while the stalled ones are still pending.
  ASSERT_OK(c.Connect());
  ASSERT_OK(SendString(c[1], 0, "after the bad ones"));
  std::string got;
  ASSERT_TRUE(RecvString(c[0], 1, 18, &got).ok());
  EXPECT_EQ(got, "after the bad ones");

  // A second connection proving itself as a connected host (with the right
  // key) is refused; the real one is untouched.
  const ByHand impostor = DialByHand(target, 2, proof_with(options.secret, 2));
  EXPECT_TRUE(impostor.closed);
  EXPECT_EQ(impostor.rest, Ack(0, 3));
  ASSERT_OK(SendString(c[2], 0, "still here"));
  ASSERT_TRUE(RecvString(c[0], 2, 10, &got).ok());
  EXPECT_EQ(got, "still here");
  close(silent);
  close(truncated);
  close(unproven);
}

TEST(DataPlaneTest, TheListenerProvesItselfAndTheDialerChecksIt) {
  // A real dialer, a listener by hand.
  std::string fake_address;
  const int listen_fd = ListenRaw(&fake_address);
  ASSERT_GE(listen_fd, 0);
  for (const std::string& key : {std::string("not the secret"), TestOptions().secret}) {
    SCOPED_TRACE(key);
    DataPlane::Options options = TestOptions();
    options.connect_timeout = absl::Seconds(5);
    absl::StatusOr<std::unique_ptr<DataPlane>> plane = DataPlane::Listen(0, 2, options);
    ASSERT_TRUE(plane.ok()) << plane.status();
    Cluster c;
    c.planes.push_back(*std::move(plane));
    auto connected = c.Async([&] { return c[0].Connect({c[0].address(), fake_address}); });
    const int fd = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    ASSERT_GE(fd, 0);
    const std::string hello = ReadRaw(fd, 48);
    ASSERT_EQ(hello.substr(0, 8), "pwdp-hi\n");
    EXPECT_EQ(hello.find(options.secret), std::string::npos);
    const std::string theirs = hello.substr(16, 32), ours = FreshNonce();
    ASSERT_TRUE(WriteRaw(fd, Challenge(1, 0, ours)));
    const std::string proof = ReadRaw(fd, 40);
    const HandshakeTranscript t = DataTranscript(0, 1, theirs, ours);
    EXPECT_EQ(proof, ProofMessage(options.secret, ProofBy::kDialer, t));
    // We accept, with a proof of `key`.
    ASSERT_TRUE(WriteRaw(fd, Ack(1, 0, HandshakeProof(key, ProofBy::kListener, t))));
    if (key != options.secret) {
      const absl::Status status = Get(connected);
      EXPECT_TRUE(absl::IsPermissionDenied(status)) << status;
      EXPECT_THAT(status.message(), HasSubstr("could not prove it knows the cluster's secret"));
    } else {
      // Host 1 (us) still has to dial in; the plane waits for it.
      const int in = DialRaw(c[0].address());
      ASSERT_TRUE(WriteRaw(in, Hello(1, ours)));
      const std::string challenge = ReadRaw(in, 52);
      ASSERT_EQ(AnswerStatus(challenge), 0u);
      const HandshakeTranscript back = DataTranscript(1, 0, ours, AnswerBytes(challenge));
      ASSERT_TRUE(WriteRaw(in, ProofMessage(options.secret, ProofBy::kDialer, back)));
      EXPECT_EQ(ReadRaw(in, 52), Ack(0, 0, HandshakeProof(options.secret, ProofBy::kListener, back)));
      ASSERT_OK(Get(connected));
      close(in);
    }
    close(fd);
  }
  close(listen_fd);
}

TEST(DataPlaneTest, PeerKeysProveWhichHostDials) {
  // Keys by pair: host a's key for b is host b's key for a.
  constexpr int kHosts = 3;
  std::vector<std::vector<std::string>> keys(kHosts, std::vector<std::string>(kHosts));
  for (int a = 0; a < kHosts; ++a) {
    for (int b = a + 1; b < kHosts; ++b) keys[a][b] = keys[b][a] = FreshNonce();
  }
  Cluster c;
  for (int h = 0; h < kHosts; ++h) {
    DataPlane::Options options = TestOptions();
    options.secret = "";
    options.peer_keys = keys[h];
    absl::StatusOr<std::unique_ptr<DataPlane>> plane = DataPlane::Listen(h, kHosts, options);
    ASSERT_TRUE(plane.ok()) << plane.status();
    c.planes.push_back(*std::move(plane));
  }
  // Host 2 claims to be host 1 to host 0: its own key for host 0 does not
  // prove that, nor does the cluster's secret.
  for (const std::string& key : {keys[2][0], TestOptions().secret}) {
    const ByHand impostor = DialByHand(c[0].address(), 1, [&](const std::string& ours, const std::string& theirs) {
      return ProofMessage(key, ProofBy::kDialer, DataTranscript(1, 0, ours, theirs));
    });
    EXPECT_EQ(impostor.rest, Ack(0, 1));
  }
  ASSERT_OK(c.Connect());
  ASSERT_OK(SendString(c[1], 0, "from 1"));
  std::string got;
  ASSERT_TRUE(RecvString(c[0], 1, 6, &got).ok());
  EXPECT_EQ(got, "from 1");
  // Peer keys must be one per host, each other host's nonempty.
  DataPlane::Options bad = TestOptions();
  bad.peer_keys = {"", "k"};
  EXPECT_TRUE(absl::IsInvalidArgument(DataPlane::Listen(0, 3, bad).status()));
  bad.peer_keys = {"", "", "k"};
  EXPECT_TRUE(absl::IsInvalidArgument(DataPlane::Listen(0, 3, bad).status()));
}

TEST(DataPlaneTest, StalledHellosAreClosedAtTheHandshakeTimeout) {
  DataPlane::Options options = TestOptions();
  options.handshake_timeout = absl::Milliseconds(300);
  Cluster c;
  ASSERT_OK(c.Listen(2, options));
  const auto start = std::chrono::steady_clock::now();
  const int silent = DialRaw(c[0].address());
  ASSERT_GE(silent, 0);
  const int truncated = DialRaw(c[0].address());
  ASSERT_GE(truncated, 0);
  ASSERT_TRUE(WriteRaw(truncated, Hello(1, FreshNonce()).substr(0, 47)));  // one byte short
  const int unproven = DialRaw(c[0].address());
  ASSERT_GE(unproven, 0);
  ASSERT_TRUE(WriteRaw(unproven, Hello(1, FreshNonce())));
  ASSERT_EQ(ReadRaw(unproven, 52).substr(0, 8), "pwdp-ch\n");
  EXPECT_TRUE(ClosedWithin(silent, std::chrono::milliseconds(5000)));
  EXPECT_TRUE(ClosedWithin(truncated, std::chrono::milliseconds(5000)));
  EXPECT_TRUE(ClosedWithin(unproven, std::chrono::milliseconds(5000)));
  // Not before the timeout (a little slack: absl::Now and steady_clock differ).
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(290));
  close(silent);
  close(truncated);
  close(unproven);
  // Those did not use up host 1's place.
  ASSERT_OK(c.Connect());
  ASSERT_OK(SendString(c[1], 0, "late but fine"));
  std::string got;
  ASSERT_TRUE(RecvString(c[0], 1, 13, &got).ok());
  EXPECT_EQ(got, "late but fine");
}

TEST(DataPlaneTest, AFloodOfSilentConnectionsDoesNotLockPeersOut) {
  DataPlane::Options options = TestOptions();
  options.handshake_timeout = absl::Seconds(60);  // the flood would last
  Cluster c;
  ASSERT_OK(c.Listen(2, options));
  std::vector<int> flood;
  for (int i = 0; i < 150; ++i) {  // more than the listener keeps pending
    const int fd = DialRaw(c[1].address());
    ASSERT_GE(fd, 0);
    flood.push_back(fd);
  }
  const auto start = std::chrono::steady_clock::now();
  ASSERT_OK(c.Connect());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  ASSERT_OK(SendString(c[0], 1, "through"));
  std::string got;
  ASSERT_TRUE(RecvString(c[1], 0, 7, &got).ok());
  EXPECT_EQ(got, "through");
  for (int fd : flood) close(fd);
}

TEST(DataPlaneTest, ADifferentSecretIsPermissionDenied) {
  DataPlane::Options other = TestOptions();
  other.secret = "the secret of another cluster";
  Cluster c;
  absl::StatusOr<std::unique_ptr<DataPlane>> a = DataPlane::Listen(0, 2, TestOptions());
  absl::StatusOr<std::unique_ptr<DataPlane>> b = DataPlane::Listen(1, 2, other);
  ASSERT_TRUE(a.ok() && b.ok());
  c.planes.push_back(*std::move(a));
  c.planes.push_back(*std::move(b));
  auto connect0 = c.Async([&] { return c[0].Connect(c.Addresses()); });
  absl::Status s1 = c[1].Connect(c.Addresses());
  absl::Status s0 = Get(connect0);
  EXPECT_TRUE(absl::IsPermissionDenied(s0)) << s0;
  EXPECT_TRUE(absl::IsPermissionDenied(s1)) << s1;
  EXPECT_THAT(s0.message(), AllOf(HasSubstr("host 1 at " + c[1].address()), HasSubstr("secret")));
  EXPECT_THAT(s1.message(), HasSubstr("host 0 at " + c[0].address()));
  std::string got;
  EXPECT_TRUE(absl::IsFailedPrecondition(SendString(c[0], 1, "x")));
}

// Two planes; host 0 dials host 1 through a relay that records every byte,
// and sends it `message`. What the relay saw.
testing_util::TapProxy::Recording ConnectThroughATapAndSend(const std::string& message) {
  Cluster c;
  if (absl::Status s = c.Listen(2); !s.ok()) {
    ADD_FAILURE() << s;
    return {};
  }
  auto tap = testing_util::TapProxy::Start(c[1].address());
  if (tap == nullptr) {
    ADD_FAILURE() << "no tap";
    return {};
  }
  std::vector<std::string> via_tap = c.Addresses();
  via_tap[1] = tap->address();
  auto connect0 = c.Async([&] { return c[0].Connect(via_tap); });
  const absl::Status connected1 = c[1].Connect(c.Addresses());
  const absl::Status connected0 = Get(connect0);
  std::string got;
  if (!connected0.ok() || !connected1.ok() || !SendString(c[0], 1, message).ok() ||
      !RecvString(c[1], 0, message.size(), &got).ok() || tap->recordings().size() != 1) {
    ADD_FAILURE() << "no transfer through the tap: " << connected0 << "; " << connected1;
    return {};
  }
  return tap->recordings()[0];
}

// Neither the handshake nor the data shows the secret.
TEST(DataPlaneTest, APassiveObserverNeverSeesTheSecret) {
  const testing_util::TapProxy::Recording seen = ConnectThroughATapAndSend("seen by the tap");
  const std::string all = seen.from_dialer + seen.from_listener;
  ASSERT_NE(all.find("seen by the tap"), std::string::npos);  // the tap is on the path
  EXPECT_EQ(all.find(TestOptions().secret), std::string::npos) << "the secret crossed the wire in the clear";
}

// What host 0 sent to host 1, replayed to a fresh host 1 of the same
// cluster: the replay must not pass for host 0 (nor take its place).
TEST(DataPlaneTest, AReplayedHandshakeDoesNotAuthenticate) {
  const std::string recorded = ConnectThroughATapAndSend("x").from_dialer;
  ASSERT_FALSE(recorded.empty());
  Cluster fresh;
  ASSERT_OK(fresh.Listen(2));
  const int fd = DialRaw(fresh[1].address());
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(WriteRaw(fd, recorded));
  const std::string answer = testing_util::ReadUntilQuiet(fd, std::chrono::milliseconds(500), kWait);
  // No ack that accepts it (status 0 at byte 16 of an ack).
  const size_t ack = answer.find("pwdp-ak\n");
  if (ack != std::string::npos) {
    ASSERT_GE(answer.size(), ack + 20);
    EXPECT_NE(answer.substr(ack + 16, 4), std::string(4, '\0')) << "the replay was accepted";
  }
  close(fd);
  // The real host 0 of the fresh cluster still gets its place.
  ASSERT_OK(fresh.Connect());
  ASSERT_OK(SendString(fresh[0], 1, "real"));
  std::string got;
  ASSERT_TRUE(RecvString(fresh[1], 0, 4, &got).ok());
  EXPECT_EQ(got, "real");
}

TEST(DataPlaneTest, AnAddressOfTheWrongHostIsFailedPrecondition) {
  DataPlane::Options options = TestOptions();
  options.connect_timeout = absl::Seconds(2);
  Cluster c;
  ASSERT_OK(c.Listen(3, options));
  std::vector<std::string> addresses = c.Addresses();
  addresses[1] = c[2].address();
  absl::Status s = c[0].Connect(addresses);
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("is the data plane of host 2"));
}

// ---------------------------------------------------------------------------
// A peer that speaks the wire format by hand: what a plane sends, and what it
// makes of a peer that lies or stops mid-message.

class FakePeerTest : public ::testing::Test {
 protected:
  // Host 0 is a real plane; host 1 is this test on raw sockets.
  void SetUp() override {
    std::string fake_address;
    listen_fd_ = ListenRaw(&fake_address);
    ASSERT_GE(listen_fd_, 0);
    absl::StatusOr<std::unique_ptr<DataPlane>> plane = DataPlane::Listen(0, 2, TestOptions());
    ASSERT_TRUE(plane.ok()) << plane.status();
    c_.planes.push_back(*std::move(plane));
    auto connected = c_.Async([&, fake_address] { return c_[0].Connect({c_[0].address(), fake_address}); });
    const std::string secret = TestOptions().secret;
    // The plane dials us: its hello, our challenge, its proof, our ack.
    from_plane_ = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    ASSERT_GE(from_plane_, 0);
    const std::string hello = ReadRaw(from_plane_, 48);
    ASSERT_EQ(hello.substr(0, 16), Hello(0, "").substr(0, 16));
    const std::string ours = FreshNonce();
    ASSERT_TRUE(WriteRaw(from_plane_, Challenge(1, 0, ours)));
    const HandshakeTranscript out = DataTranscript(0, 1, hello.substr(16), ours);
    ASSERT_EQ(ReadRaw(from_plane_, 40), ProofMessage(secret, ProofBy::kDialer, out));
    ASSERT_TRUE(WriteRaw(from_plane_, Ack(1, 0, HandshakeProof(secret, ProofBy::kListener, out))));
    // We dial the plane: the same the other way.
    to_plane_ = DialRaw(c_[0].address());
    ASSERT_GE(to_plane_, 0);
    ASSERT_TRUE(WriteRaw(to_plane_, Hello(1, ours)));
    const std::string challenge = ReadRaw(to_plane_, 52);
    ASSERT_EQ(AnswerStatus(challenge), 0u);
    const HandshakeTranscript in = DataTranscript(1, 0, ours, AnswerBytes(challenge));
    ASSERT_TRUE(WriteRaw(to_plane_, ProofMessage(secret, ProofBy::kDialer, in)));
    EXPECT_EQ(ReadRaw(to_plane_, 52), Ack(0, 0, HandshakeProof(secret, ProofBy::kListener, in)));
    ASSERT_OK(Get(connected));
  }
  void TearDown() override {
    c_[0].Shutdown();
    close(listen_fd_);
    if (from_plane_ >= 0) close(from_plane_);
    if (to_plane_ >= 0) close(to_plane_);
  }

  Cluster c_;
  int listen_fd_ = -1;
  int from_plane_ = -1;  // the plane's messages to host 1
  int to_plane_ = -1;    // host 1's messages to the plane
};

TEST_F(FakePeerTest, MessagesOnTheWireAreHeaderThenPayload) {
  static_assert(DataPlane::kHeaderBytes == 48);
  const DataMessageIds ids{0x0102030405060708, 20, 100, 0xfedcba9876543210};
  ASSERT_OK(SendString(c_[0], 1, "abc", 7));
  ASSERT_OK(c_[0].Send(1, {}, 255, ids));
  const std::string wire = ReadRaw(from_plane_, 48 + 3 + 48);
  EXPECT_EQ(wire, MessageHeader(3, 7) + "abc" + MessageHeader(0, 255, ids));
  // Byte by byte, as data_plane.h says.
  const std::string h = MessageHeader(3, 7, ids);
  EXPECT_EQ(h.substr(0, 8), std::string("PWDM\x07\0\0\0", 8));
  EXPECT_EQ(h.substr(8, 8), std::string("\x08\x07\x06\x05\x04\x03\x02\x01", 8));  // session
  EXPECT_EQ(h.substr(16, 8), std::string("\x14\0\0\0\0\0\0\0", 8));             // program id
  EXPECT_EQ(h.substr(24, 8), std::string("\x64\0\0\0\0\0\0\0", 8));             // first buffer id
  EXPECT_EQ(h.substr(32, 8), std::string("\x10\x32\x54\x76\x98\xba\xdc\xfe", 8));  // buffer id
  EXPECT_EQ(h.substr(40, 8), std::string("\x03\0\0\0\0\0\0\0", 8));             // payload length
  ASSERT_TRUE(WriteRaw(to_plane_, MessageHeader(2, 3, ids) + "hi"));
  std::string got;
  got.assign(2, '\0');
  const iovec piece = Piece(got.data(), 2);
  DataMessageIds received;
  absl::StatusOr<uint8_t> flag = c_[0].Recv(1, {&piece, 1}, nullptr, &received);
  ASSERT_TRUE(flag.ok()) << flag.status();
  EXPECT_EQ(*flag, 3);
  EXPECT_EQ(got, "hi");
  EXPECT_TRUE(received == ids);
}

TEST_F(FakePeerTest, AHugeClaimedLengthAllocatesNothingAndEndsWithTheConnection) {
  // 2^60 bytes claimed: the plane drains through its fixed scratch buffer
  // until the peer closes, and must not try to allocate the claim.
  ASSERT_TRUE(WriteRaw(to_plane_, MessageHeader(uint64_t{1} << 60) + Pattern(100000, 1)));
  shutdown(to_plane_, SHUT_WR);
  std::string got;
  absl::StatusOr<uint8_t> flag = RecvString(c_[0], 1, 10, &got);
  EXPECT_TRUE(absl::IsUnavailable(flag.status())) << flag.status();
  EXPECT_THAT(flag.status().message(),
              AllOf(HasSubstr("from host 1"), HasSubstr("after 100000 of 1152921504606846976 bytes")));
  // Broken for good, and said again.
  EXPECT_EQ(RecvString(c_[0], 1, 10, &got).status(), flag.status());
}

TEST_F(FakePeerTest, APeerThatStopsMidMessageIsUnavailable) {
  ASSERT_TRUE(WriteRaw(to_plane_, MessageHeader(1 << 20) + Pattern(1000, 2)));
  auto received = c_.Async([&] {
    std::string got;
    return RecvString(c_[0], 1, 1 << 20, &got).status();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // usually blocked by now; either way works
  close(to_plane_);
  to_plane_ = -1;
  absl::Status s = Get(received);
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_THAT(s.message(), AllOf(HasSubstr("host 1"), HasSubstr("after 1000 of 1048576 bytes")));
  // Sending to host 1 is a different connection and still works.
  ASSERT_OK(SendString(c_[0], 1, "ok"));
  EXPECT_EQ(ReadRaw(from_plane_, 48 + 2), MessageHeader(2) + "ok");
}

TEST_F(FakePeerTest, ACorruptHeaderBreaksTheConnection) {
  // A header's worth of bytes that are not one.
  const std::string http = "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: */*\r\n\r\n";
  ASSERT_EQ(http.size(), DataPlane::kHeaderBytes);
  ASSERT_TRUE(WriteRaw(to_plane_, http));
  std::string got;
  absl::Status s = RecvString(c_[0], 1, 2, &got).status();
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("corrupt"));
  // The plane shut the connection: the peer sees it closed.
  EXPECT_TRUE(ClosedWithin(to_plane_, std::chrono::milliseconds(3000)));
}

TEST_F(FakePeerTest, SendToAPeerThatClosedFailsBeforeWriting) {
  // Host 1 closes its end of the plane's connection (a FIN: TCP would still
  // take writes after it). Wait until the plane's kernel has acknowledged
  // the FIN (our end is then in FIN_WAIT2), so the plane knows.
  shutdown(from_plane_, SHUT_WR);
  const auto deadline = std::chrono::steady_clock::now() + kWait;
  for (;;) {
    tcp_info info{};
    socklen_t len = sizeof(info);
    ASSERT_EQ(getsockopt(from_plane_, IPPROTO_TCP, TCP_INFO, &info, &len), 0);
    if (info.tcpi_state == TCP_FIN_WAIT2) break;
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "the FIN is not acknowledged";
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  // The next Send fails, and writes nothing into a connection nobody reads.
  absl::Status s = SendString(c_[0], 1, "lost?");
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_THAT(s.message(), AllOf(HasSubstr("to host 1"), HasSubstr("closed by the peer")));
  // What host 1 then reads: the plane's FIN (it shut the broken connection
  // down), with no byte before it.
  std::string received;
  EXPECT_TRUE(ClosedWithin(from_plane_, std::chrono::milliseconds(3000), &received));
  EXPECT_EQ(received, "");
  EXPECT_EQ(SendString(c_[0], 1, "again").ToString(), s.ToString());  // broken for good
}

// ---------------------------------------------------------------------------
// Failures: peers that go away, Shutdown, Connect's deadline

TEST(DataPlaneTest, AShutDownPeerFailsOnlyItsOwnTransfers) {
  Cluster c;
  ASSERT_OK(c.Start(3));
  // Host 0 is blocked sending 64 MiB to host 1, which does not read.
  const std::string big = Pattern(size_t{64} << 20, 1);
  auto blocked = c.Async([&] { return SendString(c[0], 1, big); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  c[1].Shutdown();
  absl::Status s = Get(blocked);
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("host 1"));

  // Every transfer with host 1 fails promptly, and names it.
  std::string got;
  for (int h : {0, 2}) {
    absl::Status r = RecvString(c[h], 1, 1, &got).status();
    EXPECT_TRUE(absl::IsUnavailable(r)) << r;
    EXPECT_THAT(r.message(), HasSubstr("from host 1"));
  }
  absl::Status s2 = SendString(c[2], 1, "x");
  EXPECT_TRUE(absl::IsUnavailable(s2)) << s2;
  EXPECT_THAT(s2.message(), HasSubstr("to host 1"));
  EXPECT_TRUE(absl::IsCancelled(SendString(c[1], 0, "x")));

  // Hosts 0 and 2 carry on, both ways, big and small.
  auto sent = c.Async([&] { return SendString(c[0], 2, big, 1); });
  ASSERT_OK(SendString(c[2], 0, "fine"));
  got.assign(big.size(), '\0');
  const iovec piece = Piece(got.data(), got.size());
  ASSERT_TRUE(c[2].Recv(0, {&piece, 1}).ok());
  EXPECT_TRUE(got == big);
  ASSERT_OK(Get(sent));
  ASSERT_TRUE(RecvString(c[0], 2, 4, &got).ok());
  EXPECT_EQ(got, "fine");
}

TEST(DataPlaneTest, ShutdownPeerFailsOnlyTransfersWithThatPeerAtOnce) {
  // Host 1 is alive but answers nothing (a stopped process): host 0 is
  // blocked sending it 64 MiB and receiving from it. ShutdownPeer(1) ends
  // both at once; later transfers with host 1 fail at once; host 2 carries
  // on with host 0 both ways.
  Cluster c;
  ASSERT_OK(c.Start(3));
  const std::string big = Pattern(size_t{64} << 20, 4);
  std::string got;
  auto send = c.Async([&] { return SendString(c[0], 1, big); });
  auto recv = c.Async([&] { return RecvString(c[0], 1, 5, &got).status(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  c[0].ShutdownPeer(1);
  c[0].ShutdownPeer(1);  // idempotent
  c[0].ShutdownPeer(0);  // itself, and an unknown peer: ignored
  c[0].ShutdownPeer(7);
  absl::Status s = Get(send), r = Get(recv);
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("host 1"));
  EXPECT_TRUE(absl::IsUnavailable(r)) << r;
  EXPECT_THAT(r.message(), HasSubstr("host 1"));
  EXPECT_TRUE(absl::IsUnavailable(SendString(c[0], 1, "x")));
  EXPECT_TRUE(absl::IsUnavailable(RecvString(c[0], 1, 1, &got).status()));
  ASSERT_OK(SendString(c[2], 0, "fine"));
  ASSERT_TRUE(RecvString(c[0], 2, 4, &got).ok());
  EXPECT_EQ(got, "fine");
  ASSERT_OK(SendString(c[0], 2, "back"));
  ASSERT_TRUE(RecvString(c[2], 0, 4, &got).ok());
  EXPECT_EQ(got, "back");
}

TEST(DataPlaneTest, ASenderShutDownMidMessageLeavesTheReceiverUnavailable) {
  Cluster c;
  ASSERT_OK(c.Start(2));
  const std::string big = Pattern(size_t{64} << 20, 2);
  auto blocked = c.Async([&] { return SendString(c[0], 1, big); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // part of it is in flight by now
  c[0].Shutdown();
  absl::Status s = Get(blocked);
  EXPECT_TRUE(absl::IsCancelled(s)) << s;
  std::string got;
  s = RecvString(c[1], 0, big.size(), &got).status();
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("from host 0"));
}

TEST(DataPlaneTest, ShutdownUnblocksRecvSendAndConnect) {
  Cluster c;
  ASSERT_OK(c.Start(2));
  std::string got;
  auto recv = c.Async([&] { return RecvString(c[0], 1, 5, &got).status(); });
  const std::string big = Pattern(size_t{64} << 20, 3);
  auto send = c.Async([&] { return SendString(c[0], 1, big); });  // host 1 never reads
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  c[0].Shutdown();
  c[0].Shutdown();  // idempotent
  absl::Status r = Get(recv), s = Get(send);
  EXPECT_TRUE(absl::IsCancelled(r)) << r;
  EXPECT_TRUE(absl::IsCancelled(s)) << s;
  EXPECT_TRUE(absl::IsCancelled(SendString(c[0], 1, "x")));
  EXPECT_TRUE(absl::IsCancelled(RecvString(c[0], 1, 1, &got).status()));

  // A Connect waiting for a host that never dials in.
  Cluster d;
  ASSERT_OK(d.Listen(2));
  auto connect = d.Async([&] { return d[0].Connect(d.Addresses()); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  d[0].Shutdown();
  absl::Status cs = Get(connect);
  EXPECT_TRUE(absl::IsCancelled(cs)) << cs;
}

TEST(DataPlaneTest, ConnectTimesOutNamingTheHostsThatNeverDialedIn) {
  DataPlane::Options options = TestOptions();
  // Long enough for hosts 0 and 1 to reach everyone even on a loaded machine.
  options.connect_timeout = absl::Seconds(1);
  Cluster c;
  ASSERT_OK(c.Listen(3, options));
  // Host 2 listens (and acks the others' hellos) but never calls Connect.
  const auto start = std::chrono::steady_clock::now();
  auto connect0 = c.Async([&] { return c[0].Connect(c.Addresses()); });
  absl::Status s1 = c[1].Connect(c.Addresses());
  absl::Status s0 = Get(connect0);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  for (const absl::Status& s : {s0, s1}) {
    EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
    EXPECT_THAT(s.message(), HasSubstr("not dialed in by host(s) 2"));
    EXPECT_THAT(s.message(), ::testing::Not(HasSubstr("could not reach")));
  }
  EXPECT_TRUE(absl::IsFailedPrecondition(SendString(c[0], 1, "x")));
}

TEST(DataPlaneTest, ConnectTimesOutNamingAHostNobodyListensFor) {
  DataPlane::Options options = TestOptions();
  options.connect_timeout = absl::Milliseconds(300);
  Cluster c;
  ASSERT_OK(c.Listen(2, options));
  std::string closed_address;
  const int fd = ListenRaw(&closed_address, /*listen_too=*/false);  // nothing listens there
  ASSERT_GE(fd, 0);
  absl::Status s = c[0].Connect({c[0].address(), closed_address});
  close(fd);
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_THAT(s.message(), AllOf(HasSubstr("could not reach host 1 at " + closed_address), HasSubstr("refused"),
                                 HasSubstr("not dialed in by host(s) 1")));
}

// A host process killed outright (no Shutdown): the survivors' transfers
// with it fail, and theirs with each other go on.
TEST(DataPlaneTest, AKilledHostProcessFailsOnlyTransfersWithIt) {
  int to_child[2], from_child[2];
  ASSERT_EQ(pipe(to_child), 0);
  ASSERT_EQ(pipe(from_child), 0);
  // Forked before this process makes any plane (no threads to lose).
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // Host 2: tells its address, learns the others', connects, then echoes
    // host 0's messages until killed.
    close(to_child[1]);
    close(from_child[0]);
    auto plane = DataPlane::Listen(2, 3, TestOptions());
    if (!plane.ok()) _exit(2);
    const std::string mine = (*plane)->address() + "\n";
    if (write(from_child[1], mine.data(), mine.size()) != static_cast<ssize_t>(mine.size())) _exit(3);
    std::string theirs;
    char ch;
    while (read(to_child[0], &ch, 1) == 1 && ch != '\0') theirs.push_back(ch);
    std::vector<std::string> addresses = absl::StrSplit(theirs, '\n', absl::SkipEmpty());
    addresses.push_back((*plane)->address());
    if (addresses.size() != 3 || !(*plane)->Connect(addresses).ok()) _exit(4);
    for (;;) {
      char buffer[8];
      const iovec piece = {buffer, sizeof(buffer)};
      if (!(*plane)->Recv(0, {&piece, 1}).ok() || !(*plane)->Send(0, {&piece, 1}).ok()) _exit(5);
    }
  }
  struct Reaper {
    pid_t pid;
    ~Reaper() {
      if (pid > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, nullptr, 0);
      }
    }
  } reaper{pid};
  close(to_child[0]);
  close(from_child[1]);
  std::string child_address;
  char ch;
  while (read(from_child[0], &ch, 1) == 1 && ch != '\n') child_address.push_back(ch);
  close(from_child[0]);
  ASSERT_FALSE(child_address.empty());

  Cluster c;
  ASSERT_OK(c.Listen(3));
  c.planes.pop_back();  // host 2 lives in the child
  const std::string ours = c[0].address() + "\n" + c[1].address() + "\n" + std::string(1, '\0');
  ASSERT_EQ(write(to_child[1], ours.data(), ours.size()), static_cast<ssize_t>(ours.size()));
  close(to_child[1]);
  const std::vector<std::string> addresses = {c[0].address(), c[1].address(), child_address};
  auto connect1 = c.Async([&] { return c[1].Connect(addresses); });
  ASSERT_OK(c[0].Connect(addresses));
  ASSERT_OK(Get(connect1));

  // The child echoes.
  std::string got;
  ASSERT_OK(SendString(c[0], 2, "echo me!"));
  ASSERT_TRUE(RecvString(c[0], 2, 8, &got).ok());
  EXPECT_EQ(got, "echo me!");

  // Kill it, with host 0 blocked receiving from it.
  auto recv = c.Async([&] {
    std::string echo;
    return RecvString(c[0], 2, 8, &echo).status();
  });
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  ASSERT_EQ(waitpid(pid, nullptr, 0), pid);
  reaper.pid = -1;
  absl::Status r = Get(recv);
  EXPECT_TRUE(absl::IsUnavailable(r)) << r;
  EXPECT_THAT(r.message(), HasSubstr("from host 2"));
  r = RecvString(c[1], 2, 8, &got).status();
  EXPECT_TRUE(absl::IsUnavailable(r)) << r;
  EXPECT_THAT(r.message(), HasSubstr("from host 2"));
  // Sends to it fail too (at the latest once the FIN, or the reset answering
  // one last write, is in: allow a few tries).
  for (int h : {0, 1}) {
    absl::Status s;
    for (int i = 0; i < 200 && s.ok(); ++i) {
      s = SendString(c[h], 2, "anyone?");
      if (s.ok()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_TRUE(absl::IsUnavailable(s)) << s;
    EXPECT_THAT(s.message(), HasSubstr("to host 2"));
  }

  // Hosts 0 and 1 go on.
  const std::string big = Pattern(4 << 20, 4);
  auto sent = c.Async([&] { return SendString(c[0], 1, big); });
  ASSERT_OK(SendString(c[1], 0, "alive"));
  ASSERT_TRUE(RecvString(c[1], 0, big.size(), &got).ok());
  EXPECT_TRUE(got == big);
  ASSERT_OK(Get(sent));
  ASSERT_TRUE(RecvString(c[0], 1, 5, &got).ok());
  EXPECT_EQ(got, "alive");
}

// ---------------------------------------------------------------------------
// Replacement hosts: absent peers, ReplacePeer

// Keys by pair (keys[a][b] == keys[b][a]), as a control plane hands them out.
using KeyTable = std::vector<std::vector<std::string>>;
KeyTable FreshKeys(int n) {
  KeyTable keys(n, std::vector<std::string>(n));
  for (int a = 0; a < n; ++a) {
    for (int b = a + 1; b < n; ++b) keys[a][b] = keys[b][a] = FreshNonce();
  }
  return keys;
}
// New keys for every pair with `host` (a new process of it); the others'
// stay.
void RenewKeys(KeyTable& keys, int host) {
  for (int h = 0; h < static_cast<int>(keys.size()); ++h) {
    if (h != host) keys[h][host] = keys[host][h] = FreshNonce();
  }
}

absl::StatusOr<std::unique_ptr<DataPlane>> ListenWithKeys(int host, const KeyTable& keys) {
  DataPlane::Options options = TestOptions();
  options.secret = "";
  options.peer_keys = keys[host];
  return DataPlane::Listen(host, static_cast<int>(keys.size()), options);
}

// A cluster of `keys.size()` planes with peer keys, listening.
absl::Status ListenWithKeys(Cluster& c, const KeyTable& keys) {
  for (int h = 0; h < static_cast<int>(keys.size()); ++h) {
    absl::StatusOr<std::unique_ptr<DataPlane>> plane = ListenWithKeys(h, keys);
    if (!plane.ok()) return plane.status();
    c.planes.push_back(*std::move(plane));
  }
  return absl::OkStatus();
}

// One message each way between a and b, each received and checked.
absl::Status Exchange(DataPlane& a, DataPlane& b, const std::string& tag) {
  const std::string ab = absl::StrCat(tag, ": ", a.host_id(), " to ", b.host_id());
  const std::string ba = absl::StrCat(tag, ": ", b.host_id(), " to ", a.host_id());
  if (absl::Status s = SendString(a, b.host_id(), ab); !s.ok()) return s;
  if (absl::Status s = SendString(b, a.host_id(), ba); !s.ok()) return s;
  std::string got;
  if (absl::StatusOr<uint8_t> r = RecvString(b, a.host_id(), ab.size(), &got); !r.ok()) return r.status();
  if (got != ab) return absl::DataLossError(absl::StrCat("got '", got, "' for '", ab, "'"));
  if (absl::StatusOr<uint8_t> r = RecvString(a, b.host_id(), ba.size(), &got); !r.ok()) return r.status();
  if (got != ba) return absl::DataLossError(absl::StrCat("got '", got, "' for '", ba, "'"));
  return absl::OkStatus();
}

// Waits (at most kWait) until `plane` says a ReplacePeer of `peer` is under
// way: a Send to it fails so. The Send is to a peer that is lost, so it
// carries nothing anywhere.
bool ReplacementUnderWay(DataPlane& plane, int peer) {
  const auto deadline = std::chrono::steady_clock::now() + kWait;
  while (std::chrono::steady_clock::now() < deadline) {
    const absl::Status s = plane.Send(peer, {});
    if (absl::IsUnavailable(s) && absl::StrContains(s.message(), "ReplacePeer is connecting")) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}

// A loopback address where nobody listens (connections are refused), kept
// so while the returned socket is open.
int NobodyAt(std::string* address) { return ListenRaw(address, /*listen_too=*/false); }

TEST(DataPlaneReplacementTest, AnAbsentPeerIsNotWaitedForAndItsTransfersFailAtOnce) {
  Cluster c;
  ASSERT_OK(c.Listen(3));
  // Host 2 is lost before the cluster connects: no plane of it, no address.
  c.planes[2].reset();
  const std::vector<std::string> addresses = {c[0].address(), c[1].address(), ""};
  auto connect1 = c.Async([&] { return c[1].Connect(addresses); });
  ASSERT_OK(c[0].Connect(addresses));
  ASSERT_OK(Get(connect1));
  ASSERT_OK(Exchange(c[0], c[1], "without host 2"));
  std::string got;
  for (int h : {0, 1}) {
    for (const absl::Status& s : {SendString(c[h], 2, "x"), RecvString(c[h], 2, 1, &got).status(),
                                  c[h].RecvHeader(2).status()}) {
      EXPECT_TRUE(absl::IsUnavailable(s)) << s;
      EXPECT_THAT(s.message(), HasSubstr("host 2 is not connected (lost)"));
    }
  }
  // A hello claiming host 2 is refused before any proof, for retry
  // (status 5): host 0 is not expecting host 2 yet.
  const ByHand early = DialByHand(c[0].address(), 2, nullptr);
  EXPECT_EQ(early.challenge, Challenge(0, 5));
  EXPECT_TRUE(early.closed);

  // Then a process of host 2 comes; the others replace the absent host with
  // it (the cluster's secret: no new key).
  absl::StatusOr<std::unique_ptr<DataPlane>> two = DataPlane::Listen(2, 3, TestOptions());
  ASSERT_TRUE(two.ok()) << two.status();
  c.planes[2] = *std::move(two);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  auto replace0 = c.Async([&] { return c[0].ReplacePeer(2, c[2].address(), "", deadline); });
  auto replace1 = c.Async([&] { return c[1].ReplacePeer(2, c[2].address(), "", deadline); });
  ASSERT_OK(c[2].Connect(c.Addresses()));
  ASSERT_OK(Get(replace0));
  ASSERT_OK(Get(replace1));
  ASSERT_OK(Exchange(c[0], c[2], "with host 2"));
  ASSERT_OK(Exchange(c[1], c[2], "with host 2"));
  ASSERT_OK(Exchange(c[0], c[1], "still"));
}

// Hosts 0 and 1 exchange messages throughout (one sending and one
// receiving thread each way) while host 2 dies and a new process replaces
// it, with new keys for the pairs with host 2. The new process's Connect
// starts before the survivors' ReplacePeer calls (its hellos are refused
// for retry until they start) or after (they dial it while its plane only
// listens): either order connects.
class ReplaceHostTest : public ::testing::TestWithParam<bool> {};

TEST_P(ReplaceHostTest, ANewProcessTakesTheLostHostsPlace) {
  const bool new_process_first = GetParam();
  KeyTable keys = FreshKeys(3);
  Cluster c;
  ASSERT_OK(ListenWithKeys(c, keys));
  ASSERT_OK(c.Connect());
  for (int a = 0; a < 3; ++a) {
    for (int b = a + 1; b < 3; ++b) ASSERT_OK(Exchange(c[a], c[b], "before"));
  }

  constexpr int kMessages = 300;
  std::atomic<bool> replaced{false};
  auto send_all = [&](int from, int to) {
    // Keeps sending until the replacement is done, at least kMessages.
    int i = 0;
    for (; i < kMessages || !replaced.load(); ++i) {
      if (absl::Status s = SendString(c[from], to, Pattern(i % 200, from * 100000 + i)); !s.ok()) return s;
      if (i >= kMessages) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    // The count, so that the receiver knows when to stop.
    const uint32_t n = static_cast<uint32_t>(i);
    const iovec count = Piece(&n, sizeof(n));
    return c[from].Send(to, {&count, 1}, /*flag=*/1);
  };
  auto recv_all = [&](int at, int from) {
    for (int i = 0;; ++i) {
      std::string got(i % 200, '\0');
      const iovec piece = Piece(got.data(), got.size());
      std::optional<std::string> other;
      absl::StatusOr<uint8_t> flag = c[at].Recv(from, {&piece, 1}, &other);
      if (!flag.ok()) return flag.status();
      if (*flag == 1) {
        uint32_t n = 0;
        if (!other.has_value() || other->size() != sizeof(n)) return absl::DataLossError("a bad count");
        std::memcpy(&n, other->data(), sizeof(n));
        if (n != static_cast<uint32_t>(i)) return absl::DataLossError(absl::StrCat(n, " sent, ", i, " received"));
        return absl::OkStatus();
      }
      if (other.has_value() || got != Pattern(i % 200, from * 100000 + i)) {
        return absl::DataLossError(absl::StrCat("message ", i, " from ", from, " to ", at, " differs"));
      }
    }
  };
  auto sent01 = c.Async([&] { return send_all(0, 1); });
  auto sent10 = c.Async([&] { return send_all(1, 0); });
  auto got01 = c.Async([&] { return recv_all(1, 0); });
  auto got10 = c.Async([&] { return recv_all(0, 1); });

  // Host 2's process dies; the survivors are told.
  c.planes[2].reset();
  c[0].ShutdownPeer(2);
  c[1].ShutdownPeer(2);
  std::string got;
  EXPECT_TRUE(absl::IsUnavailable(RecvString(c[0], 2, 1, &got).status()));

  RenewKeys(keys, 2);
  absl::StatusOr<std::unique_ptr<DataPlane>> two = ListenWithKeys(2, keys);
  ASSERT_TRUE(two.ok()) << two.status();
  c.planes[2] = *std::move(two);
  const std::vector<std::string> addresses = c.Addresses();
  std::future<absl::Status> connect2;
  if (new_process_first) {
    connect2 = c.Async([&] { return c[2].Connect(addresses); });
    // Long enough that its first hellos are refused (not expected yet).
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  auto replace0 = c.Async([&] { return c[0].ReplacePeer(2, addresses[2], keys[0][2], deadline); });
  auto replace1 = c.Async([&] { return c[1].ReplacePeer(2, addresses[2], keys[1][2], deadline); });
  if (!new_process_first) {
    ASSERT_TRUE(ReplacementUnderWay(c[0], 2));
    ASSERT_TRUE(ReplacementUnderWay(c[1], 2));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // they have dialed it, most likely
    connect2 = c.Async([&] { return c[2].Connect(addresses); });
  }
  ASSERT_OK(Get(connect2));
  ASSERT_OK(Get(replace0));
  ASSERT_OK(Get(replace1));
  replaced = true;

  ASSERT_OK(Exchange(c[2], c[0], "after"));
  ASSERT_OK(Exchange(c[2], c[1], "after"));
  // Big ones too, both ways at once.
  const std::string big = Pattern(8 << 20, 2);
  auto big20 = c.Async([&] { return SendString(c[2], 0, big); });
  auto big02 = c.Async([&] { return SendString(c[0], 2, big); });
  std::string at0, at2;
  ASSERT_TRUE(RecvString(c[0], 2, big.size(), &at0).ok());
  ASSERT_TRUE(RecvString(c[2], 0, big.size(), &at2).ok());
  EXPECT_TRUE(at0 == big && at2 == big);
  ASSERT_OK(Get(big20));
  ASSERT_OK(Get(big02));
  // Hosts 0 and 1 never broke: every message of theirs arrived, in order.
  ASSERT_OK(Get(sent01));
  ASSERT_OK(Get(sent10));
  ASSERT_OK(Get(got01));
  ASSERT_OK(Get(got10));
  ASSERT_OK(Exchange(c[0], c[1], "after"));
}

INSTANTIATE_TEST_SUITE_P(BothOrders, ReplaceHostTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? std::string("NewProcessFirst") : std::string("NewProcessLast");
                         });

// Once ReplacePeer has started, the host's hellos must prove the new key: a
// stale process of it (with the old key) is refused, a real plane with
// PermissionDenied. Before, its hellos are refused for retry.
TEST(DataPlaneReplacementTest, AProcessWithTheOldKeyIsRefusedOnceReplacementStarted) {
  KeyTable keys = FreshKeys(2);
  const KeyTable old_keys = keys;
  Cluster c;
  ASSERT_OK(ListenWithKeys(c, keys));
  ASSERT_OK(c.Connect());
  c.planes[1].reset();
  c[0].ShutdownPeer(1);
  RenewKeys(keys, 1);
  auto proof_with = [](const std::string& key) {
    return [key](const std::string& ours, const std::string& theirs) {
      return ProofMessage(key, ProofBy::kDialer, DataTranscript(1, 0, ours, theirs));
    };
  };
  // Lost, not being replaced: refused at the hello, whatever the key.
  for (const std::string& key : {keys[1][0], old_keys[1][0]}) {
    const ByHand early = DialByHand(c[0].address(), 1, proof_with(key));
    EXPECT_EQ(early.challenge, Challenge(0, 5));
    EXPECT_EQ(early.rest, "");
  }

  absl::StatusOr<std::unique_ptr<DataPlane>> fresh = ListenWithKeys(1, keys);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  c.planes.push_back(*std::move(fresh));  // c[2] is host 1's new process
  auto replace = c.Async(
      [&] { return c[0].ReplacePeer(1, c[2].address(), keys[0][1], absl::Now() + absl::Seconds(10)); });
  // A stale process of host 1 dials at the same time: retried while not
  // expected, then refused for its proof.
  absl::StatusOr<std::unique_ptr<DataPlane>> stale = ListenWithKeys(1, old_keys);
  ASSERT_TRUE(stale.ok()) << stale.status();
  absl::Status refused = (*stale)->Connect({c[0].address(), (*stale)->address()});
  EXPECT_TRUE(absl::IsPermissionDenied(refused)) << refused;
  EXPECT_THAT(refused.message(), AllOf(HasSubstr("host 0 at " + c[0].address()), HasSubstr("refused our proof")));
  const ByHand late = DialByHand(c[0].address(), 1, proof_with(old_keys[1][0]));
  EXPECT_EQ(late.challenge.substr(0, 8), "pwdp-ch\n");
  EXPECT_EQ(AnswerStatus(late.challenge), 0u);
  EXPECT_EQ(late.rest, Ack(0, 1));

  // The new process connects.
  ASSERT_OK(c[2].Connect({c[0].address(), c[2].address()}));
  ASSERT_OK(Get(replace));
  ASSERT_OK(Exchange(c[0], c[2], "new"));
  // Now host 1 is connected in good standing: a second connection proving
  // the new key is refused for good, as before any replacement.
  const ByHand duplicate = DialByHand(c[0].address(), 1, proof_with(keys[1][0]));
  EXPECT_EQ(duplicate.rest, Ack(0, 3));
  ASSERT_OK(Exchange(c[0], c[2], "still"));
}

TEST(DataPlaneReplacementTest, AReplacementThatTimesOutLeavesTheOthersWorkingAndCanBeRetried) {
  KeyTable keys = FreshKeys(3);
  Cluster c;
  ASSERT_OK(ListenWithKeys(c, keys));
  ASSERT_OK(c.Connect());
  c.planes[2].reset();
  c[0].ShutdownPeer(2);
  c[1].ShutdownPeer(2);
  RenewKeys(keys, 2);
  std::string nobody;
  const int nobody_fd = NobodyAt(&nobody);
  ASSERT_GE(nobody_fd, 0);

  const auto start = std::chrono::steady_clock::now();
  auto replace = c.Async(
      [&] { return c[0].ReplacePeer(2, nobody, keys[0][2], absl::Now() + absl::Milliseconds(300)); });
  ASSERT_TRUE(ReplacementUnderWay(c[0], 2));
  // Meanwhile: a second replacement of the same host is refused, and host 0
  // and 1 carry on.
  absl::Status twice = c[0].ReplacePeer(2, nobody, keys[0][2], absl::Now() + absl::Seconds(1));
  ASSERT_OK(Exchange(c[0], c[1], "during"));
  absl::Status s = Get(replace);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_TRUE(absl::IsFailedPrecondition(twice)) << twice;
  EXPECT_THAT(twice.message(), HasSubstr("under way"));
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_THAT(s.message(), AllOf(HasSubstr("could not reach host 2 at " + nobody), HasSubstr("refused"),
                                 HasSubstr("host 2 (at " + nobody + ") has not dialed in")));
  // Host 2 is lost again, until a replacement succeeds.
  std::string got;
  absl::Status send = SendString(c[0], 2, "x");
  EXPECT_TRUE(absl::IsUnavailable(send)) << send;
  EXPECT_THAT(send.message(), HasSubstr("host 2 is not connected (lost)"));
  EXPECT_TRUE(absl::IsUnavailable(RecvString(c[0], 2, 1, &got).status()));
  EXPECT_EQ(DialByHand(c[0].address(), 2, nullptr).challenge, Challenge(0, 5));
  ASSERT_OK(Exchange(c[0], c[1], "after the timeout"));
  close(nobody_fd);

  // The next try, with a process that is there, succeeds.
  absl::StatusOr<std::unique_ptr<DataPlane>> two = ListenWithKeys(2, keys);
  ASSERT_TRUE(two.ok()) << two.status();
  c.planes[2] = *std::move(two);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  auto replace0 = c.Async([&] { return c[0].ReplacePeer(2, c[2].address(), keys[0][2], deadline); });
  auto replace1 = c.Async([&] { return c[1].ReplacePeer(2, c[2].address(), keys[1][2], deadline); });
  ASSERT_OK(c[2].Connect(c.Addresses()));
  ASSERT_OK(Get(replace0));
  ASSERT_OK(Get(replace1));
  ASSERT_OK(Exchange(c[0], c[2], "at last"));
  ASSERT_OK(Exchange(c[1], c[2], "at last"));
}

// Without ShutdownPeer first: ReplacePeer itself ends the transfers blocked
// on the old connections.
TEST(DataPlaneReplacementTest, TransfersBlockedOnTheOldConnectionsFailWhenReplacementStarts) {
  Cluster c;
  ASSERT_OK(c.Start(2));
  const std::string big = Pattern(size_t{64} << 20, 5);
  auto send = c.Async([&] { return SendString(c[0], 1, big); });  // host 1 does not read
  auto header = c.Async([&] { return c[0].RecvHeader(1).status(); });  // nor send
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // blocked by now, most likely; either way works
  std::string nobody;
  const int nobody_fd = NobodyAt(&nobody);
  ASSERT_GE(nobody_fd, 0);
  auto replace = c.Async([&] { return c[0].ReplacePeer(1, nobody, "", absl::Now() + absl::Milliseconds(300)); });
  absl::Status s = Get(send), r = Get(header);
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("host 1"));
  EXPECT_TRUE(absl::IsUnavailable(r)) << r;
  EXPECT_THAT(r.message(), HasSubstr("host 1"));
  absl::Status replaced = Get(replace);
  EXPECT_TRUE(absl::IsDeadlineExceeded(replaced)) << replaced;
  close(nobody_fd);
  // Host 1's side of the old connections ended too.
  std::string got;
  absl::Status at1 = RecvString(c[1], 0, 1, &got).status();
  EXPECT_TRUE(absl::IsUnavailable(at1)) << at1;
}

// Two new processes of host 1, one after the other, each with new keys. The
// second time nobody calls ShutdownPeer first: host 0 sees the old process's
// connection closed by its end, so the new process's early hellos are
// refused for retry rather than as duplicates.
TEST(DataPlaneReplacementTest, TheSameHostIsReplacedTwiceInARow) {
  KeyTable keys = FreshKeys(2);
  Cluster c;
  ASSERT_OK(ListenWithKeys(c, keys));
  ASSERT_OK(c.Connect());
  ASSERT_OK(Exchange(c[0], c[1], "first process"));
  for (int round = 1; round <= 2; ++round) {
    SCOPED_TRACE(round);
    c.planes[1].reset();
    if (round == 1) c[0].ShutdownPeer(1);
    RenewKeys(keys, 1);
    absl::StatusOr<std::unique_ptr<DataPlane>> next = ListenWithKeys(1, keys);
    ASSERT_TRUE(next.ok()) << next.status();
    c.planes[1] = *std::move(next);
    auto connect1 = c.Async([&] { return c[1].Connect(c.Addresses()); });
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ASSERT_OK(c[0].ReplacePeer(1, c[1].address(), keys[0][1], absl::Now() + absl::Seconds(10)));
    ASSERT_OK(Get(connect1));
    ASSERT_OK(Exchange(c[0], c[1], absl::StrCat("process ", round + 1)));
  }
}

TEST(DataPlaneReplacementTest, ShutdownPeerOrShutdownEndsAReplacementUnderWay) {
  Cluster c;
  ASSERT_OK(c.Start(3));
  std::string nobody;
  const int nobody_fd = NobodyAt(&nobody);
  ASSERT_GE(nobody_fd, 0);
  const absl::Time far = absl::Now() + absl::Seconds(60);
  // Host 2's new process is lost too, while host 0 dials it.
  auto replace = c.Async([&] { return c[0].ReplacePeer(2, nobody, "", far); });
  ASSERT_TRUE(ReplacementUnderWay(c[0], 2));
  c[0].ShutdownPeer(2);
  absl::Status s = Get(replace);
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("host 2 was shut down (lost) while being replaced"));
  // Past its dial, waiting for a dial-in that never comes: host 2's new
  // process is a listener by hand, which accepts host 0's dial and never
  // dials back. ShutdownPeer ends that too, and the new connection with it.
  std::string fake_address;
  const int listen_fd = ListenRaw(&fake_address);
  ASSERT_GE(listen_fd, 0);
  auto waiting = c.Async([&] { return c[0].ReplacePeer(2, fake_address, "", far); });
  const int fd = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
  ASSERT_GE(fd, 0);
  const std::string hello = ReadRaw(fd, 48);
  ASSERT_EQ(hello.substr(0, 8), "pwdp-hi\n");
  const std::string ours = FreshNonce();
  ASSERT_TRUE(WriteRaw(fd, Challenge(2, 0, ours)));
  const HandshakeTranscript t = DataTranscript(0, 2, hello.substr(16, 32), ours);
  ASSERT_EQ(ReadRaw(fd, 40), ProofMessage(TestOptions().secret, ProofBy::kDialer, t));
  ASSERT_TRUE(WriteRaw(fd, Ack(2, 0, HandshakeProof(TestOptions().secret, ProofBy::kListener, t))));
  // Host 0 registers the connection once it has checked the ack: most
  // likely by now (either way ShutdownPeer ends the call). Nothing may go
  // on it before ReplacePeer returns.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_THAT(SendString(c[0], 2, "not yet").message(), HasSubstr("ReplacePeer is connecting"));
  c[0].ShutdownPeer(2);
  s = Get(waiting);
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("host 2 was shut down (lost) while being replaced"));
  std::string received;
  EXPECT_TRUE(ClosedWithin(fd, std::chrono::milliseconds(5000), &received));
  EXPECT_EQ(received, "");
  close(fd);
  close(listen_fd);
  ASSERT_OK(Exchange(c[0], c[1], "unharmed"));
  // And Shutdown ends one with Cancelled.
  auto cancelled = c.Async([&] { return c[1].ReplacePeer(2, nobody, "", far); });
  ASSERT_TRUE(ReplacementUnderWay(c[1], 2));
  c[1].Shutdown();
  s = Get(cancelled);
  EXPECT_TRUE(absl::IsCancelled(s)) << s;
  EXPECT_TRUE(absl::IsCancelled(c[1].ReplacePeer(2, nobody, "", far)));
  close(nobody_fd);
}

TEST(DataPlaneReplacementTest, ReplacePeerRejectsBadArgumentsAndCallsOutOfOrder) {
  Cluster c;
  ASSERT_OK(c.Listen(2));
  const absl::Time deadline = absl::Now() + absl::Seconds(1);
  absl::Status early = c[0].ReplacePeer(1, c[1].address(), "", deadline);
  EXPECT_TRUE(absl::IsFailedPrecondition(early)) << early;
  ASSERT_OK(c.Connect());
  for (int peer : {-1, 0, 2}) {
    EXPECT_TRUE(absl::IsInvalidArgument(c[0].ReplacePeer(peer, c[1].address(), "", deadline))) << peer;
  }
  EXPECT_TRUE(absl::IsInvalidArgument(c[0].ReplacePeer(1, "nohost:80", "", deadline)));
  EXPECT_TRUE(absl::IsInvalidArgument(c[0].ReplacePeer(1, "", "", deadline)));
  // None of those touched host 1.
  ASSERT_OK(Exchange(c[0], c[1], "untouched"));
  // A plane with peer keys needs the new process's key.
  Cluster k;
  ASSERT_OK(ListenWithKeys(k, FreshKeys(2)));
  ASSERT_OK(k.Connect());
  absl::Status no_key = k[0].ReplacePeer(1, k[1].address(), "", deadline);
  EXPECT_TRUE(absl::IsInvalidArgument(no_key)) << no_key;
  EXPECT_THAT(no_key.message(), HasSubstr("no key for host 1"));
  ASSERT_OK(Exchange(k[0], k[1], "untouched"));
}

}  // namespace
}  // namespace pw
