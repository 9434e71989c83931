"""Host processes on loopback (issue 8): start, report, stop with the client,
run programs, and fail cleanly when a host dies.

A host is `python -m pathways.host`. The whole Python suite also runs with
the runtime's hosts as processes (`pytest --hosts=local_processes`, part of
`make test`); the tests here check what only process mode has.
"""

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
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
        sessions = _hosts.connect(hosts, secret, islands=2, hosts_per_island=2, devices_per_host=2)
        info = sessions.hosts()
        assert [h["id"] for h in info] == [0, 1, 2, 3]
        assert [h["island"] for h in info] == [0, 0, 1, 1]
        assert [h["pid"] for h in info] == [h.pid for h in hosts]
        assert [h["address"] for h in info] == [h.address for h in hosts]
        assert [h["incarnation"] for h in info] == [h.incarnation for h in hosts]
        assert all(h["alive"] and h["status"] is None for h in info)

        os.kill(hosts[2].pid, signal.SIGKILL)
        start = time.monotonic()
        while sessions.hosts()[2]["alive"] and time.monotonic() - start < 10:
            time.sleep(0.01)
        lost = sessions.hosts()[2]
        assert not lost["alive"], "the killed host is still listed alive"
        assert f"host 2 ({hosts[2].address}) was lost" in lost["status"]
        assert [h["alive"] for h in sessions.hosts()] == [True, True, False, True]

        # Closing the client's sessions stops the hosts it configured.
        sessions.close()
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
        sessions = _hosts.connect(hosts, secret, islands=1, hosts_per_island=1, devices_per_host=1)
        assert sessions.hosts()[0]["alive"]
        sessions.close()
    finally:
        _hosts.stop_local_hosts(hosts)


def _run_local_processes(code: str, timeout: float = 120, env: dict | None = None) -> str:
    from conftest import run_python
    return run_python("import pathways as pw\npw.configure(hosts='local_processes')\n" + textwrap.dedent(code),
                      timeout=timeout, env=env)


def test_figure2_runs_on_four_host_processes():
    out = _run_local_processes("""
        import os, numpy as np
        def get_devices(n):
            return pw.make_virtual_device_set().add_slice(tpu_devices=n).tpus
        a = pw.pmap(lambda x: x * 2., devices=get_devices(2))
        b = pw.pmap(lambda x: x + 1., devices=get_devices(2))
        c = pw.pmap(lambda x: x / 2., devices=get_devices(2))
        @pw.program
        def f(v):
            x = a(v)
            y = b(x)
            z = a(c(x))
            return (y, z)
        y, z = f(np.array([1., 2.]))
        print(np.asarray(y).tolist(), np.asarray(z).tolist())
        hosts = pw.hosts()
        print(len(hosts), len({h.pid for h in hosts}), all(h.alive for h in hosts),
              all(h.pid != os.getpid() for h in hosts), sorted({h.island for h in hosts}))
        # Parallel dispatch: one control message per program to each host
        # that takes part (the program is known to the hosts after its first run).
        before = pw._core.control_messages()
        for _ in range(20):
            y, z = f(y)
        z.block_until_ready()
        after = pw._core.control_messages()
        print(sorted({b - a for a, b in zip(before, after)}))
    """)
    lines = out.split("\n")
    assert lines[0] == "[3.0, 5.0] [2.0, 4.0]"
    assert lines[1] == "4 4 True True [0, 1]"
    # Figure 2's slices use host 0 (island 0) and host 2 (island 1) only.
    assert lines[2] == "[0, 20]"


