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


_HOLDER = """
import sys, pathways as pw
pw.configure(server=sys.argv[1], name=sys.argv[2], devices=int(sys.argv[3]), memory=sys.argv[4])
print(",".join(str(d.id) for d in pw.devices()), pw.devices()[0].memory_capacity, flush=True)
sys.stdin.read()
"""


def test_tenants_hold_devices_and_memory_and_wait_for_them(service):
    # A holds 2 devices x 768 MiB of the 4 x 1 GiB.
    a = _tenant(service, _HOLDER, "A", "2", "768MiB")
    line = a.stdout.readline().split()
    assert len(line) == 2, a.stderr.read()
    a_devices = [int(d) for d in line[0].split(",")]
    assert len(a_devices) == 2 and int(line[1]) == 768 << 20
    # Within its grant a tenant computes; beyond its memory or devices it is told so.
    small = _run(service, "pw.configure(server=sys.argv[1], name='small', devices=2, memory='8MiB')",
                 "print([d.id for d in pw.devices()], pw.devices()[0].memory_capacity)",
                 "t = pw.make_virtual_device_set().add_slice(tpu_devices=2).tpus",
                 "f = pw.pmap(lambda x: x * 2.0 + pw.psum(x, 'i'), devices=t, axis_name='i')",
                 "print(np.asarray(f(np.arange(2, dtype=np.float32))).tolist())",
                 "try:",
                 "    pw.device_put(np.ones((2, 3_000_000), np.float32), t)",  # 12 MB on each
                 "except pw.ResourceExhaustedError as e:",
                 "    print('memory:', e)",
                 "try:",
                 "    pw.make_virtual_device_set().add_slice(tpu_devices=3)",
                 "except pw.ResourceExhaustedError as e:",
                 "    print('devices:', e)",
                 "print(json.dumps(pw.client_stats()['small']))").splitlines()
    devices, capacity = small[0].rsplit(" ", 1)
    assert set(json.loads(devices)).isdisjoint(a_devices)  # the least-held devices
    assert int(capacity) == 8 << 20
    assert small[1] == "[1.0, 3.0]"
    assert small[2].startswith("memory:") and "8388608 bytes" in small[2], small
    assert small[3].startswith("devices:") and "of this tenant's" in small[3], small
    stats = json.loads(small[4])
    assert stats["devices"] == 2 and stats["memory"] == 8 << 20
    # 4 x 512 MiB are not free while A holds its 768 MiB: the wait ends saying why.
    b = _run(service, "pw.configure(server=sys.argv[1], name='B', devices=4, memory=512 << 20, wait_timeout=0.5)",
             "try:",
             "    pw.devices()",
             "except pw.ResourceExhaustedError as e:",
             "    print(e)")
    assert "4 devices with 536870912 bytes (512 MiB) free on each" in b, b
    assert "2 of the 4 devices have that much free" in b and "'A' (tenant" in b and "768 MiB" in b, b
    # C waits for them, and gets them once A has gone.
    c = _tenant(service, """
import sys, time, numpy as np, pathways as pw
pw.configure(server=sys.argv[1], name="C", devices=4, memory="512MiB", wait_timeout=30)
print("asking", flush=True)
start = time.monotonic()
t = pw.make_virtual_device_set().add_slice(tpu_devices=4).tpus
f = pw.pmap(lambda x: x * 2.0 + pw.psum(x, 'i'), devices=t, axis_name='i')
print(np.asarray(f(np.arange(4, dtype=np.float32))).tolist(), round(time.monotonic() - start, 1), flush=True)
""")
    assert c.stdout.readline().strip() == "asking", c.stderr.read()
    time.sleep(1.0)
    assert c.poll() is None  # still waiting
    a.stdin.close()
    assert a.wait(timeout=30) == 0, a.stderr.read()
    out, err = c.communicate(timeout=60)
    assert c.returncode == 0, err
    result, waited = out.rsplit(" ", 1)
    assert result == "[6.0, 8.0, 10.0, 12.0]"
    assert float(waited) >= 0.9


