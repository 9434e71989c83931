"""Kernels: matmul GFLOP/s and fused elementwise GB/s on one simulated device, against numpy.

Each row runs one compiled function (`pw.pmap` over a 1-device slice) back to
back on inputs already resident on the device, and numpy on the same shapes:

  matmul        f32 128/256/512/1024 square, f64 512, batched f32 8x128x128;
                the device kernel calls OpenBLAS (cblas_sgemm/dgemm), numpy
                calls its own OpenBLAS. Throughput = 2*m*n*k (*batch) / time.
  elementwise   f32 vectors of 1M and 16M elements, two chains of one shape:
                (a*2+b)*a-1 (arithmetic only) and
                tanh(a*2+b)*a-1 (the same with a transcendental). Inside a
                compiled function consecutive elementwise ops are fused (one
                pass over memory, tile by tile); numpy evaluates the same
                expression op by op and materializes every temporary.
                Throughput = minimum traffic: bytes of the inputs read once
                plus the output written once (3 x 4 bytes per element),
                whatever either side really moves.

pathways and numpy run in separate processes (one each, alternating, in
`ROUNDS` rounds), so neither's BLAS thread pool competes with the other's;
each system's best round is reported (see `summarize`).
The pathways time per call is wall time with calls in flight, so it includes
dispatch; the device time is the median gang duration from `pw.timeline()`
(kernel only, no dispatch, no gap between gangs).

Target (issue): the 512x512 f32 matmul reaches at least half of numpy's
throughput in the same run (per-call time, dispatch included).

Usage: python benchmarks/kernels.py [--quick]
"""

from __future__ import annotations

import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _harness as h  # noqa: E402

NAME = "kernels"
TOPOLOGY = "islands=1,hosts_per_island=1,devices_per_host=1"
OUTPUTS_IN_FLIGHT_BYTES = 256 << 20  # caps calls per batch (a 16M f32 output is 64 MiB)
TARGET_KEY = "matmul_f32_512"
TARGET_RATIO = 0.5
ROUNDS = 3  # pathways process, numpy process, repeated
DEVICE_CALLS = 200  # at most this many gangs recorded per row for the device time

M = 1 << 20
CASES = [
    # matmul: mnk (and batch); elementwise: n elements and the expression
    {"key": "matmul_f32_128", "op": "matmul", "dtype": "float32", "mnk": [128, 128, 128]},
    {"key": "matmul_f32_256", "op": "matmul", "dtype": "float32", "mnk": [256, 256, 256]},
    {"key": "matmul_f32_512", "op": "matmul", "dtype": "float32", "mnk": [512, 512, 512]},
    {"key": "matmul_f32_1024", "op": "matmul", "dtype": "float32", "mnk": [1024, 1024, 1024]},
    {"key": "matmul_f64_512", "op": "matmul", "dtype": "float64", "mnk": [512, 512, 512]},
    {"key": "bmm_f32_8x128", "op": "batched matmul", "dtype": "float32", "mnk": [128, 128, 128],
     "batch": 8},
    {"key": "arith_f32_1M", "op": "(a*2+b)*a-1", "dtype": "float32", "n": M, "expr": "arith"},
    {"key": "arith_f32_16M", "op": "(a*2+b)*a-1", "dtype": "float32", "n": 16 * M, "expr": "arith"},
    {"key": "tanh_f32_1M", "op": "tanh(a*2+b)*a-1", "dtype": "float32", "n": M, "expr": "tanh"},
    {"key": "tanh_f32_16M", "op": "tanh(a*2+b)*a-1", "dtype": "float32", "n": 16 * M, "expr": "tanh"},
]


def _expr(name: str, xp):
    """The elementwise chain `name` with `xp` = numpy or pathways.numpy (traced)."""
    if name == "arith":
        return lambda a, b: (a * 2 + b) * a - 1
    return lambda a, b: xp.tanh(a * 2 + b) * a - 1


def _is_matmul(case: dict) -> bool:
    return "mnk" in case