def test_cross_host_gang_collectives_match_in_process():
    # Byte for byte, except the float psum and pmean: across hosts they add
    # each host's shards first, then the hosts' sums (hierarchically), so
    # their last bits may differ from the in-process sum in shard order.
    # pmax and the int32 psum (which wraps) stay exact.
    code = """
        import numpy as np
        t = pw.make_virtual_device_set().add_slice(tpu_devices=8).tpus  # spans the island's 2 hosts
        f = pw.pmap(lambda x, k: (pw.all_gather(x, "i"), pw.axis_index("i") * x,
                                  pw.ppermute(x, "i", [(j, (j + 1) % 8) for j in range(8)]),
                                  pw.pmax(x, "i"), pw.psum(k, "i"), pw.psum(x, "i"), pw.pmean(x, "i")),
                    axis_name="i", devices=t)
        x = np.arange(8 * 3, dtype=np.float32).reshape(8, 3) / 7
        k = (np.arange(8 * 3, dtype=np.int64).reshape(8, 3) * 2654435761 % 2**32 - 2**31).astype(np.int32)
        outs = [np.asarray(o) for o in f(x, k)]
        print(repr([o.tobytes().hex() for o in outs[:5]]))
        print(repr([o.tolist() for o in outs[5:]]))
    """
    from conftest import run_python
    in_process = run_python("import pathways as pw\n" + textwrap.dedent(code)).split("\n")
    processes = _run_local_processes(code).split("\n")
    assert processes[0] == in_process[0]
    np.testing.assert_allclose(eval(processes[1]), eval(in_process[1]), rtol=1e-6, atol=0)


def test_killed_host_fails_its_programs_with_host_lost_error():
    out = _run_local_processes("""
        import os, signal, time, numpy as np
        hosts = pw.hosts()
        tpus = pw.make_virtual_device_set().add_slice(tpu_devices=4).tpus
        slow = pw.pmap(lambda x: pw.simulated_compute(x + 1., 3e6), devices=tpus)
        y = slow(np.zeros(4))
        victim = hosts[tpus[0].physical.host]
        time.sleep(0.3)
        os.kill(victim.pid, signal.SIGKILL)
        t0 = time.monotonic()
        try:
            y.block_until_ready()
            print("no error")
        except pw.HostLostError as e:
            print("HostLostError", f"host {victim.id}" in str(e), time.monotonic() - t0 < 2.0)
        print([h.alive for h in pw.hosts()] == [h.id != victim.id for h in hosts])
        # The other island keeps working.
        other = pw.make_virtual_device_set().add_slice(tpu_devices=4).tpus
        while other[0].physical.island == victim.island:
            other = pw.make_virtual_device_set().add_slice(tpu_devices=4).tpus
        g = pw.pmap(lambda x: pw.psum(x, "i"), axis_name="i", devices=other)
        print(np.asarray(g(np.arange(4.))).tolist())
    """)
    lines = out.split("\n")
    assert lines[0] == "HostLostError True True", out
    assert lines[1] == "True", out
    assert lines[2] == "[6.0, 6.0, 6.0, 6.0]", out


@pytest.mark.parametrize("victim", ["lower", "upper"])
def test_a_host_killed_while_idle_fails_new_programs_on_its_island_at_once(victim):
    # Island 1's two hosts (2 and 3); a program ran on both before the kill.
    # A new program on the slice then needs the lost host: it fails at
    # dispatch, and nothing of it goes to the survivor, which used to wait
    # out its connect to the lost host's rendezvous store (lower: 10 s) or
    # the Gloo rendezvous (upper: 30 s) before the run could fail.
    out = _run_local_processes(f"""
        import os, signal, time, numpy as np
        hosts = pw.hosts()
        island0 = pw.make_virtual_device_set().add_slice(tpu_devices=8)  # held: the next slice is island 1
        t = pw.make_virtual_device_set().add_slice(tpu_devices=8).tpus
        pair = sorted({{d.physical.host for d in t}})
        print(pair)
        print(np.asarray(pw.pmap(lambda x: x + 1., devices=t)(np.zeros(8))).tolist() == [1.0] * 8)
        victim = hosts[pair[0] if "{victim}" == "lower" else pair[1]]
        os.kill(victim.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while pw.hosts()[victim.id].alive and time.monotonic() < deadline:
            time.sleep(0.001)
        g = pw.pmap(lambda x: pw.psum(x, "i"), axis_name="i", devices=t)
        t0 = time.monotonic()
        try:
            np.asarray(g(np.arange(8.)))
            print("no error")
        except pw.HostLostError as e:
            took = time.monotonic() - t0
            print("HostLostError", f"host {{victim.id}}" in str(e), took < 2.0 or took)
        # The surviving host of the island and the other island keep working.
        survivor = [d for d in t if d.physical.host != victim.id][:2]
        print(np.asarray(pw.pmap(lambda x: x * 3., devices=survivor)(np.ones(2))).tolist())
        other = pw.make_virtual_device_set().add_slice(tpu_devices=8).tpus
        print(np.asarray(pw.pmap(lambda x: pw.psum(x, "i"), axis_name="i", devices=other)(np.arange(8.))).tolist())
    """)
    lines = out.split("\n")
    assert lines[0] == "[2, 3]", out
    assert lines[1] == "True", out
    assert lines[2] == "HostLostError True True", out
    assert lines[3] == "[3.0, 3.0]", out
    assert lines[4] == str([28.0] * 8), out


