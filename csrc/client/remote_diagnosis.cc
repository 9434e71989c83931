// RemoteCluster's answer to pw.diagnose (scheduler/diagnosis.h) when hosts
// are processes: the gangs wait in the hosts' device queues, so each host
// describes its queues (DescribeQueues) and the client names what it finds
// through the runs it has in flight. Never on the dispatch path.

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <tuple>

#include "absl/container/flat_hash_set.h"
#include "csrc/base/dtype.h"
#include "csrc/base/mutex.h"
#include "csrc/base/spin.h"
#include "csrc/client/remote_cluster_internal.h"

namespace pw {
namespace {

// A gang by its run and step: (program id, first buffer id, step).
using GangKey = std::tuple<uint64_t, uint64_t, int>;

// The replies of every host asked, shared with the callbacks (which may
// come after a wait that gave up).
struct Answers {
  Mutex mu;
  CondVar cv;
  int left ABSL_GUARDED_BY(mu) = 0;
  std::vector<std::optional<wire::QueuesReply>> replies ABSL_GUARDED_BY(mu);
};

struct GangSeen {
  GangRef ref;
  bool at_head = true;  // on every host, at the head of all its devices' queues
  std::map<int, std::pair<GangKey, int>> blocked_by;  // device id -> (head, its host)
  std::map<int, uint64_t> pending;                    // input index -> buffer id
};

}  // namespace

void RemoteCluster::Describe(Diagnosis& diagnosis, int64_t timeout_ns, int64_t min_wait_ns, bool take) {
  const int64_t now = NowNanos();
  // The runs in flight, held while their names are used.
  absl::flat_hash_map<std::pair<uint64_t, uint64_t>, std::shared_ptr<Run>> runs;
  bool any_old_enough = false;
  {
    MutexLock lock(&runs_mu_);
    for (const auto& [key, weak] : runs_by_id_) {
      if (std::shared_ptr<Run> run = weak.lock()) {
        any_old_enough |= now - run->submitted_ns >= min_wait_ns;
        runs.emplace(key, std::move(run));
      }
    }
  }
  if (take) {  // forget the reported gangs of finished runs
    MutexLock lock(&reported_mu_);
    absl::erase_if(reported_, [&](const GangKey& key) {
      return !runs.contains(std::make_pair(std::get<0>(key), std::get<1>(key)));
    });
  }
  if (!any_old_enough) return;  // nothing has waited that long: no host is asked
  // Whether the gang `key`, waiting `waited_ns`, belongs in this diagnosis
  // (min_wait_ns, take).
  auto keep = [&](const GangKey& key, int64_t waited_ns) {
    if (waited_ns < min_wait_ns) return false;
    if (!take) return true;
    MutexLock lock(&reported_mu_);
    return reported_.insert(key).second;
  };
  absl::flat_hash_set<const Run*> unsent;
  {
    MutexLock lock(&admission_mu_);
    waiting_.ForEach([&](const std::unique_ptr<Waiting>& w) { unsent.insert(w->run.get()); });
  }
  // Every live host's queues, at once.
  auto answers = std::make_shared<Answers>();
  const int num_hosts = links_->num_hosts();
  {
    MutexLock lock(&answers->mu);
    answers->replies.resize(num_hosts);
  }
  for (int h = 0; h < num_hosts; ++h) {
    if (!links_->alive(h)) continue;
    {
      MutexLock lock(&answers->mu);
      ++answers->left;
    }
    wire::Request request;
    request.mutable_describe_queues();
    Send(h, std::move(request), [answers, h](absl::StatusOr<wire::Reply> reply) {
      MutexLock lock(&answers->mu);
      if (reply.ok() && reply->has_queues()) answers->replies[h] = std::move(*reply->mutable_queues());
      if (--answers->left == 0) answers->cv.SignalAll();
    });
    Flush(h);
  }
  std::vector<std::optional<wire::QueuesReply>> replies;
  {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::nanoseconds(timeout_ns);
    MutexLock lock(&answers->mu);
    while (answers->left > 0 && answers->cv.WaitUntil(&answers->mu, deadline)) {
    }
    replies = answers->replies;  // a host that did not answer in time is left out
  }

  // The gang of step `step` of `run`, named.
  auto ref_of = [&](const Run& run, int step, GangState state) {
    GangRef ref;
    const DeviceList* devices = run.plan->step_devices[step];
    ref.island = devices->island() != nullptr ? devices->island()->id() : 0;
    ref.id = run.first_gang + (run.single_step >= 0 ? 0 : step);
    ref.program = run.program->name();
    ref.node = run.plan->step_fns[step]->name();
    ref.client = run.client != nullptr ? run.client->name() : DefaultClientName();
    ref.devices = devices;
    ref.state = state;
    return ref;
  };
  // A host's step index of a part, as the program's.
  auto global_step = [&](const Run& run, int host, uint32_t step) -> int {
    if (run.single_step >= 0) return step == 0 ? run.single_step : -1;
    const std::vector<int>& steps = run.plan->host_steps[host];
    if (step >= steps.size()) return -1;
    const int g = steps[step];
    return run.plan->step_fns[g] != nullptr ? g : -1;
  };

  std::map<GangKey, GangSeen> gangs;
  for (int h = 0; h < num_hosts; ++h) {
    if (!replies[h].has_value()) continue;
    const wire::QueuesReply& r = *replies[h];
    std::vector<std::optional<GangKey>> keys(r.parts_size());
    for (int p = 0; p < r.parts_size(); ++p) {
      const wire::QueuedPart& part = r.parts(p);
      if (part.another_session()) continue;  // another tenant's: it only holds its place
      auto it = runs.find({part.program_id(), part.first_buffer_id()});
      if (it == runs.end()) continue;  // finished meanwhile
      const int step = global_step(*it->second, h, part.step());
      if (step < 0) continue;
      const GangKey key{part.program_id(), part.first_buffer_id(), step};
      keys[p] = key;
      GangSeen& seen = gangs[key];
      if (seen.ref.devices == nullptr) seen.ref = ref_of(*it->second, step, GangState::kQueued);
      for (int i = 0; i < part.pending_inputs_size() && i < part.pending_buffer_ids_size(); ++i) {
        seen.pending[static_cast<int>(part.pending_inputs(i))] = part.pending_buffer_ids(i);
      }
    }
    for (const wire::DeviceQueue& q : r.queues()) {
      if (q.parts_size() == 0) continue;
      const uint32_t head = q.parts(0);
      for (uint32_t p : q.parts()) {
        if (p >= keys.size() || !keys[p].has_value() || p == head) continue;
        GangSeen& seen = gangs[*keys[p]];
        seen.at_head = false;
        if (head < keys.size() && keys[head].has_value()) seen.blocked_by[q.device_id()] = {*keys[head], h};
      }
    }
  }
  for (auto& [key, seen] : gangs) {
    seen.ref.state = !seen.at_head           ? GangState::kQueued
                     : !seen.pending.empty() ? GangState::kHoldingDevices
                                             : GangState::kRunning;
  }

  // Who makes a buffer: the run whose slots hold its id, and the step that
  // fills that slot (a transfer: copy, named by its source's maker).
  auto maker_of = [&](uint64_t id, PendingInput& in) {
    for (const auto& [key, run] : runs) {
      const std::vector<int>& slot_step = run->plan->slot_step;
      if (id < run->first || id - run->first >= slot_step.size()) continue;
      int step = slot_step[id - run->first];
      if (step < 0) continue;
      if (run->single_step >= 0 && run->single_step != step) continue;  // another step's run
      {
        // Under the run's lock: Run::Finish drops the buffers, on a gRPC
        // thread, as the run's last host replies.
        MutexLock lock(&run->mu);
        for (const auto& made : run->made) {
          if (made == nullptr || made->remote_id() != id) continue;
          in.type = TypeToString(made->dtype(), made->dims());
          in.devices = made->devices();
        }
      }
      if (run->plan->step_fns[step] == nullptr) {  // a transfer: its source's maker
        in.copy = true;
        const wire::ProgramStep& ws = run->plan->step_wire[step];
        step = run->plan->slot_step[ws.transfer().src_slot()];
        if (step < 0) return;  // an argument: not made in flight
      }
      const GangKey gang{key.first, key.second, step};
      if (auto it = gangs.find(gang); it != gangs.end()) {
        in.producer = it->second.ref;
      } else {  // not queued on any host: still to be admitted, or finishing
        in.producer = ref_of(*run, step, unsent.contains(run.get()) ? GangState::kWaitingForAdmission
                                                                     : GangState::kRunning);
      }
      return;
    }
  };

  auto counts_of = [&](int island) -> IslandCounts& {
    for (IslandCounts& c : diagnosis.islands) {
      if (c.island == island) return c;
    }
    diagnosis.islands.push_back(IslandCounts{island});
    return diagnosis.islands.back();
  };
  for (auto& [key, seen] : gangs) {
    IslandCounts& counts = counts_of(seen.ref.island);
    if (seen.ref.state == GangState::kRunning) {
      ++counts.running;
      continue;
    }
    ++counts.queued;
    WaitingGang w;
    w.gang = seen.ref;
    w.waited_ns = now - runs.at({std::get<0>(key), std::get<1>(key)})->submitted_ns;
    if (!keep(key, w.waited_ns)) continue;
    // The heads it waits behind, each with the devices whose queues it heads.
    std::map<GangKey, std::vector<int>> heads;
    for (const auto& [device, head] : seen.blocked_by) heads[head.first].push_back(device);
    for (const auto& [head, devices] : heads) {
      auto it = gangs.find(head);
      if (it == gangs.end()) continue;
      w.blocked_by.push_back(QueueHead{it->second.ref, devices});
    }
    for (const auto& [index, id] : seen.pending) {
      PendingInput in;
      in.index = index;
      maker_of(id, in);
      if (in.devices == nullptr) in.devices = seen.ref.devices;
      w.inputs.push_back(std::move(in));
    }
    diagnosis.waiting.push_back(std::move(w));
  }
  // Runs still queued here: every compute step waits for admission.
  for (const auto& [key, run] : runs) {
    if (!unsent.contains(run.get())) continue;
    const Plan& plan = *run->plan;
    for (int step = 0; step < static_cast<int>(plan.step_fns.size()); ++step) {
      if (plan.step_fns[step] == nullptr || (run->single_step >= 0 && run->single_step != step)) continue;
      WaitingGang w;
      w.gang = ref_of(*run, step, GangState::kWaitingForAdmission);
      w.waited_ns = now - run->submitted_ns;
      IslandCounts& counts = counts_of(w.gang.island);
      ++counts.queued;
      ++counts.waiting_for_admission;
      if (!keep(GangKey{key.first, key.second, step}, w.waited_ns)) continue;
      diagnosis.waiting.push_back(std::move(w));
    }
  }
  std::stable_sort(diagnosis.waiting.begin(), diagnosis.waiting.end(),
                   [](const WaitingGang& a, const WaitingGang& b) { return a.waited_ns > b.waited_ns; });
}

}  // namespace pw
