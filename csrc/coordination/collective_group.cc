#include "csrc/coordination/collective_group.h"

#include <netdb.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <chrono>
#include <cstring>
#include <exception>
#include <mutex>
#include <stop_token>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "csrc/base/status_macros.h"
#include "gloo/allgatherv.h"
#include "gloo/allreduce.h"
#include "gloo/barrier.h"
#include "gloo/common/error.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/store.h"
#include "gloo/transport/tcp/device.h"
#include "gloo/transport/unbound_buffer.h"
#include "gloo/types.h"

namespace pw {

// ---------------------------------------------------------------------------
// InMemoryKeyValueStore

absl::Status InMemoryKeyValueStore::Set(absl::string_view key, absl::string_view value) {
  MutexLock lock(&mu_);
  values_[key] = std::string(value);
  changed_.SignalAll();
  return absl::OkStatus();
}

absl::StatusOr<std::string> InMemoryKeyValueStore::Get(absl::string_view key, absl::Time deadline) {
  const auto steady_deadline = std::chrono::steady_clock::now() +
                               absl::ToChronoNanoseconds(std::max(deadline - absl::Now(), absl::ZeroDuration()));
  MutexLock lock(&mu_);
  for (;;) {
    auto it = values_.find(key);
    if (it != values_.end()) return it->second;
    if (!changed_.WaitUntil(&mu_, steady_deadline) && !values_.contains(key)) {
      return absl::DeadlineExceededError(absl::StrCat("key '", key, "' was not set before the deadline"));
    }
  }
}

namespace {

// Gloo's rendezvous store over ours. Gloo reports store failures only by
// exception, so the first failure's Status is kept to be returned by Create
// with its code (DeadlineExceeded stays DeadlineExceeded).
class GlooStore final : public gloo::rendezvous::Store {
 public:
  GlooStore(KeyValueStore* store, std::string prefix, absl::Duration timeout, std::function<bool()> cancelled)
      : store_(store), prefix_(std::move(prefix)), timeout_(timeout), cancelled_(std::move(cancelled)) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    Check(store_->Set(prefix_ + key, absl::string_view(data.data(), data.size())));
  }

  // Gloo calls get() also for keys it has not waited for (connectFullMesh's
  // "rank_<i>"), so get waits too.
  std::vector<char> get(const std::string& key) override {
    absl::StatusOr<std::string> value = Get(key, absl::Now() + timeout_);
    Check(value.status());
    return std::vector<char>(value->begin(), value->end());
  }

  void wait(const std::vector<std::string>& keys) override { WaitUntil(keys, absl::Now() + timeout_); }

  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    WaitUntil(keys, absl::Now() + absl::FromChrono(timeout));
  }

  // OK, or the first failure of the underlying store.
  const absl::Status& failure() const { return failure_; }

 private:
  void WaitUntil(const std::vector<std::string>& keys, absl::Time deadline) {
    for (const std::string& key : keys) Check(Get(key, deadline).status());
  }

  // The store's Get, in slices while `cancelled_` may end the wait.
  absl::StatusOr<std::string> Get(const std::string& key, absl::Time deadline) {
    if (!cancelled_) return store_->Get(prefix_ + key, deadline);
    while (true) {
      if (cancelled_()) return absl::CancelledError(absl::StrCat("the wait for key '", prefix_, key, "' was cancelled"));
      const absl::Time slice = std::min(deadline, absl::Now() + absl::Milliseconds(50));
      absl::StatusOr<std::string> value = store_->Get(prefix_ + key, slice);
      if (value.ok() || !absl::IsDeadlineExceeded(value.status()) || slice >= deadline) return value;
    }
  }

  void Check(const absl::Status& status) {
    if (status.ok()) return;
    if (failure_.ok()) failure_ = status;
    throw gloo::IoException(std::string(status.message()));
  }

  KeyValueStore* const store_;
  const std::string prefix_;
  const absl::Duration timeout_;
  const std::function<bool()> cancelled_;
  absl::Status failure_;  // only touched by the thread in Create
};

// Gloo's collectives use slot prefixes 0x01..0x08 (gloo/types.h); point to
// point messages take one of their own so a Send never meets a collective, and
// so do Arrive's.
constexpr uint8_t kPointToPointSlotPrefix = 0x40;
constexpr uint8_t kArrivalSlotPrefix = 0x41;