@pytest.mark.parametrize("victim", ["lower", "upper"])
def test_a_host_killed_under_a_run_in_flight_does_not_keep_the_survivor_waiting(victim):
    # The run was sent before the kill: the survivor's part of the psum
    # meets the lost host only after its 1.5 s producer. The client tells it
    # of the loss, so it fails that part at once instead of waiting for the
    # lost host's store (10 s) or its Gloo rendezvous (30 s); the run's
    # error comes once the survivor replies.
    out = _run_local_processes(f"""
        import os, signal, time, numpy as np
        hosts = pw.hosts()
        island0 = pw.make_virtual_device_set().add_slice(tpu_devices=8)  # held: the next slice is island 1
        t = pw.make_virtual_device_set().add_slice(tpu_devices=8).tpus
        pair = sorted({{d.physical.host for d in t}})
        slow = pw.pmap(lambda x: pw.simulated_compute(x + 1., 1_500_000), devices=t)
        total = pw.pmap(lambda x: pw.psum(x, "i"), axis_name="i", devices=t)
        @pw.program
        def f(x):
            return total(slow(x))
        y = f(np.zeros(8))
        victim = hosts[pair[0] if "{victim}" == "lower" else pair[1]]
        os.kill(victim.pid, signal.SIGKILL)
        t0 = time.monotonic()
        try:
            np.asarray(y)
            print("no error")
        except pw.HostLostError as e:
            took = time.monotonic() - t0
            print("HostLostError", f"host {{victim.id}}" in str(e), took < 6.0 or took)
        survivor = [d for d in t if d.physical.host != victim.id][:2]
        print(np.asarray(pw.pmap(lambda x: x * 3., devices=survivor)(np.ones(2))).tolist())
    """)
    lines = out.split("\n")
    assert lines[0] == "HostLostError True True", out
    assert lines[1] == "[3.0, 3.0]", out


def test_a_slow_put_does_not_lose_a_healthy_host():
    # Each host takes 1 s over every 16 MiB chunk of a put (a throttled host,
    # PATHWAYS_HOST_TEST_DELAYS): 128 MiB per host keeps each busy on its
    # session's thread for 8 s, and each 64 MiB frame takes 4 s to go, so
    # neither replies nor write progress come within the 3 s heartbeat
    # timeout. Heartbeats go on their own connection and are answered on a
    # thread of their own: both hosts stay alive and the data arrives whole.
    out = _run_local_processes("""
        import time, numpy as np
        t = pw.make_virtual_device_set().add_slice(tpu_devices=8).tpus
        x = np.arange(8 * 4 * 2**20, dtype=np.float64).reshape(8, 4 * 2**20)  # 128 MiB per host
        t0 = time.monotonic()
        y = pw.device_put(x, t)
        back = np.asarray(y)
        print(time.monotonic() - t0 > 6.0, np.array_equal(back, x))
        print(all(h.alive for h in pw.hosts()))
    """, env={"PATHWAYS_HOST_TEST_DELAYS": "put=1"}, timeout=180)
    assert out.split("\n")[:2] == ["True True", "True"], out


def test_a_slow_compile_does_not_lose_a_healthy_host():
    # Each host takes 4 s before compiling a function (PATHWAYS_HOST_TEST_DELAYS),
    # on its session's thread: longer than the 3 s heartbeat timeout.
    out = _run_local_processes("""
        import time, numpy as np
        t = pw.make_virtual_device_set().add_slice(tpu_devices=8).tpus
        t0 = time.monotonic()
        y = pw.pmap(lambda x: pw.psum(x, "i"), axis_name="i", devices=t)(np.arange(8.))
        print(np.asarray(y).tolist() == [28.0] * 8, time.monotonic() - t0 > 4.0)
        print(all(h.alive for h in pw.hosts()))
    """, env={"PATHWAYS_HOST_TEST_DELAYS": "load_function=4"})
    assert out.split("\n")[:2] == ["True True", "True"], out


