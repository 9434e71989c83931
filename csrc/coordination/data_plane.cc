#include "csrc/coordination/data_plane.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <system_error>
#include <utility>

#include "absl/container/inlined_vector.h"
#include "absl/memory/memory.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "csrc/base/status_macros.h"
#include "csrc/coordination/auth.h"

namespace pw {
namespace {

// --- Wire format (see data_plane.h) -----------------------------------------

using data_wire::kAnswerBytes;
using data_wire::kHandshakeBytes;
using data_wire::kHeaderBytes;
using data_wire::kHelloBytes;
using data_wire::kProofMessageBytes;
using data_wire::kVersion;

constexpr char kHelloMagic[8] = {'p', 'w', 'd', 'p', '-', 'h', 'i', '\n'};
constexpr char kChallengeMagic[8] = {'p', 'w', 'd', 'p', '-', 'c', 'h', '\n'};
constexpr char kProofMagic[8] = {'p', 'w', 'd', 'p', '-', 'p', 'f', '\n'};
constexpr char kAckMagic[8] = {'p', 'w', 'd', 'p', '-', 'a', 'k', '\n'};
static_assert(kHelloBytes == 8 + 4 + 4 + kNonceBytes);
static_assert(kProofMessageBytes == 8 + kProofBytes);
// The listener's two answers (challenge, ack) have one size.
static_assert(kAnswerBytes == 8 + 4 + 4 + 4 + kHandshakeBytes);
static_assert(kNonceBytes == kHandshakeBytes && kProofBytes == kHandshakeBytes);
constexpr uint32_t kMessageMarker = 0x4d445750;  // "PWDM" read little-endian
// Where the header's fields are.
constexpr size_t kFlagAt = 4, kSessionAt = 8, kProgramAt = 16, kFirstAt = 24, kBufferAt = 32, kLengthAt = 40;
static_assert(kLengthAt + 8 == kHeaderBytes);

// Why a listener refused (the status of its challenge or ack).
enum AckStatus : uint32_t {
  kAccepted = 0,
  kWrongSecret = 1,      // ack: the proof does not hold (another key)
  kBadHostId = 2,        // challenge: out of range, or the listener's own
  kAlreadyConnected = 3, // ack: that host id has a connection already
  kVersionMismatch = 4,  // challenge: its version field says the listener's
  // Challenge or ack: that host is lost to the listener, which has not
  // started replacing it yet (ReplacePeer), so it cannot tell whether the
  // dialer is its new process (whose key it may not know yet). The only
  // refusal a dialer retries: the listener's ReplacePeer may be about to
  // start. Said before the proof (there is no key to check it against), so
  // an unproven dialer learns that the host is lost.
  kNotExpected = 5,
};

void Put32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void Put64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint32_t Get32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(p[i]) << (8 * i);
  return v;
}
uint64_t Get64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

// `bytes`' first `n` bytes at `out`, zeros past their end.
void PutBytes(uint8_t* out, absl::string_view bytes, size_t n) {
  std::memcpy(out, bytes.data(), std::min(bytes.size(), n));
}

// Whether the first `n` bytes of `in` (at most its size) are those of `magic`.
bool MagicSoFar(absl::Span<const uint8_t> in, const char (&magic)[8]) {
  return in.empty() || std::memcmp(in.data(), magic, std::min<size_t>(in.size(), 8)) == 0;
}

const char (&AnswerMagic(data_wire::AnswerKind kind))[8] {
  return kind == data_wire::AnswerKind::kChallenge ? kChallengeMagic : kAckMagic;
}

// --- Limits ---------------------------------------------------------------

// Hellos in progress on the accept thread. A flood of connections that never
// finish their hello evicts the oldest first: a real peer finishes within a
// round trip, so it is never the oldest for long.
constexpr size_t kMaxPendingHellos = 64;
// Scratch for draining a message whose size the receiver did not expect:
// fixed, whatever length the wire claims.
constexpr size_t kDrainBytes = 64 << 10;
// Retry backoff of a dial that was refused or dropped.
constexpr absl::Duration kFirstBackoff = absl::Milliseconds(10);
constexpr absl::Duration kMaxBackoff = absl::Milliseconds(500);
// When accept() runs out of descriptors or memory, the listening socket stays
// readable; pause accepting instead of spinning.
constexpr absl::Duration kAcceptPause = absl::Milliseconds(100);
// TCP keepalive on established connections (see "Dead-peer detection").
constexpr int kKeepIdleSeconds = 10;
constexpr int kKeepIntervalSeconds = 5;
constexpr int kKeepCount = 3;

// --- Helpers --------------------------------------------------------------

std::string ErrnoText(int err) { return std::system_category().message(err); }

// `deadline` on the steady clock, for CondVar::WaitUntil; a far one (an
// infinite one) a year from now, which no chrono arithmetic overflows.
std::chrono::steady_clock::time_point SteadyDeadline(absl::Time deadline) {
  const absl::Duration left = std::clamp(deadline - absl::Now(), absl::ZeroDuration(), absl::Hours(24 * 365));
  return std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(left);
}

// poll()'s timeout for waiting from `now` until `until`: -1 for never,
// otherwise milliseconds rounded up (so the deadline has passed on wake-up).
int PollTimeoutMs(absl::Time now, absl::Time until) {
  if (until == absl::InfiniteFuture()) return -1;
  if (until <= now) return 0;
  const int64_t ms = absl::ToInt64Milliseconds(absl::Ceil(until - now, absl::Milliseconds(1)));
  return static_cast<int>(std::min<int64_t>(ms, INT_MAX));
}

struct SocketAddress {
  sockaddr_storage storage{};
  socklen_t length = 0;
  int family() const { return storage.ss_family; }
  const sockaddr* get() const { return reinterpret_cast<const sockaddr*>(&storage); }
};

// A numeric IPv4 or IPv6 address and a port.
absl::StatusOr<SocketAddress> ParseIp(const std::string& ip, uint16_t port) {
  SocketAddress address;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&address.storage);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&address.storage);
  if (inet_pton(AF_INET, ip.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(port);
    address.length = sizeof(sockaddr_in);
  } else if (inet_pton(AF_INET6, ip.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(port);
    address.length = sizeof(sockaddr_in6);
  } else {
    return absl::InvalidArgumentError(absl::StrCat("'", ip, "' is not a numeric IPv4 or IPv6 address"));
  }
  return address;
}

// "ip:port" or "[ipv6]:port", as address() makes them.
absl::StatusOr<SocketAddress> ParseAddress(absl::string_view text) {
  const size_t colon = text.rfind(':');
  if (colon == absl::string_view::npos) return absl::InvalidArgumentError("no ':port'");
  absl::string_view ip = text.substr(0, colon);
  uint32_t port = 0;
  if (!absl::SimpleAtoi(text.substr(colon + 1), &port) || port == 0 || port > 65535) {
    return absl::InvalidArgumentError("bad port");
  }
  if (ip.size() >= 2 && ip.front() == '[' && ip.back() == ']') ip = ip.substr(1, ip.size() - 2);
  return ParseIp(std::string(ip), static_cast<uint16_t>(port));
}

std::string FormatAddress(const SocketAddress& address) {
  char ip[INET6_ADDRSTRLEN] = {};
  if (address.family() == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(&address.storage);
    inet_ntop(AF_INET, &v4->sin_addr, ip, sizeof(ip));
    return absl::StrCat(ip, ":", ntohs(v4->sin_port));
  }
  const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&address.storage);
  inet_ntop(AF_INET6, &v6->sin6_addr, ip, sizeof(ip));
  return absl::StrCat("[", ip, "]:", ntohs(v6->sin6_port));
}

