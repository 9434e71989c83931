"""Elastic re-mapping (paper §4.1) and data-parallel replicas that outlive a host (pw.elastic).

A failed device stays failed, so each case that fails one runs in a fresh
subprocess, with the hosts of the suite's mode (`--hosts`), as test_faults.
"""

from __future__ import annotations

import numpy as np
import pytest

import pathways as pw

_PRELUDE = """
import os, signal, numpy as np
import pathways as pw
traces = []
def counted(x):
    traces.append(1)   # runs once per trace, not per call
    return x * 2. + 1.
"""


@pytest.fixture
def run_elastic(request):
    """Runs code after _PRELUDE in a fresh process with the suite's hosts; returns its stdout."""
    from conftest import runner_with_suite_hosts
    return runner_with_suite_hosts(request.config, _PRELUDE)


@pytest.mark.not_service("fault injection is the service's: a tenant may not fail devices every tenant shares")
def test_a_remapped_slice_runs_its_programs_on_spare_devices_without_retracing(run_elastic):
    out = run_elastic("""
vds = pw.make_virtual_device_set()
a, b = vds.add_slice(tpu_devices=2), vds.add_slice(tpu_devices=2)
f = pw.pmap(counted, devices=a.tpus)
g = pw.pmap(lambda x: pw.psum(x, "i"), axis_name="i", devices=b.tpus)

@pw.program
def two(x):
    return g(f(x))      # a, then b over DCN

x = np.arange(2.)
print(np.asarray(two(x)).tolist(), len(traces))
old = [d.id for d in a.physical_devices]
pw.testing.fail_device(a.physical_devices[1])
kept = f(np.ones(2))   # fails: made on the failed device
try:
    np.asarray(two(x))
except pw.DeviceFailedError as e:
    print(e.failed_devices == [old[1]], e.lost_slices == [a.id])
print(pw.elastic.lost_slices() == [a], pw.elastic.lost_leaves({"k": kept}))
moved = pw.elastic.remap()
print(moved == {a: [1]}, a.epoch, b.epoch, a.physical_devices[0].id == old[0], a.physical_devices[1].id not in old)
print(not any(d.failed for d in a.physical_devices), pw.elastic.lost_slices())
print(np.asarray(two(x)).tolist(), np.asarray(f(x)).tolist(), len(traces))
print([d.id for d in f(x).devices] == [d.id for d in a.physical_devices])
# Nothing else is lost now: remapping again moves nothing.
print(pw.elastic.remap(a, b) == {a: [], b: []})
""")
    assert out.splitlines() == [
        "[4.0, 4.0] 1",  # (0*2+1) + (1*2+1), traced once
        "True True",
        "True [\"['k']\"]",
        "True 1 0 True True",
        "True []",
        "[4.0, 4.0] [1.0, 3.0] 1",  # traced once: the remap re-lowered, not retraced
        "True",
        "True",
    ], out


@pytest.mark.not_service("fault injection is the service's: a tenant may not fail devices every tenant shares")
def test_a_slice_moves_to_another_island_or_says_why_it_cannot(run_elastic):
    out = run_elastic("""
topo = pw.topology()
per_island = topo["hosts_per_island"] * topo["devices_per_host"]
s = pw.make_virtual_device_set().add_slice(tpu_devices=per_island)   # a whole island
f = pw.pmap(lambda x: pw.psum(x, "i"), axis_name="i", devices=s.tpus)
island = s.island
pw.testing.fail_device(s.physical_devices[0])
pw.elastic.remap(s)
print(s.island != island, np.asarray(f(np.ones(per_island)))[0] == per_island)
for island_devices in ([d for d in pw.devices() if d.island == i] for i in range(topo["islands"])):
    pw.testing.fail_device(island_devices[-1])
try:
    pw.elastic.remap(s)
except pw.ResourceExhaustedError as e:
    print("remap of slice" in str(e), "healthy" in str(e))
# Unchanged, and the runtime still works on what is left.
print(s.epoch, pw.elastic.lost_slices() == [s])
t = pw.make_virtual_device_set().add_slice(tpu_devices=2)
print(np.asarray(pw.pmap(lambda x: x + 1., devices=t.tpus)(np.zeros(2))).tolist())
""")
    assert out.splitlines() == ["True True", "True True", "1 True", "[1.0, 1.0]"], out


