"""Hosts as processes: Figures 5 and 7, a DCN transfer and control messages (paper §5.1, §4.5).

Every pathways configuration here runs with `hosts=local_processes`: the
runtime starts one host process per host on loopback (gRPC control plane,
the data plane's TCP between hosts for transfers, Gloo TCP for cross-host collectives).

  1. Figure 5 on 4 host processes x 2 devices (islands=1, hosts_per_island=4,
     devices_per_host=2): one 8-device gang spans all 4 processes. Modes
     OpByOp / Chained / Fused as in dispatch_overhead.py (its pw_worker).
     Peer: JAX multi-controller on the same 4-process x 2-device shape
     (jax.distributed.initialize, Gloo CPU collectives, jax.pmap over the 8
     global devices).
  2. Figure 7 on 16 host processes x 4 devices: a pipeline of 1..16 stages,
     one 4-device slice per host process, parallel vs sequential dispatch
     (pipeline_dispatch.py's pw_pipeline).
  3. A 64 MiB DCN transfer between host processes (island 0 -> island 1),
     against raw loopback TCP between two Python processes, same run.
  4. Control messages per program per host (pw._core.control_messages()),
     parallel and sequential dispatch.
  5. In-process regression: dispatch_overhead.pw_worker (hosts in process)
     at the README's device counts, this build against the same worker on
     pathways built from --base (default: the last commit before hosts
     became processes; built once into build/regression/), alternating.

Usage: python benchmarks/multihost.py [--quick] [--out-dir DIR] [--only fig5|dcn]

--only fig5 runs section 1 alone (pathways and JAX, same rounds as the full
run) and writes multihost_fig5.{txt,json}; --only dcn runs section 3 alone
(multihost_dcn.{txt,json}), --only regression section 5; none replaces the
full run's files.
"""

from __future__ import annotations

import math
import os
import re
import sys
import threading
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _harness as h  # noqa: E402
import dispatch_overhead as fig5  # noqa: E402
import pipeline_dispatch as fig7  # noqa: E402

NAME = "multihost"
PROCS = "hosts=local_processes"
FIG5_HOSTS, FIG5_DPH = 4, 2  # one 8-device gang over 4 host processes
FIG5_TOPOLOGY = f"{PROCS},islands=1,hosts_per_island={FIG5_HOSTS},devices_per_host={FIG5_DPH}"
FIG7_TOPOLOGY = f"{PROCS},islands=1,hosts_per_island=16,devices_per_host=4"
DCN_TOPOLOGY = f"{PROCS},islands=2,hosts_per_island=1,devices_per_host=1"
DCN_MIB = 64
JAX_WINDOW = 2  # JAX calls in flight in its asynchronous modes (64 deadlocked, see notes)
MSG_RUNS = 20  # runs per program for the control-message count
# Marks every process this script starts (host processes inherit it), so the
# end of the script can find host processes it left behind, and only those.
RUN_MARK = "PW_MULTIHOST_RUN"


def _median(xs: list) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2]


def _host_pids() -> list:
    import pathways as pw

    return [x.pid for x in pw.hosts()]


# --------------------------------------------------------------------------
# 1. Figure 5 on host processes; JAX multi-controller.


def pw_fig5(n: int, seconds: float, warmup: float) -> dict:
    """dispatch_overhead's pathways worker, on the host processes of PATHWAYS_TOPOLOGY."""
    import pathways as pw

    out = fig5.pw_worker(n=n, seconds=seconds, warmup=warmup)
    out["host_pids"] = _host_pids()
    out["control_messages"] = pw._core.control_messages()
    return out


def _counted_loop(issue, wait, calls: int, window: int) -> float:
    """Seconds for exactly `calls` calls, at most `window` outputs in flight (0: synchronous).

    Multi-controller JAX needs every process to make the same number of
    calls (each call is a collective), so its loops count calls, not time.
    """
    pending = []
    t0 = time.perf_counter()
    for _ in range(calls):
        pending.append(issue())
        if len(pending) > window:
            wait(pending.pop(0))
    for out in pending:
        wait(out)
    return time.perf_counter() - t0


def jax_rank(rank: int, nproc: int, port: int, modes: list, seconds: float, warmup: float) -> dict:
    """One JAX controller of `nproc` (run in its own process, XLA_FLAGS set by the caller)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental import multihost_utils

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=nproc, process_id=rank)
    local, total = jax.local_device_count(), jax.device_count()
    step = jax.pmap(lambda x: jax.lax.psum(x, "i") + 1.0, axis_name="i")

    def fused_body(x):
        for _ in range(fig5.CHAIN):
            x = jax.lax.psum(x, "i") + 1.0
        return x

    fused = jax.pmap(fused_body, axis_name="i")
    zero = jnp.zeros((local,), jnp.float32)
    # psum over the global axis: psum(psum(0)+1)+1 = total+1 only if all
    # `total` devices of all processes took part.
    got = np.asarray(step(step(zero)))
    out = {
        "rank": rank,
        "process_count": jax.process_count(),
        "device_count": total,
        "local_device_count": local,
        "cpu_collectives": jax.config.jax_cpu_collectives_implementation,
        "check": bool((got == total + 1).all()),
        "modes": {},
    }
    fused(zero).block_until_ready()  # compile
    fns = {"OpByOp": (step, 1), "Fused": (fused, fig5.CHAIN)}
    wait = lambda b: b.block_until_ready()  # noqa: E731
    for mode in modes:
        fn, per_call = fns[mode.split("-")[0]]
        window = 0 if mode.endswith("-sync") else JAX_WINDOW
        state = {"x": zero}

        def issue(fn=fn, state=state):
            state["x"] = fn(state["x"])
            return state["x"]

        # Warm-up of a fixed count (every rank must make the same calls), then
        # rank 0's estimate of the calls per slice is used by all.
        probe = max(2, int(warmup * (10 if per_call > 1 else 150)))
        dt = _counted_loop(issue, wait, probe, window)
        calls = max(2, int(probe / dt * seconds / 3))
        calls = int(multihost_utils.broadcast_one_to_all(np.int32(calls)))
        runs = sorted(calls * per_call / _counted_loop(issue, wait, calls, window) for _ in range(3))
        out["modes"][mode] = {"per_s": runs[1], "runs_per_s": runs, "calls": calls}
    multihost_utils.sync_global_devices("done")  # nobody exits while others still need it
    return out


def jax_multicontroller(nproc: int, local_devices: int, modes: list, seconds: float, warmup: float,
                        timeout: float) -> dict:
    """Starts `nproc` JAX controllers (each `local_devices` CPU devices); rank 0's numbers."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": f"--xla_force_host_platform_device_count={local_devices}"}
    results: list = [None] * nproc

    def run(rank):
        results[rank] = h.run_isolated(
            "multihost:jax_rank",
            {"rank": rank, "nproc": nproc, "port": port, "modes": modes, "seconds": seconds, "warmup": warmup},
            env=env, timeout=timeout)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(nproc)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    failed = [f"rank {r}: {x['error']}" for r, x in enumerate(results) if not x["ok"]]
    if failed:
        raise RuntimeError("; ".join(failed)[:400])
    ranks = [x["result"] for x in results]
    return dict(ranks[0], ranks=ranks)


