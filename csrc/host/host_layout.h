#ifndef PATHWAYS_HOST_HOST_LAYOUT_H_
#define PATHWAYS_HOST_HOST_LAYOUT_H_

// Where one host stands in its cluster, and a device list as that host sees
// it: the facts every part of a host's executor (host_executor.h) reads.
//
// HostLayout is fixed once made (from the client's HostConfig and
// JoinCluster), so it is read without a lock from any thread. A
// HostDeviceList is made by DefineDevices and never changed afterwards.

#include <optional>
#include <string>
#include <vector>

#include "csrc/coordination/control.pb.h"
#include "csrc/kernels/function_executable.h"

namespace pw {

struct HostSetGroups;  // host_groups.h

// This host's id and devices, and the host of every device of the cluster.
struct HostLayout {
  HostLayout(const wire::HostConfig& config, const wire::JoinCluster& join);

  int host_id = 0;
  int island_id = 0;
  int num_hosts = 1;                  // of the cluster
  std::string group_prefix;           // the cluster's: every rendezvous key lies under it
  std::vector<int> device_host;       // by global device id
  std::vector<int> local_index;       // by global device id: index in this host, or -1
  std::vector<int> local_device_ids;  // by index in this host: global id
  int num_local_devices() const { return static_cast<int>(local_device_ids.size()); }
};

// A device list as this host sees it.
struct HostDeviceList {
  std::vector<int> device_ids;      // global ids, in list order
  std::vector<int> hosts;           // host of each position
  std::vector<int> local_positions; // positions on this host, increasing
  std::vector<int> local_devices;   // their index in this host's devices
  // The hosts of the list, increasing, and each one's positions.
  std::vector<int> host_set;
  std::vector<std::vector<int>> positions_by_host;  // parallel to host_set
  std::optional<LocalShards> local;  // when this host holds some positions
  // The collective groups of its host set, when it has positions here and
  // on other hosts (owned by the executor's HostGroups).
  HostSetGroups* groups = nullptr;
  // Its local devices' list in the executor's gang order (GangOrder's
  // ListId), when it has some.
  int order_list = -1;
  bool all_local() const { return local_positions.size() == device_ids.size(); }
};

}  // namespace pw

#endif  // PATHWAYS_HOST_HOST_LAYOUT_H_