@pytest.mark.not_service("fault injection is the service's: a tenant may not fail devices every tenant shares")
def test_replicas_drop_a_lost_replica_copy_the_state_and_resplit_the_batch(run_elastic):
    out = run_elastic("""
topo = pw.topology()
n = topo["devices_per_host"]
vds = pw.make_virtual_device_set()
slices = [vds.add_slice(tpu_devices=n) for _ in range(3)]
r = pw.elastic.Replicas(slices)
states = r.replicate({"w": np.arange(3, dtype=np.float32), "b": np.float32(2)})
print([np.asarray(s["w"]).shape for s in states], r.shares(6 * n))
for d in slices[1].physical_devices + [d for d in pw.devices() if d.id not in
                                        {x.id for s in slices for x in s.physical_devices}]:
    pw.testing.fail_device(d)      # slice 1's devices, and every spare: no remap possible
print(pw.elastic.lost_leaves(states[1]) == ["['b']", "['w']"], pw.elastic.lost_leaves(states[0]))
what = r.recover()
print(what["remapped"], what["dropped"] == [slices[1]], r.slices == [slices[0], slices[2]], r.dropped == [slices[1]])
lost_state = states[1]
before = pw.transfer_stats()
states = pw.block_until_ready(r.replicate(r.intact(states)))
after = pw.transfer_stats()
print([np.asarray(s["w"])[-1].tolist() for s in states], [float(np.asarray(s["b"])[0]) for s in states])
print([[d.id for d in s["w"].devices] == [d.id for d in sl.physical_devices] for s, sl in zip(states, r.slices)])
copies = sum(after[k] - before[k] for k in ("ici_transfers", "dcn_transfers"))
print(copies >= 2, after["host_bytes"] == before["host_bytes"])   # device to device, none through here
batch = np.arange(6 * n * 2).reshape(6 * n, 2)
parts = r.split(batch)
print(r.shares(6 * n), [p.shape for p in parts] == [(n, 3, 2), (n, 3, 2)], r.weights(6 * n))
print(np.array_equal(np.concatenate([p.reshape(-1, 2) for p in parts]), batch))
try:
    r.intact([lost_state])
except ValueError as e:
    print("restore from a checkpoint" in str(e))
""")
    lines = out.splitlines()
    n = pw.topology()["devices_per_host"]
    assert lines == [
        f"{[(n, 3)] * 3} {[2 * n] * 3}",
        "True []",
        "[] True True True",
        "[[0.0, 1.0, 2.0], [0.0, 1.0, 2.0]] [2.0, 2.0]",
        "[True, True]",
        "True True",
        f"{[3 * n, 3 * n]} True [0.5, 0.5]",
        "True",
        "True",
    ], out


def test_shares_split_a_global_batch_as_evenly_as_the_devices_allow():
    vds = pw.make_virtual_device_set()
    slices = [vds.add_slice(tpu_devices=2) for _ in range(3)]
    r = pw.elastic.Replicas(slices)
    assert r.shares(32) == [12, 10, 10]
    assert r.weights(32) == [12 / 32, 10 / 32, 10 / 32]
    parts = r.split(np.arange(32))
    assert [p.shape for p in parts] == [(2, 6), (2, 5), (2, 5)]
    assert np.array_equal(np.concatenate([p.ravel() for p in parts]), np.arange(32))
    with pytest.raises(ValueError, match="global batch of 31 does not split over replicas of 2 devices"):
        r.shares(31)


@pytest.mark.parametrize("call, error, message", [
    (lambda: pw.elastic.remap("slice 0"), TypeError, "pw.elastic.remap: expected a pw.VirtualSlice"),
    (lambda: pw.elastic.Replicas([]), ValueError, "slices is empty"),
    (lambda: pw.elastic.Replicas([pw.devices()[0]]), TypeError, "expected a pw.VirtualSlice"),
])
def test_bad_arguments_name_the_problem(call, error, message, runtime_ok):
    with pytest.raises(error, match=message):
        call()


def test_replicas_of_different_sizes_are_refused():
    vds = pw.make_virtual_device_set()
    with pytest.raises(ValueError, match=r"one size, got sizes \[1, 2\]"):
        pw.elastic.Replicas([vds.add_slice(tpu_devices=1), vds.add_slice(tpu_devices=2)])


