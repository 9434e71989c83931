"""Buffers, threads and processes over the runtime's life (issue 9: crashes and hangs).

Each case once crashed or hung: a buffer deleted while another thread reads
it, interpreter exit while daemon threads dispatch, fork() after the runtime
started, Ctrl-C during a wait, and exit with queued work. Cases that end a
process run in a subprocess; a hang fails them by the subprocess timeout.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import pathways as pw
from conftest import run_python_process


def _run(code: str, hosts: str = "in_process") -> subprocess.CompletedProcess:
    env = {"PATHWAYS_TOPOLOGY": f"hosts={hosts}"} if hosts != "in_process" else None
    return run_python_process(code, env=env, timeout=60)


_SLOW = """
import os, sys, threading, time
import numpy as np
import pathways as pw
tpus = pw.make_virtual_device_set().add_slice(tpu_devices=2).tpus
slow = pw.pmap(lambda x: pw.simulated_compute(x + 1., {us}), devices=tpus)
"""


# --- Crash 1: delete() while another thread reads -------------------------


@pytest.mark.parametrize("read", ["asarray", "getitem", "repr", "block"])
def test_delete_while_another_thread_reads(devices_of, read):
    tpus = devices_of(2)
    f = pw.pmap(lambda x: pw.simulated_compute(x * 2.0, 100_000), devices=tpus)
    y = f(np.arange(2.0))
    got = []

    def reader():
        try:
            if read == "asarray":
                got.append(np.asarray(y))
            elif read == "getitem":
                got.append(y[1])
            elif read == "repr":
                got.append(repr(y))
            else:
                got.append(y.block_until_ready())
        except BaseException as e:  # noqa: BLE001 - recorded and checked below
            got.append(e)

    t = threading.Thread(target=reader)
    t.start()
    time.sleep(0.03)
    assert not y.is_ready(), "the reader must still be waiting when the buffer is deleted"
    y.delete()
    t.join(30)
    assert not t.is_alive()
    # The reader started before the delete, so it holds the buffer and reads it.
    if read == "asarray":
        np.testing.assert_array_equal(got[0], [0.0, 2.0])
    elif read == "getitem":
        assert got[0] == 2.0
    elif read == "repr":
        assert "0., 2." in got[0]
    else:
        assert got[0] is y
    assert y.is_deleted()
    with pytest.raises(pw.DeletedBufferError, match="deleted"):
        np.asarray(y)


def test_many_threads_read_while_buffers_are_deleted(devices_of):
    tpus = devices_of(2)
    f = pw.pmap(lambda x: pw.simulated_compute(x + 1.0, 2_000), devices=tpus)
    errors = []

    def reader(buf, want):
        try:
            np.testing.assert_array_equal(np.asarray(buf), want)
        except pw.DeletedBufferError:
            pass  # deleted before this read began: the documented error
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    for i in range(50):
        y = f(np.full(2, float(i)))
        threads = [threading.Thread(target=reader, args=(y, [i + 1.0] * 2)) for _ in range(3)]
        for t in threads:
            t.start()
        y.delete()
        for t in threads:
            t.join(30)
    assert errors == []


# --- Item 7: bool(), float(), int() of a buffer are numpy's ---------------
# (except that float() and int() of a one-element buffer convert, its device
# axis notwithstanding, where numpy 2 converts only 0-d arrays)


@pytest.mark.parametrize("value", [[0.0], [2.5], [-3], [True], [False], [0.0, 1.0], [[1.0, 2.0]]])
@pytest.mark.parametrize("convert", [bool, float, int])
def test_truth_value_and_scalar_conversions_are_numpys(devices_of, value, convert):
    host = np.asarray(value, np.int32 if isinstance(value[0], int) else None)
    buf = pw.device_put(host, devices_of(len(value)))
    try:
        want = convert(host.item() if host.size == 1 else host)
    except (ValueError, TypeError) as e:
        with pytest.raises(type(e)):
            convert(buf)
    else:
        got = convert(buf)
        assert type(got) is type(want) and got == want


def test_a_buffer_holding_zero_is_falsy(devices_of):
    # `if buffer:` was always taken (len() fallback).
    taken = "yes" if pw.device_put(np.array([0.0]), devices_of(1)) else "no"
    assert taken == "no"
    with pytest.raises(ValueError, match="ambiguous"):
        if pw.device_put(np.array([0.0, 1.0]), devices_of(2)):
            pass


# --- GIL released around large copies ------------------------------------


class _Ticker:
    """A thread that ticks whenever it can take the GIL.

    With a huge switch interval, the main thread never hands over the GIL by
    itself: the ticker advances during a call only if the call releases it.
    """

    def __init__(self):
        self.count = 0
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop:
            time.sleep(0.0002)  # releases the GIL; takes it back to tick
            self.count += 1

    def __enter__(self):
        self._old = sys.getswitchinterval()
        self._thread.start()
        time.sleep(0.01)
        sys.setswitchinterval(1000.0)
        return self

    def __exit__(self, *exc):
        sys.setswitchinterval(self._old)
        self._stop = True
        self._thread.join(10)


@pytest.mark.parametrize("copy", ["to_numpy", "device_put", "execute_host_arg"])
def test_gil_released_during_large_copies(devices_of, copy):
    tpus = devices_of(2)
    host = np.ones((2, 16_000_000))  # 256 MB
    f = pw.pmap(lambda x: x[:1], devices=tpus)
    buf = pw.device_put(host, tpus).block_until_ready()
    with _Ticker() as ticker:
        before = ticker.count
        if copy == "to_numpy":
            out = np.asarray(buf)
        elif copy == "device_put":
            out = pw.device_put(host, tpus)
        else:
            out = f(host)
        advanced = ticker.count - before
    assert advanced > 0, "no other Python thread ran during the copy: the GIL was held"
    np.testing.assert_array_equal(np.asarray(out)[:, :1], np.ones((2, 1)))


# --- Crash 2: exit while daemon threads dispatch and wait -----------------


@pytest.mark.parametrize("wait", ["block_until_ready", "asarray_slow"])
def test_exit_while_daemon_threads_dispatch_and_wait(wait):
    code = _SLOW.format(us=50_000 if wait == "asarray_slow" else 1) + f"""
