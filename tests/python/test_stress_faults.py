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


def test_back_pressure_closing_clients_and_a_device_failure(python_subprocess):
    """Small devices, so dispatch keeps waiting for memory; clients close
    while their work is in flight; a device fails. Every result is right or
    a typed error for its cause; memory comes back to zero."""
    out = python_subprocess(
        """
import gc, random, threading, time
import numpy as np
import pathways as pw

pw.configure(device_memory="1MiB", islands=1, hosts_per_island=2, devices_per_host=4)
N_THREADS, N_ITER = 6, 150
slices = [pw.make_virtual_device_set().add_slice(tpu_devices=2).tpus for _ in range(N_THREADS)]
steps = [pw.pmap(lambda x: pw.simulated_compute(x + 1., 300), devices=s) for s in slices]
victim = slices[1][0].physical
wrong, unexpected, hung, closed_seen, failed_seen, waited = [], [], [], [0], [0], [0]

def client(t):
    rng = random.Random(t)
    c = pw.Client(f"c{t}")
    close_at = rng.randrange(20, N_ITER) if t % 2 == 0 else None
    try:
        with c:
            x0 = float(t)
            x = pw.device_put(np.full((2, 25000), x0, np.float32), slices[t])  # 100 KB per device
            for i in range(1, N_ITER + 1):
                if close_at is not None and i == close_at:
                    threading.Thread(target=c.close).start()  # from another thread, mid-flight
                try:
                    x = steps[t](x)
                except RuntimeError as e:
                    if "is closed" in str(e):
                        closed_seen[0] += 1
                        return
                    raise
                if t == 1 and i == N_ITER // 3:
                    third.set()  # the device fails under this thread's chain
                if i % 10 == 0:
                    got = np.asarray(x)
                    if not np.all(got == x0 + i):
                        wrong.append((t, i, got.ravel()[:2]))
    except pw.DeletedBufferError as e:
        if "was closed" in str(e):
            closed_seen[0] += 1
        else:
            unexpected.append((t, repr(e)))
    except pw.DeviceFailedError as e:
        if any(d.physical.id == victim.id for d in slices[t]) and f"device {victim.id} " in str(e):
            failed_seen[0] += 1
        else:
            unexpected.append((t, repr(e)))
    except pw.PathwaysError as e:
        if "was closed" in str(e) or "was cancelled" in str(e):
            closed_seen[0] += 1
        else:
            unexpected.append((t, repr(e)))
    except Exception as e:
        unexpected.append((t, repr(e)))

def watch():
    end = time.time() + 60
    while time.time() < end and not done.is_set():
        waited[0] = max(waited[0], pw.memory_stats()["dispatches_waiting_for_memory"])
        time.sleep(0.002)

def injector():
    third.wait(60)
    pw.testing.fail_device(victim)

done, third = threading.Event(), threading.Event()
threads = [threading.Thread(target=client, args=(t,)) for t in range(N_THREADS)]
extra = [threading.Thread(target=watch), threading.Thread(target=injector)]
for th in threads + extra:
    th.start()
for th in threads:
    th.join(120)
    if th.is_alive():
        hung.append(th.name)
done.set()
for th in extra:
    th.join(60)
gc.collect()
end = time.time() + 10
while pw.memory_stats()["bytes_in_use"] and time.time() < end:
    time.sleep(0.01)
print("wrong", wrong[:2])
print("unexpected", unexpected[:2])
print("hung", hung)
print("closed clients seen", closed_seen[0] > 0)
print("device failures seen", failed_seen[0] > 0)
print("dispatch waited for memory", waited[0] > 0)
print("memory back", pw.memory_stats()["bytes_in_use"], pw.memory_stats()["live_buffers"])
""",
        timeout=300,
    )
    assert out.splitlines() == [
        "wrong []",
        "unexpected []",
        "hung []",
        "closed clients seen True",
        "device failures seen True",
        "dispatch waited for memory True",
        "memory back 0 0",
    ]
