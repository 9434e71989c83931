#include "csrc/client/service_link.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "csrc/base/error_kind.h"
#include "csrc/base/status_macros.h"
#include "csrc/coordination/protocol_version.h"

namespace pw {
namespace {

// How long a tenant waits for the service's answer to a setting or report.
constexpr int64_t kServiceCallTimeoutNs = int64_t{10} * 1'000'000'000;

}  // namespace

absl::StatusOr<std::unique_ptr<ServiceLink>> ServiceLink::Connect(const TenantOptions& options) {
  wire::Hello hello;
  hello.set_client_name(options.name);
  hello.set_protocol_version(kControlProtocolVersion);
  hello.set_op_registry_version(kOpRegistryVersion);
  hello.set_tenant(true);
  hello.set_priority(options.priority);
  ChannelOptions channel_options;
  channel_options.secret = options.secret;
  channel_options.host_name = absl::StrCat("the pathways service at ", options.address);
  channel_options.client_name = options.name;
  channel_options.connect_timeout_ns = options.connect_timeout_ns;
  channel_options.heartbeat_timeout_ns = int64_t{3} * 1'000'000'000;
  auto channel = HostChannel::Connect(options.address, std::move(hello), channel_options);
  if (!channel.ok()) return channel.status();
  const wire::HelloReply& reply = (*channel)->hello_reply();
  PW_RETURN_IF_ERROR(
      CheckPeerVersions(channel_options.host_name, reply.protocol_version(), reply.op_registry_version()));
  if (!reply.has_tenant() || reply.tenant().session() == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        options.address, " is not a pathways service (it took no tenant): a host process? Start one with "
                         "pathways-server and connect to the address it prints"));
  }
  auto link = std::unique_ptr<ServiceLink>(new ServiceLink());
  link->options_ = options;
  link->tenant_ = reply.tenant();
  link->channel_ = *std::move(channel);
  // Its devices and memory, once they are free (the service answers when
  // its wait is over; the call's own timeout only guards a lost answer).
  {
    wire::Request reserve;
    wire::Reserve* r = reserve.mutable_service_control()->mutable_reserve();
    r->set_devices(options.devices);
    r->set_memory_bytes(options.memory_bytes);
    r->set_wait_ns(options.wait_timeout_ns);
    PW_ASSIGN_OR_RETURN(wire::Reply granted, link->channel_->Call(std::move(reserve),
                                                                  options.wait_timeout_ns + kServiceCallTimeoutNs));
    if (!granted.has_grant() || granted.grant().device_ids_size() == 0) {
      return absl::FailedPreconditionError(absl::StrCat("the service at ", options.address, " granted no devices"));
    }
    link->grant_ = granted.grant();
  }
  // Its own sessions with the hosts, for bulk data; a host it cannot reach
  // (another network) gets its data through the service.
  const int n = link->num_hosts();
  link->direct_.resize(n);
  {
    MutexLock lock(&link->mu_);
    link->direct_unflushed_.assign(n, false);
  }
  {
    MutexLock lock(&link->puts_mu_);
    link->lists_pending_.assign(n, 0);
  }
  if (!link->tenant_.host_key().empty()) {
    for (int h = 0; h < n; ++h) {
      wire::Hello host_hello;
      host_hello.set_client_name(options.name);
      host_hello.set_protocol_version(kControlProtocolVersion);
      host_hello.set_op_registry_version(kOpRegistryVersion);
      ChannelOptions direct;
      direct.secret = link->tenant_.host_key();
      direct.claim_tenant = link->tenant_.session();
      direct.host_name = absl::StrCat("host ", h, " (", link->tenant_.host_addresses(h), ")");
      direct.client_name = options.name;
      direct.connect_timeout_ns = int64_t{2} * 1'000'000'000;
      direct.heartbeat_period_ns = 0;  // the service watches the hosts; a lost host ends this stream too
      auto host = HostChannel::Connect(link->tenant_.host_addresses(h), std::move(host_hello), direct);
      if (host.ok()) link->direct_[h] = *std::move(host);
    }
  }
  return link;
}

ServiceLink::~ServiceLink() {
  // The direct sessions first: their callbacks (puts answered) use this.
  for (auto& d : direct_) d.reset();
  channel_.reset();
}

int ServiceLink::direct_hosts() const {
  int n = 0;
  for (const auto& d : direct_) n += d != nullptr ? 1 : 0;
  return n;
}

void ServiceLink::AwaitPuts() {
  {
    MutexLock lock(&puts_mu_);
    if (puts_pending_ == 0) return;
  }
  for (size_t h = 0; h < direct_.size(); ++h) {
    if (direct_unflushed_[h]) {
      direct_[h]->Flush();
      direct_unflushed_[h] = false;
    }
  }
  MutexLock lock(&puts_mu_);
  while (puts_pending_ > 0) puts_cv_.Wait(&puts_mu_);
}

void ServiceLink::AwaitLists(int host) {
  {
    MutexLock lock(&puts_mu_);
    if (lists_pending_[host] == 0) return;
  }
  if (uncommitted_) {
    wire::Request commit;
    commit.mutable_commit();
    channel_->Send(std::move(commit), nullptr);
    uncommitted_ = false;
  }
  channel_->Flush();
  MutexLock lock(&puts_mu_);
  while (lists_pending_[host] > 0) puts_cv_.Wait(&puts_mu_);
}

