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
  sessions->on_lost_ = std::move(on_lost);
  sessions->loss_handled_.reset(new std::atomic<bool>[hosts.size()]);
  for (size_t h = 0; h < hosts.size(); ++h) sessions->loss_handled_[h].store(false, std::memory_order_relaxed);
  const TopologyOptions& topology = cluster.options();
  for (const Host* host : hosts) {
    wire::Hello hello;
    hello.set_protocol_version(kControlProtocolVersion);
    hello.set_op_registry_version(kOpRegistryVersion);
    wire::HostConfig* config = hello.mutable_config();
    config->set_host_id(host->id());
    config->set_island_id(host->island()->id());
    for (const Device* d : host->devices()) config->add_device_ids(d->id());
    config->set_device_memory_bytes(topology.device_memory_bytes);
    config->set_executor_threads(topology.num_executor_threads);
    ChannelOptions host_options = options;
    host_options.host_name = absl::StrCat("host ", host->id(), " (", addresses[host->id()], ")");
    host_options.on_lost = [p = sessions.get(), id = host->id()](const absl::Status& why) { p->OnLost(id, why); };
    auto channel = HostChannel::Connect(addresses[host->id()], std::move(hello), host_options);
    if (!channel.ok()) return channel.status();
    // A host that checks no versions (older) answers none: refused here.
    const wire::HelloReply& reply = (*channel)->hello_reply();
    PW_RETURN_IF_ERROR(
        CheckPeerVersions(host_options.host_name, reply.protocol_version(), reply.op_registry_version()));
    MutexLock lock(&sessions->mu_);
    sessions->channels_.push_back(*std::move(channel));
  }
  return sessions;
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
  for (int h = 0; h < n; ++h) {
    wire::Request request;
    *request.mutable_join() = join;
    for (std::string& key : peer_keys[h]) request.mutable_join()->add_peer_keys(std::move(key));
    channels_[h]->Send(std::move(request), [replies, h](absl::StatusOr<wire::Reply> reply) {
      absl::Status status = reply.ok() ? ReplyStatus(*reply) : reply.status();
      if (!status.ok()) status = absl::Status(status.code(), absl::StrCat("host ", h, ": ", status.message()));
      replies->Done(std::move(status));
    });
    channels_[h]->Flush();
  }
  return replies->Wait(timeout_ns, "joining the hosts into one cluster");
}

void HostSessions::SendRun(const std::vector<int>& hosts, std::vector<wire::Request> requests,
                           std::vector<HostChannel::ReplyCallback> done, const RunAdmissionInfo&) {
  // The caller sends under one lock: every host sees its runs in its order.
  for (size_t k = 0; k < hosts.size(); ++k) channels_[hosts[k]]->Send(std::move(requests[k]), std::move(done[k]));
  for (int h : hosts) channels_[h]->Flush();
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
    for (int h = 0; h < static_cast<int>(channels_.size()); ++h) {
      HostChannel& survivor = *channels_[h];
      if (h == host || !survivor.alive()) continue;
      wire::Request request;
      request.mutable_peers_lost()->add_host_ids(host);
      request.mutable_peers_lost()->set_why(std::string(why.message()));
      survivor.Send(std::move(request), nullptr);
      survivor.Flush();
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
    const HostChannel& c = *channels_[host->id()];
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