// A connection that finished its handshake becomes blocking (Recv blocks in
// recvmsg; Send asks for MSG_DONTWAIT per call), sends small messages at
// once (no Nagle delay), and probes an idle peer.
absl::Status ConfigureConnection(int fd) {
  const int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) < 0) {
    return absl::InternalError(absl::StrCat("fcntl: ", ErrnoText(errno)));
  }
  const int one = 1;
  const std::array<std::pair<int, int>, 4> options = {{{IPPROTO_TCP, TCP_NODELAY},
                                                       {IPPROTO_TCP, TCP_KEEPIDLE},
                                                       {IPPROTO_TCP, TCP_KEEPINTVL},
                                                       {IPPROTO_TCP, TCP_KEEPCNT}}};
  const std::array<int, 4> values = {one, kKeepIdleSeconds, kKeepIntervalSeconds, kKeepCount};
  for (size_t i = 0; i < options.size(); ++i) {
    if (setsockopt(fd, options[i].first, options[i].second, &values[i], sizeof(int)) < 0) {
      return absl::InternalError(absl::StrCat("setsockopt: ", ErrnoText(errno)));
    }
  }
  if (setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one)) < 0) {
    return absl::InternalError(absl::StrCat("setsockopt(SO_KEEPALIVE): ", ErrnoText(errno)));
  }
  return absl::OkStatus();
}

// Skips `n` bytes of the iovec array [*iov, *iov + *count): drops the pieces
// fully done and trims the first one partly done.
void Advance(iovec** iov, size_t* count, size_t n) {
  while (n > 0 && *count > 0) {
    if (n >= (*iov)->iov_len) {
      n -= (*iov)->iov_len;
      ++*iov;
      --*count;
    } else {
      (*iov)->iov_base = static_cast<uint8_t*>((*iov)->iov_base) + n;
      (*iov)->iov_len -= n;
      n = 0;
    }
  }
}

// Why a connection's peer end is gone, from poll's revents on it.
std::string ClosedText(int fd, short revents) {
  if (revents & POLLERR) {
    int err = 0;
    socklen_t len = sizeof(err);
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err != 0) return ErrnoText(err);
  }
  return "closed by the peer";
}

