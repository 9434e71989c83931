#include "csrc/executor/timeline.h"

#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace pw {
namespace {

// Records an event whose start_ns is `tag`, so tests can tell events apart.
void RecordTagged(Timeline& timeline, int64_t tag) {
  TimelineEvent event;
  event.start_ns = tag;
  timeline.Record(std::move(event));
}

std::vector<int64_t> Tags(const absl::StatusOr<std::vector<TimelineEvent>>& events) {
  EXPECT_TRUE(events.ok()) << events.status();
  std::vector<int64_t> tags;
  if (events.ok()) {
    for (const TimelineEvent& e : *events) tags.push_back(e.start_ns);
  }
  return tags;
}

TEST(TimelineTest, NestedSessionsBothRecord) {
  Timeline timeline;
  RecordTagged(timeline, 0);  // not recording: dropped
  const int64_t outer = timeline.Start();
  RecordTagged(timeline, 1);
  const int64_t inner = timeline.Start();
  RecordTagged(timeline, 2);
  EXPECT_EQ(Tags(timeline.Stop(inner)), (std::vector<int64_t>{2}));
  EXPECT_TRUE(timeline.recording());
  RecordTagged(timeline, 3);
  EXPECT_EQ(Tags(timeline.Stop(outer)), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_FALSE(timeline.recording());
  RecordTagged(timeline, 4);
  // A closed (or never opened) session is an error, not an empty result.
  EXPECT_EQ(timeline.Stop(outer).status().code(), absl::StatusCode::kNotFound);
  // A new session starts empty.
  const int64_t again = timeline.Start();
  RecordTagged(timeline, 5);
  EXPECT_EQ(Tags(timeline.Stop(again)), (std::vector<int64_t>{5}));
}

TEST(TimelineTest, OverlappingSessionsCloseInAnyOrder) {
  Timeline timeline;
  const int64_t a = timeline.Start();
  RecordTagged(timeline, 1);
  const int64_t b = timeline.Start();
  RecordTagged(timeline, 2);
  EXPECT_EQ(Tags(timeline.Stop(a)), (std::vector<int64_t>{1, 2}));
  RecordTagged(timeline, 3);
  EXPECT_EQ(Tags(timeline.Stop(b)), (std::vector<int64_t>{2, 3}));
}

TEST(TimelineTest, SessionsOfSeveralThreads) {
  Timeline timeline;
  constexpr int kThreads = 4, kEvents = 1000;
  const int64_t all = timeline.Start();
  std::vector<std::thread> threads;
  std::vector<std::vector<int64_t>> seen(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const int64_t session = timeline.Start();
      for (int i = 0; i < kEvents; ++i) RecordTagged(timeline, t * kEvents + i);
      seen[t] = Tags(timeline.Stop(session));
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    // Each session saw at least its own thread's events, in order.
    std::vector<int64_t> own;
    for (int64_t tag : seen[t]) {
      if (tag / kEvents == t) own.push_back(tag);
    }
    ASSERT_EQ(own.size(), static_cast<size_t>(kEvents)) << t;
    for (int i = 0; i < kEvents; ++i) EXPECT_EQ(own[i], t * kEvents + i);
  }
  EXPECT_EQ(Tags(timeline.Stop(all)).size(), static_cast<size_t>(kThreads * kEvents));
}

}  // namespace
}  // namespace pw
