#include "csrc/host/host_layout.h"

#include <algorithm>

namespace pw {

HostLayout::HostLayout(const wire::HostConfig& config, const wire::JoinCluster& join)
    : host_id(config.host_id()),
      island_id(config.island_id()),
      group_prefix(join.group_prefix()),
      device_host(join.device_host().begin(), join.device_host().end()),
      local_index(join.device_host_size(), -1),
      local_device_ids(config.device_ids().begin(), config.device_ids().end()) {
  num_hosts = device_host.empty() ? 1 : *std::max_element(device_host.begin(), device_host.end()) + 1;
  for (int i = 0; i < config.device_ids_size(); ++i) {
    const int d = config.device_ids(i);
    if (d >= 0 && d < static_cast<int>(local_index.size())) local_index[d] = i;
  }
}

}  // namespace pw