// Writes all of iov[0, count) (modified as it goes) to `fd` without sleeping
// in the kernel: when the socket is full it waits in poll, which also wakes
// when the peer's end closes (FIN or RST: our peer never writes on this
// connection, so anything readable is its end) or when `wake_fd` fires
// (Shutdown). A FIN alone would not fail a write, hence the check before the
// first write too: a peer that went away since the last message fails this
// Send instead of swallowing its bytes.
// Returns OK, Cancelled (woken), or Unavailable with the reason.
absl::Status WriteAll(int fd, int wake_fd, iovec* iov, size_t count, uint64_t* written) {
  bool check = true;   // poll before writing
  bool full = false;   // the last write found no room
  while (count > 0) {
    if (check) {
      pollfd fds[2] = {{fd, static_cast<short>(POLLRDHUP | (full ? POLLOUT : 0)), 0}, {wake_fd, POLLIN, 0}};
      if (poll(fds, 2, full ? -1 : 0) < 0) {
        if (errno == EINTR) continue;
        return absl::UnavailableError(absl::StrCat("poll: ", ErrnoText(errno)));
      }
      if (fds[1].revents != 0) return absl::CancelledError("shut down");
      if (fds[0].revents & (POLLRDHUP | POLLHUP | POLLERR | POLLIN)) {
        return absl::UnavailableError(ClosedText(fd, fds[0].revents));
      }
      if (full && !(fds[0].revents & POLLOUT)) continue;
      check = false;
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = std::min<size_t>(count, IOV_MAX);
    const ssize_t n = sendmsg(fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        check = full = true;
        continue;
      }
      return absl::UnavailableError(ErrnoText(errno));
    }
    full = false;
    *written += static_cast<uint64_t>(n);
    Advance(&iov, &count, static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

// Reads exactly the bytes of iov[0, count) (modified as it goes) from the
// blocking socket `fd`, sleeping in the kernel until they are all in (or the
// connection ends, or Shutdown shuts the socket's reading side down).
// Returns OK or Unavailable with the reason.
absl::Status ReadAll(int fd, iovec* iov, size_t count, uint64_t* read) {
  while (count > 0) {
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = std::min<size_t>(count, IOV_MAX);
    const ssize_t n = recvmsg(fd, &msg, MSG_WAITALL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::UnavailableError(ErrnoText(errno));
    }
    if (n == 0) return absl::UnavailableError("closed by the peer");
    *read += static_cast<uint64_t>(n);
    Advance(&iov, &count, static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

// Sends the listener's challenge (with its nonce) or ack (with its proof) on
// a connection still in its handshake:
// `bytes` is the nonce or proof, empty for a refusal. 52 bytes always fit
// in a fresh socket's buffer (the dialer sent at most 88 bytes and waits),
// so a short write means the peer is gone.
bool SendAnswer(int fd, data_wire::AnswerKind kind, int host_id, AckStatus status, absl::string_view bytes) {
  const std::array<uint8_t, kAnswerBytes> answer = data_wire::WriteAnswer(
      kind, {.version = kVersion, .host_id = static_cast<uint32_t>(host_id), .status = status, .bytes = std::string(bytes)});
  return send(fd, answer.data(), answer.size(), MSG_DONTWAIT | MSG_NOSIGNAL) == static_cast<ssize_t>(answer.size());
}

// What the proofs between `dialer` and `listener` cover (auth.h).
HandshakeTranscript DataTranscript(uint32_t dialer, uint32_t listener, std::string dialer_nonce,
                                   std::string listener_nonce) {
  return {.plane = "data", .claim = dialer, .listener = listener, .dialer_nonce = std::move(dialer_nonce),
          .listener_nonce = std::move(listener_nonce), .binding = {}};
}

}  // namespace

// ---------------------------------------------------------------------------
// The wire format's bytes (data_wire, data_plane.h)

namespace data_wire {

Progress ReadHello(absl::Span<const uint8_t> in, Hello* hello) {
  in = in.first(std::min(in.size(), kHelloBytes));
  if (!MagicSoFar(in, kHelloMagic)) return Progress::kNotOurs;
  if (in.size() >= 12 && Get32(in.data() + 8) != kVersion) return Progress::kOtherVersion;
  if (in.size() < kHelloBytes) return Progress::kNeedMore;
  hello->version = Get32(in.data() + 8);
  hello->dialer = Get32(in.data() + 12);
  hello->nonce.assign(reinterpret_cast<const char*>(in.data() + 16), kHandshakeBytes);
  return Progress::kWhole;
}

std::array<uint8_t, kHelloBytes> WriteHello(const Hello& hello) {
  std::array<uint8_t, kHelloBytes> out = {};
  std::memcpy(out.data(), kHelloMagic, 8);
  Put32(out.data() + 8, hello.version);
  Put32(out.data() + 12, hello.dialer);
  PutBytes(out.data() + 16, hello.nonce, kHandshakeBytes);
  return out;
}

Progress ReadProof(absl::Span<const uint8_t> in, std::string* proof) {
  in = in.first(std::min(in.size(), kProofMessageBytes));
  if (!MagicSoFar(in, kProofMagic)) return Progress::kNotOurs;
  if (in.size() < kProofMessageBytes) return Progress::kNeedMore;
  proof->assign(reinterpret_cast<const char*>(in.data() + 8), kHandshakeBytes);
  return Progress::kWhole;
}

std::array<uint8_t, kProofMessageBytes> WriteProof(absl::string_view proof) {
  std::array<uint8_t, kProofMessageBytes> out = {};
  std::memcpy(out.data(), kProofMagic, 8);
  PutBytes(out.data() + 8, proof, kHandshakeBytes);
  return out;
}

std::optional<Answer> ReadAnswer(AnswerKind kind, absl::Span<const uint8_t> in) {
  if (in.size() != kAnswerBytes || std::memcmp(in.data(), AnswerMagic(kind), 8) != 0) return std::nullopt;
  Answer answer;
  answer.version = Get32(in.data() + 8);
  answer.host_id = Get32(in.data() + 12);
  answer.status = Get32(in.data() + 16);
  answer.bytes.assign(reinterpret_cast<const char*>(in.data() + 20), kHandshakeBytes);
  return answer;
}

std::array<uint8_t, kAnswerBytes> WriteAnswer(AnswerKind kind, const Answer& answer) {
  std::array<uint8_t, kAnswerBytes> out = {};
  std::memcpy(out.data(), AnswerMagic(kind), 8);
  Put32(out.data() + 8, answer.version);
  Put32(out.data() + 12, answer.host_id);
  Put32(out.data() + 16, answer.status);
  PutBytes(out.data() + 20, answer.bytes, kHandshakeBytes);
  return out;
}

std::optional<DataMessageHeader> ReadHeader(absl::Span<const uint8_t> in) {
  if (in.size() != kHeaderBytes) return std::nullopt;
  const uint8_t* p = in.data();
  if (Get32(p) != kMessageMarker || p[5] != 0 || p[6] != 0 || p[7] != 0) return std::nullopt;
  DataMessageHeader h;
  h.flag = p[kFlagAt];
  h.ids.session = Get64(p + kSessionAt);
  h.ids.program_id = Get64(p + kProgramAt);
  h.ids.first_buffer_id = Get64(p + kFirstAt);
  h.ids.buffer_id = Get64(p + kBufferAt);
  h.length = Get64(p + kLengthAt);
  return h;
}

std::array<uint8_t, kHeaderBytes> WriteHeader(const DataMessageHeader& header) {
  std::array<uint8_t, kHeaderBytes> out = {};
  uint8_t* p = out.data();
  Put32(p, kMessageMarker);
  p[kFlagAt] = header.flag;
  Put64(p + kSessionAt, header.ids.session);
  Put64(p + kProgramAt, header.ids.program_id);
  Put64(p + kFirstAt, header.ids.first_buffer_id);
  Put64(p + kBufferAt, header.ids.buffer_id);
  Put64(p + kLengthAt, header.length);
  return out;
}

}  // namespace data_wire

// ---------------------------------------------------------------------------
// Construction

absl::StatusOr<std::unique_ptr<DataPlane>> DataPlane::Listen(int host_id, int num_hosts, Options options) {
  if (num_hosts < 1 || host_id < 0 || host_id >= num_hosts) {
    return absl::InvalidArgumentError(
        absl::StrCat("data plane: host id ", host_id, " is not in a cluster of ", num_hosts, " hosts"));
  }
  if (options.peer_keys.empty() && (options.secret.empty() || options.secret.size() > kMaxSecretBytes)) {
    return absl::InvalidArgumentError(absl::StrCat("data plane host ", host_id, ": the secret has ",
                                                   options.secret.size(), " bytes, not 1 to ", kMaxSecretBytes));
  }
  if (!options.peer_keys.empty()) {
    if (options.peer_keys.size() != static_cast<size_t>(num_hosts)) {
      return absl::InvalidArgumentError(absl::StrCat("data plane host ", host_id, ": ", options.peer_keys.size(),
                                                     " peer keys for ", num_hosts, " hosts"));
    }
    for (int h = 0; h < num_hosts; ++h) {
      if (h != host_id && options.peer_keys[h].empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("data plane host ", host_id, ": the peer key for host ", h, " is empty"));
      }
    }
  }
  absl::StatusOr<SocketAddress> bind_address = ParseIp(options.bind_ip, 0);
  if (!bind_address.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("data plane host ", host_id, ": bind_ip: ", bind_address.status().message()));
  }
  auto unavailable = [&](absl::string_view what) {
    return absl::UnavailableError(absl::StrCat("data plane host ", host_id, ": ", what, " on ", options.bind_ip,
                                               ": ", ErrnoText(errno)));
  };
  // Non-blocking: poll may report a connection that is reset before
  // accept() takes it, and then accept must not block the accept thread.
  const int fd = socket(bind_address->family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return unavailable("socket");
  SocketAddress bound;
  bound.length = sizeof(bound.storage);
  if (bind(fd, bind_address->get(), bind_address->length) < 0 || listen(fd, SOMAXCONN) < 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&bound.storage), &bound.length) < 0) {
    absl::Status status = unavailable("bind/listen");
    close(fd);
    return status;
  }
  const int wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd < 0) {
    absl::Status status = unavailable("eventfd");
    close(fd);
    return status;
  }
  auto plane = absl::WrapUnique(
      new DataPlane(host_id, num_hosts, std::move(options), fd, wake_fd, FormatAddress(bound)));
  DataPlane* raw = plane.get();
  plane->accept_thread_ = std::thread([raw] { raw->AcceptLoop(); });
  return plane;
}

DataPlane::DataPlane(int host_id, int num_hosts, Options options, int listen_fd, int wake_fd, std::string address)
    : host_id_(host_id),
      num_hosts_(num_hosts),
      options_(std::move(options)),
      listen_fd_(listen_fd),
      wake_fd_(wake_fd),
      address_(std::move(address)),
      peers_(new Peer[num_hosts]),
      out_fds_(num_hosts, -1),
      in_fds_(num_hosts, -1),
      keys_(options_.peer_keys.empty() ? std::vector<std::string>(num_hosts, options_.secret) : options_.peer_keys),
      standing_(num_hosts, Standing::kJoining),
      generations_(num_hosts, 0),
      replacing_(num_hosts, false),
      interrupt_fds_(num_hosts, -1) {}

DataPlane::~DataPlane() {
  Shutdown();
  if (accept_thread_.joinable()) accept_thread_.join();
  close(listen_fd_);
  close(wake_fd_);
  MutexLock lock(&mu_);
  for (int fd : out_fds_) {
    if (fd >= 0) close(fd);
  }
  for (int fd : in_fds_) {
    if (fd >= 0) close(fd);
  }
  for (int fd : retired_fds_) close(fd);
}

void DataPlane::ShutdownPeer(int peer) {
  if (peer < 0 || peer >= num_hosts_ || peer == host_id_) return;
  // As Shutdown: shut down, not closed (another thread may be inside a
  // syscall on the descriptor).
  MutexLock lock(&mu_);
  if (out_fds_[peer] >= 0) shutdown(out_fds_[peer], SHUT_RDWR);
  if (in_fds_[peer] >= 0) shutdown(in_fds_[peer], SHUT_RDWR);
  // Before Connect succeeded the standings are Connect's: it takes every
  // peer it was given (one lost meanwhile shows as its shut-down
  // connections, as before there were standings).
  if (!connected_ || standing_[peer] == Standing::kLost) return;
  standing_[peer] = Standing::kLost;
  if (interrupt_fds_[peer] >= 0) {
    // Stops the dialing of the ReplacePeer under way (its eventfd is closed
    // only under mu_, after the call cleared it).
    const uint64_t one = 1;
    if (write(interrupt_fds_[peer], &one, sizeof(one)) < 0) {
      // Cannot fail short of overflow; the standing alone ends the call at
      // its next look.
    }
  }
  changed_.SignalAll();
}

void DataPlane::RetireLocked(int peer) {
  for (std::vector<int>* fds : {&out_fds_, &in_fds_}) {
    int& fd = (*fds)[peer];
    if (fd < 0) continue;
    shutdown(fd, SHUT_RDWR);
    retired_fds_.push_back(fd);
    fd = -1;
  }
  changed_.SignalAll();
}

uint32_t DataPlane::HelloRefusalLocked(int peer) {
  switch (standing_[peer]) {
    case Standing::kLost:
      return kNotExpected;
    case Standing::kConnected: {
      // A connection from it that its end closed: its process is gone (the
      // kernel closed its sockets), though nobody has told us it is lost
      // yet. A new process of it dialing now is early, not a duplicate.
      const int fd = in_fds_[peer];
      if (fd < 0) return kNotExpected;
      pollfd p = {fd, POLLRDHUP, 0};
      if (poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0) return kNotExpected;
      return kAccepted;
    }
    case Standing::kJoining:
    case Standing::kReplacing:
      return kAccepted;
  }
  return kAccepted;
}

std::string DataPlane::Name() const { return absl::StrCat("data plane host ", host_id_); }

void DataPlane::Shutdown() {
  if (shutting_down_.exchange(true)) return;
  // Wakes the accept thread, a dialing Connect and every Send waiting for
  // room (they poll wake_fd_); the eventfd stays readable from now on.
  const uint64_t one = 1;
  if (write(wake_fd_, &one, sizeof(one)) < 0) {
    // Cannot fail for an eventfd short of overflow; the shutdowns below
    // still end every transfer.
  }
  shutdown(listen_fd_, SHUT_RDWR);
  // Shutting the connections down (not closing them: other threads may be
  // inside a syscall on them, and a closed descriptor number can be reused)
  // wakes every Recv blocked in recvmsg, fails every later write, and sends
  // FIN to the peers, whose transfers with us then fail.
  MutexLock lock(&mu_);
  for (int fd : out_fds_) {
    if (fd >= 0) shutdown(fd, SHUT_RDWR);
  }
  for (int fd : in_fds_) {
    if (fd >= 0) shutdown(fd, SHUT_RDWR);
  }
  changed_.SignalAll();
}

// ---------------------------------------------------------------------------
// The accept thread

void DataPlane::AcceptLoop() {
  struct Pending {
    int fd = -1;
    absl::Time deadline;
    enum Stage { kHello, kProof } stage = kHello;
    size_t got = 0;
    uint8_t in[kHelloBytes] = {};  // the hello, then the proof message
    uint32_t dialer = 0;
    std::string dialer_nonce, nonce;
  };
  static_assert(kProofMessageBytes <= kHelloBytes);
  std::vector<Pending> pending;  // oldest first
  std::vector<pollfd> fds;
  absl::Time accept_paused_until = absl::InfinitePast();

  // Reads what has arrived of p's hello or proof and answers it; returns
  // true while the handshake is still under way. Closes the connection, or
  // hands it to the peer table, and returns false otherwise.
  auto advance = [&](Pending& p) -> bool {
    const size_t want = p.stage == Pending::kHello ? kHelloBytes : kProofMessageBytes;
    const ssize_t n = recv(p.fd, p.in + p.got, want - p.got, MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    bool keep_fd = false;
    if (n > 0) {
      p.got += static_cast<size_t>(n);
      // Refuse as early as the bytes allow: garbage or another protocol at
      // once, without waiting for bytes that may never come.
      const absl::Span<const uint8_t> in(p.in, p.got);
      data_wire::Hello hello;
      std::string proof;
      const data_wire::Progress progress =
          p.stage == Pending::kHello ? data_wire::ReadHello(in, &hello) : data_wire::ReadProof(in, &proof);
      if (progress == data_wire::Progress::kNotOurs) {
        // not ours: close without an answer
      } else if (progress == data_wire::Progress::kOtherVersion) {
        SendAnswer(p.fd, data_wire::AnswerKind::kChallenge, host_id_, kVersionMismatch, "");
      } else if (progress == data_wire::Progress::kNeedMore) {
        return true;
      } else if (p.stage == Pending::kHello) {
        // The dialer's claim and nonce: ask our own question.
        p.dialer = hello.dialer;
        absl::StatusOr<std::string> nonce = RandomBytes(kNonceBytes);
        uint32_t refusal = kAccepted;
        if (p.dialer >= static_cast<uint32_t>(num_hosts_) || p.dialer == static_cast<uint32_t>(host_id_)) {
          refusal = kBadHostId;
        } else {
          MutexLock lock(&mu_);
          refusal = HelloRefusalLocked(static_cast<int>(p.dialer));
        }
        if (refusal != kAccepted) {
          SendAnswer(p.fd, data_wire::AnswerKind::kChallenge, host_id_, static_cast<AckStatus>(refusal), "");
        } else if (nonce.ok() && SendAnswer(p.fd, data_wire::AnswerKind::kChallenge, host_id_, kAccepted, *nonce)) {
          p.dialer_nonce = std::move(hello.nonce);
          p.nonce = *std::move(nonce);
          p.stage = Pending::kProof;
          p.got = 0;
          return true;
        }
      } else {
        const int dialer = static_cast<int>(p.dialer);
        const HandshakeTranscript transcript =
            DataTranscript(p.dialer, static_cast<uint32_t>(host_id_), p.dialer_nonce, p.nonce);
        // The key, and whether the dialer is expected, as of now: the
        // standing may have changed since the hello (ShutdownPeer, or
        // ReplacePeer with a new key).
        uint32_t refusal;
        std::string key;
        uint64_t generation;
        {
          MutexLock lock(&mu_);
          refusal = HelloRefusalLocked(dialer);
          key = keys_[dialer];
          generation = generations_[dialer];
        }
        if (refusal != kAccepted) {
          // No key to check the proof against (a new process's, which
          // ReplacePeer has not brought yet): the dialer is to try again.
          SendAnswer(p.fd, data_wire::AnswerKind::kAck, host_id_, static_cast<AckStatus>(refusal), "");
        } else if (!ConstantTimeEquals(proof, HandshakeProof(key, ProofBy::kDialer, transcript))) {
          SendAnswer(p.fd, data_wire::AnswerKind::kAck, host_id_, kWrongSecret, "");
        } else if (absl::Status configured = ConfigureConnection(p.fd); configured.ok()) {
          MutexLock lock(&mu_);
          refusal = HelloRefusalLocked(dialer);
          if (shutting_down_.load()) {
            // closed below
          } else if (generations_[dialer] != generation || refusal != kAccepted) {
            // A ReplacePeer (or ShutdownPeer) came between: the proof was
            // of a key that may no longer be the dialer's. It tries again,
            // and proves the current key or fails.
            SendAnswer(p.fd, data_wire::AnswerKind::kAck, host_id_, kNotExpected, "");
          } else if (standing_[dialer] != Standing::kReplacing && in_fds_[dialer] >= 0) {
            SendAnswer(p.fd, data_wire::AnswerKind::kAck, host_id_, kAlreadyConnected, "");
          } else if (SendAnswer(p.fd, data_wire::AnswerKind::kAck, host_id_, kAccepted,
                                HandshakeProof(key, ProofBy::kListener, transcript))) {
            // Registered only once acked (a dialer that got no ack retries),
            // and atomically with the duplicate check. While replacing, the
            // new process proved the new key: if it dials again, its earlier
            // connection is one it gave up on (nobody uses it before
            // ReplacePeer returns), so the later one wins.
            if (in_fds_[dialer] >= 0) {
              shutdown(in_fds_[dialer], SHUT_RDWR);
              retired_fds_.push_back(in_fds_[dialer]);
            }
            in_fds_[dialer] = p.fd;
            keep_fd = true;
            changed_.SignalAll();
          }
        }
      }
    }
    if (!keep_fd) close(p.fd);
    return false;
  };

  while (!shutting_down_.load()) {
    absl::Time now = absl::Now();
    const bool accepting = now >= accept_paused_until;
    fds.clear();
    fds.push_back({wake_fd_, POLLIN, 0});
    fds.push_back({listen_fd_, static_cast<short>(accepting ? POLLIN : 0), 0});
    absl::Time wake_at = accepting ? absl::InfiniteFuture() : accept_paused_until;
    for (const Pending& p : pending) {
      fds.push_back({p.fd, POLLIN | POLLRDHUP, 0});
      wake_at = std::min(wake_at, p.deadline);
    }
    if (poll(fds.data(), fds.size(), PollTimeoutMs(now, wake_at)) < 0 && errno != EINTR) {
      // Not expected (EFAULT/EINVAL/ENOMEM); do not spin.
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    if (fds[0].revents != 0) break;

    // Hellos first (fds[2 + i] is pending[i]), then new connections.
    now = absl::Now();
    std::vector<Pending> still;
    still.reserve(pending.size());
    for (size_t i = 0; i < pending.size(); ++i) {
      Pending& p = pending[i];
      if (fds[2 + i].revents != 0) {
        if (!advance(p)) continue;
      }
      if (now >= p.deadline) {
        close(p.fd);  // too slow: a stalled or silent peer
        continue;
      }
      still.push_back(p);
    }
    pending.swap(still);

    if (fds[1].revents & POLLIN) {
      // Take what is queued, but a bounded number per round so the hellos
      // in progress keep being served during a flood.
      for (int i = 0; i < 16; ++i) {
        const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
          if (errno == EINTR || errno == ECONNABORTED) continue;
          if (errno != EAGAIN && errno != EWOULDBLOCK) accept_paused_until = now + kAcceptPause;
          break;
        }
        if (pending.size() >= kMaxPendingHellos) {
          close(pending.front().fd);
          pending.erase(pending.begin());
        }
        Pending p;
        p.fd = fd;
        p.deadline = now + options_.handshake_timeout;
        pending.push_back(std::move(p));
      }
    }
  }
  for (const Pending& p : pending) close(p.fd);
}

// ---------------------------------------------------------------------------
// Connect

// One outgoing connection that Connect or ReplacePeer is making: connect,
// send the hello, read the ack. Failures that may pass (refused: the peer is
// not listening yet; dropped before the ack: its hello queue overflowed;
// "not expecting this host yet": its ReplacePeer for us has not started)
// wait `backoff` and start over.
struct DataPlane::Dial {
  int peer = -1;
  std::string address;  // as given, for messages
  SocketAddress socket_address;
  std::string key;  // of the handshakes with `peer`, as of the call's start
  uint64_t generation = 0;  // of the peer's connections that this one joins
  enum State { kWaiting, kConnecting, kAwaitingChallenge, kAwaitingAck, kDone } state = kWaiting;
  int fd = -1;
  absl::Time retry_at = absl::InfinitePast();
  absl::Duration backoff = kFirstBackoff;
  size_t got = 0;  // bytes of `answer`
  uint8_t answer[kAnswerBytes] = {};  // the listener's challenge, then its ack
  std::string nonce;           // ours, in the hello
  std::string listener_nonce;  // its, in the challenge
  std::string last_error = "not dialed";

  std::string Text() const { return absl::StrCat("host ", peer, " at ", address); }

  void RetryLater(absl::Time now, std::string why) {
    if (fd >= 0) close(fd);
    fd = -1;
    state = kWaiting;
    got = 0;
    last_error = std::move(why);
    retry_at = now + backoff;
    backoff = std::min(backoff * 2, kMaxBackoff);
  }
};

absl::Status DataPlane::Connect(const std::vector<std::string>& addresses) {
  if (addresses.size() != static_cast<size_t>(num_hosts_)) {
    return absl::InvalidArgumentError(
        absl::StrCat(Name(), ": Connect got ", addresses.size(), " addresses for ", num_hosts_, " hosts"));
  }
  std::vector<Dial> dials;
  for (int h = 0; h < num_hosts_; ++h) {
    if (h == host_id_ || addresses[h].empty()) continue;  // an empty one: absent
    absl::StatusOr<SocketAddress> address = ParseAddress(addresses[h]);
    if (!address.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(Name(), ": address of host ", h, " '", addresses[h],
                                                     "': ", address.status().message()));
    }
    Dial dial;
    dial.peer = h;
    dial.address = addresses[h];
    dial.socket_address = *address;
    dials.push_back(std::move(dial));
  }
  {
    MutexLock lock(&mu_);
    if (connect_called_) return absl::FailedPreconditionError(absl::StrCat(Name(), ": Connect called twice"));
    connect_called_ = true;
    for (int h = 0; h < num_hosts_; ++h) {
      if (h == host_id_ || !addresses[h].empty()) continue;
      // Absent: lost until replaced. A connection it made before we knew
      // (from a process that is not to be in the cluster) is dropped.
      standing_[h] = Standing::kLost;
      RetireLocked(h);
    }
    for (Dial& d : dials) d.key = keys_[d.peer];
  }
  const absl::Time deadline = absl::Now() + options_.connect_timeout;
  absl::Status dialed = DialAll(dials, deadline);
  for (Dial& d : dials) {
    if (d.fd >= 0) close(d.fd);  // not done: not registered
  }
  return AwaitDialIns(std::move(dialed), deadline);
}

absl::Status DataPlane::DialAll(std::vector<Dial>& dials, absl::Time deadline, int interrupt_fd) {
  // A fresh socket's buffer takes the whole hello at once, so it is sent
  // without waiting (a short write just means another try).
  auto send_hello = [&](Dial& d, absl::Time now) {
    absl::StatusOr<std::string> nonce = RandomBytes(kNonceBytes);
    if (!nonce.ok()) {
      d.RetryLater(now, std::string(nonce.status().message()));
      return;
    }
    d.nonce = *std::move(nonce);
    const std::array<uint8_t, kHelloBytes> hello =
        data_wire::WriteHello({.version = kVersion, .dialer = static_cast<uint32_t>(host_id_), .nonce = d.nonce});
    if (send(d.fd, hello.data(), hello.size(), MSG_DONTWAIT | MSG_NOSIGNAL) != static_cast<ssize_t>(hello.size())) {
      d.RetryLater(now, absl::StrCat("sending the hello: ", ErrnoText(errno)));
    } else {
      d.state = Dial::kAwaitingChallenge;
      d.got = 0;
    }
  };

  // All dials at once, as a state machine on this thread: a peer that never
  // answers costs the others nothing.
  std::vector<pollfd> fds;
  std::vector<Dial*> polled;  // polled[i] is fds[i + 1]
  for (;;) {
    if (shutting_down_.load()) return absl::CancelledError(absl::StrCat(Name(), " is shut down"));
    absl::Time now = absl::Now();
    absl::Time wake_at = deadline;
    bool all_done = true;
    for (Dial& d : dials) {
      if (d.state == Dial::kWaiting && d.retry_at <= now) {
        d.fd = socket(d.socket_address.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (d.fd < 0) {
          d.RetryLater(now, absl::StrCat("socket: ", ErrnoText(errno)));
        } else if (connect(d.fd, d.socket_address.get(), d.socket_address.length) == 0) {
          send_hello(d, now);
        } else if (errno == EINPROGRESS || errno == EINTR) {
          d.state = Dial::kConnecting;
        } else {
          d.RetryLater(now, ErrnoText(errno));
        }
      }
      if (d.state == Dial::kWaiting) wake_at = std::min(wake_at, d.retry_at);
      all_done &= d.state == Dial::kDone;
    }
    if (all_done) return absl::OkStatus();
    if (now >= deadline) {
      std::vector<std::string> missing;
      for (const Dial& d : dials) {
        if (d.state != Dial::kDone) missing.push_back(absl::StrCat(d.Text(), ": ", d.last_error));
      }
      return absl::DeadlineExceededError(absl::StrCat("could not reach ", absl::StrJoin(missing, "; ")));
    }

    fds.clear();
    polled.clear();
    fds.push_back({wake_fd_, POLLIN, 0});
    // Polled always (a negative fd is skipped), so polled[i] is fds[i + 2].
    fds.push_back({interrupt_fd, POLLIN, 0});
    for (Dial& d : dials) {
      if (d.state == Dial::kConnecting || d.state == Dial::kAwaitingChallenge || d.state == Dial::kAwaitingAck) {
        fds.push_back({d.fd, static_cast<short>(d.state == Dial::kConnecting ? POLLOUT : POLLIN), 0});
        polled.push_back(&d);
      }
    }
    if (poll(fds.data(), fds.size(), PollTimeoutMs(now, wake_at)) < 0 && errno != EINTR) {
      return absl::InternalError(absl::StrCat(Name(), ": poll: ", ErrnoText(errno)));
    }
    if (fds[1].revents != 0) {
      return absl::UnavailableError(
          absl::StrCat(Name(), ": host ", dials.front().peer, " was shut down (lost) while being replaced"));
    }
    now = absl::Now();
    for (size_t i = 0; i < polled.size(); ++i) {
      Dial& d = *polled[i];
      if (fds[i + 2].revents == 0) continue;
      if (d.state == Dial::kConnecting) {
        int err = 0;
        socklen_t len = sizeof(err);
        if (getsockopt(d.fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0) err = errno;
        if (err != 0) {
          d.RetryLater(now, ErrnoText(err));
        } else {
          send_hello(d, now);
        }
        continue;
      }
      const ssize_t n = recv(d.fd, d.answer + d.got, kAnswerBytes - d.got, MSG_DONTWAIT);
      if (n < 0) {
        if (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK) d.RetryLater(now, ErrnoText(errno));
      } else if (n == 0) {
        d.RetryLater(now, "connection closed during the handshake");
      } else if ((d.got += static_cast<size_t>(n)) == kAnswerBytes) {
        PW_RETURN_IF_ERROR(d.state == Dial::kAwaitingChallenge ? TakeChallenge(d, now) : TakeAck(d, now));
      }
    }
  }
}

absl::StatusOr<data_wire::Answer> DataPlane::CheckAnswer(const Dial& d, data_wire::AnswerKind kind) {
  auto refused = [&](absl::string_view why) {
    return absl::FailedPreconditionError(absl::StrCat(Name(), ": ", d.Text(), " ", why));
  };
  std::optional<data_wire::Answer> answer = data_wire::ReadAnswer(kind, d.answer);
  if (!answer.has_value()) {
    return refused("answered the hello with something not a data plane's (or of another version)");
  }
  const uint32_t version = answer->version, id = answer->host_id, status = answer->status;
  if (status == kVersionMismatch || version != kVersion) {
    return refused(absl::StrCat("runs data plane version ", version, ", this host version ", kVersion));
  }
  if (id != static_cast<uint32_t>(d.peer)) return refused(absl::StrCat("is the data plane of host ", id));
  switch (status) {
    case kAccepted:
      return *std::move(answer);
    case kWrongSecret:
      return absl::PermissionDeniedError(absl::StrCat(
          Name(), ": ", d.Text(), " refused our proof: different secret (or peer key), or another cluster"));
    case kBadHostId:
      return refused(absl::StrCat("refused host id ", host_id_, " (a different cluster size?)"));
    case kAlreadyConnected:
      return refused(absl::StrCat("already has a connection from host ", host_id_));
    case kNotExpected:
      // Unavailable: the one refusal the caller retries.
      return absl::UnavailableError(absl::StrCat("not expecting host ", host_id_,
                                                 " yet (it takes it as lost and has not started replacing it)"));
    default:
      return refused(absl::StrCat("refused the hello (status ", status, ")"));
  }
}

absl::Status DataPlane::TakeChallenge(Dial& d, absl::Time now) {
  absl::StatusOr<data_wire::Answer> challenge = CheckAnswer(d, data_wire::AnswerKind::kChallenge);
  if (absl::IsUnavailable(challenge.status())) {
    d.RetryLater(now, std::string(challenge.status().message()));
    return absl::OkStatus();
  }
  PW_RETURN_IF_ERROR(challenge.status());
  d.listener_nonce = std::move(challenge->bytes);
  const HandshakeTranscript transcript =
      DataTranscript(static_cast<uint32_t>(host_id_), static_cast<uint32_t>(d.peer), d.nonce, d.listener_nonce);
  const std::array<uint8_t, kProofMessageBytes> proof =
      data_wire::WriteProof(HandshakeProof(d.key, ProofBy::kDialer, transcript));
  // The socket's buffer is as empty as it was for the hello.
  if (send(d.fd, proof.data(), proof.size(), MSG_DONTWAIT | MSG_NOSIGNAL) != static_cast<ssize_t>(proof.size())) {
    d.RetryLater(now, absl::StrCat("sending the proof: ", ErrnoText(errno)));
    return absl::OkStatus();
  }
  d.state = Dial::kAwaitingAck;
  d.got = 0;
  return absl::OkStatus();
}

absl::Status DataPlane::TakeAck(Dial& d, absl::Time now) {
  absl::StatusOr<data_wire::Answer> ack = CheckAnswer(d, data_wire::AnswerKind::kAck);
  if (absl::IsUnavailable(ack.status())) {
    d.RetryLater(now, std::string(ack.status().message()));
    return absl::OkStatus();
  }
  PW_RETURN_IF_ERROR(ack.status());
  // The listener's proof: only a peer that knows the key could answer our
  // nonce with it.
  const HandshakeTranscript transcript =
      DataTranscript(static_cast<uint32_t>(host_id_), static_cast<uint32_t>(d.peer), d.nonce, d.listener_nonce);
  if (!ConstantTimeEquals(ack->bytes, HandshakeProof(d.key, ProofBy::kListener, transcript))) {
    return absl::PermissionDeniedError(absl::StrCat(Name(), ": ", d.Text(),
                                                    " could not prove it knows the cluster's secret (or our peer "
                                                    "key): not a host of this cluster"));
  }
  if (absl::Status configured = ConfigureConnection(d.fd); !configured.ok()) {
    return absl::InternalError(absl::StrCat(Name(), ": ", d.Text(), ": ", configured.message()));
  }
  MutexLock lock(&mu_);
  if (shutting_down_.load()) return absl::CancelledError(absl::StrCat(Name(), " is shut down"));
  if (generations_[d.peer] != d.generation ||
      (standing_[d.peer] != Standing::kJoining && standing_[d.peer] != Standing::kReplacing)) {
    // ShutdownPeer during a ReplacePeer: the new process is lost too.
    return absl::UnavailableError(absl::StrCat(Name(), ": host ", d.peer, " was shut down (lost) while being replaced"));
  }
  out_fds_[d.peer] = d.fd;  // the destructor closes it from now on
  d.fd = -1;
  d.state = Dial::kDone;
  return absl::OkStatus();
}

absl::Status DataPlane::AwaitDialIns(absl::Status dialed, absl::Time deadline) {
  if (!dialed.ok() && !absl::IsDeadlineExceeded(dialed)) return dialed;
  const auto steady_deadline = SteadyDeadline(deadline);
  MutexLock lock(&mu_);
  for (;;) {
    if (shutting_down_.load()) return absl::CancelledError(absl::StrCat(Name(), " is shut down"));
    std::vector<int> missing;
    for (int h = 0; h < num_hosts_; ++h) {
      if (h != host_id_ && standing_[h] == Standing::kJoining && in_fds_[h] < 0) missing.push_back(h);
    }
    if (missing.empty() && dialed.ok()) {
      for (Standing& standing : standing_) {
        if (standing == Standing::kJoining) standing = Standing::kConnected;
      }
      connected_ = true;
      return absl::OkStatus();
    }
    // A dial that timed out reports now, with whoever has not dialed in yet.
    if (!dialed.ok() || std::chrono::steady_clock::now() >= steady_deadline) {
      std::string text =
          absl::StrCat(Name(), ": Connect timed out after ", absl::FormatDuration(options_.connect_timeout), ": ");
      if (!dialed.ok()) absl::StrAppend(&text, dialed.message(), missing.empty() ? "" : "; ");
      if (!missing.empty()) absl::StrAppend(&text, "not dialed in by host(s) ", absl::StrJoin(missing, ", "));
      return absl::DeadlineExceededError(text);
    }
    changed_.WaitUntil(&mu_, steady_deadline);
  }
}

// ---------------------------------------------------------------------------
// ReplacePeer

absl::Status DataPlane::ReplacePeer(int peer, const std::string& address, const std::string& key,
                                    absl::Time deadline) {
  if (peer < 0 || peer >= num_hosts_ || peer == host_id_) {
    return absl::InvalidArgumentError(absl::StrCat(Name(), ": ReplacePeer: no peer host ", peer, " (cluster of ",
                                                   num_hosts_, " hosts, this is host ", host_id_, ")"));
  }
  absl::StatusOr<SocketAddress> socket_address = ParseAddress(address);
  if (!socket_address.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(Name(), ": ReplacePeer: address of host ", peer, " '", address,
                                                   "': ", socket_address.status().message()));
  }
  if (key.empty() && !options_.peer_keys.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        Name(), ": ReplacePeer: no key for host ", peer, " (this plane has peer keys: the new process has its own)"));
  }
  if (shutting_down_.load()) return absl::CancelledError(absl::StrCat(Name(), " is shut down"));
  // ShutdownPeer's way to stop the dialing below at once (a new process
  // that is lost too).
  const int interrupt_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (interrupt_fd < 0) {
    return absl::UnavailableError(absl::StrCat(Name(), ": ReplacePeer: eventfd: ", ErrnoText(errno)));
  }
  Dial dial;
  dial.peer = peer;
  dial.address = address;
  dial.socket_address = *socket_address;
  {
    MutexLock lock(&mu_);
    absl::Status refused;
    if (shutting_down_.load()) {
      refused = absl::CancelledError(absl::StrCat(Name(), " is shut down"));
    } else if (!connected_) {
      refused = absl::FailedPreconditionError(absl::StrCat(Name(), ": ReplacePeer before Connect succeeded"));
    } else if (replacing_[peer]) {
      refused = absl::FailedPreconditionError(
          absl::StrCat(Name(), ": ReplacePeer(", peer, ") while another replacement of host ", peer, " is under way"));
    }
    if (!refused.ok()) {
      close(interrupt_fd);
      return refused;
    }
    // From here on a hello from `peer` must prove the new key, and the old
    // connections are gone: their blocked transfers fail now, and any
    // transfer that read their sockets before finds them shut down (and
    // belongs to an older generation: it cannot mark the new ones broken).
    if (!key.empty()) keys_[peer] = key;
    RetireLocked(peer);
    ++generations_[peer];
    standing_[peer] = Standing::kReplacing;
    replacing_[peer] = true;
    interrupt_fds_[peer] = interrupt_fd;
    dial.key = keys_[peer];
    dial.generation = generations_[peer];
  }
  std::vector<Dial> dials;
  dials.push_back(std::move(dial));
  absl::Status dialed = DialAll(dials, deadline, interrupt_fd);
  if (dials.front().fd >= 0) close(dials.front().fd);  // not done: not registered
  return AwaitReplacement(peer, address, std::move(dialed), deadline);
}