# --------------------------------------------------------------------------
# 2. Figure 7 on host processes.


def pw_fig7(stages: list, seconds: float, rounds: int) -> dict:
    """pipeline_dispatch's worker, on the host processes of PATHWAYS_TOPOLOGY."""
    out = fig7.pw_pipeline(stages=stages, seconds=seconds, rounds=rounds)
    out["host_pids"] = _host_pids()
    return out


# --------------------------------------------------------------------------
# 3. A DCN transfer between host processes; raw loopback TCP.


def pw_dcn(mib: int, rounds: int) -> dict:
    """Time of a `mib` MiB transfer from island 0 to island 1.

    p  = g_b(f_a(x)): f_a on island 0 makes the value, g_b on island 1 takes
         4 of its elements, so lowering puts a DCN transfer between them.
    p0 = g_a(f_a(x)): the same functions, both on island 0 (no transfer).
    The two alternate, one program at a time. Transfer time: best(p) -
    best(p0), and median(p) - median(p0), over the rounds. (A difference per
    round, paired, is as noisy as the machine: with the transfer about as
    long as the noise of one round, its smallest was negative.)
    """
    import numpy as np

    import pathways as pw

    vs = pw.make_virtual_device_set()
    a, b = vs.add_slice(tpu_devices=1), vs.add_slice(tpu_devices=1)
    assert (a.island, b.island) == (0, 1), (a.island, b.island)
    elems = mib * 2**20 // 4
    make = pw.pmap(lambda x: x + 1.0, devices=a.tpus)
    take_b = pw.pmap(lambda y: y[:4], devices=b.tpus)
    take_a = pw.pmap(lambda y: y[:4], devices=a.tpus)
    progs = {"dcn": pw.program(lambda x: take_b(make(x))), "local": pw.program(lambda x: take_a(make(x)))}
    x = pw.device_put(np.arange(elems, dtype=np.float32).reshape(1, elems), a.tpus)
    lowered = {k: (p.lower(x).num_compute_steps, p.lower(x).num_transfer_steps) for k, p in progs.items()}
    check = all(np.array_equal(np.asarray(p(x))[0], [1.0, 2.0, 3.0, 4.0]) for p in progs.values())
    times: dict = {k: [] for k in progs}
    for _ in range(2):  # warm-up
        for p in progs.values():
            p(x).block_until_ready()
    for _ in range(rounds):
        for k, p in progs.items():
            t0 = time.perf_counter()
            p(x).block_until_ready()
            times[k].append(time.perf_counter() - t0)
    best = min(times["dcn"]) - min(times["local"])
    median = _median(sorted(times["dcn"])) - _median(sorted(times["local"]))
    return {
        "bytes": elems * 4,
        "lowered": lowered,
        "check": check,
        "times_s": times,
        "transfer_s": {"best": best, "median": median},
        "best_gb_per_s": elems * 4 / best / 1e9 if best > 0 else None,
        "median_gb_per_s": elems * 4 / median / 1e9 if median > 0 else None,
        "transfer_stats": pw.transfer_stats(),
        "host_pids": _host_pids(),
        "topology": pw.topology(),
    }


_TCP_RECEIVER = r"""
import socket, sys
n, repeats = int(sys.argv[1]), int(sys.argv[2])
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(1)
print(srv.getsockname()[1], flush=True)
conn, _ = srv.accept()
buf = bytearray(n)
view = memoryview(buf)
for _ in range(repeats):
    got = 0
    while got < n:
        k = conn.recv_into(view[got:], n - got)
        if not k:
            sys.exit("sender closed early")
        got += k
    conn.sendall(b"k")
"""


def tcp_loopback(mib: int, repeats: int) -> dict:
    """Moves `mib` MiB from this process to a receiver process over loopback TCP, `repeats` times.

    Plain sockets, default buffer sizes; each time runs from the first byte
    sent until the receiver's 1-byte acknowledgement (all bytes received).
    """
    import socket
    import subprocess

    n = mib * 2**20
    recv = subprocess.Popen([sys.executable, "-c", _TCP_RECEIVER, str(n), str(repeats)],
                            stdout=subprocess.PIPE, text=True)
    try:
        port = int(recv.stdout.readline())
        data = memoryview(bytes(n))
        times = []
        with socket.create_connection(("127.0.0.1", port)) as s:
            for _ in range(repeats):
                t0 = time.perf_counter()
                s.sendall(data)
                if s.recv(1) != b"k":
                    raise RuntimeError("receiver did not acknowledge")
                times.append(time.perf_counter() - t0)
        recv.wait(10)
    finally:
        if recv.poll() is None:
            recv.kill()
            recv.wait()
    return {"bytes": n, "times_s": times, "best_gb_per_s": n / min(times) / 1e9,
            "median_gb_per_s": n / _median(times) / 1e9}


