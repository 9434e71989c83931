// libFuzzer target: ParseTopology on any string. It must return a Status or
// options that either Cluster::Create accepts or rejects with a Status:
// never crash, overflow, or allocate without bound. What a parsed spec
// prints (ToString) must parse again. Built with ASan and UBSan by
// `make fuzz`.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "csrc/cluster/cluster.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string spec(reinterpret_cast<const char*>(data), size);
  auto options = pw::ParseTopology(spec);
  if (!options.ok()) return 0;
  if (!pw::ParseTopology(options->ToString()).ok()) std::abort();
  // Building a cluster costs memory per device: only small ones here (the
  // parser's own limits are what keep large ones from running away).
  const int64_t devices = int64_t{options->num_islands} * options->hosts_per_island * options->devices_per_host;
  if (devices <= 4096) (void)pw::Cluster::Create(*options);
  return 0;
}