def test_a_stopped_host_is_lost_within_the_heartbeat_timeout():
    # SIGSTOP: the process lives and its connections stay open, but it
    # answers nothing. Lost after the 3 s heartbeat timeout (not the old
    # 10 s), then programs that need it fail at once and the rest works.
    out = _run_local_processes("""
        import os, signal, time, numpy as np
        hosts = pw.hosts()
        t = pw.make_virtual_device_set().add_slice(tpu_devices=8).tpus  # island 0: hosts 0 and 1
        print(np.asarray(pw.pmap(lambda x: x + 1., devices=t)(np.zeros(8))).tolist() == [1.0] * 8)
        victim = hosts[1]
        os.kill(victim.pid, signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            while pw.hosts()[1].alive and time.monotonic() - t0 < 20:
                time.sleep(0.01)
            took = time.monotonic() - t0
            print(pw.hosts()[1].alive, 2.0 < took < 6.0 or took)
            print("host 1" in pw.hosts()[1].status and "no sign of life" in pw.hosts()[1].status)
            t0 = time.monotonic()
            try:
                np.asarray(pw.pmap(lambda x: pw.psum(x, "i"), axis_name="i", devices=t)(np.arange(8.)))
                print("no error")
            except pw.HostLostError as e:
                print("HostLostError", time.monotonic() - t0 < 2.0)
            survivor = [d for d in t if d.physical.host == 0][:2]
            print(np.asarray(pw.pmap(lambda x: x * 3., devices=survivor)(np.ones(2))).tolist())
            other = pw.make_virtual_device_set().add_slice(tpu_devices=8).tpus
            print(np.asarray(pw.pmap(lambda x: pw.psum(x, "i"), axis_name="i", devices=other)(np.arange(8.))).tolist())
        finally:
            os.kill(victim.pid, signal.SIGKILL)
    """)
    lines = out.split("\n")
    assert lines[0] == "True", out
    assert lines[1] == "False True", out
    assert lines[2] == "True", out
    assert lines[3] == "HostLostError True", out
    assert lines[4] == "[3.0, 3.0]", out
    assert lines[5] == str([28.0] * 8), out


def test_with_host_0_lost_the_other_island_makes_new_cross_host_gangs():
    # A collective group of hosts meets in the store of its lowest host, not
    # host 0's: island 1's first gang over both its hosts, made after host 0
    # died, still forms and runs.
    out = _run_local_processes("""
        import os, signal, time, numpy as np
        hosts = pw.hosts()
        os.kill(hosts[0].pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while pw.hosts()[0].alive and time.monotonic() < deadline:
            time.sleep(0.01)
        print(pw.hosts()[0].alive)
        t = pw.make_virtual_device_set().add_slice(tpu_devices=8).tpus
        print(sorted({d.physical.host for d in t}))
        g = pw.pmap(lambda x: pw.psum(x, "i"), axis_name="i", devices=t)
        print(np.asarray(g(np.arange(8.))).tolist())
    """)
    lines = out.split("\n")
    assert lines[0] == "False", out
    assert lines[1] == "[2, 3]", out
    assert lines[2] == str([28.0] * 8), out


def test_client_exit_with_work_in_flight_leaves_no_host_behind():
    out = _run_local_processes("""
        import numpy as np
        slow = pw.pmap(lambda x: pw.simulated_compute(x, 5e6),
                       devices=pw.make_virtual_device_set().add_slice(tpu_devices=2).tpus)
        y = slow(np.zeros(2))
        print(" ".join(str(h.pid) for h in pw.hosts()))
    """)
    pids = [int(p) for p in out.split()]
    assert len(pids) == 4
    for pid in pids:
        assert _gone(pid, 10.0), f"host process {pid} outlived its client"


