#include "csrc/host/host_runtime.h"

#include <unistd.h>

#include <chrono>
#include <random>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "csrc/base/spin.h"
#include "csrc/coordination/host_channel.h"

namespace pw {
namespace {

uint64_t RandomIncarnation() {
  std::random_device device;
  return (uint64_t{device()} << 32) ^ device() ^ static_cast<uint64_t>(getpid());
}

void ToWireIfError(const absl::Status& status, wire::Reply* reply) {
  if (!status.ok()) ToWire(status, reply->mutable_status());
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

HostRuntime::HostRuntime(std::string secret, std::string bind_ip, TestDelays delays)
    : incarnation_(RandomIncarnation()), secret_(std::move(secret)), bind_ip_(std::move(bind_ip)), delays_(delays) {}

absl::StatusOr<HostRuntime::TestDelays> HostRuntime::ParseTestDelays(absl::string_view text) {
  TestDelays delays;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    part = absl::StripAsciiWhitespace(part);
    const size_t eq = part.find('=');
    double seconds = 0;
    const absl::string_view name = eq == absl::string_view::npos ? part : part.substr(0, eq);
    if (eq == absl::string_view::npos || !absl::SimpleAtod(part.substr(eq + 1), &seconds) || seconds < 0 ||
        seconds > 3600 || (name != "load_function" && name != "put")) {
      return absl::InvalidArgumentError(absl::StrCat("PATHWAYS_HOST_TEST_DELAYS: cannot use '", part,
                                                     "' (want load_function=SECONDS and/or put=SECONDS)"));
    }
    (name == "put" ? delays.put_ns : delays.load_function_ns) = static_cast<int64_t>(seconds * 1e9);
  }
  return delays;
}

void HostRuntime::Heartbeat(const wire::Ping& ping, wire::Pong* pong) {
  pong->set_sent_ns(ping.sent_ns());
  pong->set_incarnation(incarnation_);
  pong->set_host_ns(NowNanos());
}

int HostRuntime::store_sessions_opened(int host) const {
  return stores_ready_.load(std::memory_order_acquire) ? stores_->sessions_opened(host) : 0;
}

absl::Status HostRuntime::HandlePeersLost(const wire::PeersLost& request) {
  if (stores_ready_.load(std::memory_order_acquire)) {
    for (int h : request.host_ids()) stores_->Lose(h, request.why());
  }
  std::shared_ptr<HostExecutor> executor = this->executor();
  return executor != nullptr ? executor->PeersLost(request) : absl::OkStatus();
}

HostRuntime::~HostRuntime() {
  if (join_thread_.joinable()) join_thread_.join();
  std::shared_ptr<HostExecutor> executor;
  {
    MutexLock lock(&mu_);
    executor = std::move(executor_);
  }
  executor.reset();  // before the rendezvous store it uses
}

std::shared_ptr<HostExecutor> HostRuntime::executor() const {
  MutexLock lock(&mu_);
  return executor_;
}

void HostRuntime::Handle(const std::shared_ptr<HostSession>& session, wire::Request request) {
  wire::Reply reply;
  switch (request.kind_case()) {
    case wire::Request::kHello:
      reply = HandleHello(session, request.hello());
      break;
    case wire::Request::kPing:
      reply.mutable_pong()->set_sent_ns(request.ping().sent_ns());
      reply.mutable_pong()->set_incarnation(incarnation_);
      reply.mutable_pong()->set_host_ns(NowNanos());
      break;
    case wire::Request::kEcho:
      *reply.mutable_echo() = std::move(*request.mutable_echo());
      break;
    case wire::Request::kKvSet:
      ToWireIfError(kv_.Set(request.kv_set().key(), request.kv_set().value()), &reply);
      break;
    case wire::Request::kKvGet: {
      auto value = kv_.Get(request.kv_get().key(), absl::Now());
      if (value.ok()) {
        reply.mutable_kv_value()->set_value(*std::move(value));
      } else {
        ToWire(absl::NotFoundError(absl::StrCat("no key '", request.kv_get().key(), "' yet")),
               reply.mutable_status());
      }
      break;
    }
    case wire::Request::kJoin:
      Join(session, std::move(request));
      return;
    default:
      if (HandleProgramRequest(session, request)) return;
      ToWire(absl::UnimplementedError(absl::StrCat("this host does not know request kind ",
                                                   static_cast<int>(request.kind_case()))),
             reply.mutable_status());
  }
  if (request.id() == 0) return;
  reply.set_id(request.id());
  session->Reply(std::move(reply));
}

void HostRuntime::Join(const std::shared_ptr<HostSession>& session, wire::Request request) {
  auto reply_with = [session, id = request.id()](const absl::Status& status) {
    if (id == 0) return;
    wire::Reply reply;
    reply.set_id(id);
    if (!status.ok()) ToWire(status, reply.mutable_status());
    session->Reply(std::move(reply));
  };
  wire::HostConfig config;
  {
    MutexLock lock(&mu_);
    if (owner_ == 0 || session->id() != owner_) {
      reply_with(absl::PermissionDeniedError("join: only the client that configured this host may join it"));
      return;
    }
    if (joining_) {
      reply_with(absl::FailedPreconditionError("join: this host has joined its cluster already"));
      return;
    }
    joining_ = true;
    config = config_;
  }
  const wire::JoinCluster& join = request.join();
  for (int d : config.device_ids()) {
    if (d < 0 || d >= join.device_host_size() || join.device_host(d) != config.host_id()) {
      reply_with(absl::InvalidArgumentError(
          absl::StrCat("join: the cluster does not give device ", d, " to host ", config.host_id())));
      return;
    }
  }
  // Connecting blocks until every host has joined: not on a gRPC thread.
  join_thread_ = std::thread([this, config, request = std::move(request), reply_with]() {
    const wire::JoinCluster& join = request.join();
    stores_ = std::make_unique<PeerStores>(
        config.host_id(), &kv_, std::vector<std::string>(join.host_addresses().begin(), join.host_addresses().end()),
        secret_);
    stores_ready_.store(true, std::memory_order_release);
    auto executor = std::make_shared<HostExecutor>(config, join, stores_.get(), bind_ip_, secret_);
    absl::Status connected = executor->ConnectDataPlane();
    if (connected.ok()) {
      MutexLock lock(&mu_);
      executor_ = std::move(executor);
    }
    reply_with(connected);
  });
}

bool HostRuntime::HandleProgramRequest(const std::shared_ptr<HostSession>& session, wire::Request& request) {
  const uint64_t id = request.id();
  auto reply_with = [session, id](const absl::Status& status) {
    if (id == 0) return;
    wire::Reply reply;
    reply.set_id(id);
    if (!status.ok()) ToWire(status, reply.mutable_status());
    session->Reply(std::move(reply));
  };
  switch (request.kind_case()) {
    case wire::Request::kDefineDevices:
    case wire::Request::kLoadFunction:
    case wire::Request::kLoadProgram:
    case wire::Request::kPut:
    case wire::Request::kRun:
    case wire::Request::kFetch:
    case wire::Request::kFree:
    case wire::Request::kDescribeQueues:
    case wire::Request::kFailDevices:
    case wire::Request::kPeersLost:
      break;
    default:
      return false;
  }
  std::shared_ptr<HostExecutor> executor;
  {
    MutexLock lock(&mu_);
    if (owner_ == 0 || session->id() != owner_) {
      reply_with(absl::PermissionDeniedError("only the client that configured this host may run programs on it"));
      return true;
    }
    executor = executor_;
  }
  if (request.kind_case() == wire::Request::kPeersLost) {  // also while joining: nothing waits for them
    reply_with(HandlePeersLost(request.peers_lost()));
    return true;
  }
  if (executor == nullptr) {
    reply_with(absl::FailedPreconditionError("this host has not joined its cluster yet"));
    return true;
  }
  switch (request.kind_case()) {
    case wire::Request::kDefineDevices:
      reply_with(executor->DefineDevices(request.define_devices()));
      break;
    case wire::Request::kLoadFunction:
      if (delays_.load_function_ns > 0) std::this_thread::sleep_for(std::chrono::nanoseconds(delays_.load_function_ns));
      reply_with(executor->LoadFunction(request.load_function()));
      break;
    case wire::Request::kLoadProgram:
      reply_with(executor->LoadProgram(request.load_program()));
      break;
    case wire::Request::kPut:
      if (delays_.put_ns > 0) std::this_thread::sleep_for(std::chrono::nanoseconds(delays_.put_ns));
      reply_with(executor->Put(*request.mutable_put()));
      break;
    case wire::Request::kRun:
      executor->Run(request.run(), [session, id](absl::StatusOr<wire::RunReply> result) {
        if (id == 0) return;
        wire::Reply reply;
        reply.set_id(id);
        if (result.ok()) {
          *reply.mutable_run() = *std::move(result);
        } else {
          ToWire(result.status(), reply.mutable_status());
        }
        session->Reply(std::move(reply));
      });
      break;
    case wire::Request::kFetch:
      executor->Fetch(request.fetch(), [session, id](absl::StatusOr<std::string> data) {
        wire::Reply reply;
        reply.set_id(id);
        if (data.ok()) {
          reply.mutable_fetch()->set_data(*std::move(data));
        } else {
          ToWire(data.status(), reply.mutable_status());
        }
        session->Reply(std::move(reply));
      });
      break;
    case wire::Request::kFree:
      executor->Free(request.free());
      break;
    case wire::Request::kFailDevices:
      reply_with(executor->FailDevices(request.fail_devices()));
      break;
    case wire::Request::kDescribeQueues: {
      wire::Reply reply;
      reply.set_id(id);
      *reply.mutable_queues() = executor->DescribeQueues();
      if (id != 0) session->Reply(std::move(reply));
      break;
    }
    default:
      break;
  }
  return true;
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
  reply.mutable_hello()->set_boot_id(KernelBootId());
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