absl::Status DataPlane::AwaitReplacement(int peer, const std::string& address, absl::Status dialed,
                                         absl::Time deadline) {
  const auto steady_deadline = SteadyDeadline(deadline);
  MutexLock lock(&mu_);
  absl::Status status;
  for (;;) {
    if (shutting_down_.load()) {
      status = absl::CancelledError(absl::StrCat(Name(), " is shut down"));
      break;
    }
    if (standing_[peer] != Standing::kReplacing) {
      status = absl::UnavailableError(
          absl::StrCat(Name(), ": host ", peer, " was shut down (lost) while being replaced"));
      break;
    }
    if (!dialed.ok() && !absl::IsDeadlineExceeded(dialed)) {
      status = dialed;
      break;
    }
    const bool dialed_in = in_fds_[peer] >= 0;
    if (dialed.ok() && dialed_in) break;
    // A dial that timed out reports now, with the dial-in if missing too.
    if (!dialed.ok() || std::chrono::steady_clock::now() >= steady_deadline) {
      std::string text = absl::StrCat(Name(), ": ReplacePeer(", peer, ") timed out: ");
      if (!dialed.ok()) absl::StrAppend(&text, dialed.message(), dialed_in ? "" : "; ");
      if (!dialed_in) absl::StrAppend(&text, "host ", peer, " (at ", address, ") has not dialed in");
      status = absl::DeadlineExceededError(text);
      break;
    }
    changed_.WaitUntil(&mu_, steady_deadline);
  }
  if (status.ok()) {
    standing_[peer] = Standing::kConnected;
  } else {
    // Half a pair is no use (nor is one that may prove an outdated key):
    // the peer is lost until another ReplacePeer.
    RetireLocked(peer);
    standing_[peer] = Standing::kLost;
  }
  replacing_[peer] = false;
  close(interrupt_fds_[peer]);
  interrupt_fds_[peer] = -1;
  changed_.SignalAll();
  return status;
}

