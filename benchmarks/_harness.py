"""Shared helpers for the pathways benchmark scripts (paper §5.1-5.2).

Every measured configuration runs in a fresh subprocess, because both the
pathways topology (`PATHWAYS_TOPOLOGY`, fixed when the runtime starts) and
JAX's host-platform device count (`XLA_FLAGS`, fixed when the backend starts)
are per process. A benchmark script calls `run_isolated("module:function",
kwargs, env=..., timeout=...)`; the child imports `benchmarks/<module>.py`,
calls the function and hands its JSON-serializable result back through a file.

Also here: the `--quick` flag convention (`parse_args`), aligned tables, PNG
plots (matplotlib, Agg backend), detection of missing peers (reported as
"missing (pip install .[bench])" rows, never hidden), a bounded-in-flight
timing loop, and the machine description printed above every table.

Run `python benchmarks/_harness.py --child module:function '{"k": 1}'` to run
one configuration by hand (the result JSON goes to stdout).
"""

from __future__ import annotations

import argparse
import collections
import datetime
import importlib
import importlib.util
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Iterable, Optional, Sequence

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_DIR = os.path.dirname(BENCH_DIR)
RESULTS_DIR = os.path.join(BENCH_DIR, "results")

MISSING = "missing (pip install .[bench])"

# Import name -> distribution name (for versions) of the peers and tools.
PEERS = {
    "jax": "jax",
    "ray": "ray",
    "dask.distributed": "distributed",
    "matplotlib": "matplotlib",
}


# --------------------------------------------------------------------------
# Command line.