std::chrono::milliseconds ToMillis(absl::Duration d) { return absl::ToChronoMilliseconds(d); }

// Elementwise reductions in Gloo's signature: c[i] = a[i] op b[i], where c may
// alias a. NaN-propagating max/min as the in-process kernels (numpy).
template <typename T>
void SumInto(void* c, const void* a, const void* b, size_t n) {
  auto* out = static_cast<T*>(c);
  const auto* x = static_cast<const T*>(a);
  const auto* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) out[i] = x[i] + y[i];
}

// int32 sums wrap: add as uint32 (signed overflow is undefined in C++).
template <>
void SumInto<int32_t>(void* c, const void* a, const void* b, size_t n) {
  auto* out = static_cast<int32_t*>(c);
  const auto* x = static_cast<const int32_t*>(a);
  const auto* y = static_cast<const int32_t*>(b);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<int32_t>(static_cast<uint32_t>(x[i]) + static_cast<uint32_t>(y[i]));
}

template <typename T>
void MaxInto(void* c, const void* a, const void* b, size_t n) {
  auto* out = static_cast<T*>(c);
  const auto* x = static_cast<const T*>(a);
  const auto* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) out[i] = (x[i] != x[i] || x[i] > y[i]) ? x[i] : y[i];  // NOLINT: NaN check
}

template <typename T>
void MinInto(void* c, const void* a, const void* b, size_t n) {
  auto* out = static_cast<T*>(c);
  const auto* x = static_cast<const T*>(a);
  const auto* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) out[i] = (x[i] != x[i] || x[i] < y[i]) ? x[i] : y[i];  // NOLINT: NaN check
}

void OrInto(void* c, const void* a, const void* b, size_t n) {
  auto* out = static_cast<uint8_t*>(c);
  const auto* x = static_cast<const uint8_t*>(a);
  const auto* y = static_cast<const uint8_t*>(b);
  for (size_t i = 0; i < n; ++i) out[i] = (x[i] | y[i]) != 0;
}

void AndInto(void* c, const void* a, const void* b, size_t n) {
  auto* out = static_cast<uint8_t*>(c);
  const auto* x = static_cast<const uint8_t*>(a);
  const auto* y = static_cast<const uint8_t*>(b);
  for (size_t i = 0; i < n; ++i) out[i] = (x[i] != 0) & (y[i] != 0);
}

using ReduceFn = void (*)(void*, const void*, const void*, size_t);

template <typename T>
ReduceFn NumericReduction(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return &SumInto<T>;
    case ReduceOp::kMax:
      return &MaxInto<T>;
    case ReduceOp::kMin:
      return &MinInto<T>;
  }
  return nullptr;
}

// The reduction for (dtype, op), or nullptr for kSum of bool.
ReduceFn Reduction(DType dtype, ReduceOp op) {
  switch (dtype) {
    case DType::kF32:
      return NumericReduction<float>(op);
    case DType::kF64:
      return NumericReduction<double>(op);
    case DType::kI32:
      return NumericReduction<int32_t>(op);
    case DType::kU32:  // sums wrap by themselves
      return NumericReduction<uint32_t>(op);
    case DType::kBool:
      if (op == ReduceOp::kMax) return &OrInto;
      if (op == ReduceOp::kMin) return &AndInto;
      return nullptr;
    case DType::kBF16:  // the function IR reduces bfloat16 in float32
      return nullptr;
  }
  return nullptr;
}

absl::string_view ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kMin:
      return "min";
  }
  return "?";
}

// Gloo's templated setters want an element type; Gloo only uses its size.
template <size_t kBytes>
struct Element {
  unsigned char bytes[kBytes];
};

void RunAllReduce(const std::shared_ptr<gloo::Context>& context, size_t element_size, void* data, size_t count,
                  ReduceFn reduce, uint32_t tag, std::chrono::milliseconds timeout) {
  gloo::AllreduceOptions opts(context);
  switch (element_size) {
    case 1:
      opts.setOutput(static_cast<Element<1>*>(data), count);
      break;
    case 4:
      opts.setOutput(static_cast<Element<4>*>(data), count);
      break;
    case 8:
      opts.setOutput(static_cast<Element<8>*>(data), count);
      break;
    default:
      throw gloo::Exception(absl::StrCat("unsupported element size ", element_size));
  }
  opts.setReduceFunction(reduce);
  opts.setTag(tag);
  opts.setTimeout(timeout);
  gloo::allreduce(opts);
}