// ---------------------------------------------------------------------------
// Transfers

absl::StatusOr<DataPlane::Connection> DataPlane::ConnectionFd(int peer, bool outgoing) {
  if (peer < 0 || peer >= num_hosts_ || peer == host_id_) {
    return absl::InvalidArgumentError(absl::StrCat(Name(), ": no peer host ", peer, " (cluster of ", num_hosts_,
                                                   " hosts, this is host ", host_id_, ")"));
  }
  if (shutting_down_.load()) return absl::CancelledError(absl::StrCat(Name(), " is shut down"));
  MutexLock lock(&mu_);
  if (!connected_) return absl::FailedPreconditionError(absl::StrCat(Name(), ": not connected (Connect first)"));
  const int fd = outgoing ? out_fds_[peer] : in_fds_[peer];
  // Not before ReplacePeer is done: a half-made pair is not to be used.
  if (standing_[peer] == Standing::kReplacing) {
    return absl::UnavailableError(
        absl::StrCat(Name(), ": host ", peer, " is not connected (lost; ReplacePeer is connecting its new process)"));
  }
  // Absent, or its connections retired by a failed ReplacePeer. (A peer
  // lost by ShutdownPeer alone keeps its shut-down sockets, which fail the
  // transfer as any broken connection does.)
  if (fd < 0) return absl::UnavailableError(absl::StrCat(Name(), ": host ", peer, " is not connected (lost)"));
  return Connection{fd, generations_[peer]};
}

