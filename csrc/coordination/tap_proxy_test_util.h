#ifndef PATHWAYS_COORDINATION_TAP_PROXY_TEST_UTIL_H_
#define PATHWAYS_COORDINATION_TAP_PROXY_TEST_UTIL_H_

// For tests: a TCP relay on loopback that records every byte it passes, a
// passive observer of a connection (what someone on the network path sees),
// and raw replays of what it recorded.
//
// TapProxy::Start("127.0.0.1:port") listens on 127.0.0.1:0; every connection
// made to address() is relayed to the target, byte for byte in both
// directions, and recorded. Thread-safe; the destructor cuts every relayed
// connection and joins its threads. With a `delay`, each connection is
// relayed only that long after it was accepted: a connection that is slow to
// set up (a loaded host, a long network path).

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "csrc/base/mutex.h"

namespace pw {
namespace testing_util {

// A blocking TCP socket connected to "127.0.0.1:port" (IPv4 only), or -1.
inline int DialLoopback(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return -1;
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(std::stoi(address.substr(colon + 1))));
  if (inet_pton(AF_INET, address.substr(0, colon).c_str(), &to.sin_addr) != 1) return -1;
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (connect(fd, reinterpret_cast<const sockaddr*>(&to), sizeof(to)) < 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Reads from `fd` until the peer closes it or nothing came for `quiet`
// (at most `limit` in all); what arrived. *closed: whether the peer closed.
inline std::string ReadUntilQuiet(int fd, std::chrono::milliseconds quiet, std::chrono::milliseconds limit,
                                  bool* closed = nullptr) {
  std::string got;
  if (closed != nullptr) *closed = false;
  const auto end = std::chrono::steady_clock::now() + limit;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
    if (left.count() <= 0) return got;
    pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(std::min(left, quiet).count())) <= 0) return got;
    char buffer[4096];
    const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) {
      if (closed != nullptr) *closed = true;
      return got;
    }
    got.append(buffer, static_cast<size_t>(n));
  }
}

class TapProxy {
 public:
  // What one relayed connection carried, each direction in order.
  struct Recording {
    std::string from_dialer;    // dialer -> target
    std::string from_listener;  // target -> dialer
  };

  // Nullptr if it cannot listen.
  static std::unique_ptr<TapProxy> Start(std::string target,
                                         std::chrono::milliseconds delay = std::chrono::milliseconds(0)) {
    auto proxy = std::unique_ptr<TapProxy>(new TapProxy(std::move(target), delay));
    proxy->listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in at{};
    at.sin_family = AF_INET;
    at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(at);
    if (proxy->listen_fd_ < 0 || bind(proxy->listen_fd_, reinterpret_cast<sockaddr*>(&at), sizeof(at)) < 0 ||
        listen(proxy->listen_fd_, 64) < 0 ||
        getsockname(proxy->listen_fd_, reinterpret_cast<sockaddr*>(&at), &len) < 0) {
      return nullptr;
    }
    proxy->address_ = absl::StrCat("127.0.0.1:", ntohs(at.sin_port));
    proxy->accept_thread_ = std::thread([p = proxy.get()] { p->AcceptLoop(); });
    return proxy;
  }

  ~TapProxy() {
    {
      MutexLock lock(&mu_);
      stopping_ = true;
      for (int fd : fds_) shutdown(fd, SHUT_RDWR);
      stopped_.SignalAll();
    }
    shutdown(listen_fd_, SHUT_RDWR);
    accept_thread_.join();
    for (std::thread& t : relays_) t.join();
    close(listen_fd_);
    for (int fd : fds_) close(fd);
  }

  const std::string& address() const { return address_; }

  // What every connection carried so far, in the order they were accepted.
  std::vector<Recording> recordings() const {
    MutexLock lock(&mu_);
    return recordings_;
  }
  // Every byte of every connection, both directions.
  std::string AllBytes() const {
    std::string all;
    for (const Recording& r : recordings()) absl::StrAppend(&all, r.from_dialer, r.from_listener);
    return all;
  }

 private:
  TapProxy(std::string target, std::chrono::milliseconds delay) : target_(std::move(target)), delay_(delay) {}

  void AcceptLoop() {
    for (;;) {
      const int in = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (in < 0) return;  // shut down
      const int out = DialLoopback(target_);
      MutexLock lock(&mu_);
      if (stopping_ || out < 0) {
        close(in);
        if (out >= 0) close(out);
        if (stopping_) return;
        continue;
      }
      fds_.push_back(in);
      fds_.push_back(out);
      const size_t index = recordings_.size();
      recordings_.emplace_back();
      relays_.emplace_back([this, in, out, index] { Relay(in, out, index); });
    }
  }

  void Relay(int dialer, int target, size_t index) {
    {
      const auto start = std::chrono::steady_clock::now() + delay_;
      MutexLock lock(&mu_);
      while (!stopping_ && std::chrono::steady_clock::now() < start) stopped_.WaitUntil(&mu_, start);
      if (stopping_) return;
    }
    pollfd fds[2] = {{dialer, POLLIN, 0}, {target, POLLIN, 0}};
    bool open[2] = {true, true};
    while (open[0] || open[1]) {
      fds[0].events = open[0] ? POLLIN : 0;
      fds[1].events = open[1] ? POLLIN : 0;
      if (poll(fds, 2, 1000) < 0) return;
      {
        MutexLock lock(&mu_);
        if (stopping_) return;
      }
      for (int side = 0; side < 2; ++side) {
        if (!open[side] || fds[side].revents == 0) continue;
        char buffer[16384];
        const ssize_t n = recv(fds[side].fd, buffer, sizeof(buffer), 0);
        const int other = fds[1 - side].fd;
        if (n <= 0) {
          open[side] = false;
          shutdown(other, SHUT_WR);
          continue;
        }
        {
          MutexLock lock(&mu_);
          (side == 0 ? recordings_[index].from_dialer : recordings_[index].from_listener)
              .append(buffer, static_cast<size_t>(n));
        }
        for (ssize_t sent = 0; sent < n;) {
          const ssize_t w = send(other, buffer + sent, static_cast<size_t>(n - sent), MSG_NOSIGNAL);
          if (w <= 0) return;
          sent += w;
        }
      }
    }
  }

  const std::string target_;
  const std::chrono::milliseconds delay_;
  std::string address_;
  int listen_fd_ = -1;
  std::thread accept_thread_;
  mutable Mutex mu_;
  CondVar stopped_;  // signaled when stopping_ is set
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<int> fds_ ABSL_GUARDED_BY(mu_);
  std::vector<Recording> recordings_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> relays_ ABSL_GUARDED_BY(mu_);
};

}  // namespace testing_util
}  // namespace pw

#endif  // PATHWAYS_COORDINATION_TAP_PROXY_TEST_UTIL_H_