# --------------------------------------------------------------------------
# 4. Control messages per program per host.


def pw_messages(runs: int) -> dict:
    """Control messages per program per host, parallel and sequential dispatch.

    Two warm programs on 4 host processes x 2 devices:
      chain8     8 nodes of psum + add, each on the 8-device gang (every host
                 takes part in every node);
      pipeline4  4 stages of psum + add, stage k on a 2-device slice of host
                 k, the value moving host to host (3 transfer steps).
    Each run is called, then waited for and dropped; "dispatch" counts the
    messages sent while the call ran, "total" everything over the runs
    (frees of dropped buffers included, counted after a short settle).
    """
    import numpy as np

    import pathways as pw

    vs = pw.make_virtual_device_set()
    gang = vs.add_slice(tpu_devices=FIG5_HOSTS * FIG5_DPH)
    stages = [vs.add_slice(tpu_devices=FIG5_DPH) for _ in range(FIG5_HOSTS)]
    step = lambda devs: pw.pmap(lambda x: pw.psum(x, "i") + 1.0, devices=devs, axis_name="i")  # noqa: E731
    gang_step = step(gang.tpus)
    stage_steps = [step(s.tpus) for s in stages]

    def chain8(x):
        for _ in range(8):
            x = gang_step(x)
        return x

    def pipeline4(x):
        for f in stage_steps:
            x = f(x)
        return x

    stage_hosts = [sorted({v.physical.host for v in s.tpus}) for s in stages]
    inputs = {"chain8": pw.device_put(np.zeros(gang.size, np.float32), gang.tpus),
              "pipeline4": pw.device_put(np.zeros(FIG5_DPH, np.float32), stages[0].tpus)}
    bodies = {"chain8": chain8, "pipeline4": pipeline4}
    count = pw._core.control_messages
    out: dict = {"stage_hosts": stage_hosts, "programs": {}}
    for name, body in bodies.items():
        x = inputs[name]
        lowered = pw.program(body).lower(x)
        res = {"lowered": {"compute": lowered.num_compute_steps, "transfer": lowered.num_transfer_steps}}
        for mode in ("parallel", "sequential"):
            prog = pw.program(body, dispatch=mode)
            try:
                for _ in range(2):  # warm: the first run also sends the definitions
                    prog(x).block_until_ready()
            except Exception as e:  # noqa: BLE001 - reported as the row
                res[mode] = {"error": f"{type(e).__name__}: {e}"[:300]}
                continue
            time.sleep(0.05)
            start = count()
            dispatch = [0] * len(start)
            for _ in range(runs):
                c0 = count()
                r = prog(x)
                c1 = count()
                dispatch = [d + b - a for d, a, b in zip(dispatch, c0, c1)]
                r.block_until_ready()
                del r
                time.sleep(0.01)
            time.sleep(0.1)
            end = count()
            res[mode] = {"dispatch_per_program": [d / runs for d in dispatch],
                         "total_per_program": [(b - a) / runs for a, b in zip(start, end)]}
        out["programs"][name] = res
    out["host_pids"] = _host_pids()
    return out


# --------------------------------------------------------------------------
# 5. In-process regression: against the same worker built from the last
# commit before hosts became processes, on this machine, rounds interleaved
# (the README's table was measured on another CPU: shown beside, not judged).

BASE_COMMIT = "4cdf4ea"  # the last commit before issue 8 (hosts as processes)


def base_build(commit: str) -> dict:
    """Pathways built from `commit` into build/regression/<commit>/site, once
    (later runs reuse it): {"ok": True, "path": site} or {"ok": False, "error"}.

    The sources come from `git archive` (no worktree is left behind); the
    build is pip's, as `make`'s, into a directory of its own.
    """
    import subprocess
    import tarfile

    root = os.path.join(h.REPO_DIR, "build", "regression", commit)
    site = os.path.join(root, "site")
    if os.path.isdir(os.path.join(site, "pathways")):
        return {"ok": True, "path": site, "commit": commit, "built_now": False}
    src = os.path.join(root, "src")
    try:
        os.makedirs(src, exist_ok=True)
        archive = subprocess.run(["git", "-C", h.REPO_DIR, "archive", "--format=tar", commit],
                                 capture_output=True, check=True, timeout=120).stdout
        with tarfile.open(fileobj=__import__("io").BytesIO(archive)) as tar:
            tar.extractall(src, filter="data")
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps",
                        "--target", site, src], capture_output=True, check=True, timeout=3600)
        return {"ok": True, "path": site, "commit": commit, "built_now": True,
                "build_s": time.perf_counter() - t0}
    except (OSError, subprocess.SubprocessError, tarfile.TarError) as e:
        err = getattr(e, "stderr", b"") or b""
        return {"ok": False, "commit": commit,
                "error": f"{type(e).__name__}: {e} {err.decode(errors='replace')[-500:]}".strip()}


def readme_fig5() -> dict:
    """The pathways rows of the README's Figure 5 table: {label: {n: computations/s}}."""
    with open(os.path.join(h.BENCH_DIR, "README.md")) as f:
        text = f.read()
    block = text.split("### Figure 5: `results/dispatch_overhead.txt`", 1)[1].split("```", 2)[1]
    counts = None
    rows = {}
    for line in block.splitlines():
        cols = re.split(r"\s{2,}", line.strip())
        if cols[0] == "devices":
            counts = [int(c) for c in cols[1:]]
        elif counts and cols[0] in ("PW-O", "PW-O sync", "PW-C", "PW-F"):
            rows[cols[0]] = dict(zip(counts, (_parse_rate(c) for c in cols[1:])))
    return rows


def _parse_rate(text: str):
    """The inverse of _harness.fmt_rate ("12.3k" -> 12300.0); None if not a number."""
    m = re.fullmatch(r"([0-9.]+)([kM]?)", text)
    return float(m.group(1)) * {"": 1, "k": 1e3, "M": 1e6}[m.group(2)] if m else None


