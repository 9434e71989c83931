"""Stress: clients, deletes from other threads, and an injected failure (issue 9).

Eight client threads run programs (psum and simulated time over slices that
share devices) and check every result; reader threads read buffers while
their owners delete them; halfway, a device fails. Every result is either
right or, for work on the failed device only, a DeviceFailedError; nothing
hangs (every join is bounded) and device memory returns to where it started.
A device failure lasts for the runtime's life, so this runs in a subprocess.
"""

from __future__ import annotations


def test_clients_deletes_and_a_device_failure(python_subprocess):
    out = python_subprocess(
        """
import gc, queue, random, threading, time
import numpy as np
import pathways as pw

baseline = pw.memory_stats()["bytes_in_use"]
N_THREADS, N_ITER = 8, 400
slices = [pw.make_virtual_device_set().add_slice(tpu_devices=4).tpus for _ in range(N_THREADS)]

def make(t, tpus):
    f = pw.pmap(lambda x: pw.psum(x + t, "i"), devices=tpus, axis_name="i")
    g = pw.pmap(lambda x: pw.simulated_compute(x * 2., 200), devices=tpus)
    @pw.program
    def prog(x):
        return g(f(x))
    return prog

progs = [make(t, s) for t, s in enumerate(slices)]
victim = slices[0][1].physical
wrong, failed_ok, failed_bad, hung = [], [0], [], []
reads = queue.Queue()
half = threading.Event()

def on_failed_device(tpus):
    return any(d.physical.id == victim.id for d in tpus)

def client(t):
    rng = random.Random(t)
    with pw.Client(f"client{t}", weight=1 + t % 3):
        for i in range(N_ITER):
            if i == N_ITER // 2 and t == 0:
                half.set()
            x = np.array([rng.random() for _ in range(4)])
            try:
                y = progs[t](x)
                if rng.random() < 0.3:
                    reads.put(y)  # a reader reads it while we delete it
                    y.delete()
                    continue
                got = np.asarray(y)
            except pw.DeviceFailedError as e:
                if on_failed_device(slices[t]) and f"device {victim.id} " in str(e):
                    failed_ok[0] += 1
                else:
                    failed_bad.append((t, str(e)))
                continue
            want = 2 * (x.sum() + 4 * t)
            if not np.allclose(got, want):
                wrong.append((t, i, got, want))

def reader():
    while True:
        y = reads.get()
        if y is None:
            return
        try:
            np.asarray(y)
        except (pw.DeletedBufferError, pw.DeviceFailedError):
            pass

def injector():
    half.wait(60)
    pw.testing.fail_device(victim)

threads = [threading.Thread(target=client, args=(t,)) for t in range(N_THREADS)]
readers = [threading.Thread(target=reader) for _ in range(2)]
inj = threading.Thread(target=injector)
for th in threads + readers + [inj]:
    th.start()
for th in threads + [inj]:
    th.join(120)
    if th.is_alive():
        hung.append(th.name)
for _ in readers:
    reads.put(None)
for th in readers:
    th.join(60)
    if th.is_alive():
        hung.append(th.name)
gc.collect()
pw._core.await_quiescence()
print("wrong", len(wrong), wrong[:2])
print("bad failures", failed_bad[:2])
print("hung", hung)
print("failures on the failed device seen", failed_ok[0] > 0)
print("memory back", pw.memory_stats()["bytes_in_use"] == baseline)
""",
        timeout=300,
    )
    assert out.splitlines() == [
        "wrong 0 []",
        "bad failures []",
        "hung []",
        "failures on the failed device seen True",
        "memory back True",
    ]
