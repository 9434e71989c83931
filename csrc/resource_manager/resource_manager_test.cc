#include "csrc/resource_manager/resource_manager.h"

#include <limits>
#include <numeric>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace pw {
namespace {

class ResourceManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TopologyOptions options;  // 2 islands x 2 hosts x 4 devices
    cluster_ = *Cluster::Create(options);
    rm_ = std::make_unique<ResourceManager>(cluster_.get(), &registry_);
  }
  std::unique_ptr<Cluster> cluster_;
  DeviceListRegistry registry_;
  std::unique_ptr<ResourceManager> rm_;
};

TEST_F(ResourceManagerTest, SpreadsSlicesOverIslandsAndDevices) {
  auto a = *rm_->AddSlice(2, "tpu");
  auto b = *rm_->AddSlice(2, "tpu");
  auto c = *rm_->AddSlice(2, "tpu");
  EXPECT_EQ(a->island()->id(), 0);
  EXPECT_EQ(b->island()->id(), 1);  // island 1 is less loaded
  EXPECT_EQ(c->island()->id(), 0);
  EXPECT_EQ(a->devices()->devices()[0]->id(), 0);
  EXPECT_EQ(c->devices()->devices()[0]->id(), 2);  // least-loaded devices of island 0
  std::vector<int> loads = rm_->DeviceLoads();
  EXPECT_EQ(std::accumulate(loads.begin(), loads.end(), 0), 6);
}

TEST_F(ResourceManagerTest, SlicesShareDevicesWhenIslandIsFull) {
  std::vector<std::shared_ptr<VirtualSlice>> slices;
  for (int i = 0; i < 6; ++i) slices.push_back(*rm_->AddSlice(8, "tpu"));
  for (auto& s : slices) {
    std::set<int> ids;
    for (Device* d : s->devices()->devices()) ids.insert(d->id());
    EXPECT_EQ(ids.size(), 8u);  // one-to-one onto distinct devices
    EXPECT_NE(s->island(), nullptr);
  }
  std::vector<int> loads = rm_->DeviceLoads();
  for (int l : loads) EXPECT_EQ(l, 3);  // evenly spread
}

TEST_F(ResourceManagerTest, ReleasesLoadWhenSliceDies) {
  { auto s = *rm_->AddSlice(4, "tpu"); }
  for (int l : rm_->DeviceLoads()) EXPECT_EQ(l, 0);
}

