"""Topology from PATHWAYS_TOPOLOGY and pw.configure, each in a fresh process."""

import pytest

CHECK = """
import numpy as np
import pathways as pw
devs = pw.devices()
print(len(devs), sorted({d.island for d in devs}), pw.topology())
s = pw.make_virtual_device_set().add_slice(tpu_devices=2)
f = pw.pmap(lambda x: x + pw.psum(x, "i"), devices=s.tpus, axis_name="i")
print(f(np.array([1., 2.])))
"""


def test_topology_from_environment(python_subprocess):
    out = python_subprocess(
        CHECK, env={"PATHWAYS_TOPOLOGY": "islands=3,hosts_per_island=1,devices_per_host=2"}
    )
    first, second = out.splitlines()
    assert first.startswith("6 [0, 1, 2] ")
    assert (
        "'islands': 3" in first
        and "'hosts_per_island': 1" in first
        and "'devices_per_host': 2" in first
    )
    assert second == "array([4., 5.])"


def test_topology_from_environment_too_small_slice(python_subprocess):
    out = python_subprocess(
        """
import pathways as pw
try:
    pw.make_virtual_device_set().add_slice(tpu_devices=3)
except pw.ResourceExhaustedError as e:
    print("ERR", e)
""",
        env={"PATHWAYS_TOPOLOGY": "islands=3,hosts_per_island=1,devices_per_host=2"},
    )
    assert out.startswith("ERR ") and "island 0: 2, island 1: 2, island 2: 2" in out


def test_configure_before_first_use(python_subprocess):
    out = python_subprocess(
        "import pathways as pw\n"
        "assert not pw._core.is_started()\n"
        "pw.configure(islands=4, hosts_per_island=1, devices_per_host=2, device_memory='64MiB', executor_threads=2)\n"
        + CHECK
    )
    first, second = out.splitlines()
    assert first.startswith("8 [0, 1, 2, 3] ")
    assert f"'device_memory': {64 << 20}" in first and "'executor_threads': 2" in first
    assert second == "array([4., 5.])"


def test_configure_wins_over_environment(python_subprocess):
    out = python_subprocess(
        "import pathways as pw\npw.configure(islands=1, hosts_per_island=1, devices_per_host=4, device_memory=1 << 20)\n"
        + CHECK,
        env={"PATHWAYS_TOPOLOGY": "islands=3,hosts_per_island=1,devices_per_host=2"},
    )
    first = out.splitlines()[0]
    assert first.startswith("4 [0] ")
    assert "'device_memory': 1048576" in first


def test_configure_bad_spec_and_retry(python_subprocess):
    out = python_subprocess(
        """
import pathways as pw
try:
    pw.configure(device_memory="lots")
except ValueError as e:
    print("ERR", e)
pw.configure(islands=1, devices_per_host=2, hosts_per_island=1)
print(len(pw.devices()))
try:
    pw.configure(islands=2)
except RuntimeError as e:
    print("LATE", e)
"""
    )
    lines = out.splitlines()
    assert lines[0].startswith("ERR ") and "device_memory" in lines[0]
    assert lines[1] == "2"
    assert lines[2].startswith("LATE ") and "already started" in lines[2]


def test_bad_environment_topology(python_subprocess):
    out = python_subprocess(
        """
import pathways as pw
try:
    pw.devices()
except ValueError as e:
    print("ERR", e)
""",
        env={"PATHWAYS_TOPOLOGY": "islnds=2"},
    )
    assert out.startswith("ERR PATHWAYS_TOPOLOGY") and "islnds" in out


@pytest.mark.parametrize("threads", [1, 4])
def test_executor_threads(python_subprocess, threads):
    out = python_subprocess(
        f"import pathways as pw\npw.configure(executor_threads={threads})\n" + CHECK
    )
    assert f"'executor_threads': {threads}" in out
    assert out.splitlines()[1] == "array([4., 5.])"


def test_intra_op_threads(python_subprocess):
    # One thread per kernel: a product large enough to be split otherwise
    # still gives numpy's result.
    out = python_subprocess(
        """
import numpy as np
import pathways as pw
pw.configure(islands=1, hosts_per_island=1, devices_per_host=1, executor_threads=2, intra_op_threads=1)
print(pw.topology()["intra_op_threads"])
x = np.random.default_rng(0).standard_normal((300, 400), dtype=np.float32)
d = pw.make_virtual_device_set().add_slice(tpu_devices=1).tpus
f = pw.pmap(lambda a: a @ a.T, devices=d)
got = np.asarray(f(pw.device_put(x[None], d)))[0]
print(np.allclose(got, x @ x.T, rtol=1e-4, atol=1e-3))
"""
    )
    assert out.split() == ["1", "True"]


def test_control_latency_models_dispatch_messages(python_subprocess):
    out = python_subprocess(
        """
import time, numpy as np, pathways as pw
pw.configure(control_latency_us=2000)
stages = [pw.pmap(lambda x, k=float(k): x + k, devices=pw.make_virtual_device_set().add_slice(tpu_devices=2).tpus)
          for k in range(4)]
def body(x):
    for s in stages:
        x = s(x)
    return x
par, seq = pw.program(body), pw.program(body, dispatch="sequential")
np.asarray(par(np.zeros(2))); np.asarray(seq(np.zeros(2)))
t = time.perf_counter(); a = np.asarray(par(np.zeros(2))); tp = time.perf_counter() - t
t = time.perf_counter(); b = np.asarray(seq(np.zeros(2))); ts = time.perf_counter() - t
print(pw.topology()["control_latency_us"], a.tolist(), b.tolist(), tp >= 0.002, ts >= 4 * 0.002)
"""
    )
    assert out.split() == ["2000.0", "[6.0,", "6.0]", "[6.0,", "6.0]", "True", "True"]
