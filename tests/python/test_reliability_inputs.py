"""Bad inputs (issue 9, "Reliability"): each raises a clear exception naming
the parameter, of the same type whatever path it takes, and the runtime stays
usable. Topology tests run in fresh processes: the topology is fixed when the
runtime starts."""

import json
import math
import threading

import numpy as np
import pytest

import pathways as pw
from conftest import get_devices, run_python

# --- topology limits: pw.configure and PATHWAYS_TOPOLOGY ----------------------

# (configure keywords, the same as a PATHWAYS_TOPOLOGY spec, what the message must contain)
TOPOLOGY_ERRORS = [
    ({"executor_threads": 100000}, "executor_threads=100000", ["executor_threads must be at most 256, got 100000"]),
    (
        {"islands": 10000, "hosts_per_island": 10000, "devices_per_host": 1000},
        "islands=10000,hosts_per_island=10000,devices_per_host=1000",
        ["at most 65536 devices", "islands x hosts_per_island x devices_per_host", "= 100000000000"],
    ),
    (
        {"islands": 1, "hosts_per_island": 40000, "devices_per_host": 2},
        "islands=1,hosts_per_island=40000,devices_per_host=2",
        ["at most 65536 devices", "= 80000"],
    ),
    ({"islands": 2**40}, f"islands={2**40}", ["islands must be at most 65536"]),
    ({"islands": 10**30}, f"islands={10**30}", ["islands must be an integer from 1 to 65536"]),
    ({"devices_per_host": 0}, "devices_per_host=0", ["devices_per_host must be at least 1, got 0"]),
    ({"device_memory": "2TiB"}, "device_memory=2TiB", ["device_memory", "at most 1TiB", "'2TiB'"]),
    ({"device_memory": 2**80}, f"device_memory={2**80}", ["device_memory", "1TiB"]),
    ({"control_latency_us": math.nan}, "control_latency_us=nan", ["control_latency_us", "from 0 to 1000000", "'nan'"]),
    ({"control_latency_us": math.inf}, "control_latency_us=inf", ["control_latency_us", "from 0 to 1000000", "'inf'"]),
    ({"control_latency_us": 1e300}, "control_latency_us=1e+300", ["control_latency_us", "from 0 to 1000000", "'1e+300'"]),
    ({"control_latency_us": -1.0}, "control_latency_us=-1.0", ["control_latency_us", "'-1.0'"]),
    ({"control_latency_us": 2e6}, "control_latency_us=2000000.0", ["control_latency_us", "'2000000.0'"]),
]

# Catches the error of `call`, prints its type and message as JSON; then
# checks that a good configuration still works.
_CONFIGURE_ALL = """
import json, math, numpy as np, pathways as pw
cases = {cases}
for kwargs in cases:
    try:
        pw.configure(**kwargs)
        print(json.dumps(["no error", ""]))
    except Exception as e:
        print(json.dumps([type(e).__name__, str(e)]))
assert not pw._core.is_started()
pw.configure(islands=1, hosts_per_island=1, devices_per_host=2, control_latency_us=1000000)
s = pw.make_virtual_device_set().add_slice(tpu_devices=2)
print(json.dumps([pw.topology()["islands"], pw.topology()["control_latency_us"],
                  np.asarray(pw.pmap(lambda x: x + 1.0, devices=s.tpus)(np.zeros(2))).tolist()]))
"""

_START_FROM_ENVIRONMENT = """
import json, numpy as np, pathways as pw
try:
    pw.devices()
    print(json.dumps(["no error", ""]))
except Exception as e:
    print(json.dumps([type(e).__name__, str(e)]))
# The environment's error leaves configure usable.
pw.configure(islands=1, hosts_per_island=1, devices_per_host=2)
s = pw.make_virtual_device_set().add_slice(tpu_devices=2)
print(json.dumps(np.asarray(pw.pmap(lambda x: x * 2.0, devices=s.tpus)(np.ones(2))).tolist()))
"""


