#include "csrc/cluster/cluster.h"

#include "csrc/cluster/device_list.h"
#include "gtest/gtest.h"

namespace pw {
namespace {

TEST(ClusterTest, BuildsIslandsHostsDevices) {
  TopologyOptions options;
  options.num_islands = 3;
  options.hosts_per_island = 2;
  options.devices_per_host = 4;
  auto cluster = Cluster::Create(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  EXPECT_EQ((*cluster)->num_devices(), 24);
  EXPECT_EQ((*cluster)->hosts().size(), 6u);
  Device* d = *(*cluster)->device(13);
  EXPECT_EQ(d->island()->id(), 1);
  EXPECT_EQ(d->host()->id(), 3);
  EXPECT_EQ(d->index_in_host(), 1);
  EXPECT_EQ(d->index_in_island(), 5);
  EXPECT_EQ(d->ToString(), "TpuDevice(id=13, island=1, host=3)");
  auto missing = (*cluster)->device(24);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("0..23"), absl::string_view::npos);
}

TEST(ClusterTest, ParsesTopologySpec) {
  auto options = ParseTopology("islands=4, hosts_per_island=8,devices_per_host=2,device_memory=64MiB");
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->num_islands, 4);
  EXPECT_EQ(options->hosts_per_island, 8);
  EXPECT_EQ(options->devices_per_host, 2);
  EXPECT_EQ(options->device_memory_bytes, 64 << 20);
  EXPECT_EQ(ParseTopology("control_latency_us=12.5")->control_latency_ns, 12500);
  EXPECT_FALSE(ParseTopology("control_latency_us=-1").ok());
  auto bad = ParseTopology("islnds=2");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("islnds"), absl::string_view::npos);
  EXPECT_FALSE(ParseTopology("islands=two").ok());
  EXPECT_FALSE(ParseTopology("device_memory=0").ok());
  TopologyOptions zero;
  zero.num_islands = 0;
  EXPECT_FALSE(Cluster::Create(zero).ok());
}

TEST(DeviceListTest, InternsAndRejectsDuplicates) {
  auto cluster = *Cluster::Create(TopologyOptions{});
  DeviceListRegistry registry;
  const auto& devs = cluster->devices();
  auto a = registry.Intern({devs[0], devs[1]});
  auto b = registry.Intern({devs[0], devs[1]});
  auto c = registry.Intern({devs[1], devs[0]});
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(*a, *b);
  EXPECT_NE(*a, *c);
  EXPECT_EQ((*a)->island()->id(), 0);
  auto cross = registry.Intern({devs[0], devs[8]});
  ASSERT_TRUE(cross.ok());
  EXPECT_EQ((*cross)->island(), nullptr);
  auto dup = registry.Intern({devs[2], devs[2]});
  EXPECT_EQ(dup.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(registry.Intern({}).ok());
  EXPECT_EQ((*registry.Intern({devs[0], devs[1], devs[2], devs[3]}))->ToString(), "island 0 devices [0-3]");
}

}  // namespace
}  // namespace pw
