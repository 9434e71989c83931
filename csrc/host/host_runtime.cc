#include "csrc/host/host_runtime.h"

#include <unistd.h>

#include <chrono>
#include <random>

#include "absl/strings/str_cat.h"
#include "csrc/coordination/host_channel.h"

namespace pw {
namespace {

uint64_t RandomIncarnation() {
  std::random_device device;
  return (uint64_t{device()} << 32) ^ device() ^ static_cast<uint64_t>(getpid());
}

absl::Status CheckConfig(const wire::HostConfig& c) {
  if (c.host_id() < 0 || c.island_id() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("host config: host_id and island_id must be >= 0, got ", c.host_id(), " and ", c.island_id()));
  }
  if (c.device_ids_size() == 0) return absl::InvalidArgumentError("host config: a host needs at least one device");
  if (c.device_memory_bytes() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("host config: device_memory_bytes must be > 0, got ", c.device_memory_bytes()));
  }
  return absl::OkStatus();
}

bool SameConfig(const wire::HostConfig& a, const wire::HostConfig& b) {
  return a.SerializeAsString() == b.SerializeAsString();
}

}  // namespace

HostRuntime::HostRuntime() : incarnation_(RandomIncarnation()) {}

void HostRuntime::Handle(const std::shared_ptr<HostSession>& session, wire::Request request) {
  wire::Reply reply;
  switch (request.kind_case()) {
    case wire::Request::kHello:
      reply = HandleHello(session, request.hello());
      break;
    case wire::Request::kPing:
      reply.mutable_pong()->set_sent_ns(request.ping().sent_ns());
      reply.mutable_pong()->set_incarnation(incarnation_);
      break;
    case wire::Request::kEcho:
      *reply.mutable_echo() = std::move(*request.mutable_echo());
      break;
    default:
      ToWire(absl::UnimplementedError(absl::StrCat("this host does not know request kind ",
                                                   static_cast<int>(request.kind_case()))),
             reply.mutable_status());
  }
  if (request.id() == 0) return;
  reply.set_id(request.id());
  session->Reply(std::move(reply));
}

wire::Reply HostRuntime::HandleHello(const std::shared_ptr<HostSession>& session, const wire::Hello& hello) {
  wire::Reply reply;
  MutexLock lock(&mu_);
  if (hello.has_config()) {
    absl::Status status = CheckConfig(hello.config());
    if (status.ok() && owner_ != 0 && !SameConfig(config_, hello.config())) {
      status = absl::FailedPreconditionError(
          absl::StrCat("this host serves host ", config_.host_id(), " of island ", config_.island_id(),
                       " for another client already"));
    }
    if (!status.ok()) {
      ToWire(status, reply.mutable_status());
      return reply;
    }
    if (owner_ == 0) {
      config_ = hello.config();
      owner_ = session->id();
    }
  }
  reply.mutable_hello()->set_incarnation(incarnation_);
  reply.mutable_hello()->set_pid(getpid());
  *reply.mutable_hello()->mutable_config() = config_;
  return reply;
}

void HostRuntime::OnSessionEnd(const std::shared_ptr<HostSession>& session) {
  MutexLock lock(&mu_);
  if (session->id() == owner_) {
    owner_gone_ = true;
    cv_.SignalAll();
  }
}

bool HostRuntime::configured() const {
  MutexLock lock(&mu_);
  return owner_ != 0;
}

bool HostRuntime::owner_gone() const {
  MutexLock lock(&mu_);
  return owner_gone_;
}

bool HostRuntime::AwaitOwnerGone(int64_t timeout_ns) const {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::nanoseconds(timeout_ns);
  MutexLock lock(&mu_);
  while (!owner_gone_) {
    if (!cv_.WaitUntil(&mu_, deadline)) return owner_gone_;
  }
  return true;
}

}  // namespace pw