# --------------------------------------------------------------------------
# The run.


FIG5_MODES = [("PW-O", "OpByOp"), ("PW-O sync", "OpByOp-sync"), ("PW-C", "Chained"), ("PW-F", "Fused")]
JAX_MODES = [("JAX-O sync", "OpByOp-sync"), ("JAX-F sync", "Fused-sync"),
             (f"JAX-O async ({JAX_WINDOW} in flight)", "OpByOp"), (f"JAX-F async ({JAX_WINDOW} in flight)", "Fused")]


def cpu_busy(seconds: float = 0.5):
    """Share of both cores busy over `seconds` (from /proc/stat), or None."""
    before = h.cpu_times()
    time.sleep(seconds)
    after = h.cpu_times()
    if not before or not after:
        return None
    d = [b - a for a, b in zip(before, after)]
    total = sum(d[:8])
    return 1 - (d[3] + d[4]) / total if total else None


class Runner:
    """Runs configurations isolated, on an idle CPU as far as it can.

    On this 2-core machine, another process taking a core slows every number
    here (the dispatch path spins briefly before it sleeps, and 4-16 host
    processes share the cores), often several times for synchronous calls.
    So before each configuration it waits (at most `max_wait` s) until both
    cores are less than `idle_below` busy; if they are busy again right after
    the run (other work started meanwhile), it runs the configuration again,
    at most `retries` times, and keeps the last run. Every attempt's busy
    shares and wait are recorded.
    """

    def __init__(self, mark: str, max_wait: float, retries: int, idle_below: float = 0.1):
        self.mark, self.max_wait, self.retries, self.idle_below = mark, max_wait, retries, idle_below
        self.waited = 0.0
        self.disturbed = 0

    def _wait_idle(self):
        t0 = time.perf_counter()
        busy = cpu_busy()
        while busy is not None and busy >= self.idle_below and time.perf_counter() - t0 < self.max_wait:
            busy = cpu_busy()
        self.waited += time.perf_counter() - t0
        return busy, time.perf_counter() - t0

    def __call__(self, target: str, kwargs: dict, env: dict, timeout: float) -> dict:
        attempts = []
        for attempt in range(self.retries + 1):
            before, waited = self._wait_idle()
            r = h.run_isolated(target, kwargs, env=dict(env, **{RUN_MARK: self.mark}), timeout=timeout)
            time.sleep(0.2)  # the run's host processes exit
            after = cpu_busy()
            attempts.append({"cpu_busy_before": before, "cpu_busy_after": after, "waited_s": waited,
                             "ok": r["ok"]})
            if not r["ok"] or after is None or after < self.idle_below:
                break
            self.disturbed += 1
            h.log(f"[{NAME}]   CPU {100 * after:.0f}% busy after the run (other work): run again")
        r["attempts"] = attempts
        r["cpu_busy_before"] = attempts[-1]["cpu_busy_before"]
        return r


SECTIONS = ("fig5", "dcn", "regression")  # what --only can pick


def run_dcn(run, d: dict, quick: bool) -> None:
    """Section 3: the DCN transfer, and raw loopback TCP in the same run."""
    h.log(f"[{NAME}] 3. {DCN_MIB} MiB DCN transfer on {DCN_TOPOLOGY}; raw loopback TCP")
    d["dcn"] = run("multihost:pw_dcn", {"mib": DCN_MIB, "rounds": 5 if quick else 30},
                   {"PATHWAYS_TOPOLOGY": DCN_TOPOLOGY}, 180)
    d["tcp"] = run("multihost:tcp_loopback", {"mib": DCN_MIB, "repeats": 5 if quick else 10}, {}, 60)


def run_all(quick: bool, mark: str, only=None, base: str = BASE_COMMIT) -> dict:
    """Every section, or only section `only` (one of SECTIONS)."""
    run = Runner(mark, max_wait=15 if quick else 120, retries=0 if quick else 2)
    env = {"PATHWAYS_TOPOLOGY": FIG5_TOPOLOGY}
    secs, warm = (0.6, 0.2) if quick else (2.0, 0.5)
    d: dict = {"quick": quick, "seconds": secs, "warmup": warm}
    n = FIG5_HOSTS * FIG5_DPH

    # Pathways and JAX alternate, round by round, so both see the same
    # machine: on 2 cores the 4 host processes (or 4 controllers) make every
    # collective depend on the OS scheduler, and rates move 2-3x over minutes.
    d["rounds5"] = 0 if only in ("dcn", "regression") else 1 if quick else 3
    d["fig5_pw"], d["fig5_jax"] = [], {m: [] for _, m in JAX_MODES}
    for k in range(d["rounds5"]):
        h.log(f"[{NAME}] 1. Figure 5, round {k + 1} of {d['rounds5']}: pathways on {FIG5_TOPOLOGY}")
        d["fig5_pw"].append(run("multihost:pw_fig5", {"n": n, "seconds": secs, "warmup": warm}, env, 300))
        for group in (["OpByOp-sync", "Fused-sync"], ["OpByOp", "Fused"]):  # a hang loses only its group
            h.log(f"[{NAME}] 1. Figure 5, round {k + 1}: JAX multi-controller {FIG5_HOSTS} x {FIG5_DPH}: {group}")
            if not h.has_module("jax"):
                r = {"ok": False, "error": h.MISSING}
            else:
                kw = {"nproc": FIG5_HOSTS, "local_devices": FIG5_DPH, "modes": group, "seconds": secs,
                      "warmup": warm, "timeout": 150 if quick else 240}
                r = run("multihost:jax_multicontroller", kw, {}, kw["timeout"] + 30)
            for m in group:
                d["fig5_jax"][m].append(r)
    if only == "fig5":
        d["waited_for_idle_s"] = run.waited
        d["disturbed_runs"] = run.disturbed
        return d
    if only == "dcn":
        run_dcn(run, d, quick)
        d["waited_for_idle_s"] = run.waited
        d["disturbed_runs"] = run.disturbed
        return d

    if only is None:
        stages = [1, 4, 16] if quick else [1, 2, 4, 8, 16]
        seconds, rounds = (0.3, 1) if quick else (1.5, 5)
        d["fig7"] = {"stages": stages, "rounds": rounds}
        h.log(f"[{NAME}] 2. Figure 7 on {FIG7_TOPOLOGY}, S={stages}")
        d["fig7"]["run"] = run("multihost:pw_fig7", {"stages": stages, "seconds": seconds, "rounds": rounds},
                               {"PATHWAYS_TOPOLOGY": FIG7_TOPOLOGY}, 600)

        run_dcn(run, d, quick)

        h.log(f"[{NAME}] 4. control messages on {FIG5_TOPOLOGY}")
        d["messages"] = run("multihost:pw_messages", {"runs": MSG_RUNS}, env, 180)

    readme = readme_fig5()
    counts = [1, 64, 2048] if quick else sorted(next(iter(readme.values())))
    reg_rounds = 1 if quick else 3
    h.log(f"[{NAME}] 5. building pathways at {base} for the in-process comparison (once)")
    build = base_build(base)
    d["regression"] = {"readme": readme, "counts": counts, "rounds": reg_rounds, "base": build,
                       "runs": {c: [] for c in counts}, "base_runs": {c: [] for c in counts}}
    s_in, w_in = (0.4, 0.15) if quick else (1.0, 0.3)  # as dispatch_overhead.py
    for k in range(reg_rounds):
        for c in counts:
            h.log(f"[{NAME}] 5. in-process Figure 5, n={c}, round {k + 1} of {reg_rounds}")
            kw = {"n": c, "seconds": s_in, "warmup": w_in}
            env_now = {"PATHWAYS_TOPOLOGY": h.topology_for(c)}
            d["regression"]["runs"][c].append(run("dispatch_overhead:pw_worker", kw, env_now, 180))
            if build["ok"]:  # the same worker on the base build, right after
                env_base = {**env_now, "PYTHONPATH": build["path"]}
                d["regression"]["base_runs"][c].append(run("dispatch_overhead:pw_worker", kw, env_base, 180))
    d["waited_for_idle_s"] = run.waited
    d["disturbed_runs"] = run.disturbed
    return d