absl::Status DataPlane::SendGenerationLocked(Peer& p, int peer, uint64_t generation) {
  if (generation == p.send_generation) return absl::OkStatus();
  if (generation < p.send_generation) {
    return absl::UnavailableError(
        absl::StrCat(Name(), ": the connection to host ", peer, " was replaced (ReplacePeer) under this Send"));
  }
  p.send_generation = generation;
  p.send_broken = absl::OkStatus();
  return absl::OkStatus();
}

absl::Status DataPlane::RecvGenerationLocked(Peer& p, int peer, uint64_t generation) {
  if (generation == p.recv_generation) return absl::OkStatus();
  if (generation < p.recv_generation) {
    return absl::UnavailableError(
        absl::StrCat(Name(), ": the connection from host ", peer, " was replaced (ReplacePeer) under this receive"));
  }
  // A header taken from the old connection has no payload on the new one.
  p.recv_generation = generation;
  p.recv_broken = absl::OkStatus();
  p.header_taken = false;
  p.payload_left = 0;
  return absl::OkStatus();
}

absl::Status DataPlane::Send(int peer, absl::Span<const iovec> pieces, uint8_t flag, const MessageIds& ids) {
  PW_ASSIGN_OR_RETURN(const Connection connection, ConnectionFd(peer, /*outgoing=*/true));
  const int fd = connection.fd;
  uint64_t length = 0;
  for (const iovec& piece : pieces) length += piece.iov_len;
  std::array<uint8_t, kHeaderBytes> header = data_wire::WriteHeader({.flag = flag, .ids = ids, .length = length});
  absl::InlinedVector<iovec, 8> iov;
  iov.push_back({header.data(), header.size()});
  for (const iovec& piece : pieces) {
    if (piece.iov_len > 0) iov.push_back(piece);
  }

  Peer& p = peers_[peer];
  MutexLock lock(&p.send_mu);
  PW_RETURN_IF_ERROR(SendGenerationLocked(p, peer, connection.generation));
  if (!p.send_broken.ok()) return p.send_broken;
  uint64_t written = 0;
  absl::Status status = WriteAll(fd, wake_fd_, iov.data(), iov.size(), &written);
  if (status.ok()) return status;
  if (shutting_down_.load()) return absl::CancelledError(absl::StrCat(Name(), " is shut down"));
  // The stream may now end mid-message: nothing more can go on it. Shutting
  // it down makes the peer's Recv fail now rather than wait.
  shutdown(fd, SHUT_RDWR);
  p.send_broken = absl::UnavailableError(
      absl::StrCat(Name(), ": connection to host ", peer, " broke (", status.message(), ") after ", written, " of ",
                   length + kHeaderBytes, " bytes of a message"));
  return p.send_broken;
}

