#include "csrc/cluster/cluster.h"

#include <initializer_list>

#include "absl/strings/str_cat.h"
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

// InvalidArgument whose message contains every one of `parts`.
void ExpectInvalid(const absl::Status& status, std::initializer_list<absl::string_view> parts) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  for (absl::string_view part : parts) {
    EXPECT_NE(status.message().find(part), absl::string_view::npos) << status << " lacks " << part;
  }
}

TEST(ClusterTest, TopologyLimitsAreCheckedBeforeAllocating) {
  ExpectInvalid(ParseTopology("executor_threads=100000").status(), {"executor_threads", "at most 256", "100000"});
  ExpectInvalid(ParseTopology("intra_op_threads=-1").status(), {"intra_op_threads", "at least 0"});
  ExpectInvalid(ParseTopology("intra_op_threads=257").status(), {"intra_op_threads", "at most 256"});
  EXPECT_EQ(ParseTopology("intra_op_threads=1")->intra_op_threads, 1);
  EXPECT_NE(ParseTopology("intra_op_threads=1")->ToString().find(",intra_op_threads=1,"), std::string::npos);
  EXPECT_EQ(ParseTopology("islands=1")->ToString().find("intra_op_threads"), std::string::npos);
  // 10^11 devices: rejected up front, with the product spelled out.
  ExpectInvalid(ParseTopology("islands=10000,hosts_per_island=10000,devices_per_host=1000").status(),
                {"at most 65536 devices", "10000 x 10000 x 1000 = 100000000000"});
  ExpectInvalid(ParseTopology("islands=100000").status(), {"islands must be at most 65536, got 100000"});
  // Counts beyond int (and beyond int64) are range errors too, not wrapped ints.
  ExpectInvalid(ParseTopology("islands=4294967297").status(), {"islands must be at most 65536"});
  ExpectInvalid(ParseTopology("islands=99999999999999999999999").status(), {"islands", "from 1 to 65536"});
  ExpectInvalid(ParseTopology("devices_per_host=0").status(), {"devices_per_host must be at least 1"});
  ExpectInvalid(ParseTopology("device_memory=2TiB").status(), {"device_memory", "at most 1TiB"});
  ExpectInvalid(ParseTopology("device_memory=9007199254740993GiB").status(), {"device_memory", "1TiB"});
  // The largest allowed values are allowed, and the benchmarks' 2048 devices fit.
  EXPECT_TRUE(ParseTopology("islands=1,hosts_per_island=16384,devices_per_host=4,executor_threads=256").ok());
  EXPECT_EQ(ParseTopology("device_memory=1TiB")->device_memory_bytes, int64_t{1} << 40);
  EXPECT_TRUE(Cluster::Create(*ParseTopology("islands=1,hosts_per_island=512,devices_per_host=4")).ok());

  // Cluster::Create checks the same limits for options built in C++.
  TopologyOptions big;
  big.num_islands = 1 << 16;
  big.hosts_per_island = 1 << 16;
  ExpectInvalid(Cluster::Create(big).status(), {"at most 65536 devices"});
  TopologyOptions threads;
  threads.num_executor_threads = 100000;
  ExpectInvalid(Cluster::Create(threads).status(), {"executor_threads must be at most 256"});
  TopologyOptions memory;
  memory.device_memory_bytes = int64_t{1} << 62;
  ExpectInvalid(Cluster::Create(memory).status(), {"device_memory must be at most"});
}

