#ifndef PATHWAYS_CLIENT_TENANT_OPTIONS_H_
#define PATHWAYS_CLIENT_TENANT_OPTIONS_H_

// How a client process connects to a service as a tenant
// (Runtime::CreateTenant, service_link.h). Apart so that builds without
// host processes (no gRPC) still know the type.

#include <cstdint>
#include <string>

namespace pw {

struct TenantOptions {
  std::string address;  // the service's ("127.0.0.1:PORT")
  std::string secret;   // the service's secret (not the hosts')
  std::string name = "pathways";  // the tenant's name in the service's stats
  int priority = 0;     // higher goes first (scheduler/fair_queue.h)
  // What to hold while connected (service/service.h, "Quotas"): devices
  // (0: the service's default) and memory on each (0: the service's
  // default), waiting at most `wait_timeout_ns` for them to be free.
  int devices = 0;
  int64_t memory_bytes = 0;
  int64_t wait_timeout_ns = int64_t{60} * 1'000'000'000;
  int64_t connect_timeout_ns = int64_t{10} * 1'000'000'000;
};

}  // namespace pw

#endif  // PATHWAYS_CLIENT_TENANT_OPTIONS_H_
