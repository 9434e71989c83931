"""Runs the benchmark scripts in sequence (`make bench`).

Each script prints its table and writes benchmarks/results/<name>.txt, .json
and .png. `--quick` is passed through (a reduced sweep, for smoke runs).

Usage: python benchmarks/run_all.py [--quick] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _harness as h  # noqa: E402

SCRIPTS = ["dispatch_overhead", "smallest_computation", "pipeline_dispatch", "multi_tenancy", "kernels", "transformer", "multihost",
           "pipeline_training", "recovery"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="reduced sweeps (smoke run)")
    p.add_argument("--only", nargs="+", choices=SCRIPTS, help="run only these scripts")
    p.add_argument("--out-dir", default=h.RESULTS_DIR)
    p.add_argument(
        "--no-wait",
        action="store_true",
        help="do not wait (up to 2 min) for the 1-minute load average to drop below 1 before each script",
    )
    args = p.parse_args(argv)

    print(h.machine_header(), flush=True)
    times = {}
    failed = []
    t_all = time.perf_counter()
    for name in args.only or SCRIPTS:
        cmd = [sys.executable, os.path.join(h.BENCH_DIR, f"{name}.py"), "--out-dir", args.out_dir]
        if args.quick:
            cmd.append("--quick")
        print(f"\n===== {name} =====", flush=True)
        if not args.no_wait:
            waited, load = h.wait_until_quiet()
            if waited >= 1:
                print(f"(waited {waited:.0f} s for the load average to drop; now {load:.2f})", flush=True)
        t0 = time.perf_counter()
        rc = subprocess.call(cmd, cwd=h.REPO_DIR)
        times[name] = time.perf_counter() - t0
        if rc != 0:
            failed.append(f"{name} (exit code {rc})")
    print("\n===== summary =====")
    print(h.table(["script", "seconds"], [[k, f"{v:.0f}"] for k, v in times.items()]))
    print(f"total {time.perf_counter() - t_all:.0f} s; results in {os.path.relpath(args.out_dir, h.REPO_DIR)}/")
    if failed:
        print("FAILED: " + ", ".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
