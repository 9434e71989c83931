#ifndef PATHWAYS_HOST_HOST_RUNTIME_H_
#define PATHWAYS_HOST_HOST_RUNTIME_H_

// A host process (paper §4, Figure 3): it serves one host's devices to the
// client that configured it. This is its end of the control plane: it takes
// its configuration from the first Hello that carries one, answers
// heartbeats with its incarnation, and knows which session owns it, so the
// process can exit when that client goes (see host_main.h).
//
// Thread-safe.

#include <cstdint>
#include <memory>

#include "csrc/base/mutex.h"
#include "csrc/coordination/host_server.h"

namespace pw {

class HostRuntime final : public RequestHandler {
 public:
  HostRuntime();

  // Random, fixed for the life of this process (see wire::HelloReply).
  uint64_t incarnation() const { return incarnation_; }

  void Handle(const std::shared_ptr<HostSession>& session, wire::Request request) override;
  void OnSessionEnd(const std::shared_ptr<HostSession>& session) override;

  // Whether a session configured this host, and whether that session has
  // ended since (the host's client is gone).
  bool configured() const;
  bool owner_gone() const;
  // Blocks until the owner's session ends or `timeout_ns` passes; true if
  // it ended.
  bool AwaitOwnerGone(int64_t timeout_ns) const;

 private:
  wire::Reply HandleHello(const std::shared_ptr<HostSession>& session, const wire::Hello& hello);

  const uint64_t incarnation_;
  mutable Mutex mu_;
  mutable CondVar cv_;
  // Protects the configuration, the owning session's id (0: none yet) and
  // whether it has ended.
  wire::HostConfig config_ ABSL_GUARDED_BY(mu_);
  uint64_t owner_ ABSL_GUARDED_BY(mu_) = 0;
  bool owner_gone_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace pw

#endif  // PATHWAYS_HOST_HOST_RUNTIME_H_