absl::Status DataPlane::BreakRecv(Peer& p, int peer, int fd, absl::string_view why) {
  if (shutting_down_.load()) return absl::CancelledError(absl::StrCat(Name(), " is shut down"));
  // The stream's position is lost (or the stream is gone): shut it down so
  // that the peer's Sends fail too instead of filling it.
  shutdown(fd, SHUT_RDWR);
  p.header_taken = false;
  p.recv_broken = absl::UnavailableError(absl::StrCat(Name(), ": connection from host ", peer, " broke: ", why));
  return p.recv_broken;
}

absl::StatusOr<DataPlane::MessageHeader> DataPlane::ReadHeaderLocked(Peer& p, int peer, int fd) {
  if (!p.recv_broken.ok()) return p.recv_broken;
  if (p.header_taken) {
    return absl::FailedPreconditionError(absl::StrCat(
        Name(), ": the payload of the message from host ", peer,
        " whose header was taken must be received or discarded first (RecvPayload or Discard)"));
  }
  uint8_t header[kHeaderBytes];
  iovec header_iov = {header, sizeof(header)};
  uint64_t got = 0;
  if (absl::Status status = ReadAll(fd, &header_iov, 1, &got); !status.ok()) {
    return BreakRecv(p, peer, fd,
                     got == 0 ? std::string(status.message())
                              : absl::StrCat(status.message(), " inside a message header"));
  }
  const std::optional<MessageHeader> h = data_wire::ReadHeader(header);
  if (!h.has_value()) return BreakRecv(p, peer, fd, "corrupt stream (not a message header)");
  p.header_taken = true;
  p.payload_left = h->length;
  return *h;
}

