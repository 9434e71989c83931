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
  return link;
}

ServiceLink::~ServiceLink() = default;

void ServiceLink::ForwardLocked(int host, wire::Request request, HostChannel::ReplyCallback done) {
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

void ServiceLink::Flush(int) {
  MutexLock lock(&mu_);
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
