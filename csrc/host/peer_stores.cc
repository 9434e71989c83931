#include "csrc/host/peer_stores.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "csrc/base/error_kind.h"
#include "csrc/base/spin.h"
#include "csrc/base/status_macros.h"

namespace pw {
namespace {

constexpr int64_t kCallTimeoutNs = int64_t{10} * 1'000'000'000;
// How long a session waits for the other host to join its cluster (it
// refuses our peer key with FailedPrecondition until then).
constexpr int64_t kPeerJoinWaitNs = int64_t{30} * 1'000'000'000;

// One group's rendezvous in the store of its lowest member: waits in short
// slices, and gives up (HostLost) as soon as a member is known to be lost.
class GroupRendezvous final : public KeyValueStore {
 public:
  GroupRendezvous(KeyValueStore* store, std::vector<int> members, const PeerStores* stores)
      : store_(store), members_(std::move(members)), stores_(stores) {}

  absl::Status Set(absl::string_view key, absl::string_view value) override {
    PW_RETURN_IF_ERROR(MembersAlive());
    return store_->Set(key, value);
  }

  absl::StatusOr<std::string> Get(absl::string_view key, absl::Time deadline) override {
    while (true) {
      PW_RETURN_IF_ERROR(MembersAlive());
      const absl::Time slice = std::min(deadline, absl::Now() + absl::Milliseconds(20));
      absl::StatusOr<std::string> value = store_->Get(key, slice);
      if (value.ok() || !absl::IsDeadlineExceeded(value.status()) || slice >= deadline) return value;
    }
  }

 private:
  absl::Status MembersAlive() const {
    for (int h : members_) PW_RETURN_IF_ERROR(stores_->Lost(h));
    return absl::OkStatus();
  }
  KeyValueStore* const store_;
  const std::vector<int> members_;
  const PeerStores* const stores_;
};

}  // namespace

// ---- PeerStore ----

PeerStore::PeerStore(std::string address, ChannelOptions options) {
  MutexLock lock(&mu_);
  address_ = std::move(address);
  options_ = std::move(options);
  options_.abandon = [this] { return lost(); };
}

void PeerStore::Revive(std::string address, std::string key) {
  MutexLock lock(&mu_);
  if (channel_ != nullptr) retired_.push_back(std::move(channel_));
  address_ = std::move(address);
  options_.secret = std::move(key);
  options_.host_name = absl::StrCat(options_.host_name.substr(0, options_.host_name.find(" (")), " (", address_, ")");
  lost_ = absl::OkStatus();
}

PeerStore::~PeerStore() = default;

absl::Status PeerStore::Set(absl::string_view key, absl::string_view value) {
  PW_ASSIGN_OR_RETURN(std::shared_ptr<HostChannel> channel, Session());
  wire::Request request;
  request.mutable_kv_set()->set_key(std::string(key));
  request.mutable_kv_set()->set_value(std::string(value));
  return channel->Call(std::move(request), kCallTimeoutNs).status();
}

absl::StatusOr<std::string> PeerStore::Get(absl::string_view key, absl::Time deadline) {
  while (true) {
    PW_ASSIGN_OR_RETURN(std::shared_ptr<HostChannel> channel, Session());
    wire::Request request;
    request.mutable_kv_get()->set_key(std::string(key));
    auto reply = channel->Call(std::move(request), kCallTimeoutNs);
    if (reply.ok()) return std::move(*reply->mutable_kv_value()->mutable_value());
    // A session that broke under the call (the host not lost) is opened
    // anew, in time; any other error is the answer.
    if (!absl::IsNotFound(reply.status()) && (lost() || channel->alive())) return reply.status();
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("rendezvous: key '", key, "' was not set in time"));
    }
    absl::SleepFor(absl::Milliseconds(2));
  }
}

void PeerStore::Lose(const absl::Status& why) {
  std::shared_ptr<HostChannel> channel;
  {
    MutexLock lock(&mu_);
    if (!lost_.ok()) return;
    lost_ = why;
    channel = channel_;  // channel_ keeps it: never freed here
  }
  if (channel != nullptr) channel->Lose(why);
}

bool PeerStore::lost() const {
  MutexLock lock(&mu_);
  return !lost_.ok();
}

int PeerStore::sessions_opened() const {
  MutexLock lock(&mu_);
  return sessions_opened_;
}

