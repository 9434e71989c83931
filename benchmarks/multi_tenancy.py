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

import os
import sys
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
    for r in r9.values():  # the raw events are in the Chrome traces; keep the JSON small
        if r.get("ok"):
            r["result"]["timeline"]["events"] = len(r["result"]["timeline"]["events"])
    h.write_results(args.out_dir, NAME, text, data)


if __name__ == "__main__":
    main()
