#ifndef PATHWAYS_SCHEDULER_GANG_ORDER_H_
#define PATHWAYS_SCHEDULER_GANG_ORDER_H_

// The rule every device runs its gangs by (paper §4.4): gangs have one
// order, and a gang starts only once it heads the queue of each of its
// devices, that is once every earlier gang that shares one of its devices
// has finished. The one implementation of that rule for both modes: an
// island's GangScheduler (hosts in process, the island's devices) and each
// host's HostExecutor (hosts as processes, the host's own devices, in the
// order the client sent their parts).
//
// Cost: per gang, O(number of lists overlapping its own), never
// O(devices). Gangs are queued per list (a set of devices); a gang heads
// all its devices' queues exactly when it heads its own list's queue and
// every overlapping list's head comes later in the order. Lists are few
// (one per slice), so a 2048-device gang costs what an 8-device one does.
//
// Not thread-safe: the owner's lock guards it.

#include <algorithm>
#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"

namespace pw {

// `Gang` is what is queued: a pointer, copied freely.
template <typename Gang>
class GangOrder {
 public:
  using ListId = int;
  struct Ordered {
    Gang gang;
    uint64_t sequence = 0;  // its place in the order
    bool at_head = false;   // reported as heading all its devices' queues
  };
  struct List {
    std::vector<int> devices;     // increasing; fixed once made
    std::deque<Ordered> ordered;  // the gangs on exactly these devices, in order
    std::vector<ListId> overlaps;  // the other lists sharing a device with it
  };

  // Devices are the indices 0..num_devices-1.
  explicit GangOrder(int num_devices) : num_devices_(num_devices) {}

  // The list of `devices` (each below num_devices, no repeats, any order),
  // made at its first call: O(devices of every list) then, a lookup after.
  ListId ListOf(absl::Span<const int> devices) {
    std::vector<int> sorted(devices.begin(), devices.end());
    std::sort(sorted.begin(), sorted.end());
    auto [it, fresh] = by_devices_.try_emplace(sorted, static_cast<ListId>(lists_.size()));
    if (!fresh) return it->second;
    const ListId id = it->second;
    std::vector<uint8_t> mine(static_cast<size_t>(num_devices_), 0);
    for (int d : sorted) mine[d] = 1;
    List& list = lists_.emplace_back();
    list.devices = std::move(sorted);
    for (ListId other = 0; other < id; ++other) {
      for (int d : lists_[other].devices) {
        if (mine[d]) {
          lists_[other].overlaps.push_back(id);
          list.overlaps.push_back(other);
          break;
        }
      }
    }
    return id;
  }

  // References stay valid as lists are made (a deque).
  const List& list(ListId id) const { return lists_[id]; }
  int num_lists() const { return static_cast<int>(lists_.size()); }
  // Gangs placed in the order so far: the next one's sequence.
  uint64_t num_ordered() const { return next_sequence_; }

  // Places `gang` last in the order, on list `id`; returns its sequence.
  // Calls at_head(gang) if it heads all its devices' queues now. Only
  // `gang` can: one behind others on its list is reported by PopFront.
  template <typename AtHead>
  uint64_t Append(ListId id, Gang gang, AtHead&& at_head) {
    const uint64_t sequence = next_sequence_++;
    List& list = lists_[id];
    list.ordered.push_back(Ordered{gang, sequence, false});
    if (list.ordered.size() == 1) MaybeAtHead(list, at_head);
    return sequence;
  }

  // The gang heading list `id` (which headed all its devices' queues) is
  // done: removes and returns it, and calls at_head(gang) for each gang
  // that heads all its devices' queues now.
  template <typename AtHead>
  Gang PopFront(ListId id, AtHead&& at_head) {
    List& list = lists_[id];
    const Gang done = list.ordered.front().gang;
    list.ordered.pop_front();
    MaybeAtHead(list, at_head);
    for (ListId other : list.overlaps) MaybeAtHead(lists_[other], at_head);
    return done;
  }

  // Gangs ordered on list `id` and on the lists overlapping it (how full an
  // admission window around it is).
  size_t OrderedAround(ListId id) const {
    size_t n = lists_[id].ordered.size();
    for (ListId other : lists_[id].overlaps) n += lists_[other].ordered.size();
    return n;
  }

  // Calls fn(const Ordered&, ListId) for every gang in the order, list by
  // list (each gang once).
  template <typename Fn>
  void ForEach(Fn&& fn) const {
    for (ListId id = 0; id < num_lists(); ++id) {
      for (const Ordered& o : lists_[id].ordered) fn(o, id);
    }
  }

 private:
  // Reports `list`'s head if it heads all its devices' queues now (once).
  template <typename AtHead>
  void MaybeAtHead(List& list, AtHead& at_head) {
    if (list.ordered.empty()) return;
    Ordered& head = list.ordered.front();
    if (head.at_head) return;
    for (ListId other : list.overlaps) {
      const List& o = lists_[other];
      if (!o.ordered.empty() && o.ordered.front().sequence < head.sequence) return;
    }
    head.at_head = true;
    at_head(head.gang);
  }

  const int num_devices_;
  std::deque<List> lists_;
  absl::flat_hash_map<std::vector<int>, ListId> by_devices_;
  uint64_t next_sequence_ = 0;
};

}  // namespace pw

#endif  // PATHWAYS_SCHEDULER_GANG_ORDER_H_