TEST_F(ResourceManagerTest, ClearErrors) {
  auto too_many = rm_->AddSlice(9, "tpu");
  EXPECT_EQ(too_many.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(too_many.status().message().find("no island has 9 tpu devices"), absl::string_view::npos)
      << too_many.status();
  EXPECT_NE(too_many.status().message().find("island 0: 8"), absl::string_view::npos);
  auto kind = rm_->AddSlice(2, "gpu");
  EXPECT_EQ(kind.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(kind.status().message().find("'gpu'"), absl::string_view::npos);
  auto zero = rm_->AddSlice(0, "tpu");
  EXPECT_EQ(zero.status().code(), absl::StatusCode::kInvalidArgument);
  // More devices than any topology has: a bad argument, whatever its size (no narrowing to int).
  for (int64_t n : {int64_t{kMaxDevices} + 1, int64_t{1} << 32, std::numeric_limits<int64_t>::max()}) {
    auto huge = rm_->AddSlice(n, "tpu");
    EXPECT_EQ(huge.status().code(), absl::StatusCode::kInvalidArgument) << n;
    EXPECT_NE(huge.status().message().find(absl::StrCat("add_slice(tpu_devices=", n, "): a slice has at most 65536")),
              absl::string_view::npos)
        << huge.status();
  }
  for (int l : rm_->DeviceLoads()) EXPECT_EQ(l, 0);
}

TEST_F(ResourceManagerTest, NeverGivesOutFailedDevices) {
  Device* failed = cluster_->islands()[0]->devices()[0];
  ASSERT_TRUE(failed->MarkFailed());
  EXPECT_FALSE(failed->MarkFailed());  // once
  std::vector<std::shared_ptr<VirtualSlice>> slices;
  for (int i = 0; i < 6; ++i) {
    slices.push_back(*rm_->AddSlice(7, "tpu"));
    for (Device* d : slices.back()->devices()->devices()) EXPECT_FALSE(d->failed());
  }
  auto eight = *rm_->AddSlice(8, "tpu");  // only island 1 has 8 healthy devices
  EXPECT_EQ(eight->island()->id(), 1);
  cluster_->islands()[1]->devices()[3]->MarkFailed();
  auto none = rm_->AddSlice(8, "tpu");
  EXPECT_EQ(none.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(none.status().message(), "island 0: 7 healthy, island 1: 7 healthy")) << none.status();
}

// A tenant's resource manager gives out only the devices its service
// granted it (Restrict), still least-loaded first.
TEST_F(ResourceManagerTest, GivesOutOnlyTheDevicesItIsRestrictedTo) {
  rm_->Restrict({1, 2, 9, 10, 11});
  EXPECT_EQ(rm_->UsableDevices(), (std::vector<int>{1, 2, 9, 10, 11}));
  auto three = *rm_->AddSlice(3, "tpu");  // only island 1 has 3 of them
  EXPECT_EQ(three->island()->id(), 1);
  auto two = *rm_->AddSlice(2, "tpu");  // island 0 is less loaded now
  EXPECT_EQ(two->devices()->devices()[0]->id(), 1);
  EXPECT_EQ(two->devices()->devices()[1]->id(), 2);
  auto one = *rm_->AddSlice(1, "tpu");
  EXPECT_TRUE(one->devices()->devices()[0]->id() <= 2 || one->devices()->devices()[0]->id() >= 9);
  auto four = rm_->AddSlice(4, "tpu");
  EXPECT_EQ(four.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(four.status().message(), "of this tenant's")) << four.status();
  EXPECT_TRUE(absl::StrContains(four.status().message(), "island 0: 2, island 1: 3")) << four.status();
  std::vector<int> loads = rm_->DeviceLoads();
  for (int d : {0, 3, 4, 5, 6, 7, 8, 12, 13, 14, 15}) EXPECT_EQ(loads[d], 0) << d;
}

std::vector<int> Ids(const DeviceList* list) {
  std::vector<int> ids;
  for (const Device* d : list->devices()) ids.push_back(d->id());
  return ids;
}

// Paper §4.1: a slice's virtual devices on failed devices move onto spare
// healthy devices of its island; the others stay where they are.
TEST_F(ResourceManagerTest, RemapMovesOnlyTheFailedDevicesOntoTheLeastLoadedSpares) {
  auto a = *rm_->AddSlice(4, "tpu");  // island 0: devices 0-3 (host 0)
  auto b = *rm_->AddSlice(4, "tpu");  // island 1
  auto c = *rm_->AddSlice(2, "tpu");  // island 0: devices 4, 5
  ASSERT_EQ(Ids(a->devices()), (std::vector<int>{0, 1, 2, 3}));
  ASSERT_EQ(Ids(c->devices()), (std::vector<int>{4, 5}));
  const uint64_t generation = MappingGeneration();
  // Nothing failed: nothing moves, nothing changes.
  auto same = rm_->Remap(a.get());
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_TRUE(same->moved.empty());
  EXPECT_EQ(a->epoch(), 0u);
  EXPECT_EQ(MappingGeneration(), generation);

  cluster_->devices()[1]->MarkFailed();
  cluster_->devices()[3]->MarkFailed();
  EXPECT_EQ(rm_->SlicesOnFailedDevices().size(), 1u);
  auto moved = rm_->Remap(a.get());
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(moved->moved, (std::vector<int>{1, 3}));
  EXPECT_EQ(Ids(moved->before), (std::vector<int>{0, 1, 2, 3}));
  // The spares of island 0 not loaded (6, 7) before the loaded ones (4, 5).
  EXPECT_EQ(Ids(a->devices()), (std::vector<int>{0, 6, 2, 7}));
  EXPECT_EQ(moved->after, a->devices());
  EXPECT_EQ(a->island()->id(), 0);
  EXPECT_EQ(a->epoch(), 1u);
  EXPECT_GT(MappingGeneration(), generation);
  EXPECT_TRUE(rm_->SlicesOnFailedDevices().empty());
  std::vector<int> loads = rm_->DeviceLoads();
  EXPECT_EQ(loads[1], 0);
  EXPECT_EQ(loads[3], 0);
  EXPECT_EQ(loads[6], 1);
  EXPECT_EQ(loads[7], 1);
  EXPECT_EQ(std::accumulate(loads.begin(), loads.end(), 0), 10);
  // The load follows the slice's mapping when it goes.
  a.reset();
  loads = rm_->DeviceLoads();
  EXPECT_EQ(std::accumulate(loads.begin(), loads.end(), 0), 6);
  EXPECT_EQ(loads[6] + loads[7] + loads[0] + loads[2], 0);
}

TEST_F(ResourceManagerTest, RemapMovesTheWholeSliceToAnotherIslandWhenItsOwnIsShort) {
  auto a = *rm_->AddSlice(8, "tpu");  // all of island 0
  ASSERT_EQ(a->island()->id(), 0);
  cluster_->devices()[5]->MarkFailed();
  auto moved = rm_->Remap(a.get());
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(a->island()->id(), 1);
  EXPECT_EQ(Ids(a->devices()), (std::vector<int>{8, 9, 10, 11, 12, 13, 14, 15}));
  EXPECT_EQ(moved->moved.size(), 8u);
  for (int d = 0; d < 8; ++d) EXPECT_EQ(rm_->DeviceLoads()[d], 0) << d;

  // No island has 8 healthy devices: the slice stays, and says why.
  cluster_->devices()[9]->MarkFailed();
  auto none = rm_->Remap(a.get());
  ASSERT_EQ(none.status().code(), absl::StatusCode::kResourceExhausted) << none.status();
  EXPECT_TRUE(absl::StrContains(none.status().message(), "remap of slice")) << none.status();
  EXPECT_TRUE(absl::StrContains(none.status().message(),
                                "no island has 8 spare devices for it (island 0: 7 healthy, 7 spare, island 1: "
                                "7 healthy, 7 spare)"))
      << none.status();
  EXPECT_EQ(a->epoch(), 1u);
  EXPECT_EQ(Ids(a->devices()), (std::vector<int>{8, 9, 10, 11, 12, 13, 14, 15}));
  EXPECT_EQ(rm_->SlicesOnFailedDevices().size(), 1u);
}

// Spare devices are those no live slice uses; sharing them is asked for.
TEST_F(ResourceManagerTest, RemapTakesSpareDevicesUnlessAskedToShare) {
  auto a = *rm_->AddSlice(4, "tpu");  // island 0: 0-3
  auto b = *rm_->AddSlice(4, "tpu");  // island 1: 8-11
  auto c = *rm_->AddSlice(4, "tpu");  // island 0: 4-7
  ASSERT_EQ(Ids(c->devices()), (std::vector<int>{4, 5, 6, 7}));
  cluster_->devices()[0]->MarkFailed();
  // Island 0 has no spare device: the slice moves to island 1's spares.
  auto moved = rm_->Remap(a.get());
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(Ids(a->devices()), (std::vector<int>{12, 13, 14, 15}));
  // Now nothing is spare anywhere: sharing is the only way.
  cluster_->devices()[12]->MarkFailed();
  auto none = rm_->Remap(a.get());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kResourceExhausted) << none.status();
  EXPECT_TRUE(absl::StrContains(none.status().message(), "devices other slices use are not spare")) << none.status();
  auto shared = rm_->Remap(a.get(), /*spare_only=*/false);
  ASSERT_TRUE(shared.ok()) << shared.status();
  EXPECT_EQ(shared->moved, (std::vector<int>{0}));
  EXPECT_EQ(Ids(a->devices()), (std::vector<int>{8, 13, 14, 15}));  // b's least-loaded, lowest id
  EXPECT_EQ(rm_->DeviceLoads()[8], 2);
}

TEST_F(ResourceManagerTest, RemapStaysWithinARestriction) {
  rm_->Restrict({0, 1, 2, 3});
  auto a = *rm_->AddSlice(2, "tpu");
  ASSERT_EQ(Ids(a->devices()), (std::vector<int>{0, 1}));
  cluster_->devices()[0]->MarkFailed();
  ASSERT_TRUE(rm_->Remap(a.get()).ok());
  EXPECT_EQ(Ids(a->devices()), (std::vector<int>{2, 1}));
  cluster_->devices()[1]->MarkFailed();
  cluster_->devices()[2]->MarkFailed();
  auto none = rm_->Remap(a.get());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(none.status().message(), "of this tenant's")) << none.status();
}

}  // namespace
}  // namespace pw