absl::Status DataPlane::DrainLocked(Peer& p, int peer, int fd) {
  if (!p.recv_broken.ok()) return p.recv_broken;
  if (!p.header_taken) {
    return absl::FailedPreconditionError(absl::StrCat(Name(), ": no message header from host ", peer,
                                                      " was taken (RecvHeader first)"));
  }
  // A fixed scratch buffer: the length is the peer's word, and allocating
  // it could be anything.
  const uint64_t length = p.payload_left;
  uint64_t got = 0;
  if (length > 0) {
    auto scratch = std::make_unique<uint8_t[]>(static_cast<size_t>(std::min<uint64_t>(length, kDrainBytes)));
    while (got < length) {
      iovec chunk = {scratch.get(), static_cast<size_t>(std::min<uint64_t>(length - got, kDrainBytes))};
      if (absl::Status status = ReadAll(fd, &chunk, 1, &got); !status.ok()) {
        return BreakRecv(p, peer, fd,
                         absl::StrCat(status.message(), " after ", got, " of ", length, " bytes of a message"));
      }
    }
  }
  p.header_taken = false;
  p.payload_left = 0;
  return absl::OkStatus();
}

absl::Status DataPlane::ReadPayloadLocked(Peer& p, int peer, int fd, absl::Span<const iovec> pieces) {
  if (!p.recv_broken.ok()) return p.recv_broken;
  if (!p.header_taken) {
    return absl::FailedPreconditionError(absl::StrCat(Name(), ": no message header from host ", peer,
                                                      " was taken (RecvHeader first)"));
  }
  const uint64_t length = p.payload_left;
  uint64_t capacity = 0;
  absl::InlinedVector<iovec, 8> iov;
  for (const iovec& piece : pieces) {
    capacity += piece.iov_len;
    if (piece.iov_len > 0) iov.push_back(piece);
  }
  if (length != capacity) {
    PW_RETURN_IF_ERROR(DrainLocked(p, peer, fd));
    return absl::InvalidArgumentError(absl::StrCat(Name(), ": the message from host ", peer, " has ", length,
                                                   " bytes but the receive pieces hold ", capacity,
                                                   "; discarded it"));
  }
  uint64_t got = 0;
  if (absl::Status status = ReadAll(fd, iov.data(), iov.size(), &got); !status.ok()) {
    return BreakRecv(p, peer, fd,
                     absl::StrCat(status.message(), " after ", got, " of ", length, " bytes of a message"));
  }
  p.header_taken = false;
  p.payload_left = 0;
  return absl::OkStatus();
}

absl::StatusOr<DataPlane::MessageHeader> DataPlane::RecvHeader(int peer) {
  PW_ASSIGN_OR_RETURN(const Connection connection, ConnectionFd(peer, /*outgoing=*/false));
  const int fd = connection.fd;
  Peer& p = peers_[peer];
  MutexLock lock(&p.recv_mu);
  PW_RETURN_IF_ERROR(RecvGenerationLocked(p, peer, connection.generation));
  return ReadHeaderLocked(p, peer, fd);
}

absl::Status DataPlane::RecvPayload(int peer, absl::Span<const iovec> pieces) {
  PW_ASSIGN_OR_RETURN(const Connection connection, ConnectionFd(peer, /*outgoing=*/false));
  const int fd = connection.fd;
  Peer& p = peers_[peer];
  MutexLock lock(&p.recv_mu);
  PW_RETURN_IF_ERROR(RecvGenerationLocked(p, peer, connection.generation));
  return ReadPayloadLocked(p, peer, fd, pieces);
}

absl::Status DataPlane::Discard(int peer) {
  PW_ASSIGN_OR_RETURN(const Connection connection, ConnectionFd(peer, /*outgoing=*/false));
  const int fd = connection.fd;
  Peer& p = peers_[peer];
  MutexLock lock(&p.recv_mu);
  PW_RETURN_IF_ERROR(RecvGenerationLocked(p, peer, connection.generation));
  return DrainLocked(p, peer, fd);
}

absl::StatusOr<uint8_t> DataPlane::Recv(int peer, absl::Span<const iovec> pieces, std::optional<std::string>* other,
                                        MessageIds* ids) {
  if (other != nullptr) other->reset();
  PW_ASSIGN_OR_RETURN(const Connection connection, ConnectionFd(peer, /*outgoing=*/false));
  const int fd = connection.fd;
  Peer& p = peers_[peer];
  MutexLock lock(&p.recv_mu);
  PW_RETURN_IF_ERROR(RecvGenerationLocked(p, peer, connection.generation));
  PW_ASSIGN_OR_RETURN(const MessageHeader header, ReadHeaderLocked(p, peer, fd));
  if (ids != nullptr) *ids = header.ids;
  uint64_t capacity = 0;
  for (const iovec& piece : pieces) capacity += piece.iov_len;
  if (header.length != capacity && other != nullptr && header.length <= kMaxOtherBytes) {
    other->emplace(static_cast<size_t>(header.length), '\0');
    const iovec into = {(*other)->data(), (*other)->size()};
    PW_RETURN_IF_ERROR(ReadPayloadLocked(p, peer, fd, {&into, 1}));
    return header.flag;
  }
  PW_RETURN_IF_ERROR(ReadPayloadLocked(p, peer, fd, pieces));
  return header.flag;
}

}  // namespace pw
