#include "csrc/host/host_groups.h"

#include <algorithm>
#include <cstring>
#include <stop_token>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "csrc/base/error_kind.h"
#include "csrc/base/status_macros.h"

namespace pw {

// ---- RendezvousStores ----

namespace {

// Another store as it is, for one rendezvous.
class ForwardingStore final : public KeyValueStore {
 public:
  explicit ForwardingStore(KeyValueStore* store) : store_(store) {}
  absl::Status Set(absl::string_view key, absl::string_view value) override { return store_->Set(key, value); }
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Time deadline) override {
    return store_->Get(key, deadline);
  }

 private:
  KeyValueStore* const store_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<KeyValueStore>> RendezvousStores::GroupStore(absl::Span<const int> members) {
  if (members.empty()) return absl::InvalidArgumentError("rendezvous: a group of no hosts");
  PW_ASSIGN_OR_RETURN(KeyValueStore * store, StoreOf(members.front()));
  return std::make_unique<ForwardingStore>(store);
}

// ---- HostGroups ----

// One incarnation of a set's group: made from its first use by a thread of
// its own (a maker: making one waits for the other hosts, however long they
// are busy, and the part that first needs it may stop waiting before then).
struct GroupIncarnation {
  Mutex mu;
  CondVar made_cv;  // signalled when `made` turns true
  bool making ABSL_GUARDED_BY(mu) = false;  // its maker started
  bool made ABSL_GUARDED_BY(mu) = false;    // group or error is set
  std::shared_ptr<CollectiveGroup> group ABSL_GUARDED_BY(mu);
  absl::Status error ABSL_GUARDED_BY(mu);
  std::atomic<bool> abort_join{false};  // making the group gives up (AbortGroupsWith)
};

// The collective groups of one session's set of hosts: one incarnation per
// generation (RenewGroup).
struct HostSetGroups {
  using Entry = GroupIncarnation;
  std::string base_key;    // the set's (and session's), before any host of it was replaced
  std::vector<int> hosts;  // increasing
  Mutex mu;
  // Of generation `base`, which names the members' epochs (HostGroups::
  // KeyFor); generation g > base adds "/g<g - base>".
  std::string key ABSL_GUARDED_BY(mu);
  // The generation of parts enqueued now; changed only by RenewGroup and
  // PeerJoined, on the thread that takes the client's requests in order.
  uint64_t generation ABSL_GUARDED_BY(mu) = 0;
  // The first generation since a host of the set was last replaced: older
  // ones met that host's earlier process, which is gone.
  uint64_t base ABSL_GUARDED_BY(mu) = 0;
  absl::flat_hash_map<uint64_t, std::shared_ptr<Entry>> entries ABSL_GUARDED_BY(mu);
  // Parts enqueued and not yet run, by generation: an older generation's
  // entry goes once none of its parts is left.
  absl::flat_hash_map<uint64_t, int> parts ABSL_GUARDED_BY(mu);
  // Why the set's groups cannot be made (a host of it is lost:
  // AbortGroupsWith), until a new process replaces it (PeerJoined); OK
  // while they can.
  absl::Status lost ABSL_GUARDED_BY(mu);
};

namespace {

// Makers of `entries` still waiting for the other hosts give up (their join
// asks), and the groups made abort their waits with `why`.
void AbortEntries(const std::vector<std::shared_ptr<HostSetGroups::Entry>>& entries, const absl::Status& why) {
  for (auto& entry : entries) entry->abort_join.store(true, std::memory_order_release);
  for (auto& entry : entries) {
    std::shared_ptr<CollectiveGroup> group;
    {
      MutexLock lock(&entry->mu);
      group = entry->group;
    }
    if (group != nullptr) group->Abort(why);
  }
}

}  // namespace

HostGroups::HostGroups(const HostLayout& layout, RendezvousStores* stores, std::string bind_ip,
                       const std::atomic<bool>& stopping, std::vector<int> host_epochs)
    : layout_(layout), stores_(stores), stopping_(stopping), epochs_(std::move(host_epochs)) {
  options_.bind_address = std::move(bind_ip);
  epochs_.resize(layout_.num_hosts, 0);
}

std::string HostGroups::KeyFor(const HostSetGroups& groups) const {
  std::vector<int> epochs;
  bool replaced = false;
  for (int h : groups.hosts) {
    epochs.push_back(epochs_[h]);
    replaced = replaced || epochs_[h] != 0;
  }
  // A set none of whose hosts was ever replaced keeps the key it always had.
  return replaced ? absl::StrCat(groups.base_key, "/e", absl::StrJoin(epochs, ".")) : groups.base_key;
}

HostGroups::~HostGroups() {
  // The owner has set `stopping`: the makers still waiting give up.
  std::vector<Maker> makers;
  {
    MutexLock lock(&mu_);
    makers.swap(makers_);
  }
  for (Maker& m : makers) m.thread.join();
}

void HostGroups::SetTimeouts(absl::Duration timeout, absl::Duration arrival_timeout) {
  if (timeout > absl::ZeroDuration()) options_.timeout = timeout;
  if (arrival_timeout > absl::ZeroDuration()) arrival_timeout_ = arrival_timeout;
}

HostSetGroups* HostGroups::ForSet(SessionId session, const std::vector<int>& host_set) {
  const std::string set = absl::StrJoin(host_set, ",");
  MutexLock lock(&mu_);
  std::unique_ptr<HostSetGroups>& groups = sets_[{session, set}];
  if (groups == nullptr) {
    groups = std::make_unique<HostSetGroups>();
    groups->base_key = absl::StrCat(layout_.group_prefix, "/hosts/", set);
    // Each session's group of the set meets under a key of its own;
    // kOneSession's stays as it was before sessions were keyed.
    if (session != kOneSession) absl::StrAppend(&groups->base_key, "/s", session);
    groups->hosts = host_set;
    MutexLock set_lock(&groups->mu);
    groups->key = KeyFor(*groups);
  }
  return groups.get();
}

uint64_t HostGroups::Enter(const HostDeviceList& gang) {
  HostSetGroups& groups = *gang.groups;
  MutexLock lock(&groups.mu);
  ++groups.parts[groups.generation];
  return groups.generation;
}

void HostGroups::Leave(const HostDeviceList& gang, uint64_t generation) {
  HostSetGroups& groups = *gang.groups;
  std::shared_ptr<HostSetGroups::Entry> dropped;  // destroyed unlocked
  MutexLock lock(&groups.mu);
  auto it = groups.parts.find(generation);
  if (it == groups.parts.end() || --it->second > 0) return;
  groups.parts.erase(it);
  if (generation == groups.generation) return;  // the incarnation later runs use
  if (auto e = groups.entries.find(generation); e != groups.entries.end()) {
    dropped = std::move(e->second);
    groups.entries.erase(e);
  }
}

absl::StatusOr<std::shared_ptr<CollectiveGroup>> HostGroups::GroupFor(const HostDeviceList& gang, uint64_t generation,
                                                                      std::stop_token stop) {
  HostSetGroups& groups = *gang.groups;
  std::shared_ptr<HostSetGroups::Entry> entry;
  std::string key;
  {
    MutexLock lock(&groups.mu);
    if (!groups.lost.ok()) return groups.lost;
    if (generation < groups.base) {
      // Enqueued before a host of the set was replaced: its group would have
      // met that host's earlier process, which is gone.
      return HostLostError(absl::StrCat("a host of the gang (", absl::StrJoin(groups.hosts, ","),
                                        ") was lost, and replaced since this part was sent"));
    }
    std::shared_ptr<HostSetGroups::Entry>& e = groups.entries[generation];
    if (e == nullptr) e = std::make_shared<HostSetGroups::Entry>();
    entry = e;
    // A fresh key per incarnation: an earlier one's addresses are stale.
    key = generation == groups.base ? groups.key : absl::StrCat(groups.key, "/g", generation - groups.base);
  }
  bool start = false;
  {
    MutexLock lock(&entry->mu);
    start = !entry->making;
    entry->making = true;
  }
  if (start) StartMaker(groups, std::move(key), entry);
  // Runs at once if a stop was requested already (the lock not held yet).
  std::stop_callback wake(stop, [&entry] {
    MutexLock lock(&entry->mu);
    entry->made_cv.SignalAll();
  });
  MutexLock lock(&entry->mu);
  while (!entry->made && !stop.stop_requested()) entry->made_cv.Wait(&entry->mu);
  if (!entry->made) {
    return absl::CancelledError(absl::StrCat("stopped waiting for the collective group of hosts ",
                                             absl::StrJoin(groups.hosts, ","), " to be made"));
  }
  if (!entry->error.ok()) return entry->error;
  return entry->group;
}

void HostGroups::StartMaker(HostSetGroups& groups, std::string key, std::shared_ptr<GroupIncarnation> entry) {
  auto finished = std::make_shared<std::atomic<bool>>(false);
  // The key and the set's hosts by copy: a set whose session ends goes
  // while its makers may still wait (EndSession).
  std::thread thread([this, key = std::move(key), hosts = groups.hosts, entry, finished] {
    const int rank =
        static_cast<int>(std::lower_bound(hosts.begin(), hosts.end(), layout_.host_id) - hosts.begin());
    // The others may come late (busy devices): the join waits as a part's
    // first collective does.
    CollectiveOptions options = options_;
    options.join_timeout = arrival_timeout_;
    options.join_cancelled = [this, e = entry.get()] {
      return stopping_.load(std::memory_order_acquire) || e->abort_join.load(std::memory_order_acquire);
    };
    // The group meets in the store of its lowest host (RendezvousStores),
    // which gives up at once if a member is lost.
    absl::StatusOr<std::unique_ptr<KeyValueStore>> store = stores_->GroupStore(hosts);
    absl::StatusOr<std::unique_ptr<CollectiveGroup>> group =
        store.ok() ? CollectiveGroup::Create(store->get(), key, rank, static_cast<int>(hosts.size()), options)
                   : store.status();
    {
      MutexLock lock(&entry->mu);
      if (group.ok()) {
        entry->group = *std::move(group);
      } else {
        entry->error = group.status();
      }
      entry->made = true;
      entry->made_cv.SignalAll();
    }
    finished->store(true, std::memory_order_release);
  });
  MutexLock lock(&mu_);
  // The makers that are done go (joined at once) as new ones come.
  auto done = std::partition(makers_.begin(), makers_.end(),
                             [](const Maker& m) { return !m.finished->load(std::memory_order_acquire); });
  for (auto it = done; it != makers_.end(); ++it) it->thread.join();
  makers_.erase(done, makers_.end());
  makers_.push_back(Maker{std::move(thread), std::move(finished)});
}

absl::Status HostGroups::RenewGroup(SessionId session, absl::Span<const int> hosts) {
  HostSetGroups* groups = nullptr;
  {
    MutexLock lock(&mu_);
    auto it = sets_.find(std::make_pair(session, absl::StrJoin(hosts, ",")));
    if (it != sets_.end()) groups = it->second.get();
  }
  if (groups == nullptr) {
    if (hosts.size() < 2 || std::find(hosts.begin(), hosts.end(), layout_.host_id) == hosts.end() ||
        !std::is_sorted(hosts.begin(), hosts.end()) || hosts.back() >= layout_.num_hosts ||
        std::adjacent_find(hosts.begin(), hosts.end()) != hosts.end()) {
      return absl::InvalidArgumentError(absl::StrCat("renew_group: [", absl::StrJoin(hosts, ","),
                                                     "] is no set of hosts with host ", layout_.host_id));
    }
    // No list of this host spans that set yet; one may later (a process
    // that replaced a lost host learns the lists as they are needed), and
    // its gangs must then meet in the generation the other hosts count.
    groups = ForSet(session, std::vector<int>(hosts.begin(), hosts.end()));
  }
  std::shared_ptr<HostSetGroups::Entry> dropped;  // destroyed unlocked
  MutexLock lock(&groups->mu);
  const uint64_t old = groups->generation++;
  if (!groups->parts.contains(old)) {  // none of its parts is left: it goes now
    if (auto e = groups->entries.find(old); e != groups->entries.end()) {
      dropped = std::move(e->second);
      groups->entries.erase(e);
    }
  }
  return absl::OkStatus();
}

void HostGroups::AbortGroupsWith(int host, const absl::Status& why) {
  std::vector<std::shared_ptr<HostSetGroups::Entry>> entries;
  {
    MutexLock lock(&mu_);
    for (auto& [set, groups] : sets_) {
      if (host >= 0 && !std::binary_search(groups->hosts.begin(), groups->hosts.end(), host)) continue;
      MutexLock set_lock(&groups->mu);
      if (groups->lost.ok()) groups->lost = why;  // no group of this set is made again
      for (auto& [generation, entry] : groups->entries) entries.push_back(entry);
    }
  }
  // A maker still waiting for the others gives up (its join asks), and
  // the parts waiting for it with it.
  AbortEntries(entries, why);
}

void HostGroups::PeerJoined(int host, int epoch) {
  std::vector<std::shared_ptr<HostSetGroups::Entry>> dropped;  // destroyed unlocked
  MutexLock lock(&mu_);
  if (host < 0 || host >= static_cast<int>(epochs_.size())) return;
  epochs_[host] = epoch;
  for (auto& [set, groups] : sets_) {
    if (!std::binary_search(groups->hosts.begin(), groups->hosts.end(), host)) continue;
    MutexLock set_lock(&groups->mu);
    // The next generation, under the key of the members' epochs now: the
    // new process starts there at its generation 0.
    const uint64_t old = groups->generation++;
    groups->base = groups->generation;
    groups->key = KeyFor(*groups);
    groups->lost = absl::OkStatus();
    if (!groups->parts.contains(old)) {
      if (auto e = groups->entries.find(old); e != groups->entries.end()) {
        dropped.push_back(std::move(e->second));
        groups->entries.erase(e);
      }
    }
  }
}

void HostGroups::EndSession(SessionId session, const absl::Status& why) {
  std::vector<std::unique_ptr<HostSetGroups>> ended;  // destroyed unlocked
  {
    MutexLock lock(&mu_);
    for (auto it = sets_.begin(); it != sets_.end();) {
      if (it->first.first != session) {
        ++it;
        continue;
      }
      ended.push_back(std::move(it->second));
      sets_.erase(it++);
    }
  }
  std::vector<std::shared_ptr<HostSetGroups::Entry>> entries;
  for (auto& groups : ended) {
    MutexLock lock(&groups->mu);
    for (auto& [generation, entry] : groups->entries) entries.push_back(std::move(entry));
  }
  // A maker still waiting for the other hosts gives up (its join asks); a
  // group made goes with its last holder (the maker's, or these).
  AbortEntries(entries, why);
}

// ---- GroupCollectives ----

namespace {

absl::Status Aborted() { return absl::AbortedError("another host of the gang could not run its part"); }

void SetFlag(DType dtype, uint8_t* slot, bool value) {
  switch (dtype) {
    case DType::kF32: {
      const float v = value ? 1.f : 0.f;
      std::memcpy(slot, &v, sizeof v);
      return;
    }
    case DType::kF64: {
      const double v = value ? 1.0 : 0.0;
      std::memcpy(slot, &v, sizeof v);
      return;
    }
    case DType::kI32:
    case DType::kU32: {  // 0 and 1 have the same bits in both
      const int32_t v = value ? 1 : 0;
      std::memcpy(slot, &v, sizeof v);
      return;
    }
    case DType::kBool:
      *slot = value ? 1 : 0;
      return;
    case DType::kBF16: {  // never reduced (the function IR widens it), but it has a one
      const BFloat16 v = FloatToBFloat16(value ? 1.f : 0.f);
      std::memcpy(slot, &v.bits, sizeof v.bits);
      return;
    }
  }
}

bool FlagIsSet(DType dtype, const uint8_t* slot) {
  switch (dtype) {
    case DType::kF32: {
      float v;
      std::memcpy(&v, slot, sizeof v);
      return v != 0.f;
    }
    case DType::kF64: {
      double v;
      std::memcpy(&v, slot, sizeof v);
      return v != 0.0;
    }
    case DType::kI32:
    case DType::kU32: {
      int32_t v;
      std::memcpy(&v, slot, sizeof v);
      return v != 0;
    }
    case DType::kBool:
      return *slot != 0;
    case DType::kBF16: {
      BFloat16 v;
      std::memcpy(&v.bits, slot, sizeof v.bits);
      return BFloat16ToFloat(v) != 0.f;
    }
  }
  return true;
}

}  // namespace

absl::Status GroupCollectives::AllGather(const void* local, void* full, int64_t shard_bytes) {
  const bool agree = !agreed_;
  agreed_ = true;
  const int64_t flag_bytes = agree ? 1 : 0;
  const size_t n = gang_->host_set.size();
  bytes_per_rank_.resize(n);
  const int own_host = gang_->hosts[static_cast<size_t>(gang_->local_positions[0])];
  int64_t total = 0, own_offset = 0;
  for (size_t r = 0; r < n; ++r) {
    bytes_per_rank_[r] = static_cast<int64_t>(gang_->positions_by_host[r].size()) * shard_bytes + flag_bytes;
    if (gang_->host_set[r] < own_host) own_offset += bytes_per_rank_[r];
    total += bytes_per_rank_[r];
  }
  gathered_.resize(static_cast<size_t>(total));
  const int64_t local_bytes = static_cast<int64_t>(gang_->local_positions.size()) * shard_bytes;
  const uint8_t* in = static_cast<const uint8_t*>(local);
  if (agree) {  // this host's shards and its flag, in place in its slot
    if (local_bytes > 0 && local != nullptr) std::memcpy(gathered_.data() + own_offset, local, local_bytes);
    gathered_[own_offset + local_bytes] = cannot_run_ ? 1 : 0;
    in = gathered_.data() + own_offset;
  }
  PW_RETURN_IF_ERROR(group_->AllGatherV(in, local_bytes + flag_bytes, gathered_.data(), bytes_per_rank_, tag_));
  if (agree) {
    bool cannot = false;
    int64_t end = 0;
    for (size_t r = 0; r < n; ++r) {
      end += bytes_per_rank_[r];
      cannot |= gathered_[end - 1] != 0;
    }
    if (cannot) return Aborted();
  }
  // Rank order (hosts) to gang order (positions).
  uint8_t* out = static_cast<uint8_t*>(full);
  const uint8_t* from = gathered_.data();
  for (size_t r = 0; r < n; ++r) {
    for (int pos : gang_->positions_by_host[r]) {
      std::memcpy(out + pos * shard_bytes, from, static_cast<size_t>(shard_bytes));
      from += shard_bytes;
    }
    from += flag_bytes;
  }
  return absl::OkStatus();
}

absl::Status GroupCollectives::AllReduce(DType dtype, ReduceOp op, void* data, int64_t count) {
  if (agreed_) return group_->AllReduce(dtype, op, data, count, tag_);
  agreed_ = true;
  // One more element: the flag, as a value that the reduction keeps equal
  // to "can run" only if every host can (sum and max of 0s; min of 1s).
  const int64_t esize = DTypeSize(dtype);
  reduced_.resize(static_cast<size_t>((count + 1) * esize));
  if (count > 0 && data != nullptr) std::memcpy(reduced_.data(), data, static_cast<size_t>(count * esize));
  const bool can_value = op == ReduceOp::kMin;
  SetFlag(dtype, reduced_.data() + count * esize, cannot_run_ ? !can_value : can_value);
  PW_RETURN_IF_ERROR(group_->AllReduce(dtype, op, reduced_.data(), count + 1, tag_));
  if (FlagIsSet(dtype, reduced_.data() + count * esize) != can_value) return Aborted();
  if (count > 0 && data != nullptr) std::memcpy(data, reduced_.data(), static_cast<size_t>(count * esize));
  return absl::OkStatus();
}

absl::Status GroupCollectives::JoinWithoutRunning(const FunctionExecutable::CollectiveCall& call) {
  using Kind = FunctionExecutable::CollectiveCall::Kind;
  if (call.kind == Kind::kAllReduce) {
    std::vector<uint8_t> zeros(static_cast<size_t>(call.count * DTypeSize(call.dtype)));
    absl::Status s = AllReduce(call.dtype, call.op, zeros.data(), call.count);
    return absl::IsAborted(s) ? absl::OkStatus() : s;
  }
  if (call.kind == Kind::kAllGather) {
    const size_t num_local = gang_->local_positions.size();
    std::vector<uint8_t> zeros(num_local * static_cast<size_t>(call.shard_bytes));
    std::vector<uint8_t> full(gang_->device_ids.size() * static_cast<size_t>(call.shard_bytes));
    absl::Status s = AllGather(zeros.data(), full.data(), call.shard_bytes);
    return absl::IsAborted(s) ? absl::OkStatus() : s;
  }
  return absl::OkStatus();
}

}  // namespace pw
