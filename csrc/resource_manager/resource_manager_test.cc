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

}  // namespace
}  // namespace pw