def test_more_overlapping_cross_host_gangs_than_device_threads():
    # Each host runs a gang's part on a thread of its own device; a part
    # waiting in a cross-host collective must never keep an earlier gang
    # from its thread. 12 threads dispatch gangs over overlapping slices
    # (8 devices: both hosts of an island; 4 and 2: one host or two), far
    # more gangs in flight than any host has device threads.
    out = _run_local_processes("""
        import threading, numpy as np
        slices = [pw.make_virtual_device_set().add_slice(tpu_devices=n).tpus for n in (8, 8, 4, 4, 2, 2)]
        fns = [pw.pmap(lambda x: pw.psum(x, "i") + pw.axis_index("i"), axis_name="i", devices=s) for s in slices]
        errors = []
        def worker(k):
            try:
                f = fns[k % len(fns)]
                n = len(slices[k % len(fns)])
                x = np.arange(n, dtype=np.float64) + k
                outs = [f(x) for _ in range(30)]
                want = x.sum() + np.arange(n)
                for o in outs:
                    np.testing.assert_array_equal(np.asarray(o), want)
            except Exception as e:
                errors.append(repr(e))
        threads = [threading.Thread(target=worker, args=(k,)) for k in range(12)]
        for t in threads: t.start()
        for t in threads: t.join(60)
        print(sum(t.is_alive() for t in threads), errors)
    """, timeout=120)
    assert out.strip() == "0 []", out


def test_bad_hosts_option_is_a_clear_error():
    from conftest import run_python
    out = run_python("""
        import pathways as pw
        for bad, kind in (("remote", ValueError), (3, TypeError)):
            try:
                pw.configure(hosts=bad)
                print("accepted", bad)
            except kind as e:
                print(kind.__name__, "hosts" in str(e))
        pw.configure(hosts="in_process")
        print(pw.topology()["hosts"], pw.hosts()[0].address)
    """)
    assert out.split("\n")[:3] == ["ValueError True", "TypeError True", "in_process None"], out
    out = run_python("""
        import pathways as pw
        try:
            pw.devices()
        except ValueError as e:
            print("ValueError", "hosts" in str(e))
    """, env={"PATHWAYS_TOPOLOGY": "hosts=bogus"})
    assert out.strip() == "ValueError True", out


def test_hosts_on_a_local_ray_cluster():
    pytest.importorskip("ray")
    from conftest import run_python
    # A one-node Ray instance on loopback: the hosts are placed by Ray actors
    # (SPREAD, since one node cannot take STRICT_SPREAD's one host per node;
    # several Ray nodes on one machine would need addresses other than
    # loopback), report their addresses, and run a gang spanning hosts.
    out = run_python("""
        import os
        import ray
        ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, logging_level="ERROR",
                 _node_ip_address="127.0.0.1")
        os.environ["PATHWAYS_RAY_LISTEN_IP"] = "127.0.0.1"
        os.environ["PATHWAYS_RAY_STRATEGY"] = "SPREAD"
        import numpy as np, pathways as pw
        pw.configure(hosts="ray")
        a = pw.pmap(lambda x: pw.psum(x, "i") * 2., axis_name="i",
                    devices=pw.make_virtual_device_set().add_slice(tpu_devices=8).tpus)
        print(np.asarray(a(np.arange(8.))).tolist())
        hosts = pw.hosts()
        # Each host's parent is a Ray actor's worker process, not this client.
        parents = {int(open(f"/proc/{h.pid}/stat").read().rsplit(")", 1)[1].split()[1]) for h in hosts}
        print(len(hosts), len({h.pid for h in hosts}), all(h.alive and h.address.startswith("127.0.0.1:") for h in hosts),
              len(parents), os.getpid() not in parents)
        print(pw.topology()["hosts"])
        ray.shutdown()
    """, timeout=180)
    lines = out.strip().split("\n")
    assert lines[0] == str([56.0] * 8), out
    assert lines[1] == "4 4 True 4 True", out
    assert lines[2] == "ray", out