fast = pw.pmap(lambda x: x + 1., devices=tpus)
def loop():
    x = np.zeros(2)
    while True:
        if {wait!r} == "block_until_ready":
            x = fast(x); x.block_until_ready()
        else:
            x = slow(x); np.asarray(x)
for _ in range(8):
    threading.Thread(target=loop, daemon=True).start()
time.sleep(0.3)
print("exiting", flush=True)
sys.exit(0)
"""
    for _ in range(5):  # the abort came in 7 runs of 10
        proc = _run(code)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == "exiting\n"
        assert proc.stderr == "", proc.stderr  # no abort, no traceback from the dying threads


def test_runtime_call_after_shutdown_in_main_thread_raises():
    # An atexit handler registered before pathways runs after its shutdown.
    proc = _run("""
import atexit, numpy as np
def late():
    try:
        f(np.zeros(2))
    except Exception as e:
        print(type(e).__name__, e, flush=True)
atexit.register(late)
import pathways as pw
f = pw.pmap(lambda x: x + 1., devices=pw.make_virtual_device_set().add_slice(tpu_devices=2).tpus)
f(np.zeros(2)).block_until_ready()
""")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("PathwaysError the pathways runtime has shut down"), proc.stdout


# --- Hang 4: fork() after the runtime started ----------------------------


def test_fork_child_exits_and_refuses_the_runtime():
    proc = _run(_SLOW.format(us=2_000_000) + """
fast = pw.pmap(lambda x: x + 1., devices=tpus)
print("parent", np.asarray(fast(np.zeros(2))), flush=True)
ready = fast(np.ones(2)).block_until_ready()
pending = slow(np.zeros(2))  # in flight at fork time
pid = os.fork()
if pid == 0:
    print("child reads", np.asarray(ready), flush=True)
    for what, call in [("pmap", lambda: fast(np.zeros(2))),
                       ("wait", lambda: pending.block_until_ready()),
                       ("repr", lambda: repr(pending)),
                       ("slice", lambda: pw.make_virtual_device_set().add_slice(tpu_devices=2))]:
        try:
            call()
            print("child", what, "ran", flush=True)
        except RuntimeError as e:
            print("child", what, "RuntimeError", "fork" in str(e), flush=True)
    sys.exit(0)  # a normal exit: atexit handlers and finalization run
_, status = os.waitpid(pid, 0)
print("child exit", os.waitstatus_to_exitcode(status), flush=True)
print("parent", np.asarray(fast(np.zeros(2))), flush=True)
""")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "parent [1. 1.]",
        "child reads [2. 2.]",
        "child pmap RuntimeError True",
        "child wait RuntimeError True",
        "child repr RuntimeError True",
        "child slice RuntimeError True",
        "child exit 0",
        "parent [1. 1.]",
    ]


def test_fork_before_first_use_is_fine():
    proc = _run("""
