"""Recovery: checkpoint save and restore throughput (issue 28).

1. Checkpoint throughput. A small transformer's parameters (a dict of float32
   arrays, ~260 MiB; ~34 MiB with --quick), the large matrices split over 4
   devices (one chunk per device) and the position embedding, layer norms
   and some biases replicated, saved and restored by:
     - pathways (`pw.checkpointing.save(...).result()`, `restore(like=)`),
       hosts in process and as 2 host processes x 2 devices
       (`hosts=local_processes`), where each host writes its own shards;
     - Orbax (`orbax.checkpoint`, OCDBT + zarr3, the format pathways
       writes) saving the same arrays as `jax.Array`s on 4 XLA:CPU devices,
       split and replicated the same way, and restoring them there;
     - a raw sequential write of the same bytes to one file on the same file
       system (16 MiB writes, one fsync at the end) and its sequential read.
   GB/s = bytes of the tree (a replicated leaf counted once) / wall time.
   Every method runs in a fresh process per round, 5 rounds interleaved;
   the page cache is dropped before every read when this process may
   (root). Goals: pathways >= 70% of the raw write (and read), and not
   slower than Orbax.

Usage: python benchmarks/recovery.py [--quick] [--dir DIR] [--only SECTION] [--rounds N]

The report is a list of sections (SECTIONS): each has a function that
measures (run in the parent, isolating configurations with
`_harness.run_isolated`), one that formats its part of the report and one
that draws its panel of the PNG.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any, Callable, NamedTuple, Optional

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _harness as h  # noqa: E402

NAME = "recovery"
N_DEVICES = 4
HOSTS, DPH = 2, 2  # the pathways topology in both modes: 2 hosts x 2 devices
TOPOLOGY = f"islands=1,hosts_per_island={HOSTS},devices_per_host={DPH}"
PROCS_TOPOLOGY = f"hosts=local_processes,{TOPOLOGY}"
RAW_CHUNK = 16 << 20  # bytes per write()/readinto() of the raw baseline
GOAL_RAW = 0.70  # pathways / raw
GOAL_ORBAX = 1.0  # pathways / Orbax


# --------------------------------------------------------------------------
# Helpers shared by the workers.


def drop_caches() -> Optional[str]:
    """Writes dirty pages back and drops the page cache; None if done, else why not."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return None
    except OSError as e:
        return f"{type(e).__name__}: {e}"


def _cpu_seconds(pids: tuple = ()) -> float:
    """CPU seconds (user + system) of this process and of `pids` (host processes) so far."""
    t = os.times()
    total = t.user + t.system
    tick = os.sysconf("SC_CLK_TCK")
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
        except (OSError, IndexError, ValueError):
            pass
    return total