def work_per_call(case: dict) -> float:
    """FLOPs (matmul) or bytes of minimum traffic (elementwise) per call."""
    if _is_matmul(case):
        m, n, k = case["mnk"]
        return 2.0 * case.get("batch", 1) * m * n * k
    return 3.0 * 4 * case["n"]  # a, b read once + out written once, f32


def shape_text(case: dict) -> str:
    if _is_matmul(case):
        m, n, k = case["mnk"]
        b = f"{case['batch']}x" if case.get("batch") else ""
        return f"{b}{m}x{k} @ {b}{k}x{n}"
    n = case["n"]
    return f"{n // M}M" if n % M == 0 else str(n)


def _inputs(case: dict):
    import numpy as np

    rng = np.random.default_rng(0)
    dt = np.dtype(case["dtype"])
    if _is_matmul(case):
        m, n, k = case["mnk"]
        lead = (case["batch"],) if case.get("batch") else ()
        return (rng.standard_normal(lead + (m, k)).astype(dt),
                rng.standard_normal(lead + (k, n)).astype(dt))
    return (rng.uniform(-1, 1, case["n"]).astype(dt), rng.uniform(-1, 1, case["n"]).astype(dt))


# --------------------------------------------------------------------------
# BLAS configuration (recorded, so a thread-count difference is visible).


def _pathways_blas() -> dict:
    """The OpenBLAS the pathways extension links (libopenblas.so.0, already loaded)."""
    import ctypes

    try:
        lib = ctypes.CDLL("libopenblas.so.0")
        lib.openblas_get_config.restype = ctypes.c_char_p
        lib.openblas_get_corename.restype = ctypes.c_char_p
        return {"config": lib.openblas_get_config().decode(),
                "core": lib.openblas_get_corename().decode(),
                "threads": lib.openblas_get_num_threads()}
    except (OSError, AttributeError) as e:
        return {"error": str(e)}


def _numpy_blas() -> dict:
    """numpy's bundled scipy-openblas, if that is what it uses."""
    import ctypes
    import glob

    import numpy as np

    libs = glob.glob(os.path.join(os.path.dirname(np.__file__), os.pardir, "numpy.libs",
                                  "libscipy_openblas*.so"))
    for path in libs:
        try:
            lib = ctypes.CDLL(path)
            for suffix in ("64_", ""):
                cfg = getattr(lib, f"scipy_openblas_get_config{suffix}", None)
                if cfg is None:
                    continue
                cfg.restype = ctypes.c_char_p
                core = getattr(lib, f"scipy_openblas_get_corename{suffix}")
                core.restype = ctypes.c_char_p
                return {"config": cfg().decode(), "core": core().decode(),
                        "threads": getattr(lib, f"scipy_openblas_get_num_threads{suffix}")()}
        except OSError:
            continue
    return {"error": "numpy's BLAS not identified (not a bundled scipy-openblas)"}


