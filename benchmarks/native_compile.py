"""Native compile: LLVM ORC JIT vs the system compiler with a disk cache, for fused kernels (issue 26).

Issue 26 compiles fused elementwise/reduction loops to native code at run
time. This measures the two ways to do that on two representative generated
kernels (benchmarks/native_compile/*.cc, C++ of the kind a fusion code
generator emits: rows walked in chunks of 256 floats, plain loops the
compiler vectorizes, an inline polynomial exp; each is handed over as one
self-contained string, its `#include "prelude.h"` replaced by the helpers):

  softmax         softmax over rows (max pass, exp and sum pass, scale pass)
  layernorm_gelu  y = h + gelu(layer_norm(h) * gamma + beta), h = x + r
                  (some 25 fused ops in three passes)
  empty           an empty kernel: the floor of each path (compiled, not run)

Paths, each from "have the source" to "have a function pointer":

  g++ / clang++-14  the source string written to a new directory, then
                    `<cxx> -O3 -march=native -shared -fPIC -o kernel.so
                    kernel.cc` (posix_spawn), dlopen, dlsym (as PyTorch
                    Inductor's CPU backend). The compilers are called by
                    their real paths, never through ccache (which is on
                    PATH here), and with CCACHE_DISABLE=1.
  disk-cache hit    the same, warm: hash the source, stat the cached .so,
                    dlopen, dlsym (the file in the page cache, not yet
                    mapped by the process).
  ORC               LLVM 14's LLJIT in process (as XLA's CPU backend and
                    numba): parse LLVM IR text, the new pass manager's O3
                    pipeline for the host CPU, add to the JIT, look the symbol
                    up (code generation and linking). Its input is the same
                    source lowered, before anything is timed, by `clang++-14
                    -O0 -Xclang -disable-O0-optnone -S -emit-llvm
                    -march=native`: unoptimized IR, standing in for an IR
                    emitter whose own cost is negligible. Loading libLLVM
                    (dlopen of the ORC driver) and creating the LLJIT are
                    one-time costs per process, reported apart.

The measuring program (benchmarks/native_compile/bench.cc, built here with
g++; the ORC driver orc_jit.cc with clang++-14 and `llvm-config-14 --cxxflags
--ldflags --libs`) runs in a few fresh processes, one after another. In each,
every kernel is compiled by every path in interleaved rounds; the first
round (the first compile in the process) is reported apart, the others give
the median and min. Then the kernels of the last round are checked against a
double-precision reference (1024 x 1024 and 7 x 1000, a shape with a row
tail), compared with each other bit for bit, and timed (GB/s = bytes read
once + bytes written once, per call).

Nothing is installed: without llvm-config-14 the ORC rows read
"ORC row missing: apt-get install llvm-14-dev" and the rest still runs.

Before each process the script waits (at most 1 min, `--no-wait` to skip)
for the 1-minute load average to drop below 1, as run_all.py does.

Usage: python benchmarks/native_compile.py [--quick] [--reps N] [--processes N] [--no-wait]
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from typing import Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _harness as h  # noqa: E402

NAME = "native_compile"
SRC_DIR = os.path.join(h.BENCH_DIR, "native_compile")
KERNELS = ["softmax", "layernorm_gelu", "empty"]
RUN_KERNELS = ["softmax", "layernorm_gelu"]  # "empty" is compiled only
PRELUDE = "prelude.h"  # the helpers every kernel's source starts with
COMPILERS = ["g++", "clang++-14"]  # the system-compiler paths, in this order
LLVM_CONFIG = "llvm-config-14"
IR_COMPILER = "clang++-14"
IR_FLAGS = ["-O0", "-Xclang", "-disable-O0-optnone", "-S", "-emit-llvm", "-march=native"]
ORC_MISSING = "ORC row missing: apt-get install llvm-14-dev"
CHECK_TOLERANCE = 1e-4  # max relative error vs the float64 reference
CACHES = {"ccache", "sccache", "distcc", "icecc"}


# --------------------------------------------------------------------------
# Tools.


def real_tool(name: str) -> Optional[str]:
    """`name` on PATH, skipping compiler caches (here /usr/local/bin/g++ is a
    ccache symlink, which would turn a cold compile into a cache hit)."""
    for d in os.environ.get("PATH", "").split(os.pathsep):
        p = os.path.join(d, name)
        if os.path.isfile(p) and os.access(p, os.X_OK):
            if os.path.basename(os.path.realpath(p)) not in CACHES:
                return p
    return None


def first_line(cmd: list) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout
        return out.strip().splitlines()[0] if out.strip() else "?"
    except (OSError, subprocess.SubprocessError):
        return "?"


def run_tool(cmd: list, what: str) -> Optional[str]:
    """Runs a build step; returns None, or why it failed."""
    h.log(f"[{NAME}] {what}")
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                           env=dict(os.environ, CCACHE_DISABLE="1"))
    except (OSError, subprocess.SubprocessError) as e:
        return f"{what}: {e}"
    if p.returncode != 0:
        tail = " | ".join(l for l in (p.stderr or p.stdout).strip().splitlines()[-3:])
        return f"{what} failed (exit code {p.returncode}): {tail[-400:]}"
    return None


def build(tmp: str) -> dict:
    """Finds the tools, builds bench (and the ORC driver, and the kernels' IR,
    when LLVM 14 is there). Returns what was found and built, and why not."""
    b = {"compilers": {}, "notes": [], "orc_missing": None, "sources": write_sources(tmp)}
    for name in COMPILERS:
        path = real_tool(name)
        if path:
            b["compilers"][name] = {"path": path, "version": first_line([path, "--version"])}
        else:
            b["notes"].append(f"{name} row missing: not on PATH (apt-get install "
                              f"{'g++' if name == 'g++' else 'clang-14'})")
    host_cxx = next((c["path"] for c in b["compilers"].values()), None)
    if host_cxx is None:
        b["error"] = "no C++ compiler (g++ or clang++-14) to build the benchmark with"
        return b
    b["bench"] = os.path.join(tmp, "bench")
    err = run_tool([host_cxx, "-O2", "-std=c++17", "-o", b["bench"],
                    os.path.join(SRC_DIR, "bench.cc"), "-ldl"], "building bench.cc")
    if err:
        b["error"] = err
        return b

    llvm_config = real_tool(LLVM_CONFIG)
    clang = b["compilers"].get(IR_COMPILER, {}).get("path")
    if llvm_config is None:
        b["orc_missing"] = ORC_MISSING
    elif clang is None:
        b["orc_missing"] = f"ORC row missing: apt-get install clang-14 (the kernels' IR comes from {IR_COMPILER})"
    else:
        flags = subprocess.run([llvm_config, "--cxxflags", "--ldflags", "--libs"], capture_output=True,
                               text=True).stdout.split()
        libdir = subprocess.run([llvm_config, "--libdir"], capture_output=True, text=True).stdout.strip()
        b["llvm"] = {"version": subprocess.run([llvm_config, "--version"], capture_output=True,
                                               text=True).stdout.strip(),
                     "libllvm_bytes": _libllvm_size(libdir)}
        b["orc_plugin"] = os.path.join(tmp, "orc_jit.so")
        err = run_tool([clang, "-O2", "-shared", "-fPIC", "-o", b["orc_plugin"],
                        os.path.join(SRC_DIR, "orc_jit.cc")] + flags, "building orc_jit.cc (LLVM ORC driver)")
        for k in KERNELS:
            if err:
                break
            err = run_tool([clang] + IR_FLAGS + [b["sources"][k], "-o", os.path.join(tmp, f"{k}.ll")],
                           f"emitting {k}.ll")
        if err:
            b["orc_missing"] = f"ORC row missing: {err}"
            b.pop("orc_plugin")
    return b


def write_sources(tmp: str) -> dict:
    """Each kernel's source as a code generator hands it over, one
    self-contained string: its .cc with `#include "prelude.h"` replaced by the
    prelude. Written to tmp/src/; returns {kernel: path}."""
    with open(os.path.join(SRC_DIR, PRELUDE)) as f:
        prelude = f.read()
    include = f'#include "{PRELUDE}"\n'
    os.makedirs(os.path.join(tmp, "src"), exist_ok=True)
    paths = {}
    for k in KERNELS:
        with open(os.path.join(SRC_DIR, f"{k}.cc")) as f:
            text = f.read()
        if include not in text:
            raise ValueError(f"{k}.cc does not include {PRELUDE}")
        paths[k] = os.path.join(tmp, "src", f"{k}.cc")
        with open(paths[k], "w") as f:
            f.write(text.replace(include, prelude, 1))
    return paths


def _libllvm_size(libdir: str) -> Optional[int]:
    for name in sorted(os.listdir(libdir)) if os.path.isdir(libdir) else []:
        if name.startswith("libLLVM") and ".so" in name:
            return os.path.getsize(os.path.realpath(os.path.join(libdir, name)))
    return None


# --------------------------------------------------------------------------
# The run: `processes` fresh processes of bench, one after another.


def sweep(args, b: dict, tmp: str) -> dict:
    reps, processes = (3, 1) if args.quick else (args.reps, args.processes)
    cmd = [b["bench"], "--work", tmp, "--reps", str(reps)]
    if args.quick:
        cmd += ["--batches", "3", "--batch-ms", "20"]
    for name, c in b["compilers"].items():
        cmd += ["--cxx", f"{name}={c['path']}"]
    if b.get("orc_plugin"):
        cmd += ["--orc", b["orc_plugin"]]
    for k in KERNELS:
        ir = os.path.join(tmp, f"{k}.ll")
        cmd += ["--kernel", f"{k}={b['sources'][k]}" + (f",{ir}" if b.get("orc_plugin") else "")]
    cpu0 = h.cpu_times()
    runs = []
    for i in range(processes):
        waited = 0.0
        if not args.no_wait:  # other work on a 2-core machine changes every number
            waited, _ = h.wait_until_quiet(max_wait=60)
        h.log(f"[{NAME}] process {i + 1}/{processes}: {reps} + 1 rounds")
        out = os.path.join(tmp, f"result_{i}.json")
        load = h.loadavg()
        try:
            p = subprocess.run(cmd + ["--out", out], capture_output=True, text=True, timeout=900,
                               env=dict(os.environ, CCACHE_DISABLE="1"))
            if p.returncode != 0:
                raise RuntimeError(f"exit code {p.returncode}: {p.stderr.strip()[-400:]}")
            with open(out) as f:
                runs.append({"ok": True, "result": json.load(f), "load_at_start": load, "waited_s": waited})
        except (OSError, RuntimeError, ValueError, subprocess.SubprocessError) as e:
            runs.append({"ok": False, "error": str(e), "load_at_start": load, "waited_s": waited})
    return {"reps": reps, "processes": processes, "runs": runs, "steal": h.steal_fraction(cpu0, h.cpu_times())}


# --------------------------------------------------------------------------
# Summary.


def _stats(xs: list) -> Optional[dict]:
    xs = [x for x in xs if x is not None]
    if not xs:
        return None
    return {"median": statistics.median(xs), "min": min(xs), "n": len(xs)}


def summarize(data: dict, b: dict) -> dict:
    results = [r["result"] for r in data["runs"] if r["ok"]]
    paths = list(b["compilers"]) + (["orc"] if b.get("orc_plugin") else [])
    s = {"paths": paths, "kernels": {}, "errors": [r["error"] for r in data["runs"] if not r["ok"]]}
    orc = [r["orc"] for r in results if "orc" in r]
    s["orc_setup"] = {
        "load_ms": _stats([o["load_ms"] for o in orc if not o["error"]]),
        "create_ms": _stats([o["create_ms"] for o in orc if not o["error"]]),
        "info": next((o["info"] for o in orc if o["info"]), ""),
        "errors": sorted({o["error"] for o in orc if o["error"]}),
    }
    for k in KERNELS:
        per = [next(x for x in r["kernels"] if x["name"] == k) for r in results]
        if not per:
            continue
        ks = {"source_lines": per[0]["source_lines"], "source_bytes": per[0]["source_bytes"],
              "ir_lines": per[0]["ir_lines"], "ir_bytes": per[0]["ir_bytes"], "paths": {}}
        for p in paths:
            rounds = [x["compile"].get(p, []) for x in per]
            steady = [c for rr in rounds for c in rr[1:]]
            first = [rr[0] for rr in rounds if rr]
            errors = sorted({c["error"] for rr in rounds for c in rr if "error" in c})
            ps = {"total_ms": _stats([c.get("total_ms") for c in steady]),
                  "first_ms": _stats([c.get("total_ms") for c in first]), "errors": errors,
                  "phases_ms": {}}
            for phase in sorted({key for c in steady for key in c if key.endswith("_ms") and key != "total_ms"}):
                ps["phases_ms"][phase[:-3]] = _stats([c.get(phase) for c in steady])
            if k in RUN_KERNELS:
                calls = [u for x in per for u in x["run"]["per_call_us"].get(p, [])]
                ps["per_call_us"] = _stats(calls)
                if ps["per_call_us"]:
                    ps["gb_s"] = per[0]["run"]["bytes_per_call"] / (ps["per_call_us"]["median"] * 1e3)
                errs = [x["run"][key].get(p) for x in per for key in x["run"] if key.startswith("rel_error_")]
                errs = [e for e in errs if e is not None]
                ps["max_rel_error"] = max(errs) if errs else None
                agree = [x["run"]["agreement"][p] for x in per if p in x["run"].get("agreement", {})]
                if agree:
                    ps["identical_fraction"] = min(a["identical_fraction"] for a in agree)
                    ps["max_rel_diff"] = max(a["max_rel_diff"] for a in agree)
                    ps["agreement_base"] = per[0]["run"]["agreement_base"]
            if p != "orc" and "orc" in paths:
                # Paired with ORC's compile of the same kernel in the same round:
                # other work on the machine slows both alike.
                diffs = [c["total_ms"] - o["total_ms"] for x in per
                         for c, o in zip(x["compile"].get(p, [])[1:], x["compile"].get("orc", [])[1:])
                         if "total_ms" in c and "total_ms" in o]
                ps["minus_orc_ms"] = _stats(diffs)
                if diffs:
                    ps["minus_orc_ms"]["orc_faster_rounds"] = sum(d > 0 for d in diffs)
            ks["paths"][p] = ps
        hits = [c for x in per for c in x.get("cache_hit", [])]
        ks["cache_hit"] = {"total_ms": _stats([c.get("total_ms") for c in hits]),
                           "compiler": per[0].get("cache_hit_compiler"),
                           "errors": sorted({c["error"] for c in hits if "error" in c})}
        s["kernels"][k] = ks
    return s


def _median(st: Optional[dict]) -> Optional[float]:
    return st["median"] if st else None


def _compile_ms(s: dict, kernel: str, path: str) -> Optional[float]:
    return _median(s["kernels"].get(kernel, {}).get("paths", {}).get(path, {}).get("total_ms"))


def conclusion(s: dict, b: dict) -> str:
    """One paragraph, every number from this run."""
    compilers = [p for p in s["paths"] if p != "orc"]
    if "orc" not in s["paths"]:
        return "Conclusion: none without the ORC rows (" + (b.get("orc_missing") or "ORC failed") + ")."
    kernels = [k for k in RUN_KERNELS if _compile_ms(s, k, "orc")
               and any(s["kernels"][k]["paths"][p].get("minus_orc_ms") for p in compilers)]
    if not kernels:
        return "Conclusion: none, no kernel has both an ORC and a compiler row (see the errors above)."
    stat = lambda k, p: s["kernels"][k]["paths"][p]["total_ms"]  # noqa: E731
    full = ["orc"] + [p for p in compilers if all(stat(k, p) for k in kernels)]
    per_kernel = lambda p, key: " / ".join(f"{stat(k, p)[key]:.0f}" for k in kernels)  # noqa: E731
    name = lambda p: "ORC" if p == "orc" else p  # noqa: E731
    out = [f"Conclusion: cold, from source to a callable kernel ({' / '.join(kernels)}), "
           + ", ".join(f"{name(p)} {per_kernel(p, 'median')}" for p in full)
           + " ms (medians; minimums " + ", ".join(f"{name(p)} {per_kernel(p, 'min')}" for p in full) + ")."]

    # The faster compiler per kernel, paired with ORC round by round (other
    # work on the machine slows both alike).
    best = {k: min((p for p in compilers if stat(k, p)), key=lambda p: stat(k, p)["median"]) for k in kernels}
    paired = {k: s["kernels"][k]["paths"][best[k]]["minus_orc_ms"] for k in kernels}
    share = {k: paired[k]["median"] / stat(k, best[k])["median"] for k in kernels}
    out.append("Round by round against the faster compiler, ORC is " + " and ".join(
        f"{abs(paired[k]['median']):.0f} ms ({100 * abs(share[k]):.0f}%) "
        f"{'faster' if paired[k]['median'] > 0 else 'slower'} than {best[k]} on {k} "
        f"(faster in {paired[k]['orc_faster_rounds']} of {paired[k]['n']} rounds)" for k in kernels) + ".")

    floors = {p: _compile_ms(s, "empty", p) for p in s["paths"]}
    if all(floors.get(p) for p in s["paths"]):
        work = {p: statistics.mean(_compile_ms(s, k, p) - floors[p] for k in kernels) for p in s["paths"]}
        fastest_work = min(compilers, key=work.get)
        out.append(
            "An empty kernel costs " + ", ".join(f"{p} {floors[p]:.0f} ms" for p in compilers)
            + f" (starting the toolchain) but ORC {floors['orc']:.1f} ms; above that floor, optimizing and "
            f"generating code take ORC {work['orc']:.0f} ms, " + ", ".join(f"{p} {work[p]:.0f} ms" for p in compilers)
            + (f", so ORC's edge is skipping the process and file round trip, not compiling faster than "
               f"{fastest_work}, and it shrinks when many kernels share one compiler run."
               if work["orc"] >= work[fastest_work] else ", so ORC compiles faster as well."))

    setup = s["orc_setup"]
    load, create = _median(setup["load_ms"]) or 0.0, _median(setup["create_ms"]) or 0.0
    saving = statistics.mean(paired[k]["median"] for k in kernels)
    if saving > 0:
        n = max(1, -int(-(load + create) // saving))
        out.append(f"ORC's once-per-process cost (loading libLLVM {load:.0f} ms, creating the LLJIT {create:.1f} ms) "
                   "is repaid " + ("by the first kernel." if n == 1 else f"after {n} kernels."))
    else:
        out.append(f"ORC also costs {load + create:.0f} ms once per process (loading libLLVM, creating the LLJIT).")

    speed = {}  # path -> [its GB/s / the fastest path's, per kernel]
    for k in kernels:
        rates = {p: s["kernels"][k]["paths"][p].get("gb_s") for p in s["paths"]}
        rates = {p: r for p, r in rates.items() if r}
        for p, r in rates.items():
            speed.setdefault(p, []).append(r / max(rates.values()))
    if "orc" in speed:
        rng = lambda v: f"{min(v):.2f}" if len(set(round(x, 2) for x in v)) == 1 else f"{min(v):.2f}-{max(v):.2f}"  # noqa: E731
        out.append("The kernels run at " + ", ".join(f"{name(p)} {rng(v)}x" for p, v in speed.items())
                   + " the fastest path's GB/s" + (", so ORC's code is as fast as the best compiler's."
                                                   if min(speed["orc"]) >= 0.95 else "."))

    hits = [_median(s["kernels"][k]["cache_hit"]["total_ms"]) for k in kernels]
    hits = [x for x in hits if x]
    if hits:
        fastest = min(stat(k, p)["median"] for k in kernels for p in full)
        out.append(f"A warm disk-cache hit takes {max(hits):.2f} ms, {fastest / max(hits):.0f}x less than the "
                   "fastest cold compile, so compiled kernels belong in a disk cache whichever path compiles "
                   "them (ORC through an ObjectCache of object files).")

    mean_share = statistics.mean(share.values())
    libllvm = b.get("llvm", {}).get("libllvm_bytes")
    out.append(
        (f"On these numbers ORC wins the cold compile by {saving:.0f} ms ({100 * mean_share:.0f}%) per kernel"
         if saving > 0 else
         f"On these numbers the system compiler wins the cold compile by {-saving:.0f} ms per kernel")
        + ("; with a margin that small, what decides is" if abs(mean_share) < 0.3 else "; also to weigh:")
        + " libLLVM as a dependency of the runtime" + (f" ({libllvm / 2**20:.0f} MiB)" if libllvm else "")
        + " against a C++ compiler on every machine that runs it.")
    spread = [stat(k, p)["median"] / stat(k, p)["min"] for k in kernels for p in full]
    if max(spread) > 1.2:
        out.append(f"(The machine was not quiet: medians are up to {100 * (max(spread) - 1):.0f}% above the "
                   "minimums.)")
    return " ".join(out)


# --------------------------------------------------------------------------
# Report.

LABELS = {"orc": "ORC (LLVM {llvm}, O3)", "g++": "{name} -O3 (.so)", "clang++-14": "{name} -O3 (.so)"}


def _label(path: str, b: dict) -> str:
    return LABELS.get(path, "{name}").format(name=path, llvm=b.get("llvm", {}).get("version", "?"))


def _ms(x: Optional[float]) -> str:
    if x is None:
        return "-"
    return f"{x:.2f}" if x < 10 else f"{x:.1f}" if x < 100 else f"{x:.0f}"


PHASES = {"write": "write", "compiler": "compiler", "load": "dlopen", "parse": "parse", "optimize": "O3",
          "codegen": "codegen+link"}  # bench.cc's phase names, in order, and how the table names them


def _phases(ps: dict) -> str:
    return ", ".join(f"{label} {_ms(_median(ps['phases_ms'][k]))}" for k, label in PHASES.items()
                     if k in ps["phases_ms"])


def report(data: dict, s: dict, b: dict, info: dict, elapsed: float) -> str:
    lines = [h.machine_header(info)]
    tools = [f"{n} = {c['path']} ({c['version']})" for n, c in b["compilers"].items()]
    if b.get("llvm"):
        tools.append(f"{LLVM_CONFIG} {b['llvm']['version']}; ORC target: {s['orc_setup']['info']}")
    lines.append("# tools: " + "; ".join(tools))
    lines.append("")
    lines.append(
        f"Fused kernels compiled at run time: {data['processes']} process(es) x {data['reps']} rounds "
        f"(after a first round per process, reported apart), every kernel by every path, interleaved"
        + ("; --quick (a smoke run)" if data.get("quick") else ""))
    lines.append("")
    setup = s["orc_setup"]
    orc_setup = (f"libLLVM {_ms(_median(setup['load_ms']))} + LLJIT {_ms(_median(setup['create_ms']))} ms"
                 if setup["load_ms"] else "-")
    rows = []
    for k in KERNELS:
        ks = s["kernels"].get(k)
        if not ks:
            continue
        kname = f"{k} ({ks['source_lines']} lines"
        kname += f", IR {ks['ir_lines']})" if ks["ir_lines"] else ")"
        for p in s["paths"]:
            ps = ks["paths"][p]
            t, first = ps["total_ms"], ps["first_ms"]
            per_call = ps.get("per_call_us")
            rows.append([
                kname, _label(p, b), _ms(_median(t)), _ms(t["min"]) if t else "-",
                _ms(_median(first)),
                h.fmt_us(_median(per_call)) if per_call else "-",
                f"{ps['gb_s']:.1f}" if ps.get("gb_s") else "-",
                f"{ps['max_rel_error']:.1e}" if ps.get("max_rel_error") is not None else "-",
                orc_setup if p == "orc" else "none",
                _phases(ps) + ("; ERROR " + ps["errors"][0][:120] if ps["errors"] else ""),
            ])
            kname = ""
        hit = ks["cache_hit"]
        if hit["total_ms"]:
            rows.append(["", f"disk-cache hit ({hit['compiler']} .so)", _ms(_median(hit["total_ms"])),
                         _ms(hit["total_ms"]["min"]), "-", "-", "-", "-", "none", "hash, stat, dlopen, dlsym"])
        if "orc" not in s["paths"]:
            rows.append(["", b.get("orc_missing") or ORC_MISSING] + ["-"] * 8)
    lines.append(h.table(
        ["kernel", "path", "ms median", "min", "1st in proc", "kernel/call", "GB/s", "rel err",
         "one-time setup", "phases (median ms)"],
        rows, align="llrrrrrrll"))
    lines.append("")
    lines.append(conclusion(s, b))
    lines.append("")
    notes = list(b["notes"])
    if b.get("orc_missing"):
        notes.append(b["orc_missing"])
    for k in RUN_KERNELS:
        for p, ps in s["kernels"].get(k, {}).get("paths", {}).items():
            err = ps.get("max_rel_error")
            if err is None or not err <= CHECK_TOLERANCE:
                notes.append(f"CHECK FAILED: {k} by {p}: max relative error {err} (tolerance {CHECK_TOLERANCE})")
    agree = []
    for k in RUN_KERNELS:
        for p, ps in s["kernels"].get(k, {}).get("paths", {}).items():
            if "identical_fraction" in ps and p != ps["agreement_base"]:
                agree.append(f"{k} {p}: {100 * ps['identical_fraction']:.1f}% bit-identical, max rel diff "
                             f"{ps['max_rel_diff']:.1e}")
    if agree:
        base = next(ps["agreement_base"] for k in RUN_KERNELS for ps in s["kernels"].get(k, {}).get("paths", {}).values()
                    if "agreement_base" in ps)
        lines.append(f"Outputs vs {base}'s (1024 x 1024): " + "; ".join(agree))
    for e in s["errors"] + setup["errors"]:
        notes.append(f"error: {e}")
    lines += notes
    lines.append(
        "1-min load average at each process start (after waiting up to 60 s for it to drop below 1): "
        + ", ".join(f"{r['load_at_start'][0]:.2f}" + (f" (waited {r['waited_s']:.0f} s)" if r["waited_s"] >= 1 else "")
                    for r in data["runs"] if r.get("load_at_start"))
        + (f"; CPU steal during the run: {100 * data['steal']:.1f}%" if data.get("steal") is not None else ""))
    lines += ["", "Notes:",
              "- ms: from the source (or, for ORC, the unoptimized IR text) in memory to a function pointer;",
              "  median and min over every round but each process's first (1st in proc: the median of those).",
              "  Compiler phases: write = new directory + kernel.cc, compiler = the whole",
              "  `-O3 -march=native -shared -fPIC` run (driver, compiler, assembler, linker), dlopen = dlopen + dlsym.",
              "  ORC phases: parse = IR text to a Module (new LLVMContext), O3 = buildPerModuleDefaultPipeline(O3),",
              "  codegen+link = new JITDylib, addIRModule, lookup (machine code, linking in memory).",
              "- one-time setup: per process, before the first kernel: dlopen of the ORC driver (loads libLLVM)",
              "  and LLJIT creation (host CPU and features detected).",
              "- disk-cache hit: FNV-1a of the source and flags, stat, dlopen, dlsym of a .so the compiler built",
              "  (in the page cache, not mapped by the process: closed after every hit).",
              "- kernel/call: median over batches (~40 ms each, interleaved by path) of 1024 x 1024 float32;",
              "  GB/s = inputs read once + output written once per call. rel err: max over elements of",
              "  |y - ref| / max(|ref|, 1e-3 max|ref|) against float64, on 1024 x 1024 and 7 x 1000.",
              "- empty: an empty kernel, the floor of each path (starting the toolchain; ORC's per-module work).",
              f"total time {elapsed:.0f} s"]
    return "\n".join(lines)


def plot(s: dict, b: dict, path: str) -> Optional[str]:
    plt = h.pyplot()
    if plt is None:
        return None
    kernels = [k for k in KERNELS if k in s["kernels"]]
    series = [(_label(p, b), [_compile_ms(s, k, p) for k in kernels]) for p in s["paths"]]
    series.append(("disk-cache hit", [_median(s["kernels"][k]["cache_hit"]["total_ms"]) for k in kernels]))
    fig, ax = plt.subplots(figsize=(9.5, 4.5))
    width = 0.8 / len(series)
    for i, (label, ys) in enumerate(series):
        xs = [j + i * width for j in range(len(kernels))]
        ax.bar([x for x, y in zip(xs, ys) if y], [y for y in ys if y], width, label=label)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(kernels))])
    ax.set_xticklabels(kernels)
    ax.set_yscale("log")
    ax.set_ylabel("source to callable, median ms (log)")
    ax.set_title("Compiling a fused kernel at run time")
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv=None) -> int:
    p = h.argument_parser(__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=6, help="rounds per process after the first (default 6)")
    p.add_argument("--processes", type=int, default=3, help="fresh processes, one after another (default 3)")
    p.add_argument("--keep", action="store_true", help="keep the build and work directory (printed)")
    p.add_argument("--no-wait", action="store_true",
                   help="do not wait (up to 1 min) for the 1-minute load average to drop below 1 before each process")
    args = p.parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    sw = h.Stopwatch()
    info = h.machine_info()
    tmp = tempfile.mkdtemp(prefix="pw_native_compile_")
    try:
        b = build(tmp)
        if b.get("orc_missing"):
            print(b["orc_missing"], flush=True)
        if "error" in b:
            print(f"{NAME}: {b['error']}")
            return 1
        data = sweep(args, b, tmp)
        data["quick"] = args.quick
        s = summarize(data, b)
    finally:
        if args.keep:
            h.log(f"[{NAME}] kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    text = report(data, s, b, info, sw.elapsed())
    print(text)
    data.update({"machine": info, "build": b, "summary": s})
    h.write_results(args.out_dir, NAME, text, data)
    plot(s, b, os.path.join(args.out_dir, f"{NAME}.png"))
    return 0 if data["runs"] and all(r["ok"] for r in data["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
