"""Fault injection (pw.testing) and errors that flow through futures (paper §4.6).

A failed device stays failed, so each case runs in a fresh subprocess, with
the hosts of the suite's mode (`--hosts`: in process, or host processes,
where the hosts fail the work on their failed devices). The programs use
600-second simulated kernels: if a failed gang or one of its dependents
waited out its simulated time, the subprocess would time out.
"""

from __future__ import annotations

import re

import pytest

import pathways as pw


_PRELUDE = """
import gc, numpy as np
import pathways as pw
def slow(x):
    return pw.simulated_compute(x + 1., 600_000_000)  # 600 s
def expect_failure(buf, device):
    try:
        np.asarray(buf)
    except pw.DeviceFailedError as e:
        assert f"device {device} " in str(e), str(e)
        return str(e)
    raise AssertionError("no DeviceFailedError")
"""


@pytest.fixture
def run_faults(request):
    """Runs code after _PRELUDE in a fresh process with the suite's hosts; returns its stdout."""
    from conftest import runner_with_suite_hosts
    return runner_with_suite_hosts(request.config, _PRELUDE)


@pytest.mark.not_service("fault injection is the service's: a tenant may not fail devices every tenant shares")
def test_failed_device_fails_its_gang_and_dependents_and_the_rest_runs(run_faults):
    out = run_faults("""
a = pw.make_virtual_device_set().add_slice(tpu_devices=2).tpus
b = pw.make_virtual_device_set().add_slice(tpu_devices=2).tpus  # the other island
f, g = pw.pmap(slow, devices=a), pw.pmap(slow, devices=b)
h = pw.pmap(lambda x: x * 2., devices=b)

@pw.program
def chain(x):
    y = f(x)     # runs 600 s on `a` ...
    z = f(y)     # ... then this
    return y, g(z), h(z)   # g and h on the other slice, after a transfer

baseline = pw.memory_stats()["bytes_in_use"]
y, gz, hz = chain(np.zeros(2))
victim = a[1].physical
pw.testing.fail_device(a[1])
print(expect_failure(y, victim.id))
for out in (gz, hz):   # dependents fail with the same error, without running
    expect_failure(out, victim.id)
print(victim.failed, pw.testing.failed_devices() == [victim.id])
# The rest keeps working, the failed slice does not.
print(np.asarray(h(np.ones(2))))
expect_failure(pw.pmap(lambda x: x + 1., devices=a)(np.ones(2)), victim.id)
del y, gz, hz, out
gc.collect()
pw._core.await_quiescence()
print(pw.memory_stats()["bytes_in_use"] == baseline)
""")
    lines = out.splitlines()
    # With host processes, the host that ran the gang says so ("failed on host 0: ").
    assert re.fullmatch(r"'slow' in program 'chain' failed( on host \d+)?: device \d+ \(.*\) has failed", lines[0]), out
    assert lines[1:] == ["True True", "[2. 2.]", "True"]


@pytest.mark.not_service("fault injection is the service's: a tenant may not fail devices every tenant shares")
def test_a_failed_buffer_passed_to_later_programs_keeps_its_error(run_faults):
    # The error a buffer failed with is the one every program that takes it
    # gets, however long after it failed, on its own slice or after a
    # transfer (with host processes the hosts keep the failed buffer until
    # the client drops it, rather than forgetting it and saying "not on host").
    out = run_faults("""
a = pw.make_virtual_device_set().add_slice(tpu_devices=2).tpus
b = pw.make_virtual_device_set().add_slice(tpu_devices=2).tpus  # the other island
y = pw.pmap(slow, devices=a)(np.zeros(2))
victim = a[1].physical
pw.testing.fail_device(a[1])
first = expect_failure(y, victim.id)
gc.collect()
pw._core.await_quiescence()
double = pw.pmap(lambda x: x * 2., devices=b)
@pw.program
def later(x):
    return double(x)
for out in (double(y), later(y), later(y)):
    print(expect_failure(out, victim.id) == first)
""")
    assert out.splitlines() == ["True", "True", "True"], out