def test_a_tenant_asks_for_no_more_than_it_may(service):
    out = _run(service,
               "for kw in ({'devices': 0}, {'devices': 1.5}, {'memory': 'lots'}, {'memory': -1},",
               "           {'wait_timeout': -1}, {'wait_timeout': float('nan')}):",
               "    try:",
               "        pw.configure(server=sys.argv[1], **kw)",
               "    except (TypeError, ValueError) as e:",
               "        print(type(e).__name__, e)",
               "pw.configure(server=sys.argv[1], devices=5)",
               "try:",
               "    pw.devices()",
               "except ValueError as e:",
               "    print('at the service:', e)").splitlines()
    assert len(out) == 7, out
    assert out[0] == "ValueError configure: devices must be at least 1, got 0"
    assert out[1].startswith("TypeError configure: devices must be an int")
    assert out[2].startswith("ValueError configure: memory must be a size") and "'lots'" in out[2]
    assert out[3].startswith("ValueError configure: memory must be at least 1 byte")
    assert out[4].startswith("ValueError configure: wait_timeout must be from 0 to 86400")
    assert out[5].startswith("ValueError configure: wait_timeout must be from 0 to 86400")
    assert "devices=5: a tenant of this service holds 1 to 4 devices" in out[6], out[6]
    # Quota keywords belong to a tenant.
    with pytest.raises(ValueError, match="devices, memory are a service's tenant's"):
        import pathways as pw
        pw.configure(devices=2, memory="1MiB")


def test_a_service_whose_hosts_ray_places(tmp_path):
    # One machine, Ray: the service's hosts are placed by Ray actors of a
    # one-node Ray instance on loopback (SPREAD: one node cannot take
    # STRICT_SPREAD's one host per node), and a tenant runs a gang spanning
    # them.
    pytest.importorskip("ray")
    connection = tmp_path / "server.json"
    server = subprocess.Popen([sys.executable, "-c", """
import os, sys
import ray
ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, logging_level="ERROR",
         _node_ip_address="127.0.0.1")
os.environ["PATHWAYS_RAY_LISTEN_IP"] = "127.0.0.1"
os.environ["PATHWAYS_RAY_STRATEGY"] = "SPREAD"
from pathways import server
code = server.main(sys.argv[1:])
ray.shutdown()
sys.exit(code)
""", f"--connection-file={connection}", "--topology=islands=1,hosts_per_island=2,devices_per_host=2,hosts=ray"],
        stdout=subprocess.PIPE, stderr=open(tmp_path / "server.err", "wb"), env=_env())
    try:
        line = server.stdout.readline().decode()
        assert line.startswith("pathways-server ready"), (line, (tmp_path / "server.err").read_text())
        out = _run(connection, "pw.configure(server=sys.argv[1], name='on-ray')",
                   "t = pw.make_virtual_device_set().add_slice(tpu_devices=4).tpus",
                   "f = pw.pmap(lambda x: x * 2.0 + pw.psum(x, 'i'), devices=t, axis_name='i')",
                   "print(np.asarray(f(np.arange(4, dtype=np.float32))).tolist())",
                   "hosts = pw.hosts()",
                   "print(json.dumps([int(open(f'/proc/{h.pid}/stat').read().rsplit(')', 1)[1].split()[1])",
                   "                  for h in hosts]))",
                   "print(pw.topology()['hosts'])").splitlines()
        assert out[0] == "[6.0, 8.0, 10.0, 12.0]", out
        parents = json.loads(out[1])
        # Two hosts, each a child of a Ray worker, not of the service.
        assert len(parents) == 2 and len(set(parents)) == 2 and server.pid not in parents, (parents, server.pid)
        assert out[2] == "service"
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=60) == 0, (tmp_path / "server.err").read_text()


@pytest.mark.parametrize("flag, says", [
    ("--tenant-memory=lots", "--tenant-memory must be a size"),
    ("--max-tenant-devices=5", "max_tenant_devices (--max-tenant-devices) must be from 0 (every device) to 4"),
    ("--max-tenant-memory=2GiB", "max_tenant_memory (--max-tenant-memory) must be from 0"),
])
def test_the_server_refuses_bad_quotas(tmp_path, flag, says):
    out = subprocess.run([sys.executable, "-m", "pathways.server", f"--connection-file={tmp_path / 's.json'}",
                          f"--topology={TOPOLOGY}", flag], capture_output=True, text=True, env=_env(), timeout=60)
    assert out.returncode != 0 and says in out.stderr, out.stderr
    assert not (tmp_path / "s.json").exists()