// What a member is about to do, for check_agreement: the operation kind and
// its sizes. Fixed size, so a disagreement cannot itself be a size mismatch.
struct Signature {
  int64_t kind = 0;
  int64_t a = 0, b = 0, c = 0;
  bool operator==(const Signature&) const = default;
};

// Signature kinds; each also picks the slot prefix of its exchange, so checks
// of different kinds on one tag do not meet. Gloo's own prefixes are 0x01..0x08.
constexpr int64_t kAllReduceKind = 1;
constexpr int64_t kAllGatherVKind = 2;
constexpr int64_t kSendKind = 3;  // a sender announces its byte count
constexpr int64_t kRecvKind = 4;  // a receiver announces its byte count
constexpr uint8_t kCheckSlotPrefixBase = 0x50;

std::string Describe(const Signature& sig) {
  switch (sig.kind) {
    case kAllReduceKind:
      return absl::StrCat("AllReduce ", ReduceOpName(static_cast<ReduceOp>(sig.b)), " ",
                          DTypeName(static_cast<DType>(sig.a)), "[", sig.c, "]");
    case kAllGatherVKind:
      return absl::StrCat("AllGatherV of ", sig.a, " bytes in all (byte counts hash ", sig.b, ")");
    case kSendKind:
      return absl::StrCat("a send of ", sig.a, " bytes");
    case kRecvKind:
      return absl::StrCat("a receive of ", sig.a, " bytes");
  }
  return absl::StrCat("operation kind ", sig.kind);
}

// A signature to send to (or receive from) `peer`.
struct SignatureMessage {
  int peer;
  Signature* signature;
};

// Sends every `out` and receives every `in` (all on `tag`, slot prefix by
// kind: out[i]'s kind for sends; `in_kinds[i]` for receives). Receives are
// posted before sends, so members exchanging with each other cannot deadlock.
void ExchangeSignatures(gloo::Context& context, absl::Span<const SignatureMessage> out,
                        absl::Span<const SignatureMessage> in, absl::Span<const int64_t> in_kinds, uint32_t tag,
                        std::chrono::milliseconds timeout) {
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> recvs, sends;
  for (size_t i = 0; i < in.size(); ++i) {
    recvs.push_back(context.createUnboundBuffer(in[i].signature, sizeof(Signature)));
    recvs.back()->recv(in[i].peer, gloo::Slot::build(kCheckSlotPrefixBase + in_kinds[i], tag));
  }
  for (const SignatureMessage& m : out) {
    sends.push_back(context.createUnboundBuffer(m.signature, sizeof(Signature)));
    sends.back()->send(m.peer, gloo::Slot::build(kCheckSlotPrefixBase + m.signature->kind, tag));
  }
  for (auto& r : recvs) r->waitRecv(timeout);
  for (auto& s : sends) s->waitSend(timeout);
}

// check_agreement for a collective: every member's signature must equal
// `mine`. On a disagreement every member sees it (all exchange with all)
// before any data moves, so the group stays usable.
absl::Status AgreeOnCollective(gloo::Context& context, Signature mine, uint32_t tag,
                               std::chrono::milliseconds timeout) {
  std::vector<Signature> theirs(context.size);
  std::vector<SignatureMessage> out, in;
  std::vector<int64_t> in_kinds;
  for (int p = 0; p < context.size; ++p) {
    if (p == context.rank) continue;
    out.push_back({p, &mine});
    in.push_back({p, &theirs[p]});
    in_kinds.push_back(mine.kind);
  }
  ExchangeSignatures(context, out, in, in_kinds, tag, timeout);
  theirs[context.rank] = mine;
  if (std::all_of(theirs.begin(), theirs.end(), [&](const Signature& s) { return s == mine; })) {
    return absl::OkStatus();
  }
  std::vector<std::string> calls;
  for (int p = 0; p < context.size; ++p) calls.push_back(absl::StrCat("rank ", p, " calls ", Describe(theirs[p])));
  return absl::InvalidArgumentError(
      absl::StrCat("the members disagree, nothing was exchanged: ", absl::StrJoin(calls, "; ")));
}

