#include "csrc/host/host_executor.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "csrc/base/error_kind.h"
#include "csrc/base/spin.h"
#include "csrc/base/status_macros.h"
#include "csrc/coordination/host_channel.h"
#include "csrc/coordination/data_plane.h"
#include "csrc/function_ir/function_ir_wire.h"
#include "csrc/object_store/host_memory_pool.h"

namespace pw {
namespace {

// Bounds what a client may ask of one host (a program's slots, a shard's
// bytes: at most a device's memory, so products with shard counts fit).
constexpr int kMaxSlots = 1 << 22;
constexpr int64_t kMaxShardBytes = int64_t{1} << 40;

bool ShardBytesOk(int64_t bytes) { return bytes >= 0 && bytes <= kMaxShardBytes; }

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

uint8_t* AlignedAlloc(int64_t bytes) {
  if (bytes < 0 || bytes > kMaxShardBytes * 65536) return nullptr;
  const size_t size = (static_cast<size_t>(std::max<int64_t>(bytes, 1)) + 63) / 64 * 64;
  return static_cast<uint8_t*>(std::aligned_alloc(64, size));
}

// What a buffer of `bytes` takes from the pool: at least 1 byte, whole
// 64-byte lines.
size_t PoolBytes(int64_t bytes) { return (static_cast<size_t>(std::max<int64_t>(bytes, 1)) + 63) / 64 * 64; }

}  // namespace

// Scratch memory of one device thread, 64-byte aligned, grown on demand.
class HostExecutor::Scratch {
 public:
  ~Scratch() { std::free(data_); }
  // Null if `bytes` cannot be allocated (a later call may try again).
  uint8_t* Get(int64_t bytes) {
    if (bytes > capacity_) {
      std::free(data_);
      data_ = AlignedAlloc(bytes);
      capacity_ = data_ != nullptr ? bytes : 0;
    }
    return data_;
  }

 private:
  uint8_t* data_ = nullptr;
  int64_t capacity_ = 0;
};

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

// ---- HostBuffer ----

// From the host memory pool, as in process: a step that frees and makes
// buffers of the same sizes (every training step, every transfer's
// destination) reuses their pages instead of faulting in fresh ones (about
// 1 us per 4 KiB: 16 ms for a 64 MiB destination).
HostBuffer::HostBuffer(uint64_t id, int64_t bytes) : id_(id), bytes_(bytes) {
  if (bytes < 0 || bytes > kMaxShardBytes * 65536) return;
  try {
    data_ = static_cast<uint8_t*>(HostMemoryPool::Get().Allocate(PoolBytes(bytes)));
  } catch (const std::bad_alloc&) {
    data_ = nullptr;
  }
}

absl::Status HostBuffer::AllocationError() const {
  return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes_, " bytes for buffer ", id_));
}

HostBuffer::~HostBuffer() {
  if (data_ != nullptr) HostMemoryPool::Get().Free(data_, PoolBytes(bytes_));
}

void HostBuffer::OnDone(absl::AnyInvocable<void(const absl::Status&) &&> fn) {
  absl::Status status;
  {
    MutexLock lock(&mu_);
    if (!done_) {
      waiters_.push_back(std::move(fn));
      return;
    }
    status = status_;
  }
  std::move(fn)(status);
}

bool HostBuffer::done() const {
  MutexLock lock(&mu_);
  return done_;
}

bool HostBuffer::failed() const {
  MutexLock lock(&mu_);
  return done_ && !status_.ok();
}

absl::Status HostBuffer::Await(const std::atomic<bool>& stopping) {
  MutexLock lock(&mu_);
  while (!done_) {
    if (stopping.load(std::memory_order_acquire)) return absl::CancelledError("the host is stopping");
    cv_.WaitUntil(&mu_, std::chrono::steady_clock::now() + std::chrono::milliseconds(50));
  }
  return status_;
}

void HostBuffer::Complete(const absl::Status& status) {
  std::vector<absl::AnyInvocable<void(const absl::Status&) &&>> waiters;
  {
    MutexLock lock(&mu_);
    if (done_) return;
    done_ = true;
    status_ = status;
    waiters.swap(waiters_);
    cv_.SignalAll();
    // A failed buffer is never read or written again (its producer is done,
    // readers look at the status first): its bytes go back now, while the
    // buffer stays, as its error, until the client frees it.
    if (!status.ok() && data_ != nullptr) {
      HostMemoryPool::Get().Free(data_, PoolBytes(bytes_));
      data_ = nullptr;
    }
  }
  for (auto& w : waiters) std::move(w)(status);
}

// ---- The executor's records ----

// The collective groups of one set of hosts: one incarnation per generation
// (RenewGroup), each made at its first use under its entry's lock (not the
// set's: making one waits for the other hosts).
struct HostSetGroups {
  struct Entry {
    Mutex mu;
    bool created ABSL_GUARDED_BY(mu) = false;
    std::shared_ptr<CollectiveGroup> group ABSL_GUARDED_BY(mu);
    absl::Status error ABSL_GUARDED_BY(mu);
    std::atomic<bool> abort_join{false};  // making the group gives up (AbortGroupsWith)
  };
  std::string key;         // of generation 0; generation g > 0 adds "/g<g>"
  std::vector<int> hosts;  // increasing
  Mutex mu;
  // The generation of parts enqueued now; changed only by RenewGroup, on
  // the thread that takes the client's requests in order.
  uint64_t generation ABSL_GUARDED_BY(mu) = 0;
  absl::flat_hash_map<uint64_t, std::shared_ptr<Entry>> entries ABSL_GUARDED_BY(mu);
  // Parts enqueued and not yet run, by generation: an older generation's
  // entry goes once none of its parts is left.
  absl::flat_hash_map<uint64_t, int> parts ABSL_GUARDED_BY(mu);
  // Why the set's groups can never be made again (a host of it is lost:
  // AbortGroupsWith); OK while they can.
  absl::Status lost ABSL_GUARDED_BY(mu);
};

struct HostExecutor::Function {
  std::shared_ptr<const FunctionExecutable> exe;
};

struct HostExecutor::Program {
  struct Step {
    bool compute = true;
    std::shared_ptr<const Function> fn;      // compute
    const HostDeviceList* gang = nullptr;    // compute
    std::vector<int> in_slots, out_slots;    // compute
    uint32_t tag = 0;                        // compute
    int src_slot = 0, dst_slot = 0;          // transfer
    const HostDeviceList* src = nullptr;     // transfer
    const HostDeviceList* dst = nullptr;     // transfer
    int64_t shard_bytes = 0;                 // transfer
  };
  std::string name;
  int num_slots = 0;
  std::vector<Step> steps;
};

// The local part of one gang.
struct HostExecutor::Part {
  std::shared_ptr<const Function> fn;
  const HostDeviceList* gang = nullptr;
  uint32_t tag = 0;
  RunState* run = nullptr;  // holds it until the part's time is in its reply
  uint32_t step = 0;        // index in the program's steps on this host
  std::shared_ptr<const Program> program;  // for its name in errors
  uint64_t program_id = 0;  // with first_buffer_id: the run (pw.diagnose)
  uint64_t first_buffer_id = 0;
  std::vector<std::shared_ptr<HostBuffer>> inputs, outputs;
  absl::Status error;  // set before enqueueing: fail without running
  uint64_t generation = 0;  // of its collective group, when it meets other hosts
  // Its start (DeviceLoop) against CancelParts, one atomic step each, so
  // that exactly one of them wins: kStarted, kCancelled, kEndSimulatedTime.
  std::atomic<int> state{0};
  std::string cancel_reason;  // written before kCancelled is set, once
  // Inputs not done, devices whose queue head it is not yet, and the
  // enqueuer's hold.
  std::atomic<int> pending{0};
};

constexpr int kStarted = 1;
constexpr int kCancelled = 2;
constexpr int kEndSimulatedTime = 4;