def _env_threads() -> dict:
    return {k: os.environ[k] for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS") if k in os.environ}


# --------------------------------------------------------------------------
# Timing: k calls back to back, then wait for the last output (calls run in
# order on the device, so the last one done means all done).


def back_to_back(issue, wait, calls: int) -> float:
    """Seconds for `calls` calls issued back to back, the last one waited for."""
    import time

    t0 = time.perf_counter()
    last = None
    for _ in range(calls):
        last = issue()
    wait(last)
    return time.perf_counter() - t0


def measure_batches(issue, wait, *, seconds: float, warmup: float, max_calls: int,
                    repeats: int = 3) -> dict:
    """A warm-up batch, then `repeats` batches of k calls, k chosen so a batch
    lasts about `seconds / repeats` (at most `max_calls`, at least 1).

    Returns the median batch's numbers and every batch's rate ("runs_per_s",
    calls per second), as `_harness.measure` does.
    """
    one = back_to_back(issue, wait, 1)
    k_w = max(1, min(max_calls, int(warmup / max(one, 1e-7))))
    est = back_to_back(issue, wait, k_w) / k_w
    k = max(1, min(max_calls, round(seconds / repeats / max(est, 1e-7))))
    runs = sorted(k / back_to_back(issue, wait, k) for _ in range(repeats))
    return {"calls": k, "seconds": sum(k / r for r in runs), "per_s": runs[len(runs) // 2],
            "runs_per_s": runs}


# --------------------------------------------------------------------------
# Workers (each in a fresh process, via _harness.run_isolated).


def pw_worker(cases: list, seconds: float, warmup: float) -> dict:
    import time

    import numpy as np

    import pathways as pw
    import pathways.numpy as pnp

    tpu = pw.make_virtual_device_set().add_slice(tpu_devices=1).tpus
    out = {"topology": pw.topology(), "blas": _pathways_blas(), "env": _env_threads(), "cases": {}}
    to_check = []
    for case in cases:
        x, y = _inputs(case)
        fn = (lambda a, b: a @ b) if _is_matmul(case) else _expr(case["expr"], pnp)
        f = pw.pmap(fn, devices=tpu)
        xa, ya = pw.device_put(x[None], tpu), pw.device_put(y[None], tpu)
        t0 = time.perf_counter()
        first = np.asarray(f(xa, ya))[0]  # trace + compile + one run
        first_s = time.perf_counter() - t0
        to_check.append((case, x, y, first))
        issue, wait = (lambda: f(xa, ya)), (lambda b: b.block_until_ready())
        # Every call in flight holds its output's device memory.
        max_calls = max(1, OUTPUTS_IN_FLIGHT_BYTES // first.nbytes)
        m = measure_batches(issue, wait, seconds=seconds, warmup=warmup, max_calls=max_calls)
        if case["key"] == TARGET_KEY:
            # The same call made synchronously: dispatch and wake-up not overlapped.
            m["sync"] = h.measure(issue, wait, seconds=seconds, warmup=warmup, window=0)
        # Device time: one more batch, recorded (one timeline event per gang).
        with pw.timeline() as tl:
            back_to_back(issue, wait, max(2, min(DEVICE_CALLS, m["calls"])))
        ev = sorted(tl.events(), key=lambda e: e["start_us"])
        dur = [e["end_us"] - e["start_us"] for e in ev]
        gaps = [ev[i + 1]["start_us"] - ev[i]["end_us"] for i in range(len(ev) - 1)]
        span = ev[-1]["end_us"] - ev[0]["start_us"]
        m["device_us"] = dur
        m["gap_us"] = {"median": statistics.median(gaps), "mean": statistics.mean(gaps)}
        m["device_busy"] = sum(dur) / span  # of the span from the first gang's start to the last's end
        m["first_call_s"] = first_s
        out["cases"][case["key"]] = m
        xa.delete()
        ya.delete()
    # Checks last: the reference calls numpy's BLAS, whose threads would
    # otherwise still be spinning while pathways is timed.
    for case, x, y, got in to_check:
        if _is_matmul(case):
            ref = x.astype(np.float64) @ y.astype(np.float64)
            err = float(np.max(np.abs(got - ref)) / max(1e-30, float(np.max(np.abs(ref)))))
            ok = err < (1e-5 if case["dtype"] == "float32" else 1e-12)
        else:
            ref = _expr(case["expr"], np)(x, y)
            err = float(np.max(np.abs(got - ref)))
            ok = bool(np.allclose(got, ref, rtol=1e-5, atol=1e-6)) and got.dtype == ref.dtype
        out["cases"][case["key"]]["check"] = {"ok": bool(ok), "max_err": err}
    return out


def np_worker(cases: list, seconds: float, warmup: float) -> dict:
    import numpy as np

    out = {"numpy": np.__version__, "blas": _numpy_blas(), "env": _env_threads(), "cases": {}}
    for case in cases:
        x, y = _inputs(case)
        fn = (lambda a, b: a @ b) if _is_matmul(case) else _expr(case["expr"], np)
        out["cases"][case["key"]] = measure_batches(lambda: fn(x, y), lambda _: None, seconds=seconds,
                                                    warmup=warmup, max_calls=10**6)
    return out


# --------------------------------------------------------------------------
# The run.


def sweep(args) -> dict:
    seconds, warmup, rounds = (0.3, 0.1, 1) if args.quick else (0.6, 0.15, ROUNDS)
    kw = {"cases": CASES, "seconds": seconds, "warmup": warmup}
    cpu0 = h.cpu_times()
    runs = []
    for r in range(rounds):
        h.log(f"[{NAME}] round {r + 1}/{rounds}: pathways")
        p = h.run_isolated("kernels:pw_worker", kw, env={"PATHWAYS_TOPOLOGY": TOPOLOGY}, timeout=180)
        h.log(f"[{NAME}] round {r + 1}/{rounds}: numpy")
        n = h.run_isolated("kernels:np_worker", kw, timeout=180)
        runs.append({"pathways": p, "numpy": n})
    return {"seconds": seconds, "warmup": warmup, "rounds": rounds, "runs": runs,
            "steal": h.steal_fraction(cpu0, h.cpu_times())}


def summarize(data: dict) -> dict:
    """Per case and system: the median batch of each round, then the best round.

    Other work on this 2-core machine only ever slows a round down (a BLAS
    call whose second thread loses its core can take 100x longer), so the
    best round is the estimate of the undisturbed speed, for both systems
    alike; the per-round ratios show how much the rounds disagreed.
    """
    out = {}
    for case in CASES:
        key, work = case["key"], work_per_call(case)
        pw_rates, np_rates, dev_us, busy, sync_rates = [], [], [], [], []
        round_ratios, checks, errors = [], [], []
        for run in data["runs"]:
            p, n = run["pathways"], run["numpy"]
            pc = p["result"]["cases"].get(key) if p["ok"] else None
            nc = n["result"]["cases"].get(key) if n["ok"] else None
            if not p["ok"]:
                errors.append("pathways: " + p["error"])
            if not n["ok"]:
                errors.append("numpy: " + n["error"])
            if pc:
                pw_rates.append(pc["per_s"])
                dev_us.append(statistics.median(pc["device_us"]))
                busy.append(pc["device_busy"])
                checks.append(pc["check"])
                if "sync" in pc:
                    sync_rates.append(pc["sync"]["per_s"])
            if nc:
                np_rates.append(nc["per_s"])
            if pc and nc:
                round_ratios.append(pc["per_s"] / nc["per_s"])
        s = {"case": case, "errors": errors, "round_ratios": round_ratios, "checks": checks}
        if pw_rates:
            s["pw_us"] = 1e6 / max(pw_rates)
            s["pw_thru"] = work / (s["pw_us"] * 1e-6)
        if busy:
            s["busy"] = statistics.median(busy)
        if sync_rates:
            s["sync_us"] = 1e6 / max(sync_rates)
            s["sync_thru"] = work / (s["sync_us"] * 1e-6)
        if dev_us:
            s["dev_us"] = min(dev_us)
            s["dev_thru"] = work / (s["dev_us"] * 1e-6)
        if np_rates:
            s["np_us"] = 1e6 / max(np_rates)
            s["np_thru"] = work / (s["np_us"] * 1e-6)
        if pw_rates and np_rates:
            s["ratio"] = s["pw_thru"] / s["np_thru"]
        if dev_us and np_rates:
            s["dev_ratio"] = s["dev_thru"] / s["np_thru"]
        out[key] = s
    return out


def _thru(x) -> str:
    if x is None:
        return "-"
    return f"{x / 1e9:.1f}" if x < 1e11 else f"{x / 1e9:.0f}"


def report(data: dict, summary: dict, info: dict, elapsed: float) -> str:
    lines = [h.machine_header(info), ""]
    lines.append(
        f"Kernels on one simulated device ({TOPOLOGY}) vs numpy, same shapes; "
        f"{data['rounds']} round(s) of (pathways process, numpy process), {data['seconds']:.2f} s "
        f"per row and system in 3 batches after {data['warmup']:.2f} s warm-up"
    )
    lines.append("")
    rows = []
    for case in CASES:
        s = summary[case["key"]]
        unit = "GFLOP/s" if _is_matmul(case) else "GB/s"
        rr = s["round_ratios"]
        rows.append([
            f"{case['op']} {'f32' if case['dtype'] == 'float32' else 'f64'}",
            shape_text(case),
            h.fmt_us(s.get("pw_us")),
            h.fmt_us(s.get("dev_us")),
            f"{100 * s['busy']:.0f}%" if "busy" in s else "-",
            h.fmt_us(s.get("np_us")),
            _thru(s.get("pw_thru")),
            _thru(s.get("dev_thru")),
            _thru(s.get("np_thru")),
            unit,
            f"{s['ratio']:.2f}" if "ratio" in s else "-",
            (f"{min(rr):.2f}-{max(rr):.2f}" if len(rr) > 1 else "-"),
            f"{s['dev_ratio']:.2f}" if "dev_ratio" in s else "-",
        ])
    lines.append(h.table(
        ["op", "shape", "pw/call", "pw device", "busy", "numpy/call", "pw", "pw device", "numpy",
         "unit", "ratio", "(rounds)", "ratio dev"],
        rows, align="llrrrrrrrlrrr"))
    lines.append("")
    t = summary[TARGET_KEY]
    if "ratio" in t:
        verdict = "PASS" if t["ratio"] >= TARGET_RATIO else "FAIL"
        lines.append(
            f"512x512 f32 matmul: {t['pw_thru'] / 1e9:.0f} GFLOP/s vs numpy {t['np_thru'] / 1e9:.0f} "
            f"GFLOP/s (ratio {t['ratio']:.2f}, target >= {TARGET_RATIO}): {verdict}"
            + (f"; per round: {', '.join(f'{r:.2f}' for r in t['round_ratios'])}"
               if len(t["round_ratios"]) > 1 else "")
        )
        if "sync_thru" in t:
            lines.append(
                f"  the same call made synchronously (wait for each output before the next call): "
                f"{h.fmt_us(t['sync_us'])}/call, {t['sync_thru'] / 1e9:.0f} GFLOP/s "
                f"(ratio {t['sync_thru'] / t['np_thru']:.2f})")
    else:
        lines.append("512x512 f32 matmul: not measured (" + "; ".join(t["errors"]) + "): FAIL")
    bad = [k for k, s in summary.items() if not s["checks"] or not all(c["ok"] for c in s["checks"])]
    lines.append("pathways results checked against numpy (matmul vs float64 reference, rel. err < 1e-5 "
                 "f32 / 1e-12 f64; elementwise allclose rtol 1e-5): "
                 + ("all ok" if not bad else f"WRONG or missing: {', '.join(bad)}"))
    errs = sorted({e for s in summary.values() for e in s["errors"]})
    for e in errs:
        lines.append(f"error: {e}")
    first = next((r for r in data["runs"] if r["pathways"]["ok"] and r["numpy"]["ok"]), None)
    if first:
        pb, nb = first["pathways"]["result"]["blas"], first["numpy"]["result"]["blas"]
        lines.append(f"pathways BLAS: {pb.get('config', pb.get('error'))}, core {pb.get('core')}, "
                     f"{pb.get('threads')} threads; executor threads "
                     f"{first['pathways']['result']['topology']['executor_threads']}")
        lines.append(f"numpy {first['numpy']['result']['numpy']} BLAS: "
                     f"{nb.get('config', nb.get('error'))}, core {nb.get('core')}, {nb.get('threads')} threads"
                     + (f"; env {first['numpy']['result']['env']}" if first["numpy"]["result"]["env"] else ""))
    loads = []
    for i, r in enumerate(data["runs"]):
        for sysname in ("pathways", "numpy"):
            la = r[sysname].get("load_at_start")
            if la:
                loads.append(f"{sysname} {i + 1}: {la[0]:.2f}")
    if loads:
        lines.append("1-min load average at each process start: " + ", ".join(loads))
    if data.get("steal") is not None:
        lines.append(f"CPU steal during the run: {100 * data['steal']:.1f}%")
    lines += [
        "",
        "Notes:",
        "- pw/call: wall time per call, k calls issued back to back and the last output waited for",
        "  (inputs already on the device; k sized to ~1/3 of the row's time, at most 256 MiB of",
        "  outputs in flight); it includes dispatch (~10-20 us per call, overlapped with earlier",
        "  kernels). pw device: median gang duration from pw.timeline() (the kernel only) over one",
        f"  more batch of up to {DEVICE_CALLS} calls; busy = summed gang time / span of that batch (the",
        "  rest is gaps between gangs). numpy/call: the same op on the same arrays, back to back.",
        "- throughput: matmul 2*m*n*k (*batch) FLOP per call; elementwise the minimum traffic, 12 bytes",
        "  per element (a, b read once, out written once), although numpy writes and rereads a",
        "  temporary per op. ratio = pathways per-call throughput / numpy; (rounds) = the same ratio",
        "  in each round; ratio dev = pathways device-time throughput / numpy.",
        "- each round runs pathways, then numpy, each in its own process (their BLAS thread pools never",
        "  compete). A cell is the median of 3 batches in the best round for that system: other work",
        "  on this 2-core VM only slows a round down (a BLAS call whose second thread loses its core",
        "  can take 100x longer). (rounds) = min-max of the per-round ratios; busy = median over",
        "  rounds. The JSON keeps every batch and every recorded gang duration.",
        "- elementwise: numpy ufuncs run on one thread; a pathways gang also runs on one executor",
        "  thread. tanh rows measure the transcendental more than memory.",
        "",
        f"total time {elapsed:.0f} s",
    ]
    return "\n".join(lines)


def _short_label(case: dict) -> str:
    dt = "f32" if case["dtype"] == "float32" else "f64"
    if _is_matmul(case):
        m = case["mnk"][0]
        return f"bmm {dt}\n{case['batch']}x{m}" if case.get("batch") else f"{dt}\n{m}"
    return f"{case['op']}\n{shape_text(case)}"


def plot(summary: dict, path: str) -> None:
    plt = h.pyplot()
    if plt is None:
        return
    groups = [("matmul (GFLOP/s)", [c for c in CASES if _is_matmul(c)]),
              ("fused elementwise (GB/s, minimum traffic)", [c for c in CASES if not _is_matmul(c)])]
    fig, axes = plt.subplots(1, 2, figsize=(12, 5), gridspec_kw={"width_ratios": [6, 4]})
    series = [("pw_thru", "pathways (per call)", "tab:blue"),
              ("dev_thru", "pathways (device time)", "lightsteelblue"),
              ("np_thru", "numpy", "tab:orange")]
    width = 0.27
    for ax, (title, cases) in zip(axes, groups):
        xs = list(range(len(cases)))
        for j, (field, label, color) in enumerate(series):
            ys = [(summary[c["key"]].get(field) or 0) / 1e9 for c in cases]
            ax.bar([x + (j - 1) * width for x in xs], ys, width, label=label, color=color)
        for x, c in zip(xs, cases):
            s = summary[c["key"]]
            if "ratio" in s:
                top = max((s.get(f) or 0) for f, _, _ in series) / 1e9
                ax.annotate(f"{s['ratio']:.2f}x", (x, top), ha="center", va="bottom", fontsize=8)
        ax.set_xticks(xs)
        ax.set_xticklabels([_short_label(c) for c in cases], fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.grid(True, axis="y", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("Kernels on one simulated device vs numpy (labels: pathways per-call / numpy)",
                 fontsize=11)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> None:
    args = h.parse_args(__doc__.splitlines()[0], argv)
    sw = h.Stopwatch()
    info = h.machine_info()
    data = sweep(args)
    summary = summarize(data)
    text = report(data, summary, info, sw.elapsed())
    print(text)
    data["machine"] = info
    data["summary"] = summary
    h.write_results(args.out_dir, NAME, text, data)
    plot(summary, os.path.join(args.out_dir, f"{NAME}.png"))


if __name__ == "__main__":
    main()