def leftover_hosts(mark: str, grace: float = 5.0) -> dict:
    """Processes still carrying this run's mark (host processes it started): waits
    `grace` s for them to exit, then kills those left. Returns what it found."""

    def marked():
        pids = []
        for p in os.listdir("/proc"):
            if not p.isdigit() or int(p) == os.getpid():
                continue
            try:
                with open(f"/proc/{p}/environ", "rb") as f:
                    if f"{RUN_MARK}={mark}".encode() in f.read().split(b"\0"):
                        pids.append(int(p))
            except OSError:
                pass
        return pids

    deadline = time.monotonic() + grace
    while (pids := marked()) and time.monotonic() < deadline:
        time.sleep(0.2)
    killed = []
    for p in pids:
        try:
            os.kill(p, 9)
            killed.append(p)
        except ProcessLookupError:
            pass
    return {"left_after_grace": pids, "killed": killed}


# --------------------------------------------------------------------------
# Report.


def _mode_cell(r: dict, mode: str) -> tuple:
    """(text, computations/s or None)."""
    if not r.get("ok"):
        return r["error"], None
    m = r["result"]["modes"].get(mode)
    return (h.fmt_rate(m["per_s"]), m["per_s"]) if m else ("-", None)


def _best_round(runs: list, mode: str) -> tuple:
    """The best of the rounds' cells (other work only slows a round down); a
    failure's text if every round failed."""
    cells = [_mode_cell(r, mode) for r in runs]
    ok = [c for c in cells if c[1] is not None]
    return max(ok, key=lambda c: c[1]) if ok else cells[0]


def _rounds_cell(runs: list, mode: str) -> tuple:
    """(text, median over the rounds or None, [each round's value])."""
    cells = [_mode_cell(r, mode) for r in runs]
    vals = [v for _, v in cells if v is not None]
    if not vals:
        return cells[0][0], None, []
    return h.fmt_rate(_median(vals)), _median(vals), vals


def report_fig5(d: dict, lines: list, targets: list) -> dict:
    pw_runs, jx = d["fig5_pw"], d["fig5_jax"]
    rows, vals, per_round, spread = [], {}, {}, {}
    for label, mode, runs in ([(l, m, pw_runs) for l, m in FIG5_MODES]
                              + [(l, m, jx[m]) for l, m in JAX_MODES]):
        text, v, each = _rounds_cell(runs, mode)
        rows.append([label, text, " / ".join(h.fmt_rate(x) for x in each)])
        vals[label], per_round[label] = v, [_mode_cell(r, mode)[1] for r in runs]
        spread[label] = each
    nr = d["rounds5"]
    lines += [
        f"1. Figure 5 on host processes: {FIG5_HOSTS} processes x {FIG5_DPH} devices, one gang of "
        f"{FIG5_HOSTS * FIG5_DPH} devices spanning all of them; computations/s (scalar psum + add); "
        f"{nr} round(s), pathways and JAX alternating; in each, {d['seconds']:.1f} s per measurement "
        f"(median of 3 slices) after {d['warmup']:.1f} s warm-up",
        f"   pathways: {FIG5_TOPOLOGY}; JAX: {FIG5_HOSTS} controllers x {FIG5_DPH} CPU devices",
        "",
        h.table(["mode", "comp/s (median of rounds)", "(each round)"], rows, align="lrl"),
        "",
    ]
    pw_ok = [r["result"] for r in pw_runs if r.get("ok")]
    if pw_ok:
        lines.append(f"pathways: check psum(psum(0)+1)+1 == {FIG5_HOSTS * FIG5_DPH + 1}: "
                     f"{'ok' if all(v['check'] for v in pw_ok) else 'WRONG'}; host pids of round 1 "
                     f"{pw_ok[0]['host_pids']}")
    jr = [r for runs in jx.values() for r in runs if r.get("ok")]
    if jr:
        v = jr[0]["result"]
        checks = all(x["check"] for r in jr for x in r["result"]["ranks"])
        lines.append(
            f"JAX: jax.pmap over {v['device_count']} global devices ({v['process_count']} processes x "
            f"{v['local_device_count']} local), jax_cpu_collectives_implementation="
            f"{v['cpu_collectives']!r}; cross-process psum check (psum(psum(0)+1)+1 == {v['device_count'] + 1} "
            f"on every rank): {'ok' if checks else 'WRONG'}; rank 0's numbers (every rank's in the JSON)")
    lines.append("JAX-C: none (JAX has no chained mode; a chain of asynchronous calls is JAX-O async)")
    jax_best = max(((vals[l], l) for l, _ in JAX_MODES if vals[l] is not None), default=None)
    pwc = vals["PW-C"]
    if jax_best and pwc:
        ratios = []
        for k in range(nr):
            best = max((per_round[l][k] for l, _ in JAX_MODES if per_round[l][k] is not None), default=None)
            if per_round["PW-C"][k] is not None and best:
                ratios.append(per_round["PW-C"][k] / best)
        targets.append(f"Figure 5: PW-C {h.fmt_rate(pwc)} vs JAX best ({jax_best[1]}) {h.fmt_rate(jax_best[0])}: "
                       f"{pwc / jax_best[0]:.2f}x (target >= 1.00x): {'MET' if pwc >= jax_best[0] else 'MISSED'}; "
                       "per round (PW-C / that round's best JAX mode): " + ", ".join(f"{x:.2f}x" for x in ratios))
    else:
        targets.append("Figure 5: PW-C vs JAX best: not measured (see the table)")
    lines.append("")
    return {label: (vals[label], spread[label]) for label in vals}


