// Prints the throughput of large transfers from one process to another over
// loopback TCP: DataPlane::Send/Recv against two raw TCP sockets doing the
// same, in the same run with rounds of each interleaved, so that the
// machine's load hits all alike. Raw TCP twice (TCP_NODELAY, receiver
// recv(MSG_WAITALL) into the whole buffer), the sender either
//  - "raw TCP": one blocking send() of the whole buffer, or
//  - "raw TCP, poll": send(MSG_DONTWAIT) and poll(POLLOUT) when the socket is
//    full, as the data plane's Send does (it must watch for Shutdown and for
//    the peer's end closing while it waits).
//
// A round: the sender (parent process) starts the clock, sends `size` bytes
// and stops it when the receiver's (child process's) one-byte ack arrives.
// The receiver's buffer is touched before the first round, so page faults
// are not measured. Not a test; numbers depend on the machine (run it on an
// idle one).
//
//   build/cpp/csrc/coordination/data_plane_benchmark [rounds=10] [mebibytes=64]

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "csrc/coordination/data_plane.h"

namespace pw {
namespace {

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "data_plane_benchmark (process %d): %s\n", static_cast<int>(getpid()), what.c_str());
  std::exit(1);
}

void Check(const absl::Status& status, const char* what) {
  if (!status.ok()) Die(absl::StrCat(what, ": ", status.ToString()));
}

void FillPattern(uint8_t* data, size_t size) {
  uint32_t x = 12345;
  for (size_t i = 0; i < size; ++i) {
    x = x * 1103515245u + 12345u;
    data[i] = static_cast<uint8_t>(x >> 24);
  }
}

void SendAllRaw(int fd, const uint8_t* data, size_t size) {
  while (size > 0) {
    const ssize_t n = send(fd, data, size, MSG_NOSIGNAL);
    if (n < 0) Die(absl::StrCat("send: ", std::strerror(errno)));
    data += n;
    size -= static_cast<size_t>(n);
  }
}

void SendAllRawPolling(int fd, const uint8_t* data, size_t size) {
  while (size > 0) {
    const ssize_t n = send(fd, data, size, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p = {fd, POLLOUT, 0};
      if (poll(&p, 1, -1) < 0) Die(absl::StrCat("poll: ", std::strerror(errno)));
      continue;
    }
    if (n < 0) Die(absl::StrCat("send: ", std::strerror(errno)));
    data += n;
    size -= static_cast<size_t>(n);
  }
}

void RecvAllRaw(int fd, uint8_t* data, size_t size) {
  while (size > 0) {
    const ssize_t n = recv(fd, data, size, MSG_WAITALL);
    if (n <= 0) Die(absl::StrCat("recv: ", n == 0 ? "closed" : std::strerror(errno)));
    data += n;
    size -= static_cast<size_t>(n);
  }
}

void WriteLine(int fd, const std::string& line) {
  const std::string text = line + "\n";
  if (write(fd, text.data(), text.size()) != static_cast<ssize_t>(text.size())) Die("pipe write");
}

std::string ReadLine(int fd) {
  std::string line;
  char ch;
  while (read(fd, &ch, 1) == 1 && ch != '\n') line.push_back(ch);
  return line;
}

// This process's plane (host `id` of 2), connected to the other process's
// (addresses swapped over the pipes).
std::unique_ptr<DataPlane> ConnectPlane(int id, const std::string& secret, int to_other, int from_other) {
  DataPlane::Options options;
  options.secret = secret;
  absl::StatusOr<std::unique_ptr<DataPlane>> plane = DataPlane::Listen(id, 2, options);
  Check(plane.status(), "Listen");
  WriteLine(to_other, (*plane)->address());
  std::vector<std::string> addresses(2);
  addresses[id] = (*plane)->address();
  addresses[1 - id] = ReadLine(from_other);
  Check((*plane)->Connect(addresses), "Connect");
  return *std::move(plane);
}

void NoDelay(int fd) {
  const int one = 1;
  if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) < 0) Die("TCP_NODELAY");
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 == 1 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

constexpr int kWarmup = 2;

enum Mode { kRaw, kRawPoll, kPlane, kModes };
constexpr const char* kModeNames[kModes] = {"raw TCP", "raw TCP, poll", "data plane"};

// The order of the modes in `round`: rotated every round.
Mode ModeAt(int round, int i) { return static_cast<Mode>((round + i) % kModes); }