@pytest.fixture(scope="module")
def configure_errors():
    """The (type, message) of pw.configure for every TOPOLOGY_ERRORS case, from one process."""
    cases = "[" + ", ".join(
        "{" + ", ".join(f"{k!r}: {_literal(v)}" for k, v in kwargs.items()) + "}"
        for kwargs, _, _ in TOPOLOGY_ERRORS
    ) + "]"
    lines = run_python(_CONFIGURE_ALL.format(cases=cases)).splitlines()
    assert len(lines) == len(TOPOLOGY_ERRORS) + 1
    assert json.loads(lines[-1]) == [1, 1000000.0, [1.0, 1.0]]
    return [json.loads(line) for line in lines[:-1]]


def _literal(value):
    if isinstance(value, float) and not math.isfinite(value):
        return f"math.{value!r}" if value > 0 else f"-math.{-value!r}"
    return repr(value)


@pytest.mark.parametrize("index", range(len(TOPOLOGY_ERRORS)), ids=[spec for _, spec, _ in TOPOLOGY_ERRORS])
def test_topology_limits_same_error_from_configure_and_environment(python_subprocess, configure_errors, index):
    _, spec, fragments = TOPOLOGY_ERRORS[index]
    kind, message = configure_errors[index]
    assert kind == "ValueError", (kind, message)
    assert message.startswith("configure: ")
    for fragment in fragments:
        assert fragment in message, (fragment, message)

    first, second = python_subprocess(_START_FROM_ENVIRONMENT, env={"PATHWAYS_TOPOLOGY": spec}).splitlines()
    env_kind, env_message = json.loads(first)
    assert env_kind == "ValueError", (env_kind, env_message)
    assert env_message.startswith("PATHWAYS_TOPOLOGY: ")
    # The same check in the same place: the same message after the prefix.
    assert env_message.removeprefix("PATHWAYS_TOPOLOGY: ") == message.removeprefix("configure: ")
    assert json.loads(second) == [2.0, 2.0]


def test_configure_values_cannot_inject_keys(python_subprocess):
    out = python_subprocess(
        """
import pathways as pw
for kwargs in ({"device_memory": "64MiB,islands=1"}, {"device_memory": "64MiB, executor_threads=3"}):
    try:
        pw.configure(**kwargs)
        print("no error")
    except ValueError as e:
        print("ValueError", e)
pw.configure(device_memory="64MiB")
t = pw.topology()
print(t["islands"], t["device_memory"], len(pw.devices()))
"""
    )
    first, second, third = out.splitlines()
    assert first.startswith("ValueError configure: device_memory must be a size") and "'64MiB,islands=1'" in first
    assert second.startswith("ValueError configure: device_memory must be a size")
    # The default topology: islands=1 was not applied.
    assert third == f"2 {64 << 20} 16"


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"control_latency_us": "2"}, "control_latency_us must be a number"),
        ({"control_latency_us": True}, "control_latency_us must be a number"),
        ({"device_memory": 1.5}, "device_memory must be an int of bytes or a str"),
        ({"executor_threads": 2.0}, "executor_threads must be an int"),
    ],
)
def test_configure_wrong_types(kwargs, name):
    # Types are checked before anything else, so this works after the runtime started.
    with pytest.raises(TypeError, match=f"configure: {name}"):
        pw.configure(**kwargs)


def test_configure_huge_latency_int_is_a_value_error():
    # Too large for a float: still the range error, not OverflowError.
    with pytest.raises(ValueError, match="control_latency_us must be a finite number from 0 to 1000000"):
        pw.configure(control_latency_us=10**400)


# --- nested and concurrent timelines -------------------------------------------


def _named_step(name, tpus):
    def step(x):
        return pw.simulated_compute(x + 1.0, 10)

    step.__name__ = step.__qualname__ = name
    return pw.pmap(step, devices=tpus)


def _gangs_by_node(tl):
    """{node: number of gangs}, from the per-device events (grouped by gang: with
    host processes a gang spanning hosts has one start per host)."""
    gangs = {(ev["node"], ev["gang"]) for ev in tl.events()}
    counts = {}
    for node, _ in gangs:
        counts[node] = counts.get(node, 0) + 1
    return counts