void ServiceLink::ForwardLocked(int host, wire::Request request, HostChannel::ReplyCallback done) {
  if (Bulk(request) && direct_[host] != nullptr) {
    AwaitLists(host);  // a put finds its list
    if (request.kind_case() == wire::Request::kPut) {
      {
        MutexLock lock(&puts_mu_);
        ++puts_pending_;
      }
      // Answered once the host has taken it (or the session is lost).
      done = [this, done = std::move(done)](absl::StatusOr<wire::Reply> reply) mutable {
        if (done) std::move(done)(std::move(reply));
        MutexLock lock(&puts_mu_);
        if (--puts_pending_ == 0) puts_cv_.SignalAll();
      };
    }
    direct_[host]->Send(std::move(request), std::move(done));
    direct_unflushed_[host] = true;
    return;
  }
  AwaitPuts();  // nothing overtakes a put sent directly
  if (request.kind_case() == wire::Request::kDefineDevices && direct_[host] != nullptr) {
    {
      MutexLock lock(&puts_mu_);
      ++lists_pending_[host];
    }
    done = [this, host, done = std::move(done)](absl::StatusOr<wire::Reply> reply) mutable {
      if (done) std::move(done)(std::move(reply));
      MutexLock lock(&puts_mu_);
      if (--lists_pending_[host] == 0) puts_cv_.SignalAll();
    };
  }
  wire::Request forward;
  forward.mutable_forward()->set_host(host);
  *forward.mutable_forward()->mutable_request() = std::move(request);
  channel_->Send(std::move(forward), std::move(done));
  uncommitted_ = true;
}

void ServiceLink::Send(int host, wire::Request request, HostChannel::ReplyCallback done) {
  MutexLock lock(&mu_);
  ForwardLocked(host, std::move(request), std::move(done));
}

void ServiceLink::Flush(int host) {
  MutexLock lock(&mu_);
  if (direct_unflushed_[host]) {
    direct_[host]->Flush();
    direct_unflushed_[host] = false;
  }
  if (!uncommitted_) return;
  wire::Request commit;
  commit.mutable_commit();
  channel_->Send(std::move(commit), nullptr);
  uncommitted_ = false;
  channel_->Flush();
}

void ServiceLink::SendRun(const std::vector<int>& hosts, std::vector<wire::Request> requests,
                          std::vector<HostChannel::ReplyCallback> done, const RunAdmissionInfo& admission) {
  wire::Request commit;
  wire::Commit* c = commit.mutable_commit();
  wire::RunAdmission* run = c->mutable_run();
  run->set_flow(admission.flow);
  run->set_flow_name(admission.flow_name);
  run->set_weight(admission.weight);
  run->set_cost_ns(admission.cost_ns);
  run->set_gangs(admission.gangs);
  if (admission.islands != nullptr) {
    for (int i : *admission.islands) run->add_islands(i);
  }
  for (uint64_t id : admission.made_buffer_ids) run->add_made_buffer_ids(id);
  for (uint64_t id : admission.used_buffer_ids) run->add_used_buffer_ids(id);
  MutexLock lock(&mu_);
  for (size_t k = 0; k < hosts.size(); ++k) ForwardLocked(hosts[k], std::move(requests[k]), std::move(done[k]));
  channel_->Send(std::move(commit), nullptr);
  uncommitted_ = false;
  channel_->Flush();
}

void ServiceLink::Close(const absl::Status& why) {
  for (auto& d : direct_) {
    if (d != nullptr) d->Close(why);
  }
  channel_->Close(why);
}

absl::Status ServiceLink::status(int host) const {
  absl::Status status = channel_->status();
  if (status.ok()) return status;
  return HostLostError(absl::StrCat("host ", host, " is out of reach: ", status.message()));
}

int64_t ServiceLink::clock_offset_ns(int host) const {
  const std::string& boot = host < tenant_.host_boot_ids_size() ? tenant_.host_boot_ids(host) : std::string();
  if (!boot.empty() && boot == KernelBootId()) return 0;
  return channel_->clock_offset_ns();
}

std::vector<RemoteHostInfo> ServiceLink::hosts() const {
  std::vector<RemoteHostInfo> out;
  for (int h = 0; h < num_hosts(); ++h) {
    RemoteHostInfo info;
    info.id = h;
    info.island = h < tenant_.host_islands_size() ? tenant_.host_islands(h) : 0;
    info.address = tenant_.host_addresses(h);
    info.pid = h < tenant_.host_pids_size() ? tenant_.host_pids(h) : 0;
    info.incarnation = h < tenant_.host_incarnations_size() ? tenant_.host_incarnations(h) : 0;
    info.status = status(h);
    out.push_back(std::move(info));
  }
  return out;
}

absl::Status ServiceLink::SetPolicy(const std::string& policy) {
  wire::Request request;
  request.mutable_service_control()->set_set_policy(policy);
  return channel_->Call(std::move(request), kServiceCallTimeoutNs).status();
}

absl::StatusOr<wire::ServiceReport> ServiceLink::Report() {
  wire::Request request;
  request.mutable_service_control()->set_stats(true);
  PW_ASSIGN_OR_RETURN(wire::Reply reply, channel_->Call(std::move(request), kServiceCallTimeoutNs));
  return reply.service();
}

}  // namespace pw
