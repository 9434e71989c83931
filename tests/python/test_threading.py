"""Many Python threads tracing and running programs at once; the GIL is released while blocking."""

import threading
import time

import numpy as np
import pytest

import pathways as pw


def run_threads(target, num_threads, timeout=120.0):
    """Runs `target(thread_index)` on threads started together; returns the errors."""
    errors = []
    barrier = threading.Barrier(num_threads)

    def body(t):
        try:
            barrier.wait(timeout=30)
            target(t)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append((t, repr(e)))

    threads = [threading.Thread(target=body, args=(t,), daemon=True) for t in range(num_threads)]
    for th in threads:
        th.start()
    deadline = time.monotonic() + timeout
    for th in threads:
        th.join(max(0.0, deadline - time.monotonic()))
    alive = [th.name for th in threads if th.is_alive()]
    assert not alive, f"threads still running after {timeout} s (hang?): {alive}"
    return errors


@pytest.mark.parametrize("num_threads, num_devices", [(8, 4), (4, 2), (2, 8)])
def test_threads_run_programs_on_overlapping_slices(num_threads, num_devices):
    iterations = 50
    done = []

    def worker(t):
        # Each thread has its own slice; with 8 slices of 4 on 16 devices the
        # slices share physical devices, so gangs of different threads interleave.
        tpus = pw.make_virtual_device_set().add_slice(tpu_devices=num_devices).tpus
        scale = pw.pmap(lambda x: x * float(t + 1) + pw.psum(x, "i"), devices=tpus, axis_name="i")
        norm = pw.pmap(lambda x: pw.psum(x * x, "i") - x, devices=tpus, axis_name="i")

        @pw.program
        def step(x):
            return norm(scale(x))

        for k in range(iterations):
            x = np.arange(num_devices, dtype=np.float64) + k + t
            h = x * (t + 1) + x.sum()
            expected = (h * h).sum() - h
            got = np.asarray(step(x))
            np.testing.assert_allclose(
                got, expected, rtol=1e-12, err_msg=f"thread {t} iteration {k}"
            )
            done.append(t)

    errors = run_threads(worker, num_threads)
    assert errors == []
    assert sorted(done) == sorted(list(range(num_threads)) * iterations)


def test_threads_share_functions_and_programs(devices_of):
    # One pmap'd function and one program, traced for the first time by all
    # threads at once (the cache fill is locked) and then run concurrently.
    tpus = devices_of(4)
    traces = []

    def body(x):
        traces.append(1)
        time.sleep(0.05)  # a slow trace: the other threads wait for it instead of tracing too
        return x - pw.psum(x, "i") / 4.0

    center = pw.pmap(body, devices=tpus, axis_name="i")
    double = pw.pmap(lambda x: x * 2.0, devices=devices_of(4))

    @pw.program
    def prog(x):
        return double(center(x)), center(x)

    def worker(t):
        for k in range(30):
            x = np.array([1.0, 2.0, 3.0, 6.0]) * (t + k + 1)
            a, b = prog(x)
            np.testing.assert_allclose(np.asarray(a), 2 * (x - x.mean()))
            np.testing.assert_allclose(np.asarray(b), x - x.mean())
            np.testing.assert_allclose(np.asarray(center(x)), x - x.mean())

    errors = run_threads(worker, 8)
    assert errors == []
    assert len(traces) == 1  # traced once for the one signature


def test_threads_op_by_op(devices_of):
    fns = [pw.pmap(lambda x, k=k: x + float(k), devices=devices_of(2)) for k in range(4)]

    def worker(t):
        x = np.array([float(t), 0.0])
        for _ in range(100):
            for f in fns:
                x = f(x)
        np.testing.assert_array_equal(np.asarray(x), [t + 600.0, 600.0])

    assert run_threads(worker, 8) == []


class _Counter:
    """A Python thread that counts while the main thread blocks in the runtime.

    If the runtime held the GIL while blocking, the count could not advance.
    """

    def __init__(self):
        self.count = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.count += 1

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(10)
        assert not self._thread.is_alive()


def test_gil_released_while_blocking(devices_of):
    tpus = devices_of(2)

    # Long enough to observe (over 20 ms) in the interpreter, which runs both
    # calls below: native code is compiled only after a second run.
    def chain(x):
        for _ in range(60):
            x = x * 1.0000001 + 0.5
        return x

    f = pw.pmap(chain, devices=tpus)
    x = pw.device_put(np.ones((2, 4_000_000)), tpus)
    f(x).block_until_ready()  # compile and warm up

    with _Counter() as counter:
        time.sleep(0.01)
        out = f(x)
        before = counter.count
        start = time.perf_counter()
        out.block_until_ready()
        waited = time.perf_counter() - start
        advanced = counter.count - before
    assert waited > 0.02, f"the computation finished too quickly to test ({waited:.4f} s)"
    # With the GIL held while blocking, the counter could not advance at all.
    assert advanced > 10_000, f"counter advanced only {advanced} in {waited:.3f} s"
    np.testing.assert_allclose(
        np.asarray(out)[:, :3], np.asarray(chain(np.ones((2, 3)))), rtol=1e-12
    )


def test_gil_released_in_await_quiescence(devices_of):
    from pathways import _core

    tpus = devices_of(2)

    def chain(x):
        for _ in range(15):
            x = x + 1.0
        return x

    f = pw.pmap(chain, devices=tpus)
    x = pw.device_put(np.zeros((2, 4_000_000)), tpus)
    f(x).block_until_ready()
    with _Counter() as counter:
        out = f(x)
        before = counter.count
        start = time.perf_counter()
        _core.await_quiescence()
        waited = time.perf_counter() - start
        advanced = counter.count - before
    assert out.is_ready()
    if waited > 0.02:
        assert advanced > 10_000, f"counter advanced only {advanced} in {waited:.3f} s"


def test_first_use_from_many_threads_at_once(request):
    # The runtime starts on the first call, whichever thread makes it. With
    # host processes, starting them takes the GIL back while the runtime's
    # start lock is held; another thread's first call used to wait for that
    # lock holding the GIL: both hung. A fresh process, so that the calls
    # below are the first.
    from conftest import run_python

    hosts = request.config.getoption("--hosts")
    from conftest import hosts_env

    # A service's tenant connects on its first use, like a runtime starting.
    env = hosts_env(hosts) or {}
    configure = f"pw.configure(server={env['PATHWAYS_SERVER']!r})" if hosts == "service" else \
        f"pw.configure(hosts={hosts!r})"
    out = run_python(
        f"""
import threading
import numpy as np
import pathways as pw
{configure}
results = []

def first_call(t):
    with pw.Client(f"client{{t}}"):
        tpus = pw.make_virtual_device_set().add_slice(tpu_devices=2).tpus
        results.append(np.asarray(pw.pmap(lambda x: x + t, devices=tpus)(np.zeros(2))).tolist())

threads = [threading.Thread(target=first_call, args=(t,), daemon=True) for t in range(12)]
for th in threads:
    th.start()
for th in threads:
    th.join(60)
print(sum(th.is_alive() for th in threads), sorted(results) == [[float(t)] * 2 for t in range(12)])
""",
        timeout=120,
    )
    assert out.split() == ["0", "True"]
