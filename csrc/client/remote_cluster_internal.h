#ifndef PATHWAYS_CLIENT_REMOTE_CLUSTER_INTERNAL_H_
#define PATHWAYS_CLIENT_REMOTE_CLUSTER_INTERNAL_H_

// RemoteCluster's records of programs and runs, shared by its files
// (remote_cluster.cc: dispatch; remote_diagnosis.cc: pw.diagnose).

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "csrc/client/remote_cluster.h"

namespace pw {

// `status` with `prefix` before its message, its payloads kept (its
// ErrorKind: a lost host stays pw.HostLostError).
inline absl::Status Prefixed(absl::string_view prefix, const absl::Status& status) {
  absl::Status out(status.code(), absl::StrCat(prefix, status.message()));
  status.ForEachPayload([&](absl::string_view url, const absl::Cord& payload) { out.SetPayload(url, payload); });
  return out;
}

// A host's answer to one load (DefineDevices, LoadFunction or LoadProgram),
// shared by every plan that needs what it loaded. Answered once, on a gRPC
// thread (a lost host answers with its loss).
struct RemoteCluster::LoadReply {
  LoadReply(int host, std::string what) : host(host), what(std::move(what)) {}
  // Takes the host's reply: its error is kept as "<what>: <the host's error>".
  void Answer(const absl::StatusOr<wire::Reply>& reply) {
    absl::Status s = reply.ok() ? ReplyStatus(*reply) : reply.status();
    if (!s.ok()) s = Prefixed(absl::StrCat(what, ": "), s);
    MutexLock lock(&mu);
    answered = true;
    status = std::move(s);
    cv.SignalAll();
  }
  // Blocks until answered; the answer.
  absl::Status Await() {
    MutexLock lock(&mu);
    while (!answered) cv.Wait(&mu);
    return status;
  }
  bool is_answered() {
    MutexLock lock(&mu);
    return answered;
  }
  const int host;          // the host it went to
  const std::string what;  // "host 1 could not load function 'f'"
  Mutex mu;
  CondVar cv;
  bool answered ABSL_GUARDED_BY(mu) = false;
  absl::Status status ABSL_GUARDED_BY(mu);
};

// When a host's part of a step ran, on the client's clock.
struct PartInterval {
  int64_t start_ns = 0;
  int64_t end_ns = 0;  // >= start_ns
};

// A host's report of when a part ran (on its clock) moved to the client's
// clock by the host's `offset_ns`. The times are only the host's word: a
// part ran inside its run's life here, from its submission to `now_ns`, so
// they are clamped to that (no overflow, whatever the host sent), which also
// bounds what the accounts multiply by a gang's size.
inline PartInterval OnClientClock(int64_t start_ns, int64_t end_ns, int64_t offset_ns, int64_t submitted_ns,
                                  int64_t now_ns) {
  const int64_t hi = std::max(now_ns, submitted_ns);
  auto ours = [&](int64_t t) {
    int64_t local;
    if (__builtin_sub_overflow(t, offset_ns, &local)) return t < 0 ? submitted_ns : hi;
    return std::clamp(local, submitted_ns, hi);
  };
  PartInterval interval{ours(start_ns), ours(end_ns)};
  interval.end_ns = std::max(interval.end_ns, interval.start_ns);
  return interval;
}

// What the hosts know of one lowered program.
struct RemoteCluster::Plan {
  // The program it is for: once that is gone and no run holds the plan,
  // the plan and its loads on the hosts are dropped (ReclaimLocked).
  std::weak_ptr<const LoweredProgram> program;
  std::vector<int> hosts;              // taking part, increasing
  absl::flat_hash_set<int> loaded;     // hosts that have its steps
  // Per step: its hosts and its wire form; its devices and function (null
  // for a transfer; alive while a run holds the program).
  std::vector<std::vector<int>> step_hosts;
  std::vector<wire::ProgramStep> step_wire;
  std::vector<const DeviceList*> step_devices;
  std::vector<const CompiledFunction*> step_fns;
  // Per host: the steps it loaded, in order (a reply's step index).
  std::vector<std::vector<int>> host_steps;
  // The step that makes each slot (-1: an argument), and whether the
  // program returns it.
  std::vector<int> slot_step;
  std::vector<bool> slot_is_output;
  // Proportional share: each step's device time and island(s), and the
  // whole program's.
  std::vector<double> step_cost_ns;
  std::vector<std::vector<int>> step_islands;
  double cost_ns = 0;
  std::vector<int> islands;
  // Sequential dispatch: step k is program sequential_base + k, and the
  // arguments' copies program sequential_base + num_steps (0: not loaded).
  uint64_t sequential_base = 0;
  absl::flat_hash_set<int> args_loaded;
  std::string name;  // the program's, for errors

