#include "csrc/host/host_transfers.h"

#include <chrono>
#include <cstring>
#include <deque>
#include <iostream>
#include <optional>
#include <thread>

#include "absl/functional/any_invocable.h"
#include "absl/strings/str_cat.h"
#include "csrc/base/error_kind.h"
#include "csrc/base/status_macros.h"
#include "csrc/coordination/host_channel.h"
#include "csrc/host/host_groups.h"

namespace pw {
namespace {

// A message whose receive is not posted this long after it came is said on
// stderr (see RecvLoop).
constexpr std::chrono::seconds kLongRecvWait(10);

// A transfer's message on the data plane: its shards (flag kShards), or,
// when they cannot be had, an error report (kErrorReport: a wire::Status)
// that the receiver fails its destination with.
constexpr uint8_t kShards = 0;
constexpr uint8_t kErrorReport = 1;

// Shards `indices` (of `shard` bytes each) of `base` as pieces to send or
// receive into, consecutive shards in one piece.
void ShardPieces(const std::vector<int>& indices, uint8_t* base, int64_t shard, std::vector<iovec>& pieces) {
  pieces.clear();
  for (int i : indices) {
    uint8_t* p = base + i * shard;
    if (!pieces.empty() && static_cast<uint8_t*>(pieces.back().iov_base) + pieces.back().iov_len == p) {
      pieces.back().iov_len += static_cast<size_t>(shard);
    } else {
      pieces.push_back(iovec{p, static_cast<size_t>(shard)});
    }
  }
}

// `status` as an error report: never `payload` bytes long, so that it can
// never pass for the shards (see DataPlane::Recv's `other`).
std::string ErrorReport(const absl::Status& status, int64_t payload) {
  wire::Status w;
  ToWire(absl::Status(status.code(), status.message().substr(0, 4096)), &w);
  if (static_cast<int64_t>(w.ByteSizeLong()) == payload) w.mutable_message()->push_back(' ');
  return w.SerializeAsString();
}

}  // namespace

// The remaining sources of one transfer's destination on this host.
struct HostTransfers::DstParts {
  std::shared_ptr<HostBuffer> dst;
  // Run once every part is in, if they all went well (the devices' health).
  absl::AnyInvocable<absl::Status()> check;
  std::atomic<int> left{0};
  Mutex mu;
  absl::Status error ABSL_GUARDED_BY(mu);
  void Done(const absl::Status& status) {
    if (!status.ok()) {
      MutexLock lock(&mu);
      if (error.ok()) error = status;
    }
    if (left.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    absl::Status result;
    {
      MutexLock lock(&mu);
      result = error;
    }
    if (result.ok() && check) result = check();
    dst->Complete(result);
  }
};

// One other host: what this host sends it, in the global order, and the
// receives posted for its messages, by destination.
struct HostTransfers::Peer {
  struct Send {
    DataMessageIds ids;  // the run and the destination: what the receiver matches
    std::shared_ptr<HostBuffer> src;
    std::vector<int> indices;  // local shard indices of src, in order
    std::vector<int> devices;  // their devices (indices in this host)
    int64_t shard_bytes = 0;
    int64_t src_bytes = 0;     // what src must hold
  };
  struct Recv {
    RunKey run;
    std::shared_ptr<DstParts> parts;
    std::vector<int> indices;  // local shard indices of the destination
    int64_t shard_bytes = 0;
  };
  int host = 0;
  Mutex mu;  // signals cv when sends or recvs grow, when a run dies, and on stopping
  CondVar cv;
  std::deque<Send> sends ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<RecvKey, Recv> recvs ABSL_GUARDED_BY(mu);
  // Set once nothing more can come from this host (its connection broke, or
  // this host stops): receives posted from then on fail at once with it.
  absl::Status recv_broken ABSL_GUARDED_BY(mu);
  // It served a host's earlier process (RetirePeer): its threads end.
  bool retired ABSL_GUARDED_BY(mu) = false;
  std::thread sender, receiver;
};

HostTransfers::HostTransfers(const HostLayout& layout, std::string bind_ip, std::string secret,
                             std::vector<std::string> peer_keys, const DeadRuns& dead_runs,
                             const HostHealth& health, const std::atomic<bool>& stopping,
                             uint64_t first_buffer_id)
    : layout_(layout),
      bind_ip_(std::move(bind_ip)),
      secret_(std::move(secret)),
      peer_keys_(std::move(peer_keys)),
      dead_runs_(dead_runs),
      health_(health),
      stopping_(stopping),
      first_buffer_id_(first_buffer_id) {}

HostTransfers::~HostTransfers() { Stop(); }

void HostTransfers::Stop() {
  if (data_ != nullptr) data_->Shutdown();  // a peer thread blocked in it returns
  std::vector<std::unique_ptr<Peer>> peers;
  {
    MutexLock lock(&peers_mu_);
    for (auto& [host, peer] : peers_) peers.push_back(std::move(peer));
    peers_.clear();
    for (auto& peer : retired_) peers.push_back(std::move(peer));
    retired_.clear();
  }
  for (auto& peer : peers) {
    {
      MutexLock lock(&peer->mu);
      peer->cv.SignalAll();
    }
    peer->sender.join();
    peer->receiver.join();
  }
}

std::string HostTransfers::address() const { return data_ != nullptr ? data_->address() : std::string(); }

std::string HostTransfers::AddressKey(int host) const { return absl::StrCat(layout_.group_prefix, "/data/", host); }

absl::Status HostTransfers::Connect(RendezvousStores& stores, absl::Duration timeout,
                                    const std::vector<std::string>& data_addresses) {
  const int num_hosts = layout_.num_hosts;
  if (num_hosts <= 1) return absl::OkStatus();
  DataPlane::Options options;
  options.bind_ip = bind_ip_;
  // Hosts configured without a secret (tests) still name their cluster.
  options.secret = secret_.empty() ? layout_.group_prefix : secret_;
  if (options.secret.size() > DataPlane::kMaxSecretBytes) options.secret.resize(DataPlane::kMaxSecretBytes);
  // With the client's peer keys, each connection proves which host it is.
  if (peer_keys_.size() == static_cast<size_t>(num_hosts)) options.peer_keys = peer_keys_;
  options.connect_timeout = timeout;
  PW_ASSIGN_OR_RETURN(std::unique_ptr<DataPlane> plane, DataPlane::Listen(layout_.host_id, num_hosts, options));
  if (!data_addresses.empty()) {
    // A replacement: the client gave the others' addresses (a lost one's
    // empty: absent). They read this one's from its own store.
    if (data_addresses.size() != static_cast<size_t>(num_hosts)) {
      return absl::InvalidArgumentError(absl::StrCat("join: ", data_addresses.size(), " data plane addresses for ",
                                                     num_hosts, " hosts"));
    }
    PW_ASSIGN_OR_RETURN(KeyValueStore * own, stores.StoreOf(layout_.host_id));
    PW_RETURN_IF_ERROR(own->Set(AddressKey(layout_.host_id), plane->address()));
    std::vector<std::string> addresses = data_addresses;
    addresses[layout_.host_id] = plane->address();
    PW_RETURN_IF_ERROR(plane->Connect(addresses));
    data_ = std::move(plane);
    return absl::OkStatus();
  }
  // The hosts learn each other's data plane addresses through host 0's
  // store (every host is alive while the cluster forms).
  PW_ASSIGN_OR_RETURN(KeyValueStore * store, stores.StoreOf(0));
  const std::string prefix = absl::StrCat(layout_.group_prefix, "/data/");
  PW_RETURN_IF_ERROR(store->Set(absl::StrCat(prefix, layout_.host_id), plane->address()));
  const absl::Time deadline = absl::Now() + options.connect_timeout;
  std::vector<std::string> addresses(num_hosts);
  for (int h = 0; h < num_hosts; ++h) {
    if (h == layout_.host_id) {
      addresses[h] = plane->address();
    } else {
      PW_ASSIGN_OR_RETURN(addresses[h], store->Get(absl::StrCat(prefix, h), deadline));
    }
  }
  PW_RETURN_IF_ERROR(plane->Connect(addresses));
  data_ = std::move(plane);
  return absl::OkStatus();
}

absl::Status HostTransfers::CheckSizes(const HostBuffer& src, int64_t src_bytes, const HostBuffer& dst) const {
  if (src.bytes() != src_bytes) {  // never read past a buffer, whatever a client says
    return absl::InternalError(absl::StrCat("transfer: buffer ", src.id(), " has ", src.bytes(), " bytes on host ",
                                            layout_.host_id, ", expected ", src_bytes));
  }
  if (!dst.allocated()) return dst.AllocationError();
  return absl::OkStatus();
}

void HostTransfers::Start(const RunKey& run, const HostDeviceList& src_list, std::shared_ptr<HostBuffer> src,
                          const HostDeviceList& dst_list, uint64_t dst_id, std::shared_ptr<HostBuffer> dst,
                          int64_t shard_bytes) {
  const int host_id = layout_.host_id;
  const int64_t src_bytes = static_cast<int64_t>(src_list.local_positions.size()) * shard_bytes;
  std::vector<std::pair<int, int>> copies;  // (src local index, dst local index)
  absl::flat_hash_map<int, std::vector<int>> sends, recvs;
  absl::flat_hash_map<int, std::vector<int>> send_devices;  // the devices of `sends`
  std::vector<int> dst_devices;  // devices whose health the destination needs
  std::vector<int> send_order, recv_order;  // peers, in first-seen order
  int src_local = 0, dst_local = 0;
  for (size_t i = 0; i < src_list.device_ids.size(); ++i) {
    const int s = src_list.hosts[i];
    const int d = dst_list.hosts[i];
    const int si = s == host_id ? src_local++ : -1;
    const int di = d == host_id ? dst_local++ : -1;
    if (s == host_id && d == host_id) {
      copies.emplace_back(si, di);
      dst_devices.push_back(src_list.local_devices[si]);
      dst_devices.push_back(dst_list.local_devices[di]);
    } else if (s == host_id) {
      if (!sends.contains(d)) send_order.push_back(d);
      sends[d].push_back(si);
      send_devices[d].push_back(src_list.local_devices[si]);
    } else if (d == host_id) {
      dst_devices.push_back(dst_list.local_devices[di]);
      if (!recvs.contains(s)) recv_order.push_back(s);
      recvs[s].push_back(di);
    }
  }
  const DataMessageIds ids{run.session, run.program_id, run.first_buffer_id, dst_id};
  for (int peer : send_order) {
    Peer& p = PeerFor(peer);
    MutexLock lock(&p.mu);
    if (p.retired) continue;  // for a process that is gone (RetirePeer): its run is dead
    p.sends.push_back(
        Peer::Send{ids, src, std::move(sends[peer]), std::move(send_devices[peer]), shard_bytes, src_bytes});
    p.cv.SignalAll();
  }
  if (dst == nullptr) return;
  auto parts = std::make_shared<DstParts>();
  parts->dst = dst;
  parts->check = [health = &health_, devices = std::move(dst_devices)] { return health->CheckHealthy(devices); };
  parts->left.store((copies.empty() ? 0 : 1) + static_cast<int>(recv_order.size()) + 1);
  for (int peer : recv_order) {
    if (data_ == nullptr) {
      parts->Done(absl::FailedPreconditionError("the data plane is not connected"));
      continue;
    }
    Peer& p = PeerFor(peer);
    absl::Status broken;
    {
      MutexLock lock(&p.mu);
      broken = p.recv_broken;
      if (broken.ok()) {
        // Posted by its destination's id: the receiving thread pairs the
        // message that names it with it, whatever came before.
        p.recvs.insert_or_assign(RecvKey{run.session, dst_id},
                                 Peer::Recv{run, parts, std::move(recvs[peer]), shard_bytes});
        p.cv.SignalAll();
      }
    }
    if (!broken.ok()) parts->Done(broken);
  }
  if (!copies.empty()) {
    src->OnDone([this, src, dst, parts, copies = std::move(copies), shard_bytes,
                 src_bytes](absl::Status status) {
      status.Update(CheckSizes(*src, src_bytes, *dst));
      if (status.ok()) {
        for (auto [si, di] : copies) {
          std::memcpy(dst->data() + di * shard_bytes, src->data() + si * shard_bytes,
                      static_cast<size_t>(shard_bytes));
        }
      }
      parts->Done(status);
    });
  }
  parts->Done(absl::OkStatus());  // the hold
}

HostTransfers::Peer& HostTransfers::PeerFor(int host) {
  MutexLock lock(&peers_mu_);
  std::unique_ptr<Peer>& peer = peers_[host];
  if (peer == nullptr) {
    peer = std::make_unique<Peer>();
    peer->host = host;
    Peer* p = peer.get();
    p->sender = std::thread([this, p] { SendLoop(p); });
    p->receiver = std::thread([this, p] { RecvLoop(p); });
  }
  return *peer;
}

std::vector<HostTransfers::Peer*> HostTransfers::Peers() {
  std::vector<Peer*> peers;
  MutexLock lock(&peers_mu_);
  for (auto& [host, peer] : peers_) peers.push_back(peer.get());
  return peers;
}

void HostTransfers::SendLoop(Peer* peer) {
  std::vector<iovec> pieces;
  while (true) {
    Peer::Send item;
    {
      MutexLock lock(&peer->mu);
      while (peer->sends.empty() && !peer->retired && !stopping_.load(std::memory_order_acquire)) {
        peer->cv.Wait(&peer->mu);
      }
      if (peer->sends.empty() || peer->retired) return;
      item = std::move(peer->sends.front());
      peer->sends.pop_front();
    }
    const int64_t payload = static_cast<int64_t>(item.indices.size()) * item.shard_bytes;
    const RunKey run{item.ids.session, item.ids.program_id, item.ids.first_buffer_id};
    // A cancelled run's data is not worth sending (nor waiting for): the
    // receiver drops it, or, if the cancel has not reached it yet, fails the
    // destination with the error.
    absl::Status status = dead_runs_.DeadStatus(run);
    if (status.ok()) status = item.src->Await(stopping_);
    if (stopping_.load(std::memory_order_acquire)) return;
    if (status.ok() && item.src->bytes() != item.src_bytes) {
      status = absl::InternalError(absl::StrCat("transfer: buffer ", item.src->id(), " has ", item.src->bytes(),
                                                " bytes on host ", layout_.host_id, ", expected ", item.src_bytes));
    }
    if (status.ok()) status = health_.CheckHealthy(item.devices);
    if (status.ok()) status = dead_runs_.DeadStatus(run);
    if (data_ == nullptr) continue;  // the receiver fails its part
    absl::Status sent;
    if (status.ok()) {
      // Straight from the buffer: the kernel gathers the shards.
      ShardPieces(item.indices, item.src->data(), item.shard_bytes, pieces);
      sent = data_->Send(peer->host, pieces, kShards, item.ids);
    } else {
      const std::string report = ErrorReport(status, payload);
      const iovec piece{const_cast<char*>(report.data()), report.size()};
      sent = data_->Send(peer->host, {&piece, 1}, kErrorReport, item.ids);
    }
    item.src.reset();
    if (!sent.ok() && !absl::IsCancelled(sent)) {
      std::cerr << "pathways-host " << layout_.host_id << ": transfer to host " << peer->host << " failed: " << sent
                << "\n";
    }
  }
}

void HostTransfers::RecvLoop(Peer* peer) {
  const int host_id = layout_.host_id;
  std::vector<iovec> pieces;
  std::string report;
  // Ends the loop: every receive from this peer fails from now on.
  auto broken = [&](const absl::Status& status) { FailReceives(peer, status); };
  if (data_ == nullptr) return broken(absl::FailedPreconditionError("the data plane is not connected"));
  while (true) {
    {
      MutexLock lock(&peer->mu);
      if (peer->retired) return;  // a fresh peer reads the new process's messages
    }
    absl::StatusOr<DataMessageHeader> header = data_->RecvHeader(peer->host);
    if (!header.ok()) return broken(header.status());
    const DataMessageIds& ids = header->ids;
    const RunKey run{ids.session, ids.program_id, ids.first_buffer_id};
    if (ids.session == kOneSession && ids.first_buffer_id < first_buffer_id_) {
      // A run from before this process replaced a lost host: a survivor
      // had queued it for the earlier one.
      if (absl::Status dropped = data_->Discard(peer->host); !dropped.ok()) return broken(dropped);
      continue;
    }
    // The receive posted for its destination; none yet: its run has not
    // reached this host yet (every host takes the runs in one order), so it
    // waits, and nothing else is read from this peer meanwhile, as when
    // receives paired by order. Or nowhere: its run is dead here.
    std::optional<Peer::Recv> item;
    {
      MutexLock lock(&peer->mu);
      // A run reaches every host at about the same time (the client sends
      // it to all at once): a long wait means this host's control plane is
      // far behind, or the hosts disagree on the program. Said once.
      const auto warn_at = std::chrono::steady_clock::now() + kLongRecvWait;
      bool warned = false;
      while (!stopping_.load(std::memory_order_acquire) && !peer->retired) {
        auto it = peer->recvs.find(RecvKey{ids.session, ids.buffer_id});
        if (it != peer->recvs.end()) {
          item = std::move(it->second);
          peer->recvs.erase(it);
          break;
        }
        if (!dead_runs_.DeadStatus(run).ok()) break;
        if (warned) {
          peer->cv.Wait(&peer->mu);
        } else if (!peer->cv.WaitUntil(&peer->mu, warn_at)) {
          warned = true;
          std::cerr << "pathways-host " << host_id << ": a message from host " << peer->host << " for buffer "
                    << ids.buffer_id << " of the run of program " << ids.program_id << " from buffer "
                    << ids.first_buffer_id << " has waited " << absl::FormatDuration(absl::FromChrono(kLongRecvWait))
                    << " for its run to reach this host\n";
        }
      }
    }
    if (stopping_.load(std::memory_order_acquire)) return broken(absl::CancelledError("the host is stopping"));
    bool retired;
    {
      MutexLock lock(&peer->mu);
      retired = peer->retired;
    }
    if (retired) {
      // RetirePeer failed what was still posted; this one was taken before.
      if (item.has_value()) {
        item->parts->Done(HostLostError(absl::StrCat("host ", peer->host, " was lost (a new process replaced it)")));
      }
      return;
    }
    if (!item.has_value()) {  // a run refused or cancelled here
      if (absl::Status dropped = data_->Discard(peer->host); !dropped.ok()) return broken(dropped);
      continue;
    }
    const int64_t payload = static_cast<int64_t>(item->indices.size()) * item->shard_bytes;
    HostBuffer& dst = *item->parts->dst;
    absl::Status status;     // the destination's part
    absl::Status connection;  // the peer's connection
    if (!(item->run == run)) {
      // The hosts disagree on which run makes this buffer: nothing of it
      // lands here.
      connection = data_->Discard(peer->host);
      status = absl::InternalError(absl::StrCat(
          "transfer from host ", peer->host, ": a message for buffer ", ids.buffer_id, " of the run of program ",
          ids.program_id, " from buffer ", ids.first_buffer_id, ", where host ", host_id,
          " makes that buffer in the run of program ", item->run.program_id, " from buffer ",
          item->run.first_buffer_id));
    } else if (header->flag == kErrorReport && header->length <= DataPlane::kMaxOtherBytes) {
      report.resize(static_cast<size_t>(header->length));
      const iovec into{report.data(), report.size()};
      connection = data_->RecvPayload(peer->host, {&into, 1});
      wire::Status wire_status;
      status = wire_status.ParseFromString(report)
                   ? FromWire(wire_status)
                   : absl::DataLossError(absl::StrCat("a malformed error report from host ", peer->host));
      if (status.ok()) status = absl::InternalError(absl::StrCat("host ", peer->host, " reported an OK error"));
    } else if (header->flag != kShards || header->length != static_cast<uint64_t>(payload)) {
      connection = data_->Discard(peer->host);
      status = absl::InternalError(absl::StrCat("transfer from host ", peer->host, ": a message of ",
                                                header->length, " bytes (flag ", header->flag, ") where ", payload,
                                                " bytes of shards were due"));
    } else if (!dst.allocated() && payload > 0) {
      // No memory for it: its bytes still leave the wire.
      connection = data_->Discard(peer->host);
      status = dst.AllocationError();
    } else {
      // Straight into the destination (the kernel scatters the shards).
      ShardPieces(item->indices, dst.data(), item->shard_bytes, pieces);
      connection = data_->RecvPayload(peer->host, pieces);
    }
    if (!connection.ok()) {
      item->parts->Done(connection);
      return broken(connection);
    }
    item->parts->Done(status);
  }
}

void HostTransfers::FailReceives(Peer* peer, const absl::Status& status) {
  absl::flat_hash_map<RecvKey, Peer::Recv> failed;
  {
    MutexLock lock(&peer->mu);
    if (peer->recv_broken.ok()) peer->recv_broken = status;
    failed.swap(peer->recvs);
  }
  for (auto& [key, recv] : failed) recv.parts->Done(status);
}

void HostTransfers::EnsureReceivers() {
  if (data_ == nullptr) return;
  for (int h = 0; h < data_->num_hosts(); ++h) {
    if (h != layout_.host_id) PeerFor(h);
  }
}

void HostTransfers::WakeReceivers() {
  for (Peer* p : Peers()) {
    MutexLock lock(&p->mu);
    p->cv.SignalAll();
  }
}

void HostTransfers::CancelRun(const RunKey& run, const absl::Status& why) {
  FailRuns([&run](const RunKey& r) { return r == run; }, why);
}

void HostTransfers::EndSession(SessionId session, const absl::Status& why) {
  FailRuns([session](const RunKey& r) { return r.session == session; }, why);
}

void HostTransfers::FailRuns(absl::FunctionRef<bool(const RunKey&)> which, const absl::Status& why) {
  std::vector<std::shared_ptr<DstParts>> failed;
  for (Peer* p : Peers()) {
    MutexLock lock(&p->mu);
    for (auto it = p->recvs.begin(); it != p->recvs.end();) {
      if (which(it->second.run)) {
        failed.push_back(std::move(it->second.parts));
        p->recvs.erase(it++);
      } else {
        ++it;
      }
    }
    p->cv.SignalAll();
  }
  for (auto& parts : failed) parts->Done(why);
}

void HostTransfers::ShutdownPeer(int host) {
  if (data_ != nullptr) data_->ShutdownPeer(host);
}

void HostTransfers::RetirePeer(int host, const absl::Status& why) {
  std::unique_ptr<Peer> old;
  {
    MutexLock lock(&peers_mu_);
    auto it = peers_.find(host);
    if (it == peers_.end()) return;
    old = std::move(it->second);
    peers_.erase(it);
  }
  std::deque<Peer::Send> dropped;  // released unlocked
  absl::flat_hash_map<RecvKey, Peer::Recv> failed;
  {
    MutexLock lock(&old->mu);
    old->retired = true;
    dropped.swap(old->sends);
    failed.swap(old->recvs);
    if (old->recv_broken.ok()) old->recv_broken = why;
    old->cv.SignalAll();
  }
  for (auto& [key, recv] : failed) recv.parts->Done(why);
  MutexLock lock(&peers_mu_);
  retired_.push_back(std::move(old));
}

absl::Status HostTransfers::RejoinPeer(int host, const std::string& address, const std::string& key,
                                       absl::Time deadline) {
  if (data_ == nullptr) return absl::FailedPreconditionError("the data plane is not connected");
  const absl::Status replaced = HostLostError(absl::StrCat("host ", host, " was lost (a new process replaced it)"));
  RetirePeer(host, replaced);
  absl::Status connected = data_->ReplacePeer(host, address, key, deadline);
  // A transfer of a run from before may have made a peer meanwhile, which
  // found no connection.
  RetirePeer(host, replaced);
  if (connected.ok()) PeerFor(host);  // its receiving thread, as EnsureReceivers
  return connected;
}

}  // namespace pw