def test_nested_timelines_both_record(runtime_ok):
    tpus = get_devices(2)
    before, inside, after = (_named_step(n, tpus) for n in ("rel_before", "rel_inside", "rel_after"))
    x = np.zeros(2)
    with pw.timeline() as outer:
        before(x).block_until_ready()
        with pw.timeline() as inner:
            inside(inside(x)).block_until_ready()
        after(x).block_until_ready()
    outer_gangs, inner_gangs = _gangs_by_node(outer), _gangs_by_node(inner)
    assert {k: outer_gangs.get(k) for k in ("rel_before", "rel_inside", "rel_after")} == {
        "rel_before": 1, "rel_inside": 2, "rel_after": 1}
    assert inner_gangs.get("rel_inside") == 2
    assert "rel_before" not in inner_gangs and "rel_after" not in inner_gangs
    # Every event is on the gang's two devices.
    assert sum(1 for ev in outer.events() if ev["node"].startswith("rel_")) == 4 * 2
    # A timeline after them starts empty of their gangs.
    with pw.timeline() as later:
        pass
    assert not any(ev["node"].startswith("rel_") for ev in later.events())
    runtime_ok()


def test_timelines_of_two_threads_at_once(runtime_ok):
    n = 20
    steps = [_named_step(f"rel_thread{i}", get_devices(2)) for i in range(2)]
    both_open = threading.Barrier(2)
    results = [None, None]
    events = [None, None]
    errors = []

    def run(i):
        try:
            with pw.timeline() as tl:
                both_open.wait(timeout=60)
                x = np.zeros(2)
                for _ in range(n):
                    x = steps[i](x)
                x.block_until_ready()
                both_open.wait(timeout=60)  # neither closes before the other finished
            results[i] = _gangs_by_node(tl)
            # Kept for the message below: which events a wrong count came from.
            events[i] = sorted((ev["node"], ev["start_us"], ev["end_us"], ev["device"])
                               for ev in tl.events() if ev["node"].startswith("rel_thread"))
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for i in range(2):
        # Its own gangs, and (both scopes being open throughout) the other thread's too.
        assert results[i].get("rel_thread0") == n and results[i].get("rel_thread1") == n, (
            i, results[i], events[i])
    runtime_ok()


# --- simulated_compute durations ---------------------------------------------------


@pytest.mark.parametrize(
    "microseconds, shown",
    [(math.nan, "nan"), (math.inf, "inf"), (-math.inf, "-inf"), (-5, "-5"), (1e300, "1e+300"),
     (5e15, "5e+15"), (10**400, "inf"), (3.6e9 + 1, "3600000001")],
    ids=["nan", "inf", "-inf", "-5", "1e300", "5e15", "10**400", "3.6e9+1"],
)
def test_simulated_compute_rejects_bad_durations(runtime_ok, microseconds, shown):
    tpus = get_devices(2)
    with pytest.raises(ValueError) as e:
        pw.pmap(lambda x: pw.simulated_compute(x, microseconds), devices=tpus)(np.zeros(2))
    message = str(e.value)
    assert "simulated_compute: duration must be a finite number of microseconds from 0 to 3600000000" in message
    assert message.endswith(f"got {shown}"), message
    runtime_ok()


def test_simulated_compute_total_is_checked_not_wrapped(runtime_ok):
    tpus = get_devices(2)
    # Each fits on its own (before: 5e15 each, whose sum wrapped in int64 and finished at once).
    with pytest.raises(ValueError, match=r"simulated_compute: a function's total simulated time must be at most "
                                         r"3600000000 us \(one hour\); it has 3000000000 us, plus 3000000000 us"):
        pw.pmap(lambda x: pw.simulated_compute(pw.simulated_compute(x, 3e9), 3e9), devices=tpus)(np.zeros(2))
    with pytest.raises(ValueError, match="simulated_compute: duration must be"):
        pw.pmap(lambda x: pw.simulated_compute(pw.simulated_compute(x, 5e15), 5e15), devices=tpus)(np.zeros(2))
    # Durations that fit add up.
    f = pw.pmap(lambda x: pw.simulated_compute(pw.simulated_compute(x, 1.5) * 2.0, 2.5), devices=tpus)
    assert "simulated_compute[1.5us]" in f.as_text(np.zeros(2)) and "[2.5us]" in f.as_text(np.zeros(2))
    np.testing.assert_array_equal(np.asarray(f(np.ones(2))), [2.0, 2.0])
    runtime_ok()


