// The admission queue both modes share (fair_queue.h).

#include "csrc/scheduler/fair_queue.h"

#include <map>
#include <string>
#include <vector>

#include "csrc/scheduler/gang_scheduler.h"
#include "gtest/gtest.h"

namespace pw {
namespace {

struct Item {
  std::string client;
  int n = 0;
  double cost = 1.0;
};

auto Always() {
  return [](const Item&) { return true; };
}
auto CostOf() {
  return [](const Item& item) { return item.cost; };
}

TEST(FairQueueTest, BackloggedClientsShareInProportionToTheirWeights) {
  SchedulingClient heavy(1, "heavy", 3.0), light(2, "light", 1.0);
  FairQueue<Item> q;
  for (int i = 0; i < 400; ++i) {
    q.Push(&heavy, Item{"heavy", i});
    q.Push(&light, Item{"light", i});
  }
  std::map<std::string, int> served;
  for (int i = 0; i < 200; ++i) {
    auto item = q.Pop(/*fair=*/true, Always(), CostOf());
    ASSERT_TRUE(item.has_value());
    ++served[item->client];
  }
  EXPECT_EQ(served["heavy"], 150);
  EXPECT_EQ(served["light"], 50);
  EXPECT_EQ(q.size(), 600);
}

// A client of another priority (a service's tenant).
struct RankedClient {
  double w = 1;
  int p = 0;
  double weight() const { return w; }
  int priority() const { return p; }
};

TEST(FairQueueTest, HigherPriorityHeadsGoFirstUntilAHeadWasPassedOverTooOften) {
  RankedClient high{1, 5}, low{1, 0};
  FairQueue<Item, RankedClient> q;
  q.Push(&low, Item{"low", 0});
  for (int i = 0; i < 100; ++i) q.Push(&high, Item{"high", i});
  // The low head is passed over kMaxPassOvers times, then goes.
  std::vector<std::string> order;
  for (int i = 0; i < 30; ++i) order.push_back(q.Pop(/*fair=*/false, Always(), CostOf())->client);
  const int limit = FairQueue<Item, RankedClient>::kMaxPassOvers;
  for (int i = 0; i < limit; ++i) EXPECT_EQ(order[i], "high") << i;
  EXPECT_EQ(order[limit], "low");
  // Under proportional share too: priority first, then start tags.
  FairQueue<Item, RankedClient> fair;
  for (int i = 0; i < 4; ++i) fair.Push(&low, Item{"low", i});
  fair.Push(&high, Item{"high", 0});
  EXPECT_EQ(fair.Pop(/*fair=*/true, Always(), CostOf())->client, "high");
  EXPECT_EQ(fair.Pop(/*fair=*/true, Always(), CostOf())->client, "low");
}

TEST(FairQueueTest, AHeadThatCannotGoIsNotPassedOver) {
  RankedClient high{1, 5}, low{1, 0};
  FairQueue<Item, RankedClient> q;
  q.Push(&low, Item{"low", 0});
  for (int i = 0; i < 100; ++i) q.Push(&high, Item{"high", i});
  auto not_low = [](const Item& item) { return item.client != "low"; };
  for (int i = 0; i < 50; ++i) EXPECT_EQ(q.Pop(/*fair=*/false, not_low, CostOf())->client, "high");
  // It was never admissible, so it never aged: high still goes first.
  EXPECT_EQ(q.Pop(/*fair=*/false, Always(), CostOf())->client, "high");
}

TEST(FairQueueTest, CostsCountNotItems) {
  // Equal weights; one client's items cost 4 times the other's.
  SchedulingClient big(1, "big", 1.0), small(2, "small", 1.0);
  FairQueue<Item> q;
  for (int i = 0; i < 100; ++i) {
    q.Push(&big, Item{"big", i, 4.0});
    q.Push(&small, Item{"small", i, 1.0});
  }
  std::map<std::string, double> time;
  for (int i = 0; i < 50; ++i) {
    auto item = q.Pop(/*fair=*/true, Always(), CostOf());
    time[item->client] += item->cost;
  }
  EXPECT_NEAR(time["big"], time["small"], 4.0);
}

TEST(FairQueueTest, AnIdleClientGetsNoCreditForItsIdleTime) {
  SchedulingClient a(1, "a", 1.0), b(2, "b", 1.0);
  FairQueue<Item> q;
  for (int i = 0; i < 100; ++i) q.Push(&a, Item{"a", i});
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(q.Pop(true, Always(), CostOf()).has_value());
  // b arrives after a was served alone: they alternate from now on, rather
  // than b taking the next 100.
  for (int i = 0; i < 10; ++i) {
    q.Push(&a, Item{"a", i});
    q.Push(&b, Item{"b", i});
  }
  std::map<std::string, int> served;
  for (int i = 0; i < 10; ++i) ++served[q.Pop(true, Always(), CostOf())->client];
  EXPECT_EQ(served["a"], 5);
  EXPECT_EQ(served["b"], 5);
}

TEST(FairQueueTest, FirstIsPushOrderAcrossClients) {
  SchedulingClient a(1, "a", 1.0), b(2, "b", 100.0);
  FairQueue<Item> q;
  q.Push(&a, Item{"a", 0});
  q.Push(&b, Item{"b", 1});
  q.Push(nullptr, Item{"default", 2});
  q.Push(&a, Item{"a", 3});
  std::vector<int> order;
  while (auto item = q.Pop(/*fair=*/false, Always(), CostOf())) order.push_back(item->n);
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_TRUE(q.empty());
}

TEST(FairQueueTest, OnlyAdmissibleHeadsCompeteAndAClientsOrderHolds) {
  SchedulingClient a(1, "a", 1.0), b(2, "b", 1.0);
  FairQueue<Item> q;
  q.Push(&a, Item{"a", 0});
  q.Push(&a, Item{"a", 1});
  q.Push(&b, Item{"b", 2});
  auto not_a0 = [](const Item& item) { return !(item.client == "a" && item.n == 0); };
  // a's head is not admissible, so a's second item must wait behind it.
  auto item = q.Pop(true, not_a0, CostOf());
  ASSERT_TRUE(item.has_value());
  EXPECT_EQ(item->n, 2);
  EXPECT_FALSE(q.Pop(true, not_a0, CostOf()).has_value());
  EXPECT_EQ(q.size(), 2);
  EXPECT_EQ(q.Pop(true, Always(), CostOf())->n, 0);
}

TEST(FairQueueTest, TakeRemovesOneClientsOrAllInPushOrder) {
  SchedulingClient a(1, "a", 1.0), b(2, "b", 1.0);
  FairQueue<Item> q;
  for (int i = 0; i < 6; ++i) q.Push(i % 2 == 0 ? &a : &b, Item{i % 2 == 0 ? "a" : "b", i});
  std::vector<int> seen;
  q.ForEach([&](const Item& item) { seen.push_back(item.n); });
  EXPECT_EQ(seen.size(), 6u);
  std::vector<Item> taken = q.Take(&b);
  ASSERT_EQ(taken.size(), 3u);
  EXPECT_EQ(taken[0].n, 1);
  EXPECT_EQ(taken[2].n, 5);
  EXPECT_EQ(q.size(), 3);
  taken = q.Take(nullptr, /*all=*/true);
  ASSERT_EQ(taken.size(), 3u);
  EXPECT_EQ(taken[0].n, 0);
  EXPECT_EQ(taken[1].n, 2);
  EXPECT_TRUE(q.empty());
}

}  // namespace
}  // namespace pw
