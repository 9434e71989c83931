"""Figures 8 and 9: multi-tenancy (paper §5.2, Appendix D).

One island of 16 devices (4 hosts x 4). Each client is a Python thread with
its own `pw.Client`, its own 16-device slice (the resource manager maps every
client's slice onto the same 16 devices) and its own program: a pmap of
psum + add + `pw.simulated_compute(x, T)`. Every gang needs all 16 devices,
so the gang scheduler must time-multiplex the clients' programs.

Figure 8: aggregate throughput (computations/s over all clients) for
  1, 2, 4, 8, 16 clients x T = 0.33, 1, 2.5, 5, 10 ms, FIFO policy. Each
  client runs a closed loop: call its pmap, wait for the output, repeat (a
  client that waits for its results, like a training loop reading its loss).
  The ideal is 1/T (devices never idle); utilization = device busy time /
  wall time, from the runtime's per-device busy counters.

Figure 9: 4 clients, proportional share with weights 1:1:1:1 and 1:2:4:8,
  T = 0.33 ms and 1 ms, ~3 s each. Here every client keeps 32 programs in
  flight, so all are always backlogged (proportional share can only divide
  time among clients that want it). Shares are measured from
  `pw.client_stats()` between 0.5 s and the end of the submission window,
  while every client is backlogged. A 0.3 s slice of each run is recorded
  with `pw.timeline()` for the PNG and the Chrome trace.

Usage: python benchmarks/multi_tenancy.py [--quick]
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _harness as h  # noqa: E402

NAME = "multi_tenancy"
TOPOLOGY = "islands=1,hosts_per_island=4,devices_per_host=4"
N_DEVICES = 16
CLIENT_COLORS = ["tab:blue", "tab:orange", "tab:green", "tab:red"]


def _client_fn(pw, tpus, t_us: float, tag: int):
    """A distinct program per client: the constant differs, so the traces differ."""
    def step(x):
        return pw.simulated_compute(pw.psum(x, "i") * 0.0 + x + float(tag + 1), t_us)

    step.__name__ = step.__qualname__ = f"client{tag}_step"  # the name shown in traces
    return pw.pmap(step, devices=tpus, axis_name="i")


def fig8_worker(clients_list: list, compute_ms: list, seconds: float) -> dict:
    """All Figure 8 configurations in one process (the topology is the same)."""
    import numpy as np

    import pathways as pw

    pw.set_scheduling_policy("fifo")
    out = {"topology": pw.topology(), "policy": pw.scheduling_policy(), "results": {}}
    for t_ms in compute_ms:
        for nc in clients_list:
            t_us = t_ms * 1000.0
            slices = [pw.make_virtual_device_set().add_slice(tpu_devices=N_DEVICES) for _ in range(nc)]
            fns = [_client_fn(pw, s.tpus, t_us, i) for i, s in enumerate(slices)]
            xs = [pw.device_put(np.zeros(N_DEVICES, np.float32), s.tpus) for s in slices]
            clients = [pw.Client(f"c{nc}x{t_ms}-{i}") for i in range(nc)]
            for f, x in zip(fns, xs):  # trace + first run outside the clock
                f(x).block_until_ready()
            counts = [0] * nc
            start = threading.Barrier(nc + 1)
            stop = threading.Event()

            def run(i):
                f, x, c = fns[i], xs[i], clients[i]
                start.wait()
                k = 0
                with c:
                    while not stop.is_set():
                        x = f(x)
                        x.block_until_ready()
                        k += 1
                counts[i] = k

            threads = [threading.Thread(target=run, args=(i,)) for i in range(nc)]
            for t in threads:
                t.start()
            busy0 = pw.device_busy_seconds()
            start.wait()
            t0 = time.perf_counter()
            time.sleep(seconds)
            stop.set()
            for t in threads:
                t.join()
            wall = time.perf_counter() - t0
            busy1 = pw.device_busy_seconds()
            busy = [b1 - b0 for b0, b1 in zip(busy0, busy1)][:N_DEVICES]
            total = sum(counts)
            out["results"][f"{nc}x{t_ms}"] = {
                "clients": nc,
                "compute_ms": t_ms,
                "computations": total,
                "seconds": wall,
                "per_s": total / wall,
                "ideal_per_s": 1000.0 / t_ms,
                "utilization": sum(busy) / len(busy) / wall,
                "per_client": counts,
            }
    return out


def fig9_worker(weights: list, compute_ms: float, seconds: float, trace_path: str,
                trace_window: float) -> dict:
    """One proportional-share run: 4 backlogged clients with `weights`."""
    import numpy as np

    import pathways as pw

    pw.set_scheduling_policy("proportional_share")
    t_us = compute_ms * 1000.0
    nc = len(weights)
    slices = [pw.make_virtual_device_set().add_slice(tpu_devices=N_DEVICES) for _ in range(nc)]
    fns = [_client_fn(pw, s.tpus, t_us, i) for i, s in enumerate(slices)]
    xs = [pw.device_put(np.zeros(N_DEVICES, np.float32), s.tpus) for s in slices]
    names = [f"client{i} (w={w:g})" for i, w in enumerate(weights)]
    clients = [pw.Client(n, weight=float(w)) for n, w in zip(names, weights)]
    for f, x in zip(fns, xs):
        f(x).block_until_ready()
    depth = 32
    start = threading.Barrier(nc + 1)
    stop = threading.Event()
    counts = [0] * nc

    def run(i):
        f, x, c = fns[i], xs[i], clients[i]
        inflight = []
        start.wait()
        k = 0
        with c:
            while not stop.is_set():
                x = f(x)
                inflight.append(x)
                k += 1
                if len(inflight) > depth:
                    inflight.pop(0).block_until_ready()
        for b in inflight:
            b.block_until_ready()
        counts[i] = k

    threads = [threading.Thread(target=run, args=(i,)) for i in range(nc)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    time.sleep(0.5)
    s0 = pw.client_stats()
    w0 = time.perf_counter()
    time.sleep(max(0.0, seconds - trace_window - (time.perf_counter() - t0)))
    # The timeline covers the last `trace_window` s of submission and then the
    # drain: on exit it waits for all dispatched work, so the clients stop first.
    with pw.timeline() as tl:
        time.sleep(trace_window)
        s1 = pw.client_stats()
        w1 = time.perf_counter()
        stop.set()
        for t in threads:
            t.join()
    total_wall = time.perf_counter() - t0
    dev_s = {n: s1[n]["device_seconds"] - s0[n]["device_seconds"] for n in names}
    gangs = {n: s1[n]["gangs"] - s0[n]["gangs"] for n in names}
    tot = sum(dev_s.values())
    events = tl.events()
    busy_tl = tl.device_busy_seconds()
    if trace_path:
        tl.export_chrome_trace(trace_path, devices=list(range(0, N_DEVICES, 2)))
    # Compact events for the PNG: a sample of devices over the recorded window.
    sample = set(range(0, N_DEVICES, 2))
    ev = [(e["device"], e["start_us"], e["end_us"], e["client"]) for e in events if e["device"] in sample]
    tl_clients = sorted({e[3] for e in ev})
    return {
        "weights": weights,
        "compute_ms": compute_ms,
        "policy": pw.scheduling_policy(),
        "window_s": w1 - w0,
        "expected_share": [w / sum(weights) for w in weights],
        "device_seconds": [dev_s[n] for n in names],
        "share": [dev_s[n] / tot if tot else None for n in names],
        "gangs": [gangs[n] for n in names],
        "per_s_total": sum(gangs.values()) / (w1 - w0),
        "utilization": tot / N_DEVICES / (w1 - w0),
        "submitted": counts,
        "total_wall_s": total_wall,
        "names": names,
        "timeline": {
            "wall_s": tl.wall_seconds,
            "events": ev,
            "clients_seen": tl_clients,
            "steady_center_us": trace_window / 2 * 1e6,  # all clients backlogged around here
            "busy_mean_s": sum(busy_tl.values()) / max(1, len(busy_tl)),
        },
    }


# --------------------------------------------------------------------------
# Tenants as processes (issue 27): a pathways-server and one process per client.

SERVICE_TOPOLOGY = TOPOLOGY + ",hosts=local_processes"


class Service:
    """A pathways-server on this machine (its hosts on loopback), for one measurement."""

    def __init__(self, policy: str = "fifo", *args: str):
        self.dir = tempfile.mkdtemp(prefix="pw_bench_service_")
        self.connection = os.path.join(self.dir, "server.json")
        env = {k: v for k, v in os.environ.items() if k not in ("PATHWAYS_TOPOLOGY", "PATHWAYS_SERVER")}
        self.err = open(os.path.join(self.dir, "server.err"), "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pathways.server", f"--connection-file={self.connection}",
             f"--topology={TOPOLOGY}", f"--policy={policy}",
             # up to 16 tenants and an observer, each holding every device
             "--tenant-memory=32MiB", *args],
            stdout=subprocess.PIPE, stderr=self.err, env=env, start_new_session=True)
        line = self.proc.stdout.readline().decode()
        if not line.startswith("pathways-server ready"):
            self.close()
            raise RuntimeError(f"pathways-server did not start: {line!r}")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.err.close()


def tenant_worker(connection: str, name: str, weight: float, priority: int, compute_ms: float, tag: int,
                  depth: int, sync_dir: str) -> dict:
    """One tenant process: its program on all 16 devices, `depth` in flight (0: a closed loop,
    each step timed), from the go file in `sync_dir` until the stop file."""
    import numpy as np

    import pathways as pw

    pw.configure(server=connection, name=name, priority=priority)
    tpus = pw.make_virtual_device_set().add_slice(tpu_devices=N_DEVICES).tpus
    f = _client_fn(pw, tpus, compute_ms * 1000.0, tag)
    x = pw.device_put(np.zeros(N_DEVICES, np.float32), tpus)
    f(x).block_until_ready()
    client = pw.Client(name, weight=float(weight))
    open(os.path.join(sync_dir, f"ready.{name}"), "w").close()
    go, stop = os.path.join(sync_dir, "go"), os.path.join(sync_dir, "stop")
    while not os.path.exists(go):
        time.sleep(0.001)
    count, steps, inflight = 0, [], []
    with client:
        while not os.path.exists(stop):
            if depth:
                x = f(x)
                inflight.append(x)
                if len(inflight) > depth:
                    inflight.pop(0).block_until_ready()
            else:
                t0 = time.perf_counter()
                x = f(x)
                x.block_until_ready()
                steps.append((time.perf_counter() - t0) * 1e3)
            count += 1
        for b in inflight:
            b.block_until_ready()
    return {"count": count, "step_ms": steps}


def stats_worker(connection: str, sync_dir: str, skip: float, seconds: float) -> dict:
    """A tenant that only watches: pw.client_stats() after `skip` s and at the end, then stop."""
    import pathways as pw

    pw.configure(server=connection, name="observer")
    go = os.path.join(sync_dir, "go")
    while not os.path.exists(go):
        time.sleep(0.001)
    time.sleep(skip)
    s0, w0 = pw.client_stats(), time.perf_counter()
    time.sleep(seconds)
    s1, w1 = pw.client_stats(), time.perf_counter()
    open(os.path.join(sync_dir, "stop"), "w").close()
    return {"before": s0, "after": s1, "window_s": w1 - w0}


def run_tenants(service: Service, tenants: list, skip: float, seconds: float, timeout: float = 300) -> dict:
    """Runs `tenants` (tenant_worker kwargs without connection/sync_dir) at once, with an observer."""
    sync_dir = tempfile.mkdtemp(prefix="pw_bench_sync_")
    results: dict = {}

    def run(key, target, kwargs):
        results[key] = h.run_isolated(target, kwargs, env={"PATHWAYS_TOPOLOGY": None, "PATHWAYS_SERVER": None},
                                      timeout=timeout)

    threads = [threading.Thread(target=run, args=(t["name"], "multi_tenancy:tenant_worker",
                                                  {**t, "connection": service.connection, "sync_dir": sync_dir}))
               for t in tenants]
    threads.append(threading.Thread(target=run, args=("observer", "multi_tenancy:stats_worker", {
        "connection": service.connection, "sync_dir": sync_dir, "skip": skip, "seconds": seconds})))
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    while sum(f.startswith("ready.") for f in os.listdir(sync_dir)) < len(tenants):
        if time.monotonic() > deadline or not any(t.is_alive() for t in threads[:-1]):
            break
        time.sleep(0.01)
    open(os.path.join(sync_dir, "go"), "w").close()
    for t in threads:
        t.join()
    return results


def fig9_processes(nc: int, weights: list, compute_ms: float, seconds: float) -> dict:
    """Figure 9 with `nc` client processes of one service (proportional share)."""
    service = Service("proportional_share")
    try:
        names = [f"client{i} (w={w:g})" for i, w in enumerate(weights)]
        res = run_tenants(service, [
            {"name": n, "weight": w, "priority": 0, "compute_ms": compute_ms, "tag": i, "depth": 32}
            for i, (n, w) in enumerate(zip(names, weights))], skip=0.5, seconds=seconds - 0.5)
    finally:
        service.close()
    failed = [f"{k}: {r['error']}" for k, r in res.items() if not r["ok"]]
    if failed:
        return {"ok": False, "error": "; ".join(failed)[:400]}
    obs = res["observer"]["result"]
    dev_s = {n: obs["after"][n]["device_seconds"] - obs["before"].get(n, {}).get("device_seconds", 0.0)
             for n in names}
    gangs = {n: obs["after"][n]["gangs"] - obs["before"].get(n, {}).get("gangs", 0) for n in names}
    tot = sum(dev_s.values())
    share = [dev_s[n] / tot if tot else None for n in names]
    expected = [w / sum(weights) for w in weights]
    return {"ok": True, "weights": weights, "compute_ms": compute_ms, "window_s": obs["window_s"],
            "share": share, "expected_share": expected,
            "max_share_error_pp": max(abs(a - b) for a, b in zip(share, expected)) * 100,
            "utilization": tot / N_DEVICES / obs["window_s"],
            "per_s_total": sum(gangs.values()) / obs["window_s"]}


def priority_run(n_low: int, compute_ms: float, seconds: float) -> dict:
    """A high-priority tenant's closed-loop step time, alone and with `n_low` low-priority
    tenants saturating the island (32 programs in flight each)."""
    out: dict = {}
    for label, lows, args in (("alone", 0, ()), ("with low", n_low, ()),
                              ("with low, no anticipation", n_low, ("--max-anticipation-ms=0",))):
        service = Service("fifo", *args)
        try:
            tenants = [{"name": "high", "weight": 1.0, "priority": 10, "compute_ms": compute_ms, "tag": 0,
                        "depth": 0}]
            tenants += [{"name": f"low{i}", "weight": 1.0, "priority": 0, "compute_ms": compute_ms,
                         "tag": i + 1, "depth": 32} for i in range(lows)]
            res = run_tenants(service, tenants, skip=0.3, seconds=seconds)
        finally:
            service.close()
        failed = [f"{k}: {r['error']}" for k, r in res.items() if not r["ok"]]
        if failed:
            return {"ok": False, "error": "; ".join(failed)[:400]}
        steps = sorted(res["high"]["result"]["step_ms"][5:])  # after warm-up
        obs = res["observer"]["result"]
        low_dev = sum(obs["after"][f"low{i}"]["device_seconds"] - obs["before"].get(f"low{i}", {}).get(
            "device_seconds", 0.0) for i in range(lows))
        out[label] = {"median_ms": steps[len(steps) // 2] if steps else None,
                      "p90_ms": steps[int(len(steps) * 0.9)] if steps else None, "steps": len(steps),
                      "low_utilization": low_dev / N_DEVICES / obs["window_s"]}
    out["ok"] = True
    out["ratio"] = out["with low"]["median_ms"] / out["alone"]["median_ms"]
    out["ratio_no_anticipation"] = out["with low, no anticipation"]["median_ms"] / out["alone"]["median_ms"]
    return out


def dispatch_processes(n: int, seconds: float, warmup: float) -> dict:
    """dispatch_overhead's pathways workload, hosts as processes: owned by the process, or a service's."""
    topology = SERVICE_TOPOLOGY  # the service's: the same hosts and devices
    owned = h.run_isolated("dispatch_overhead:pw_worker", {"n": n, "seconds": seconds, "warmup": warmup},
                           env={"PATHWAYS_TOPOLOGY": topology, "PATHWAYS_SERVER": None}, timeout=300)
    service = Service("fifo")
    try:
        tenant = h.run_isolated("dispatch_overhead:pw_worker", {"n": n, "seconds": seconds, "warmup": warmup},
                                env={"PATHWAYS_TOPOLOGY": None, "PATHWAYS_SERVER": service.connection},
                                timeout=300)
    finally:
        service.close()
    return {"owned": owned, "tenant": tenant}


def plot_processes(rp: dict, clients: list, path: str) -> None:
    """Tenants as processes: utilization and shares against threads, and the priority step times."""
    plt = h.pyplot()
    if plt is None or not rp:
        return
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(15, 4.2))
    labels, util_t, util_p = [], [], []
    for nc in clients:
        r = rp.get(f"fig9 {nc}")
        if not r or not r["threads"].get("ok") or not r["processes"].get("ok"):
            continue
        labels.append(f"{nc} clients")
        util_t.append(100 * r["threads"]["result"]["utilization"])
        util_p.append(100 * r["processes"]["utilization"])
    xs = list(range(len(labels)))
    ax1.bar([x - 0.2 for x in xs], util_t, 0.4, label="threads of one process")
    ax1.bar([x + 0.2 for x in xs], util_p, 0.4, label="processes of one service")
    ax1.set_xticks(xs)
    ax1.set_xticklabels(labels)
    ax1.set_ylim(0, 105)
    ax1.set_ylabel("device utilization (%)")
    ax1.set_title("Figure 9 load, proportional share", fontsize=9)
    ax1.legend(fontsize=8)
    r = rp.get(f"fig9 {clients[-1]}")
    if r and r["processes"].get("ok"):
        p = r["processes"]
        idx = list(range(len(p["share"])))
        ax2.bar([i - 0.2 for i in idx], [100 * v for v in p["expected_share"]], 0.4, label="weight share")
        ax2.bar([i + 0.2 for i in idx], [100 * v for v in p["share"]], 0.4, label="measured (processes)")
        ax2.set_xlabel("client process")
        ax2.set_ylabel("share of device time (%)")
        ax2.set_title(f"{clients[-1]} client processes, weights 1:2:4:8", fontsize=9)
        ax2.legend(fontsize=8)
    pr = rp.get("priority")
    if pr and pr.get("ok"):
        keys = ["alone", "with low", "with low, no anticipation"]
        ax3.bar(["alone", "with low", "with low,\nno anticipation"], [pr[k]["median_ms"] for k in keys],
                color=["tab:green", "tab:red", "tab:gray"])
        ax3.set_ylabel("median step (ms)")
        ax3.set_title(f"priority 10 tenant, alone and with 8 busy tenants of priority 0: {pr['ratio']:.2f}x",
                      fontsize=9)
    fig.suptitle("Tenants as processes of one pathways-server (16 devices, hosts as processes)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_fig8(data: dict, path: str) -> None:
    plt = h.pyplot()
    if plt is None:
        return
    res = data["result"]["results"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for t_ms in data["compute_ms"]:
        ys = [res[f"{nc}x{t_ms}"]["per_s"] for nc in data["clients"]]
        line, = ax1.plot(data["clients"], ys, "o-", label=f"{t_ms} ms")
        ax1.axhline(1000.0 / t_ms, color=line.get_color(), linestyle=":", alpha=0.6)
        ax2.plot(data["clients"], [100 * res[f"{nc}x{t_ms}"]["utilization"] for nc in data["clients"]],
                 "o-", label=f"{t_ms} ms")
    ax1.set_yscale("log")
    ax1.set_ylabel("aggregate computations / s (dotted: ideal 1/T)")
    ax2.set_ylabel("device utilization (%)")
    ax2.set_ylim(0, 105)
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xticks(data["clients"])
        ax.set_xticklabels([str(c) for c in data["clients"]])
        ax.set_xlabel("concurrent clients")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(title="compute / program", fontsize=8)
    fig.suptitle("Figure 8: aggregate throughput of concurrent clients on 16 simulated devices (FIFO)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_fig9(runs: list, path: str, span_ms: float = 25.0) -> None:
    """Rows = sampled devices, x = time, colored by client; one panel per run."""
    plt = h.pyplot()
    if plt is None or not runs:
        return
    fig, axes = plt.subplots(len(runs), 1, figsize=(12, 2.6 * len(runs)), squeeze=False)
    for ax, (title, r) in zip(axes[:, 0], runs):
        ev = r["timeline"]["events"]
        names = r["names"]
        color = {n: CLIENT_COLORS[i % len(CLIENT_COLORS)] for i, n in enumerate(names)}
        if ev:
            t_mid = r["timeline"]["steady_center_us"]
            lo, hi = t_mid - span_ms * 500, t_mid + span_ms * 500
            devices = sorted({e[0] for e in ev})
            row = {d: i for i, d in enumerate(devices)}
            for d, s, e, c in ev:
                if e < lo or s > hi:
                    continue
                ax.broken_barh([((s - lo) / 1e3, (e - s) / 1e3)], (row[d] - 0.4, 0.8),
                               facecolors=color.get(c, "gray"), edgecolor="none")
            ax.set_yticks(range(len(devices)))
            ax.set_yticklabels([f"dev {d}" for d in devices], fontsize=7)
            ax.set_xlim(0, span_ms)
        shares = ", ".join(f"{s * 100:.0f}%" for s in r["share"])
        ax.set_title(f"{title}: measured device-time shares {shares}", fontsize=9)
        ax.set_xlabel("time (ms)")
        handles = [plt.Rectangle((0, 0), 1, 1, color=color[n]) for n in names]
        ax.legend(handles, names, fontsize=7, loc="upper left", bbox_to_anchor=(1.005, 1.0))
    fig.suptitle("Figure 9: gang-scheduled clients under proportional share (sample of 8 of 16 devices)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> None:
    args = h.parse_args(__doc__.splitlines()[0], argv)
    sw = h.Stopwatch()
    info = h.machine_info()
    os.makedirs(args.out_dir, exist_ok=True)
    clients_list = [1, 4, 16] if args.quick else [1, 2, 4, 8, 16]
    compute_ms = [0.33, 2.5, 10] if args.quick else [0.33, 1, 2.5, 5, 10]
    seconds8 = 0.4 if args.quick else 1.0
    seconds9 = 1.2 if args.quick else 3.0
    fig9_ms = [0.33] if args.quick else [0.33, 1.0]
    weightings = [[1, 1, 1, 1], [1, 2, 4, 8]]

    missing = h.pathways_api_missing(
        ["simulated_compute", "Client", "set_scheduling_policy", "client_stats", "timeline",
         "device_busy_seconds"])
    lines = [h.machine_header(info), ""]
    data: dict = {"clients": clients_list, "compute_ms": compute_ms, "machine": info}
    if missing:
        err = f"pathways API missing: pw.{', pw.'.join(missing)}"
        r8 = {"ok": False, "error": err}
        r9 = {}
    else:
        h.log(f"[{NAME}] figure 8")
        r8 = h.run_isolated(
            "multi_tenancy:fig8_worker",
            {"clients_list": clients_list, "compute_ms": compute_ms, "seconds": seconds8},
            env={"PATHWAYS_TOPOLOGY": TOPOLOGY},
            timeout=300,
        )
        r9 = {}
        for t_ms in fig9_ms:
            for w in weightings:
                key = f"{':'.join(str(x) for x in w)} @ {t_ms} ms"
                trace = ""
                if t_ms == fig9_ms[0]:
                    suffix = "" if w == weightings[-1] else "_equal"
                    trace = os.path.join(args.out_dir, f"{NAME}_trace{suffix}.json")
                h.log(f"[{NAME}] figure 9 {key}")
                r9[key] = h.run_isolated(
                    "multi_tenancy:fig9_worker",
                    {"weights": w, "compute_ms": t_ms, "seconds": seconds9, "trace_path": trace,
                     "trace_window": 0.3},
                    env={"PATHWAYS_TOPOLOGY": TOPOLOGY},
                    timeout=120,
                )
    data["fig8"] = r8
    data["fig9"] = r9

    # Tenants as processes (issue 27): the same workloads, hosts as processes.
    proc_ms = 1.0
    proc_clients = [4] if args.quick else [4, 16]
    proc_seconds = 1.5 if args.quick else 3.0
    rp: dict = {}
    if not missing:
        for nc in proc_clients:
            weights = [[1, 2, 4, 8][i % 4] for i in range(nc)]
            h.log(f"[{NAME}] figure 9, {nc} threads of one process, hosts as processes")
            threads_run = h.run_isolated(
                "multi_tenancy:fig9_worker",
                {"weights": weights, "compute_ms": proc_ms, "seconds": proc_seconds, "trace_path": "",
                 "trace_window": 0.3},
                env={"PATHWAYS_TOPOLOGY": SERVICE_TOPOLOGY, "PATHWAYS_SERVER": None}, timeout=300)
            h.log(f"[{NAME}] figure 9, {nc} client processes of one service")
            try:
                procs_run = fig9_processes(nc, weights, proc_ms, proc_seconds)
            except Exception as e:  # noqa: BLE001 - a row
                procs_run = {"ok": False, "error": f"{type(e).__name__}: {e}"[:400]}
            rp[f"fig9 {nc}"] = {"threads": threads_run, "processes": procs_run, "weights": weights}
        h.log(f"[{NAME}] priority: 1 high-priority tenant against 8 low-priority ones")
        try:
            rp["priority"] = priority_run(8, proc_ms, 1.5 if args.quick else 3.0)
        except Exception as e:  # noqa: BLE001
            rp["priority"] = {"ok": False, "error": f"{type(e).__name__}: {e}"[:400]}
        h.log(f"[{NAME}] dispatch cost: a service's tenant against a process owning its hosts")
        try:
            rp["dispatch"] = dispatch_processes(8, 1.0 if args.quick else 2.0, 0.3)
        except Exception as e:  # noqa: BLE001
            rp["dispatch"] = {"owned": {"ok": False, "error": str(e)}, "tenant": {"ok": False, "error": str(e)}}
    data["processes"] = rp

    lines.append(
        f"Figure 8: aggregate computations/s, {N_DEVICES} devices ({TOPOLOGY}), every client's "
        "program gang-scheduled on all 16, FIFO; closed-loop clients (call, wait, repeat); "
        f"{seconds8:.1f} s per cell"
    )
    lines.append("")
    if r8["ok"]:
        res = r8["result"]["results"]
        rows = []
        for t_ms in compute_ms:
            row = [f"{t_ms} ms", h.fmt_rate(1000.0 / t_ms)]
            for nc in clients_list:
                c = res[f"{nc}x{t_ms}"]
                row.append(f"{h.fmt_rate(c['per_s'])} ({c['utilization'] * 100:.0f}%)")
            rows.append(row)
        lines.append(h.table(["compute", "ideal"] + [f"{nc} client{'s' if nc > 1 else ''}" for nc in clients_list],
                             rows))
        lines.append("")
        lines.append("cells: computations/s (device utilization = mean busy time / wall time, from "
                     "pw.device_busy_seconds())")
    else:
        lines.append(f"pathways: {r8['error']}")
    lines.append("JAX peer: n/a. JAX has no simulated kernel of known duration; running real compute "
                 "of T ms on 16 XLA:CPU 'devices' needs 16 cores' worth of CPU per gang (this host has 2), "
                 "so it would measure CPU contention, not scheduling.")
    lines.append("")
    lines.append("Figure 9: 4 clients, proportional share, each client always backlogged (32 programs in "
                 f"flight); shares of device time measured over ~{seconds9 - 0.5:.1f} s")
    lines.append("")
    if r9:
        rows = []
        for key, r in r9.items():
            if not r["ok"]:
                rows.append([key, r["error"], "", "", ""])
                continue
            v = r["result"]
            rows.append([
                key,
                " / ".join(f"{s * 100:.1f}" for s in v["expected_share"]),
                " / ".join(f"{s * 100:.1f}" for s in v["share"]),
                f"{v['utilization'] * 100:.0f}%",
                h.fmt_rate(v["per_s_total"]),
            ])
        lines.append(h.table(["weights @ compute", "expected share %", "measured share %", "util",
                              "total comp/s"], rows))
        traces = [f for f in os.listdir(args.out_dir) if f.startswith(f"{NAME}_trace")]
        lines.append("")
        lines.append("Chrome traces (8 of 16 devices, 0.3 s): " + ", ".join(
            os.path.relpath(os.path.join(args.out_dir, f), h.REPO_DIR) for f in sorted(traces)))
    else:
        lines.append(f"pathways: {r8.get('error', 'not run')}")
    lines += ["", f"Tenants as processes (issue 27): {N_DEVICES} devices ({SERVICE_TOPOLOGY}), every gang on "
              f"all 16, {proc_ms} ms of simulated compute per gang; hosts are processes in every row.", ""]
    rows = []
    for nc in proc_clients:
        r = rp.get(f"fig9 {nc}")
        if r is None:
            continue
        t, p = r["threads"], r["processes"]
        tv = t["result"] if t.get("ok") else None
        pv = p if p.get("ok") else None
        share_err_t = (max(abs(a - b) for a, b in zip(tv["share"], tv["expected_share"])) * 100) if tv else None
        rows.append([
            f"{nc} clients",
            f"{tv['utilization'] * 100:.1f}%" if tv else t.get("error", "?")[:60],
            f"{pv['utilization'] * 100:.1f}%" if pv else p.get("error", "?")[:60],
            f"{pv['utilization'] / tv['utilization'] * 100:.0f}%" if tv and pv else "n/a",
            h.fmt_rate(tv["per_s_total"]) if tv else "n/a",
            h.fmt_rate(pv["per_s_total"]) if pv else "n/a",
            f"{share_err_t:.1f}" if share_err_t is not None else "n/a",
            f"{pv['max_share_error_pp']:.1f}" if pv else "n/a",
        ])
    if rows:
        lines.append("Figure 9, proportional share, weights 1:2:4:8 (repeated), 32 programs in flight per client "
                     f"(goal: processes >= 95% of threads' utilization; shares within 2 points):")
        lines.append("")
        lines.append(h.table(["clients", "util threads", "util processes", "processes / threads",
                              "comp/s threads", "comp/s processes", "share err threads (pp)",
                              "share err processes (pp)"], rows))
        lines.append("")
        lines.append("util = device-seconds (each gang part's span on its host, times its devices, as the "
                     "runtime or the service accounts it) / (16 devices x wall); a span includes the gang's "
                     "collective across hosts, so it is not the same as comp/s x T.")
        lines.append("")
    pr = rp.get("priority")
    if pr is not None:
        if pr.get("ok"):
            lines.append("Priority: a tenant of priority 10 in a closed loop (call, wait), alone and while 8 "
                         "tenants of priority 0 keep 32 programs each in flight (goal: within 1.5x):")
            lines.append("")
            lines.append(h.table(["high-priority tenant", "median step", "p90 step", "low tenants' utilization"], [
                [k, f"{pr[k]['median_ms']:.2f} ms", f"{pr[k]['p90_ms']:.2f} ms",
                 f"{pr[k]['low_utilization'] * 100:.0f}%"] for k in ("alone", "with low",
                                                                      "with low, no anticipation")]))
            lines.append(f"ratio: {pr['ratio']:.2f}x (without anticipation, --max-anticipation-ms=0: "
                         f"{pr['ratio_no_anticipation']:.2f}x)")
        else:
            lines.append(f"Priority: {pr['error']}")
        lines.append("")
    dr = rp.get("dispatch")
    if dr is not None:
        lines.append("Dispatch cost (dispatch_overhead.py's workload, 8 devices): a process that owns its host "
                     "processes against a tenant of a service on the same hosts (goal: Chained within 2x):")
        lines.append("")
        drows = []
        for mode in ("OpByOp", "OpByOp-sync", "Chained", "Fused"):
            o = dr["owned"]["result"]["modes"][mode] if dr["owned"].get("ok") else None
            t = dr["tenant"]["result"]["modes"][mode] if dr["tenant"].get("ok") else None
            drows.append([mode, h.fmt_rate(o["per_s"]) if o else dr["owned"].get("error", "?")[:50],
                          h.fmt_rate(t["per_s"]) if t else dr["tenant"].get("error", "?")[:50],
                          f"{o['per_s'] / t['per_s']:.2f}x" if o and t and t["per_s"] else "n/a"])
        lines.append(h.table(["mode", "owned hosts comp/s", "tenant comp/s", "owned / tenant"], drows))
    lines += [
        "",
        "Notes:",
        "- compute time T is simulated (pw.simulated_compute): devices are held for T without a CPU",
        "  core; the psum + add of each gang is real. Each client's pmap adds a different constant, so",
        "  the clients run different programs.",
        "- utilization counts simulated + real device time; FIFO runs gangs in submission order.",
        "- shares come from pw.client_stats() (device-seconds per client) sampled at 0.5 s and at the",
        "  end of the submission window, so the start-up and the drain of queued work are excluded.",
        "",
        f"total time {sw.elapsed():.0f} s",
    ]
    text = "\n".join(lines)
    print(text)
    if r8.get("ok"):
        plot_fig8({"result": r8["result"], "clients": clients_list, "compute_ms": compute_ms},
                  os.path.join(args.out_dir, f"{NAME}.png"))
    runs = [(k, r["result"]) for k, r in r9.items() if r.get("ok") and k.endswith(f"@ {fig9_ms[0]} ms")]
    if runs:
        plot_fig9(runs, os.path.join(args.out_dir, f"{NAME}_fig9.png"))
    if rp:
        plot_processes(rp, proc_clients, os.path.join(args.out_dir, f"{NAME}_processes.png"))
    for r in r9.values():  # the raw events are in the Chrome traces; keep the JSON small
        if r.get("ok"):
            r["result"]["timeline"]["events"] = len(r["result"]["timeline"]["events"])
    h.write_results(args.out_dir, NAME, text, data)


if __name__ == "__main__":
    main()