class _FakeRay:
    """Just enough of Ray for pathways._ray_hosts, in this process: every
    argument of a remote call and every result goes through pickle, as with
    Ray, and is kept, so a test can see what Ray would have stored."""

    def __init__(self):
        import pickle
        import types
        self.carried = []  # pickled arguments and results, in order
        fake = self

        class Ref:
            def __init__(self, value):
                self.data = pickle.dumps(value)
                fake.carried.append(self.data)

        class Method:
            def __init__(self, instance, name):
                self.instance, self.name = instance, name

            def remote(self, *args, **kwargs):
                fake.carried.append(pickle.dumps((args, kwargs)))
                args, kwargs = pickle.loads(fake.carried[-1])
                return Ref(getattr(self.instance, self.name)(*args, **kwargs))

        class Actor:
            def __init__(self, instance):
                self.instance = instance

            def __getattr__(self, name):
                return Method(self.instance, name)

        class ActorClass:
            def __init__(self, cls):
                self.cls = cls
                self.actors = []

            def options(self, **_):
                return self

            def remote(self, *args):
                actor = Actor(self.cls(*args))
                fake.actors.append(actor)
                return actor

        class Group:
            def wait(self, timeout_seconds):
                return True

        self.actors = []
        ray = types.ModuleType("ray")
        ray.is_initialized = lambda: True
        ray.nodes = lambda: [{"Alive": True}]
        ray.remote = lambda **_: ActorClass
        ray.get = lambda refs, timeout=None: (
            [pickle.loads(r.data) for r in refs] if isinstance(refs, list) else pickle.loads(refs.data))
        util = types.ModuleType("ray.util")
        util.get_node_ip_address = lambda: "127.0.0.1"
        pg = types.ModuleType("ray.util.placement_group")
        pg.placement_group = lambda bundles, strategy: Group()
        pg.remove_placement_group = lambda group: None
        strategies = types.ModuleType("ray.util.scheduling_strategies")
        strategies.PlacementGroupSchedulingStrategy = lambda **_: None
        ray.util = util
        util.placement_group = pg
        util.scheduling_strategies = strategies
        self.modules = {"ray": ray, "ray.util": util, "ray.util.placement_group": pg,
                        "ray.util.scheduling_strategies": strategies}


def test_ray_never_carries_the_secret(monkeypatch):
    # Under Ray, what a task gets or returns is pickled and kept by Ray (its
    # object store, its dashboard, spilled objects on disk): the secret must
    # never be among it, and the hosts must know it all the same.
    fake = _FakeRay()
    for name, module in fake.modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    from pathways import _ray_hosts
    monkeypatch.setattr(_ray_hosts, "_kept", [])
    secret = _hosts.make_secret()
    addresses = _ray_hosts.launch(2, secret)
    try:
        assert len(addresses) == 2
        for blob in fake.carried:
            assert secret.encode() not in blob, "the secret went through Ray"
            assert bytes.fromhex(secret) not in blob, "the secret went through Ray"
        topology = [("islands", "1"), ("hosts_per_island", "2"), ("devices_per_host", "1")]
        sessions = _core._HostSessions(addresses, secret, topology)
        assert all(h["alive"] for h in sessions.hosts())
        sessions.close()
    finally:
        for actor in fake.actors:
            actor.instance.stop()


def test_a_sealed_secret_opens_only_in_the_host_it_was_sealed_to():
    other = _hosts.start_sealed_host()
    start = _hosts.start_sealed_host()
    try:
        assert other.sealing_key != start.sealing_key
        secret = _hosts.make_secret()
        with pytest.raises(RuntimeError, match="does not open with this host's key"):
            _hosts.finish_sealed_host(other, _core._seal_secret(start.sealing_key, secret))
        host = _hosts.finish_sealed_host(start, _core._seal_secret(start.sealing_key, secret))
        sessions = _core._HostSessions([host.address], secret,
                               [("islands", "1"), ("hosts_per_island", "1"), ("devices_per_host", "1")])
        assert sessions.hosts()[0]["alive"]
        sessions.close()
        assert host.process.wait(10) == 0
    finally:
        for s in (other, start):
            _hosts._stop(s.proc, 5.0)
    with pytest.raises(ValueError, match="hex"):
        _core._seal_secret("not hex", "x")


