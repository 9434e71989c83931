#ifndef PATHWAYS_CLIENT_SERVICE_LINK_H_
#define PATHWAYS_CLIENT_SERVICE_LINK_H_

// A tenant's link to a service (pathways-server: service/service.h), which
// owns the hosts: the HostLinks of a client process that connected with
// pw.configure(server=...).
//
// One session with the service carries the control plane. Each request for
// a host goes as a wire::Forward, and its reply comes back as the
// Forward's; the service sends it on in the tenant's session on the host
// (the tenant's ids are its own there). Requests gather into units, each
// ended by a wire::Commit: SendRun ends a run's unit (its parts on every
// host, and whatever was queued before them), which waits for the service
// to admit it; Flush ends any other unit, which passes through, behind the
// tenant's runs committed before it. One lock keeps a unit whole against
// other threads' sends.
//
// Bulk data goes between the tenant and the hosts directly: the tenant has
// a session of its own with each host, proving the key the service gave it
// ("tenant-<t>" claim, auth.h), which may only put and fetch the tenant's
// buffers. Puts and fetches go there; the rest through the service. Order
// across the two paths: nothing is forwarded while a put sent directly is
// not answered (the host has taken it), so a run, a free or a fetch that
// names the buffer finds it; nothing goes directly to a host while a device
// list forwarded to it is not answered, so a put finds its list; a fetch
// follows the put on the same session, or the run that made the buffer,
// which finished before anyone reads it. Those waits cost a round trip
// after a put, and after a host's first sight of a list. A host the tenant
// cannot reach directly gets its data through the service.
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
  // Connects as a tenant and reserves its devices and memory, waiting up to
  // options.wait_timeout_ns for them. Unavailable if the service cannot be
  // reached, Unauthenticated for a wrong secret, FailedPrecondition naming
  // both builds if the service runs another one, InvalidArgument for more
  // than the service lets a tenant hold, ResourceExhausted (saying what it
  // waited for) when they were not free in time, or the service's refusal.
  static absl::StatusOr<std::unique_ptr<ServiceLink>> Connect(const TenantOptions& options);
  // Ends the session: the service cancels this tenant's work and frees
  // everything it held on the hosts.
  ~ServiceLink() override;

  // Who this tenant is and the cluster it is on (the service's answer).
  const wire::TenantInfo& tenant() const { return tenant_; }
  // The devices it holds, and the memory on each (its Reserve's answer).
  const wire::Grant& grant() const { return grant_; }
  const TenantOptions& options() const { return options_; }

  // The service's scheduling policy for every tenant from now on
  // ("fifo" or "proportional_share"): InvalidArgument for another name.
  absl::Status SetPolicy(const std::string& policy);
  // The service's policy and every tenant's clients' stats.
  absl::StatusOr<wire::ServiceReport> Report();
  // Cuts the session as a killed process would, without a word to the
  // service (tests): from now on the hosts are lost to this tenant.
  void Sever(absl::Status why) { channel_->Lose(std::move(why)); }
  // Ends the tenant's sessions (the runtime shuts down): the service frees
  // what the tenant held, and no thread of them runs on while the process
  // exits. Later requests fail with `why`. Idempotent.
  void Close(const absl::Status& why) override;

  // HostLinks
  int num_hosts() const override { return tenant_.host_addresses_size(); }
  void Send(int host, wire::Request request, HostChannel::ReplyCallback done) override;
  void Flush(int host) override;
  void SendRun(const std::vector<int>& hosts, std::vector<wire::Request> requests,
               std::vector<HostChannel::ReplyCallback> done, const RunAdmissionInfo& admission) override;
  bool alive(int host) const override { return channel_->alive(); }
  // Hosts this tenant reaches directly for its bulk data (tests).
  int direct_hosts() const;
  absl::Status status(int host) const override;
  int64_t clock_offset_ns(int host) const override;
  std::vector<RemoteHostInfo> hosts() const override;
  bool admits_runs() const override { return true; }

 private:
  ServiceLink() = default;
  void ForwardLocked(int host, wire::Request request, HostChannel::ReplyCallback done)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Puts and fetches go to the host directly when it can be reached.
  static bool Bulk(const wire::Request& request) {
    return request.kind_case() == wire::Request::kPut || request.kind_case() == wire::Request::kFetch;
  }
  // Waits until every put sent directly is answered (flushing them first).
  void AwaitPuts() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits until every device list forwarded to `host` is answered
  // (committing and flushing them first).
  void AwaitLists(int host) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  TenantOptions options_;
  wire::TenantInfo tenant_;
  wire::Grant grant_;
  std::unique_ptr<HostChannel> channel_;
  // The tenant's own sessions with the hosts (null: not reachable).
  std::vector<std::unique_ptr<HostChannel>> direct_;
  // Keeps a unit's requests together on the channel.
  Mutex mu_;
  bool uncommitted_ ABSL_GUARDED_BY(mu_) = false;  // requests sent since the last Commit
  std::vector<bool> direct_unflushed_ ABSL_GUARDED_BY(mu_);
  // Puts sent directly, and per host device lists forwarded, that are not
  // answered yet.
  Mutex puts_mu_;
  CondVar puts_cv_;
  int64_t puts_pending_ ABSL_GUARDED_BY(puts_mu_) = 0;
  std::vector<int64_t> lists_pending_ ABSL_GUARDED_BY(puts_mu_);
};

}  // namespace pw

#endif  // PATHWAYS_CLIENT_SERVICE_LINK_H_