@pytest.mark.parametrize("microseconds", [None, "10", True, [1.0]])
def test_simulated_compute_duration_must_be_a_number(runtime_ok, microseconds):
    tpus = get_devices(2)
    with pytest.raises(TypeError, match="simulated_compute: microseconds must be a number"):
        pw.pmap(lambda x: pw.simulated_compute(x, microseconds), devices=tpus)(np.zeros(2))
    runtime_ok()


# --- export_chrome_trace devices ---------------------------------------------------


@pytest.fixture(scope="module")
def recorded():
    tpus = get_devices(2)
    f = _named_step("rel_export", tpus)
    with pw.timeline() as tl:
        f(np.zeros(2)).block_until_ready()
    return tl, tpus


def _tracks(path):
    trace = json.loads(path.read_text())
    return {ev["tid"] for ev in trace["traceEvents"] if ev["ph"] == "X" and ev["name"] == "rel_export"}


@pytest.mark.parametrize(
    "devices, exc, message",
    [
        ("ab", TypeError, "export_chrome_trace: devices must be a sequence of device ids or devices, got 'ab'"),
        (b"\x00", TypeError, "export_chrome_trace: devices must be a sequence"),
        (3, TypeError, "export_chrome_trace: devices must be a sequence"),
        (["0"], TypeError, "export_chrome_trace: devices must hold device ids (int) or devices, got '0'"),
        ([True], TypeError, "export_chrome_trace: devices must hold device ids"),
        ([1.0], TypeError, "export_chrome_trace: devices must hold device ids"),
        ([0, 999], ValueError, "export_chrome_trace: devices has unknown device id 999; the devices are 0..15"),
        ([-1], ValueError, "export_chrome_trace: devices has unknown device id -1"),
    ],
)
def test_export_chrome_trace_rejects_bad_devices(tmp_path, recorded, devices, exc, message):
    tl, _ = recorded
    path = tmp_path / "trace.json"
    with pytest.raises(exc) as e:
        tl.export_chrome_trace(str(path), devices=devices)
    assert message in str(e.value)
    assert not path.exists()


def test_export_chrome_trace_device_forms(tmp_path, recorded):
    tl, tpus = recorded
    physical = [v.physical for v in tpus]
    ids = [d.id for d in physical]
    path = tmp_path / "trace.json"
    tl.export_chrome_trace(str(path))
    assert _tracks(path) == set(ids)
    for devices in ([ids[0]], [np.int64(ids[0])], [physical[0]], [tpus[0]], (ids[0],), {ids[0]}):
        tl.export_chrome_trace(str(path), devices=devices)
        assert _tracks(path) == {ids[0]}, devices
    tl.export_chrome_trace(str(path), devices=[])
    assert _tracks(path) == set()


# --- clients, scheduling policy, slices --------------------------------------------


@pytest.mark.parametrize("weight, exc", [(None, TypeError), ("heavy", TypeError), (True, TypeError),
                                         (math.nan, ValueError), (0, ValueError), (1e10, ValueError),
                                         (10**400, ValueError)],
                         ids=["None", "heavy", "True", "nan", "0", "1e10", "10**400"])
def test_client_weight_errors_name_weight(runtime_ok, weight, exc):
    with pytest.raises(exc) as e:
        pw.Client("rel", weight=weight)
    assert "weight" in str(e.value)
    if exc is TypeError:
        assert str(e.value) == f"Client: weight must be a number, got {weight!r}"
    runtime_ok()


@pytest.mark.parametrize("policy", [None, 3, b"fifo"])
def test_scheduling_policy_must_be_a_str(runtime_ok, policy):
    before = pw.scheduling_policy()
    with pytest.raises(TypeError) as e:
        pw.set_scheduling_policy(policy)
    assert str(e.value) == f"set_scheduling_policy: policy must be a str, got {policy!r}"
    assert pw.scheduling_policy() == before
    runtime_ok()


@pytest.mark.parametrize("n", [2**70, -(2**70), 2**40, 2**31, 65537])
def test_add_slice_out_of_range_names_the_keyword(runtime_ok, n):
    with pytest.raises(ValueError) as e:
        pw.make_virtual_device_set().add_slice(tpu_devices=n)
    assert f"add_slice(tpu_devices={n})" in str(e.value)
    assert "65536" in str(e.value) or "at least one device" in str(e.value)
    runtime_ok()
