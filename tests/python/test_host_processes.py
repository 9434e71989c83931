"""Host processes on loopback (issue 8): start, report, stop with the client.

A host is `python -m pathways.host`; these tests check its life cycle, not
yet programs run on it.
"""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import pathways as pw
from pathways import _core, _hosts


def _gone(pid: int, timeout: float) -> bool:
    """True once no process `pid` exists (waiting up to `timeout` s)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.02)
    return False


def test_this_build_has_host_processes():
    # `make` installs gRPC, protobuf and Gloo; a build without them would
    # silently lose process mode.
    assert _core.has_host_processes


def test_hosts_start_report_distinct_addresses_and_stop():
    hosts = _hosts.start_local_hosts(3, _hosts.make_secret())
    try:
        assert len({h.address for h in hosts}) == 3
        assert len({h.pid for h in hosts}) == 3
        assert len({h.incarnation for h in hosts}) == 3
        for h in hosts:
            assert h.alive()
            assert h.address.startswith("127.0.0.1:")
            assert h.pid == h.process.pid
    finally:
        codes = _hosts.stop_local_hosts(hosts)
    assert codes == [0, 0, 0]
    assert "its client's pipe closed" in hosts[0].stderr_text()


def test_hosts_exit_when_their_client_is_killed():
    # A client that starts two hosts and is then killed: its hosts must not
    # stay behind.
    script = textwrap.dedent("""
        import sys, time
        from pathways import _hosts
        hosts = _hosts.start_local_hosts(2, _hosts.make_secret())
        print(" ".join(str(h.pid) for h in hosts), flush=True)
        time.sleep(600)
    """)
    client = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    try:
        line = client.stdout.readline()
        pids = [int(p) for p in line.split()]
        assert len(pids) == 2, line
        for pid in pids:
            assert not _gone(pid, 0.0)
        client.send_signal(signal.SIGKILL)
        client.wait(10)
        for pid in pids:
            assert _gone(pid, 10.0), f"host {pid} outlived its client"
    finally:
        client.kill()
        client.wait()


def test_bad_arguments_and_a_missing_secret_are_refused():
    bad = subprocess.run([sys.executable, "-m", "pathways.host", "--port=1"], capture_output=True, timeout=60)
    assert bad.returncode == 2
    assert b"unknown argument '--port=1'" in bad.stderr
    env = dict(os.environ)
    env.pop("PATHWAYS_SECRET", None)
    no_secret = subprocess.run([sys.executable, "-m", "pathways.host"], capture_output=True, timeout=60, env=env)
    assert no_secret.returncode == 2
    assert b"no secret" in no_secret.stderr
    usage = subprocess.run([sys.executable, "-m", "pathways.host", "--help"], capture_output=True, timeout=60)
    assert usage.returncode == 0 and b"--secret-stdin" in usage.stdout


def test_a_host_that_cannot_listen_is_reported_with_its_error():
    with pytest.raises(RuntimeError, match=r"(?s)host process 0 .* exited; its output: .*cannot listen on 256\.0\.0\.1:0"):
        _hosts.start_local_hosts(1, _hosts.make_secret(), listen="256.0.0.1:0")


def test_a_host_started_by_hand_stops_when_no_client_configures_it():
    env = dict(os.environ, PATHWAYS_SECRET=_hosts.make_secret())
    proc = subprocess.run([sys.executable, "-m", "pathways.host", "--configure-timeout=0.3"],
                          capture_output=True, timeout=60, env=env)
    assert proc.returncode == 0
    assert proc.stdout.startswith(b"pathways-host ready address=127.0.0.1:")
    assert b"no client configured it in time" in proc.stderr


def test_a_client_configures_its_hosts_and_sees_one_killed():
    secret = _hosts.make_secret()
    hosts = _hosts.start_local_hosts(4, secret)
    try:
        pool = _hosts.connect(hosts, secret, islands=2, hosts_per_island=2, devices_per_host=2)
        info = pool.hosts()
        assert [h["id"] for h in info] == [0, 1, 2, 3]
        assert [h["island"] for h in info] == [0, 0, 1, 1]
        assert [h["pid"] for h in info] == [h.pid for h in hosts]
        assert [h["address"] for h in info] == [h.address for h in hosts]
        assert [h["incarnation"] for h in info] == [h.incarnation for h in hosts]
        assert all(h["alive"] and h["status"] is None for h in info)

        os.kill(hosts[2].pid, signal.SIGKILL)
        start = time.monotonic()
        while pool.hosts()[2]["alive"] and time.monotonic() - start < 10:
            time.sleep(0.01)
        lost = pool.hosts()[2]
        assert not lost["alive"], "the killed host is still listed alive"
        assert f"host 2 ({hosts[2].address}) was lost" in lost["status"]
        assert [h["alive"] for h in pool.hosts()] == [True, True, False, True]

        # Closing the client's sessions stops the hosts it configured.
        pool.close()
        for h in (hosts[0], hosts[1], hosts[3]):
            assert h.process.wait(10) == 0
            assert "its client's session ended" in h.stderr_text()
    finally:
        _hosts.stop_local_hosts(hosts)


def test_the_wrong_secret_is_refused_and_the_hosts_keep_serving():
    secret = _hosts.make_secret()
    hosts = _hosts.start_local_hosts(1, secret)
    try:
        with pytest.raises(pw.PathwaysError, match=r"host 0 \(127\.0\.0\.1:\d+\) refused the session"):
            _hosts.connect(hosts, "not-" + secret, islands=1, hosts_per_island=1, devices_per_host=1)
        pool = _hosts.connect(hosts, secret, islands=1, hosts_per_island=1, devices_per_host=1)
        assert pool.hosts()[0]["alive"]
        pool.close()
    finally:
        _hosts.stop_local_hosts(hosts)
