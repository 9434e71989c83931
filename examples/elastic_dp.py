# %% [markdown]
# # Data-parallel training that outlives a host (paper §4.1, `pw.elastic`)
#
# Four replicas of a small LM, one per host process, two hosts per island,
# train data parallel on a global batch of 32 sequences: each replica takes
# the loss and gradients of its share on its 2 devices (`pw.pmean` over ICI),
# and every replica adds up all replicas' gradients, weighted by their
# shares (the runtime moves them between slices: ICI inside an island, DCN
# across), then takes the Adam step. One `@pw.program` per step.
#
# Mid-run, a host process is killed (SIGKILL). The step in flight fails with
# `pw.HostLostError`, which names the failed devices and lost slices. The job
# does not read a checkpoint: `pw.elastic.DataParallel` drops the lost
# replica, copies nothing (the survivors' state is intact: the failed step
# changed none of it, buffers being immutable), re-splits the same global
# batch over the 3 replicas left (12 + 10 + 10) and redoes the step. Later, a new
# host process takes the lost one's place (`pw.elastic.replace_host`: it
# joins the running cluster, the others never stop), the dropped replica's
# slice is back on its devices, the state is copied there from a survivor,
# device to device, and the job is back to 4 replicas.
#
# The check: the losses follow a run without the failure step for step (same
# global batch, same data) to 1e-4, training resumes within 5 s of the kill,
# and the loss falls. The script prints the timeline of the recovery and
# exits with code 1 if a check fails. `--quick`: fewer steps.

# %%
import os
import signal
import sys
import time

import numpy as np

import pathways as pw

import lm  # examples/lm.py: the transformer's pieces and Adam

QUICK = "--quick" in sys.argv
STEPS = 12 if QUICK else 24
KILL_AT, REJOIN_AT = (4, 8) if QUICK else (8, 16)
VOCAB, SEQ, D_MODEL, HEADS, BLOCKS = 64, 16, 32, 2, 2
GLOBAL_BATCH = 32
RTOL = 1e-4

# 2 islands x 2 hosts x 2 devices: a replica on each host, no spare devices.
pw.configure(hosts="local_processes", islands=2, hosts_per_island=2, devices_per_host=2)
vds = pw.make_virtual_device_set()
slices = [vds.add_slice(tpu_devices=2) for _ in range(4)]
print("replicas:", ", ".join(f"slice {s.id} on host {s.physical_devices[0].host} (island {s.island})"
                             for s in slices))


def init_params(seed=0):
    return lm.init_lm(VOCAB, SEQ, D_MODEL, BLOCKS, seed)


def loss_fn(p, tokens):
    return lm.lm_loss(p, tokens, HEADS)


tokens_all = lm.permutation_tokens(STEPS, GLOBAL_BATCH, SEQ, VOCAB)
init = init_params()

# %% [markdown]
# ## The job: `pw.elastic.DataParallel`
#
# It keeps the state per replica slice and builds one `@pw.program` per step
# for the replicas it has (each replica's loss and gradients on its share,
# then every replica combines all gradients, weighted by the shares, and
# takes the Adam step). When a step fails with `pw.DeviceFailedError`, it
# remaps or drops the lost replicas, re-splits the global batch and runs the
# step again. Functions placed on a remapped slice are kept: its programs
# re-lower, nothing is retraced.

# %%
def new_job(on_event=None):
    return pw.elastic.DataParallel(loss_fn, lm.adam, slices, init, lm.zero_adam(init),
                                   global_batch=GLOBAL_BATCH, remap_onto_spares=False, on_event=on_event)


# %% [markdown]
# ## The reference: the same job without a failure

# %%
t0 = time.perf_counter()
job = new_job()
reference = [job.step(tokens_all[step]) for step in range(STEPS)]
print(f"reference: {STEPS} steps on 4 replicas in {time.perf_counter() - t0:.2f} s")
del job

# %% [markdown]
# ## The same job, a host killed mid-run
#
# The kill comes once step KILL_AT is dispatched and running. The job drops
# the lost replica (there are no spare devices to remap it onto) and goes
# on with 3. Before step REJOIN_AT a new host process replaces the killed
# one (`replace_host`), and `grow` puts the dropped replica back on that
# host's devices, its state copied there from a survivor.

# %%
victim = {h.id: h for h in pw.hosts()}[slices[1].physical_devices[0].host]
kill = {}


def kill_victim():
    os.kill(victim.pid, signal.SIGKILL)
    kill["t"] = time.perf_counter()
    job.note(f"host {victim.id} (pid {victim.pid}, replica slice {slices[1].id}) killed while step "
             f"{KILL_AT} runs")


job = new_job(on_event=lambda line: print(" ", line))
losses, recovery_s = [], None
for step in range(STEPS):
    if step == REJOIN_AT:
        t = time.perf_counter()
        pw.elastic.replace_host(victim.id)  # a new process joins the running cluster
        new = {h.id: h for h in pw.hosts()}[victim.id]
        job.note(f"host {victim.id}: a new process (pid {new.pid}) took its place in "
                 f"{time.perf_counter() - t:.2f} s")
        back = job.grow()  # the dropped slice, on the new process's devices
        job.note(f"step {step}: slice {back.id} is back on host {back.physical_devices[0].host}, "
                 f"its state copied from a survivor")
    losses.append(job.step(tokens_all[step], after_dispatch=kill_victim if step == KILL_AT else None))
    if step == KILL_AT:
        recovery_s = time.perf_counter() - kill["t"]
        job.note(f"step {step}: done on {len(job.replicas.slices)} replicas, {recovery_s:.2f} s after the kill")
job.note(f"step {STEPS - 1}: done; {len(job.replicas.slices)} replicas")

# %% [markdown]
# ## Results

# %%
worst = lm.compare_losses("with the kill", losses, "without", reference)
print(f"\nrecovery: {recovery_s:.2f} s from the kill to the next completed step (no checkpoint read)")
print(f"max relative difference of the losses: {worst:.2e}")
ok = worst <= RTOL and recovery_s < 5.0 and losses[-1] < losses[0]
ok = ok and len(job.replicas.slices) == 4 and not job.replicas.dropped
rejoined = {h.id: h for h in pw.hosts()}[victim.id]
ok = ok and rejoined.alive and rejoined.pid != victim.pid
if not ok:
    print("FAILED: the losses left the reference's curve, recovery took 5 s or more, the loss did not "
          "fall, or the job did not get its fourth replica back on a new host process")
    sys.exit(1)
print("OK: training went on through the loss of a host, on the same curve")
