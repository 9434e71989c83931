#ifndef PATHWAYS_CLIENT_HOST_LINKS_H_
#define PATHWAYS_CLIENT_HOST_LINKS_H_

// How a client reaches its hosts' control planes: what RemoteCluster sends
// its requests through. Two kinds:
//   - HostSessions (host_sessions.h): a session with each host, which this
//     client configured and owns; its requests are the hosts' session 0's.
//   - ServiceLink (service_link.h): one session with a service
//     (pathways-server, service/service.h) that owns the hosts; this client
//     is one of its tenants, and the service forwards its requests to the
//     hosts under the tenant's session id, in one order with every other
//     tenant's runs, once the service's scheduler admits them.
//
// Thread-safe.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "csrc/coordination/control.pb.h"
#include "csrc/coordination/host_channel.h"

namespace pw {

struct RemoteHostInfo {
  int id = 0;
  int island = 0;
  std::string address;
  int64_t pid = 0;
  uint64_t incarnation = 0;
  absl::Status status;  // OK while reachable; the loss (kHostLost) after
  bool alive() const { return status.ok(); }
};

// What a service admits a run by (wire::RunAdmission), given with the run's
// parts; a client that owns its hosts admits its runs itself and ignores it.
struct RunAdmissionInfo {
  uint64_t flow = 0;  // the client's tenant (SchedulingClient), 0: the default
  std::string flow_name;
  double weight = 1;
  double cost_ns = 0;
  int gangs = 0;
  const std::vector<int>* islands = nullptr;
  std::vector<uint64_t> made_buffer_ids;
  std::vector<uint64_t> used_buffer_ids;
};

class HostLinks {
 public:
  virtual ~HostLinks() = default;

  virtual int num_hosts() const = 0;
  // Queues `request` for `host`; `done` gets the reply (null: none wanted).
  virtual void Send(int host, wire::Request request, HostChannel::ReplyCallback done) = 0;
  // Sends what is queued for `host`.
  virtual void Flush(int host) = 0;
  // One run: requests[i] (a RunProgram) to hosts[i], each reply to
  // done[i], and everything queued before them: they leave together, and
  // every host sees them at the same place among the runs of every client
  // of the hosts. The caller sends its runs in one order.
  virtual void SendRun(const std::vector<int>& hosts, std::vector<wire::Request> requests,
                       std::vector<HostChannel::ReplyCallback> done, const RunAdmissionInfo& admission) = 0;
  // Whether `host` is reachable; OK while it is, its loss after.
  virtual bool alive(int host) const = 0;
  virtual absl::Status status(int host) const = 0;
  // The host's monotonic clock minus this process's.
  virtual int64_t clock_offset_ns(int host) const = 0;
  // Every host, by id.
  virtual std::vector<RemoteHostInfo> hosts() const = 0;
  // True when the far end (a service) admits runs: the client sends each at
  // once and leaves policy, windows and order across clients to it.
  virtual bool admits_runs() const { return false; }
  // Ends every session (HostChannel::Close): the runtime shuts down, and no
  // thread of the links may run on while the process exits. Later requests
  // fail with `why`. Idempotent.
  virtual void Close(const absl::Status& why) = 0;
};

}  // namespace pw

#endif  // PATHWAYS_CLIENT_HOST_LINKS_H_