// check_agreement for point to point: this member sends `send_bytes` to
// `send_peer` and receives `recv_bytes` from `recv_peer` (-1: no such side);
// each side of each pair announces its count to the other and both check.
// *send_agreed / *recv_agreed say whether that transfer may go ahead (both of
// its sides know the same answer).
absl::Status AgreeOnPointToPoint(gloo::Context& context, int send_peer, int64_t send_bytes, int recv_peer,
                                 int64_t recv_bytes, uint32_t tag, std::chrono::milliseconds timeout,
                                 bool* send_agreed, bool* recv_agreed) {
  Signature my_send{kSendKind, send_bytes}, my_recv{kRecvKind, recv_bytes};
  Signature their_recv, their_send;
  std::vector<SignatureMessage> out, in;
  std::vector<int64_t> in_kinds;
  if (send_peer >= 0) {
    out.push_back({send_peer, &my_send});
    in.push_back({send_peer, &their_recv});
    in_kinds.push_back(kRecvKind);
  }
  if (recv_peer >= 0) {
    out.push_back({recv_peer, &my_recv});
    in.push_back({recv_peer, &their_send});
    in_kinds.push_back(kSendKind);
  }
  ExchangeSignatures(context, out, in, in_kinds, tag, timeout);
  *send_agreed = send_peer < 0 || their_recv.a == send_bytes;
  *recv_agreed = recv_peer < 0 || their_send.a == recv_bytes;
  std::vector<std::string> problems;
  if (!*send_agreed) {
    problems.push_back(absl::StrCat("rank ", send_peer, " receives ", their_recv.a, " bytes, this member sends ",
                                    send_bytes));
  }
  if (!*recv_agreed) {
    problems.push_back(absl::StrCat("rank ", recv_peer, " sends ", their_send.a, " bytes, this member receives ",
                                    recv_bytes));
  }
  if (problems.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("sizes disagree, nothing was exchanged: ", absl::StrJoin(problems, "; ")));
}

// FNV-1a of the byte counts: AllGatherV's signature must stay fixed-size.
int64_t HashCounts(absl::Span<const int64_t> counts) {
  uint64_t h = 1469598103934665603ull;
  for (int64_t c : counts) {
    for (int i = 0; i < 8; ++i) h = (h ^ ((static_cast<uint64_t>(c) >> (8 * i)) & 0xff)) * 1099511628211ull;
  }
  return static_cast<int64_t>(h >> 1);
}

// `bind_address`, or this machine's name if it is empty, once this process
// can listen on one of its addresses. Gloo must not see an address that fails
// either way: on a name getaddrinfo(3) rejects it checks for -1 only (failures
// are other negative codes) and walks an uninitialized list, a segfault; on
// an address no socket binds to it throws before freeaddrinfo, a leak.
absl::StatusOr<std::string> BindableHost(const std::string& bind_address) {
  std::string host = bind_address;
  if (host.empty()) {
    char name[HOST_NAME_MAX + 1] = {};
    if (gethostname(name, sizeof(name) - 1) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("no bind address and gethostname failed: ", strerror(errno)));
    }
    host = name;
  }
  struct addrinfo hints;
  std::memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  struct addrinfo* result = nullptr;
  const int rv = getaddrinfo(host.c_str(), nullptr, &hints, &result);
  if (rv != 0) {
    return absl::InvalidArgumentError(absl::StrCat("cannot resolve bind address '", host, "': ", gai_strerror(rv)));
  }
  int bind_errno = 0;
  bool bound = false;
  for (struct addrinfo* ai = result; ai != nullptr && !bound; ai = ai->ai_next) {
    const int fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
    if (fd == -1) continue;
    bound = bind(fd, ai->ai_addr, ai->ai_addrlen) == 0;
    if (!bound) bind_errno = errno;
    close(fd);
  }
  freeaddrinfo(result);
  if (!bound) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot listen on bind address '", host, "': ", strerror(bind_errno)));
  }
  return host;
}

