// The rule both modes run gangs by (gang_order.h).

#include "csrc/scheduler/gang_order.h"

#include <deque>
#include <random>
#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace pw {
namespace {

struct G {
  int id = 0;
  std::vector<int> devices;
};

TEST(GangOrderTest, AGangStartsOnceEveryEarlierGangOnItsDevicesIsDone) {
  GangOrder<G*> order(4);
  G a{0, {0, 1}}, b{1, {1, 2}}, c{2, {3}}, d{3, {0, 1}};
  std::vector<int> started;
  auto at_head = [&](G* g) { started.push_back(g->id); };
  const auto ab = order.ListOf(a.devices), bc = order.ListOf(b.devices), cc = order.ListOf(c.devices);
  EXPECT_EQ(order.ListOf({1, 0}), ab);  // a set of devices, in any order
  EXPECT_EQ(order.Append(ab, &a, at_head), 0u);
  EXPECT_EQ(order.Append(bc, &b, at_head), 1u);
  EXPECT_EQ(order.Append(cc, &c, at_head), 2u);
  EXPECT_EQ(order.Append(ab, &d, at_head), 3u);
  EXPECT_EQ(started, (std::vector<int>{0, 2}));  // b waits for a (device 1), d for a and b
  EXPECT_EQ(order.OrderedAround(ab), 3u);
  EXPECT_EQ(order.OrderedAround(cc), 1u);
  started.clear();
  EXPECT_EQ(order.PopFront(ab, at_head), &a);
  EXPECT_EQ(started, (std::vector<int>{1}));  // d still waits for b, which came first
  started.clear();
  EXPECT_EQ(order.PopFront(bc, at_head), &b);
  EXPECT_EQ(started, (std::vector<int>{3}));
  started.clear();
  EXPECT_EQ(order.PopFront(ab, at_head), &d);
  EXPECT_EQ(order.PopFront(cc, at_head), &c);
  EXPECT_TRUE(started.empty());
  EXPECT_EQ(order.num_ordered(), 4u);
}

// Against the plain model (a queue per device, a gang starts when it heads
// each of its devices' queues), over random lists and random completions:
// the same gangs are startable at every moment, and each is reported once.
TEST(GangOrderTest, AgreesWithAQueuePerDevice) {
  constexpr int kDevices = 8;
  std::mt19937 rng(7);
  for (int trial = 0; trial < 20; ++trial) {
    GangOrder<G*> order(kDevices);
    std::vector<std::deque<G*>> per_device(kDevices);
    std::deque<G> gangs;
    std::set<G*> running;
    std::set<int> reported;  // ids: every gang is reported once
    int next_id = 0;
    auto at_head = [&](G* g) {
      EXPECT_TRUE(reported.insert(g->id).second) << "gang " << g->id << " reported twice";
      running.insert(g);
    };
    auto model_startable = [&] {
      std::set<G*> s;
      for (G& g : gangs) {
        bool heads = !g.devices.empty();
        for (int d : g.devices) heads = heads && !per_device[d].empty() && per_device[d].front() == &g;
        if (heads) s.insert(&g);
      }
      return s;
    };
    for (int step = 0; step < 300; ++step) {
      if (running.empty() || rng() % 3 != 0) {
        G& g = gangs.emplace_back();
        g.id = next_id++;
        for (int d = 0; d < kDevices; ++d) {
          if (rng() % 4 == 0) g.devices.push_back(d);
        }
        if (g.devices.empty()) g.devices.push_back(static_cast<int>(rng() % kDevices));
        for (int d : g.devices) per_device[d].push_back(&g);
        order.Append(order.ListOf(g.devices), &g, at_head);
      } else {
        // A started gang finishes.
        auto it = running.begin();
        std::advance(it, rng() % running.size());
        G* g = *it;
        running.erase(it);
        for (int d : g->devices) per_device[d].pop_front();
        EXPECT_EQ(order.PopFront(order.ListOf(g->devices), at_head), g);
      }
      std::set<G*> startable = model_startable();
      ASSERT_EQ(startable, running) << "trial " << trial << " step " << step;
      // Keep the set of gangs scanned small: drop the finished ones.
      while (!gangs.empty() && std::none_of(per_device.begin(), per_device.end(), [&](const std::deque<G*>& q) {
               return std::find(q.begin(), q.end(), &gangs.front()) != q.end();
             })) {
        gangs.pop_front();
      }
    }
  }
}

}  // namespace
}  // namespace pw
