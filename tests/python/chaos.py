"""A chaos run (issue 28): clients train small models while hosts die and devices fail.

    python chaos.py SECONDS SEED

Host processes (2 islands x 4 hosts x 2 devices). For SECONDS, in threads:
  - three clients (pw.Client), each training a linear model by gradient
    descent on a slice of its own (float64; the weights stay on the slice,
    each step's output is read and checked against numpy); after a
    documented error each remaps its slice onto spare devices, or takes a
    new slice, and resumes from its last checked state;
  - a data-parallel job of four replicas (pw.elastic.DataParallel, as in
    examples/elastic_dp.py) with a global batch of 48 that must do at least
    60 steps and go on until the end, each step's weights checked against
    numpy, remapping or dropping lost replicas as it goes;
  - a driver that, at random, SIGKILLs a host process (at most 3), fails a
    device (pw.testing.fail_device, at most 3), or has a new host process
    take a killed one's place (pw.elastic.replace_host), after which the
    data-parallel job puts a dropped replica back (grow).
Then every buffer is dropped. Prints one JSON line: wrong results, errors
by type, undocumented errors, steps done, the DP job's steps, memory in use
at the start and at the end.
"""

import collections
import gc
import json
import os
import random
import signal
import sys
import threading
import time
import traceback

import numpy as np

import pathways as pw
import pathways.numpy

SECONDS = float(sys.argv[1]) if len(sys.argv) > 1 else 60.0
SEED = int(sys.argv[2]) if len(sys.argv) > 2 else 0
DP_STEPS = 60
FEATURES, PER_DEVICE, LR = 8, 4, 0.05
DOCUMENTED = (pw.DeviceFailedError, pw.ResourceExhaustedError)  # pw.HostLostError is a DeviceFailedError

pw.configure(hosts="local_processes", islands=2, hosts_per_island=4, devices_per_host=2)
baseline = pw.memory_stats()["bytes_in_use"]
lock = threading.Lock()
report = {"wrong": 0, "errors": collections.Counter(), "undocumented": [], "steps": 0, "dp_steps": 0,
          "kills": 0, "failed_devices": 0, "replacements": 0, "regrown": 0, "recoveries": 0}
stop = threading.Event()


def count_error(e):
    with lock:
        if isinstance(e, DOCUMENTED):
            report["errors"][type(e).__name__] += 1
        else:
            report["undocumented"].append("".join(traceback.format_exception_only(type(e), e)).strip())


def grad_step(w, x, y):
    """One device's least-squares gradient step, averaged over the slice."""
    g = x.T @ (x @ w - y) * (1.0 / x.shape[0])
    return w - LR * pw.pmean(g, "d")


def numpy_step(w, xs, ys):
    g = np.mean([x.T @ (x @ w - y) / x.shape[0] for x, y in zip(xs, ys)], axis=0)
    return w - LR * g


def data(rng, n):
    x = rng.standard_normal((n, PER_DEVICE, FEATURES))
    return x, x @ np.linspace(-1, 1, FEATURES) + 0.01 * rng.standard_normal((n, PER_DEVICE))


def new_slice(vds):
    try:
        return vds.add_slice(tpu_devices=2)
    except pw.ResourceExhaustedError as e:
        count_error(e)
        return None


def sgd_client(idx):
    rng = np.random.default_rng(SEED * 100 + idx)
    client = pw.Client(f"sgd{idx}")
    vds = pw.make_virtual_device_set()
    vslice = new_slice(vds)
    w_truth = np.zeros(FEATURES)
    while vslice is not None and not stop.is_set():
        step = pw.pmap(grad_step, axis_name="d", in_axes=(None, 0, 0), out_axes=None, devices=vslice.tpus)
        w = None
        try:
            with client:
                w = w_truth  # from the last checked state; then its replicated value on the slice
                while not stop.is_set():
                    x, y = data(rng, 2)
                    w = step(w, x, y)
                    expected = numpy_step(w_truth, x, y)
                    if not np.allclose(np.asarray(w), expected, rtol=1e-12, atol=1e-12):
                        with lock:
                            report["wrong"] += 1
                    w_truth = expected
                    with lock:
                        report["steps"] += 1
        except DOCUMENTED as e:
            count_error(e)
            del w
            try:
                pw.elastic.remap(vslice)
            except pw.ResourceExhaustedError as e2:
                count_error(e2)
                vslice = new_slice(vds)
            with lock:
                report["recoveries"] += 1
        except Exception as e:  # noqa: BLE001 - recorded as undocumented
            count_error(e)
            return
    client.close()