def report_fig7(d: dict, lines: list, targets: list) -> None:
    f7 = d["fig7"]
    stages, run = f7["stages"], f7["run"]
    lines += [f"2. Figure 7 on host processes ({FIG7_TOPOLOGY}): a pipeline of S stages, stage k = psum + add "
              "on a 4-device slice of host process k, the value moving host to host (data plane TCP); no modeled latency", ""]
    fig7._report_one(lines, run, stages, f7["rounds"])
    if run.get("ok"):
        res = run["result"]["results"][str(max(stages))]
        ratio = res["parallel"]["computations_per_s"] / res["sequential"]["computations_per_s"]
        targets.append(f"Figure 7: parallel/sequential at {max(stages)} stages = {ratio:.2f}x (target >= 3x): "
                       f"{'MET' if ratio >= 3 else 'MISSED'}")
    else:
        targets.append(f"Figure 7: not measured ({run['error'][:100]})")
    lines.append("")


def report_dcn(d: dict, lines: list, targets: list) -> None:
    dcn, tcp = d["dcn"], d["tcp"]
    lines += [f"3. A {DCN_MIB} MiB DCN transfer between host processes ({DCN_TOPOLOGY}), "
              "against raw loopback TCP measured in the same run", ""]
    ms = lambda x: f"{1e3 * x:.1f} ms"  # noqa: E731
    gb = lambda x: f"{x:.2f} GB/s" if x else "-"  # noqa: E731
    rows = []
    if dcn.get("ok"):
        v = dcn["result"]
        for name, key in (("program with the DCN transfer", "dcn"), ("same functions on island 0", "local")):
            t = sorted(v["times_s"][key])
            rows.append([f"pathways: {name}", ms(t[0]), ms(_median(t)), "", ""])
        t = v["transfer_s"]
        rows.append(["pathways: transfer (difference of the two)", ms(t["best"]), ms(t["median"]),
                     gb(v["best_gb_per_s"]), gb(v["median_gb_per_s"])])
    else:
        rows.append(["pathways", dcn["error"], "", "", ""])
    if tcp.get("ok"):
        v = tcp["result"]
        t = sorted(v["times_s"])
        rows.append([f"raw TCP, Python sockets ({len(t)} sends)", ms(t[0]), ms(_median(t)), gb(v["best_gb_per_s"]),
                     gb(v["median_gb_per_s"])])
    else:
        rows.append(["raw TCP", tcp["error"], "", "", ""])
    lines.append(h.table(["", "best", "median", "best", "median"], rows, align="lrrrr"))
    if dcn.get("ok"):
        v = dcn["result"]
        lines.append(f"{len(v['times_s']['dcn'])} rounds; lowered (compute, transfer steps): with transfer "
                     f"{v['lowered']['dcn']}, same island {v['lowered']['local']}; results checked: "
                     f"{'ok' if v['check'] else 'WRONG'}; client transfer_stats: {v['transfer_stats']}")
    if dcn.get("ok") and tcp.get("ok") and dcn["result"]["best_gb_per_s"]:
        v, t = dcn["result"], tcp["result"]
        best = v["best_gb_per_s"] / t["best_gb_per_s"]
        med = (v["median_gb_per_s"] or 0) / t["median_gb_per_s"]
        targets.append(f"DCN transfer: best {gb(v['best_gb_per_s'])} = {100 * best:.0f}% of raw TCP's best "
                       f"({gb(t['best_gb_per_s'])}); medians {100 * med:.0f}% (target >= 50%): "
                       f"{'MET' if best >= 0.5 else 'MISSED'}")
    else:
        targets.append("DCN transfer: not measured (see the table)")
    lines.append("")