// One run on this host: replies once every buffer it makes here is done.
struct HostExecutor::RunState {
  explicit RunState(absl::AnyInvocable<void(absl::StatusOr<wire::RunReply>) &&> d) : done(std::move(d)) {}
  void Track(const std::shared_ptr<HostBuffer>& buffer) {
    pending.fetch_add(1, std::memory_order_relaxed);
    buffer->OnDone([this, id = buffer->id()](const absl::Status& status) {
      if (!status.ok()) {
        MutexLock lock(&mu);
        wire::FailedBuffer* f = reply.add_failed();
        f->set_buffer_id(id);
        ToWire(status, f->mutable_status());
      }
      Release();
    });
  }
  void Hold() { pending.fetch_add(1, std::memory_order_relaxed); }
  void AddTime(uint32_t step, int64_t start_ns, int64_t end_ns) {
    MutexLock lock(&mu);
    wire::StepTime* t = reply.add_times();
    t->set_step(step);
    t->set_start_ns(start_ns);
    t->set_end_ns(end_ns);
  }
  void Release() {
    if (pending.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    wire::RunReply out;
    {
      MutexLock lock(&mu);  // the last hold is gone: uncontended, for the analysis
      out = std::move(reply);
    }
    std::move(done)(std::move(out));
    delete this;
  }
  std::atomic<int> pending{1};  // the dispatching thread's hold
  Mutex mu;
  wire::RunReply reply ABSL_GUARDED_BY(mu);
  absl::AnyInvocable<void(absl::StatusOr<wire::RunReply>) &&> done;
};

// The remaining sources of one transfer's destination on this host.
struct DstParts {
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
struct HostExecutor::Peer {
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
  std::thread sender, receiver;
};

// A cross-host gang's collectives: the local shards meet the other hosts'
// through the group of the gang's hosts.
//
// Agreement. The gang's first collective also carries each host's "cannot
// run" flag (one more byte of its AllGatherV contribution, or one more
// element of its AllReduce), so the hosts agree whether every part runs at
// no extra round: a host whose part cannot run (a failed input, no memory)
// still makes that first call, through JoinWithoutRunning, with its flag
// set and no kernel run; every host that can run gets Aborted from that
// call, and RunLocal ends with it. Every host makes the same calls up to
// and including that first one, and none makes a later one, so none is left
// waiting in a collective another host never joins.
class HostExecutor::GroupCollectives final : public GangCollectives {
 public:
  GroupCollectives(CollectiveGroup* group, const HostDeviceList* gang, uint32_t tag, bool cannot_run)
      : group_(group), gang_(gang), tag_(tag), cannot_run_(cannot_run) {}