absl::StatusOr<std::shared_ptr<HostChannel>> PeerStore::Session() {
  MutexLock connecting(&connect_mu_);
  std::shared_ptr<HostChannel> broken;  // closed outside mu_, on this thread
  {
    MutexLock lock(&mu_);
    if (!lost_.ok()) return lost_;
    if (channel_ != nullptr && channel_->alive()) return channel_;
    broken = std::move(channel_);
  }
  broken.reset();
  std::string address;
  ChannelOptions options;
  {
    MutexLock lock(&mu_);
    address = address_;
    options = options_;
  }
  // Not under mu_: Lose must get through, and makes this give up (abandon).
  // The other host may not have its JoinCluster (and so our peer key) yet:
  // it refuses with FailedPrecondition until it has, so that is tried again
  // for a while (a lost host ends the wait).
  const int64_t deadline = NowNanos() + kPeerJoinWaitNs;
  absl::StatusOr<std::unique_ptr<HostChannel>> channel;
  for (int64_t pause_ms = 1;; pause_ms = std::min<int64_t>(pause_ms * 2, 50)) {
    channel = HostChannel::Connect(address, wire::Hello(), options);
    if (channel.ok() || !absl::IsFailedPrecondition(channel.status()) || NowNanos() >= deadline || lost()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
  }
  MutexLock lock(&mu_);
  if (!lost_.ok()) return lost_;
  if (!channel.ok()) return channel.status();
  channel_ = *std::move(channel);
  ++sessions_opened_;
  return channel_;
}

// ---- PeerStores ----

PeerStores::PeerStores(int self, KeyValueStore* own, const std::vector<std::string>& addresses,
                       const std::vector<std::string>& peer_keys)
    : self_(self), own_(own), lost_(new std::atomic<bool>[addresses.size()]) {
  for (size_t h = 0; h < addresses.size(); ++h) {
    // A session with another host's store proves this host's identity with
    // the key the two share (auth.h's peer keys).
    ChannelOptions options;
    options.secret = h < peer_keys.size() ? peer_keys[h] : std::string();
    options.claim_host = self_;
    options.host_name = absl::StrCat("host ", h, " (", addresses[h], ")");
    options.client_name = absl::StrCat("host ", self_);
    peers_.push_back(std::make_unique<PeerStore>(addresses[h], std::move(options)));
    lost_[h].store(false, std::memory_order_relaxed);
  }
}

absl::Status PeerStores::CheckHost(int host) const {
  if (host < 0 || host >= static_cast<int>(peers_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("rendezvous: no host ", host, " in this cluster"));
  }
  return absl::OkStatus();
}

absl::StatusOr<KeyValueStore*> PeerStores::StoreOf(int host) {
  if (host == self_) return own_;
  PW_RETURN_IF_ERROR(CheckHost(host));
  return peers_[host].get();
}

absl::StatusOr<std::unique_ptr<KeyValueStore>> PeerStores::GroupStore(absl::Span<const int> members) {
  if (members.empty()) return absl::InvalidArgumentError("rendezvous: a group of no hosts");
  for (int h : members) PW_RETURN_IF_ERROR(CheckHost(h));
  PW_ASSIGN_OR_RETURN(KeyValueStore * store, StoreOf(members.front()));
  return std::make_unique<GroupRendezvous>(store, std::vector<int>(members.begin(), members.end()), this);
}

void PeerStores::Lose(int host, absl::string_view why) {
  if (!CheckHost(host).ok() || host == self_) return;
  if (lost_[host].exchange(true, std::memory_order_acq_rel)) return;
  peers_[host]->Lose(HostLostError(absl::StrCat("host ", host, " was lost: ", why)));
}

void PeerStores::Rejoin(int host, std::string address, std::string key) {
  if (!CheckHost(host).ok() || host == self_) return;
  peers_[host]->Revive(std::move(address), std::move(key));
  lost_[host].store(false, std::memory_order_release);
}

absl::Status PeerStores::Lost(int host) const {
  if (!CheckHost(host).ok() || !lost_[host].load(std::memory_order_acquire)) return absl::OkStatus();
  return HostLostError(absl::StrCat("rendezvous: host ", host, " of the group was lost"));
}

int PeerStores::sessions_opened(int host) const {
  if (!CheckHost(host).ok() || host == self_) return 0;
  return peers_[host]->sessions_opened();
}

}  // namespace pw