def parse_args(description: str, argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """The common flags: `--quick` (reduced sweep, shorter measurements).

    Creates the output directory."""
    args = argument_parser(description).parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    return args


def argument_parser(description: str) -> argparse.ArgumentParser:
    """A parser with the common flags, for scripts that add their own."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument(
        "--quick",
        action="store_true",
        help="reduced sweep and shorter measurement windows (a smoke run, not for the README)",
    )
    p.add_argument(
        "--out-dir",
        default=RESULTS_DIR,
        help="where <name>.txt/.json/.png go (default: benchmarks/results)",
    )
    return p


# --------------------------------------------------------------------------
# Peers and machine.


def has_module(name: str) -> bool:
    """True if `name` is importable (without importing it)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a missing parent package
        return False


def module_version(name: str) -> Optional[str]:
    """The installed version of a peer's distribution, or None if missing."""
    if not has_module(name):
        return None
    try:
        from importlib.metadata import version

        return version(PEERS.get(name, name))
    except Exception:  # noqa: BLE001 - metadata of odd installs
        return "unknown version"


def peer_versions() -> dict:
    return {name: module_version(name) for name in PEERS}


def pathways_api_missing(names: Iterable[str]) -> list:
    """The attributes of `pathways` (e.g. "simulated_compute") that do not exist.

    Checked in the parent without starting the runtime: importing pathways
    does not touch devices.
    """
    import pathways as pw

    return [n for n in names if not hasattr(pw, n)]


def pathways_configure_keys() -> list:
    """The keyword arguments `pw.configure` accepts (topology keys)."""
    import inspect

    import pathways as pw

    return list(inspect.signature(pw.configure).parameters)


def machine_info() -> dict:
    mem = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    mem = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        import pathways

        pw_version = pathways.__version__
    except Exception:  # noqa: BLE001
        pw_version = "not importable"
    return {
        "date": datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
        "cores": os.cpu_count(),
        "memory_gib": round(mem / 2**30, 1) if mem else None,
        "cpu": cpu,
        "python": platform.python_version(),
        "pathways": pw_version,
        "peers": peer_versions(),
        "timer": timer_noise(),
        "loadavg": loadavg(),
    }


def machine_header(info: Optional[dict] = None) -> str:
    info = info or machine_info()
    peers = ", ".join(f"{k} {v}" if v else f"{k} {MISSING}" for k, v in info["peers"].items())
    t = info.get("timer")
    timer = (
        f"\n# at start: time.sleep({t['sleep_us']:.0f} us) woke late by p50 {t['p50_us']:.0f} us, "
        f"p99 {t['p99_us']:.0f} us, max {t['max_us']:.0f} us"
        if t
        else ""
    )
    if info.get("loadavg"):
        timer += "; load average " + " / ".join(f"{x:.2f}" for x in info["loadavg"])
    return (
        f"# {info['date']}; {info['cores']} cores, {info['memory_gib']} GiB, {info['cpu']}; "
        f"Python {info['python']}; pathways {info['pathways']}\n# peers: {peers}{timer}"
    )


def timer_noise(sleep_us: float = 300.0, samples: int = 500) -> dict:
    """Lateness of `time.sleep(sleep_us)` on this machine: p50, p99 and max in us.

    Simulated kernels end on a timer, so this bounds how precisely a
    simulated device can be kept busy here (a VM with steal time wakes late).
    """
    late = []
    for _ in range(samples):
        t = time.perf_counter()
        time.sleep(sleep_us / 1e6)
        late.append((time.perf_counter() - t) * 1e6 - sleep_us)
    late.sort()
    return {
        "sleep_us": sleep_us,
        "p50_us": late[len(late) // 2],
        "p99_us": late[int(len(late) * 0.99)],
        "max_us": late[-1],
    }


def loadavg() -> Optional[list]:
    """1, 5 and 15-minute load averages, or None."""
    try:
        return list(os.getloadavg())
    except OSError:
        return None


def wait_until_quiet(threshold: float = 1.0, max_wait: float = 120.0) -> tuple:
    """Waits until the 1-minute load average is below `threshold` (other work
    on this small machine distorts every number). Returns (waited s, load)."""
    t0 = time.perf_counter()
    while True:
        la = loadavg()
        if la is None or la[0] < threshold or time.perf_counter() - t0 >= max_wait:
            return time.perf_counter() - t0, (la[0] if la else None)
        time.sleep(5)


def cpu_times() -> Optional[list]:
    """The aggregate "cpu" line of /proc/stat (jiffies), or None."""
    try:
        with open("/proc/stat") as f:
            return [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None


def steal_fraction(before: Optional[list], after: Optional[list]) -> Optional[float]:
    """Share of CPU time stolen by the hypervisor between two `cpu_times()`."""
    if not before or not after or len(before) < 8:
        return None
    d = [b - a for a, b in zip(before, after)]
    total = sum(d[:8])
    return d[7] / total if total else None


# --------------------------------------------------------------------------
# Topologies.


def topology_for(n: int, devices_per_host: int = 4) -> str:
    """One island that holds an `n`-device slice, hosts of (at most) 4 devices."""
    dph = min(n, devices_per_host)
    hosts = -(-n // dph)
    return f"islands=1,hosts_per_island={hosts},devices_per_host={dph}"


# --------------------------------------------------------------------------
# Running one configuration in a fresh process.


def run_isolated(
    target: str,
    kwargs: Optional[dict] = None,
    *,
    env: Optional[dict] = None,
    timeout: float = 120.0,
) -> dict:
    """Runs `benchmarks/<module>.py:<function>(**kwargs)` in a new process.

    Args:
      target: "module:function", a module of this directory.
      kwargs: JSON-serializable keyword arguments.
      env: Variables set on top of this process's environment (e.g.
        PATHWAYS_TOPOLOGY, XLA_FLAGS). A value of None removes the variable.
      timeout: Seconds before the child's whole process group is killed.

    Returns:
      {"ok": True, "result": <the function's return value>, "wall_s": float,
      "load_at_start": [1, 5, 15-min load averages]} or {"ok": False, "error":
      "<reason>", "wall_s": float, "load_at_start": ...}.
    """
    child_env = dict(os.environ)
    for k, v in (env or {}).items():
        if v is None:
            child_env.pop(k, None)
        else:
            child_env[k] = str(v)
    child_env.setdefault("PYTHONUNBUFFERED", "1")
    fd, result_path = tempfile.mkstemp(prefix="pw_bench_", suffix=".json")
    os.close(fd)
    child_env["PW_BENCH_RESULT"] = result_path
    cmd = [sys.executable, os.path.abspath(__file__), "--child", target, json.dumps(kwargs or {})]
    load = loadavg()
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            cmd,
            env=child_env,
            cwd=REPO_DIR,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,  # its own process group: a timeout kills all of it
        )
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            wall = time.perf_counter() - t0
            os.unlink(result_path)
            return {"ok": False, "error": f"timeout after {timeout:.0f} s", "wall_s": wall,
                    "load_at_start": load}
        wall = time.perf_counter() - t0
        err.seek(0)
        stderr = err.read().decode(errors="replace")
    try:
        with open(result_path) as f:
            text = f.read()
    finally:
        os.unlink(result_path)
    if rc != 0 or not text:
        tail = [l for l in stderr.strip().splitlines() if l.strip()][-3:]
        reason = " | ".join(tail)[-400:] if tail else "no output"
        return {"ok": False, "error": f"exit code {rc}: {reason}", "wall_s": wall, "load_at_start": load}
    payload = json.loads(text)
    if "error" in payload:
        return {"ok": False, "error": payload["error"], "wall_s": wall, "load_at_start": load}
    return {"ok": True, "result": payload["result"], "wall_s": wall, "load_at_start": load}


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the group we created for this child
    except ProcessLookupError:
        pass
    proc.wait()


def _child_main(target: str, kwargs_json: str) -> int:
    module_name, func_name = target.split(":")
    sys.path.insert(0, BENCH_DIR)
    out = os.environ.get("PW_BENCH_RESULT")
    try:
        module = importlib.import_module(module_name)
        result = getattr(module, func_name)(**json.loads(kwargs_json))
        payload = {"result": result}
    except Exception as e:  # noqa: BLE001 - reported to the parent as a row
        import traceback

        traceback.print_exc()
        payload = {"error": f"{type(e).__name__}: {e}"[:400]}
    text = json.dumps(payload)
    if out:
        with open(out, "w") as f:
            f.write(text)
    else:
        print(text)
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown (Ray/JAX atexit hooks can be slow); the result is written.
    os._exit(0)


# --------------------------------------------------------------------------
# Timing.


def timed_loop(
    issue: Callable[[], Any],
    wait: Callable[[Any], Any],
    *,
    seconds: float,
    window: int,
    per_call: int = 1,
) -> dict:
    """Calls `issue()` back to back for `seconds`, then waits for the last output.

    At most `window` outputs are in flight: before issuing more, the loop waits
    for the oldest (`window=0`: wait for every output right after issuing it,
    i.e. synchronous calls). The clock stops after the last output is ready, so
    work queued at the end is paid for.

    Returns:
      {"calls", "computations" (= calls * per_call), "seconds", "per_s"}.
    """
    inflight: collections.deque = collections.deque()
    calls = 0
    t0 = time.perf_counter()
    deadline = t0 + seconds
    while True:
        out = issue()
        calls += 1
        if window <= 0:
            wait(out)
        else:
            inflight.append(out)
            if len(inflight) > window:
                wait(inflight.popleft())
        if time.perf_counter() >= deadline:
            break
    while inflight:
        wait(inflight.popleft())
    dt = time.perf_counter() - t0
    return {
        "calls": calls,
        "computations": calls * per_call,
        "seconds": dt,
        "per_s": calls * per_call / dt,
    }


def measure(
    issue: Callable[[], Any],
    wait: Callable[[Any], Any],
    *,
    seconds: float,
    warmup: float,
    window: int,
    per_call: int = 1,
    repeats: int = 3,
) -> dict:
    """Warm-up, then `repeats` timed loops of `seconds / repeats` each.

    Returns the median run's numbers plus "runs_per_s" (every run's rate), so
    the spread on this shared 2-core machine stays visible in the JSON. When a
    single call outlasts a slice, one run of `seconds` is made instead.
    """
    if warmup > 0:
        w = timed_loop(issue, wait, seconds=warmup, window=window, per_call=per_call)
        if w["calls"] == 1 and w["seconds"] > seconds / repeats:
            repeats = 1  # one call outlasts a slice: a single run of `seconds`
    runs = [
        timed_loop(issue, wait, seconds=seconds / repeats, window=window, per_call=per_call)
        for _ in range(repeats)
    ]
    runs.sort(key=lambda r: r["per_s"])
    med = dict(runs[len(runs) // 2])
    med["runs_per_s"] = [r["per_s"] for r in runs]
    return med


# --------------------------------------------------------------------------
# Output.


def fmt_rate(x: Optional[float]) -> str:
    """Compact rate: 950, 12.3k, 4.56M."""
    if x is None:
        return "-"
    if x >= 1e6:
        return f"{x / 1e6:.2f}M"
    if x >= 1e4:
        return f"{x / 1e3:.1f}k"
    if x >= 1e3:
        return f"{x / 1e3:.2f}k"
    if x >= 10:
        return f"{x:.0f}"
    return f"{x:.2f}"


def fmt_us(us: Optional[float]) -> str:
    if us is None:
        return "-"
    if us >= 1e4:
        return f"{us / 1e3:.1f} ms"
    if us >= 1e3:
        return f"{us / 1e3:.2f} ms"
    return f"{us:.0f} us"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], align: Optional[str] = None) -> str:
    """An aligned plain-text table. `align`: one char per column, "l" or "r"
    (default: first column left, the rest right)."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    ncol = len(headers)
    align = align or ("l" + "r" * (ncol - 1))
    widths = [max(len(r[i]) for r in cells if i < len(r)) for i in range(ncol)]

    def line(r: Sequence[str]) -> str:
        parts = []
        for i in range(ncol):
            c = r[i] if i < len(r) else ""
            parts.append(c.ljust(widths[i]) if align[i] == "l" else c.rjust(widths[i]))
        return "  ".join(parts).rstrip()

    out = [line(cells[0]), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in cells[1:]]
    return "\n".join(out)


def write_results(out_dir: str, name: str, text: str, data: Any) -> None:
    """Writes `<name>.txt` (the printed report) and `<name>.json` (raw numbers)."""
    os.makedirs(out_dir, exist_ok=True)
    if not has_module("matplotlib"):
        note = f"PNG not written: matplotlib {MISSING}"
        print(note)
        text = text.rstrip() + "\n" + note
    with open(os.path.join(out_dir, f"{name}.txt"), "w") as f:
        f.write(text.rstrip() + "\n")
    with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
        json.dump(data, f, indent=1, default=str)


def pyplot():
    """matplotlib.pyplot with the Agg backend, or None if matplotlib is missing."""
    if not has_module("matplotlib"):
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_lines(
    path: str,
    series: dict,
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    logx: bool = True,
    logy: bool = True,
    styles: Optional[dict] = None,
    xticks: Optional[Sequence[float]] = None,
) -> Optional[str]:
    """One line per series {label: (xs, ys)}; points with y None are dropped.

    Returns the path written, or None if matplotlib is missing.
    """
    plt = pyplot()
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(8, 5))
    for label, (xs, ys) in series.items():
        pts = [(x, y) for x, y in zip(xs, ys) if y is not None and y > 0]
        if not pts:
            continue
        style = (styles or {}).get(label, {"marker": "o"})
        ax.plot([p[0] for p in pts], [p[1] for p in pts], label=label, **style)
    if logx:
        ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    if xticks:
        ax.set_xticks(list(xticks))
        ax.set_xticklabels([str(int(x)) if float(x).is_integer() else str(x) for x in xticks])
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


class Stopwatch:
    """Wall time of a whole script, for the footer of its report."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0


def log(msg: str) -> None:
    """Progress to stderr (stdout carries the report)."""
    print(msg, file=sys.stderr, flush=True)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        sys.exit(_child_main(sys.argv[2], sys.argv[3]))
    print(__doc__)
    print(machine_header())