def report_messages(d: dict, lines: list, targets: list) -> None:
    m = d["messages"]
    lines += [f"4. Control messages per program per host ({FIG5_TOPOLOGY}), {MSG_RUNS} warm runs each, "
              "one at a time", ""]
    if not m.get("ok"):
        lines += [f"failed: {m['error']}", ""]
        targets.append("control messages: not measured")
        return
    v = m["result"]
    expect = {  # (parallel, sequential) per host
        "chain8": ([1] * FIG5_HOSTS, [8] * FIG5_HOSTS),
        "pipeline4": ([1] * FIG5_HOSTS, [1 + (k > 0) + (k < FIG5_HOSTS - 1) for k in range(FIG5_HOSTS)]),
    }
    rows, met = [], True
    fmt = lambda xs: " / ".join(f"{x:g}" for x in xs)  # noqa: E731
    for name, res in v["programs"].items():
        low = res["lowered"]
        for i, mode in enumerate(("parallel", "sequential")):
            r = res[mode]
            if "error" in r:
                rows.append([name, f"{low['compute']}+{low['transfer']}", mode, r["error"], "", ""])
                met = False
                continue
            want = expect[name][i]
            met = met and [round(x, 2) for x in r["dispatch_per_program"]] == want
            rows.append([name, f"{low['compute']}+{low['transfer']}", mode, fmt(r["dispatch_per_program"]),
                         fmt(r["total_per_program"]), fmt(want)])
    lines.append(h.table(["program", "steps (compute+transfer)", "dispatch", "sent by the call, per host",
                          "total incl. frees", "expected"], rows, align="lrlrrr"))
    lines += [f"pipeline4 stage slices on hosts {v['stage_hosts']}; per host = hosts 0 / 1 / 2 / 3", ""]
    targets.append("control messages: parallel 1 per host taking part, sequential 1 per step on that host: "
                   + ("MET" if met else "MISSED (see section 4)"))


REG_ROWS = [("PW-O", "OpByOp"), ("PW-O sync", "OpByOp-sync"), ("PW-C", "Chained"), ("PW-F", "Fused")]


def report_regression(d: dict, lines: list, targets: list) -> None:
    reg = d["regression"]
    counts, readme, build = reg["counts"], reg["readme"], reg.get("base", {"ok": False, "error": "not run"})
    base = build.get("commit", "?")
    lines += [f"5. In-process regression: dispatch_overhead.pw_worker (hosts in process), this build vs the same "
              f"worker on pathways at {base} (before hosts became processes), the two alternating on this "
              f"machine; cells: now / then (ratio), best of {reg['rounds']} round(s) each", ""]
    if not build["ok"]:
        lines.append(f"the build at {base} failed: {build['error']}")
    rows, ratios, readme_ratios = [], [], []
    for c in counts:
        row = [c]
        for label, mode in REG_ROWS:
            text, v = _best_round(reg["runs"][c], mode)
            old = _best_round(reg["base_runs"][c], mode)[1] if reg["base_runs"].get(c) else None
            if readme.get(label, {}).get(c) and v is not None:
                readme_ratios.append((v / readme[label][c], label, c))
            if v is None or not old:
                row.append(text[:30])
                continue
            ratios.append((v / old, label, c))
            row.append(f"{h.fmt_rate(v)} / {h.fmt_rate(old)} ({v / old:.2f})")
        rows.append(row)
    lines.append(h.table(["devices"] + [label for label, _ in REG_ROWS], rows))
    busy = [r.get("cpu_busy_before") for c in counts for r in reg["runs"][c] + reg["base_runs"].get(c, [])]
    busy = [b for b in busy if b is not None]
    if busy:
        lines.append(f"CPU busy (both cores) just before each configuration: {100 * min(busy):.0f}-"
                     f"{100 * max(busy):.0f}%")
    if readme_ratios:
        lines.append(f"against the README's table (measured on an {_readme_cpu()}, not this CPU): "
                     f"{min(r[0] for r in readme_ratios):.2f}-{max(r[0] for r in readme_ratios):.2f}x")
    lines.append("")
    if not ratios:
        targets.append(f"in-process regression: not measured (no build at {base})")
        return
    below = sorted(r for r in ratios if r[0] < 0.9)
    def geomean(xs):
        return math.exp(sum(math.log(x) for x in xs) / len(xs))

    per_mode = ", ".join(f"{label} {min(x for x, l, _ in ratios if l == label):.2f}-"
                         f"{max(x for x, l, _ in ratios if l == label):.2f} "
                         f"(geometric mean {geomean([x for x, l, _ in ratios if l == label]):.2f})"
                         for label, _ in REG_ROWS if any(l == label for _, l, _ in ratios))
    targets.append(f"in-process regression: {len(ratios) - len(below)} of {len(ratios)} cells at >= 0.90 of "
                   f"pathways at {base} on this machine (target: all): {'MET' if not below else 'MISSED'}; "
                   f"ratios now/then by mode: {per_mode}"
                   + (f"; below: {', '.join(f'{l} n={c} {x:.2f}' for x, l, c in below)}" if below else ""))


def _readme_cpu() -> str:
    """The CPU the README's results name ("2 cores (Intel Xeon)"), for the report."""
    with open(os.path.join(h.BENCH_DIR, "README.md")) as f:
        m = re.search(r"2 cores \(([^)]*)\)", f.read())
    return m.group(1) if m else "unknown CPU"