def dp_job():
    """pw.elastic.DataParallel over 4 replicas: at least DP_STEPS steps, each checked."""
    rng = np.random.default_rng(SEED * 100 + 99)
    client = pw.Client("dp")
    vds = pw.make_virtual_device_set()
    global_batch = 48
    w_truth = np.zeros(FEATURES)

    def loss_fn(p, batch):
        x, y = batch[:, :FEATURES], batch[:, FEATURES]
        return pw.numpy.mean((x @ p["w"] - y) ** 2) * 0.5

    def sgd(p, state, g):
        return {"w": p["w"] - LR * g["w"]}, state

    with client:
        job = pw.elastic.DataParallel(loss_fn, sgd, [vds.add_slice(tpu_devices=2) for _ in range(4)],
                                      {"w": w_truth}, {}, global_batch=global_batch)
        step = seen_replacements = 0
        while step < DP_STEPS or not stop.is_set():
            x = rng.standard_normal((global_batch, FEATURES))
            y = x @ np.linspace(-1, 1, FEATURES)
            try:
                job.step(np.concatenate([x, y[:, None]], 1))
                w_truth = w_truth - LR * (x.T @ (x @ w_truth - y) / global_batch)
                step += 1
                # One intact replica's weights against numpy.
                for s in job.replicas.slices:
                    try:
                        w = np.asarray(job.states[s.id][0]["w"])
                    except DOCUMENTED as e:
                        count_error(e)
                        continue
                    if not np.allclose(w, w_truth, rtol=1e-10, atol=1e-12):
                        with lock:
                            report["wrong"] += 1
                    break
                with lock:
                    report["dp_steps"] += 1
                    report["dp_replicas"] = len(job.replicas.slices)
                with lock:
                    replaced = report["replacements"]
                if job.replicas.dropped and replaced > seen_replacements:
                    # A replica dropped for want of devices comes back once
                    # there are some again (a host replaced).
                    seen_replacements = replaced
                    try:
                        job.grow()
                        with lock:
                            report["regrown"] += 1
                    except DOCUMENTED as e:
                        count_error(e)
            except DOCUMENTED as e:  # every replica lost, none remappable
                count_error(e)
                return
            except Exception as e:  # noqa: BLE001
                count_error(e)
                return
        with lock:
            report["dp_recoveries"] = sum(1 for _, what in job.events if what.startswith("remapped"))
        del job
    client.close()


def driver():
    rng = random.Random(SEED)
    kills = fails = 0
    while not stop.wait(rng.uniform(2.0, 6.0)):
        hosts = pw.hosts()
        alive = [h for h in hosts if h.alive]
        lost = [h for h in hosts if not h.alive]
        r = rng.random()
        if lost and r < 0.35:
            try:
                pw.elastic.replace_host(rng.choice(lost).id)
                with lock:
                    report["replacements"] += 1
            except Exception as e:  # noqa: BLE001 (a HostLostError if a host died during the join)
                count_error(e)
        elif r < 0.7 and kills < 3 and len(alive) > 4:
            victim = rng.choice(alive)
            os.kill(victim.pid, signal.SIGKILL)
            kills += 1
        elif fails < 3:
            healthy = [d for d in pw.devices() if not d.failed]
            pw.testing.fail_device(rng.choice(healthy))
            fails += 1
    with lock:
        report["kills"], report["failed_devices"] = kills, fails


start = time.monotonic()
threads = [threading.Thread(target=sgd_client, args=(i,)) for i in range(3)]
threads += [threading.Thread(target=dp_job), threading.Thread(target=driver)]
for t in threads:
    t.start()
while time.monotonic() < start + SECONDS and any(t.is_alive() for t in threads[:4]):
    time.sleep(0.2)
stop.set()
for t in threads:
    t.join(timeout=120)
report["seconds"] = round(time.monotonic() - start, 1)
gc.collect()
pw._core.await_quiescence()
for _ in range(100):  # host processes free what they are told on their own time
    if pw.memory_stats()["bytes_in_use"] == baseline:
        break
    time.sleep(0.05)
report["errors"] = dict(report["errors"])
report["memory_start"], report["memory_end"] = baseline, pw.memory_stats()["bytes_in_use"]
report["hung_threads"] = sum(t.is_alive() for t in threads)
print(json.dumps(report))
