"""Suspend and resume of a client (issue 28, item 2): `Client.suspend()` moves
its buffers to host memory (or a checkpoint) and frees its devices;
`Client.resume()` brings them back, onto other devices where it must, and its
handles keep working.

Cases that need small devices or fail devices run in a fresh subprocess with
the suite's hosts (`--hosts`); the rest share the suite's runtime.
"""

from __future__ import annotations

import os
import re
import threading
import time

import numpy as np
import pytest

import pathways as pw
from conftest import hosts_env, run_python


def _ml_bfloat16():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    return ml_dtypes.bfloat16


def _settle(client, want: int = 0, what: str = "bytes_in_use") -> None:
    """Waits until `client` holds `want` bytes (or buffers, with what="live_buffers"): a gang may hold its
    outputs, and host arguments placed as the client's, a moment after they are ready."""
    deadline = time.time() + 10
    while getattr(client, what) != want and time.time() < deadline:
        time.sleep(0.001)
    assert getattr(client, what) == want


def test_values_dtypes_replication_and_shared_handles_come_back(tpus4):
    c = pw.Client("suspend-values")
    rng = np.random.default_rng(0)
    values = {
        "f32": rng.standard_normal((4, 3, 5)).astype(np.float32),
        "f64": rng.standard_normal((4, 7)),
        "i32": rng.integers(-1000, 1000, (4, 2)).astype(np.int32),
        "u32": rng.integers(0, 2**32, (4, 3), dtype=np.uint32),
        "bool": rng.random((4, 6)) < 0.5,
        "bf16": rng.standard_normal((4, 8)).astype(_ml_bfloat16()),
    }
    double = pw.pmap(lambda x: x * 2.0, devices=tpus4)
    with c:
        handles = {k: pw.device_put(v, tpus4) for k, v in values.items()}
        doubled = double(values["f32"])                       # a program's output
        same = np.ones((4, 5), np.float32) * np.arange(5, dtype=np.float32)
        mapped = pw.device_put(same, tpus4)
        view = pw._core.replicated_view(mapped, c._core)       # another handle on the same buffer
        replicated = pw.jit(lambda x: x + 1.0)(np.arange(6, dtype=np.float32))
    _settle(c, len(values) + 3, "live_buffers")
    before = c.bytes_in_use
    assert before > 0 and replicated.is_replicated and view.is_replicated
    ids = {k: id(h) for k, h in handles.items()}

    summary = c.suspend()
    assert c.suspended and "suspended" in repr(c)
    assert summary["buffers"] == len(values) + 3  # the view shares `mapped`'s buffer
    assert summary["bytes"] == before and summary["failed_buffers"] == 0 and summary["path"] is None
    assert summary["seconds"] >= 0
    _settle(c, 0)
    assert c.live_buffers == 0
    # Reading a suspended handle reads its host copy.
    for k, v in values.items():
        assert handles[k].is_suspended() and not handles[k].is_deleted()
        np.testing.assert_array_equal(np.asarray(handles[k]), v)
    np.testing.assert_array_equal(np.asarray(view), same[0])
    np.testing.assert_array_equal(np.asarray(replicated), np.arange(6) + 1.0)
    assert "suspended with client 'suspend-values'" in repr(doubled)

    summary = c.resume()
    assert not c.suspended and summary["buffers"] == len(values) + 3 and summary["moved"] == []
    assert summary["bytes"] == before and c.bytes_in_use == before
    for k, v in values.items():
        h = handles[k]
        assert id(h) == ids[k] and not h.is_suspended() and h.dtype == v.dtype
        assert h.devices == [d.physical for d in tpus4]
        np.testing.assert_array_equal(np.asarray(h), v)
    np.testing.assert_array_equal(np.asarray(doubled), values["f32"] * 2.0)
    np.testing.assert_array_equal(np.asarray(view), same[0])
    assert view.is_replicated and replicated.is_replicated and not mapped.is_replicated
    np.testing.assert_array_equal(np.asarray(replicated), np.arange(6) + 1.0)
    # They are device buffers again: programs take them.
    with c:
        np.testing.assert_array_equal(np.asarray(double(handles["f32"])), values["f32"] * 2.0)
        np.testing.assert_array_equal(np.asarray(pw.jit(lambda x: x * 3.0)(replicated)), (np.arange(6) + 1.0) * 3)
    c.close()


