"""Hang diagnosis (issue 9): pw.diagnose() and the hang watchdog.

A gang that cannot start for a while is made by a long simulated kernel
holding a slice's devices and another program queued behind it on the same
devices. Nothing here deadlocks: the long kernel ends (in this process), or
the subprocess exits and its runtime cancels the rest.
"""

import json
import os
import time

import numpy as np
import pytest

import pathways as pw
from conftest import get_devices


def slow_step(x):
    return pw.simulated_compute(x + 1.0, 5e6)  # 5 s on the slice's devices


def quick_step(x):
    return x * 2.0


def then_step(x):
    return x - 1.0


def _waiting(diagnosis, node):
    return [g for g in diagnosis if g["node"] == node]


def test_nothing_waiting_reports_nothing():
    pw._core.await_quiescence()
    d = pw.diagnose()
    assert isinstance(d, pw.Diagnosis) and list(d) == []
    assert [i["island"] for i in d.islands] == list(range(pw.topology()["islands"]))
    assert all(i["running"] == 0 and i["queued"] == 0 for i in d.islands)
    assert str(d).startswith("pathways: 0 gangs waiting to start.")
    assert "idle" in str(d)


def test_diagnose_names_the_waiting_gang_and_what_it_waits_for():
    tpus = get_devices(2)
    ids = [d.physical.id for d in tpus]
    slow = pw.pmap(slow_step, devices=tpus)
    quick = pw.pmap(quick_step, devices=tpus)
    then = pw.pmap(then_step, devices=tpus)

    @pw.program
    def hold(x):
        return slow(x)

    @pw.program
    def behind(x):
        return then(quick(x))

    held = hold(np.zeros(2))
    with pw.Client("tenant"):
        out = behind(np.ones(2))
    deadline = time.monotonic() + 60
    while True:  # the hold gang may take a moment to be running
        d = pw.diagnose()
        first = _waiting(d, "quick_step")
        if first and first[0]["blocked_by"] and first[0]["blocked_by"][0]["running"]:
            break
        assert time.monotonic() < deadline, str(d)
        time.sleep(0.01)

    (g,) = first
    assert (g["program"], g["client"], g["state"]) == ("behind", "tenant", "queued")
    assert g["devices"] == ids
    assert g["waiting_for"] == ["devices"]
    assert g["waited_seconds"] >= 0
    (b,) = g["blocked_by"]
    assert (b["program"], b["node"], b["client"], b["state"], b["running"]) == (
        "hold", "slow_step", "default", "running", True)
    assert b["devices"] == ids
    # The next node waits behind the same gang, and for its input from the first.
    (g2,) = _waiting(d, "then_step")
    assert g2["waiting_for"] == ["devices", "inputs"]
    (i,) = g2["inputs"]
    assert (i["index"], i["type"], i["devices"], i["copy"]) == (0, "f64[2]", ids, False)
    assert (i["producer"]["program"], i["producer"]["node"], i["producer"]["running"]) == (
        "behind", "quick_step", False)
    island = next(c for c in d.islands if c["island"] == g["island"])
    assert island["running"] >= 1 and island["queued"] >= 2

    text = str(d)
    assert "'quick_step' of program 'behind', client 'tenant'" in text
    assert "queue headed by 'slow_step' of program 'hold', client 'default'" in text
    assert "input 0 (f64[2] on island" in text and "produced by 'quick_step' of program 'behind'" in text
    assert json.loads(json.dumps(list(d))) == list(d)  # plain data

    np.testing.assert_array_equal(np.asarray(out), [1.0, 1.0])
    np.testing.assert_array_equal(np.asarray(held), [1.0, 1.0])
    assert _waiting(pw.diagnose(), "quick_step") == []


def test_topology_has_hang_report_seconds():
    if os.environ.get("PATHWAYS_TOPOLOGY"):
        pytest.skip("expects the default topology")
    assert pw.topology()["hang_report_seconds"] == 60.0


# The watchdog at 0.5 s, in a fresh process: a 1 s gang that nothing waits
# behind is not reported; a gang queued behind an hour-long one is reported
# once, by the wait on it (as an error here, so the wait ends); waits after
# that issue nothing more.
_WATCHDOG = """
import json, warnings, numpy as np, pathways as pw
a = pw.make_virtual_device_set().add_slice(tpu_devices=2).tpus
b = pw.make_virtual_device_set().add_slice(tpu_devices=2).tpus
def hold_step(x): return pw.simulated_compute(x + 1.0, 3.6e9)
def busy_step(x): return pw.simulated_compute(x + 1.0, 1e6)
def after_step(x): return x * 2.0
hold_fn, after_fn, busy_fn = pw.pmap(hold_step, devices=a), pw.pmap(after_step, devices=a), pw.pmap(busy_step, devices=b)
@pw.program
def hold(x): return hold_fn(x)
@pw.program
def after(x): return after_fn(x)
@pw.program
def busy(x): return busy_fn(x)
x = np.zeros(2)
out = {"topology": pw.topology()["hang_report_seconds"]}
def hang_warnings(caught):
    return [str(w.message) for w in caught if issubclass(w.category, pw.HangWarning)]
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    np.asarray(busy(x))
    out["idle"] = hang_warnings(caught)
held = hold(x)
with pw.Client("tenant"):
    waiting = after(x)
try:
    with warnings.catch_warnings():
        warnings.simplefilter("error", pw.HangWarning)
        np.asarray(waiting)
    out["raised"] = None
except pw.HangWarning as e:
    out["raised"] = str(e)
    out["report"] = list(e.diagnosis)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    np.asarray(busy(x))
    np.asarray(busy(x))
    out["again"] = hang_warnings(caught)
out["still_waiting"] = [g["node"] for g in pw.diagnose()]
print(json.dumps(out))
"""