import os, numpy as np
import pathways as pw  # imported, not started
pid = os.fork()
tpus = pw.make_virtual_device_set().add_slice(tpu_devices=2).tpus
out = np.asarray(pw.pmap(lambda x: x + 1., devices=tpus)(np.zeros(2)))
if pid == 0:
    os._exit(0 if list(out) == [1.0, 1.0] else 1)
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status), out.tolist())
""")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "0 [1.0, 1.0]\n"


# --- Hang 5: Ctrl-C interrupts waits --------------------------------------


@pytest.mark.parametrize("wait", ["block_until_ready", "asarray", "repr", "timeline", "block_tree"])
def test_ctrl_c_interrupts_waits_and_the_runtime_stays_usable(wait):
    proc = _run(_SLOW.format(us=5_000_000) + f"""
import signal
def double(x):
    return x * 2.
fast = pw.pmap(double, devices=pw.make_virtual_device_set().add_slice(tpu_devices=2).tpus)
y = slow(np.zeros(2))
threading.Timer(0.2, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
try:
    if {wait!r} == "block_until_ready":
        y.block_until_ready()
    elif {wait!r} == "asarray":
        np.asarray(y)
    elif {wait!r} == "repr":
        repr(y)
    elif {wait!r} == "block_tree":
        pw.block_until_ready({{"a": [y]}})
    else:
        with pw.timeline() as tl:
            y = slow(y)
    print("not interrupted", flush=True)
except KeyboardInterrupt:
    print("interrupted before the work finished:", not y.is_ready(), flush=True)
print(np.asarray(fast(np.ones(2))), flush=True)  # other devices: runs at once
with pw.timeline() as tl:  # an interrupted timeline scope left nothing behind
    fast(np.ones(2)).block_until_ready()
print([e["node"] for e in tl.events()].count("double"), flush=True)
""")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "interrupted before the work finished: True", "[2. 2.]", "2"]


# --- Hang 6: exit cancels queued work --------------------------------------


@pytest.mark.parametrize("hosts", ["in_process", "local_processes"])
@pytest.mark.parametrize("ending", ["return", "uncaught exception", "a daemon thread waiting"])
def test_exit_cancels_queued_work(ending, hosts):
    # 100 gangs of 10 s: 1000 s of queued device time. Exit must not wait for
    # it (the subprocess timeout is 60 s), with hosts in process or as
    # processes (issue 25, item 7).
    body = _SLOW.format(us=10_000_000) + """
x = np.zeros(2)
for _ in range(100):
    x = slow(x)
print("queued", flush=True)
"""
    if ending == "uncaught exception":
        body += "raise ValueError('boom')\n"
    elif ending == "a daemon thread waiting":
        body += "threading.Thread(target=lambda: x.block_until_ready(), daemon=True).start()\n"
    start = time.monotonic()
    proc = _run(body, hosts)
    assert proc.stdout == "queued\n", proc.stderr
    if ending == "uncaught exception":
        assert proc.returncode == 1 and "ValueError: boom" in proc.stderr
    else:
        assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert time.monotonic() - start < 30


# --- Issue 25, item 7: shutdown with the hosts' runs in flight ------------


@pytest.mark.parametrize("hosts", ["in_process", "local_processes"])
def test_exit_with_work_running_on_the_hosts_is_prompt_and_cancels_it(hosts):
    # pw's shutdown (as at exit) with a 10 s gang running and 100 queued:
    # the running gang's simulated time ends, the queued ones are cancelled,
    # and a thread waiting for the last output hears why.
    proc = _run(_SLOW.format(us=10_000_000) + """
x = np.zeros(2)
for _ in range(100):
    x = slow(x)
got = []
def wait():
    try:
        x.block_until_ready()
        got.append("ready")
    except pw.PathwaysError as e:
        got.append(str(e))
t = threading.Thread(target=wait)
t.start()
time.sleep(0.5)
start = time.monotonic()
pw._core.shutdown()
t.join(30)
print(time.monotonic() - start < 5, flush=True)
print("cancelled" in got[0] and "shut down" in got[0], got[0][:200], flush=True)
""", hosts)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "True"
    assert lines[1].startswith("True"), lines[1]
