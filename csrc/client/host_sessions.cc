#include "csrc/client/host_sessions.h"

#include <chrono>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "csrc/coordination/auth.h"
#include "csrc/base/status_macros.h"
#include "csrc/coordination/protocol_version.h"
#include "csrc/base/error_kind.h"

namespace pw {
namespace {

std::string FreshGroupPrefix() {
  std::random_device device;
  return absl::StrFormat("cluster-%08x%08x", device(), device());
}


}  // namespace

absl::StatusOr<std::unique_ptr<HostSessions>> HostSessions::Connect(const Cluster& cluster,
                                                            const std::vector<std::string>& addresses,
                                                            const ChannelOptions& options, LostCallback on_lost) {
  const auto& hosts = cluster.hosts();
  if (addresses.size() != hosts.size()) {
    return absl::InvalidArgumentError(absl::StrCat("the topology has ", hosts.size(), " hosts but ",
                                                   addresses.size(), " host addresses were given"));
  }
  std::unique_ptr<HostSessions> sessions(new HostSessions());
  sessions->cluster_ = &cluster;
  sessions->options_ = options;
  sessions->num_hosts_ = static_cast<int>(hosts.size());
  sessions->on_lost_ = std::move(on_lost);
  sessions->loss_handled_.reset(new std::atomic<bool>[hosts.size()]);
  sessions->current_.reset(new std::atomic<HostChannel*>[hosts.size()]);
  for (size_t h = 0; h < hosts.size(); ++h) {
    sessions->loss_handled_[h].store(false, std::memory_order_relaxed);
    sessions->current_[h].store(nullptr, std::memory_order_relaxed);
  }
  for (const Host* host : hosts) {
    auto channel = sessions->ConnectHost(*host, addresses[host->id()]);
    if (!channel.ok()) return channel.status();
    MutexLock lock(&sessions->mu_);
    sessions->current_[host->id()].store(channel->get(), std::memory_order_release);
    sessions->channels_.push_back(*std::move(channel));
  }
  return sessions;
}

absl::StatusOr<std::unique_ptr<HostChannel>> HostSessions::ConnectHost(const Host& host, const std::string& address) {
  const TopologyOptions& topology = cluster_->options();
  wire::Hello hello;
  hello.set_protocol_version(kControlProtocolVersion);
  hello.set_op_registry_version(kOpRegistryVersion);
  wire::HostConfig* config = hello.mutable_config();
  config->set_host_id(host.id());
  config->set_island_id(host.island()->id());
  for (const Device* d : host.devices()) config->add_device_ids(d->id());
  config->set_device_memory_bytes(topology.device_memory_bytes);
  config->set_executor_threads(topology.num_executor_threads);
  ChannelOptions host_options = options_;
  host_options.host_name = absl::StrCat("host ", host.id(), " (", address, ")");
  host_options.on_lost = [this, id = host.id()](const absl::Status& why) { OnLost(id, why); };
  auto channel = HostChannel::Connect(address, std::move(hello), host_options);
  if (!channel.ok()) return channel.status();
  // A host that checks no versions (older) answers none: refused here.
  const wire::HelloReply& reply = (*channel)->hello_reply();
  PW_RETURN_IF_ERROR(CheckPeerVersions(host_options.host_name, reply.protocol_version(), reply.op_registry_version()));
  return channel;
}

void HostSessions::Close(const absl::Status& why) {
  for (int h = 0; h < num_hosts_; ++h) channel(h).Close(why);
}


absl::Status HostSessions::Join(const std::vector<std::string>& addresses, int64_t timeout_ns) {
  wire::JoinCluster join;
  for (const Device* d : cluster_->devices()) join.add_device_host(d->host()->id());
  for (const std::string& address : addresses) join.add_host_addresses(address);
  join.set_group_prefix(FreshGroupPrefix());
  // A key for every pair of hosts, which only those two get (auth.h): with
  // it each proves which host it is to the other's rendezvous store and
  // data plane.
  const int n = num_hosts();
  std::vector<std::vector<std::string>> peer_keys(n, std::vector<std::string>(n));
  for (int a = 0; a < n; ++a) {
    for (int b = a + 1; b < n; ++b) {
      PW_ASSIGN_OR_RETURN(peer_keys[a][b], RandomBytes(kPeerKeyBytes));
      peer_keys[b][a] = peer_keys[a][b];
    }
  }
  // Every host at once: each one's join waits for all the others.
  // Shared with the callbacks: a reply may come after a timed-out wait.
  auto replies = std::make_shared<HostReplies>(n);
  // Each host's data plane address, as it answers (kept for replacements).
  auto data_addresses = std::make_shared<std::vector<std::string>>(n);
  auto data_mu = std::make_shared<Mutex>();
  for (int h = 0; h < n; ++h) {
    wire::Request request;
    *request.mutable_join() = join;
    for (std::string& key : peer_keys[h]) request.mutable_join()->add_peer_keys(std::move(key));
    channel(h).Send(std::move(request), [replies, data_addresses, data_mu, h](absl::StatusOr<wire::Reply> reply) {
      absl::Status status = reply.ok() ? ReplyStatus(*reply) : reply.status();
      if (!status.ok()) status = absl::Status(status.code(), absl::StrCat("host ", h, ": ", status.message()));
      if (status.ok()) {
        MutexLock lock(data_mu.get());
        (*data_addresses)[h] = reply->joined().data_address();
      }
      replies->Done(std::move(status));
    });
    channel(h).Flush();
  }
  PW_RETURN_IF_ERROR(replies->Wait(timeout_ns, "joining the hosts into one cluster"));
  MutexLock data_lock(data_mu.get());
  MutexLock lock(&replace_mu_);
  group_prefix_ = join.group_prefix();
  addresses_ = addresses;
  data_addresses_ = *data_addresses;
  epochs_.assign(n, 0);
  return absl::OkStatus();
}

absl::Status HostSessions::ReplaceHost(int host, const std::string& address, uint64_t first_buffer_id,
                                       int64_t timeout_ns) {
  if (host < 0 || host >= num_hosts_) {
    return absl::InvalidArgumentError(absl::StrCat("host ", host, " is not in the cluster (of ", num_hosts_, " hosts)"));
  }
  MutexLock replacing(&replace_mu_);
  if (group_prefix_.empty()) return absl::FailedPreconditionError("the hosts were never joined into a cluster");
  if (channel(host).alive() || !loss_handled_[host].load(std::memory_order_acquire)) {
    return absl::FailedPreconditionError(
        absl::StrCat("host ", host, " is not lost: only a lost host's place can be taken by a new process"));
  }
  PW_ASSIGN_OR_RETURN(std::unique_ptr<HostChannel> fresh, ConnectHost(*cluster_->hosts()[host], address));
  HostChannel* joining = fresh.get();
  {
    MutexLock lock(&mu_);
    if (closing_) return absl::CancelledError("the sessions are closing");
    loss_handled_[host].store(false, std::memory_order_release);
    current_[host].store(joining, std::memory_order_release);
    channels_.push_back(std::move(fresh));
  }
  const int epoch = ++epochs_[host];
  addresses_[host] = address;
  // The new process's join: the others as they are now (a lost one has no
  // data plane address: it is left out), and a fresh key for each of its
  // pairs, which the other host of the pair gets in its PeerJoined.
  wire::Request join_request;
  wire::JoinCluster& join = *join_request.mutable_join();
  for (const Device* d : cluster_->devices()) join.add_device_host(d->host()->id());
  for (const std::string& a : addresses_) join.add_host_addresses(a);
  join.set_group_prefix(group_prefix_);
  join.set_first_buffer_id(first_buffer_id);
  std::vector<int> survivors;
  std::vector<std::string> keys(num_hosts_);
  for (int h = 0; h < num_hosts_; ++h) {
    join.add_host_epochs(epochs_[h]);
    const bool live = h != host && channel(h).alive();
    join.add_data_addresses(live ? data_addresses_[h] : std::string());
    if (h != host) {
      PW_ASSIGN_OR_RETURN(keys[h], RandomBytes(kPeerKeyBytes));
    }
    join.add_peer_keys(keys[h]);
    if (live) survivors.push_back(h);
  }
  auto replies = std::make_shared<HostReplies>(static_cast<int>(survivors.size()) + 1);
  auto data_address = std::make_shared<std::string>();
  auto data_mu = std::make_shared<Mutex>();
  joining->Send(std::move(join_request), [replies, data_address, data_mu, host](absl::StatusOr<wire::Reply> reply) {
    absl::Status status = reply.ok() ? ReplyStatus(*reply) : reply.status();
    if (status.ok()) {
      MutexLock lock(data_mu.get());
      *data_address = reply->joined().data_address();
    } else {
      status = absl::Status(status.code(), absl::StrCat("the new host ", host, ": ", status.message()));
    }
    replies->Done(std::move(status));
  });
  joining->Flush();
  for (int h : survivors) {
    wire::Request request;
    wire::PeerJoined& joined = *request.mutable_peer_joined();
    joined.set_host_id(host);
    joined.set_address(address);
    joined.set_peer_key(keys[h]);
    joined.set_epoch(epoch);
    channel(h).Send(std::move(request), [replies, h](absl::StatusOr<wire::Reply> reply) {
      absl::Status status = reply.ok() ? ReplyStatus(*reply) : reply.status();
      if (!status.ok()) status = absl::Status(status.code(), absl::StrCat("host ", h, ": ", status.message()));
      replies->Done(std::move(status));
    });
    channel(h).Flush();
  }
  absl::Status status = replies->Wait(timeout_ns, absl::StrCat("a new process taking host ", host, "'s place"));
  if (!status.ok()) {
    // It stays lost: its new session goes as a loss (the others are told).
    joining->Lose(status);
    return status;
  }
  MutexLock data_lock(data_mu.get());
  data_addresses_[host] = *data_address;
  return absl::OkStatus();
}

void HostSessions::SendRun(const std::vector<int>& hosts, std::vector<wire::Request> requests,
                           std::vector<HostChannel::ReplyCallback> done, const RunAdmissionInfo&) {
  // The caller sends under one lock: every host sees its runs in its order.
  for (size_t k = 0; k < hosts.size(); ++k) channel(hosts[k]).Send(std::move(requests[k]), std::move(done[k]));
  for (int h : hosts) channel(h).Flush();
}

HostSessions::~HostSessions() {
  {
    MutexLock lock(&mu_);
    closing_ = true;
  }
  channels_.clear();  // each closes its session; no loss is reported for that
}

void HostSessions::OnLost(int host, const absl::Status& why) {
  {
    // Only queued and flushed here (nothing waits for a reply): this runs on
    // the lost channel's gRPC or heartbeat thread.
    MutexLock lock(&mu_);
    if (closing_) return;
    // An earlier session's loss (a new process took its place), or one
    // that Connect or ReplaceHost opened and is dropping.
    const HostChannel* now = current_[host].load(std::memory_order_acquire);
    if (now == nullptr || now->alive()) return;
    for (int h = 0; h < num_hosts_; ++h) {
      HostChannel* survivor = current_[h].load(std::memory_order_acquire);
      if (h == host || survivor == nullptr || !survivor->alive()) continue;
      wire::Request request;
      request.mutable_peers_lost()->add_host_ids(host);
      request.mutable_peers_lost()->set_why(std::string(why.message()));
      survivor->Send(std::move(request), nullptr);
      survivor->Flush();
      survivors_told_.fetch_add(1, std::memory_order_relaxed);
    }
  }
  if (on_lost_) on_lost_(host, why);
  MutexLock lock(&mu_);
  loss_handled_[host].store(true, std::memory_order_release);
  handled_cv_.SignalAll();
}

std::vector<RemoteHostInfo> HostSessions::hosts() const {
  std::vector<RemoteHostInfo> out;
  for (const Host* host : cluster_->hosts()) {
    const HostChannel& c = channel(host->id());
    RemoteHostInfo info;
    info.id = host->id();
    info.island = host->island()->id();
    info.address = c.address();
    info.pid = c.hello_reply().pid();
    info.incarnation = c.hello_reply().incarnation();
    absl::Status status = c.status();
    if (GetErrorKind(status) == ErrorKind::kHostLost && !loss_handled_[host->id()].load(std::memory_order_acquire)) {
      // Being dealt with on another thread (OnLost blocks on nothing), or
      // never, if the sessions are closing: then it shows as alive a while.
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
      MutexLock lock(&mu_);
      while (!loss_handled_[host->id()].load(std::memory_order_acquire) && !closing_) {
        if (!handled_cv_.WaitUntil(&mu_, deadline)) break;
      }
      if (!loss_handled_[host->id()].load(std::memory_order_acquire)) status = absl::OkStatus();
    }
    info.status = std::move(status);
    out.push_back(std::move(info));
  }
  return out;
}

}  // namespace pw