  // The hosts' answers to the loads its runs need: its own LoadPrograms and
  // the lists and functions they name (sent for it, or known already). A
  // dispatch waits while some are unanswered (AwaitLoads: one round trip,
  // when a program is first dispatched); the first error fails this and
  // every later dispatch of the program, before anything is sent.
  Mutex loads_mu;  // not mu_: read by dispatches waiting outside it
  std::vector<std::shared_ptr<LoadReply>> loads ABSL_GUARDED_BY(loads_mu);
  absl::Status load_error ABSL_GUARDED_BY(loads_mu);
  std::atomic<bool> loads_ok{false};  // every one of `loads` answered OK: nothing to wait for
  void AddLoad(std::shared_ptr<LoadReply> reply) {
    MutexLock lock(&loads_mu);
    loads.push_back(std::move(reply));
    loads_ok.store(false, std::memory_order_release);
  }
};

// One run in flight: its buffers complete once every host taking part has
// replied. Holds the buffers (as a gang task does), and counts as work in
// flight so a dispatch waiting for memory knows memory may come back.
struct RemoteCluster::Run {
  Run(RemoteCluster* rc, std::shared_ptr<const Plan> plan, std::shared_ptr<const ProgramIr> program,
      SchedulingClient* client, int single_step = -1)
      : in_flight(rc->stores_),
        rc(rc),
        plan(std::move(plan)),
        program(std::move(program)),
        client(client),
        single_step(single_step) {}
  ObjectStores::WorkInFlight in_flight;
  RemoteCluster* rc;
  // Held while the run is in flight or waiting for admission: its program's
  // loads stay on the hosts until no run holds the plan.
  std::shared_ptr<const Plan> plan;
  std::shared_ptr<const ProgramIr> program;  // keeps the steps' functions alive
  SchedulingClient* client;                  // null: the default client
  // Sequential dispatch runs one step: every time a host reports is this
  // step's. Else (-1) the host's step index maps through the plan.
  int single_step;
  int64_t seq = -1;  // in the runs in flight, from SubmitRun
  std::vector<int> hosts;   // that take part, increasing (from SubmitRun)
  uint64_t program_id = 0;  // with `first`: how hosts name it
  uint64_t first = 0;
  int64_t submitted_ns = 0;
  int64_t first_gang = 0;  // its steps' gang numbers count from it (pw.diagnose)
  std::vector<int> admitted_islands;  // counted in their admission windows
  double cost_ns = 0;                 // device time, for a service's admission
  std::vector<int> islands;           // those it runs on
  // The buffers it makes. Filled before the run is registered (SubmitRun);
  // from then on read under `mu` only by a thread other than the
  // dispatching one (Describe), since Finish empties it under `mu` on
  // whichever thread completes the run. Not annotated: the dispatch path
  // fills it without the lock, before anyone else can see the run.
  std::vector<std::shared_ptr<ShardedBuffer>> made;
  // The buffers it reads and does not make (the program's arguments; a
  // sequential step's inputs), held until it is sent: the free of one must
  // not reach a host before the run that reads it.
  std::vector<std::shared_ptr<ShardedBuffer>> args;
  // The buffers made by transfers (ICI or DCN), counted in the transfer
  // statistics once they are ready, as in process.
  absl::flat_hash_map<uint64_t, LinkKind> copies;
  std::atomic<int> pending{0};
  std::atomic<bool> finished{false};  // Finish ran (Abandon may come first)
  Mutex mu;
  absl::Status whole ABSL_GUARDED_BY(mu);  // a host's part failed as a whole
  std::vector<int> refusers ABSL_GUARDED_BY(mu);  // hosts that refused it, whose refusal its hosts were told
  absl::flat_hash_map<uint64_t, absl::Status> failed ABSL_GUARDED_BY(mu);