// Gloo writes to its sockets with writev(2), without MSG_NOSIGNAL, so a write
// to a connection the peer has closed raises SIGPIPE, whose default action
// ends the process. A peer's death must be an error here instead: ignore
// SIGPIPE unless the program chose its own disposition (Python already
// ignores it).
void IgnoreDefaultSigpipe() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction current;
    if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) signal(SIGPIPE, SIG_IGN);
  });
}

}  // namespace

// ---------------------------------------------------------------------------
// CollectiveGroup

struct CollectiveGroup::Gloo {
  std::shared_ptr<gloo::transport::Device> device;
  std::shared_ptr<gloo::rendezvous::Context> context;
};

struct CollectiveGroup::Arrival {
  char here = 1;
  std::vector<char> heard;
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> recvs, sends;

  // Each wait (the one under way, or the next) returns false at once.
  void AbortWaits() {
    for (auto& b : recvs) b->abortWaitRecv();
    for (auto& b : sends) b->abortWaitSend();
  }
};

absl::StatusOr<std::unique_ptr<CollectiveGroup>> CollectiveGroup::Create(KeyValueStore* store, std::string group_key,
                                                                         int rank, int size,
                                                                         const CollectiveOptions& options) {
  const std::string name = absl::StrCat("collective group '", group_key, "' rank ", rank, " of ", size);
  if (store == nullptr) return absl::InvalidArgumentError(absl::StrCat(name, ": no key-value store"));
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": rank must be in [0, size) and size >= 1"));
  }
  if (options.timeout < absl::Milliseconds(1)) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": timeout must be at least 1 ms, got ",
                                                   absl::FormatDuration(options.timeout)));
  }

  absl::StatusOr<std::string> host = BindableHost(options.bind_address);
  if (!host.ok()) return absl::InvalidArgumentError(absl::StrCat(name, ": ", host.status().message()));
  IgnoreDefaultSigpipe();
  auto gloo = std::make_unique<Gloo>();
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = *host;
    gloo->device = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": cannot listen on address '", options.bind_address, "': ", e.what()));
  }

  const absl::Duration join_timeout =
      options.join_timeout > absl::ZeroDuration() ? options.join_timeout : options.timeout;
  GlooStore gloo_store(store, absl::StrCat(group_key, "/"), join_timeout, options.join_cancelled);
  try {
    gloo->context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    gloo->context->setTimeout(ToMillis(join_timeout));
    gloo->context->connectFullMesh(gloo_store, gloo->device);
  } catch (const std::exception& e) {
    const absl::Status& store_failure = gloo_store.failure();
    if (!store_failure.ok()) {
      return absl::Status(store_failure.code(), absl::StrCat(name, ": rendezvous: ", store_failure.message()));
    }
    return absl::UnavailableError(absl::StrCat(name, ": connecting to the other members failed: ", e.what()));
  }
  return std::unique_ptr<CollectiveGroup>(
      new CollectiveGroup(std::move(group_key), rank, size, options, std::move(gloo)));
}

CollectiveGroup::CollectiveGroup(std::string group_key, int rank, int size, const CollectiveOptions& options,
                                 std::unique_ptr<Gloo> gloo)
    : group_key_(std::move(group_key)),
      rank_(rank),
      size_(size),
      timeout_(options.timeout),
      check_agreement_(options.check_agreement),
      gloo_(std::move(gloo)) {}

CollectiveGroup::~CollectiveGroup() {
  {
    MutexLock lock(&mu_);
    abandoned_.clear();  // Gloo's buffers, before the context they were made in
  }
  // The context's pairs refer to the device; drop them first.
  gloo_->context.reset();
  gloo_->device.reset();
}

std::string CollectiveGroup::Name() const {
  return absl::StrCat("collective group '", group_key_, "' rank ", rank_, " of ", size_);
}

absl::Status CollectiveGroup::broken() const {
  MutexLock lock(&mu_);
  return broken_;
}

void CollectiveGroup::Break(const absl::Status& error) {
  {
    MutexLock lock(&mu_);
    if (!broken_.ok()) return;
    broken_ = error;
    for (Arrival* arrival : arrivals_) arrival->AbortWaits();
  }
  // Close every connection so the peers see the failure now (their pending
  // receives end with "connection closed") rather than at their timeout.
  // Pair::close never throws in practice, but stay on the safe side.
  try {
    gloo_->context->closeConnections();
  } catch (const std::exception&) {
  }
}