def _du(path: str) -> int:
    """Bytes of the file `path`, or of the files under the directory `path`."""
    if os.path.isfile(path):
        return os.path.getsize(path)
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def model_shapes(quick: bool) -> list:
    """(key path, per-device or whole shape, "split" | "replicated") of the parameter tree.

    A decoder-only transformer, Megatron-style: the matrices (and their
    biases) split over N_DEVICES along a leading axis of N_DEVICES, the
    position embedding, layer norms and the biases that follow a reduction
    replicated. A split leaf's array is (N_DEVICES, *shape).
    """
    d, layers, vocab, seq = (512, 2, 4096, 1024) if quick else (1024, 4, 16384, 1024)
    n = N_DEVICES
    out = [(("embed", "wte"), (vocab // n, d), "split"), (("embed", "wpe"), (seq, d), "replicated")]
    for i in range(layers):
        p = ("layers", str(i))
        out += [
            (p + ("ln1", "scale"), (d,), "replicated"), (p + ("ln1", "bias"), (d,), "replicated"),
            (p + ("attn", "qkv"), (d, 3 * d // n), "split"), (p + ("attn", "qkv_bias"), (3 * d // n,), "split"),
            (p + ("attn", "out"), (d // n, d), "split"), (p + ("attn", "out_bias"), (d,), "replicated"),
            (p + ("ln2", "scale"), (d,), "replicated"), (p + ("ln2", "bias"), (d,), "replicated"),
            (p + ("mlp", "up"), (d, 4 * d // n), "split"), (p + ("mlp", "up_bias"), (4 * d // n,), "split"),
            (p + ("mlp", "down"), (4 * d // n, d), "split"), (p + ("mlp", "down_bias"), (d,), "replicated"),
        ]
    out += [(("ln_f", "scale"), (d,), "replicated"), (("ln_f", "bias"), (d,), "replicated")]
    return out


def model_arrays(quick: bool) -> list:
    """(key path, numpy array, kind): the same seeded float32 values in every process."""
    import numpy as np

    rng = np.random.default_rng(0)
    out = []
    for path, shape, kind in model_shapes(quick):
        full = (N_DEVICES,) + shape if kind == "split" else shape
        out.append((path, (rng.standard_normal(full, dtype=np.float32) * 0.02), kind))
    return out


def _nest(pairs: list) -> dict:
    tree: dict = {}
    for path, value in pairs:
        node = tree
        for k in path[:-1]:
            node = node.setdefault(k, {})
        node[path[-1]] = value
    return tree


def _leaves(tree: Any, prefix: tuple = ()) -> list:
    if isinstance(tree, dict):
        return [x for k in sorted(tree) for x in _leaves(tree[k], prefix + (k,))]
    return [(prefix, tree)]


def tree_bytes(quick: bool) -> int:
    import numpy as np

    return sum(int(np.prod(((N_DEVICES,) + s) if k == "split" else s)) * 4 for _, s, k in model_shapes(quick))


def _check_equal(arrays: list, restored: dict, to_numpy: Callable[[Any], Any]) -> Optional[str]:
    """None if every restored leaf equals the saved array, else the first difference."""
    import numpy as np

    got = dict(_leaves(restored))
    for path, a, _ in arrays:
        if path not in got:
            return f"{'.'.join(path)} missing from the restored tree"
        b = to_numpy(got[path])
        if b.shape != a.shape or not np.array_equal(b, a):
            return f"{'.'.join(path)} differs after restore (shape {b.shape} vs {a.shape})"
    return None


def _timed(fn: Callable[[], Any], pids: tuple = ()) -> tuple:
    """(result, wall s, CPU s of this process and `pids`)."""
    c0, t0 = _cpu_seconds(pids), time.perf_counter()
    r = fn()
    dt = time.perf_counter() - t0
    return r, dt, _cpu_seconds(pids) - c0


# --------------------------------------------------------------------------
# Section 1 workers (each runs in a fresh process).


def raw_worker(quick: bool, dir: str) -> dict:
    """A raw sequential write (one file, RAW_CHUNK writes, fsync at the end) and read of the tree's bytes."""
    import numpy as np

    arrays = model_arrays(quick)
    data = np.concatenate([a.ravel() for _, a, _ in arrays])
    mv = memoryview(data).cast("B")
    nbytes = mv.nbytes
    path = os.path.join(dir, "raw.bin")
    warm = os.path.join(dir, "raw_warm.bin")

    def write(p):
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            off = 0
            while off < nbytes:
                off += os.write(fd, mv[off:off + RAW_CHUNK])
            os.fsync(fd)
        finally:
            os.close(fd)
        _fsync_dir(os.path.dirname(p))

    out_buf = np.empty(nbytes, np.uint8)
    out_mv = memoryview(out_buf)

    def read(p):
        with open(p, "rb", buffering=0) as f:
            # Read-ahead for a sequential reader (without it, the first read
            # after the write ran at a quarter of this speed during development).
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
            off = 0
            while off < nbytes:
                n = f.readinto(out_mv[off:off + RAW_CHUNK])
                if not n:
                    raise IOError(f"{p}: short read at {off} of {nbytes}")
                off += n

    write(warm)  # the first write of a process (page allocation), untimed
    os.unlink(warm)
    os.sync()
    _, save_s, save_cpu = _timed(lambda: write(path))
    dropped = drop_caches()
    _, restore_s, restore_cpu = _timed(lambda: read(path))
    ok = np.array_equal(out_buf.view(np.float32), data)
    on_disk = _du(path)
    os.unlink(path)
    return {"bytes": nbytes, "on_disk_bytes": on_disk, "save_s": save_s, "save_cpu_s": save_cpu,
            "restore_s": restore_s, "restore_cpu_s": restore_cpu, "cache_dropped": dropped is None,
            "drop_error": dropped, "check": None if ok else "read back differs from the written bytes"}


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def pathways_worker(quick: bool, dir: str) -> dict:
    """pw.checkpointing.save and restore(like=) of the tree, on PATHWAYS_TOPOLOGY's 4 devices.

    One untimed save first (the first save of a process starts tensorstore
    and the writer threads), then a timed save and a timed restore. A
    restore that raises is reported with its message.
    """
    import numpy as np

    import pathways as pw

    arrays = model_arrays(quick)
    tpus = pw.make_virtual_device_set().add_slice(tpu_devices=N_DEVICES).tpus
    replicate = pw.pmap(lambda x: x, devices=tpus, out_axes=None)
    leaves = []
    for path, a, kind in arrays:
        if kind == "split":
            b = pw.device_put(a, tpus)
        else:
            b = replicate(np.ascontiguousarray(np.broadcast_to(a, (N_DEVICES,) + a.shape)))
            assert b.is_replicated
        leaves.append((path, b))
    tree = {"params": _nest(leaves), "step": 1000}
    pw.block_until_ready(tree)
    hosts = [x.pid for x in pw.hosts()] if pw.topology()["hosts"] != "in_process" else []
    pids = tuple(p for p in hosts if p and p != os.getpid())
    nbytes = tree_bytes(quick)

    pw.checkpointing.save(os.path.join(dir, "warm"), tree).result()
    shutil.rmtree(os.path.join(dir, "warm"))
    os.sync()
    path = os.path.join(dir, "ckpt")
    _, save_s, save_cpu = _timed(lambda: pw.checkpointing.save(path, tree).result(), pids)
    out = {"bytes": nbytes, "on_disk_bytes": _du(path), "save_s": save_s, "save_cpu_s": save_cpu,
           "topology": pw.topology(), "host_pids": hosts, "pathways": _package_identity(pw), "writers": sorted(
               p for p in os.listdir(path) if p.startswith("ocdbt.process_"))}
    dropped = drop_caches()
    out.update(cache_dropped=dropped is None, drop_error=dropped)
    like = {"params": tree["params"], "step": 0}
    got, restore_s, restore_cpu = _timed(
        lambda: pw.block_until_ready(pw.checkpointing.restore(path, like=like)), pids)
    out.update(restore_s=restore_s, restore_cpu_s=restore_cpu)
    out["check"] = _check_equal(arrays, got["params"], np.asarray)
    if got["step"] != 1000:
        out["check"] = f"step restored as {got['step']!r}"
    placed = got["params"]["layers"]["0"]["attn"]["qkv"]
    if [d.id for d in placed.devices] != [d.id for d in tree["params"]["layers"]["0"]["attn"]["qkv"].devices]:
        out["check"] = "a split leaf was restored onto other devices"
    shutil.rmtree(path)
    return out


def _package_identity(pw) -> dict:
    """Where the pathways package came from and a digest of its checkpoint code (the venv is shared)."""
    import hashlib

    d = os.path.dirname(pw.__file__)
    digest = hashlib.sha256()
    for name in ("checkpointing.py", "_checkpoint_io.py"):
        with open(os.path.join(d, name), "rb") as f:
            digest.update(f.read())
    core = [n for n in os.listdir(d) if n.startswith("_core") and n.endswith(".so")]
    mtime = os.path.getmtime(os.path.join(d, core[0])) if core else None
    return {"dir": d, "checkpoint_code_sha256": digest.hexdigest()[:12],
            "core_mtime": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(mtime)) if mtime else None}


def orbax_worker(quick: bool, dir: str) -> dict:
    """Orbax (OCDBT + zarr3) saving and restoring the tree as jax.Arrays on 4 XLA:CPU devices."""
    import jax
    import numpy as np
    import orbax.checkpoint as ocp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    devices = jax.devices()
    if len(devices) != N_DEVICES:
        raise RuntimeError(f"JAX has {len(devices)} devices, expected {N_DEVICES} (XLA_FLAGS)")
    mesh = Mesh(np.array(devices), ("d",))
    split, repl = NamedSharding(mesh, P("d")), NamedSharding(mesh, P())
    arrays = model_arrays(quick)
    leaves = [(path, jax.device_put(a, split if kind == "split" else repl)) for path, a, kind in arrays]
    tree = {"params": _nest(leaves), "step": 1000}
    jax.block_until_ready(tree)
    nbytes = tree_bytes(quick)
    handler = ocp.PyTreeCheckpointHandler(use_ocdbt=True, use_zarr3=True)
    ckptr = ocp.Checkpointer(handler)

    def save(p):
        ckptr.save(p, args=ocp.args.PyTreeSave(tree))

    save(os.path.join(dir, "warm"))
    shutil.rmtree(os.path.join(dir, "warm"))
    os.sync()
    path = os.path.join(dir, "ckpt")
    _, save_s, save_cpu = _timed(lambda: save(path))
    out = {"bytes": nbytes, "on_disk_bytes": _du(path), "save_s": save_s, "save_cpu_s": save_cpu,
           "orbax": ocp.__version__ if hasattr(ocp, "__version__") else _version("orbax-checkpoint"),
           "jax_devices": len(devices)}
    with open(os.path.join(path, "_METADATA")) as f:
        meta = json.load(f)
    out["format"] = {"use_ocdbt": meta.get("use_ocdbt"), "use_zarr3": meta.get("use_zarr3")}
    abstract = jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding) if isinstance(x, jax.Array) else x,
        tree)
    restore_args = ocp.checkpoint_utils.construct_restore_args(abstract)
    dropped = drop_caches()
    out.update(cache_dropped=dropped is None, drop_error=dropped)
    got, restore_s, restore_cpu = _timed(lambda: jax.block_until_ready(
        ckptr.restore(path, args=ocp.args.PyTreeRestore(item=abstract, restore_args=restore_args))))
    out.update(restore_s=restore_s, restore_cpu_s=restore_cpu)
    out["check"] = _check_equal(arrays, got["params"], np.asarray)
    if got["params"]["layers"]["0"]["attn"]["qkv"].sharding != split:
        out["check"] = "a split leaf was restored with another sharding"
    shutil.rmtree(path)
    return out


def _version(dist: str) -> Optional[str]:
    try:
        from importlib.metadata import version

        return version(dist)
    except Exception:  # noqa: BLE001
        return None


# --------------------------------------------------------------------------
# Section 1: checkpoint throughput.

METHODS = [
    # (key, label, worker, env)
    ("raw", "raw sequential write / read", "recovery:raw_worker", {}),
    ("pw", "pathways, hosts in process", "recovery:pathways_worker", {"PATHWAYS_TOPOLOGY": TOPOLOGY}),
    ("pw_procs", f"pathways, {HOSTS} host processes", "recovery:pathways_worker",
     {"PATHWAYS_TOPOLOGY": PROCS_TOPOLOGY}),
    ("orbax", f"Orbax from JAX ({N_DEVICES} CPU devices)", "recovery:orbax_worker",
     {"XLA_FLAGS": f"--xla_force_host_platform_device_count={N_DEVICES}", "JAX_PLATFORMS": "cpu"}),
]
PW_METHODS = ("pw", "pw_procs")


def run_throughput(args, work_dir: str) -> dict:
    rounds = args.rounds or (2 if args.quick else 5)
    d: dict = {"rounds": rounds, "bytes": tree_bytes(args.quick), "leaves": len(model_shapes(args.quick)),
               "split_bytes": sum(4 * N_DEVICES * _prod(s) for _, s, k in model_shapes(args.quick) if k == "split"),
               "dir": work_dir, "runs": {k: [] for k, *_ in METHODS}}
    missing = {"jax": h.has_module("jax"), "orbax.checkpoint": h.has_module("orbax.checkpoint"),
               "tensorstore": h.has_module("tensorstore")}
    d["missing"] = [m for m, ok in missing.items() if not ok]
    for r in range(rounds):
        for key, label, target, env in METHODS:
            if key == "orbax" and ("jax" in d["missing"] or "orbax.checkpoint" in d["missing"]):
                d["runs"][key].append({"ok": False, "error": h.MISSING})
                continue
            sub = os.path.join(work_dir, f"{key}_{r}")
            os.makedirs(sub)
            h.log(f"[{NAME}] throughput round {r + 1}/{rounds}: {label}")
            res = h.run_isolated(target, {"quick": args.quick, "dir": sub}, env=env, timeout=600)
            shutil.rmtree(sub, ignore_errors=True)
            d["runs"][key].append(res)
    return d


def _prod(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _median(xs: list) -> Optional[float]:
    xs = sorted(x for x in xs if x is not None)
    return xs[len(xs) // 2] if xs else None


def _rates(d: dict, key: str, op: str) -> tuple:
    """(median GB/s, [each round's GB/s], first error) of method `key`'s `op` ("save" | "restore")."""
    rates, err = [], None
    for r in d["runs"][key]:
        if not r["ok"]:
            err = err or r["error"]
            continue
        res = r["result"]
        if res.get(f"{op}_s"):
            rates.append(res["bytes"] / res[f"{op}_s"] / 1e9)
    return _median(rates), rates, err


def report_throughput(d: dict) -> str:
    mib = d["bytes"] / 2**20
    lines = [
        f"1. Checkpoint throughput: a transformer's parameters, {d['leaves']} float32 leaves + a scalar, "
        f"{mib:.0f} MiB ({100 * d['split_bytes'] / d['bytes']:.0f}% in leaves split over {N_DEVICES} devices, "
        "the rest replicated and written once); GB/s = tree bytes / wall time (save: until the checkpoint is "
        f"complete; restore: until every leaf is on its devices); median of {d['rounds']} rounds, each method "
        "in a fresh process per round, after one untimed save",
        f"   pathways: {TOPOLOGY} (hosts in process, and hosts=local_processes); Orbax: "
        f"PyTreeCheckpointHandler(use_ocdbt=True, use_zarr3=True), jax.Arrays on {N_DEVICES} XLA:CPU devices; "
        f"raw: one file, {RAW_CHUNK >> 20} MiB writes, fsync at the end; read back in {RAW_CHUNK >> 20} MiB "
        "readinto() calls after posix_fadvise(SEQUENTIAL)",
        "",
    ]
    rows = []
    notes = []  # why a cell is not available, printed under the table
    med: dict = {}
    for key, label, _, _ in METHODS:
        row = [label]
        for op in ("save", "restore"):
            m, each, err = _rates(d, key, op)
            med[(key, op)] = m
            if m is None:
                notes.append(f"[{len(notes) + 1}] {label}, {op}: not available: {err or 'no result'}")
                row += [f"not available [{len(notes)}]", ""]
            else:
                row += [f"{m:.3f}", " / ".join(f"{x:.3f}" for x in each)]
        runs = [r["result"] for r in d["runs"][key] if r["ok"]]
        ratio = _median([r["on_disk_bytes"] / r["bytes"] for r in runs if r.get("on_disk_bytes")])
        cpu = _median([r["save_cpu_s"] / r["save_s"] for r in runs if r.get("save_s")])
        row += [f"{ratio:.3f}" if ratio else "-", f"{cpu:.2f}" if cpu is not None else "-"]
        rows.append(row)
    lines.append(h.table(["method", "save GB/s", "(each round)", "restore GB/s", "(each round)", "on disk / bytes",
                          "save CPU/wall"], rows, align="lrrrrrr"))
    lines += notes
    lines.append("")
    drops = [r["result"].get("cache_dropped") for k in d["runs"] for r in d["runs"][k] if r["ok"]]
    if drops and all(drops):
        lines.append("page cache dropped (sync; echo 3 > /proc/sys/vm/drop_caches) before every read: restores "
                     "and the raw read come from the disk (as this VM sees it: its host may cache the disk)")
    else:
        errs = {r["result"].get("drop_error") for k in d["runs"] for r in d["runs"][k] if r["ok"]} - {None}
        lines.append("page cache NOT dropped before every read (" + "; ".join(sorted(errs)) + "): reads may come "
                     "from memory")
    loads = [r["load_at_start"][0] for k in d["runs"] for r in d["runs"][k] if r.get("load_at_start")]
    if loads:
        lines.append(f"1-minute load average when each measurement's process started: {min(loads):.2f} to "
                     f"{max(loads):.2f} (median {_median(loads):.2f}) on {os.cpu_count()} cores")
    ids = {json.dumps(r["result"]["pathways"], sort_keys=True) for k in PW_METHODS for r in d["runs"][k]
           if r["ok"] and r["result"].get("pathways")}
    for i in sorted(ids):
        i = json.loads(i)
        lines.append(f"pathways from {i['dir']}: checkpoint code sha256 {i['checkpoint_code_sha256']}, _core built "
                     f"{i['core_mtime']} UTC")
    if len(ids) > 1:
        lines.append("WARNING: the pathways package changed between rounds (reinstalled meanwhile)")
    checks = [f"{label}: {r['result']['check']}" for key, label, *_ in METHODS for r in d["runs"][key]
              if r["ok"] and r["result"].get("check")]
    lines.append("checked: every restored leaf equals the saved array: " + ("ok" if not checks else
                                                                            "FAILED " + "; ".join(checks)))
    for key, label, *_ in METHODS:
        failed = [r["error"] for r in d["runs"][key] if not r["ok"]]
        if failed:
            lines.append(f"{label}: {len(failed)} of {len(d['runs'][key])} rounds failed: {failed[0]}")
    lines.append("")
    lines.append("goals (ratios of medians):")
    for op, base in (("save", "raw write"), ("restore", "raw read")):
        for key in PW_METHODS:
            label = dict((k, l) for k, l, *_ in METHODS)[key]
            for ref, goal, ref_name in (("raw", GOAL_RAW, base), ("orbax", GOAL_ORBAX, f"Orbax {op}")):
                a, b = med[(key, op)], med[(ref, op)]
                if a is None or b is None:
                    why = "pathways" if a is None else ref_name
                    lines.append(f"  {label} {op} / {ref_name} >= {goal:.2f}: not measured ({why} not available)")
                else:
                    verdict = "met" if a / b >= goal else "missed"
                    lines.append(f"  {label} {op} / {ref_name} >= {goal:.2f}: {a / b:.2f} ({a:.3f} / {b:.3f} GB/s) "
                                 f"{verdict}")
    return "\n".join(lines)


def plot_throughput(d: dict, ax) -> None:
    import numpy as np

    labels = [l for _, l, *_ in METHODS]
    x = np.arange(len(labels))
    for i, (op, color) in enumerate((("save", "tab:blue"), ("restore", "tab:orange"))):
        meds, lo, hi = [], [], []
        for key, *_ in METHODS:
            m, each, _ = _rates(d, key, op)
            meds.append(m or 0.0)
            lo.append((m - min(each)) if m else 0.0)
            hi.append((max(each) - m) if m else 0.0)
        ax.bar(x + (i - 0.5) * 0.38, meds, 0.38, yerr=[lo, hi], capsize=3, color=color, label=op)
        for xi, m in zip(x, meds):
            ax.text(xi + (i - 0.5) * 0.38, m, f"{m:.2f}" if m else "n/a", ha="center", va="bottom", fontsize=7)
    for op, color in (("save", "tab:blue"), ("restore", "tab:orange")):
        raw, _, _ = _rates(d, "raw", op)
        if raw:
            ax.axhline(GOAL_RAW * raw, color=color, ls="--", lw=1,
                       label=f"goal: {100 * GOAL_RAW:.0f}% of the raw {'write' if op == 'save' else 'read'}")
    ax.set_xticks(x)
    ax.set_xticklabels([l.replace(", ", ",\n").replace(" (", "\n(") for l in labels], fontsize=8)
    ax.set_ylabel("GB/s")
    ax.set_title(f"checkpoint of {d['bytes'] / 2**20:.0f} MiB: median and range of {d['rounds']} rounds", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)


# --------------------------------------------------------------------------
# 2. Recovery time: kill a host process, time until the step it broke is done.

EXAMPLES_DIR = os.path.join(h.REPO_DIR, "examples")
JOB_TOPOLOGY = dict(hosts="local_processes", islands=2, hosts_per_island=3, devices_per_host=2)
JOB = dict(vocab=64, seq=32, d=64, heads=4, blocks=2, global_batch=32)  # examples/lm.py's LM, 4 replicas


def _dp_job(pw, lm, slices, remap: bool, params=None, opt=None, recover: bool = True):
    """The job every recovery method runs: pw.elastic.DataParallel over 4 replicas (examples/elastic_dp.py)."""
    init = lm.init_lm(JOB["vocab"], JOB["seq"], JOB["d"], JOB["blocks"], 0) if params is None else params
    return pw.elastic.DataParallel(lambda p, t: lm.lm_loss(p, t, JOB["heads"]), lm.adam, slices, init,
                                   lm.zero_adam(init) if opt is None else opt,
                                   global_batch=JOB["global_batch"], remap_onto_spares=remap, recover=recover)


def _start_job(steps: int):
    sys.path.insert(0, EXAMPLES_DIR)
    import lm
    import pathways as pw

    pw.configure(**JOB_TOPOLOGY)
    vds = pw.make_virtual_device_set()
    slices = [vds.add_slice(tpu_devices=2) for _ in range(4)]  # hosts 0, 3, 1, 4; hosts 2 and 5 spare
    tokens = lm.permutation_tokens(steps, JOB["global_batch"], JOB["seq"], JOB["vocab"])
    return pw, lm, slices, tokens


def elastic_worker(steps: int, kill_at: int, remap: bool) -> dict:
    """The job runs; once step `kill_at` is dispatched, replica 1's host is SIGKILLed; the job recovers.
    Dropping the replica (not `remap`), a new host process takes the killed one's place two steps later
    (pw.elastic.replace_host) and the replica comes back there (grow)."""
    import signal

    pw, lm, slices, tokens = _start_job(steps)
    job = _dp_job(pw, lm, slices, remap)
    victim = {x.id: x for x in pw.hosts()}[slices[1].physical_devices[0].host]
    t: dict = {}

    def kill():
        os.kill(victim.pid, signal.SIGKILL)
        t["kill"] = time.perf_counter()

    step_s = []
    rejoin: dict = {}
    for step in range(steps):
        if not remap and step == kill_at + 2:
            t0 = time.perf_counter()
            pw.elastic.replace_host(victim.id)
            t1 = time.perf_counter()
            job.grow()
            rejoin = {"replace_s": t1 - t0, "grow_s": time.perf_counter() - t1}
        t0 = time.perf_counter()
        job.step(tokens[step], after_dispatch=kill if step == kill_at else None)
        if step == kill_at:
            t["done"] = time.perf_counter()
        elif step >= 2:
            step_s.append(time.perf_counter() - t0)
    seen = next(at for at, what in job.events if "Error" in what) + job._start
    recovered = next(at for at, what in job.events if what.startswith("remapped")) + job._start
    return {"recovery_s": t["done"] - t["kill"], "detect_s": seen - t["kill"], "remap_s": recovered - seen,
            "step_s": _median(step_s), "replicas_after": len(job.replicas.slices), "steps_lost": 0, **rejoin}


def restart_train_worker(steps: int, kill_at: int, every: int, dir: str) -> dict:
    """The job with a checkpoint every `every` steps (asynchronous, `pw.checkpointing`); the kill's error
    ends it (`recover=False`), as a job that restarts from its last checkpoint ends."""
    import signal

    pw, lm, slices, tokens = _start_job(steps)
    job = _dp_job(pw, lm, slices, remap=False, recover=False)
    victim = {x.id: x for x in pw.hosts()}[slices[1].physical_devices[0].host]
    pending, pending_step, saved = None, None, None
    t: dict = {}

    def kill():
        os.kill(victim.pid, signal.SIGKILL)
        t["kill"] = time.time()  # wall clock: the restart is another process

    for step in range(steps):
        if step % every == 0:
            if pending is not None:
                pending.result()
                saved = pending_step
            params, opt = job.states[job.replicas.slices[0].id]
            pending = pw.checkpointing.save(os.path.join(dir, f"step_{step}"),
                                            {"params": params, "opt": opt, "step": step})
            pending_step = step
        try:
            job.step(tokens[step], after_dispatch=kill if step == kill_at else None)
        except pw.DeviceFailedError:
            try:
                pending.result()  # the save in flight may have completed before the kill
                saved = pending_step
            except Exception:  # noqa: BLE001 - it lost a shard with the host: the one before stands
                pass
            return {"t_kill": t["kill"], "t_exit": time.time(), "checkpoint_step": saved, "killed_step": step}
    raise RuntimeError("the kill did not fail a step")


def restart_resume_worker(steps: int, kill_at: int, dir: str, checkpoint_step: int) -> dict:
    """A new job process: its hosts, the last checkpoint read, the steps since it redone up to the one
    the kill broke."""
    t_start = time.time()
    pw, lm, slices, tokens = _start_job(steps)
    t_hosts = time.time()
    state = pw.checkpointing.restore(os.path.join(dir, f"step_{checkpoint_step}"))
    t_restored = time.time()
    params = pw.tree_map(lambda x: np.asarray(x)[0], state["params"])
    opt = pw.tree_map(lambda x: np.asarray(x)[0], state["opt"])
    job = _dp_job(pw, lm, slices, remap=False, params=params, opt=opt)
    first = int(state["step"])
    t_first = None
    for step in range(first, kill_at + 1):
        job.step(tokens[step])
        t_first = t_first or time.time()
    return {"t_start": t_start, "t_hosts": t_hosts, "t_restored": t_restored, "t_first_step": t_first,
            "t_done": time.time(), "steps_redone": kill_at + 1 - first}


def run_recovery(args, work_dir: str) -> dict:
    rounds = 1 if args.quick else 3
    steps, kill_at, every = (10, 6, 4) if args.quick else (16, 10, 4)
    d: dict = {"rounds": rounds, "steps": steps, "kill_at": kill_at, "every": every, "job": JOB,
               "topology": JOB_TOPOLOGY, "runs": {"remap": [], "drop": [], "restart": []}}
    for r in range(rounds):
        for key, remap in (("remap", True), ("drop", False)):
            h.log(f"[{NAME}] recovery round {r + 1}/{rounds}: elastic, {key}")
            d["runs"][key].append(h.run_isolated("recovery:elastic_worker",
                                                 {"steps": steps, "kill_at": kill_at, "remap": remap}, timeout=600))
        h.log(f"[{NAME}] recovery round {r + 1}/{rounds}: checkpoint and restart")
        sub = os.path.join(work_dir, f"restart_{r}")
        os.makedirs(sub)
        train = h.run_isolated("recovery:restart_train_worker",
                               {"steps": steps, "kill_at": kill_at, "every": every, "dir": sub}, timeout=600)
        run: dict = {"train": train}
        if train["ok"] and train["result"]["checkpoint_step"] is not None:
            resume = h.run_isolated("recovery:restart_resume_worker",
                                    {"steps": steps, "kill_at": kill_at, "dir": sub,
                                     "checkpoint_step": train["result"]["checkpoint_step"]}, timeout=600)
            run["resume"] = resume
            if resume["ok"]:
                a, b = train["result"], resume["result"]
                run["recovery_s"] = b["t_done"] - a["t_kill"]
                run["parts"] = {"failing job exits": a["t_exit"] - a["t_kill"],
                                "new process until hosts up": b["t_hosts"] - a["t_exit"],
                                "checkpoint read": b["t_restored"] - b["t_hosts"],
                                "first step (trace, compile)": b["t_first_step"] - b["t_restored"],
                                "steps redone": b["t_done"] - b["t_first_step"]}
                run["steps_redone"] = b["steps_redone"]
        d["runs"]["restart"].append(run)
        shutil.rmtree(sub, ignore_errors=True)
    return d


def _recovery_times(d: dict, key: str) -> tuple:
    times, err = [], None
    for run in d["runs"][key]:
        if key == "restart":
            if "recovery_s" in run:
                times.append(run["recovery_s"])
            else:
                bad = run.get("resume") or run["train"]
                err = err or bad.get("error") or "no checkpoint before the kill"
        elif run["ok"]:
            times.append(run["result"]["recovery_s"])
        else:
            err = err or run["error"]
    return _median(times), times, err


def report_recovery(d: dict) -> str:
    j = d["job"]
    lines = [
        f"2. Recovery time: kill to the next completed step. The same job (examples/lm.py's LM, d={j['d']}, "
        f"{j['blocks']} blocks, seq {j['seq']}; pw.elastic.DataParallel, 4 replicas of 2 devices, global batch "
        f"{j['global_batch']}) on 6 host processes (2 islands x 3 hosts x 2 devices; hosts 2 and 5 spare); "
        f"once step {d['kill_at']} is dispatched, replica 1's host process is SIGKILLed; median of "
        f"{d['rounds']} round(s), each method in fresh processes",
        "",
        f"{'method':<46}  {'recovery s':>10}  {'(each round)':>22}  {'steps redone':>12}",
        f"{'-' * 46}  {'-' * 10}  {'-' * 22}  {'-' * 12}",
    ]
    labels = {"remap": "elastic: remap onto a spare host, copy state",
              "drop": "elastic: drop the replica, 3 replicas go on",
              "restart": f"checkpoint (every {d['every']} steps) and restart"}
    medians = {}
    for key in ("remap", "drop", "restart"):
        med, each, err = _recovery_times(d, key)
        medians[key] = med
        redone = "0" if key != "restart" else ", ".join(str(r.get("steps_redone", "?")) for r in d["runs"][key])
        if med is None:
            lines.append(f"{labels[key]:<46}  {'failed':>10}  {err}")
        else:
            lines.append(f"{labels[key]:<46}  {med:10.2f}  {' / '.join(f'{x:.2f}' for x in each):>22}  {redone:>12}")
    parts = [r["parts"] for r in d["runs"]["restart"] if "parts" in r]
    if parts:
        lines.append("")
        lines.append("checkpoint and restart, where its time goes (first round): " +
                     ", ".join(f"{k} {v:.2f} s" for k, v in parts[0].items()))
    el = [r["result"] for r in d["runs"]["remap"] if r["ok"]]
    if el:
        lines.append(f"elastic remap, where its time goes (first round): the loss seen {el[0]['detect_s']:.3f} s "
                     f"after the kill, the remap and state copy issued in {el[0]['remap_s']:.3f} s, one step "
                     f"takes {el[0]['step_s']:.3f} s")
    back = [r["result"] for r in d["runs"]["drop"] if r["ok"] and "replace_s" in r["result"]]
    if back:
        lines.append(f"elastic drop, then a new host process in the killed one's place (pw.elastic.replace_host, "
                     f"first round): it joins the running cluster in {back[0]['replace_s']:.2f} s (process start "
                     f"included), the replica is back on it with its state copied (grow) in "
                     f"{back[0]['grow_s']:.2f} s; {back[0]['replicas_after']} replicas at the end")
    if medians["restart"] and medians["remap"]:
        lines.append(f"elastic remap recovers {medians['restart'] / medians['remap']:.0f}x faster than checkpoint "
                     f"and restart; dropping the replica {medians['restart'] / medians['drop']:.0f}x"
                     if medians["drop"] else "")
    return "\n".join(lines)


def plot_recovery(d: dict, ax) -> None:
    keys = ["remap", "drop", "restart"]
    names = ["elastic:\nremap", "elastic:\ndrop replica", "checkpoint\n+ restart"]
    vals = [_recovery_times(d, k)[0] or 0 for k in keys]
    ax.bar(names, vals, color=["tab:green", "tab:olive", "tab:red"])
    for i, v in enumerate(vals):
        ax.text(i, v, f"{v:.2f} s", ha="center", va="bottom", fontsize=9)
    ax.set_ylabel("kill to the next completed step (s)")
    ax.set_title("recovery from a killed host process")
    ax.grid(True, axis="y", alpha=0.3)


# --------------------------------------------------------------------------
# 3. Suspend and resume (pw.Client.suspend / resume) of 1 GiB of buffers.


def suspend_worker(gib: float, buffers: int) -> dict:
    import pathways as pw

    devices = pw.make_virtual_device_set().add_slice(tpu_devices=8).tpus
    client = pw.Client("suspended")
    per = int(gib * 2**30) // 4 // 8 // buffers
    with client:
        handles = [pw.device_put(np.full((8, per), i, np.float32), devices) for i in range(buffers)]
    pw.block_until_ready(handles)
    rounds = []
    for _ in range(3):
        s = client.suspend()
        r = client.resume()
        rounds.append({"suspend_s": s["seconds"], "resume_s": r["seconds"], "bytes": s["bytes"]})
    ok = all(float(np.asarray(x)[7, -1]) == i for i, x in enumerate(handles))
    return {"rounds": rounds, "bytes": rounds[0]["bytes"], "values_kept": ok}


def run_suspend(args, work_dir: str) -> dict:
    gib = 0.25 if args.quick else 1.0
    d: dict = {"gib": gib, "buffers": 16, "runs": {}}
    for key, env in (("in_process", {"PATHWAYS_TOPOLOGY": "islands=1,hosts_per_island=2,devices_per_host=4,"
                                                            "device_memory=2147483648"}),
                     ("local_processes", {"PATHWAYS_TOPOLOGY": "hosts=local_processes,islands=1,hosts_per_island=2,"
                                                                 "devices_per_host=4,device_memory=2147483648"})):
        h.log(f"[{NAME}] suspend/resume of {gib} GiB, hosts {key}")
        d["runs"][key] = h.run_isolated("recovery:suspend_worker", {"gib": gib, "buffers": 16}, env=env,
                                        timeout=900)
    return d


def report_suspend(d: dict) -> str:
    lines = [f"3. Suspend and resume: a client's {d['buffers']} buffers, {d['gib']:g} GiB in all, over 8 devices "
             "(client.suspend() to host memory, then client.resume() onto the same devices); median of 3 "
             "cycles in one process",
             "",
             f"{'hosts':<18}  {'suspend s':>9}  {'resume s':>8}  {'suspend GB/s':>12}  {'resume GB/s':>11}  values",
             f"{'-' * 18}  {'-' * 9}  {'-' * 8}  {'-' * 12}  {'-' * 11}  ------"]
    for key, run in d["runs"].items():
        if not run["ok"]:
            lines.append(f"{key:<18}  failed: {run['error']}")
            continue
        res = run["result"]
        sus = _median([r["suspend_s"] for r in res["rounds"]])
        rsm = _median([r["resume_s"] for r in res["rounds"]])
        lines.append(f"{key:<18}  {sus:9.2f}  {rsm:8.2f}  {res['bytes'] / sus / 1e9:12.2f}  "
                     f"{res['bytes'] / rsm / 1e9:11.2f}  {'kept' if res['values_kept'] else 'WRONG'}")
    return "\n".join(lines)


# --------------------------------------------------------------------------
# The sections: each measures, reports and draws its own part.


class Section(NamedTuple):
    key: str
    run: Callable[[Any, str], dict]  # (args, work dir) -> its data
    report: Callable[[dict], str]
    plot: Optional[Callable[[dict, Any], None]]  # (its data, a matplotlib Axes)


SECTIONS = [
    Section("throughput", run_throughput, report_throughput, plot_throughput),
    Section("recovery", run_recovery, report_recovery, plot_recovery),
    Section("suspend", run_suspend, report_suspend, None),
]


def plot(d: dict, path: str) -> None:
    plt = h.pyplot()
    drawn = [s for s in SECTIONS if s.plot and s.key in d["sections"]]
    if plt is None or not drawn:
        return
    fig, axes = plt.subplots(1, len(drawn), figsize=(9 * len(drawn), 5.5), squeeze=False)
    for s, ax in zip(drawn, axes[0]):
        s.plot(d["sections"][s.key], ax)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> None:
    p = h.argument_parser(__doc__.splitlines()[0])
    p.add_argument("--dir", default=None,
                   help="where checkpoints are written (a temporary directory under it, removed at the end; "
                        "default: the system's temporary directory)")
    p.add_argument("--only", choices=[s.key for s in SECTIONS], help="run only this section")
    p.add_argument("--rounds", type=int, default=None, help="rounds of every measurement (default 5, --quick 2)")
    args = p.parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    sw = h.Stopwatch()
    info = h.machine_info()
    work = tempfile.mkdtemp(prefix="pw_recovery_", dir=args.dir)
    st = os.statvfs(work)
    d: dict = {"quick": args.quick, "work_dir": work, "sections": {},
               "same_fs_as_results": os.stat(work).st_dev == os.stat(args.out_dir).st_dev,
               "fs_free_gib": st.f_bavail * st.f_frsize / 2**30}
    try:
        for s in SECTIONS:
            if args.only and s.key != args.only:
                continue
            d["sections"][s.key] = s.run(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    fs = _filesystem(work)
    parts = [h.machine_header(info),
             f"# checkpoints written under {os.path.dirname(work)} ({fs}"
             f"{', the same file system as the results' if d['same_fs_as_results'] else ', NOT the results file system'})",
             ""]
    parts += [s.report(d["sections"][s.key]) + "\n" for s in SECTIONS if s.key in d["sections"]]
    parts.append(f"total {sw.elapsed():.0f} s" + (" (--quick: a smoke run, not for the README)" if args.quick else ""))
    text = "\n".join(parts)
    print(text)
    d["machine"] = info
    d["filesystem"] = fs
    name = f"{NAME}_{args.only}" if args.only else NAME
    h.write_results(args.out_dir, name, text, d)
    plot(d, os.path.join(args.out_dir, f"{name}.png"))


def _filesystem(path: str) -> str:
    """The device and type of the mount that holds `path` (from /proc/mounts)."""
    best = ("", "?", "?")
    try:
        with open("/proc/mounts") as f:
            for line in f:
                dev, mnt, typ = line.split()[:3]
                if path.startswith(mnt) and len(mnt) >= len(best[0]):
                    best = (mnt, dev, typ)
    except OSError:
        pass
    return f"{best[1]} {best[2]} mounted on {best[0] or '?'}"


if __name__ == "__main__":
    main()