def test_training_loop_gives_the_same_numbers_with_a_suspension_in_the_middle(tpus4):
    def step(w, x):
        g = pw.psum(x * w, "i")
        return w - 0.1 * g * x

    train = pw.pmap(step, devices=tpus4, axis_name="i")
    x = np.linspace(-1, 1, 4 * 3, dtype=np.float32).reshape(4, 3)
    w0 = np.full((4, 3), 0.5, np.float32)

    def run(client, suspend_after=None, other=None):
        with client:
            w = pw.device_put(w0, tpus4)
            data = pw.device_put(x, tpus4)
            for i in range(6):
                w = train(w, data)
                if i == suspend_after:
                    client.suspend()
                    with pytest.raises(RuntimeError, match="is suspended: resume"):
                        train(w, data)
                    with other:  # another client uses the devices meanwhile
                        z = pw.device_put(np.ones((4, 3), np.float32), tpus4)
                        np.testing.assert_allclose(np.asarray(train(z, z)), np.full((4, 3), 0.6), rtol=1e-6)
                    assert client.resume()["buffers"] == 2
            return np.asarray(w)

    plain = run(pw.Client("train-plain"))
    other = pw.Client("train-other")
    suspended = run(pw.Client("train-suspended"), suspend_after=2, other=other)
    np.testing.assert_array_equal(suspended, plain)
    other.close()


def test_errors_name_the_client_and_say_what_to_do(tpus2, tmp_path, runtime_ok):
    c = pw.Client("errs")
    f = pw.pmap(lambda x: x + 1.0, devices=tpus2)
    with pytest.raises(RuntimeError, match="resume: client 'errs' is active, not suspended"):
        c.resume()
    with c:
        a = f(np.ones(2, np.float32))
        b = pw.device_put(np.zeros(2, np.float32), tpus2)
    c.suspend()
    with pytest.raises(RuntimeError, match="suspend: client 'errs' is suspended already"):
        c.suspend()
    with c:
        with pytest.raises(RuntimeError, match="client 'errs' is suspended: resume\\(\\) it before it runs program"):
            f(np.ones(2, np.float32))
        with pytest.raises(RuntimeError, match="client 'errs' is suspended: resume\\(\\) it before it places buffers"):
            pw.device_put(np.ones(2, np.float32), tpus2)
    # Its handles, passed to another client's (here the default's) program.
    with pytest.raises(RuntimeError, match="argument 0 of program .* of client 'errs', which is suspended"):
        f(a)
    with pytest.raises(RuntimeError, match="is suspended with its client 'errs'; resume\\(\\) the client"):
        a.devices
    with pytest.raises(RuntimeError, match="suspended with its client 'errs'; resume\\(\\) the client before you hold"):
        pw._core.another_handle(a)  # (what a checkpoint's save takes)
    assert a.is_ready() and a.block_until_ready() is a
    b.delete()  # drops its host copy
    assert b.is_deleted() and not b.is_suspended()
    with pytest.raises(pw.DeletedBufferError):
        np.asarray(b)
    assert c.resume()["buffers"] == 1  # `b` was deleted meanwhile
    np.testing.assert_array_equal(np.asarray(a), [2.0, 2.0])
    # A bad path leaves the client as it was.
    with pytest.raises(TypeError, match="suspend: path must be a str"):
        c.suspend(path=3)
    os.makedirs(tmp_path / "taken")
    with pytest.raises(FileExistsError):
        c.suspend(path=tmp_path / "taken")
    assert not c.suspended and not a.is_suspended()
    with c:
        np.testing.assert_array_equal(np.asarray(f(a)), [3.0, 3.0])
    # Closing a suspended client drops its host copies.
    c.suspend()
    assert c.close() == 1
    with pytest.raises(pw.DeletedBufferError, match="client 'errs' was closed"):
        np.asarray(a)
    with pytest.raises(RuntimeError, match="suspend: client 'errs' is closed"):
        c.suspend()
    with pytest.raises(RuntimeError, match="resume: client 'errs' is closed"):
        c.resume()
    runtime_ok()


def test_suspend_waits_for_the_clients_work_in_flight(tpus2):
    c = pw.Client("in-flight")
    slow = pw.pmap(lambda x: pw.simulated_compute(x * 2.0, 300_000), devices=tpus2)  # 0.3 s
    with c:
        x = pw.device_put(np.full(2, 3.0, np.float32), tpus2)
        y = slow(slow(x))
    assert not y.is_ready()
    assert c.suspend()["buffers"] == 2
    np.testing.assert_array_equal(np.asarray(y), [12.0, 12.0])
    _settle(c, 0)
    c.resume()
    np.testing.assert_array_equal(np.asarray(y), [12.0, 12.0])
    c.close()