// The receiving process: host 1.
void Receiver(int raw_fd, int total_rounds, size_t size, const std::string& secret, int to_parent,
              int from_parent) {
  std::unique_ptr<DataPlane> plane = ConnectPlane(1, secret, to_parent, from_parent);
  std::vector<uint8_t> raw_dst(size), plane_dst(size);
  std::memset(raw_dst.data(), 1, size);  // touched: no page faults inside the rounds
  std::memset(plane_dst.data(), 1, size);
  uint8_t ack = 0;
  const iovec ack_piece = {&ack, 1};
  const iovec dst_piece = {plane_dst.data(), size};
  for (int round = 0; round < total_rounds; ++round) {
    for (int i = 0; i < kModes; ++i) {
      if (ModeAt(round, i) != kPlane) {
        RecvAllRaw(raw_fd, raw_dst.data(), size);
        SendAllRaw(raw_fd, &ack, 1);
      } else {
        Check(plane->Recv(0, {&dst_piece, 1}).status(), "Recv");
        Check(plane->Send(0, {&ack_piece, 1}), "Send ack");
      }
    }
  }
  std::vector<uint8_t> expected(size);
  FillPattern(expected.data(), size);
  if (raw_dst != expected) Die("raw TCP: the received bytes differ");
  if (plane_dst != expected) Die("data plane: the received bytes differ");
}

// The sending process: host 0; prints the results.
void Sender(int raw_fd, int rounds, size_t size, const std::string& secret, int to_child, int from_child) {
  std::unique_ptr<DataPlane> plane = ConnectPlane(0, secret, to_child, from_child);
  std::vector<uint8_t> src(size);
  FillPattern(src.data(), size);
  uint8_t ack = 0;
  const iovec ack_piece = {&ack, 1};
  const iovec src_piece = {src.data(), size};
  std::vector<double> gbps[kModes];
  for (int round = 0; round < kWarmup + rounds; ++round) {
    for (int i = 0; i < kModes; ++i) {
      const Mode mode = ModeAt(round, i);
      const auto start = std::chrono::steady_clock::now();
      if (mode == kPlane) {
        Check(plane->Send(1, {&src_piece, 1}), "Send");
        Check(plane->Recv(1, {&ack_piece, 1}).status(), "Recv ack");
      } else {
        (mode == kRaw ? SendAllRaw : SendAllRawPolling)(raw_fd, src.data(), size);
        RecvAllRaw(raw_fd, &ack, 1);
      }
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (round >= kWarmup) gbps[mode].push_back(static_cast<double>(size) / seconds / 1e9);
    }
  }
  double best[kModes], median[kModes];
  for (int m = 0; m < kModes; ++m) {
    best[m] = *std::max_element(gbps[m].begin(), gbps[m].end());
    median[m] = Median(gbps[m]);
  }
  std::printf("%zu MiB, process to process over loopback TCP, %d rounds each (after %d warm-up), interleaved\n",
              size >> 20, rounds, kWarmup);
  std::printf("%-14s  %10s  %12s\n", "", "best GB/s", "median GB/s");
  for (int m = 0; m < kModes; ++m) std::printf("%-14s  %10.2f  %12.2f\n", kModeNames[m], best[m], median[m]);
  for (int m : {kRaw, kRawPoll}) {
    std::printf("data plane / %s: best %.0f%%, median %.0f%%\n", kModeNames[m], 100 * best[kPlane] / best[m],
                100 * median[kPlane] / median[m]);
  }
}

}  // namespace
}  // namespace pw

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 10;
  const size_t size = (argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 64) << 20;
  if (rounds < 1 || size == 0) {
    std::fprintf(stderr, "usage: data_plane_benchmark [rounds=10] [mebibytes=64]\n");
    return 2;
  }
  std::random_device random;
  const std::string secret = absl::StrCat(random(), "-", random(), "-", random(), "-", random());

  // The raw pair: the parent listens, the child dials.
  const int listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in at{};
  at.sin_family = AF_INET;
  at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(at);
  if (listen_fd < 0 || bind(listen_fd, reinterpret_cast<sockaddr*>(&at), sizeof(at)) < 0 ||
      listen(listen_fd, 1) < 0 || getsockname(listen_fd, reinterpret_cast<sockaddr*>(&at), &len) < 0) {
    pw::Die("raw listen");
  }
  int to_child[2], to_parent[2];
  if (pipe(to_child) < 0 || pipe(to_parent) < 0) pw::Die("pipe");

  // Forked before either process starts a thread (a DataPlane's accept thread).
  const pid_t pid = fork();
  if (pid < 0) pw::Die("fork");
  if (pid == 0) {
    close(listen_fd);
    close(to_child[1]);
    close(to_parent[0]);
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&at), sizeof(at)) < 0) pw::Die("raw connect");
    pw::NoDelay(fd);
    pw::Receiver(fd, pw::kWarmup + rounds, size, secret, to_parent[1], to_child[0]);
    close(fd);
    _exit(0);
  }
  close(to_child[0]);
  close(to_parent[1]);
  const int fd = accept(listen_fd, nullptr, nullptr);
  if (fd < 0) pw::Die("raw accept");
  pw::NoDelay(fd);
  pw::Sender(fd, rounds, size, secret, to_child[1], to_parent[0]);
  close(fd);
  int status = 0;
  if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "data_plane_benchmark: the receiving process failed\n");
    return 1;
  }
  return 0;
}
