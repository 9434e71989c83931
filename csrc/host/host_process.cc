#include "csrc/host/host_process.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <random>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "csrc/base/spin.h"
#include "csrc/base/status_macros.h"
#include "csrc/coordination/auth.h"
#include "csrc/coordination/host_channel.h"
#include "csrc/coordination/protocol_version.h"

namespace pw {
namespace {

// What answers request `id` of `session` with a status (nothing for id 0:
// no reply wanted). Copyable, so it may go to another thread.
auto StatusReply(std::shared_ptr<HostSession> session, uint64_t id) {
  return [session = std::move(session), id](const absl::Status& status) {
    if (id == 0) return;
    wire::Reply reply;
    reply.set_id(id);
    if (!status.ok()) ToWire(status, reply.mutable_status());
    session->Reply(std::move(reply));
  };
}

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

// The collective timeouts from the environment, if set there (tests make
// them short): PATHWAYS_COLLECTIVE_TIMEOUT and
// PATHWAYS_COLLECTIVE_ARRIVAL_TIMEOUT, in seconds (HostExecutor::
// SetCollectiveTimeouts). InvalidArgument for a bad value.
absl::Status ConfigureCollectiveTimeouts(HostExecutor& executor) {
  absl::Duration timeouts[2] = {absl::ZeroDuration(), absl::ZeroDuration()};  // zero: the default
  const char* names[2] = {"PATHWAYS_COLLECTIVE_TIMEOUT", "PATHWAYS_COLLECTIVE_ARRIVAL_TIMEOUT"};
  bool any = false;
  for (int i = 0; i < 2; ++i) {
    const char* value = std::getenv(names[i]);
    if (value == nullptr || *value == '\0') continue;
    double seconds = 0;
    if (!absl::SimpleAtod(value, &seconds) || !(seconds >= 0.001) || seconds > 7 * 86400) {
      return absl::InvalidArgumentError(
          absl::StrCat(names[i], " must be a number of seconds in [0.001, 604800], got '", value, "'"));
    }
    timeouts[i] = absl::Seconds(seconds);
    any = true;
  }
  if (any) executor.SetCollectiveTimeouts(timeouts[0], timeouts[1]);
  return absl::OkStatus();
}

constexpr size_t kMaxRendezvousValueBytes = size_t{1} << 20;
constexpr int64_t kMaxRendezvousKeysPerHost = 65535;

// A host id in [0, num_hosts) written in decimal, or -1.
int ParseHostId(absl::string_view text, int num_hosts) {
  int id = -1;
  if (text.empty() || text.size() > 9 || !absl::SimpleAtoi(text, &id) || absl::StrCat(id) != text || id < 0 ||
      id >= num_hosts) {
    return -1;
  }
  return id;
}

}  // namespace

absl::Status CheckRendezvousScope(absl::string_view prefix, int num_hosts, int self, int peer, absl::string_view key,
                                  bool write) {
  const absl::string_view what = write ? "write" : "read";
  auto denied = [&](absl::string_view why) {
    return absl::PermissionDeniedError(absl::StrCat("rendezvous: ", peer < 0 ? std::string("this session") :
                                                                               absl::StrCat("host ", peer),
                                                    " may not ", what, " key '", key, "': ", why));
  };
  if (peer < 0) {
    return denied("the store serves the cluster's hosts only, and this session proved no host's identity (only "
                  "the cluster's secret)");
  }
  if (prefix.empty() || num_hosts <= 0) return denied("this host has not joined its cluster");
  if (!absl::StartsWith(key, prefix) || key.size() <= prefix.size() || key[prefix.size()] != '/') {
    return denied(absl::StrCat("it is not under this cluster's prefix '", prefix, "/'"));
  }
  const std::vector<absl::string_view> parts = absl::StrSplit(key.substr(prefix.size() + 1), '/');
  if (parts.size() == 2 && parts[0] == "data") {
    const int owner = ParseHostId(parts[1], num_hosts);
    if (owner < 0) return denied(absl::StrCat("'", parts[1], "' is no host of this cluster"));
    if (write && owner != peer) return denied(absl::StrCat("it is host ", owner, "'s entry"));
    return absl::OkStatus();
  }
  if (parts.size() >= 3 && parts[0] == "hosts") {
    std::vector<int> members;
    for (absl::string_view m : absl::StrSplit(parts[1], ',')) {
      const int id = ParseHostId(m, num_hosts);
      if (id < 0 || (!members.empty() && id <= members.back())) {
        return denied(absl::StrCat("'", parts[1], "' is no ascending list of this cluster's hosts"));
      }
      members.push_back(id);
    }
    if (members.size() < 2) return denied("a group has at least two hosts");
    if (members.front() != self) {
      return denied(absl::StrCat("the group meets in host ", members.front(), "'s store, not this one (host ", self,
                                 ")"));
    }
    if (std::find(members.begin(), members.end(), peer) == members.end()) {
      return denied(absl::StrCat("host ", peer, " is not in the group"));
    }
    if (!write) return absl::OkStatus();
    // Gloo writes each rank's addresses under the rank ("<r>"; other Gloo
    // versions "rank_<r>").
    absl::string_view last = parts.back();
    absl::ConsumePrefix(&last, "rank_");
    const int rank = ParseHostId(last, static_cast<int>(members.size()));
    if (rank < 0) return denied("a group's keys are written only as '<r>' or 'rank_<r>' (r a rank of the group)");
    if (members[rank] != peer) {
      return denied(absl::StrCat("rank ", rank, " of the group is host ", members[rank]));
    }
    return absl::OkStatus();
  }
  return denied("it is no rendezvous key ('data/<host>' or 'hosts/<group>/...') of this cluster");
}

HostProcess::HostProcess(std::string secret, std::string bind_ip, TestDelays delays)
    : incarnation_(RandomIncarnation()), secret_(std::move(secret)), bind_ip_(std::move(bind_ip)), delays_(delays) {}

absl::StatusOr<HostProcess::TestDelays> HostProcess::ParseTestDelays(absl::string_view text) {
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

void HostProcess::Heartbeat(const wire::Ping& ping, wire::Pong* pong) {
  pong->set_sent_ns(ping.sent_ns());
  pong->set_incarnation(incarnation_);
  pong->set_host_ns(NowNanos());
}

int HostProcess::store_sessions_opened(int host) const {
  return stores_ready_.load(std::memory_order_acquire) ? stores_->sessions_opened(host) : 0;
}

absl::Status HostProcess::HandlePeersLost(const wire::PeersLost& request) {
  if (stores_ready_.load(std::memory_order_acquire)) {
    for (int h : request.host_ids()) stores_->Lose(h, request.why());
  }
  std::shared_ptr<HostExecutor> executor = this->executor();
  return executor != nullptr ? executor->PeersLost(request) : absl::OkStatus();
}

HostProcess::~HostProcess() {
  if (join_thread_.joinable()) join_thread_.join();
  std::vector<std::thread> peer_threads;
  {
    MutexLock lock(&mu_);
    peer_threads.swap(peer_threads_);
  }
  for (std::thread& t : peer_threads) t.join();
  std::shared_ptr<HostExecutor> executor;
  {
    MutexLock lock(&mu_);
    executor = std::move(executor_);
  }
  executor.reset();  // before the rendezvous store it uses
}

std::shared_ptr<HostExecutor> HostProcess::executor() const {
  MutexLock lock(&mu_);
  return executor_;
}

void HostProcess::Handle(const std::shared_ptr<HostSession>& session, wire::Request request) {
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
      ToWireIfError(KvSet(*session, request.kv_set()), &reply);
      break;
    case wire::Request::kKvGet: {
      absl::StatusOr<std::string> value = KvGet(*session, request.kv_get());
      if (value.ok()) {
        reply.mutable_kv_value()->set_value(*std::move(value));
      } else {
        ToWire(value.status(), reply.mutable_status());
      }
      break;
    }
    case wire::Request::kJoin:
      Join(session, std::move(request));
      return;
    case wire::Request::kPeerJoined:
      PeerJoined(session, std::move(request));
      return;
    case wire::Request::kForward:
    case wire::Request::kCommit:
    case wire::Request::kServiceControl:
      // A tenant's requests of a service (service/service.h): a host takes
      // only what the service passes on, in the service's own session.
      ToWire(absl::InvalidArgumentError(absl::StrCat(
                 "a ",
                 request.kind_case() == wire::Request::kForward  ? "forward"
                 : request.kind_case() == wire::Request::kCommit ? "commit"
                                                                 : "service_control",
                 " request is for a service (pathways-server), not a host")),
             reply.mutable_status());
      break;
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

void HostProcess::Join(const std::shared_ptr<HostSession>& session, wire::Request request) {
  auto reply_with = StatusReply(session, request.id());
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
  // One key per host, 32 bytes each, none for this host (auth.h).
  const int num_hosts = join.host_addresses_size();
  absl::Status keys_ok;
  if (config.host_id() >= num_hosts) {
    keys_ok = absl::InvalidArgumentError(
        absl::StrCat("join: host ", config.host_id(), " is not among the cluster's ", num_hosts, " hosts"));
  } else if (join.peer_keys_size() != num_hosts) {
    keys_ok = absl::InvalidArgumentError(absl::StrCat("join: ", join.peer_keys_size(), " peer keys for ", num_hosts,
                                                      " hosts (a client of another version?)"));
  } else {
    for (int h = 0; h < num_hosts && keys_ok.ok(); ++h) {
      const size_t want = h == config.host_id() ? 0 : kPeerKeyBytes;
      if (join.peer_keys(h).size() != want) {
        keys_ok = absl::InvalidArgumentError(absl::StrCat("join: the peer key for host ", h, " has ",
                                                          join.peer_keys(h).size(), " bytes, not ", want));
      }
    }
  }
  if (!keys_ok.ok()) {
    MutexLock lock(&mu_);
    joining_ = false;
    reply_with(keys_ok);
    return;
  }
  for (int d : config.device_ids()) {
    if (d < 0 || d >= join.device_host_size() || join.device_host(d) != config.host_id()) {
      reply_with(absl::InvalidArgumentError(
          absl::StrCat("join: the cluster does not give device ", d, " to host ", config.host_id())));
      return;
    }
  }
  // From now on the other hosts' sessions can prove who they are.
  {
    MutexLock lock(&mu_);
    group_prefix_ = join.group_prefix();
    num_hosts_ = num_hosts;
    peer_keys_.assign(join.peer_keys().begin(), join.peer_keys().end());
    keys_written_.assign(num_hosts, 0);
  }
  // Connecting blocks until every host has joined: not on a gRPC thread.
  join_thread_ = std::thread([this, session, id = request.id(), config, request = std::move(request), reply_with]() {
    const wire::JoinCluster& join = request.join();
    stores_ = std::make_unique<PeerStores>(
        config.host_id(), &kv_, std::vector<std::string>(join.host_addresses().begin(), join.host_addresses().end()),
        std::vector<std::string>(join.peer_keys().begin(), join.peer_keys().end()));
    // A process that replaces a lost host: the hosts lost now (no data
    // plane address) are lost to it from the start.
    wire::PeersLost lost;
    for (int h = 0; h < join.data_addresses_size(); ++h) {
      if (h != config.host_id() && join.data_addresses(h).empty()) lost.add_host_ids(h);
    }
    lost.set_why("lost before this process joined");
    for (int h : lost.host_ids()) stores_->Lose(h, lost.why());
    stores_ready_.store(true, std::memory_order_release);
    auto executor = std::make_shared<HostExecutor>(config, join, stores_.get(), bind_ip_, secret_);
    if (absl::Status timeouts = ConfigureCollectiveTimeouts(*executor); !timeouts.ok()) {
      reply_with(timeouts);
      return;
    }
    absl::Status connected = executor->PeersLost(lost);
    if (connected.ok()) connected = executor->ConnectDataPlane();
    if (!connected.ok()) {
      reply_with(connected);
      return;
    }
    wire::Reply reply;
    reply.set_id(id);
    reply.mutable_joined()->set_data_address(executor->data_address());
    {
      MutexLock lock(&mu_);
      executor_ = std::move(executor);
    }
    if (id != 0) session->Reply(std::move(reply));
  });
}

void HostProcess::PeerJoined(const std::shared_ptr<HostSession>& session, wire::Request request) {
  auto reply_with = StatusReply(session, request.id());
  const wire::PeerJoined& joined = request.peer_joined();
  const int host = joined.host_id();
  std::shared_ptr<HostExecutor> executor;
  {
    MutexLock lock(&mu_);
    if (owner_ == 0 || session->id() != owner_) {
      reply_with(absl::PermissionDeniedError("peer_joined: only the client that configured this host may say so"));
      return;
    }
    if (executor_ == nullptr) {
      reply_with(absl::FailedPreconditionError("peer_joined: this host has not joined its cluster yet"));
      return;
    }
    if (host < 0 || host >= num_hosts_ || host == config_.host_id()) {
      reply_with(absl::InvalidArgumentError(
          absl::StrCat("peer_joined: no other host ", host, " in this cluster of ", num_hosts_, " hosts")));
      return;
    }
    if (joined.peer_key().size() != kPeerKeyBytes) {
      reply_with(absl::InvalidArgumentError(absl::StrCat("peer_joined: the peer key for host ", host, " has ",
                                                         joined.peer_key().size(), " bytes, not ", kPeerKeyBytes)));
      return;
    }
    // From now on only the new process proves it is that host.
    peer_keys_[host] = joined.peer_key();
    keys_written_[host] = 0;
    executor = executor_;
  }
  stores_->Rejoin(host, joined.address(), joined.peer_key());
  if (absl::Status status = executor->PeerJoined(host, joined.epoch()); !status.ok()) {
    reply_with(status);
    return;
  }
  // Connecting waits for the new process: not on a gRPC thread.
  std::thread connect([executor, host, key = joined.peer_key(), reply_with] {
    reply_with(executor->ConnectPeer(host, key));
  });
  MutexLock lock(&mu_);
  peer_threads_.push_back(std::move(connect));
}

absl::StatusOr<std::string> HostProcess::TenantKey(uint64_t tenant) {
  MutexLock lock(&mu_);
  auto it = tenant_keys_.find(tenant);
  if (it == tenant_keys_.end()) {
    return absl::UnauthenticatedError(absl::StrCat("tenant ", tenant, " is not (or no longer) a tenant of this host"));
  }
  return it->second;
}

absl::StatusOr<std::string> HostProcess::PeerKey(int host) {
  MutexLock lock(&mu_);
  if (peer_keys_.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("this host has not joined its cluster yet, so host ", host, "'s key is not known yet"));
  }
  if (host < 0 || host >= num_hosts_ || peer_keys_[host].empty()) {
    return absl::PermissionDeniedError(
        absl::StrCat("no host ", host, " of this cluster (of ", num_hosts_, " hosts) may open a host session here"));
  }
  return peer_keys_[host];
}

absl::Status HostProcess::KvSet(const HostSession& session, const wire::KvSet& request) {
  {
    MutexLock lock(&mu_);
    PW_RETURN_IF_ERROR(CheckRendezvousScope(group_prefix_, num_hosts_, config_.host_id(), session.peer_host(),
                                            request.key(), /*write=*/true));
    if (request.value().size() > kMaxRendezvousValueBytes) {
      return absl::PermissionDeniedError(absl::StrCat("rendezvous: the value for '", request.key(), "' has ",
                                                      request.value().size(), " bytes, more than ",
                                                      kMaxRendezvousValueBytes));
    }
    int64_t& written = keys_written_[session.peer_host()];
    if (written >= kMaxRendezvousKeysPerHost) {
      return absl::PermissionDeniedError(absl::StrCat("rendezvous: host ", session.peer_host(), " wrote ",
                                                      kMaxRendezvousKeysPerHost, " keys here already"));
    }
    ++written;
  }
  return kv_.Set(request.key(), request.value());
}

absl::StatusOr<std::string> HostProcess::KvGet(const HostSession& session, const wire::KvGet& request) {
  {
    MutexLock lock(&mu_);
    PW_RETURN_IF_ERROR(CheckRendezvousScope(group_prefix_, num_hosts_, config_.host_id(), session.peer_host(),
                                            request.key(), /*write=*/false));
  }
  absl::StatusOr<std::string> value = kv_.Get(request.key(), absl::Now());
  if (!value.ok()) return absl::NotFoundError(absl::StrCat("no key '", request.key(), "' yet"));
  return value;
}

bool HostProcess::HandleProgramRequest(const std::shared_ptr<HostSession>& session, wire::Request& request) {
  const uint64_t id = request.id();
  auto reply_with = StatusReply(session, id);
  switch (request.kind_case()) {
    case wire::Request::kDefineDevices:
    case wire::Request::kLoadFunction:
    case wire::Request::kLoadProgram:
    case wire::Request::kPut:
    case wire::Request::kRun:
    case wire::Request::kFetch:
    case wire::Request::kFree:
    case wire::Request::kUnload:
    case wire::Request::kDescribeQueues:
    case wire::Request::kFailDevices:
    case wire::Request::kCancelRun:
    case wire::Request::kCancelRuns:
    case wire::Request::kRenewGroup:
    case wire::Request::kPeersLost:
    case wire::Request::kEndSession:
    case wire::Request::kTenantKey:
    case wire::Request::kSaveShards:
    case wire::Request::kLoadShards:
      break;
    default:
      return false;
  }
  // A service's tenant, in a session of its own, moves its bulk data: puts
  // and fetches of its own session's buffers, nothing else.
  const uint64_t tenant = session->tenant();
  const bool bulk = request.kind_case() == wire::Request::kPut || request.kind_case() == wire::Request::kFetch;
  std::shared_ptr<HostExecutor> executor;
  {
    MutexLock lock(&mu_);
    if (tenant != 0 && !bulk) {
      reply_with(absl::PermissionDeniedError(
          "a tenant's own session with a host moves only its data (puts and fetches); the rest goes through its "
          "service"));
      return true;
    }
    if (tenant != 0 && !tenant_keys_.contains(tenant)) {
      reply_with(absl::PermissionDeniedError(absl::StrCat("tenant ", tenant, " has ended")));
      return true;
    }
    if (tenant == 0 && (owner_ == 0 || session->id() != owner_)) {
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
  // The ids a request names are its client's session's (the executor keys
  // its tables by session): the owner's own (kOneSession, Request.session
  // 0), or, when the owner is a service, the tenant's that the request
  // names (the same on every host; service/service.h).
  const SessionId ids_session = tenant != 0 ? tenant : request.session();
  switch (request.kind_case()) {
    case wire::Request::kDefineDevices:
      reply_with(executor->DefineDevices(request.define_devices(), ids_session));
      break;
    case wire::Request::kLoadFunction:
      if (delays_.load_function_ns > 0) std::this_thread::sleep_for(std::chrono::nanoseconds(delays_.load_function_ns));
      reply_with(executor->LoadFunction(request.load_function(), ids_session));
      break;
    case wire::Request::kLoadProgram:
      reply_with(executor->LoadProgram(request.load_program(), ids_session));
      break;
    case wire::Request::kPut:
      if (delays_.put_ns > 0) std::this_thread::sleep_for(std::chrono::nanoseconds(delays_.put_ns));
      reply_with(executor->Put(*request.mutable_put(), ids_session));
      break;
    case wire::Request::kRun:
      executor->Run(
          request.run(),
          [session, id](absl::StatusOr<wire::RunReply> result) {
            if (id == 0) return;
            wire::Reply reply;
            reply.set_id(id);
            if (result.ok()) {
              *reply.mutable_run() = *std::move(result);
            } else {
              ToWire(result.status(), reply.mutable_status());
            }
            session->Reply(std::move(reply));
          },
          ids_session);
      break;
    case wire::Request::kFetch:
      executor->Fetch(
          request.fetch(),
          [session, id](absl::StatusOr<std::string> data) {
            wire::Reply reply;
            reply.set_id(id);
            if (data.ok()) {
              reply.mutable_fetch()->set_data(*std::move(data));
            } else {
              ToWire(data.status(), reply.mutable_status());
            }
            session->Reply(std::move(reply));
          },
          ids_session);
      break;
    case wire::Request::kFree:
      executor->Free(request.free(), ids_session);
      break;
    case wire::Request::kSaveShards:
    case wire::Request::kLoadShards: {
      // The client's own: writing or reading files on this host's machine is
      // not a service's tenant's to ask (a service does not forward it).
      const bool save = request.kind_case() == wire::Request::kSaveShards;
      if (request.session() != 0) {
        reply_with(absl::PermissionDeniedError(
            absl::StrCat("a tenant may not have a host ", save ? "write" : "read", " a checkpoint")));
        break;
      }
      auto answer = StatusReply(session, id);
      if (save) {
        executor->SaveShards(request.save_shards(), std::move(answer), ids_session);
      } else {
        executor->LoadShards(request.load_shards(), std::move(answer), ids_session);
      }
      break;
    }
    case wire::Request::kUnload:
      executor->Unload(request.unload(), ids_session);
      break;
    case wire::Request::kFailDevices:
      reply_with(executor->FailDevices(request.fail_devices()));
      break;
    case wire::Request::kCancelRun:
      executor->CancelRun(request.cancel_run(), ids_session);
      reply_with(absl::OkStatus());
      break;
    case wire::Request::kCancelRuns: {
      wire::Reply reply;
      reply.set_id(id);
      *reply.mutable_cancelled() = executor->CancelRuns(request.cancel_runs(), ids_session);
      if (id != 0) session->Reply(std::move(reply));
      break;
    }
    case wire::Request::kRenewGroup:
      reply_with(executor->RenewGroup(request.renew_group().hosts(), ids_session));
      break;
    case wire::Request::kDescribeQueues: {
      wire::Reply reply;
      reply.set_id(id);
      *reply.mutable_queues() = executor->DescribeQueues(ids_session);
      if (id != 0) session->Reply(std::move(reply));
      break;
    }
    case wire::Request::kEndSession:
      // The owner's own session ends with its stream (see host_main.h).
      if (ids_session == kOneSession) {
        reply_with(absl::InvalidArgumentError(
            "end_session: session 0 is the owner's own, which ends when its stream closes; name a tenant's"));
        break;
      }
      {
        MutexLock lock(&mu_);
        tenant_keys_.erase(ids_session);  // no new session of the tenant
      }
      // Replied to once it has all taken effect, from the executor's thread.
      executor->EndSession(ids_session, request.end_session().reason(), std::move(reply_with));
      break;
    case wire::Request::kTenantKey: {
      absl::Status status;
      if (ids_session == kOneSession || request.tenant_key().key().size() != kPeerKeyBytes) {
        status = absl::InvalidArgumentError(
            absl::StrCat("tenant_key: a tenant's key is ", kPeerKeyBytes, " bytes, for a session other than 0"));
      } else {
        MutexLock lock(&mu_);
        tenant_keys_[ids_session] = request.tenant_key().key();
      }
      reply_with(status);
      break;
    }
    default:
      break;
  }
  return true;
}

wire::Reply HostProcess::HandleHello(const std::shared_ptr<HostSession>& session, const wire::Hello& hello) {
  wire::Reply reply;
  MutexLock lock(&mu_);
  if (hello.has_config()) {
    // A client that configures this host will send it functions and
    // programs: it must speak this build's protocol and ops.
    absl::Status status = CheckPeerVersions(absl::StrCat("the client '", hello.client_name(), "'"),
                                            hello.protocol_version(), hello.op_registry_version());
    status.Update(CheckConfig(hello.config()));
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
  reply.mutable_hello()->set_protocol_version(kControlProtocolVersion);
  reply.mutable_hello()->set_op_registry_version(kOpRegistryVersion);
  *reply.mutable_hello()->mutable_config() = config_;
  return reply;
}

void HostProcess::OnSessionEnd(const std::shared_ptr<HostSession>& session) {
  MutexLock lock(&mu_);
  if (session->id() == owner_) {
    owner_gone_ = true;
    cv_.SignalAll();
  }
}

bool HostProcess::configured() const {
  MutexLock lock(&mu_);
  return owner_ != 0;
}

bool HostProcess::owner_gone() const {
  MutexLock lock(&mu_);
  return owner_gone_;
}

bool HostProcess::AwaitOwnerGone(int64_t timeout_ns) const {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::nanoseconds(timeout_ns);
  MutexLock lock(&mu_);
  while (!owner_gone_) {
    if (!cv_.WaitUntil(&mu_, deadline)) return owner_gone_;
  }
  return true;
}

}  // namespace pw