template <typename Body>
absl::Status CollectiveGroup::Run(absl::string_view op, uint64_t tag, Body body) {
  {
    MutexLock lock(&mu_);
    if (!broken_.ok()) {
      return absl::UnavailableError(absl::StrCat(Name(), ": ", op, " (tag ", tag, "): the group broke earlier (",
                                                 broken_.message(), "); create a new one under a new key"));
    }
  }
  std::string what;
  try {
    absl::Status status = body();
    if (status.ok()) return status;
    return absl::Status(status.code(), absl::StrCat(Name(), ": ", op, " (tag ", tag, "): ", status.message()));
  } catch (const std::exception& e) {  // gloo::Exception, gloo::EnforceNotMet, std::bad_alloc, ...
    what = e.what();
  } catch (...) {
    what = "unknown exception";
  }
  const std::string failure = absl::StrCat(op, " (tag ", tag, ") failed: ", what);
  Break(absl::UnavailableError(failure));
  return absl::UnavailableError(absl::StrCat(Name(), ": ", failure));
}

absl::Status CollectiveGroup::AllReduce(DType dtype, ReduceOp op, void* data, int64_t count, uint32_t tag) {
  const ReduceFn reduce = Reduction(dtype, op);
  if (reduce == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(Name(), ": AllReduce ", ReduceOpName(op), " of ",
                                                   DTypeName(dtype),
                                                   " is not supported (sum bools as int32, "
                                                   "reduce bfloat16 in float32)"));
  }
  const int64_t element_size = DTypeSize(dtype);
  if (count < 0 || count > kMaxArrayBytes / element_size) {
    return absl::InvalidArgumentError(absl::StrCat(Name(), ": AllReduce of ", count, " elements"));
  }
  if (count == 0 && !check_agreement_) return absl::OkStatus();
  if (data == nullptr && count > 0) {
    return absl::InvalidArgumentError(absl::StrCat(Name(), ": AllReduce of null data"));
  }
  return Run(absl::StrCat("AllReduce ", ReduceOpName(op), " ", DTypeName(dtype), "[", count, "]"), tag, [&] {
    if (check_agreement_) {
      const Signature mine{kAllReduceKind, static_cast<int64_t>(dtype), static_cast<int64_t>(op), count};
      PW_RETURN_IF_ERROR(AgreeOnCollective(*gloo_->context, mine, tag, ToMillis(timeout_)));
    }
    if (count > 0) RunAllReduce(gloo_->context, element_size, data, count, reduce, tag, ToMillis(timeout_));
    return absl::OkStatus();
  });
}

absl::Status CollectiveGroup::AllGatherV(const void* in, int64_t in_bytes, void* out,
                                         absl::Span<const int64_t> bytes_per_rank, uint32_t tag) {
  if (static_cast<int64_t>(bytes_per_rank.size()) != size_) {
    return absl::InvalidArgumentError(
        absl::StrCat(Name(), ": AllGatherV got ", bytes_per_rank.size(), " byte counts for ", size_, " ranks"));
  }
  std::vector<size_t> counts(size_);
  int64_t total = 0;
  int64_t own_offset = 0;
  for (int r = 0; r < size_; ++r) {
    const int64_t bytes = bytes_per_rank[r];
    if (bytes < 0 || bytes > kMaxArrayBytes - total) {
      return absl::InvalidArgumentError(absl::StrCat(Name(), ": AllGatherV byte counts [",
                                                     absl::StrJoin(bytes_per_rank, ", "), "] are out of range"));
    }
    if (r == rank_) own_offset = total;
    counts[r] = static_cast<size_t>(bytes);
    total += bytes;
  }
  if (in_bytes != bytes_per_rank[rank_]) {
    return absl::InvalidArgumentError(absl::StrCat(Name(), ": AllGatherV contributes ", in_bytes,
                                                   " bytes but bytes_per_rank says ", bytes_per_rank[rank_]));
  }
  if ((in == nullptr && in_bytes > 0) || (out == nullptr && total > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(Name(), ": AllGatherV of null data"));
  }
  auto* out_bytes = static_cast<unsigned char*>(out);
  // In place (in is this member's slot of out): Gloo then takes out as primed.
  const bool in_place = in == out_bytes + own_offset;
  return Run("AllGatherV", tag, [&] {
    if (check_agreement_) {
      const Signature mine{kAllGatherVKind, total, HashCounts(bytes_per_rank)};
      PW_RETURN_IF_ERROR(AgreeOnCollective(*gloo_->context, mine, tag, ToMillis(timeout_)));
    }
    gloo::AllgathervOptions opts(gloo_->context);
    if (!in_place) opts.setInput(const_cast<unsigned char*>(static_cast<const unsigned char*>(in)), in_bytes);
    opts.setOutput(out_bytes, std::move(counts));
    opts.setTag(tag);
    opts.setTimeout(ToMillis(timeout_));
    gloo::allgatherv(opts);
    return absl::OkStatus();
  });
}