@contextlib.contextmanager
def _external_hosts(ip: str, code: str, host_args):
    """Runs `code` in a client that waits for its hosts (hosts="external",
    PATHWAYS_CLIENT_ADDRESS on `ip`) and one `python -m pathways.host
    --client=...` per entry of `host_args` (its further arguments), as Slurm
    would start them; yields (the client's stdout, its stderr, the host
    processes) once the client is done. The client must succeed (else the
    assertion holds every host's output); every process is gone after."""
    import socket
    with socket.socket() as s:  # a free port for the client to listen on
        s.bind((ip, 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k != "PATHWAYS_TOPOLOGY"}
    env["PATHWAYS_SECRET"] = _hosts.make_secret()
    from conftest import PYTHON_DIR
    env["PYTHONPATH"] = str(PYTHON_DIR)
    client = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        env={**env, "PATHWAYS_CLIENT_ADDRESS": f"{ip}:{port}", "PATHWAYS_HOSTS_TIMEOUT": "60"},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    hosts = []
    try:
        time.sleep(0.5)
        for args in host_args:
            hosts.append(subprocess.Popen(
                [sys.executable, "-m", "pathways.host", f"--client={ip}:{port}"] + list(args),
                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
        out, err = client.communicate(timeout=120)
        if client.returncode != 0:  # what the hosts said, for the failure's message
            for p in hosts:
                if p.poll() is None:
                    p.kill()
            err += "".join(f"\n--- host {p.pid} (exit {p.wait()}):\n{p.stderr.read()}" for p in hosts)
        assert client.returncode == 0, err
        yield out, err, hosts
    finally:
        for p in [client] + hosts:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_hosts_started_by_hand_register_with_the_client(tmp_path):
    # The default topology's 4 hosts, some of which listen on every
    # interface: each advertises the IP that reaches the client.
    code = """
            import numpy as np, pathways as pw
            pw.configure(hosts="external")
            a = pw.pmap(lambda x: x + 1., devices=pw.make_virtual_device_set().add_slice(tpu_devices=2).tpus)
            print(np.asarray(a(np.array([1., 2.]))).tolist(), sorted(h.pid for h in pw.hosts()))
            # A gang over two hosts (their collectives), then a transfer to the
            # other island (the data plane), among hosts some of which listen on
            # every interface: each advertises the IP that reaches the client.
            s = pw.pmap(lambda x: pw.psum(x, "i"), axis_name="i",
                        devices=pw.make_virtual_device_set().add_slice(tpu_devices=8).tpus)
            t = pw.pmap(lambda x: x * 2., devices=pw.make_virtual_device_set().add_slice(tpu_devices=8).tpus)
            print(np.asarray(t(s(np.arange(8.)))).tolist(), sorted(h.address.split(":")[0] for h in pw.hosts()))
        """
    with _external_hosts("127.0.0.1", code, [["--listen=0.0.0.0:0"] if k % 2 else [] for k in range(4)]) as (
            out, err, hosts):
        assert "waiting for 4 hosts to register" in err
        assert out.strip().split("\n") == [
            f"[2.0, 3.0] {sorted(h.pid for h in hosts)}",
            f"{[56.0] * 8} {['127.0.0.1'] * 4}",
        ], out
        for h in hosts:  # each host stops when its client's session ends
            assert h.wait(timeout=10) == 0


def _non_loopback_ip():
    """This machine's IPv4 address on its default route (a UDP socket's
    connect picks it and sends nothing), or None."""
    import socket
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))
        except OSError:
            return None
        ip = s.getsockname()[0]
    return None if ip.startswith("127.") or ip == "0.0.0.0" else ip


def test_hosts_beyond_loopback_speak_tls():
    # Client and hosts on this machine's own (non-loopback) IP: the control
    # plane is TLS there, and a gang across hosts and a transfer between
    # islands run as on loopback.
    ip = _non_loopback_ip()
    if ip is None:
        pytest.skip("this machine has no IP address besides loopback")
    code = """
            import socket
            import numpy as np, pathways as pw
            pw.configure(hosts="external")
            s = pw.pmap(lambda x: pw.psum(x, "i"), axis_name="i",
                        devices=pw.make_virtual_device_set().add_slice(tpu_devices=8).tpus)
            t = pw.pmap(lambda x: x * 2., devices=pw.make_virtual_device_set().add_slice(tpu_devices=8).tpus)
            print(np.asarray(t(s(np.arange(8.)))).tolist())
            # What a plaintext HTTP/2 client gets from a host: no HTTP/2.
            host, port = pw.hosts()[0].address.rsplit(":", 1)
            with socket.create_connection((host, int(port)), timeout=5) as c:
                c.sendall(b"PRI * HTTP/2.0\\r\\n\\r\\nSM\\r\\n\\r\\n" + bytes(9))
                try:
                    answer = c.recv(64)
                except OSError:
                    answer = b""
            print("http2" if len(answer) >= 9 and answer[3] == 4 else "not http2")
        """
    with _external_hosts(ip, code, [[f"--listen={ip}:0"]] * 4) as (out, _, _):
        assert out.strip().split("\n") == [str([56.0] * 8), "not http2"], out


def test_works_after_importing_jax_and_ray():
    # jaxlib and ray bring their own gRPC and abseil; pathways' must not clash.
    pytest.importorskip("jax")
    pytest.importorskip("ray")
    from conftest import run_python
    code = """
        import jax, ray
        import numpy as np, pathways as pw
        %s
        a = pw.pmap(lambda x: pw.psum(x, "i"), axis_name="i",
                    devices=pw.make_virtual_device_set().add_slice(tpu_devices=8).tpus)
        print(np.asarray(a(np.arange(8.))).tolist(), pw.topology()["hosts"])
    """
    assert run_python(code % "").strip() == f"{[28.0] * 8} in_process"
    assert run_python(code % "pw.configure(hosts='local_processes')").strip() == f"{[28.0] * 8} local_processes"


def test_large_transfers_between_host_processes_are_exact():
    # Shards of 2 MiB and more travel without copies (a header, then the
    # bytes straight from and into the buffers); small ones in one message.
    out = _run_local_processes("""
        import numpy as np
        a = pw.make_virtual_device_set().add_slice(tpu_devices=8).tpus   # island 0: hosts 0 and 1
        b = pw.make_virtual_device_set().add_slice(tpu_devices=8).tpus   # island 1: hosts 2 and 3
        f = pw.pmap(lambda x: x * 2., devices=a)
        g = pw.pmap(lambda x: x + 1., devices=b)
        @pw.program
        def p(x):
            return g(f(x))
        rng = np.random.default_rng(0)
        for per_shard in (3, 512 * 1024 + 5):  # floats per shard: small, and over 2 MiB
            x = rng.standard_normal((8, per_shard)).astype(np.float32)
            before = pw.transfer_stats()
            y = p(x)
            print(per_shard, np.array_equal(np.asarray(y), x * 2 + 1), sorted({d.physical.island for d in a}),
                  sorted({d.physical.island for d in b}))
            after = pw.transfer_stats()  # the DCN transfer is counted, as in process
            print(after["dcn_transfers"] - before["dcn_transfers"], after["dcn_bytes"] - before["dcn_bytes"] == x.nbytes)
    """)
    assert out.split("\n")[:4] == ["3 True [0] [1]", "1 True", "524293 True [0] [1]", "1 True"], out


def test_buffers_larger_than_a_chunk_go_to_and_from_hosts_exact():
    # Buffer data moves between the client and its hosts in 16 MiB chunks,
    # so no message nears protobuf's 2 GiB limit (a 2.25 GiB device_put
    # aborted the client before). Shards of 29 MiB + 12 bytes straddle the
    # chunk boundaries, and each host's 116 MiB is more chunks than a read
    # asks a host for at once; a program's host-data argument takes the
    # same path.
    out = _run_local_processes("""
        import numpy as np
        tpus = pw.make_virtual_device_set().add_slice(tpu_devices=8).tpus
        print(len({d.physical.host for d in tpus}))
        rng = np.random.default_rng(1)
        x = rng.integers(-2**31, 2**31 - 1, size=(8, (29 * 2**20 + 12) // 4), dtype=np.int32)
        b = pw.device_put(x, tpus)
        print(np.array_equal(np.asarray(b), x))
        f = pw.pmap(lambda v: v + 1, devices=tpus)
        print(np.array_equal(np.asarray(f(x)), x + 1), np.array_equal(np.asarray(f(b)), x + 1))
        empty = pw.device_put(np.zeros((8, 0), np.float32), tpus)
        print(np.asarray(empty).shape)
    """)
    assert out.split("\n")[:4] == ["2", "True", "True True", "(8, 0)"], out
