"""The pathways service (issue 27): tenants as client processes of one pathways-server.

These tests start a service of their own (1 island x 2 hosts x 2 devices)
and tenants as subprocesses, once, in the suite's first pass; the rest of
the suite runs as a tenant with --hosts=service.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from conftest import PYTHON_DIR

TOPOLOGY = "islands=1,hosts_per_island=2,devices_per_host=2"


@pytest.fixture(autouse=True)
def _first_pass_only(request):
    if request.config.getoption("--hosts") != "in_process":
        pytest.skip("starts a service of its own: once, in the first pass")


def _env() -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PATHWAYS_TOPOLOGY", "PATHWAYS_SERVER", "PATHWAYS_SERVER_SECRET")}
    env["PYTHONPATH"] = os.pathsep.join([str(PYTHON_DIR)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


@pytest.fixture
def service(tmp_path):
    """A running pathways-server: its connection file; stopped after the test."""
    connection = tmp_path / "server.json"
    err = open(tmp_path / "server.err", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "pathways.server", f"--connection-file={connection}",
                             f"--topology={TOPOLOGY}"], stdout=subprocess.PIPE, stderr=err, env=_env())
    line = proc.stdout.readline().decode()
    assert line.startswith("pathways-server ready"), (line, (tmp_path / "server.err").read_text())
    assert oct(connection.stat().st_mode & 0o777) == "0o600"
    yield connection
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0, (tmp_path / "server.err").read_text()
    assert not connection.exists()  # removed at exit


def _tenant(connection, code: str, *args: str) -> subprocess.Popen:
    """A tenant process running `code` (sys.argv[1]: the connection file)."""
    return subprocess.Popen([sys.executable, "-c", code, str(connection), *args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(), text=True)


def _run(server: str, *lines: str, env: dict | None = None) -> str:
    """Runs `lines` in a fresh tenant process (sys.argv[1]: `server`); its stdout, failing on an error."""
    out = subprocess.run([sys.executable, "-c", "\n".join(("import json, sys, time, numpy as np, pathways as pw",)
                                                          + lines), str(server)],
                         capture_output=True, text=True, env={**_env(), **(env or {})}, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def _stats(connection) -> dict:
    """pw.client_stats() as seen by a fresh tenant."""
    return json.loads(_run(connection, "pw.configure(server=sys.argv[1], name='observer')",
                           "print(json.dumps(pw.client_stats()))"))


_HOG = """
import sys, numpy as np, pathways as pw
pw.configure(server=sys.argv[1], name=sys.argv[2], priority=int(sys.argv[3]))
t = pw.make_virtual_device_set().add_slice(tpu_devices=4).tpus
slow = pw.pmap(lambda x: pw.simulated_compute(x + 1.0, float(sys.argv[4])), devices=t)
keep = [pw.device_put(np.ones((4, 250_000), np.float32), t) for _ in range(8)]  # 32 MB held
x = pw.device_put(np.zeros(4, np.float32), t)
np.asarray(slow(x))
print("compiled", flush=True)
for _ in range(int(sys.argv[5])):
    x = slow(x)
print("queued", flush=True)
print(float(np.asarray(x)[0]), flush=True)
sys.stdin.read()
"""


def test_a_killed_tenant_is_freed_within_2_s_and_the_others_run_on(service):
    # The hog queues 20 s of gangs on every device and holds 32 MB; killed
    # with SIGKILL, its queue is cancelled and the hosts free its session.
    hog = _tenant(service, _HOG, "hog", "0", "500000", "40")
    assert hog.stdout.readline().strip() == "compiled", hog.stderr.read()
    assert hog.stdout.readline().strip() == "queued"
    time.sleep(0.3)
    start = time.monotonic()
    hog.kill()
    hog.wait()
    other = _run(service, "pw.configure(server=sys.argv[1], name='other')",
                 "t = pw.make_virtual_device_set().add_slice(tpu_devices=4).tpus",
                 "f = pw.pmap(lambda x: x * 2.0 + pw.psum(x, 'i'), devices=t, axis_name='i')",
                 "print(np.asarray(f(np.arange(4, dtype=np.float32))).tolist())")
    elapsed = time.monotonic() - start
    assert other.strip() == "[6.0, 8.0, 10.0, 12.0]"
    assert elapsed < 10, elapsed  # not behind the hog's 20 s of gangs
    deadline = time.monotonic() + 10
    while True:
        hog_stats = _stats(service)["hog"]
        if hog_stats["freed"] or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert hog_stats["ended"] and hog_stats["freed"], hog_stats
    report_after = hog_stats.get("freed_after_seconds")
    assert report_after is None or report_after < 2.0


def test_a_higher_priority_tenant_goes_ahead_of_a_lower_ones_queue(service):
    # The low tenant queues 30 gangs of 100 ms on every device (3 s); the
    # high one's gang, submitted after them, finishes long before they do.
    low = _tenant(service, _HOG, "low", "0", "100000", "30")
    assert low.stdout.readline().strip() == "compiled", low.stderr.read()
    assert low.stdout.readline().strip() == "queued"
    high = _run(service, "pw.configure(server=sys.argv[1], name='high', priority=10)",
                "t = pw.make_virtual_device_set().add_slice(tpu_devices=4).tpus",
                "f = pw.pmap(lambda x: x + 1.0, devices=t)",
                "start = time.monotonic()",
                "print(np.asarray(f(np.zeros(4, np.float32))).tolist(), time.monotonic() - start)")
    result, seconds = high.rsplit(" ", 1)
    assert result == "[1.0, 1.0, 1.0, 1.0]"
    # The low tenant's queue is still there when the high one is done.
    low_done = low.stdout.readline().strip()
    assert float(low_done) == 30.0
    stats = _stats(service)
    assert stats["high"]["priority"] == 10 and stats["low"]["priority"] == 0
    assert float(seconds) < 1.5, (seconds, stats)
    low.stdin.close()
    assert low.wait(timeout=30) == 0, low.stderr.read()


def test_garbage_and_a_wrong_secret_are_refused_and_the_service_serves_on(service):
    info = json.loads(service.read_text())
    host, port = info["address"].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(os.urandom(4096))
        s.settimeout(5)
        try:
            s.recv(100)
        except OSError:
            pass
    wrong = _run(info["address"], "pw.configure(server=sys.argv[1])",
                 "try:\n    pw.devices()\nexcept Exception as e:\n    print(type(e).__name__, e)",
                 env={"PATHWAYS_SERVER_SECRET": "0" * 64})
    assert "secret" in wrong or "authenticat" in wrong.lower(), wrong
    ok = _run(service, "pw.configure(server=sys.argv[1])",
              "t = pw.make_virtual_device_set().add_slice(tpu_devices=2).tpus",
              "print(np.asarray(pw.pmap(lambda x: x * 3.0, devices=t)(np.ones(2))).tolist())")
    assert ok.strip() == "[3.0, 3.0]"


def test_a_tenant_may_set_no_topology_and_inject_no_faults(service):
    out = _run(service, "try:\n    pw.configure(server=sys.argv[1], islands=2)\nexcept ValueError as e:\n    print(e)",
               "pw.configure(server=sys.argv[1])",
               "print(pw.topology()['hosts'], len(pw.devices()))",
               "try:\n    pw.testing.fail_device(0)\nexcept Exception as e:\n    print(type(e).__name__, e)")
    lines = out.splitlines()
    assert "the topology is the service's" in lines[0]
    assert lines[1] == "service 4"
    assert "fault injection is the service's" in lines[2]