absl::Status CollectiveGroup::Send(int peer, const void* data, int64_t bytes, uint32_t tag) {
  if (peer < 0 || peer >= size_ || peer == rank_ || bytes < 0 || (data == nullptr && bytes > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat(Name(), ": Send of ", bytes, " bytes to rank ", peer, " (must be another member)"));
  }
  return Run(absl::StrCat("Send of ", bytes, " bytes to rank ", peer), tag, [&] {
    if (check_agreement_) {
      bool agreed, unused;
      PW_RETURN_IF_ERROR(
          AgreeOnPointToPoint(*gloo_->context, peer, bytes, -1, 0, tag, ToMillis(timeout_), &agreed, &unused));
    }
    // Gloo's buffers are not const; a send only reads.
    auto buffer = gloo_->context->createUnboundBuffer(const_cast<void*>(data), bytes);
    buffer->send(peer, gloo::Slot::build(kPointToPointSlotPrefix, tag));
    buffer->waitSend(ToMillis(timeout_));
    return absl::OkStatus();
  });
}

absl::Status CollectiveGroup::Recv(int peer, void* data, int64_t bytes, uint32_t tag) {
  if (peer < 0 || peer >= size_ || peer == rank_ || bytes < 0 || (data == nullptr && bytes > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat(Name(), ": Recv of ", bytes, " bytes from rank ", peer, " (must be another member)"));
  }
  return Run(absl::StrCat("Recv of ", bytes, " bytes from rank ", peer), tag, [&] {
    if (check_agreement_) {
      bool unused, agreed;
      PW_RETURN_IF_ERROR(
          AgreeOnPointToPoint(*gloo_->context, -1, 0, peer, bytes, tag, ToMillis(timeout_), &unused, &agreed));
    }
    auto buffer = gloo_->context->createUnboundBuffer(data, bytes);
    buffer->recv(peer, gloo::Slot::build(kPointToPointSlotPrefix, tag));
    buffer->waitRecv(ToMillis(timeout_));
    return absl::OkStatus();
  });
}

absl::Status CollectiveGroup::SendRecv(int send_peer, const void* send_data, int64_t send_bytes, int recv_peer,
                                       void* recv_data, int64_t recv_bytes, uint32_t tag) {
  const std::string op = absl::StrCat("SendRecv of ", send_bytes, " bytes to rank ", send_peer, " and ", recv_bytes,
                                      " bytes from rank ", recv_peer);
  if (send_peer < 0 || send_peer >= size_ || recv_peer < 0 || recv_peer >= size_ || send_bytes < 0 ||
      recv_bytes < 0 || (send_data == nullptr && send_bytes > 0) || (recv_data == nullptr && recv_bytes > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(Name(), ": ", op));
  }
  if ((send_peer == rank_) != (recv_peer == rank_)) {
    return absl::InvalidArgumentError(
        absl::StrCat(Name(), ": ", op, ": either both peers are this member or neither is"));
  }
  if (send_peer == rank_) {
    if (send_bytes != recv_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(Name(), ": ", op, ": a copy to itself needs equal sizes"));
    }
    if (send_bytes > 0 && send_data != recv_data) std::memmove(recv_data, send_data, send_bytes);
    return absl::OkStatus();
  }
  return Run(op, tag, [&] {
    bool send_agreed = true, recv_agreed = true;
    absl::Status agreement;
    if (check_agreement_) {
      agreement = AgreeOnPointToPoint(*gloo_->context, send_peer, send_bytes, recv_peer, recv_bytes, tag,
                                      ToMillis(timeout_), &send_agreed, &recv_agreed);
    }
    // A transfer whose two sides agreed still happens when the other did not,
    // so no member of another pair is left waiting (a ring stays whole).
    const uint64_t slot = gloo::Slot::build(kPointToPointSlotPrefix, tag);
    auto out = gloo_->context->createUnboundBuffer(const_cast<void*>(send_data), send_bytes);
    auto in = gloo_->context->createUnboundBuffer(recv_data, recv_bytes);
    if (recv_agreed) in->recv(recv_peer, slot);
    if (send_agreed) out->send(send_peer, slot);
    if (recv_agreed) in->waitRecv(ToMillis(timeout_));
    if (send_agreed) out->waitSend(ToMillis(timeout_));
    return agreement;
  });
}

