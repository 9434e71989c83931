#include "csrc/client/host_registry.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "csrc/coordination/host_channel.h"

namespace pw {

absl::StatusOr<std::unique_ptr<HostRegistry>> HostRegistry::Start(const std::string& listen, std::string secret) {
  auto registry = std::unique_ptr<HostRegistry>(new HostRegistry());
  auto server = HostServer::Start(listen, std::move(secret), registry.get());
  if (!server.ok()) return server.status();
  registry->server_ = *std::move(server);
  return registry;
}

HostRegistry::~HostRegistry() { server_.reset(); }  // ends the sessions before the handler goes

void HostRegistry::Handle(const std::shared_ptr<HostSession>& session, wire::Request request) {
  wire::Reply reply;
  reply.set_id(request.id());
  if (request.kind_case() == wire::Request::kRegisterHost && !request.register_host().address().empty()) {
    MutexLock lock(&mu_);
    addresses_.push_back(request.register_host().address());
    cv_.SignalAll();
  } else if (request.kind_case() != wire::Request::kHello && request.kind_case() != wire::Request::kPing) {
    ToWire(absl::InvalidArgumentError("this client only takes host registrations here"), reply.mutable_status());
  } else if (request.kind_case() == wire::Request::kPing) {
    reply.mutable_pong()->set_sent_ns(request.ping().sent_ns());
  } else {
    reply.mutable_hello();
  }
  if (request.id() != 0) session->Reply(std::move(reply));
}

absl::StatusOr<std::vector<std::string>> HostRegistry::Await(int n, int64_t timeout_ns) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::nanoseconds(timeout_ns);
  MutexLock lock(&mu_);
  while (static_cast<int>(addresses_.size()) < n) {
    if (!cv_.WaitUntil(&mu_, deadline)) {
      return absl::DeadlineExceededError(absl::StrCat("hosts=external: ", addresses_.size(), " of ", n,
                                                      " hosts registered at ", address(), " in time"));
    }
  }
  return std::vector<std::string>(addresses_.begin(), addresses_.begin() + n);
}

}  // namespace pw
