#ifndef PATHWAYS_SCHEDULER_FAIR_QUEUE_H_
#define PATHWAYS_SCHEDULER_FAIR_QUEUE_H_

// What waits for admission, per client, and which goes next (paper §4.4:
// the gang scheduler's policy): the one queue that both modes admit from,
// an island's GangScheduler (its gangs, hosts in process) and the client of
// hosts as processes (RemoteCluster: its runs, before they are sent).
//
// Each client has a FIFO queue; only the heads compete. Pop picks, among the
// heads its caller can admit now, either
//  - fair: the one with the smallest start tag, by start-time fair queueing
//    (Goyal, Vin and Cheng, SIGCOMM 1996): a client's start tag is the later
//    of the virtual time and its finish tag; admitting an item moves the
//    virtual time to its start tag and the client's finish tag past it by
//    the item's cost over the client's weight, so backlogged clients get
//    device time in proportion to their weights, and a client idle for a
//    while gets no credit for it (a new client starts at the virtual time);
//  - or first: the one pushed first (dispatch order across clients).
// Ties go to the item pushed first. Clients are few, so Pop scans them.
//
// Priorities (a service's tenants: service/service.h) come before both:
// only the admissible heads of the highest priority compete. Starvation is
// bounded: a head passed over kMaxPassOvers times by the pick of a head of
// higher priority competes from then on as if its priority were the
// highest, so an item at the head of its queue waits for at most
// kMaxPassOvers admissions of higher-priority work (and then for its turn
// among equals).
//
// Not thread-safe: the owner's lock guards it.

#include <algorithm>
#include <cstdint>
#include <deque>
#include <limits>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace pw {

class SchedulingClient;  // gang_scheduler.h

// `Client` has weight() > 0 (a SchedulingClient).
template <typename Item, typename Client = SchedulingClient>
class FairQueue {
 public:
  static constexpr int kMaxPassOvers = 16;
  // Items waiting, over every client.
  int64_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

  // Appends `item` to `client`'s queue (null: the default client, of weight
  // 1).
  void Push(const Client* client, Item item) {
    clients_[client].waiting.push_back(Entry{std::move(item), next_order_++});
    ++size_;
  }

  // Removes and returns the next head (see above) among those for which
  // `admissible(const Item&)` is true; nullopt if none is. `cost(const
  // Item&)` is the item's device time (ns over all its devices), read only
  // when `fair`.
  template <typename Admissible, typename Cost>
  std::optional<Item> Pop(bool fair, Admissible&& admissible, Cost&& cost) {
    ClientQueue* best = nullptr;
    const Client* best_client = nullptr;
    double best_start = 0;
    int best_priority = 0;
    int lower = 0;  // admissible heads of a priority below the best's
    for (auto& [client, q] : clients_) {
      if (q.waiting.empty() || !admissible(std::as_const(q.waiting.front().item))) continue;
      const int priority = EffectivePriority(client, q);
      const double start = fair ? std::max(virtual_time_, q.finish_tag) : 0;
      if (best == nullptr || priority > best_priority ||
          (priority == best_priority &&
           (start < best_start ||
            (start == best_start && q.waiting.front().order < best->waiting.front().order)))) {
        if (best != nullptr && priority > best_priority) ++lower;
        best = &q;
        best_client = client;
        best_start = start;
        best_priority = priority;
      } else if (priority < best_priority) {
        ++lower;
      }
    }
    if (best == nullptr) return std::nullopt;
    if (lower > 0) {
      // The heads of lower priority were passed over (admissible() again:
      // it must not change during a Pop).
      for (auto& [client, q] : clients_) {
        if (&q == best || q.waiting.empty() || EffectivePriority(client, q) >= best_priority) continue;
        if (admissible(std::as_const(q.waiting.front().item))) ++q.passed_over;
      }
    }
    best->passed_over = 0;  // a new head
    Item item = std::move(best->waiting.front().item);
    best->waiting.pop_front();
    --size_;
    if (fair) {
      const double weight = best_client != nullptr ? std::max(best_client->weight(), 1e-9) : 1.0;
      virtual_time_ = best_start;
      best->finish_tag = best_start + static_cast<double>(cost(std::as_const(item))) / weight;
    }
    return item;
  }

  // Calls fn(const Item&) for every item waiting, client by client, each
  // client's in order.
  template <typename Fn>
  void ForEach(Fn&& fn) const {
    for (const auto& [client, q] : clients_) {
      for (const Entry& e : q.waiting) fn(e.item);
    }
  }

  // Removes and returns every item of `client`, or of every client when
  // `all`, in push order.
  std::vector<Item> Take(const Client* client, bool all = false) {
    std::vector<Entry> taken;
    for (auto& [c, q] : clients_) {
      if (!all && c != client) continue;
      for (Entry& e : q.waiting) taken.push_back(std::move(e));
      size_ -= static_cast<int64_t>(q.waiting.size());
      q.waiting.clear();
    }
    std::sort(taken.begin(), taken.end(), [](const Entry& a, const Entry& b) { return a.order < b.order; });
    std::vector<Item> items;
    items.reserve(taken.size());
    for (Entry& e : taken) items.push_back(std::move(e.item));
    return items;
  }

 private:
  struct Entry {
    Item item;
    int64_t order = 0;  // push order, over every client
  };
  struct ClientQueue {
    std::deque<Entry> waiting;
    double finish_tag = 0;
    int passed_over = 0;  // by picks of higher priority, since its head became head
  };
  static int EffectivePriority(const Client* client, const ClientQueue& q) {
    if (q.passed_over >= kMaxPassOvers) return std::numeric_limits<int>::max();
    return client != nullptr ? client->priority() : 0;
  }
  absl::flat_hash_map<const Client*, ClientQueue> clients_;
  int64_t size_ = 0;
  int64_t next_order_ = 0;
  double virtual_time_ = 0;
};

}  // namespace pw

#endif  // PATHWAYS_SCHEDULER_FAIR_QUEUE_H_
