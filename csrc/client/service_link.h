#ifndef PATHWAYS_CLIENT_SERVICE_LINK_H_
#define PATHWAYS_CLIENT_SERVICE_LINK_H_

// A tenant's link to a service (pathways-server: service/service.h), which
// owns the hosts: the HostLinks of a client process that connected with
// pw.configure(server=...).
//
// One session with the service carries everything. Each request for a host
// goes as a wire::Forward, and its reply comes back as the Forward's; the
// service sends it on in the tenant's session on the host (the tenant's
// ids are its own there). Requests gather into units, each ended by a
// wire::Commit: SendRun ends a run's unit (its parts on every host, and
// whatever was queued before them), which waits for the service to admit
// it; Flush ends any other unit, which passes through, behind the tenant's
// runs committed before it. One lock keeps a unit whole against other
// threads' sends.
//
// The hosts are as alive as the service: once its session ends, every host
// is lost to this client (the service going takes the tenants' work with
// it; it does not survive its own restart). Clock offsets: a host on this
// kernel (same boot id) shares our clock; another's is taken as the
// service's.
//
// Thread-safe.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "csrc/base/mutex.h"
#include "csrc/client/host_links.h"
#include "csrc/client/tenant_options.h"
#include "csrc/coordination/host_channel.h"

namespace pw {

class ServiceLink final : public HostLinks {
 public:
  // Connects as a tenant. Unavailable if the service cannot be reached,
  // Unauthenticated for a wrong secret, FailedPrecondition naming both
  // builds if the service runs another one, or the service's refusal.
  static absl::StatusOr<std::unique_ptr<ServiceLink>> Connect(const TenantOptions& options);
  // Ends the session: the service cancels this tenant's work and frees
  // everything it held on the hosts.
  ~ServiceLink() override;

  // Who this tenant is and the cluster it is on (the service's answer).
  const wire::TenantInfo& tenant() const { return tenant_; }
  const TenantOptions& options() const { return options_; }

  // The service's scheduling policy for every tenant from now on
  // ("fifo" or "proportional_share"): InvalidArgument for another name.
  absl::Status SetPolicy(const std::string& policy);
  // The service's policy and every tenant's clients' stats.
  absl::StatusOr<wire::ServiceReport> Report();
  // Cuts the session as a killed process would, without a word to the
  // service (tests): from now on the hosts are lost to this tenant.
  void Sever(absl::Status why) { channel_->Lose(std::move(why)); }

  // HostLinks
  int num_hosts() const override { return tenant_.host_addresses_size(); }
  void Send(int host, wire::Request request, HostChannel::ReplyCallback done) override;
  void Flush(int host) override;
  void SendRun(const std::vector<int>& hosts, std::vector<wire::Request> requests,
               std::vector<HostChannel::ReplyCallback> done, const RunAdmissionInfo& admission) override;
  bool alive(int host) const override { return channel_->alive(); }
  absl::Status status(int host) const override;
  int64_t clock_offset_ns(int host) const override;
  std::vector<RemoteHostInfo> hosts() const override;
  bool admits_runs() const override { return true; }

 private:
  ServiceLink() = default;
  void ForwardLocked(int host, wire::Request request, HostChannel::ReplyCallback done)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  TenantOptions options_;
  wire::TenantInfo tenant_;
  std::vector<int> host_islands_;
  std::unique_ptr<HostChannel> channel_;
  // Keeps a unit's requests together on the channel.
  Mutex mu_;
  bool uncommitted_ ABSL_GUARDED_BY(mu_) = false;  // requests sent since the last Commit
};

}  // namespace pw

#endif  // PATHWAYS_CLIENT_SERVICE_LINK_H_
