"""Figure 7: parallel vs sequential asynchronous dispatch (paper §4.5, §5.1).

A pipeline of S stages (S = 1, 2, 4, ..., 64): stage s is a pmap (scalar psum +
add) on its own 4-device slice, each slice on a different host of one island
(64 hosts x 4 devices); the output of each stage is transferred (ICI) to the
next. One `@pw.program` call runs the whole pipeline. Measured:

  throughput  programs issued back to back (up to 4 in flight), counted as
              stage computations/s (= S x programs/s);
  latency     one program at a time: call, then wait for its output.

with `dispatch="parallel"` (every node's host-side work done at the call) and
`dispatch="sequential"` (each node's host-side work waits for its inputs, and
the call returns when the last node is dispatched).

Each is run twice, in fresh processes: with no modeled control-message
latency (client and hosts share this process, so messages are free) and with
`control_latency_us=50` in the topology (a modeled client/host message
latency: parallel dispatch pays it once per program, sequential once per
node, as in the paper's Figure 4). The paper's client and hosts talk over a
datacenter network; 50 us is an assumption, chosen with --control-latency-us.

Usage: python benchmarks/pipeline_dispatch.py [--quick] [--control-latency-us 0,50]
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _harness as h  # noqa: E402

NAME = "pipeline_dispatch"
TOPOLOGY = "islands=1,hosts_per_island=64,devices_per_host=4"
WINDOW = 4  # programs in flight for the throughput measurement
MODES = ("parallel", "sequential")


def _median(xs: list) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2]


def pw_pipeline(stages: list, seconds: float, rounds: int) -> dict:
    """Runs in one fresh process: builds max(stages) slices, measures every S.

    For each S, `rounds` rounds alternate the two modes (parallel, then
    sequential) so both see the same machine state; each round measures
    throughput for seconds/rounds and latency for half that.
    """
    import numpy as np

    import pathways as pw

    dev_set = pw.make_virtual_device_set()
    slices = [dev_set.add_slice(tpu_devices=4) for _ in range(max(stages))]
    hosts = [sorted({v.physical.host for v in s.tpus}) for s in slices]
    fns = [pw.pmap(lambda x: pw.psum(x, "i") + 1.0, devices=s.tpus, axis_name="i") for s in slices]
    x0 = pw.device_put(np.zeros(4, np.float32), slices[0].tpus)
    out = {"topology": pw.topology(), "slice_hosts": hosts, "results": {}}
    t_before = pw.transfer_stats()
    wait = lambda b: b.block_until_ready()  # noqa: E731

    def call_return_us(fn, count=20):
        """Median time for a program call to return (one at a time)."""
        ts = []
        for _ in range(count):
            t0 = time.perf_counter()
            b = fn()
            ts.append(time.perf_counter() - t0)
            b.block_until_ready()
        return 1e6 * _median(ts)

    for S in stages:
        def body(x, S=S):
            for f in fns[:S]:
                x = f(x)
            return x

        progs = {m: pw.program(body, dispatch=m) for m in MODES}
        expect = 0.0  # stage k maps v -> 4v + 1, from v = 0
        for _ in range(S):
            expect = 4 * expect + 1
        res: dict = {}
        lowered = progs["parallel"].lower(x0)
        res["lowered"] = {"compute": lowered.num_compute_steps, "transfer": lowered.num_transfer_steps}
        state = {m: {"x": x0} for m in MODES}

        def issue(m):
            # Feed the output back: the next program's input is on the last
            # stage's slice, so the first node starts with a transfer.
            state[m]["x"] = progs[m](state[m]["x"])
            return state[m]["x"]

        for m in MODES:
            got = float(np.asarray(progs[m](x0))[0])
            res[m] = {"check": abs(got - expect) <= 1e-6 * max(1.0, abs(expect)), "thr": [], "lat": []}
            h.timed_loop(lambda m=m: issue(m), wait, seconds=0.1, window=WINDOW, per_call=S)  # warm-up
        for _ in range(rounds):
            for m in MODES:
                thr = h.timed_loop(lambda m=m: issue(m), wait, seconds=seconds / rounds, window=WINDOW,
                                   per_call=S)
                lat = h.timed_loop(lambda m=m: progs[m](x0), wait, seconds=seconds / rounds / 2, window=0)
                res[m]["thr"].append(thr["per_s"])
                res[m]["lat"].append(1e6 / lat["per_s"])
        for m in MODES:
            r = res[m]
            r["computations_per_s"] = _median(r["thr"])
            r["programs_per_s"] = r["computations_per_s"] / S
            r["latency_us"] = _median(r["lat"])
            r["call_return_us"] = call_return_us(lambda m=m: progs[m](x0))
        # The per-call override must behave like the program's own mode.
        with pw.dispatch_mode("sequential"):
            res["override_sequential_call_return_us"] = call_return_us(lambda: progs["parallel"](x0))
        with pw.dispatch_mode("parallel"):
            res["override_parallel_call_return_us"] = call_return_us(lambda: progs["sequential"](x0))
        out["results"][S] = res
    t_after = pw.transfer_stats()
    out["transfers"] = {k: t_after[k] - t_before.get(k, 0) for k in t_after}
    return out


def _report_one(lines: list, r: dict, stages: list, rounds: int) -> None:
    """Appends the table and checks of one latency setting."""
    if not r["ok"]:
        lines.append(f"pathways: {r['error']}")
        return
    v = r["result"]
    res = v["results"]

    def rng(xs, fmt):
        return f"{fmt(min(xs))}-{fmt(max(xs))}"

    def us(x):
        return f"{x:.0f}"

    rows = []
    for S in stages:
        p, s = res[str(S)]["parallel"], res[str(S)]["sequential"]
        rows.append([
            S,
            h.fmt_rate(p["computations_per_s"]),
            rng(p["thr"], h.fmt_rate),
            h.fmt_rate(s["computations_per_s"]),
            rng(s["thr"], h.fmt_rate),
            f"{p['computations_per_s'] / s['computations_per_s']:.2f}x",
            us(p["latency_us"]),
            us(s["latency_us"]),
            rng(s["lat"], us),
            f"{s['latency_us'] / p['latency_us']:.2f}x",
            f"{p['call_return_us']:.0f} / {s['call_return_us']:.0f}",
        ])
    lines.append(h.table(
        ["stages", "par comp/s", "(range)", "seq comp/s", "(range)", "par/seq", "par lat us",
         "seq lat us", "(range)", "seq/par", "call returns us par/seq"],
        rows,
    ))
    smax = str(max(stages))
    hosts = v["slice_hosts"]
    distinct = len({tuple(x) for x in hosts}) == len(hosts) and all(len(x) == 1 for x in hosts)
    checks = all(res[k][m]["check"] for k in res for m in MODES)
    low = {S: res[str(S)]["lowered"] for S in stages}
    lines += [
        "",
        f"dispatch_mode override, S={smax}: call returns in "
        f"{res[smax]['override_sequential_call_return_us']:.0f} us for the parallel program under "
        f"dispatch_mode('sequential'), {res[smax]['override_parallel_call_return_us']:.0f} us for the "
        "sequential program under dispatch_mode('parallel')",
        f"slices: {len(hosts)} slices of 4 devices; "
        + ("each on its own host" if distinct else f"hosts per slice: {hosts}")
        + f"; results checked (stage: v -> 4v+1): {'all ok' if checks else 'WRONG'}",
        "transfers during the run: " + ", ".join(f"{k}={val}" for k, val in v["transfers"].items()),
        "lowered program (compute, transfer steps): "
        + ", ".join(f"S={S}: {x['compute']},{x['transfer']}" for S, x in low.items()),
    ]


def main(argv=None) -> None:
    p = h.argument_parser(__doc__.splitlines()[0])
    p.add_argument(
        "--control-latency-us",
        default="0,50",
        help="comma-separated modeled control-message latencies (topology key control_latency_us); "
        "0 = none (one process), default: 0,50",
    )
    args = p.parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    sw = h.Stopwatch()
    info = h.machine_info()
    stages = [1, 4, 16, 64] if args.quick else [1, 2, 4, 8, 16, 32, 64]
    seconds, rounds = (0.3, 1) if args.quick else (1.5, 5)
    latencies = [float(x) for x in args.control_latency_us.split(",") if x.strip()]
    missing = h.pathways_api_missing(["dispatch_mode"])
    supports_latency = "control_latency_us" in h.pathways_configure_keys()
    runs = {}
    for lat in latencies:
        key = f"{lat:g}"
        if missing:
            runs[key] = {"ok": False, "error": f"pathways API missing: pw.{', pw.'.join(missing)}"}
            continue
        if lat and not supports_latency:
            runs[key] = {"ok": False, "error": "pathways API missing: configure(control_latency_us=...)"}
            continue
        topo = TOPOLOGY + (f",control_latency_us={lat:g}" if lat else "")
        h.log(f"[{NAME}] control_latency_us={lat:g} S={stages}")
        runs[key] = h.run_isolated(
            "pipeline_dispatch:pw_pipeline",
            {"stages": stages, "seconds": seconds, "rounds": rounds},
            env={"PATHWAYS_TOPOLOGY": topo},
            timeout=600,
        )
        runs[key]["topology"] = topo

    lines = [h.machine_header(info), ""]
    lines.append(
        "Figure 7: pipeline of S stages, each a pmap (psum + add) on its own 4-device slice on its own "
        f"host ({TOPOLOGY})"
    )
    for key, r in runs.items():
        lines += ["", f"control_latency_us={key}"
                  + (" (no modeled message latency: client and hosts in one process)" if float(key) == 0
                     else " (modeled latency of each control message on the dispatch path)"), ""]
        _report_one(lines, r, stages, rounds)
    lines += [
        "",
        "Notes:",
        f"- comp/s = stage computations per second with programs issued back to back, at most {WINDOW}",
        "  in flight; each program's input is the previous program's output (on the last stage's slice).",
        "- lat = one program at a time (call, then wait for its output): the end-to-end latency in us.",
        f"- each cell is the median of {rounds} rounds (range = min-max over the rounds); the rounds",
        "  alternate parallel and sequential so both modes see the same machine state.",
        "- call returns = median time for the program call itself to return (its dispatch cost to",
        "  Python): parallel returns after enqueueing every node; sequential after the last node",
        "  is dispatched, i.e. after the earlier stages have run.",
        "- control_latency_us is a model parameter, not a measurement: per the runtime, parallel",
        "  dispatch pays it once per program, sequential dispatch once per node (paper Figure 4).",
        "  With 0, sequential dispatch costs a thread wake-up per node, which varies a lot on this VM.",
        "- interconnect latency/bandwidth are not modeled: an ICI transfer costs a memcpy of 4 floats",
        "  plus its scheduling; stages do no simulated compute.",
        "",
        f"total time {sw.elapsed():.0f} s",
    ]
    text = "\n".join(lines)
    print(text)
    data = {"stages": stages, "runs": runs, "machine": info}
    plt = h.pyplot()
    ok = {k: r for k, r in runs.items() if r.get("ok")}
    if plt is not None and ok:
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.8))
        colors = {"parallel": "tab:blue", "sequential": "tab:red"}
        styles = ["o-", "s--", "^:", "d-."]
        for i, (key, r) in enumerate(ok.items()):
            res = r["result"]["results"]
            for m in MODES:
                label = f"{m}, control latency {key} us"
                for ax, k, rk in ((ax1, "computations_per_s", "thr"), (ax2, "latency_us", "lat")):
                    ys = [res[str(S)][m][k] for S in stages]
                    ax.plot(stages, ys, styles[i % len(styles)], color=colors[m], label=label)
                    ax.fill_between(stages, [min(res[str(S)][m][rk]) for S in stages],
                                    [max(res[str(S)][m][rk]) for S in stages], color=colors[m], alpha=0.1)
        for ax, yl in ((ax1, f"stage computations / s ({WINDOW} programs in flight)"),
                       (ax2, "program latency (us), one at a time")):
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xticks(stages)
            ax.set_xticklabels([str(s) for s in stages])
            ax.set_xlabel("pipeline stages (hosts)")
            ax.set_ylabel(yl)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
        fig.suptitle("Figure 7: parallel vs sequential dispatch (simulated devices; band = min-max of rounds)")
        fig.tight_layout()
        fig.savefig(os.path.join(args.out_dir, f"{NAME}.png"), dpi=110)
        plt.close(fig)
    h.write_results(args.out_dir, NAME, text, data)


if __name__ == "__main__":
    main()