def test_a_killed_host_process_is_reported_and_its_slice_remapped_onto_a_spare_host():
    """Host processes of their own (whatever the suite's mode): SIGKILL one, remap, go on."""
    from conftest import run_python
    out = run_python(_PRELUDE + """
pw.configure(hosts="local_processes", islands=1, hosts_per_island=3, devices_per_host=2)
vds = pw.make_virtual_device_set()
a, b = vds.add_slice(tpu_devices=2), vds.add_slice(tpu_devices=2)   # hosts 0 and 1; host 2 spare
f = pw.pmap(counted, devices=a.tpus)
g = pw.pmap(lambda x: pw.psum(x, "i"), axis_name="i", devices=b.tpus)

@pw.program
def two(x):
    return g(f(x))

x = np.arange(2.)
print(np.asarray(two(x)).tolist())
victim = {h.id: h for h in pw.hosts()}[b.physical_devices[0].host]
os.kill(victim.pid, signal.SIGKILL)
try:
    for _ in range(100):      # the loss may land between two runs
        np.asarray(two(x))
except pw.HostLostError as e:
    print(sorted(e.failed_devices) == sorted(d.id for d in pw.devices() if d.host == victim.id),
          e.lost_slices == [b.id])
print(pw.elastic.remap() == {b: [0, 1]}, {d.host for d in b.physical_devices} == {2})
print(np.asarray(two(x)).tolist(), len(traces))
print([h.alive for h in pw.hosts()])
""", timeout=120)
    assert out.splitlines() == [
        "[4.0, 4.0]",
        "True True",
        "True True",
        "[4.0, 4.0] 1",
        "[True, False, True]",
    ], out


def test_a_new_host_process_takes_a_killed_hosts_place():
    """Host processes of their own: SIGKILL one, then a new process takes its
    place; programs on its devices run again (gangs, transfers) without a
    retrace, and what was on the killed process stays lost."""
    from conftest import run_python
    out = run_python(_PRELUDE + """
pw.configure(hosts="local_processes", islands=1, hosts_per_island=2, devices_per_host=2)
vds = pw.make_virtual_device_set()
a, b = vds.add_slice(tpu_devices=2), vds.add_slice(tpu_devices=2)   # hosts 0 and 1
both = vds.add_slice(tpu_devices=4)
f = pw.pmap(counted, devices=a.tpus)
g = pw.pmap(lambda x: pw.psum(x, "i"), axis_name="i", devices=b.tpus)
h = pw.pmap(lambda x: pw.psum(x, "i"), axis_name="i", devices=both.tpus)

@pw.program
def two(x):
    return g(f(x))      # host 0, then host 1

x = np.arange(2.)
print(np.asarray(two(x)).tolist(), np.asarray(h(np.arange(4.))).tolist())
kept = g(x).block_until_ready()   # on host 1
victim = {v.id: v for v in pw.hosts()}[1]
os.kill(victim.pid, signal.SIGKILL)
try:
    for _ in range(100):
        np.asarray(two(x))
except pw.HostLostError as e:
    print(sorted(e.failed_devices) == [2, 3])
for bad, error in [("1", TypeError), (7, ValueError), (0, RuntimeError)]:
    try:
        pw.elastic.replace_host(bad)
    except error as e:
        print(type(e).__name__, str(e).split(": ", 1)[1][:48])
pw.elastic.replace_host(1)
new = {v.id: v for v in pw.hosts()}[1]
print(new.alive, new.pid != victim.pid, [d.failed for d in pw.devices()])
for _ in range(3):
    print(np.asarray(two(x)).tolist(), np.asarray(h(np.arange(4.))).tolist(), len(traces))
print(pw.elastic.is_lost(kept), pw.elastic.lost_leaves([kept, g(x)]))
try:
    np.asarray(kept)
except pw.HostLostError as e:
    print("HostLostError", "host 1's earlier process, which was lost" in str(e))
""", timeout=180)
    assert out.splitlines() == [
        "[4.0, 4.0] [6.0, 6.0, 6.0, 6.0]",
        "True",
        "TypeError host must be an int, got str",
        "ValueError host 7 is not in the cluster (of 2 hosts)",
        "RuntimeError host 0 is not lost: only a lost host's place can",
        "True True [False, False, False, False]",
        "[4.0, 4.0] [6.0, 6.0, 6.0, 6.0] 1",
        "[4.0, 4.0] [6.0, 6.0, 6.0, 6.0] 1",
        "[4.0, 4.0] [6.0, 6.0, 6.0, 6.0] 1",
        "True ['[0]']",
        "HostLostError True",
    ], out


def test_replace_host_needs_a_lost_host_process(runtime_ok):
    """In process there is no host process to replace; with host processes,
    host 0 is not lost; a service's tenant may not replace the service's."""
    with pytest.raises(RuntimeError, match="no host process to replace|is not lost|did not start its host"):
        pw.elastic.replace_host(0)