TEST(ClusterTest, ControlLatencyMustBeFiniteAndInRange) {
  for (const char* bad : {"nan", "inf", "-inf", "1e300", "-1", "1000001", "fast"}) {
    ExpectInvalid(ParseTopology(absl::StrCat("control_latency_us=", bad)).status(),
                  {"control_latency_us", "from 0 to 1000000", bad});
  }
  EXPECT_EQ(ParseTopology("control_latency_us=1000000")->control_latency_ns, 1'000'000'000);
  TopologyOptions options;
  options.control_latency_ns = -1;
  ExpectInvalid(Cluster::Create(options).status(), {"control_latency"});
}

TEST(ClusterTest, HangReportSecondsMustBeFiniteAndInRange) {
  EXPECT_EQ(TopologyOptions().hang_report_ns, int64_t{60} * 1'000'000'000);  // on by default
  EXPECT_EQ(ParseTopology("hang_report_seconds=0")->hang_report_ns, 0);     // off
  EXPECT_EQ(ParseTopology("hang_report_seconds=0.25")->hang_report_ns, 250'000'000);
  EXPECT_EQ(ParseTopology("hang_report_seconds=86400")->hang_report_ns, int64_t{86400} * 1'000'000'000);
  for (const char* bad : {"nan", "inf", "-1", "86401", "soon"}) {
    ExpectInvalid(ParseTopology(absl::StrCat("hang_report_seconds=", bad)).status(),
                  {"hang_report_seconds", "from 0 to 86400", bad});
  }
  TopologyOptions options;
  options.hang_report_ns = -1;
  ExpectInvalid(Cluster::Create(options).status(), {"hang_report_ns"});
  // What ToString prints parses back to the same value.
  options.hang_report_ns = 1'500'000'000;
  EXPECT_EQ(ParseTopology(options.ToString())->hang_report_ns, 1'500'000'000);
}

TEST(ClusterTest, InterconnectKeysParseValidateAndPrint) {
  const TopologyOptions none;
  EXPECT_FALSE(none.models_interconnect());  // off by default
  EXPECT_EQ(none.ToString().find("ici_"), std::string::npos);  // and absent from the spec
  auto options = ParseTopology("ici_latency_us=1.5,ici_bandwidth_gbps=1600,dcn_latency_us=20,dcn_bandwidth_gbps=0.5");
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->ici_latency_ns, 1500);
  EXPECT_EQ(options->ici_bandwidth_bps, int64_t{1600} * 1'000'000'000);
  EXPECT_EQ(options->dcn_latency_ns, 20'000);
  EXPECT_EQ(options->dcn_bandwidth_bps, 500'000'000);
  EXPECT_TRUE(options->models_interconnect());
  // What ToString prints parses back to the same values.
  auto again = ParseTopology(options->ToString());
  ASSERT_TRUE(again.ok()) << again.status() << " " << options->ToString();
  EXPECT_EQ(again->ici_latency_ns, 1500);
  EXPECT_EQ(again->ici_bandwidth_bps, options->ici_bandwidth_bps);
  EXPECT_EQ(again->dcn_latency_ns, 20'000);
  EXPECT_EQ(again->dcn_bandwidth_bps, 500'000'000);
  // Any one key turns the model on; 0 bandwidth is unlimited.
  EXPECT_TRUE(ParseTopology("dcn_latency_us=0.001")->models_interconnect());
  EXPECT_FALSE(ParseTopology("ici_bandwidth_gbps=0,dcn_latency_us=0")->models_interconnect());
  EXPECT_EQ(ParseTopology("dcn_bandwidth_gbps=0.001")->dcn_bandwidth_bps, kMinLinkBandwidthBps);
  EXPECT_EQ(ParseTopology("ici_bandwidth_gbps=1000000")->ici_bandwidth_bps, kMaxLinkBandwidthBps);
  EXPECT_EQ(ParseTopology("ici_latency_us=1000000")->ici_latency_ns, kMaxLinkLatencyNs);

  for (const char* key : {"ici_latency_us", "dcn_latency_us"}) {
    for (const char* bad : {"nan", "inf", "-1", "1000001", "slow"}) {
      ExpectInvalid(ParseTopology(absl::StrCat(key, "=", bad)).status(), {key, "from 0 to 1000000", bad});
    }
  }
  for (const char* key : {"ici_bandwidth_gbps", "dcn_bandwidth_gbps"}) {
    for (const char* bad : {"nan", "inf", "-1", "0.0001", "1000001", "1e300", "fast"}) {
      ExpectInvalid(ParseTopology(absl::StrCat(key, "=", bad)).status(),
                    {key, "0 (unlimited)", "from 0.001 to 1000000", bad});
    }
  }
  // Cluster::Create checks options built in C++ too, naming the field.
  TopologyOptions slow;
  slow.dcn_bandwidth_bps = 5;
  ExpectInvalid(Cluster::Create(slow).status(), {"dcn_bandwidth_bps", "0 (unlimited)"});
  TopologyOptions late;
  late.ici_latency_ns = kMaxLinkLatencyNs + 1;
  ExpectInvalid(Cluster::Create(late).status(), {"ici_latency_ns", "at most"});
  // Host processes move bytes over real sockets: the model is refused there.
  ExpectInvalid(ParseTopology("hosts=local_processes,dcn_latency_us=20").status(),
                {"hosts=in_process only", "hosts=local_processes", "dcn_latency_us"});
  EXPECT_TRUE(ParseTopology("hosts=local_processes,dcn_latency_us=0").ok());
}

TEST(ClusterTest, StructuredItemsParseEachValueAlone) {
  auto options = ParseTopology({{"islands", "3"}, {"device_memory", "64MiB"}, {"control_latency_us", "2.5"}});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->num_islands, 3);
  EXPECT_EQ(options->device_memory_bytes, 64 << 20);
  EXPECT_EQ(options->control_latency_ns, 2500);
  // A value cannot carry another key.
  ExpectInvalid(ParseTopology({{"device_memory", "64MiB,islands=1"}}).status(),
                {"device_memory", "64MiB,islands=1"});
  ExpectInvalid(ParseTopology({{"islands", "1,devices_per_host=2"}}).status(), {"islands"});
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