def report(d: dict, info: dict, elapsed: float) -> str:
    lines = [h.machine_header(info), ""]
    targets: list = []
    if d["rounds5"]:  # not a --only dcn run
        report_fig5(d, lines, targets)
    if "dcn" in d and "fig7" not in d:  # --only dcn
        report_dcn(d, lines, targets)
    if "regression" in d and "fig7" not in d:  # --only regression
        report_regression(d, lines, targets)
    if "fig7" in d:  # not a --only run
        report_fig7(d, lines, targets)
        report_dcn(d, lines, targets)
        report_messages(d, lines, targets)
        report_regression(d, lines, targets)
    left = d["leftover_hosts"]
    lines += ["Targets:"] + [f"- {t}" for t in targets] + [""]
    lines.append(f"waited {d['waited_for_idle_s']:.0f} s in all for the CPU to be idle (< 10% busy) before "
                 f"configurations; {d['disturbed_runs']} run(s) repeated because other work was running at their "
                 "end; every attempt's busy shares are in the JSON")
    lines.append("host processes left by this script after its runs: "
                 + ("none" if not left["left_after_grace"] else
                    f"{left['left_after_grace']} (killed {left['killed']})"))
    lines += [
        "",
        "Notes:",
        "- pathways rows run the runtime with hosts=local_processes: the client (this script's child) and",
        "  one process per host, on loopback; cross-host psums go over Gloo TCP, transfers over the data plane. The",
        "  in-process rows (section 5) are the README's setting: hosts are threads of one process.",
        f"- JAX: {FIG5_HOSTS} processes, each XLA_FLAGS=--xla_force_host_platform_device_count={FIG5_DPH},",
        "  jax.distributed.initialize(coordinator_address=127.0.0.1:PORT, num_processes, process_id),",
        "  jax.config.update('jax_cpu_collectives_implementation', 'gloo') (already the default in this jax);",
        "  jax.pmap spans processes (each feeds its 2 local shards). Every controller must make the same",
        "  number of calls, so runs count calls (rank 0's count, sent with broadcast_one_to_all) instead",
        f"  of stopping on a clock. Async modes keep {JAX_WINDOW} calls in flight: with 64 in flight the 4",
        "  controllers hung in the first 50 calls during development (8 worked).",
        "- Figure 7: pipeline_dispatch.py's worker and table; each slice is on its own host process.",
        "- DCN: transfer time = time(program with the transfer) - time(same functions on island 0), best",
        "  minus best and median minus median (the two alternate); both make a 64 MiB value (x + 1) and keep 4 elements of",
        "  it. Raw TCP: one Python socket pair between two processes, 64 MiB per send, default",
        "  buffers, timed to the receiver's ack. The target compares the bests.",
        "- control messages: pw._core.control_messages() counts frames the client sends each host;",
        "  'sent by the call' is what a program call sends; 'total' adds what follows (e.g. frees).",
        "",
        f"total time {elapsed:.0f} s",
    ]
    return "\n".join(lines)


def plot(d: dict, vals: dict, path: str) -> None:
    plt = h.pyplot()
    if plt is None:
        return
    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    ax = axes[0][0]
    labels = [l for l in vals if vals[l][0]]
    med = [vals[l][0] for l in labels]
    err = [[m - min(vals[l][1]) for m, l in zip(med, labels)], [max(vals[l][1]) - m for m, l in zip(med, labels)]]
    ax.bar(range(len(labels)), med, yerr=err, capsize=3,
           color=["tab:blue" if l.startswith("PW") else "tab:orange" for l in labels])
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels([l.replace(" (", "\n(") for l in labels], fontsize=7, rotation=30)
    ax.set_yscale("log")
    ax.set_ylabel("computations / s")
    ax.set_title(f"Fig. 5 on {FIG5_HOSTS} host processes x {FIG5_DPH} devices (8-device gang); "
                 "median and range of rounds", fontsize=9)
    ax = axes[0][1]
    run = d["fig7"]["run"]
    if run.get("ok"):
        stages = d["fig7"]["stages"]
        res = run["result"]["results"]
        for m, c in (("parallel", "tab:blue"), ("sequential", "tab:red")):
            ax.plot(stages, [res[str(s)][m]["computations_per_s"] for s in stages], "o-", color=c, label=m)
        ax.set_xscale("log", base=2)
        ax.set_xticks(stages)
        ax.set_xticklabels([str(s) for s in stages])
        ax.set_yscale("log")
        ax.legend(fontsize=8)
    ax.set_xlabel("pipeline stages (host processes)")
    ax.set_ylabel("stage computations / s")
    ax.set_title("Fig. 7 on 16 host processes: parallel vs sequential dispatch", fontsize=9)
    ax = axes[1][0]
    bars = []
    for key, name, colors in (("dcn", "pathways DCN\n(island 0 -> 1)", ("tab:blue", "lightsteelblue")),
                              ("tcp", "raw TCP", ("tab:gray", "silver"))):
        if d[key].get("ok"):
            for stat, color in zip(("best", "median"), colors):
                if d[key]["result"][f"{stat}_gb_per_s"]:
                    bars.append((f"{name}\n{stat}", d[key]["result"][f"{stat}_gb_per_s"], color))
    ax.bar([b[0] for b in bars], [b[1] for b in bars], color=[b[2] for b in bars])
    ax.set_ylabel("GB/s")
    ax.set_title(f"{DCN_MIB} MiB between two processes on loopback", fontsize=9)
    ax = axes[1][1]
    reg = d["regression"]
    for label, mode in REG_ROWS:
        pts = []
        for c in reg["counts"]:
            _, v = _best_round(reg["runs"][c], mode)
            old = _best_round(reg["base_runs"][c], mode)[1] if reg.get("base_runs", {}).get(c) else None
            if v and old:
                pts.append((c, v / old))
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=label)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.axhspan(0.9, 1.1, color="tab:green", alpha=0.1)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("devices")
    ax.set_ylabel(f"now / at {reg.get('base', {}).get('commit', '?')}")
    ax.set_title("in process: Figure 5 now vs before issue 8, same machine (band: +-10%)", fontsize=9)
    ax.legend(fontsize=8)
    for a in axes.flat:
        a.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> None:
    p = h.argument_parser(__doc__.splitlines()[0])
    p.add_argument("--only", choices=SECTIONS, help="run only this section (results as multihost_<section>)")
    p.add_argument("--base", default=BASE_COMMIT,
                   help="commit the in-process section compares with (built once into build/regression/)")
    args = p.parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    sw = h.Stopwatch()
    info = h.machine_info()
    mark = uuid.uuid4().hex
    try:
        d = run_all(args.quick, mark, args.only, args.base)
    finally:
        left = leftover_hosts(mark)
    d["leftover_hosts"] = left
    text = report(d, info, sw.elapsed())
    print(text)
    d["machine"] = info
    name = f"{NAME}_{args.only}" if args.only else NAME
    h.write_results(args.out_dir, name, text, d)
    if args.only is None:
        plot(d, report_fig5(d, [], []), os.path.join(args.out_dir, f"{name}.png"))


if __name__ == "__main__":
    main()