@pytest.mark.not_service("fault injection is the service's: a tenant may not fail devices every tenant shares")
def test_failed_host_loses_its_buffers_and_new_slices_avoid_it(run_faults):
    out = run_faults("""
tpus = pw.make_virtual_device_set().add_slice(tpu_devices=8).tpus   # all of island 0: hosts 0 and 1
ready = pw.device_put(np.arange(8.), tpus)
host = tpus[5].physical.host
pw.testing.fail_host(host)
failed = sorted(pw.testing.failed_devices())
print(failed == [d.id for d in pw.devices() if d.host == host])
expect_failure(ready, failed[0])  # a ready buffer on the host is lost with it
kept = []
for _ in range(4):  # island 0 has 4 healthy devices left; none are failed ones
    kept.append(pw.make_virtual_device_set().add_slice(tpu_devices=4).tpus)
    assert not any(d.physical.failed for d in kept[-1]), kept[-1]
pw.make_virtual_device_set().add_slice(tpu_devices=8)  # island 1 still has 8
pw.testing.fail_host(next(d.host for d in pw.devices() if d.island == 1))
try:
    pw.make_virtual_device_set().add_slice(tpu_devices=8)
except pw.ResourceExhaustedError as e:
    print("island 0: 4 healthy, island 1: 4 healthy" in str(e))
""")
    assert out.splitlines() == ["True", "True"]


@pytest.mark.not_service("fault injection is the service's: a tenant may not fail devices every tenant shares")
def test_device_put_onto_a_failed_device_cannot_be_read(run_faults):
    out = run_faults("""
tpus = pw.make_virtual_device_set().add_slice(tpu_devices=2).tpus
pw.testing.fail_device(tpus[0].physical.id)
print(expect_failure(pw.device_put(np.ones(2), tpus), tpus[0].physical.id))
""")
    assert out.strip().startswith("device ")


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda: pw.testing.fail_device("ab"), TypeError, "fail_device: devices must hold device ids"),
        (lambda: pw.testing.fail_device(10_000), ValueError, "fail_device: devices has unknown device id 10000"),
        (lambda: pw.testing.fail_device(None), TypeError, "fail_device: devices must hold device ids"),
        (lambda: pw.testing.fail_host(1.5), TypeError, "fail_host: host must be an int"),
        (lambda: pw.testing.fail_host(99), ValueError, "fail_host: unknown host 99"),
    ],
)
def test_bad_arguments_name_the_parameter(runtime_ok, call, error, message):
    with pytest.raises(error, match=message):
        call()
    assert pw.testing.failed_devices() == []
    runtime_ok()


@pytest.mark.not_service("fault injection is the service's: a tenant may not fail devices every tenant shares")
def test_a_gang_over_two_hosts_with_a_failed_device_fails_with_the_device_not_the_other_hosts_abort(run_faults):
    # With host processes the host whose devices are healthy answers that
    # "another host of the gang could not run its part" (Aborted); the
    # buffer's error must be the cause, the failed device, whichever host
    # answers first (it was the abort in about 2 runs of 3).
    out = run_faults("""
s = pw.make_virtual_device_set().add_slice(tpu_devices=8)   # a whole island: 2 hosts
f = pw.pmap(lambda x: pw.psum(x, "i"), axis_name="i", devices=s.tpus)
print(np.asarray(f(np.ones(8)))[0])
victim = s.physical_devices[0]
pw.testing.fail_device(victim)
kinds = set()
for _ in range(30):
    try:
        np.asarray(f(np.ones(8)))
        kinds.add("ran")
    except pw.DeviceFailedError as e:
        kinds.add(f"device {victim.id} " in str(e))
    except pw.PathwaysError as e:
        kinds.add(str(e))
print(sorted(map(str, kinds)))
""")
    assert out.splitlines() == ["8.0", "['True']"], out