def test_dispatches_under_way_in_other_threads_are_suspended_too(tpus2):
    # A host argument of 1 MiB or more is copied in without the GIL: the
    # suspension starts while some dispatches are inside; their outputs are
    # the client's and must be suspended with the rest.
    c = pw.Client("busy-threads")
    f = pw.pmap(lambda x: x[:4] * 2.0, devices=tpus2)
    x = np.ones((2, 300_000), np.float32)
    stop, outs, errors = threading.Event(), [], []

    def dispatch():
        while not stop.is_set():
            try:
                with c:
                    outs.append(f(x))
            except RuntimeError as e:
                if not re.match(r"client 'busy-threads' is (being )?(suspended|resumed): resume\(\) it", str(e)):
                    errors.append(repr(e))

    threads = [threading.Thread(target=dispatch) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        for _ in range(10):
            seen = len(outs)
            while len(outs) < seen + 3:
                time.sleep(0.001)
            c.suspend()
            n = len(outs)
            assert all(o.is_suspended() for o in outs[:n])
            _settle(c, 0)
            c.resume()
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    assert errors == []
    for o in outs:
        np.testing.assert_array_equal(np.asarray(o), np.full((2, 4), 2.0))
    c.close()


def test_a_reader_that_took_the_buffer_is_not_disturbed_by_suspend_and_resume(tpus4):
    c = pw.Client("readers")
    value = np.arange(4 * 300_000, dtype=np.float32).reshape(4, 300_000)  # 4.8 MB: read without the GIL
    with c:
        h = pw.device_put(value, tpus4)
    stop, errors, reads = threading.Event(), [], [0]

    def read():
        while not stop.is_set():
            try:
                if not np.array_equal(np.asarray(h), value):
                    errors.append("wrong value")
                reads[0] += 1
            except Exception as e:  # noqa: BLE001 - every error is a failure here
                errors.append(repr(e))

    threads = [threading.Thread(target=read) for _ in range(2)]
    for t in threads:
        t.start()
    for _ in range(15):
        c.suspend()
        c.resume()
    stop.set()
    for t in threads:
        t.join(timeout=60)
    assert errors == [] and reads[0] > 0
    np.testing.assert_array_equal(np.asarray(h), value)
    c.close()


def _suspend_to_path_code(path: str) -> str:
    return f"""
import numpy as np, pathways as pw
t = pw.make_virtual_device_set().add_slice(tpu_devices=4).tpus
c = pw.Client("to-disk")
v = np.arange(4 * 1000, dtype=np.float32).reshape(4, 1000)
with c:
    h = pw.device_put(v, t)
    r = pw._core.replicated_view(h, c._core)
    k = pw.device_put(np.arange(8, dtype=np.int32).reshape(4, 2), t)
s = c.suspend(path={path!r})
print(s["buffers"], s["bytes"], s["path"] == {path!r}, c.bytes_in_use)
try:
    np.asarray(h)
except RuntimeError as e:
    print("in a checkpoint" in str(e))
s = c.resume()
print(s["buffers"], s["moved"], c.bytes_in_use)
print(np.array_equal(np.asarray(h), v), np.array_equal(np.asarray(r), v[0]), r.is_replicated,
      np.array_equal(np.asarray(k), np.arange(8).reshape(4, 2)))
"""


def test_suspend_to_a_checkpoint(request, tmp_path):
    path = str(tmp_path / "suspended")
    hosts = request.config.getoption("--hosts")
    if hosts == "service":  # a tenant: written from its own process, the hosts being the service's
        configure = f"pw.configure(server={hosts_env('service')['PATHWAYS_SERVER']!r})\n"
    else:
        configure = "" if hosts == "in_process" else f"pw.configure(hosts={hosts!r})\n"
    out = run_python("import pathways as pw\n" + configure + _suspend_to_path_code(path)).splitlines()
    assert out == ["2 16032 True 0", "True", "2 [] 16032", "True True True True"], out
    assert os.path.isdir(path)  # left for the caller


def _run_small(request, code: str) -> list:
    """Runs `code` in a fresh process whose devices (or tenant) have 1 MiB each, with the suite's hosts."""
    hosts = request.config.getoption("--hosts")
    if hosts == "service":
        configure = f"pw.configure(server={hosts_env('service')['PATHWAYS_SERVER']!r}, memory='1MiB')\n"
    elif hosts == "local_processes":
        configure = "pw.configure(hosts='local_processes', device_memory='1MiB')\n"
    else:
        configure = "pw.configure(device_memory='1MiB')\n"
    return run_python("import time, numpy as np, pathways as pw\n" + configure + code, timeout=180).splitlines()


def test_freed_memory_serves_another_client_and_resume_moves_or_fails_cleanly(request):
    out = _run_small(request, """
t = pw.make_virtual_device_set().add_slice(tpu_devices=2).tpus   # where a's buffers are
old = [d.physical.id for d in t]
island = t[0].physical.island
rest = {d.id for d in pw.devices() if d.island == island and d.id not in old}
a, b = pw.Client("a"), pw.Client("b")
big = np.arange(2 * 150_000, dtype=np.float32).reshape(2, 150_000)   # 600 kB per device (of 1 MiB)
small = big[:, :10] * 2
with a:
    x = pw.device_put(big, t)
    y = pw.device_put(small, t)
try:
    with b:
        pw.device_put(big, t)          # does not fit next to a's
except pw.ResourceExhaustedError:
    print("full")
print(a.suspend()["buffers"], a.bytes_in_use, pw.memory_stats()["bytes_in_use"])
with b:
    z = pw.device_put(big + 1, t)      # fits now
print(float(np.asarray(z)[1, 5]))
# x comes back on other devices of the island (b holds its own now); y fits beside z and stays.
s = a.resume()
m = s["moved"]
print(len(m), m[0]["buffer"], m[0]["from"] == old, set(m[0]["to"]) <= rest, [d.id for d in x.devices] == m[0]["to"],
      [d.id for d in y.devices] == old)
print(np.array_equal(np.asarray(x), big), np.array_equal(np.asarray(y), small), a.bytes_in_use == s["bytes"])
# A program on x's old devices takes the moved buffer (copied there).
z.delete()
with a:
    print(np.array_equal(np.asarray(pw.pmap(lambda v: v[:10] * 2.0, devices=t)(x)), small))
# No room anywhere: resume fails at once, even with b's work in flight, and a keeps every value.
a.suspend()
slow = pw.pmap(lambda v: pw.simulated_compute(v + 1.0, 3_000_000), devices=t)  # 3 s
with b:
    fill = [pw.device_put(np.ones((1, 150_000), np.float32), [d]) for d in pw.devices()]
    busy = slow(np.ones((2, 10), np.float32))
start = time.monotonic()
try:
    a.resume()
except pw.ResourceExhaustedError as e:
    print("exhausted", "client 'a' stays suspended" in str(e), time.monotonic() - start < 2)
print(a.suspended, x.is_suspended(), y.is_suspended(), np.array_equal(np.asarray(x), big), a.bytes_in_use)
del fill
s = a.resume()
print(s["buffers"], s["moved"], np.array_equal(np.asarray(x), big), np.array_equal(np.asarray(y), small))
""")
    assert out[0] == "full", out
    assert out[1] == "2 0 0", out
    assert out[2] == "150006.0", out
    assert out[3] == "1 0 True True True True", out
    assert out[4:6] == ["True True True", "True"], out
    assert out[6] == "exhausted True True", out
    assert out[7] == "True True True True 0", out
    assert out[8] == "2 [] True True", out


@pytest.mark.not_service("fault injection is the service's: a tenant may not fail devices every tenant shares")
def test_resume_moves_buffers_off_a_device_that_failed_meanwhile(request):
    from conftest import runner_with_suite_hosts

    run = runner_with_suite_hosts(request.config, "import numpy as np\nimport pathways as pw\n")
    out = run("""
t = pw.make_virtual_device_set().add_slice(tpu_devices=2).tpus
c = pw.Client("survivor")
v = np.arange(2 * 5, dtype=np.float32).reshape(2, 5)
with c:
    h = pw.device_put(v, t)
    r = pw.jit(lambda x: x * 2.0)(np.arange(3, dtype=np.float32))    # replicated, on jit's device
old = [d.physical.id for d in t]
t2 = pw.make_virtual_device_set().add_slice(tpu_devices=2).tpus
with c:
    lost = pw.device_put(np.ones(2, np.float32), t2)
pw.testing.fail_device(t2[0])          # before the suspension: the buffer stays, failed
print(not {d.physical.id for d in t2} & set(old), c.suspend()["failed_buffers"], lost.is_suspended())
pw.testing.fail_device(t[1])           # while suspended
s = c.resume()
m = [e for e in s["moved"] if e["from"] == old]
print(len(m), m[0]["to"][0] == old[0], m[0]["to"][1] != old[1], [d.id for d in h.devices] == m[0]["to"])
print(np.array_equal(np.asarray(h), v), np.array_equal(np.asarray(r), np.arange(3) * 2.0), r.is_replicated)
u = pw.make_virtual_device_set().add_slice(tpu_devices=2).tpus   # a healthy slice
with c:
    print(np.array_equal(np.asarray(pw.pmap(lambda x: x + 1.0, devices=u)(h)), v + 1.0))
try:
    np.asarray(lost)
except pw.DeviceFailedError as e:
    print("has failed" in str(e))
""")
    assert out.splitlines() == ["True 1 False", "1 True True True", "True True True", "True", "True"], out
