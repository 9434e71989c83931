#ifndef PATHWAYS_CLIENT_HOST_REGISTRY_H_
#define PATHWAYS_CLIENT_HOST_REGISTRY_H_

// Hosts started by someone else (hosts=external: by hand, by Slurm, by
// Kubernetes): the client listens, each host started with
// `pathways-host --client=ADDRESS` tells it where the host listens (over the
// control plane, with the cluster's secret), and the client then connects
// to the hosts as to any others. Host ids follow the order of registration.
//
// Thread-safe.

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "csrc/base/mutex.h"
#include "csrc/coordination/host_server.h"

namespace pw {

class HostRegistry final : public RequestHandler {
 public:
  // Listens on `listen` ("0.0.0.0:5000"; port 0 picks one) for hosts that
  // present `secret`. Unavailable if the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<HostRegistry>> Start(const std::string& listen, std::string secret);
  ~HostRegistry() override;

  // Where hosts reach the registry, with the port actually bound.
  const std::string& address() const { return server_->address(); }

  // The addresses of the first `n` hosts to register, in that order, once
  // they have; DeadlineExceeded (saying how many came) after `timeout_ns`.
  absl::StatusOr<std::vector<std::string>> Await(int n, int64_t timeout_ns);

  void Handle(const std::shared_ptr<HostSession>& session, wire::Request request) override;

 private:
  HostRegistry() = default;
  std::unique_ptr<HostServer> server_;
  Mutex mu_;
  CondVar cv_;
  std::vector<std::string> addresses_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pw

#endif  // PATHWAYS_CLIENT_HOST_REGISTRY_H_