@pytest.mark.not_service("fault injection is the service's: a tenant may not fail devices every tenant shares")
@pytest.mark.parametrize("remap", [True, False])
def test_data_parallel_goes_on_through_a_failed_host_on_the_same_losses(run_elastic, remap):
    out = run_elastic(f"""
import pathways.numpy as pnp
rng = np.random.default_rng(0)
x_all = rng.standard_normal((6, 24, 5)).astype(np.float32)
y_all = x_all @ np.arange(5, dtype=np.float32)

def loss_fn(p, batch):
    x, y = batch[:, :5], batch[:, 5]
    return pnp.mean((x @ p["w"] + p["b"] - y) ** 2)

def sgd(p, state, g):
    return pw.tree_map(lambda a, b: a - 0.1 * b, p, g), {{"n": state["n"] + 1.0}}

def run(fail_at):
    vds = pw.make_virtual_device_set()
    slices = [vds.add_slice(tpu_devices=2) for _ in range(3)]
    job = pw.elastic.DataParallel(loss_fn, sgd, slices, {{"w": np.zeros(5, np.float32), "b": np.float32(0)}},
                                  {{"n": np.float32(0)}}, global_batch=24, remap_onto_spares={remap})
    fail = lambda: pw.testing.fail_host(slices[1].physical_devices[0].host)
    losses = [job.step(np.concatenate([x_all[i], y_all[i][:, None]], 1),
                       after_dispatch=fail if i == fail_at else None) for i in range(6)]
    return job, losses

ref_job, ref = run(None)
job, losses = run(2)
print(np.allclose(losses, ref, rtol=1e-5), losses[-1] < losses[0])
print(len(job.replicas.slices), [e[1].split(":")[0].split(" ")[0] for e in job.events])
print(job.replicas.shares(24))
state = job.states[job.replicas.slices[-1].id]
print(float(np.asarray(state[1]["n"])[0]), np.allclose(np.asarray(state[0]["w"])[0], np.asarray(ref_job.states[ref_job.replicas.slices[-1].id][0]["w"])[0], rtol=1e-5))
""")
    lines = out.splitlines()
    assert lines[0] == "True True", out
    if remap:  # onto spare devices: still 3 replicas
        assert lines[1:3] == ["3 ['DeviceFailedError', 'remapped']", "[8, 8, 8]"], out
    else:  # dropped: 2 replicas take the same global batch
        assert lines[1:3] == ["2 ['DeviceFailedError', 'remapped']", "[12, 12]"], out
    assert lines[3] == "6.0 True", out


@pytest.mark.not_service("fault injection is the service's: a tenant may not fail devices every tenant shares")
def test_data_parallel_recovers_when_the_replica_it_copies_from_is_lost_too(run_elastic):
    out = run_elastic("""
import pathways.numpy as pnp
rng = np.random.default_rng(1)
data = [np.concatenate([x, (x @ np.arange(4.0))[:, None]], 1) for x in rng.standard_normal((5, 12, 4))]

def loss_fn(p, batch):
    return pnp.mean((batch[:, :4] @ p["w"] - batch[:, 4]) ** 2)

def sgd(p, state, g):
    return {"w": p["w"] - 0.05 * g["w"]}, state

def job_on(n):
    vds = pw.make_virtual_device_set()
    slices = [vds.add_slice(tpu_devices=2) for _ in range(n)]
    return slices, pw.elastic.DataParallel(loss_fn, sgd, slices, {"w": np.zeros(4)}, {}, global_batch=12)

_, ref = job_on(3)
ref_losses = [ref.step(b) for b in data]
del ref, _   # its slices go: their devices are spare again
slices, job = job_on(3)
original, lost_sources = job.replicas.replicate, []
def replicate_after_losing_the_source(tree, onto=None):
    # The first replica a copy comes from is lost as the copy starts.
    leaves = pw.tree_leaves(tree)
    if onto is not None and leaves and not lost_sources:
        lost_sources.append(leaves[0].devices)
        pw.testing.fail_device(*leaves[0].devices)
    return original(tree, onto=onto)
job.replicas.replicate = replicate_after_losing_the_source
fail = lambda: pw.testing.fail_device(*slices[0].physical_devices)
losses = [job.step(b, after_dispatch=fail if i == 2 else None) for i, b in enumerate(data)]
print(np.allclose(losses, ref_losses, rtol=1e-9), len(job.replicas.slices))
print(any("during the recovery" in what for _, what in job.events))
print(all(not pw.elastic.lost_leaves(job.states[s.id]) for s in job.replicas.slices), len(lost_sources))
""")
    assert out.splitlines() == ["True 3", "True", "True 1"], out