  static void HostDone(const std::shared_ptr<Run>& run, int host, absl::StatusOr<wire::Reply> reply) {
    absl::Status status = reply.ok() ? ReplyStatus(*reply) : reply.status();
    // The host refused the run (its reply is the error): its other hosts
    // started their parts, which wait for it (a transfer it never sends, a
    // collective it never joins). They let go of the run now.
    if (reply.ok() && !status.ok()) run->rc->CancelRunOn(*run, host, status);
    const bool replied = status.ok();
    // Before the buffers complete: whoever sees them ready sees the gangs
    // in the timeline and the accounts, as in process.
    if (status.ok()) {
      for (const wire::StepTime& t : reply->run().times()) {
        run->rc->RecordPart(*run, host, static_cast<int>(t.step()), t.start_ns(), t.end_ns());
      }
    }
    {
      MutexLock lock(&run->mu);
      if (!status.ok()) {
        if (run->whole.ok()) run->whole = std::move(status);
      } else {
        for (const wire::FailedBuffer& f : reply->run().failed()) {
          // Each host of a gang reports the gang's outputs failed. A host
          // whose part could run says only that another one could not
          // (Aborted: host_groups.cc): the other host's error, the cause
          // (a failed device's), is the buffer's, whichever came first.
          absl::Status error = FromWire(f.status());
          auto [it, first] = run->failed.try_emplace(f.buffer_id(), error);
          if (!first && it->second.code() == absl::StatusCode::kAborted &&
              error.code() != absl::StatusCode::kAborted) {
            it->second = std::move(error);
          }
        }
      }
    }
    // A gang's collectives that failed may have broken its hosts' group.
    if (replied) {
      for (const wire::FailedBuffer& f : reply->run().failed()) {
        const auto code = static_cast<absl::StatusCode>(f.status().code());
        if (code != absl::StatusCode::kUnavailable && code != absl::StatusCode::kDeadlineExceeded) continue;
        run->rc->GroupMayHaveBroken(*run, run->StepOf(f.buffer_id()));
      }
    }
    if (run->pending.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    Finish(*run);
  }

  // Completes the buffers the run made: the program's outputs last, once
  // the run has dropped the others, so whoever sees an output ready also
  // sees the memory of the buffers nobody else holds returned (as a gang
  // task drops its inputs before completing its outputs).
  static void Finish(Run& run) {
    if (run.finished.exchange(true, std::memory_order_acq_rel)) return;
    ReadyList none;  // nothing in this process waits on a remote buffer's list
    std::vector<std::shared_ptr<ShardedBuffer>> made;
    absl::Status whole;
    absl::flat_hash_map<uint64_t, absl::Status> failed;
    {
      MutexLock lock(&run.mu);
      made.swap(run.made);
      whole = run.whole;
      failed.swap(run.failed);
    }
    const std::vector<bool>& is_output = run.plan->slot_is_output;
    // Two passes, no reordering: the others first, then the outputs.
    for (const bool outputs : {false, true}) {
      for (auto& buffer : made) {
        if (buffer == nullptr || is_output[buffer->remote_id() - run.first] != outputs) continue;
        Complete(run, buffer, whole, failed, &none);
        buffer.reset();
      }
    }
    if (!run.admitted_islands.empty()) run.rc->Released(run.admitted_islands);
    if (run.seq >= 0) run.rc->Retire(run);
  }

  // Fails a run that was never sent to its hosts (cancelled: `reason`).
  static void FinishUnsent(Run& run, absl::string_view reason) {
    {
      MutexLock lock(&run.mu);
      run.whole = absl::CancelledError(
          absl::StrCat("program '", run.program->name(), "' was cancelled before it was sent: ", reason));
    }
    Finish(run);
  }

  // The step that makes buffer `id` of this run (-1: none).
  int StepOf(uint64_t id) const {
    if (single_step >= 0) return single_step;
    if (id < first || id - first >= plan->slot_step.size()) return -1;
    return plan->slot_step[id - first];
  }

  // Completes one buffer the run made: ready (counted in the transfer
  // statistics if a transfer made it), or failed with the run's error.
  static void Complete(Run& run, const std::shared_ptr<ShardedBuffer>& buffer, const absl::Status& whole,
                       const absl::flat_hash_map<uint64_t, absl::Status>& failed, ReadyList* none) {
    absl::Status status = whole;
    if (status.ok()) {
      auto it = failed.find(buffer->remote_id());
      if (it != failed.end()) status = it->second;
    }
    if (!status.ok()) {
      buffer->SetError(std::move(status), none);
      return;
    }
    TransferStats* stats = run.rc->services_.stats;
    if (auto c = run.copies.find(buffer->remote_id()); c != run.copies.end() && stats != nullptr) {
      const bool dcn = c->second == LinkKind::kDcn;
      (dcn ? stats->dcn_bytes : stats->ici_bytes).fetch_add(buffer->total_bytes(), std::memory_order_relaxed);
      (dcn ? stats->dcn_transfers : stats->ici_transfers).fetch_add(1, std::memory_order_relaxed);
    }
    buffer->SetReady(none);
  }
};

// A run waiting for admission: SendRun's arguments.
struct RemoteCluster::Waiting {
  uint64_t program_id = 0;
  uint64_t first = 0;
  std::vector<wire::ArgBinding> bindings;
  std::shared_ptr<Run> run;
  double cost_ns = 0;
  std::vector<int> islands;
};

}  // namespace pw

#endif  // PATHWAYS_CLIENT_REMOTE_CLUSTER_INTERNAL_H_