@pytest.mark.not_service("sets its own hang_report_seconds, which a tenant takes from the service's topology")
def test_watchdog_reports_a_gang_that_cannot_start_once(python_subprocess, request):
    # With the suite's hosts: with host processes the gangs wait in the
    # hosts' device queues, which the watchdog asks about.
    hosts = request.config.getoption("--hosts")
    topology = "hang_report_seconds=0.5" + ("" if hosts == "in_process" else f",hosts={hosts}")
    out = json.loads(python_subprocess(_WATCHDOG, env={"PATHWAYS_TOPOLOGY": topology}))
    assert out["topology"] == 0.5
    assert out["idle"] == []
    assert out["raised"] is not None, out
    assert "1 gang has not started 0.5 s after submission" in out["raised"]
    assert "'after_step' of program 'after', client 'tenant'" in out["raised"]
    assert "queue headed by 'hold_step' of program 'hold', client 'default'" in out["raised"]
    (g,) = out["report"]
    assert (g["program"], g["node"], g["client"], g["state"]) == ("after", "after_step", "tenant", "queued")
    assert g["waited_seconds"] >= 0.5
    (b,) = g["blocked_by"]
    assert (b["program"], b["node"], b["running"]) == ("hold", "hold_step", True)
    assert out["again"] == []  # reported once
    assert out["still_waiting"] == ["after_step"]  # while pw.diagnose() still lists it


def test_watchdog_off_reports_nothing(python_subprocess):
    # With the watchdog off, the wait would last the hour: it waits in a
    # daemon thread, which the exit's shutdown ends.
    code = """
import json, threading, time, warnings, numpy as np, pathways as pw
a = pw.make_virtual_device_set().add_slice(tpu_devices=2).tpus
hold_fn = pw.pmap(lambda x: pw.simulated_compute(x + 1.0, 3.6e9), devices=a)
after_fn = pw.pmap(lambda x: x * 2.0, devices=a)
held = hold_fn(np.zeros(2))
waiting = after_fn(np.zeros(2))
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    def wait():
        try:
            np.asarray(waiting)
        except pw.PathwaysError:
            pass
    threading.Thread(target=wait, daemon=True).start()
    time.sleep(1.0)
    print(json.dumps([pw.topology()["hang_report_seconds"], len(caught), len(pw.diagnose())]))
"""
    topology, warned, waiting = json.loads(python_subprocess(code, env={"PATHWAYS_TOPOLOGY": "hang_report_seconds=0"}))
    assert (topology, warned, waiting) == (0.0, 0, 1)


def test_watchdog_reports_stay_in_the_parent_across_fork(python_subprocess):
    # A report is queued (nothing waited yet) when the process forks: the
    # child has no watchdog and refuses the runtime, diagnosis included; the
    # parent's next wait still issues the report.
    code = """
import json, os, time, warnings, numpy as np, pathways as pw
a = pw.make_virtual_device_set().add_slice(tpu_devices=2).tpus
def hold_step(x): return pw.simulated_compute(x + 1.0, 3.6e9)
def after_step(x): return x * 2.0
held = pw.pmap(hold_step, devices=a)(np.zeros(2))
waiting = pw.pmap(after_step, devices=a)(np.zeros(2))
deadline = time.monotonic() + 60
while not pw._core._has_hang_report() and time.monotonic() < deadline:
    time.sleep(0.01)
pid = os.fork()
if pid == 0:
    try:
        pw.diagnose()
        os._exit(1)
    except RuntimeError as e:
        os._exit(0 if "fork" in str(e) else 2)
_, status = os.waitpid(pid, 0)
try:
    with warnings.catch_warnings():
        warnings.simplefilter("error", pw.HangWarning)
        np.asarray(waiting)
    raised = None
except pw.HangWarning as e:
    raised = [g["node"] for g in e.diagnosis]
print(json.dumps([os.waitstatus_to_exitcode(status), raised]))
"""
    child, raised = json.loads(python_subprocess(code, env={"PATHWAYS_TOPOLOGY": "hang_report_seconds=0.2"}))
    assert (child, raised) == (0, ["after_step"])


@pytest.mark.parametrize("bad", ["-1", "86401", "nan", "inf", "1e300"])
def test_hang_report_seconds_range(bad):
    # Values are checked before the runtime's state, as for every key.
    with pytest.raises(ValueError, match="hang_report_seconds must be a finite number from 0 to 86400"):
        pw.configure(hang_report_seconds=float(bad))


def test_hang_report_seconds_type():
    with pytest.raises(TypeError, match="configure: hang_report_seconds must be a number"):
        pw.configure(hang_report_seconds="60")