absl::Status CollectiveGroup::Arrive(uint64_t meeting, absl::Duration timeout, std::stop_token cancel) {
  if (meeting >= kMaxMeetings) {
    return absl::InvalidArgumentError(absl::StrCat(Name(), ": Arrive: meeting ", meeting, " is not below 2^56"));
  }
  if (size_ == 1) return absl::OkStatus();
  bool cancelled = false;
  absl::Status status = Run("Arrive", meeting, [&]() -> absl::Status {
    if (cancel.stop_requested()) {  // nothing sent yet: nobody hears of it
      cancelled = true;
      return absl::OkStatus();
    }
    const std::chrono::milliseconds millis = ToMillis(timeout);
    // Its own prefix, so all the bits below it are the meeting's.
    const uint64_t slot = uint64_t{kArrivalSlotPrefix} * kMaxMeetings | meeting;
    // Each member tells every other one it is here, and waits to hear the
    // same from each: the last to come ends the others' waits.
    auto arrival = std::make_unique<Arrival>();
    arrival->heard.assign(static_cast<size_t>(size_), 0);
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      arrival->recvs.push_back(gloo_->context->createUnboundBuffer(&arrival->heard[p], 1));
      arrival->recvs.back()->recv(p, slot);
    }
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      arrival->sends.push_back(gloo_->context->createUnboundBuffer(&arrival->here, 1));
      arrival->sends.back()->send(p, slot);
    }
    // Registered while it waits, for Break; unregistered however this ends
    // (a timeout throws).
    struct Registration {
      CollectiveGroup* group;
      Arrival* arrival;
      ~Registration() {
        MutexLock lock(&group->mu_);
        auto& a = group->arrivals_;
        a.erase(std::remove(a.begin(), a.end(), arrival), a.end());
      }
    };
    {
      MutexLock lock(&mu_);
      if (!broken_.ok()) return absl::UnavailableError(absl::StrCat("the group broke: ", broken_.message()));
      arrivals_.push_back(arrival.get());
    }
    Registration registration{this, arrival.get()};
    // Ends the waits at a stop (at once if one was requested already); gone
    // before `arrival` is (its destructor waits for a call under way).
    std::stop_callback on_stop(cancel, [waits = arrival.get()] { waits->AbortWaits(); });
    bool arrived = true;  // each wait is false if Break or the stop aborted it
    for (auto& r : arrival->recvs) arrived = r->waitRecv(millis) && arrived;
    for (auto& s : arrival->sends) arrived = s->waitSend(millis) && arrived;
    if (arrived) return absl::OkStatus();
    MutexLock lock(&mu_);
    if (!broken_.ok()) return absl::UnavailableError(absl::StrCat("the wait was aborted: ", broken_.message()));
    // Cancelled: the members still to come send into it, and the group
    // stays as it is.
    cancelled = true;
    abandoned_.push_back(std::move(arrival));
    return absl::OkStatus();
  });
  if (!cancelled) return status;
  return absl::CancelledError(absl::StrCat(Name(), ": Arrive (meeting ", meeting, ") was cancelled"));
}

absl::Status CollectiveGroup::Barrier(uint32_t tag) {
  return Run("Barrier", tag, [&] {
    gloo::BarrierOptions opts(gloo_->context);
    opts.setTag(tag);
    opts.setTimeout(ToMillis(timeout_));
    gloo::barrier(opts);
    return absl::OkStatus();
  });
}

}  // namespace pw
