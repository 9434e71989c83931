"""Figure 5: single-controller dispatch overhead (paper §5.1).

One computation = a scalar all-reduce (psum over the n devices) followed by a
scalar add; each computation's output feeds the next. Throughput is counted in
computations per second (each computation runs on all n devices at once).

  OpByOp  (-O): one call from Python per computation.
  Chained (-C): one call runs a chain of 128 computation nodes
                (pathways: `@pw.program` calling the step pmap 128 times).
  Fused   (-F): one call runs one node whose body is 128 computations
                (pathways/JAX: a pmap whose body unrolls psum+add 128 times).

Peers, at the device counts they can reach on this machine:
  JAX      jax.pmap + jax.lax.psum on XLA host-platform CPU devices
           (XLA_FLAGS=--xla_force_host_platform_device_count=n).
  Ray      n actors (processes). ray.util.collective has no CPU backend here
           (no pygloo/torch), so the all-reduce goes through the driver (-O),
           a Sum actor fed with futures (-C), a compiled graph (-CG), or an
           asyncio AllReducer actor the actors call in a loop (-F).
  Dask     distributed.LocalCluster(processes=False), n single-thread workers;
           per computation one task per worker plus one sum task.

Usage: python benchmarks/dispatch_overhead.py [--quick]
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _harness as h  # noqa: E402

NAME = "dispatch_overhead"
CHAIN = 128  # computations per Chained/Fused call (paper)
RAY_CG_CHAIN = 16  # computations per Ray compiled-graph execution (see notes)

PW_WINDOW_OPBYOP = 256  # outputs in flight for pathways OpByOp
PW_WINDOW_CALLS = 8  # calls in flight for Chained / Fused


# --------------------------------------------------------------------------
# Workers (run in a fresh process each, via _harness.run_isolated).


def pw_worker(n: int, seconds: float, warmup: float) -> dict:
    import numpy as np

    import pathways as pw

    tpus = pw.make_virtual_device_set().add_slice(tpu_devices=n).tpus
    step = pw.pmap(lambda x: pw.psum(x, "i") + 1.0, devices=tpus, axis_name="i")

    def fused_body(x):
        for _ in range(CHAIN):
            x = pw.psum(x, "i") + 1.0
        return x

    fused = pw.pmap(fused_body, devices=tpus, axis_name="i")

    @pw.program
    def chained(x):
        for _ in range(CHAIN):
            x = step(x)
        return x

    zero = pw.device_put(np.zeros(n, np.float32), tpus)
    # Correctness: psum(0)+1 = 1, psum(1)+1 = n+1; at n=1 a chain of 128 gives 128.
    check = float(np.asarray(step(step(zero)))[0]) == n + 1
    if n == 1:
        check = check and float(np.asarray(chained(zero))[0]) == CHAIN
        check = check and float(np.asarray(fused(zero))[0]) == CHAIN

    out = {"topology": pw.topology(), "check": check, "modes": {}}
    modes = {
        # name: (function, computations per call, outputs in flight)
        "OpByOp": (step, 1, PW_WINDOW_OPBYOP),
        "OpByOp-sync": (step, 1, 0),
        "Chained": (chained, CHAIN, PW_WINDOW_CALLS),
        "Fused": (fused, CHAIN, PW_WINDOW_CALLS),
    }
    for name, (fn, per_call, window) in modes.items():
        state = {"x": zero}

        def issue(fn=fn, state=state):
            state["x"] = fn(state["x"])
            return state["x"]

        wait = lambda b: b.block_until_ready()  # noqa: E731
        out["modes"][name] = h.measure(
            issue, wait, seconds=seconds, warmup=warmup, window=window, per_call=per_call
        )
    return out


def jax_worker(n: int, seconds: float, warmup: float) -> dict:
    import time

    import jax
    import jax.numpy as jnp
    import numpy as np

    assert jax.device_count() == n, (jax.device_count(), n)
    step = jax.pmap(lambda x: jax.lax.psum(x, "i") + 1.0, axis_name="i")

    def fused_body(x):
        for _ in range(CHAIN):
            x = jax.lax.psum(x, "i") + 1.0
        return x

    fused = jax.pmap(fused_body, axis_name="i")
    zero = jnp.zeros((n,), jnp.float32)
    t0 = time.perf_counter()
    check = float(np.asarray(step(step(zero)))[0]) == n + 1
    compile_step = time.perf_counter() - t0
    t0 = time.perf_counter()
    r = fused(zero).block_until_ready()
    compile_fused = time.perf_counter() - t0
    if n == 1:
        check = check and float(np.asarray(r)[0]) == CHAIN
    out = {"check": check, "compile_s": {"OpByOp": compile_step, "Fused": compile_fused}, "modes": {}}
    # window=0: every call waits for its output. With several calls in flight,
    # XLA:CPU pmap collectives deadlock on this 2-core host (rendezvous of the
    # n device threads never completes), so JAX runs synchronously here.
    for name, fn, per_call in (("OpByOp", step, 1), ("Fused", fused, CHAIN)):
        state = {"x": zero}

        def issue(fn=fn, state=state):
            state["x"] = fn(state["x"])
            return state["x"]

        wait = lambda b: b.block_until_ready()  # noqa: E731
        out["modes"][name] = h.measure(issue, wait, seconds=seconds, warmup=warmup, window=0, per_call=per_call)
    return out


def ray_worker(n: int, seconds: float, warmup: float, compiled_graph: bool = True) -> dict:
    import asyncio
    import time

    import ray

    t0 = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    try:

        @ray.remote(num_cpus=0)
        class Device:
            def __init__(self):
                self.x = 0.0

            def add(self, total):
                self.x = total + 1.0
                return self.x

            def fused(self, length, reducer):
                for _ in range(length):
                    self.x = ray.get(reducer.allreduce.remote(self.x)) + 1.0
                return self.x

        @ray.remote(num_cpus=0)
        class Sum:
            def sum(self, *xs):
                return sum(xs)

        @ray.remote(num_cpus=0)
        class AllReducer:
            """Sums one value from each of n callers; all n get the total."""

            def __init__(self, n):
                self.n, self.gen, self.acc, self.count = n, 0, 0.0, 0
                self.events, self.results, self.readers = {}, {}, {}

            async def allreduce(self, x):
                g = self.gen
                ev = self.events.setdefault(g, asyncio.Event())
                self.acc += x
                self.count += 1
                if self.count == self.n:
                    self.results[g] = self.acc
                    self.acc, self.count, self.gen = 0.0, 0, g + 1
                    ev.set()
                else:
                    await ev.wait()
                r = self.results[g]
                self.readers[g] = self.readers.get(g, 0) + 1
                if self.readers[g] == self.n:
                    del self.events[g], self.results[g], self.readers[g]
                return r

        actors = [Device.remote() for _ in range(n)]
        summer = Sum.remote()
        reducer = AllReducer.remote(n)
        ray.get([a.add.remote(0.0) for a in actors] + [summer.sum.remote(0.0)])
        startup = time.perf_counter() - t0
        out = {"startup_s": startup, "modes": {}}
        try:  # recorded for the report: why the all-reduce is not ray.util.collective
            import ray.util.collective as col

            out["collective"] = {"nccl": bool(col.nccl_available()), "gloo": bool(col.gloo_available())}
        except Exception as e:  # noqa: BLE001
            out["collective"] = {"error": f"{type(e).__name__}: {e}"[:200]}

        def run(name, issue, wait, per_call, window):
            out["modes"][name] = h.measure(
                issue, wait, seconds=seconds, warmup=warmup, window=window, per_call=per_call
            )

        # -O: one actor-method call per device per computation; the driver
        # gathers the n values and sums them (the all-reduce) before the next.
        st = {"total": 0.0}

        def issue_o():
            st["total"] = sum(ray.get([a.add.remote(st["total"]) for a in actors]))
            return None

        run("OpByOp", issue_o, lambda _: None, 1, 0)

        # -C: 128 computations submitted as futures, one ray.get per chain.
        def issue_c():
            total = 0.0
            for _ in range(CHAIN):
                total = summer.sum.remote(*[a.add.remote(total) for a in actors])
            return total

        run("Chained", issue_c, ray.get, CHAIN, 1)

        # -F: one method call per actor runs 128 all-reduces (through the
        # AllReducer actor) and adds.
        def issue_f():
            return [a.fused.remote(CHAIN, reducer) for a in actors]

        run("Fused", issue_f, ray.get, CHAIN, 0)

        # -CG: Ray Compiled Graph of a RAY_CG_CHAIN-computation chain.
        if compiled_graph:
            try:
                from ray.dag import InputNode

                t1 = time.perf_counter()
                with InputNode() as inp:
                    node = inp
                    for _ in range(RAY_CG_CHAIN):
                        node = summer.sum.bind(*[a.add.bind(node) for a in actors])
                cdag = node.experimental_compile()
                out["cg_compile_s"] = time.perf_counter() - t1
                try:
                    run("CompiledGraph", lambda: cdag.execute(0.0), ray.get, RAY_CG_CHAIN, 0)
                finally:
                    cdag.teardown()
            except Exception as e:  # noqa: BLE001
                out["cg_error"] = f"{type(e).__name__}: {e}"[:300]
        return out
    finally:
        ray.shutdown()


def dask_worker(n: int, seconds: float, warmup: float) -> dict:
    import time

    from dask.distributed import Client, LocalCluster

    t0 = time.perf_counter()
    cluster = LocalCluster(
        n_workers=n, threads_per_worker=1, processes=False, dashboard_address=None
    )
    client = Client(cluster)
    try:
        workers = sorted(client.scheduler_info()["workers"])
        assert len(workers) == n
        out = {"startup_s": time.perf_counter() - t0, "modes": {}}

        def add(total):
            return total + 1.0

        def total_of(*xs):
            return sum(xs)

        def run(name, issue, wait, per_call, window):
            out["modes"][name] = h.measure(
                issue, wait, seconds=seconds, warmup=warmup, window=window, per_call=per_call
            )

        st = {"total": 0.0}

        def issue_o():
            futs = [client.submit(add, st["total"], workers=[w], pure=False) for w in workers]
            st["total"] = sum(client.gather(futs))

        run("OpByOp", issue_o, lambda _: None, 1, 0)

        def issue_c():
            total = 0.0
            for _ in range(CHAIN):
                futs = [client.submit(add, total, workers=[w], pure=False) for w in workers]
                total = client.submit(total_of, *futs, pure=False)
            return total

        run("Chained", issue_c, lambda f: f.result(), CHAIN, 1)
        return out
    finally:
        client.close()
        cluster.close()


# --------------------------------------------------------------------------
# The sweep.


def sweep(args) -> dict:
    quick = args.quick
    seconds, warmup = (0.4, 0.15) if quick else (1.0, 0.3)
    pw_counts = [1, 8, 64, 512, 2048] if quick else [2**k for k in range(12)]
    # Peer caps (device counts beyond them are "skipped" with the reason):
    caps = {
        "JAX": (16 if quick else 128, "one XLA:CPU thread per device must meet in every psum; "
                "64+ host devices on 2 cores already run at <300 computations/s"),
        "Ray": (4 if quick else 16, "one actor process per device on a 2-core host"),
        "Dask": (4 if quick else 16, "n+1 tasks per computation on one scheduler; 2 cores"),
    }
    budget_s = 40.0  # a peer configuration slower than this ends that peer's sweep

    results: dict = {"pathways": {}, "JAX": {}, "Ray": {}, "Dask": {}}

    for n in pw_counts:
        h.log(f"[{NAME}] pathways n={n}")
        results["pathways"][n] = h.run_isolated(
            "dispatch_overhead:pw_worker",
            {"n": n, "seconds": seconds, "warmup": warmup},
            env={"PATHWAYS_TOPOLOGY": h.topology_for(n)},
            timeout=180,
        )

    peers = {
        "JAX": ("jax", "dispatch_overhead:jax_worker", 120),
        "Ray": ("ray", "dispatch_overhead:ray_worker", 150),
        "Dask": ("dask.distributed", "dispatch_overhead:dask_worker", 120),
    }
    for peer, (module, target, timeout) in peers.items():
        cap, cap_reason = caps[peer]
        stop_reason = None
        for n in pw_counts:
            if not h.has_module(module):
                results[peer][n] = {"ok": False, "missing": True, "error": h.MISSING}
                continue
            if n > cap:
                results[peer][n] = {"ok": False, "skipped": True, "error": f"skipped (> {cap}: {cap_reason})"}
                continue
            if stop_reason:
                results[peer][n] = {"ok": False, "skipped": True, "error": stop_reason}
                continue
            h.log(f"[{NAME}] {peer} n={n}")
            env = {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": f"--xla_force_host_platform_device_count={n}"}
            r = h.run_isolated(target, {"n": n, "seconds": seconds, "warmup": warmup}, env=env, timeout=timeout)
            results[peer][n] = r
            if not r["ok"]:
                stop_reason = f"skipped (n={n} failed: {r['error'][:80]})"
            elif r["wall_s"] > budget_s:
                stop_reason = f"skipped (n={n} took {r['wall_s']:.0f} s > {budget_s:.0f} s budget)"
    return {"counts": pw_counts, "results": results, "seconds": seconds, "warmup": warmup}


ROWS = [
    # (label, system, mode)
    ("PW-O", "pathways", "OpByOp"),
    ("PW-O sync", "pathways", "OpByOp-sync"),
    ("PW-C", "pathways", "Chained"),
    ("PW-F", "pathways", "Fused"),
    ("JAX-O sync", "JAX", "OpByOp"),
    ("JAX-F sync", "JAX", "Fused"),
    ("Ray-O", "Ray", "OpByOp"),
    ("Ray-C", "Ray", "Chained"),
    ("Ray-CG", "Ray", "CompiledGraph"),
    ("Ray-F", "Ray", "Fused"),
    ("Dask-O", "Dask", "OpByOp"),
    ("Dask-C", "Dask", "Chained"),
]


def cell(res: dict, mode: str) -> tuple:
    """(text, value or None) for one table cell."""
    if res is None:
        return "-", None
    if not res["ok"]:
        return res["error"], None
    m = res["result"]["modes"].get(mode)
    if m is None:
        err = res["result"].get("cg_error")
        return ("error: " + err) if err else "-", None
    return h.fmt_rate(m["per_s"]), m["per_s"]


def report(data: dict, info: dict, elapsed: float) -> str:
    counts = data["counts"]
    res = data["results"]
    lines = [h.machine_header(info), ""]
    lines.append(
        f"Figure 5: computations/s (one computation = scalar psum + scalar add over n devices); "
        f"{data['seconds']:.1f} s per measurement after {data['warmup']:.2f} s warm-up"
    )
    lines.append("")
    rows = []
    notes = {}  # long reasons, printed once below the table
    for label, system, mode in ROWS:
        row = [label]
        for n in counts:
            text, _ = cell(res[system].get(n), mode)
            if len(text) > 12:
                key = text
                if key not in notes:
                    notes[key] = f"[{len(notes) + 1}]"
                text = notes[key]
            row.append(text)
        rows.append(row)
    lines.append(h.table(["devices"] + [str(n) for n in counts], rows))
    if notes:
        lines.append("")
        for text, ref in notes.items():
            lines.append(f"{ref} {text}")
    # Checks, topologies and startup costs.
    lines.append("")
    bad = [n for n in counts if res["pathways"][n]["ok"] and not res["pathways"][n]["result"]["check"]]
    lines.append("pathways results checked (psum(psum(0)+1)+1 == n+1; n=1: 128-chain == 128): "
                 + ("all ok" if not bad else f"WRONG at n={bad}"))
    topo = {n: res["pathways"][n]["result"]["topology"] for n in counts if res["pathways"][n]["ok"]}
    if topo:
        t = topo[max(topo)]
        lines.append(f"pathways topology: 1 island, hosts of min(n,4) devices (n={max(topo)}: "
                     f"{t['hosts_per_island']} hosts x {t['devices_per_host']}), executor_threads={t['executor_threads']}")
    jax_c = {n: r["result"]["compile_s"]["Fused"] for n, r in res["JAX"].items() if r.get("ok")}
    if jax_c:
        lines.append("JAX Fused compile time (s): " + ", ".join(f"n={n}: {v:.2f}" for n, v in jax_c.items()))
    ray_s = {n: r["result"]["startup_s"] for n, r in res["Ray"].items() if r.get("ok")}
    if ray_s:
        lines.append("Ray init + actor startup (s): " + ", ".join(f"n={n}: {v:.1f}" for n, v in ray_s.items()))
        colls = {json.dumps(r["result"].get("collective"), sort_keys=True) for r in res["Ray"].values() if r.get("ok")}
        lines.append("ray.util.collective backends available (checked in each Ray run): " + "; ".join(sorted(colls)))
        cg = {n: r["result"].get("cg_compile_s") for n, r in res["Ray"].items() if r.get("ok")}
        lines.append("Ray compiled-graph compile (s): " + ", ".join(
            f"n={n}: {v:.1f}" for n, v in cg.items() if v is not None))
    lines += [
        "",
        "Notes:",
        f"- PW-O keeps up to {PW_WINDOW_OPBYOP} outputs in flight (asynchronous dispatch, as in the paper);",
        "  PW-O sync waits for each output before the next call (the same discipline as JAX here).",
        f"- PW-C: @pw.program calling the step pmap {CHAIN} times (one call = {CHAIN} nodes); PW-F: one pmap",
        f"  whose body unrolls {CHAIN} psum+add. Up to {PW_WINDOW_CALLS} calls in flight.",
        "- JAX runs synchronously (block_until_ready after every call): with two or more pmap calls in",
        "  flight, XLA:CPU's psum rendezvous deadlocked on this 2-core host (XLA aborts after 40 s).",
        "  JAX has no analog of Chained. Devices are CPU threads, not accelerators.",
        "- Ray: ray.util.collective has no usable backend here (NCCL needs a GPU; its GLOO backend is",
        "  torch.distributed, and torch is not installed), so the all-reduce is done with Ray",
        "  primitives: -O sums the n actors' outputs in the driver;",
        f"  -C submits {CHAIN} computations as futures (n actor calls + 1 Sum-actor call each) and",
        "  waits once; -F is one call per actor that runs 128 all-reduces through an asyncio",
        f"  AllReducer actor; -CG is a Ray Compiled Graph of a {RAY_CG_CHAIN}-computation chain (a",
        "  128-chain took ~21 s to compile at n=4 here and ran slower).",
        "- Dask: LocalCluster(processes=False), n one-thread workers; per computation n pinned add",
        f"  tasks + 1 sum task; -O gathers every computation, -C submits a {CHAIN}-computation chain.",
        "  Dask has no collective inside a task, so there is no Dask-F.",
        "- Ray and Dask move Python floats, pathways and JAX float32 device arrays; everything",
        "  shares 2 cores, so peers with one process or thread per device pay for it.",
        "",
        f"total time {elapsed:.0f} s",
    ]
    return "\n".join(lines)


def plot(data: dict, path: str) -> None:
    counts = data["counts"]
    series = {}
    for label, system, mode in ROWS:
        ys = [cell(data["results"][system].get(n), mode)[1] for n in counts]
        if any(y is not None for y in ys):
            series[label] = (counts, ys)
    styles = {}
    for label in series:
        base = label.split("-")[0]
        color = {"PW": "tab:blue", "JAX": "tab:orange", "Ray": "tab:green", "Dask": "tab:red"}[base]
        suffix = label.split("-", 1)[1]
        marker = {"O": "o", "O sync": "x", "C": "s", "CG": "D", "F": "^", "F sync": "^"}.get(suffix, "o")
        ls = "--" if "sync" in label else "-"
        styles[label] = {"color": color, "marker": marker, "linestyle": ls}
    h.plot_lines(
        path,
        series,
        title="Figure 5: dispatch overhead (scalar psum + add), simulated devices on 2 CPU cores",
        xlabel="devices",
        ylabel="computations / s",
        styles=styles,
        xticks=counts,
    )


def main(argv=None) -> None:
    args = h.parse_args(__doc__.splitlines()[0], argv)
    sw = h.Stopwatch()
    info = h.machine_info()
    data = sweep(args)
    text = report(data, info, sw.elapsed())
    print(text)
    data["machine"] = info
    h.write_results(args.out_dir, NAME, text, data)
    plot(data, os.path.join(args.out_dir, f"{NAME}.png"))


if __name__ == "__main__":
    main()