  absl::Status AllGather(const void* local, void* full, int64_t shard_bytes) override {
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

  absl::Status AllReduce(DType dtype, ReduceOp op, void* data, int64_t count) override {
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

  // For a host whose part cannot run (made with cannot_run): makes the
  // function's first collective call, as RunLocal would, with zeros for its
  // data; OK if the group worked (every host then knows), else its error.
  absl::Status JoinWithoutRunning(const FunctionExecutable::CollectiveCall& call) {
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

 private:
  static absl::Status Aborted() { return absl::AbortedError("another host of the gang could not run its part"); }
  static void SetFlag(DType dtype, uint8_t* slot, bool value) {
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
  static bool FlagIsSet(DType dtype, const uint8_t* slot) {
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

  CollectiveGroup* group_;
  const HostDeviceList* gang_;
  uint32_t tag_;
  const bool cannot_run_;
  bool agreed_ = false;  // the first call (which carries the flags) is made
  std::vector<int64_t> bytes_per_rank_;
  std::vector<uint8_t> gathered_, reduced_;
};

// ---- HostExecutor ----

HostExecutor::HostExecutor(const wire::HostConfig& config, const wire::JoinCluster& join,
                           RendezvousStores* stores, std::string bind_ip, std::string secret)
    : host_id_(config.host_id()),
      num_local_devices_(config.device_ids_size()),
      device_host_(join.device_host().begin(), join.device_host().end()),
      local_index_(join.device_host_size(), -1),
      local_device_ids_(config.device_ids().begin(), config.device_ids().end()),
      group_prefix_(join.group_prefix()),
      stores_(stores),
      secret_(std::move(secret)),
      peer_keys_(join.peer_keys().begin(), join.peer_keys().end()),
      island_id_(config.island_id()),
      failed_(new std::atomic<bool>[config.device_ids_size()]) {
  for (int d = 0; d < config.device_ids_size(); ++d) failed_[d].store(false, std::memory_order_relaxed);
  num_hosts_ = device_host_.empty() ? 1 : *std::max_element(device_host_.begin(), device_host_.end()) + 1;
  lost_peers_.reset(new std::atomic<bool>[num_hosts_]);
  for (int h = 0; h < num_hosts_; ++h) lost_peers_[h].store(false, std::memory_order_relaxed);
  collective_options_.bind_address = std::move(bind_ip);
  for (int i = 0; i < config.device_ids_size(); ++i) {
    const int d = config.device_ids(i);
    if (d >= 0 && d < static_cast<int>(local_index_.size())) local_index_[d] = i;
  }
  {
    MutexLock lock(&queue_mu_);
    queues_.resize(num_local_devices_);
  }
  for (int d = 0; d < num_local_devices_; ++d) {
    workers_.push_back(std::make_unique<Worker>());
  }
  for (int d = 0; d < num_local_devices_; ++d) {
    workers_[d]->thread = std::thread([this, d] { DeviceLoop(d); });
  }
}

HostExecutor::~HostExecutor() {
  stopping_.store(true, std::memory_order_release);
  {
    MutexLock lock(&fail_mu_);  // parts in their simulated time stop
    fail_cv_.SignalAll();
  }
  // Parts waiting in a collective for other hosts stop too.
  AbortGroupsWith(-1, absl::CancelledError(absl::StrCat("host ", host_id_, " is stopping")));
  for (auto& w : workers_) {
    {
      MutexLock lock(&w->mu);
      w->cv.SignalAll();
    }
    w->thread.join();
  }
  if (data_ != nullptr) data_->Shutdown();  // a peer thread blocked in it returns
  absl::flat_hash_map<int, std::unique_ptr<Peer>> peers;
  {
    MutexLock lock(&peers_mu_);
    peers.swap(peers_);
  }
  for (auto& [host, peer] : peers) {
    {
      MutexLock lock(&peer->mu);
      peer->cv.SignalAll();
    }
    peer->sender.join();
    peer->receiver.join();
  }
  // Parts still queued never ran; they only hold buffers.
  MutexLock lock(&queue_mu_);
  absl::flat_hash_map<Part*, bool> seen;
  for (auto& q : queues_) {
    for (Part* p : q) seen[p] = true;
  }
  for (auto& [p, unused] : seen) delete p;
}

absl::Status HostExecutor::ConnectDataPlane() {
  const int num_hosts =
      device_host_.empty() ? 1 : *std::max_element(device_host_.begin(), device_host_.end()) + 1;
  if (num_hosts <= 1) return absl::OkStatus();
  DataPlane::Options options;
  options.bind_ip = collective_options_.bind_address;
  // Hosts configured without a secret (tests) still name their cluster.
  options.secret = secret_.empty() ? group_prefix_ : secret_;
  if (options.secret.size() > DataPlane::kMaxSecretBytes) options.secret.resize(DataPlane::kMaxSecretBytes);
  // With the client's peer keys, each connection proves which host it is.
  if (peer_keys_.size() == static_cast<size_t>(num_hosts)) options.peer_keys = peer_keys_;
  options.connect_timeout = collective_options_.timeout;
  PW_ASSIGN_OR_RETURN(std::unique_ptr<DataPlane> plane, DataPlane::Listen(host_id_, num_hosts, options));
  // The hosts learn each other's data plane addresses through host 0's
  // store (every host is alive while the cluster forms).
  PW_ASSIGN_OR_RETURN(KeyValueStore * store, stores_->StoreOf(0));
  const std::string prefix = absl::StrCat(group_prefix_, "/data/");
  PW_RETURN_IF_ERROR(store->Set(absl::StrCat(prefix, host_id_), plane->address()));
  const absl::Time deadline = absl::Now() + options.connect_timeout;
  std::vector<std::string> addresses(num_hosts);
  for (int h = 0; h < num_hosts; ++h) {
    if (h == host_id_) {
      addresses[h] = plane->address();
    } else {
      PW_ASSIGN_OR_RETURN(addresses[h], store->Get(absl::StrCat(prefix, h), deadline));
    }
  }
  PW_RETURN_IF_ERROR(plane->Connect(addresses));
  data_ = std::move(plane);
  return absl::OkStatus();
}

absl::Status HostExecutor::DefineDevices(const wire::DefineDevices& request) {
  absl::Status status = DefineDevicesChecked(request);
  MutexLock lock(&mu_);
  if (status.ok()) {
    list_errors_.erase(request.list_id());
  } else if (!lists_.contains(request.list_id())) {  // a list that exists stays usable
    list_errors_[request.list_id()] = status;
  }
  return status;
}

absl::Status HostExecutor::DefineDevicesChecked(const wire::DefineDevices& request) {
  auto list = std::make_unique<HostDeviceList>();
  if (request.device_ids_size() == 0) return absl::InvalidArgumentError("define_devices: an empty device list");
  for (int i = 0; i < request.device_ids_size(); ++i) {
    const int d = request.device_ids(i);
    if (d < 0 || d >= static_cast<int>(device_host_.size())) {
      return absl::InvalidArgumentError(absl::StrCat("define_devices: no device ", d, " in this cluster"));
    }
    const int h = device_host_[d];
    list->device_ids.push_back(d);
    list->hosts.push_back(h);
    if (h == host_id_) {
      list->local_positions.push_back(i);
      list->local_devices.push_back(local_index_[d]);
    }
    auto it = std::find(list->host_set.begin(), list->host_set.end(), h);
    if (it == list->host_set.end()) list->host_set.push_back(h);
  }
  std::sort(list->host_set.begin(), list->host_set.end());
  list->positions_by_host.resize(list->host_set.size());
  for (int i = 0; i < request.device_ids_size(); ++i) {
    const size_t r = std::lower_bound(list->host_set.begin(), list->host_set.end(), list->hosts[i]) -
                     list->host_set.begin();
    list->positions_by_host[r].push_back(i);
  }
  if (!list->local_positions.empty()) {
    auto local = LocalShards::Create(static_cast<int>(list->device_ids.size()), list->local_positions);
    if (!local.ok()) return local.status();
    list->local = *std::move(local);
  }
  std::vector<int> sorted = list->local_devices;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
    return absl::InvalidArgumentError("define_devices: a device appears twice in the list");
  }
  if (!list->local_positions.empty() && list->host_set.size() > 1) {
    const std::string set = absl::StrJoin(list->host_set, ",");
    MutexLock lock(&groups_mu_);
    std::unique_ptr<HostSetGroups>& groups = groups_[set];
    if (groups == nullptr) {
      groups = std::make_unique<HostSetGroups>();
      groups->key = absl::StrCat(group_prefix_, "/hosts/", set);
      groups->hosts = list->host_set;
    }
    list->groups = groups.get();
  }
  MutexLock lock(&mu_);
  if (lists_.contains(request.list_id())) {
    return absl::AlreadyExistsError(absl::StrCat("define_devices: list ", request.list_id(), " exists"));
  }
  lists_[request.list_id()] = std::move(list);
  return absl::OkStatus();
}

absl::StatusOr<const HostDeviceList*> HostExecutor::List(int id) const {
  auto it = lists_.find(id);
  if (it != lists_.end()) return it->second.get();
  if (auto failed = list_errors_.find(id); failed != list_errors_.end()) {
    return absl::Status(failed->second.code(), absl::StrCat("device list ", id, " could not be defined on host ",
                                                            host_id_, ": ", failed->second.message()));
  }
  return absl::InvalidArgumentError(absl::StrCat("no device list ", id, " on host ", host_id_));
}

absl::Status HostExecutor::LoadFunction(const wire::LoadFunction& request) {
  absl::StatusOr<std::shared_ptr<const FunctionExecutable>> exe = [&]() -> decltype(exe) {
    auto ir = ParseFunctionIr(request.ir());
    if (!ir.ok()) return ir.status();
    const std::string name = (*ir)->name();
    auto compiled = FunctionExecutable::Compile(*std::move(ir));
    if (!compiled.ok()) {
      return absl::Status(compiled.status().code(), absl::StrCat("'", name, "': ", compiled.status().message()));
    }
    return compiled;
  }();
  MutexLock lock(&mu_);
  if (!exe.ok()) {
    function_errors_[request.function_id()] = exe.status();
    return exe.status();
  }
  auto fn = std::make_shared<Function>();
  fn->exe = *std::move(exe);
  functions_[request.function_id()] = std::move(fn);
  function_errors_.erase(request.function_id());
  return absl::OkStatus();
}

absl::Status HostExecutor::LoadProgram(const wire::LoadProgram& request) {
  MutexLock lock(&mu_);
  absl::Status status = LoadProgramLocked(request);
  if (status.ok()) {
    program_errors_.erase(request.program_id());
  } else {
    programs_.erase(request.program_id());  // a run of it is refused with this error, not an older program's
    program_errors_[request.program_id()] = status;
  }
  return status;
}

absl::Status HostExecutor::LoadProgramLocked(const wire::LoadProgram& request) {
  auto program = std::make_shared<Program>();
  program->name = request.name();
  program->num_slots = request.num_slots();
  if (program->num_slots < 0 || program->num_slots > kMaxSlots) {
    return absl::InvalidArgumentError(absl::StrCat("load_program: bad num_slots ", program->num_slots));
  }
  auto slot_ok = [&](int s) { return s >= 0 && s < program->num_slots; };
  for (const wire::ProgramStep& ws : request.steps()) {
    Program::Step step;
    if (ws.has_compute()) {
      const wire::ComputeStep& c = ws.compute();
      auto fn = functions_.find(c.function_id());
      if (fn == functions_.end()) {
        if (auto failed = function_errors_.find(c.function_id()); failed != function_errors_.end()) {
          return absl::Status(failed->second.code(),
                              absl::StrCat("load_program: function ", c.function_id(), " could not be loaded on host ",
                                           host_id_, ": ", failed->second.message()));
        }
        return absl::InvalidArgumentError(
            absl::StrCat("load_program: no function ", c.function_id(), " on host ", host_id_));
      }
      auto gang = List(c.devices());
      if (!gang.ok()) return gang.status();
      const FunctionIr& ir = fn->second->exe->ir();
      if (c.in_slots_size() != ir.num_params() || c.out_slots_size() != ir.num_outputs()) {
        return absl::InvalidArgumentError(absl::StrCat("load_program: '", ir.name(), "' takes ", ir.num_params(),
                                                       " inputs and gives ", ir.num_outputs(), " outputs"));
      }
      if (ir.axis_size() >= 1 && ir.axis_size() != static_cast<int64_t>((*gang)->device_ids.size())) {
        return absl::InvalidArgumentError(absl::StrCat("load_program: '", ir.name(), "' runs on ", ir.axis_size(),
                                                       " devices, not ", (*gang)->device_ids.size()));
      }
      step.compute = true;
      step.fn = fn->second;
      step.gang = *gang;
      step.in_slots.assign(c.in_slots().begin(), c.in_slots().end());
      step.out_slots.assign(c.out_slots().begin(), c.out_slots().end());
      step.tag = c.gang_tag();
      for (int s : step.in_slots) {
        if (!slot_ok(s)) return absl::InvalidArgumentError(absl::StrCat("load_program: bad slot ", s));
      }
      for (int s : step.out_slots) {
        if (!slot_ok(s)) return absl::InvalidArgumentError(absl::StrCat("load_program: bad slot ", s));
      }
    } else if (ws.has_transfer()) {
      const wire::TransferStep& t = ws.transfer();
      auto src = List(t.src_devices());
      if (!src.ok()) return src.status();
      auto dst = List(t.dst_devices());
      if (!dst.ok()) return dst.status();
      if ((*src)->device_ids.size() != (*dst)->device_ids.size() || !ShardBytesOk(t.shard_bytes()) ||
          !slot_ok(t.src_slot()) || !slot_ok(t.dst_slot())) {
        return absl::InvalidArgumentError("load_program: a malformed transfer step");
      }
      step.compute = false;
      step.src_slot = t.src_slot();
      step.dst_slot = t.dst_slot();
      step.src = *src;
      step.dst = *dst;
      step.shard_bytes = t.shard_bytes();
    } else {
      return absl::InvalidArgumentError("load_program: a step of unknown kind");
    }
    program->steps.push_back(std::move(step));
  }
  programs_[request.program_id()] = std::move(program);
  return absl::OkStatus();
}

std::shared_ptr<HostBuffer> HostExecutor::NewBuffer(uint64_t id, int64_t bytes) {
  auto buffer = std::make_shared<HostBuffer>(id, bytes);
  buffers_[id] = buffer;
  return buffer;
}

absl::Status HostExecutor::CheckSizes(const Part& part) const {
  const FunctionExecutable& exe = *part.fn->exe;
  const int64_t n = static_cast<int64_t>(part.gang->local_positions.size());
  for (size_t i = 0; i < part.inputs.size(); ++i) {
    const int64_t want = exe.param_bytes(static_cast<int>(i)) * n;
    if (part.inputs[i]->bytes() != want) {
      return absl::InternalError(absl::StrCat("'", exe.ir().name(), "' input ", i, " has ", part.inputs[i]->bytes(),
                                              " bytes on host ", host_id_, ", expected ", want));
    }
  }
  for (const auto& out : part.outputs) {
    if (!out->allocated()) return out->AllocationError();
  }
  return absl::OkStatus();
}

absl::Status HostExecutor::CheckTransferSizes(const HostBuffer& src, int64_t src_bytes, const HostBuffer& dst) const {
  if (src.bytes() != src_bytes) {  // never read past a buffer, whatever a client says
    return absl::InternalError(absl::StrCat("transfer: buffer ", src.id(), " has ", src.bytes(), " bytes on host ",
                                            host_id_, ", expected ", src_bytes));
  }
  if (!dst.allocated()) return dst.AllocationError();
  return absl::OkStatus();
}

absl::Status HostExecutor::Put(wire::PutBuffer& request) {
  MutexLock lock(&mu_);
  absl::Status status = PutLocked(request);
  if (status.ok()) return status;
  // Nobody hears a put's error (no reply): the buffer keeps it, so its
  // readers and the runs that use it get it, not "no such buffer" or a wait
  // for chunks that will not fit.
  const uint64_t id = request.buffer_id();
  puts_in_progress_.erase(id);
  auto it = buffers_.find(id);
  // A stray later chunk of a buffer this host does not have (freed) makes
  // none: nobody would free it.
  if (it == buffers_.end() && request.offset() != 0) return status;
  std::shared_ptr<HostBuffer> buffer = it != buffers_.end() ? it->second : NewBuffer(id, 0);
  buffer->Complete(absl::Status(status.code(), absl::StrCat(status.message(), " (on host ", host_id_, ")")));
  return status;
}

absl::Status HostExecutor::PutLocked(wire::PutBuffer& request) {
  const uint64_t id = request.buffer_id();
  if (request.offset() != 0) {
    // A later chunk of a buffer that failed (a chunk refused, or no memory):
    // dropped, the buffer keeps its first error.
    auto it = buffers_.find(id);
    if (it != buffers_.end() && !puts_in_progress_.contains(id) && it->second->failed()) return absl::OkStatus();
  }
  auto list = List(request.devices());
  if (!list.ok()) {
    return absl::Status(list.status().code(), absl::StrCat("put: buffer ", id, ": ", list.status().message()));
  }
  if (!ShardBytesOk(request.shard_bytes())) {
    return absl::InvalidArgumentError(absl::StrCat("put: buffer ", id, ": bad shard_bytes ", request.shard_bytes()));
  }
  const int64_t want = static_cast<int64_t>((*list)->local_positions.size()) * request.shard_bytes();
  const int64_t offset = request.offset();
  const int64_t bytes = static_cast<int64_t>(request.data().size());
  if (offset < 0 || offset > want || bytes > want - offset) {
    return absl::InvalidArgumentError(absl::StrCat("put: buffer ", id, " has ", want, " bytes here; got ", bytes,
                                                   " at offset ", offset));
  }
  std::shared_ptr<HostBuffer> buffer;
  if (offset == 0) {
    buffer = NewBuffer(id, want);
    puts_in_progress_.erase(id);
    if (!buffer->allocated()) {
      buffer->Complete(buffer->AllocationError());  // reading it says why; later chunks are dropped
      return absl::OkStatus();
    }
  } else {
    auto next = puts_in_progress_.find(id);
    auto it = buffers_.find(id);
    if (next == puts_in_progress_.end() || it == buffers_.end() || next->second != offset) {
      return absl::InvalidArgumentError(absl::StrCat("put: a chunk of buffer ", id, " at offset ", offset,
                                                     " that does not follow the one before"));
    }
    buffer = it->second;
  }
  if (bytes > 0) std::memcpy(buffer->data() + offset, request.data().data(), static_cast<size_t>(bytes));
  if (offset + bytes < want) {
    puts_in_progress_[id] = offset + bytes;
    return absl::OkStatus();
  }
  puts_in_progress_.erase(id);
  buffer->Complete(absl::OkStatus());
  return absl::OkStatus();
}

void HostExecutor::Run(const wire::RunProgram& request,
                       absl::AnyInvocable<void(absl::StatusOr<wire::RunReply>) &&> done) {
  // What to start once the tables are unlocked, in program order.
  struct Transfer {
    const HostDeviceList* src_list;
    std::shared_ptr<HostBuffer> src;
    const HostDeviceList* dst_list;
    uint64_t dst_id;
    std::shared_ptr<HostBuffer> dst;
    int64_t shard_bytes;
  };
  const RunKey key{kOneSession, request.program_id(), request.first_buffer_id()};
  std::vector<Transfer> transfers;
  std::vector<Part*> parts;
  auto* run = new RunState(std::move(done));
  std::vector<std::shared_ptr<HostBuffer>> dropped;  // freed once unlocked
  // The run is refused (replied to outside the lock): the client cancelled
  // it already, or it cannot start here.
  absl::Status early = DeadStatus(key);
  {
    MutexLock lock(&mu_);
    for (uint64_t id : request.free_buffer_ids()) DropLocked(id, dropped);
    auto pit = programs_.find(request.program_id());
    if (!early.ok()) {
      // Refused as a whole (below).
    } else if (pit == programs_.end()) {
      auto failed = program_errors_.find(request.program_id());
      early = failed != program_errors_.end()
                  ? absl::Status(failed->second.code(),
                                 absl::StrCat("run: program ", request.program_id(), " could not be loaded on host ",
                                              host_id_, ": ", failed->second.message()))
                  : absl::InvalidArgumentError(
                        absl::StrCat("run: no program ", request.program_id(), " on host ", host_id_));
    }
    // Every binding is checked before anything is made: a run refused
    // leaves nothing behind that would never complete.
    for (const wire::ArgBinding& a : request.args()) {
      if (!early.ok()) break;
      auto src = List(a.src_devices());
      auto dst = List(a.dst_devices());
      if (!src.ok() || !dst.ok()) {
        early = absl::Status((src.ok() ? dst : src).status().code(),
                             absl::StrCat("run: argument binding of slot ", a.slot(), " of program '",
                                          pit->second->name, "': ", (src.ok() ? dst : src).status().message()));
      } else if (a.slot() < 0 || a.slot() >= pit->second->num_slots || !ShardBytesOk(a.shard_bytes()) ||
                 (*src)->device_ids.size() != (*dst)->device_ids.size()) {
        early = absl::InvalidArgumentError(absl::StrCat("run: a malformed argument binding (slot ", a.slot(),
                                                        ") of program '", pit->second->name, "' on host ",
                                                        host_id_));
      }
    }
  }
  if (!early.ok()) {
    // Dead here: whatever the other hosts send for it is dropped (they may
    // have queued their side before the client cancels the run on them).
    MarkDead(key, early, host_id_);
    EnsureReceivers();
    std::move(run->done)(early);
    delete run;
    return;
  }
  {
    MutexLock lock(&mu_);
    auto pit = programs_.find(request.program_id());
    const std::shared_ptr<const Program> program_ref = pit->second;
    const Program& program = *program_ref;
    const uint64_t first = request.first_buffer_id();
    std::vector<std::shared_ptr<HostBuffer>> slots(program.num_slots);
    auto lookup = [&](uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> std::shared_ptr<HostBuffer> {
      auto it = buffers_.find(id);
      if (it != buffers_.end()) return it->second;
      // The client holds every buffer it names; one missing here is an
      // error the run reports, not a crash.
      auto missing = std::make_shared<HostBuffer>(id, 0);
      missing->Complete(absl::NotFoundError(absl::StrCat("buffer ", id, " is not on host ", host_id_)));
      return missing;
    };
    for (const wire::ArgBinding& a : request.args()) {
      auto src = List(a.src_devices());  // checked above; lists are never removed
      auto dst = List(a.dst_devices());
      if (!a.copy()) {
        if (!(*dst)->local_positions.empty()) slots[a.slot()] = lookup(a.buffer_id());
        continue;
      }
      std::shared_ptr<HostBuffer> s = (*src)->local_positions.empty() ? nullptr : lookup(a.buffer_id());
      std::shared_ptr<HostBuffer> d;
      if (!(*dst)->local_positions.empty()) {
        d = NewBuffer(first + a.slot(), static_cast<int64_t>((*dst)->local_positions.size()) * a.shard_bytes());
        slots[a.slot()] = d;
        run->Track(d);
      }
      transfers.push_back(Transfer{*src, std::move(s), *dst, first + a.slot(), std::move(d), a.shard_bytes()});
    }
    for (size_t k = 0; k < program.steps.size(); ++k) {
      const Program::Step& step = program.steps[k];
      if (!step.compute) {
        std::shared_ptr<HostBuffer> s = step.src->local_positions.empty() ? nullptr : slots[step.src_slot];
        std::shared_ptr<HostBuffer> d;
        if (!step.dst->local_positions.empty()) {
          d = NewBuffer(first + step.dst_slot,
                        static_cast<int64_t>(step.dst->local_positions.size()) * step.shard_bytes);
          slots[step.dst_slot] = d;
          run->Track(d);
        }
        if (s == nullptr && !step.src->local_positions.empty()) s = lookup(first + step.src_slot);
        transfers.push_back(
            Transfer{step.src, std::move(s), step.dst, first + step.dst_slot, std::move(d), step.shard_bytes});
        continue;
      }
      if (step.gang->local_positions.empty()) continue;
      auto* part = new Part();
      part->fn = step.fn;
      part->gang = step.gang;
      part->tag = step.tag;
      part->run = run;
      part->step = static_cast<uint32_t>(k);
      part->program = program_ref;
      part->program_id = request.program_id();
      part->first_buffer_id = first;
      run->Hold();
      const FunctionExecutable& exe = *step.fn->exe;
      const int64_t n = static_cast<int64_t>(step.gang->local_positions.size());
      for (size_t i = 0; i < step.in_slots.size(); ++i) {
        std::shared_ptr<HostBuffer> in = slots[step.in_slots[i]];
        if (in == nullptr) in = lookup(first + step.in_slots[i]);
        part->inputs.push_back(std::move(in));
      }
      for (size_t i = 0; i < step.out_slots.size(); ++i) {
        auto out = NewBuffer(first + step.out_slots[i], exe.output_bytes(static_cast<int>(i)) * n);
        slots[step.out_slots[i]] = out;
        run->Track(out);
        part->outputs.push_back(std::move(out));
      }
      parts.push_back(part);
    }
  }
  for (Transfer& t : transfers) {
    StartTransfer(key, *t.src_list, std::move(t.src), *t.dst_list, t.dst_id, std::move(t.dst), t.shard_bytes);
  }
  for (Part* part : parts) Enqueue(part);
  run->Release();
}

void HostExecutor::StartTransfer(const RunKey& run, const HostDeviceList& src_list, std::shared_ptr<HostBuffer> src,
                                 const HostDeviceList& dst_list, uint64_t dst_id, std::shared_ptr<HostBuffer> dst,
                                 int64_t shard_bytes) {
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
    const int si = s == host_id_ ? src_local++ : -1;
    const int di = d == host_id_ ? dst_local++ : -1;
    if (s == host_id_ && d == host_id_) {
      copies.emplace_back(si, di);
      dst_devices.push_back(src_list.local_devices[si]);
      dst_devices.push_back(dst_list.local_devices[di]);
    } else if (s == host_id_) {
      if (!sends.contains(d)) send_order.push_back(d);
      sends[d].push_back(si);
      send_devices[d].push_back(src_list.local_devices[si]);
    } else if (d == host_id_) {
      dst_devices.push_back(dst_list.local_devices[di]);
      if (!recvs.contains(s)) recv_order.push_back(s);
      recvs[s].push_back(di);
    }
  }
  const DataMessageIds ids{run.session, run.program_id, run.first_buffer_id, dst_id};
  for (int peer : send_order) {
    Peer& p = PeerFor(peer);
    MutexLock lock(&p.mu);
    p.sends.push_back(
        Peer::Send{ids, src, std::move(sends[peer]), std::move(send_devices[peer]), shard_bytes, src_bytes});
    p.cv.SignalAll();
  }
  if (dst == nullptr) return;
  auto parts = std::make_shared<DstParts>();
  parts->dst = dst;
  parts->check = [this, devices = std::move(dst_devices)] { return CheckHealthy(devices); };
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
      status.Update(CheckTransferSizes(*src, src_bytes, *dst));
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

HostExecutor::Peer& HostExecutor::PeerFor(int host) {
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

void HostExecutor::SendLoop(Peer* peer) {
  std::vector<iovec> pieces;
  while (true) {
    Peer::Send item;
    {
      MutexLock lock(&peer->mu);
      while (peer->sends.empty() && !stopping_.load(std::memory_order_acquire)) peer->cv.Wait(&peer->mu);
      if (peer->sends.empty()) return;
      item = std::move(peer->sends.front());
      peer->sends.pop_front();
    }
    const int64_t payload = static_cast<int64_t>(item.indices.size()) * item.shard_bytes;
    const RunKey run{item.ids.session, item.ids.program_id, item.ids.first_buffer_id};
    // A cancelled run's data is not worth sending (nor waiting for): the
    // receiver drops it, or, if the cancel has not reached it yet, fails the
    // destination with the error.
    absl::Status status = DeadStatus(run);
    if (status.ok()) status = item.src->Await(stopping_);
    if (stopping_.load(std::memory_order_acquire)) return;
    if (status.ok() && item.src->bytes() != item.src_bytes) {
      status = absl::InternalError(absl::StrCat("transfer: buffer ", item.src->id(), " has ", item.src->bytes(),
                                                " bytes on host ", host_id_, ", expected ", item.src_bytes));
    }
    if (status.ok()) status = CheckHealthy(item.devices);
    if (status.ok()) status = DeadStatus(run);
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
      std::cerr << "pathways-host " << host_id_ << ": transfer to host " << peer->host << " failed: " << sent
                << "\n";
    }
  }
}

void HostExecutor::RecvLoop(Peer* peer) {
  std::vector<iovec> pieces;
  std::string report;
  // Ends the loop: every receive from this peer fails from now on.
  auto broken = [&](const absl::Status& status) { FailReceives(peer, status); };
  if (data_ == nullptr) return broken(absl::FailedPreconditionError("the data plane is not connected"));
  while (true) {
    absl::StatusOr<DataMessageHeader> header = data_->RecvHeader(peer->host);
    if (!header.ok()) return broken(header.status());
    const DataMessageIds& ids = header->ids;
    const RunKey run{ids.session, ids.program_id, ids.first_buffer_id};
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
      while (!stopping_.load(std::memory_order_acquire)) {
        auto it = peer->recvs.find(RecvKey{ids.session, ids.buffer_id});
        if (it != peer->recvs.end()) {
          item = std::move(it->second);
          peer->recvs.erase(it);
          break;
        }
        if (!DeadStatus(run).ok()) break;
        if (warned) {
          peer->cv.Wait(&peer->mu);
        } else if (!peer->cv.WaitUntil(&peer->mu, warn_at)) {
          warned = true;
          std::cerr << "pathways-host " << host_id_ << ": a message from host " << peer->host << " for buffer "
                    << ids.buffer_id << " of the run of program " << ids.program_id << " from buffer "
                    << ids.first_buffer_id << " has waited " << absl::FormatDuration(absl::FromChrono(kLongRecvWait))
                    << " for its run to reach this host\n";
        }
      }
    }
    if (stopping_.load(std::memory_order_acquire)) return broken(absl::CancelledError("the host is stopping"));
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
          ids.program_id, " from buffer ", ids.first_buffer_id, ", where host ", host_id_,
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

void HostExecutor::FailReceives(Peer* peer, const absl::Status& status) {
  absl::flat_hash_map<RecvKey, Peer::Recv> failed;
  {
    MutexLock lock(&peer->mu);
    if (peer->recv_broken.ok()) peer->recv_broken = status;
    failed.swap(peer->recvs);
  }
  for (auto& [key, recv] : failed) recv.parts->Done(status);
}

absl::Status HostExecutor::DeadStatus(const RunKey& run) const {
  if (!any_dead_.load(std::memory_order_acquire)) return absl::OkStatus();
  MutexLock lock(&dead_mu_);
  auto it = dead_runs_.find(run);
  return it == dead_runs_.end() ? absl::OkStatus() : it->second.why;
}

bool HostExecutor::RefusedByAnyOf(const RunKey& run, absl::Span<const int> hosts) const {
  MutexLock lock(&dead_mu_);
  auto it = dead_runs_.find(run);
  if (it == dead_runs_.end()) return false;
  for (int h : it->second.refusers) {
    if (std::find(hosts.begin(), hosts.end(), h) != hosts.end()) return true;
  }
  return false;
}

bool HostExecutor::MarkDead(const RunKey& run, const absl::Status& why, int refuser) {
  {
    MutexLock lock(&dead_mu_);
    auto [it, fresh] = dead_runs_.try_emplace(run, DeadRun{why, {}});
    std::vector<int>& refusers = it->second.refusers;
    if (refuser >= 0 && std::find(refusers.begin(), refusers.end(), refuser) == refusers.end()) {
      refusers.push_back(refuser);
    }
    if (!fresh) return false;
    dead_order_.push_back(run);
    if (dead_order_.size() > kMaxDeadRuns) {
      dead_runs_.erase(dead_order_.front());
      dead_order_.pop_front();
    }
    any_dead_.store(true, std::memory_order_release);
  }
  // A receiving thread may be waiting for a receive of that run: it drops
  // the message instead.
  std::vector<Peer*> peers;
  {
    MutexLock lock(&peers_mu_);
    for (auto& [host, peer] : peers_) peers.push_back(peer.get());
  }
  for (Peer* p : peers) {
    MutexLock lock(&p->mu);
    p->cv.SignalAll();
  }
  return true;
}

void HostExecutor::EnsureReceivers() {
  if (data_ == nullptr) return;
  for (int h = 0; h < data_->num_hosts(); ++h) {
    if (h != host_id_) PeerFor(h);
  }
}

void HostExecutor::CancelRun(const wire::CancelRun& request) {
  const RunKey run{kOneSession, request.program_id(), request.first_buffer_id()};
  absl::Status why = FromWire(request.status());
  if (why.ok()) {
    why = absl::CancelledError(absl::StrCat("the client cancelled the run of program ", run.program_id,
                                            " from buffer ", run.first_buffer_id));
  }
  if (!MarkDead(run, why, request.has_refused_by() ? request.refused_by() : -1)) return;
  // Its parts not started fail when their turn comes (DeviceLoop asks);
  // its receives posted fail now; its sends go as the error (SendLoop asks).
  std::vector<Peer*> peers;
  {
    MutexLock lock(&peers_mu_);
    for (auto& [host, peer] : peers_) peers.push_back(peer.get());
  }
  std::vector<std::shared_ptr<DstParts>> failed;
  for (Peer* p : peers) {
    MutexLock lock(&p->mu);
    for (auto it = p->recvs.begin(); it != p->recvs.end();) {
      if (it->second.run == run) {
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

bool HostExecutor::MeetsOtherHosts(const Part& part) {
  return part.gang->groups != nullptr &&
         part.fn->exe->first_collective().kind != FunctionExecutable::CollectiveCall::Kind::kNone;
}

void HostExecutor::Enqueue(Part* part) {
  // Its gang's group incarnation: the one of the runs at this place in the
  // client's order (RenewGroup), the same on every host of the gang.
  if (MeetsOtherHosts(*part)) {
    HostSetGroups& groups = *part->gang->groups;
    MutexLock lock(&groups.mu);
    part->generation = groups.generation;
    ++groups.parts[groups.generation];
  }
  const int devices = static_cast<int>(part->gang->local_devices.size());
  part->pending.store(static_cast<int>(part->inputs.size()) + devices + 1, std::memory_order_relaxed);
  for (const auto& in : part->inputs) {
    in->OnDone([this, part](const absl::Status&) { CountDown(part); });
  }
  int heads = 0;
  {
    MutexLock lock(&queue_mu_);
    for (int d : part->gang->local_devices) {
      queues_[d].push_back(part);
      if (queues_[d].front() == part) ++heads;
    }
  }
  for (int i = 0; i < heads; ++i) CountDown(part);
  CountDown(part);  // the hold
}

void HostExecutor::CountDown(Part* part) {
  if (part->pending.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  Worker& w = *workers_[part->gang->local_devices[0]];
  MutexLock lock(&w.mu);
  w.ready.push_back(part);
  w.cv.Signal();
}

void HostExecutor::DeviceLoop(int device) {
  Worker& w = *workers_[device];
  Scratch scratch;
  while (true) {
    Part* part;
    {
      MutexLock lock(&w.mu);
      while (w.ready.empty() && !stopping_.load(std::memory_order_acquire)) w.cv.Wait(&w.mu);
      if (stopping_.load(std::memory_order_acquire)) return;
      part = w.ready.front();
      w.ready.pop_front();
    }
    absl::Status status = part->error;
    // A cancelled run's part fails without running: a host of the run
    // refused it (its error, which comes first, is the part's).
    const RunKey key{kOneSession, part->program_id, part->first_buffer_id};
    const absl::Status dead = DeadStatus(key);
    status.Update(dead);
    // It starts now, unless CancelParts came first.
    if (part->state.fetch_or(kStarted, std::memory_order_acq_rel) & kCancelled) {
      status.Update(absl::CancelledError(absl::StrCat("'", part->fn->exe->ir().name(), "' in program '",
                                                      part->program->name, "' was cancelled: ",
                                                      part->cancel_reason)));
    }
    for (const auto& in : part->inputs) {
      if (!status.ok()) break;
      absl::Status s = in->Await(stopping_);
      if (!s.ok()) status = s;
    }
    status.Update(CheckSizes(*part));
    const int64_t start_ns = NowNanos();
    const bool refused_in_gang = !dead.ok() && RefusedByAnyOf(key, part->gang->host_set);
    RunPart(*part, status, refused_in_gang, scratch);
    part->run->AddTime(part->step, start_ns, NowNanos());
    if (MeetsOtherHosts(*part)) LeaveGeneration(*part);
    // Free the devices first, so the next gang in order can start.
    std::vector<Part*> heads;
    {
      MutexLock lock(&queue_mu_);
      for (int d : part->gang->local_devices) {
        queues_[d].pop_front();
        if (!queues_[d].empty()) heads.push_back(queues_[d].front());
      }
    }
    for (Part* next : heads) CountDown(next);
    part->inputs.clear();
    for (const auto& out : part->outputs) out->Complete(status);
    part->run->Release();
    delete part;
  }
}

void HostExecutor::RunPart(const Part& part, absl::Status& status, bool refused_in_gang, Scratch& scratch) {
  const FunctionExecutable& exe = *part.fn->exe;
  const HostDeviceList& gang = *part.gang;
  const int gang_size = static_cast<int>(gang.device_ids.size());
  const auto start = std::chrono::steady_clock::now();
  // An input's error passes on as it is (a chain of failed steps does not
  // repeat itself); the part's own is named.
  const bool failed_before = !status.ok();  // (a cancelled run's error too)
  // A gang on a failed device fails when its turn comes, without running
  // (an input's error, which came first, stays the one reported).
  status.Update(CheckHealthy(gang.local_devices));
  const int num_local = static_cast<int>(gang.local_positions.size());
  // local_scratch_bytes is scratch_bytes(gang_size) for a gang all on this host.
  auto local_scratch = [&] { return scratch.Get(exe.local_scratch_bytes(num_local, gang_size)); };
  auto scratch_error = [&] {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", exe.local_scratch_bytes(num_local, gang_size), " bytes of scratch"));
  };
  auto run = [&](auto&& body) {
    if (!status.ok()) return;
    std::vector<const void*> ins;
    std::vector<void*> outs;
    for (const auto& in : part.inputs) ins.push_back(in->data());
    for (const auto& out : part.outputs) outs.push_back(out->data());
    status = body(ins, outs);
  };
  if (gang.all_local()) {
    run([&](const std::vector<const void*>& ins, const std::vector<void*>& outs) {
      uint8_t* all = local_scratch();
      if (all == nullptr) return scratch_error();
      exe.Run(gang_size, ins, outs, all);
      return absl::OkStatus();
    });
  } else if (refused_in_gang) {
    // Its gang would wait for the host that refused the run, which never
    // arrives (Arrive: up to the arrival timeout), and leave the group
    // broken: the part fails without meeting. (A cancelled part whose gang
    // the refuser is not in meets and joins without running, below, so that
    // its hosts agree to stop.)
  } else if (exe.first_collective().kind == FunctionExecutable::CollectiveCall::Kind::kNone) {
    // The parts need nothing from each other (elementwise, or cross-shard
    // ops on constants and positions only): each runs or fails alone.
    run([&](const std::vector<const void*>& ins, const std::vector<void*>& outs) {
      uint8_t* local = local_scratch();
      if (local == nullptr) return scratch_error();
      return exe.RunLocal(*gang.local, ins, outs, local, nullptr);
    });
  } else if (absl::Status lost = CheckPeers(gang); !lost.ok()) {
    status.Update(lost);  // its collectives would wait for a host that is gone
  } else if (auto group = GroupFor(gang, part.generation); !group.ok()) {
    status.Update(group.status());
  } else if (absl::Status arrived = (*group)->Arrive(part.tag, arrival_timeout_); !arrived.ok()) {
    // The gang's parts meet here first: a host still busy with earlier
    // gangs comes late, and only once all are here do the collectives'
    // own timeouts start. A failed wait broke the group on every host.
    status.Update(arrived);
  } else {
    // A part that cannot run (a failed input, no scratch) must not leave
    // the others waiting in a collective it never joins, which would break
    // their group for good: the hosts agree in the gang's first collective
    // (see GroupCollectives), with no round of their own.
    uint8_t* local = status.ok() ? local_scratch() : nullptr;
    if (status.ok() && local == nullptr) status = scratch_error();
    GroupCollectives collectives(group->get(), &gang, part.tag, /*cannot_run=*/!status.ok());
    if (!status.ok()) {
      status.Update(collectives.JoinWithoutRunning(exe.first_collective()));
    } else {
      run([&](const std::vector<const void*>& ins, const std::vector<void*>& outs) {
        return exe.RunLocal(*gang.local, ins, outs, local, &collectives);
      });
    }
  }
  // Simulated compute (pw.simulated_compute): the gang keeps its devices for
  // that long, as in process; this thread is its device's, so it waits.
  // A device that fails meanwhile ends that time at once, failed.
  if (const int64_t simulated = exe.ir().simulated_ns(); simulated > 0 && status.ok()) {
    const auto deadline = start + std::chrono::nanoseconds(simulated);
    MutexLock lock(&fail_mu_);
    while (CheckHealthy(gang.local_devices).ok() && !stopping_.load(std::memory_order_acquire) &&
           (part.state.load(std::memory_order_acquire) & kEndSimulatedTime) == 0 &&
           fail_cv_.WaitUntil(&fail_mu_, deadline)) {
    }
    status.Update(CheckHealthy(gang.local_devices));
  }
  if (!status.ok() && !failed_before) {
    status = absl::Status(status.code(), absl::StrCat("'", exe.ir().name(), "' in program '", part.program->name,
                                                      "' failed on host ", host_id_, ": ",
                                                      status.message()));
  }
}

absl::StatusOr<std::shared_ptr<CollectiveGroup>> HostExecutor::GroupFor(const HostDeviceList& list,
                                                                        uint64_t generation) {
  HostSetGroups& groups = *list.groups;
  std::shared_ptr<HostSetGroups::Entry> entry;
  {
    MutexLock lock(&groups.mu);
    if (!groups.lost.ok()) return groups.lost;
    std::shared_ptr<HostSetGroups::Entry>& e = groups.entries[generation];
    if (e == nullptr) e = std::make_shared<HostSetGroups::Entry>();
    entry = e;
  }
  MutexLock lock(&entry->mu);
  if (!entry->created) {
    entry->created = true;
    const int rank = static_cast<int>(std::lower_bound(groups.hosts.begin(), groups.hosts.end(), host_id_) -
                                      groups.hosts.begin());
    // A fresh key per incarnation: an earlier one's addresses are stale.
    const std::string key = generation == 0 ? groups.key : absl::StrCat(groups.key, "/g", generation);
    // The others may come late (busy devices): the join waits as a part's
    // first collective does.
    CollectiveOptions options = collective_options_;
    options.join_timeout = arrival_timeout_;
    options.join_cancelled = [this, e = entry.get()] {
      return stopping_.load(std::memory_order_acquire) || e->abort_join.load(std::memory_order_acquire);
    };
    // The group meets in the store of its lowest host (RendezvousStores),
    // which gives up at once if a member is lost.
    absl::StatusOr<std::unique_ptr<KeyValueStore>> store = stores_->GroupStore(groups.hosts);
    absl::StatusOr<std::unique_ptr<CollectiveGroup>> group =
        store.ok() ? CollectiveGroup::Create(store->get(), key, rank, static_cast<int>(groups.hosts.size()), options)
                   : store.status();
    if (group.ok()) {
      entry->group = *std::move(group);
    } else {
      entry->error = group.status();
    }
  }
  if (!entry->error.ok()) return entry->error;
  return entry->group;
}

void HostExecutor::LeaveGeneration(const Part& part) {
  HostSetGroups& groups = *part.gang->groups;
  std::shared_ptr<HostSetGroups::Entry> dropped;  // destroyed unlocked
  MutexLock lock(&groups.mu);
  auto it = groups.parts.find(part.generation);
  if (it == groups.parts.end() || --it->second > 0) return;
  groups.parts.erase(it);
  if (part.generation == groups.generation) return;  // the incarnation later runs use
  if (auto e = groups.entries.find(part.generation); e != groups.entries.end()) {
    dropped = std::move(e->second);
    groups.entries.erase(e);
  }
}

absl::Status HostExecutor::RenewGroup(absl::Span<const int> hosts) {
  HostSetGroups* groups = nullptr;
  {
    MutexLock lock(&groups_mu_);
    auto it = groups_.find(absl::StrJoin(hosts, ","));
    if (it != groups_.end()) groups = it->second.get();
  }
  if (groups == nullptr) {
    // No list of this host spans that set: no gang here uses its group.
    if (hosts.size() < 2 || std::find(hosts.begin(), hosts.end(), host_id_) == hosts.end() ||
        !std::is_sorted(hosts.begin(), hosts.end())) {
      return absl::InvalidArgumentError(
          absl::StrCat("renew_group: [", absl::StrJoin(hosts, ","), "] is no set of hosts with host ", host_id_));
    }
    return absl::OkStatus();
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

void HostExecutor::AbortGroupsWith(int host, const absl::Status& why) {
  std::vector<std::shared_ptr<HostSetGroups::Entry>> entries;
  {
    MutexLock lock(&groups_mu_);
    for (auto& [set, groups] : groups_) {
      if (host >= 0 && !std::binary_search(groups->hosts.begin(), groups->hosts.end(), host)) continue;
      MutexLock set_lock(&groups->mu);
      if (groups->lost.ok()) groups->lost = why;  // no group of this set is made again
      for (auto& [generation, entry] : groups->entries) entries.push_back(entry);
    }
  }
  // A part making a group holds its entry's lock: it gives up first.
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

void HostExecutor::SetCollectiveTimeouts(absl::Duration timeout, absl::Duration arrival_timeout) {
  if (timeout > absl::ZeroDuration()) collective_options_.timeout = timeout;
  if (arrival_timeout > absl::ZeroDuration()) arrival_timeout_ = arrival_timeout;
}

int HostExecutor::CancelParts(absl::FunctionRef<bool(uint64_t program_id, uint64_t first_buffer_id)> which,
                              absl::string_view reason, bool end_simulated_time) {
  int cancelled = 0;
  {
    MutexLock lock(&queue_mu_);
    absl::flat_hash_set<Part*> seen;  // a part is in the queue of each of its devices
    for (const std::deque<Part*>& queue : queues_) {
      for (Part* part : queue) {
        if (!seen.insert(part).second || !which(part->program_id, part->first_buffer_id)) continue;
        // The reason first, once (only this function, under queue_mu_, sets
        // kCancelled); DeviceLoop reads it only if it sees kCancelled.
        if ((part->state.load(std::memory_order_acquire) & kCancelled) == 0) part->cancel_reason = std::string(reason);
        const int before =
            part->state.fetch_or(kCancelled | (end_simulated_time ? kEndSimulatedTime : 0), std::memory_order_acq_rel);
        if ((before & (kStarted | kCancelled)) == 0) ++cancelled;
      }
    }
  }
  if (end_simulated_time) {
    MutexLock lock(&fail_mu_);  // parts in their simulated time look again
    fail_cv_.SignalAll();
  }
  return cancelled;
}

wire::CancelRunsReply HostExecutor::CancelRuns(const wire::CancelRuns& request) {
  absl::flat_hash_set<std::pair<uint64_t, uint64_t>> runs;
  for (int i = 0; i < request.program_ids_size() && i < request.first_buffer_ids_size(); ++i) {
    runs.insert({request.program_ids(i), request.first_buffer_ids(i)});
  }
  wire::CancelRunsReply reply;
  reply.set_parts_cancelled(CancelParts(
      [&](uint64_t program_id, uint64_t first) { return request.all() || runs.contains({program_id, first}); },
      request.reason(), request.end_simulated_time()));
  return reply;
}

absl::Status HostExecutor::PeersLost(const wire::PeersLost& request) {
  for (int h : request.host_ids()) {
    if (h < 0 || h >= num_hosts_ || h == host_id_) {
      return absl::InvalidArgumentError(
          absl::StrCat("peers_lost: no other host ", h, " in this cluster of ", num_hosts_, " hosts"));
    }
  }
  for (int h : request.host_ids()) {
    if (lost_peers_[h].exchange(true, std::memory_order_acq_rel)) continue;
    any_peer_lost_.store(true, std::memory_order_release);
    // Transfers: the peer threads' Send or Recv with it (in flight, or the
    // next ones) fail at once, each failing its destination as a broken
    // connection does; none waits for a host that may never answer.
    if (data_ != nullptr) data_->ShutdownPeer(h);
    // Its groups break: a part waiting in Arrive for it, or making a group
    // with it, stops now, and no group with it is made again.
    AbortGroupsWith(h, HostLostError(request.why().empty()
                                         ? absl::StrCat("host ", h, " was lost")
                                         : absl::StrCat("host ", h, " was lost (", request.why(), ")")));
  }
  // Besides: a part of a gang with it that starts from now on fails
  // without joining their collectives (CheckPeers); one still forming gives
  // up at once (its rendezvous store ends its waits: GroupStore, and the
  // abort above); a part already inside a collective with it fails as soon
  // as its connections close (at once for a process that died; for a
  // stopped one, after the collective timeout: Gloo wakes no waiter for a
  // close on this side).
  return absl::OkStatus();
}

bool HostExecutor::PeerLost(int host) const {
  return host >= 0 && host < num_hosts_ && lost_peers_[host].load(std::memory_order_acquire);
}

absl::Status HostExecutor::CheckPeers(const HostDeviceList& gang) const {
  if (!any_peer_lost_.load(std::memory_order_acquire)) return absl::OkStatus();
  for (int h : gang.host_set) {
    if (h != host_id_ && PeerLost(h)) {
      return HostLostError(absl::StrCat("host ", h, " of the gang (", absl::StrJoin(gang.host_set, ","),
                                        ") was lost"));
    }
  }
  return absl::OkStatus();
}

absl::Status HostExecutor::FailDevices(const wire::FailDevices& request) {
  for (int d : request.device_ids()) {
    if (d < 0 || d >= static_cast<int>(local_index_.size()) || local_index_[d] < 0) {
      return absl::InvalidArgumentError(absl::StrCat("fail_devices: device ", d, " is not on host ", host_id_));
    }
  }
  for (int d : request.device_ids()) failed_[local_index_[d]].store(true, std::memory_order_release);
  any_failed_.store(true, std::memory_order_release);
  MutexLock lock(&fail_mu_);
  fail_cv_.SignalAll();
  return absl::OkStatus();
}

absl::Status HostExecutor::CheckHealthy(absl::Span<const int> local_devices) const {
  if (!any_failed_.load(std::memory_order_acquire)) return absl::OkStatus();
  for (int d : local_devices) {
    if (failed_[d].load(std::memory_order_acquire)) {
      return absl::UnavailableError(absl::StrCat("device ", local_device_ids_[d], " (island ", island_id_, ", host ",
                                                 host_id_, ") has failed"));
    }
  }
  return absl::OkStatus();
}

void HostExecutor::Free(const wire::FreeBuffers& request) {
  std::vector<std::shared_ptr<HostBuffer>> dropped;  // freed outside the lock
  MutexLock lock(&mu_);
  for (uint64_t id : request.buffer_ids()) DropLocked(id, dropped);
}

void HostExecutor::DropLocked(uint64_t id, std::vector<std::shared_ptr<HostBuffer>>& dropped) {
  auto it = buffers_.find(id);
  if (it == buffers_.end()) return;
  if (puts_in_progress_.erase(id) > 0) {  // nobody may wait for the rest of it
    it->second->Complete(absl::CancelledError(absl::StrCat("buffer ", id, " was freed before all of it came")));
  }
  dropped.push_back(std::move(it->second));
  buffers_.erase(it);
}

void HostExecutor::Fetch(const wire::FetchBuffer& request,
                         absl::AnyInvocable<void(absl::StatusOr<std::string>) &&> done) {
  const uint64_t buffer_id = request.buffer_id();
  std::shared_ptr<HostBuffer> buffer;
  {
    MutexLock lock(&mu_);
    auto it = buffers_.find(buffer_id);
    if (it != buffers_.end()) buffer = it->second;
  }
  if (buffer == nullptr) {
    std::move(done)(absl::NotFoundError(absl::StrCat("buffer ", buffer_id, " is not on host ", host_id_)));
    return;
  }
  const int64_t offset = request.offset();
  if (offset < 0 || offset > buffer->bytes() || request.max_bytes() < 0) {
    std::move(done)(absl::InvalidArgumentError(absl::StrCat("fetch: buffer ", buffer_id, " has ", buffer->bytes(),
                                                            " bytes on host ", host_id_, "; asked for offset ",
                                                            offset, ", max_bytes ", request.max_bytes())));
    return;
  }
  int64_t bytes = buffer->bytes() - offset;
  if (request.max_bytes() > 0) bytes = std::min(bytes, request.max_bytes());
  buffer->OnDone([buffer, offset, bytes, done = std::move(done)](const absl::Status& status) mutable {
    if (!status.ok()) {
      std::move(done)(status);
      return;
    }
    std::move(done)(
        std::string(reinterpret_cast<const char*>(buffer->data()) + offset, static_cast<size_t>(bytes)));
  });
}

wire::QueuesReply HostExecutor::DescribeQueues() {
  wire::QueuesReply reply;
  absl::flat_hash_map<const Part*, uint32_t> index;
  // A part in a queue still has its inputs: its device's thread drops them
  // only after taking it out of every queue, under this lock.
  MutexLock lock(&queue_mu_);
  for (int d = 0; d < num_local_devices_; ++d) {
    wire::DeviceQueue* q = reply.add_queues();
    q->set_device_id(local_device_ids_[d]);
    for (const Part* part : queues_[d]) {
      auto [it, fresh] = index.try_emplace(part, static_cast<uint32_t>(reply.parts_size()));
      if (fresh) {
        wire::QueuedPart* p = reply.add_parts();
        p->set_program_id(part->program_id);
        p->set_first_buffer_id(part->first_buffer_id);
        p->set_step(part->step);
        for (size_t i = 0; i < part->inputs.size(); ++i) {
          if (part->inputs[i]->done()) continue;
          p->add_pending_buffer_ids(part->inputs[i]->id());
          p->add_pending_inputs(static_cast<uint32_t>(i));
        }
      }
      q->add_parts(it->second);
    }
  }
  return reply;
}

int HostExecutor::num_buffers() const {
  MutexLock lock(&mu_);
  return static_cast<int>(buffers_.size());
}

}  // namespace pw
