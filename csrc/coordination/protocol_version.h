#ifndef PATHWAYS_COORDINATION_PROTOCOL_VERSION_H_
#define PATHWAYS_COORDINATION_PROTOCOL_VERSION_H_

// The versions a client and the hosts it configures must share, exchanged in
// the Hello and its reply (control.proto): the control protocol's, and the
// op registry's (function_ir/op_registry.h: the ops a function IR may name,
// which the hosts compile). Both sides compute them from the same source, so
// two builds of one commit always agree; builds that differ refuse each other
// at connect time, with both versions in the error, instead of failing later
// with a confusing error (or worse, reading a request as something else).
//
// Bump kControlProtocolVersion with any change to control.proto or
// function_ir.proto that an older peer would misread (a field's meaning, a
// renumbered enumerator, a request that must be understood), and with the
// data plane's DataPlane::kVersion (hosts of one client run one build). The
// op registry's version changes by itself when its table does.

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "csrc/function_ir/op_registry.h"

namespace pw {

// 1: before versions were exchanged (a Hello without them reads as 0).
// 2: loads answered, CancelRun, data plane messages carrying their ids.
// 3: Unload (a host that ignored it would keep every function and program).
// 4: tenants of a service (Request.session, Forward, Commit, EndSession).
// 5: a tenant reserves its devices and memory before it sends anything.
// 6: a new process replaces a lost host (PeerJoined, JoinCluster's
//    replacement fields, JoinClusterReply).
inline constexpr uint32_t kControlProtocolVersion = 6;

// "control protocol 2, op registry 0123456789abcdef".
inline std::string DescribeVersions(uint32_t protocol, uint64_t op_registry) {
  return absl::StrFormat("control protocol %u, op registry %016x", protocol, op_registry);
}

// OK if `protocol` and `op_registry` (the peer's, as `peer` names it: "the
// client", "host 3 (127.0.0.1:4567)") are this build's; else
// FailedPrecondition naming both sides' versions.
inline absl::Status CheckPeerVersions(absl::string_view peer, uint32_t protocol, uint64_t op_registry) {
  if (protocol == kControlProtocolVersion && op_registry == kOpRegistryVersion) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat(peer, " runs ", protocol == 0 ? "a build from before versions were exchanged (" : "",
                   DescribeVersions(protocol, op_registry), protocol == 0 ? ")" : "", "; this process runs ",
                   DescribeVersions(kControlProtocolVersion, kOpRegistryVersion),
                   ": the client and its hosts must run the same pathways build"));
}

}  // namespace pw

#endif  // PATHWAYS_COORDINATION_PROTOCOL_VERSION_H_
