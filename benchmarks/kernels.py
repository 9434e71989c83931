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
  model ops     f32, 4096x256 (1M elements) and 16384x1024 (16M), over the
                last axis: softmax (x - max, exp, / sum); layer norm with
                gamma and beta (mean, var, rsqrt(var + eps), scale, shift);
                GELU, tanh approximation (jax.nn.gelu's default); cross-entropy
                of logits and int32 labels (log-softmax, the label's entry
                picked by a one-hot compare with an iota, mean over rows);
                and one Adam step of a 1M / 16M parameter vector (p, g, m, v
                in; p, m, v out; the hyperparameters constants). Each is one
                function of `xp` (numpy, pathways.numpy or jax.numpy), built
                from the primitives all three have. Throughput = minimum
                traffic, as above.

Memory bandwidth is measured in the same run: a STREAM triad a = b + s*c over
16M float32 in C, compiled now (`cc -O3 -march=native`), on one thread per
core (a large fused loop runs in blocks on every executor thread), best of
several passes, 12 bytes per element; the one-thread figure is printed too. Every
non-matmul row's "share of limit" is its pathways throughput over the triad's;
the goal (issue 26) is >= 60% at 16M elements.

pathways, numpy, jax.jit (when jax is installed: the same functions on
jax.numpy, CPU backend) and the triad run in separate processes (one each,
in turn, in `ROUNDS` rounds), so no thread pool competes with another's;
each system's best round is reported (see `summarize`).
The pathways time per call is wall time with calls in flight, so it includes
dispatch; the device time is the median gang duration from `pw.timeline()`
(kernel only, no dispatch, no gap between gangs).

Target (issue): the 512x512 f32 matmul reaches at least half of numpy's
throughput in the same run (per-call time, dispatch included).

Usage: python benchmarks/kernels.py [--quick]
"""

from __future__ import annotations

import math
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
ROUNDS = 3  # pathways, numpy, jax and triad processes, repeated
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
    # rows x cols ("rc"), the reductions over the last axis; adam over an n-vector.
    {"key": "softmax_f32_1M", "op": "softmax", "dtype": "float32", "rc": [4096, 256], "expr": "softmax"},
    {"key": "softmax_f32_16M", "op": "softmax", "dtype": "float32", "rc": [16384, 1024],
     "expr": "softmax"},
    {"key": "layernorm_f32_1M", "op": "layer norm", "dtype": "float32", "rc": [4096, 256],
     "expr": "layernorm"},
    {"key": "layernorm_f32_16M", "op": "layer norm", "dtype": "float32", "rc": [16384, 1024],
     "expr": "layernorm"},
    {"key": "gelu_f32_1M", "op": "gelu (tanh)", "dtype": "float32", "rc": [4096, 256], "expr": "gelu"},
    {"key": "gelu_f32_16M", "op": "gelu (tanh)", "dtype": "float32", "rc": [16384, 1024], "expr": "gelu"},
    {"key": "adam_f32_1M", "op": "adam update", "dtype": "float32", "n": M, "expr": "adam"},
    {"key": "adam_f32_16M", "op": "adam update", "dtype": "float32", "n": 16 * M, "expr": "adam"},
    {"key": "xent_f32_1M", "op": "cross-entropy", "dtype": "float32", "rc": [4096, 256], "expr": "xent"},
    {"key": "xent_f32_16M", "op": "cross-entropy", "dtype": "float32", "rc": [16384, 1024],
     "expr": "xent"},
]
GOAL_SIZE = 16 * M  # elements of the rows the bandwidth goal applies to
GOAL_SHARE = 0.6  # of the triad's bandwidth (issue 26)
TRIAD_N = 16 * M  # float32 elements per triad array (3 x 64 MiB, far out of cache)
TRIAD_REPS = 10

# Constants of the rows (Python floats: weakly typed, the arrays stay float32).
LN_EPS = 1e-5
ADAM_LR, ADAM_B1, ADAM_B2, ADAM_EPS, ADAM_STEP = 1e-3, 0.9, 0.999, 1e-8, 10
GELU_C = math.sqrt(2.0 / math.pi)


def _rsqrt(xp, v):
    """1 / sqrt(v): pathways.numpy's rsqrt, jax.lax's for jax.numpy (which has none), else
    numpy's 1 / sqrt."""
    if hasattr(xp, "rsqrt"):
        return xp.rsqrt(v)
    if xp.__name__.startswith("jax"):
        import jax.lax

        return jax.lax.rsqrt(v)
    return 1 / xp.sqrt(v)


def _softmax(xp, x):
    e = xp.exp(x - xp.max(x, axis=-1, keepdims=True))
    return e / xp.sum(e, axis=-1, keepdims=True)


def _layernorm(xp, x, gamma, beta):
    mean = xp.mean(x, axis=-1, keepdims=True)
    centered = x - mean
    var = xp.mean(centered * centered, axis=-1, keepdims=True)
    return centered * _rsqrt(xp, var + LN_EPS) * gamma + beta


def _gelu(xp, x):
    """jax.nn.gelu's default (approximate=True)."""
    return 0.5 * x * (1 + xp.tanh(GELU_C * (x + 0.044715 * (x * x * x))))


def _adam(xp, p, g, m, v):
    """One bias-corrected Adam step at step ADAM_STEP: the new (p, m, v)."""
    m = ADAM_B1 * m + (1 - ADAM_B1) * g
    v = ADAM_B2 * v + (1 - ADAM_B2) * (g * g)
    c1, c2 = 1 - ADAM_B1**ADAM_STEP, 1 - ADAM_B2**ADAM_STEP
    return p - (ADAM_LR / c1) * m / (xp.sqrt(v / c2) + ADAM_EPS), m, v


def _xent(xp, logits, labels):
    """Mean over rows of -log softmax(logits)[label], the label's entry picked by a
    one-hot compare with an iota."""
    shifted = logits - xp.max(logits, axis=-1, keepdims=True)
    logp = shifted - xp.log(xp.sum(xp.exp(shifted), axis=-1, keepdims=True))
    one_hot = xp.expand_dims(labels, -1) == xp.arange(logits.shape[-1], dtype=xp.int32)
    return -xp.mean(xp.sum(xp.where(one_hot, logp, 0.0), axis=-1))


_EXPRS = {
    "arith": lambda xp, a, b: (a * 2 + b) * a - 1,
    "tanh": lambda xp, a, b: xp.tanh(a * 2 + b) * a - 1,
    "softmax": _softmax,
    "layernorm": _layernorm,
    "gelu": _gelu,
    "adam": _adam,
    "xent": _xent,
}

# Per row: allclose(pathways or jax, numpy's float32 result, rtol, atol). The
# reductions sum in another order than numpy's pairwise sums, and the mean of
# cross-entropy adds up 4096-16384 rows.
TOLERANCE = {"arith": (1e-5, 1e-6), "tanh": (1e-5, 1e-6), "softmax": (1e-5, 1e-7),
             "layernorm": (1e-4, 1e-5), "gelu": (1e-5, 1e-6), "adam": (1e-5, 1e-7),
             "xent": (1e-4, 0.0)}


def _expr(name: str, xp):
    """The elementwise function `name` with `xp` = numpy, pathways.numpy (traced) or
    jax.numpy."""
    return lambda *args: _EXPRS[name](xp, *args)


def _is_matmul(case: dict) -> bool:
    return "mnk" in case


def _signature(case: dict) -> tuple:
    """An elementwise row's inputs, as (shape, dtype, fill), and outputs, as (shape, dtype)."""
    dt, e = case["dtype"], case["expr"]
    if "rc" in case:
        r, c = case["rc"]
        x = ((r, c), dt, "normal")
        ins = {"softmax": [x], "gelu": [x], "layernorm": [x, ((c,), dt, "normal"), ((c,), dt, "normal")],
               "xent": [x, ((r,), "int32", "labels")]}[e]
        return ins, ([((), dt)] if e == "xent" else [((r, c), dt)])
    n = (case["n"],)
    if e == "adam":  # p, g, m, v (v >= 0) -> p, m, v
        return [(n, dt, "normal")] * 3 + [(n, dt, "positive")], [(n, dt)] * 3
    return [(n, dt, "uniform")] * 2, [(n, dt)]


def _nbytes(specs) -> int:
    import numpy as np

    return sum(int(np.prod(shape)) * np.dtype(dt).itemsize for shape, dt, *_ in specs)


def _elements(case: dict) -> int:
    return case["n"] if "n" in case else case["rc"][0] * case["rc"][1]


def work_per_call(case: dict) -> float:
    """FLOPs (matmul) or bytes of minimum traffic (elementwise: every input read once,
    every output written once) per call."""
    if _is_matmul(case):
        m, n, k = case["mnk"]
        return 2.0 * case.get("batch", 1) * m * n * k
    ins, outs = _signature(case)
    return float(_nbytes(ins) + _nbytes(outs))


def shape_text(case: dict) -> str:
    if _is_matmul(case):
        m, n, k = case["mnk"]
        b = f"{case['batch']}x" if case.get("batch") else ""
        return f"{b}{m}x{k} @ {b}{k}x{n}"
    if "rc" in case:
        return "x".join(map(str, case["rc"]))
    n = case["n"]
    return f"{n // M}M" if n % M == 0 else str(n)


def _inputs(case: dict) -> tuple:
    import numpy as np

    rng = np.random.default_rng(0)
    dt = np.dtype(case["dtype"])
    if _is_matmul(case):
        m, n, k = case["mnk"]
        lead = (case["batch"],) if case.get("batch") else ()
        return (rng.standard_normal(lead + (m, k)).astype(dt),
                rng.standard_normal(lead + (k, n)).astype(dt))
    fills = {"uniform": lambda shape: rng.uniform(-1, 1, shape),
             "normal": lambda shape: rng.standard_normal(shape),
             "positive": lambda shape: rng.uniform(0, 1, shape),
             "labels": lambda shape: rng.integers(0, case["rc"][1], shape)}
    return tuple(fills[fill](shape).astype(d) for shape, d, fill in _signature(case)[0])


def _leaves(out) -> list:
    """A row's outputs as a list (adam has three)."""
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _check(case: dict, got: list, ref) -> dict:
    """{"ok", "max_err"}: `got` (the outputs, numpy) against numpy's result `ref`."""
    import numpy as np

    rtol, atol = TOLERANCE[case["expr"]]
    ref = [np.asarray(r) for r in _leaves(ref)]
    err = max(float(np.max(np.abs(g.astype(np.float64) - r))) for g, r in zip(got, ref))
    ok = len(got) == len(ref) and all(
        g.shape == r.shape and g.dtype == r.dtype and np.allclose(g, r, rtol=rtol, atol=atol)
        for g, r in zip(got, ref))
    return {"ok": bool(ok), "max_err": err}


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
        args = _inputs(case)
        fn = (lambda a, b: a @ b) if _is_matmul(case) else _expr(case["expr"], pnp)
        f = pw.pmap(fn, devices=tpu)
        dev = [pw.device_put(x[None], tpu) for x in args]
        t0 = time.perf_counter()
        first = [np.asarray(o)[0] for o in _leaves(f(*dev))]  # trace + compile + one run
        first_s = time.perf_counter() - t0
        # Native code for the fused loops is compiled in the background after
        # the second run (PATHWAYS_NATIVE_AFTER_RUNS); wait for it, then check
        # what it computes.
        [o.block_until_ready() for o in _leaves(f(*dev))]
        t0 = time.perf_counter()
        pw.wait_for_native_kernels()
        native_wait_s = time.perf_counter() - t0
        first = [np.asarray(o)[0] for o in _leaves(f(*dev))]
        to_check.append((case, args, first))
        issue, wait = (lambda: f(*dev)), (lambda out: [o.block_until_ready() for o in _leaves(out)])
        # Every call in flight holds its outputs' device memory.
        max_calls = max(1, OUTPUTS_IN_FLIGHT_BYTES // sum(o.nbytes for o in first))
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
        m["native_wait_s"] = native_wait_s
        out["cases"][case["key"]] = m
        for d in dev:
            d.delete()
    out["native"] = pw.native_kernel_stats()
    # Checks last: the reference calls numpy's BLAS, whose threads would
    # otherwise still be spinning while pathways is timed.
    for case, args, got in to_check:
        if _is_matmul(case):
            x, y = args
            ref = x.astype(np.float64) @ y.astype(np.float64)
            err = float(np.max(np.abs(got[0] - ref)) / max(1e-30, float(np.max(np.abs(ref)))))
            check = {"ok": bool(err < (1e-5 if case["dtype"] == "float32" else 1e-12)), "max_err": err}
        else:
            check = _check(case, got, _expr(case["expr"], np)(*args))
        out["cases"][case["key"]]["check"] = check
    return out


def np_worker(cases: list, seconds: float, warmup: float) -> dict:
    import numpy as np

    out = {"numpy": np.__version__, "blas": _numpy_blas(), "env": _env_threads(), "cases": {}}
    for case in cases:
        args = _inputs(case)
        fn = (lambda a, b: a @ b) if _is_matmul(case) else _expr(case["expr"], np)
        out["cases"][case["key"]] = measure_batches(lambda: fn(*args), lambda _: None, seconds=seconds,
                                                    warmup=warmup, max_calls=10**6)
    return out


def jax_worker(cases: list, seconds: float, warmup: float) -> dict:
    """`jax.jit` of each elementwise row's function (jax.numpy) on the CPU backend."""
    import time

    import numpy as np

    import jax
    import jax.numpy as jnp

    out = {"jax": jax.__version__, "backend": jax.default_backend(), "cases": {}}
    to_check = []
    for case in cases:
        if _is_matmul(case):
            continue
        args = _inputs(case)
        f = jax.jit(_expr(case["expr"], jnp))
        dev = [jax.device_put(x) for x in args]
        t0 = time.perf_counter()
        first = [np.asarray(o) for o in _leaves(f(*dev))]  # trace + compile + one run
        first_s = time.perf_counter() - t0
        to_check.append((case, args, first))
        max_calls = max(1, OUTPUTS_IN_FLIGHT_BYTES // sum(o.nbytes for o in first))
        cpu0, wall0 = time.process_time(), time.perf_counter()
        m = measure_batches(lambda: f(*dev), jax.block_until_ready, seconds=seconds, warmup=warmup,
                            max_calls=max_calls)
        # XLA:CPU may spread a kernel over threads; numpy and a pathways gang use one.
        m["cpu_per_wall"] = (time.process_time() - cpu0) / (time.perf_counter() - wall0)
        m["first_call_s"] = first_s
        out["cases"][case["key"]] = m
    for case, args, got in to_check:
        out["cases"][case["key"]]["check"] = _check(case, got, _expr(case["expr"], np)(*args))
    return out


TRIAD_C = r"""
#include <pthread.h>

void triad(float *restrict a, const float *restrict b, const float *restrict c, float s, long n) {
  for (long i = 0; i < n; ++i) a[i] = b[i] + s * c[i];
}

struct part { float *a; const float *b, *c; float s; long n; };

static void *run_part(void *p) {
  struct part *q = p;
  triad(q->a, q->b, q->c, q->s, q->n);
  return 0;
}

/* The same over `threads` threads, each its own contiguous part (threads <= 64). */
void triad_threads(float *a, const float *b, const float *c, float s, long n, int threads) {
  pthread_t t[64];
  struct part parts[64];
  for (int i = 0; i < threads; ++i) {
    long lo = n * i / threads, hi = n * (i + 1) / threads;
    parts[i] = (struct part){a + lo, b + lo, c + lo, s, hi - lo};
    if (i > 0) pthread_create(&t[i], 0, run_part, &parts[i]);
  }
  run_part(&parts[0]);
  for (int i = 1; i < threads; ++i) pthread_join(t[i], 0);
}
"""


def triad_worker(n: int, reps: int) -> dict:
    """This machine's memory bandwidth: the STREAM triad a = b + s*c over `n` float32,
    compiled now with the system C compiler, on one thread and on one thread per core
    (threads started in each pass, which the pass's time includes); the best of `reps`
    passes each, counted as 12 bytes per element (b and c read, a written)."""
    import ctypes
    import subprocess
    import tempfile
    import time

    import numpy as np

    cmd = ["cc", "-O3", "-march=native", "-shared", "-fPIC", "-pthread"]
    with tempfile.TemporaryDirectory(prefix="pw_triad_") as d:
        src, lib_path = os.path.join(d, "triad.c"), os.path.join(d, "triad.so")
        with open(src, "w") as f:
            f.write(TRIAD_C)
        subprocess.run(cmd + ["-o", lib_path, src], check=True, capture_output=True, text=True)
        lib = ctypes.CDLL(lib_path)
    version = subprocess.run(["cc", "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    lib.triad_threads.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_float, ctypes.c_long, ctypes.c_int]
    lib.triad_threads.restype = None
    a, b, c = np.zeros(n, np.float32), np.full(n, 1.0, np.float32), np.full(n, 2.0, np.float32)
    ptr = [x.ctypes.data for x in (a, b, c)]
    cores = min(64, os.cpu_count() or 1)
    out = {"compiler": f"{' '.join(cmd[:3])}; {version}", "n": n, "bytes_per_pass": 12 * n,
           "cores": cores}
    for key, threads in (("one_thread", 1), ("all_cores", cores)):
        times = []
        for _ in range(reps + 1):  # the first pass warms up (and is dropped)
            a[:] = 0
            t0 = time.perf_counter()
            lib.triad_threads(*ptr, 3.0, n, threads)
            times.append(time.perf_counter() - t0)
        times = times[1:]
        if not (a[0] == 7.0 and a[-1] == 7.0 and a[n // 2] == 7.0):
            raise RuntimeError(f"triad computed {a[0]}, not 7")
        out[key] = {"seconds": times, "gb_per_s": 12 * n / min(times) / 1e9}
    # The limit: the machine's bandwidth, as a gang's kernels may use every
    # executor thread (one per core).
    out["gb_per_s"] = max(out["one_thread"]["gb_per_s"], out["all_cores"]["gb_per_s"])
    return out


# --------------------------------------------------------------------------
# The run.


def sweep(args) -> dict:
    seconds, warmup, rounds = (0.3, 0.1, 1) if args.quick else (0.6, 0.15, ROUNDS)
    kw = {"cases": CASES, "seconds": seconds, "warmup": warmup}
    has_jax = h.has_module("jax")
    cpu0 = h.cpu_times()
    runs = []
    for r in range(rounds):
        run = {}
        for system, target, env, timeout in [
                ("pathways", "kernels:pw_worker", {"PATHWAYS_TOPOLOGY": TOPOLOGY}, 300),
                ("numpy", "kernels:np_worker", None, 300),
                ("jax", "kernels:jax_worker", {"JAX_PLATFORMS": "cpu"}, 300),
                ("triad", "kernels:triad_worker", None, 120)]:
            if system == "jax" and not has_jax:
                continue
            h.log(f"[{NAME}] round {r + 1}/{rounds}: {system}")
            kwargs = {"n": TRIAD_N, "reps": TRIAD_REPS} if system == "triad" else kw
            run[system] = h.run_isolated(target, kwargs, env=env, timeout=timeout)
        runs.append(run)
    return {"seconds": seconds, "warmup": warmup, "rounds": rounds, "runs": runs, "has_jax": has_jax,
            "steal": h.steal_fraction(cpu0, h.cpu_times())}


def triad_bandwidth(data: dict) -> dict:
    """The triad's best GB/s over rounds ("gb_per_s", absent if never measured), every
    round's, and the errors."""
    rates = [r["triad"]["result"]["gb_per_s"] for r in data["runs"] if r["triad"]["ok"]]
    out = {"rounds": rates, "errors": [r["triad"]["error"] for r in data["runs"] if not r["triad"]["ok"]]}
    if rates:
        out["gb_per_s"] = max(rates)
        ok = [r["triad"]["result"] for r in data["runs"] if r["triad"]["ok"]]
        out["compiler"] = ok[0]["compiler"]
        out["cores"] = ok[0].get("cores", 1)
        singles = [x["one_thread"]["gb_per_s"] for x in ok if "one_thread" in x]
        if singles:
            out["one_thread"] = max(singles)
    return out


def summarize(data: dict) -> dict:
    """Per case and system: the median batch of each round, then the best round.

    Other work on this 2-core machine only ever slows a round down (a BLAS
    call whose second thread loses its core can take 100x longer), so the
    best round is the estimate of the undisturbed speed, for every system
    alike (and for the triad); the per-round ratios show how much the rounds
    disagreed.
    """
    triad = triad_bandwidth(data).get("gb_per_s")
    out = {}
    for case in CASES:
        key, work = case["key"], work_per_call(case)
        rates = {"pathways": [], "numpy": [], "jax": []}
        dev_us, busy, sync_rates = [], [], []
        round_ratios, checks, jax_checks, errors = [], [], [], []
        for run in data["runs"]:
            got = {}
            for system in rates:
                r = run.get(system)
                if r is None:
                    continue
                if not r["ok"]:
                    errors.append(f"{system}: {r['error']}")
                    continue
                c = r["result"]["cases"].get(key)
                if c:
                    got[system] = c
                    rates[system].append(c["per_s"])
            pc = got.get("pathways")
            if pc:
                dev_us.append(statistics.median(pc["device_us"]))
                busy.append(pc["device_busy"])
                checks.append(pc["check"])
                if "sync" in pc:
                    sync_rates.append(pc["sync"]["per_s"])
            if "jax" in got:
                jax_checks.append(got["jax"]["check"])
            if pc and "numpy" in got:
                round_ratios.append(pc["per_s"] / got["numpy"]["per_s"])
        s = {"case": case, "errors": errors, "round_ratios": round_ratios, "checks": checks,
             "jax_checks": jax_checks}
        for system, prefix in (("pathways", "pw"), ("numpy", "np"), ("jax", "jax")):
            if rates[system]:
                s[f"{prefix}_us"] = 1e6 / max(rates[system])
                s[f"{prefix}_thru"] = work / (s[f"{prefix}_us"] * 1e-6)
        if busy:
            s["busy"] = statistics.median(busy)
        if sync_rates:
            s["sync_us"] = 1e6 / max(sync_rates)
            s["sync_thru"] = work / (s["sync_us"] * 1e-6)
        if dev_us:
            s["dev_us"] = min(dev_us)
            s["dev_thru"] = work / (s["dev_us"] * 1e-6)
        if "pw_thru" in s and "np_thru" in s:
            s["ratio"] = s["pw_thru"] / s["np_thru"]
        if "dev_thru" in s and "np_thru" in s:
            s["dev_ratio"] = s["dev_thru"] / s["np_thru"]
        if "pw_thru" in s and "jax_thru" in s:
            s["jax_ratio"] = s["pw_thru"] / s["jax_thru"]
        if "pw_thru" in s and triad and not _is_matmul(case):
            s["share"] = s["pw_thru"] / (triad * 1e9)
        out[key] = s
    return out


def _thru(x) -> str:
    if x is None:
        return "-"
    return f"{x / 1e9:.1f}" if x < 1e11 else f"{x / 1e9:.0f}"


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def _ratio(s: dict, field: str) -> str:
    return f"{s[field]:.2f}" if field in s else "-"


def report(data: dict, summary: dict, info: dict, elapsed: float) -> str:
    lines = [h.machine_header(info), ""]
    systems = "pathways process, numpy process, " + ("jax process, " if data["has_jax"] else "")
    lines.append(
        f"Kernels on one simulated device ({TOPOLOGY}) vs numpy"
        + (" and jax.jit (CPU)" if data["has_jax"] else "")
        + f", same shapes; {data['rounds']} round(s) of ({systems}triad process), "
        f"{data['seconds']:.2f} s per row and system in 3 batches after {data['warmup']:.2f} s warm-up"
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
            _pct(s.get("busy")),
            h.fmt_us(s.get("np_us")),
            h.fmt_us(s.get("jax_us")),
            _thru(s.get("pw_thru")),
            _thru(s.get("dev_thru")),
            _thru(s.get("np_thru")),
            _thru(s.get("jax_thru")),
            unit,
            _ratio(s, "ratio"),
            (f"{min(rr):.2f}-{max(rr):.2f}" if len(rr) > 1 else "-"),
            _ratio(s, "dev_ratio"),
            _ratio(s, "jax_ratio"),
            _pct(s.get("share")),
        ])
    lines.append(h.table(
        ["op", "shape", "pw/call", "pw device", "busy", "numpy/call", "jax/call", "pw", "pw device",
         "numpy", "jax", "unit", "ratio", "(rounds)", "ratio dev", "pw/jax", "share of limit"],
        rows, align="llrrrrrrrrrlrrrrr"))
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
    lines += _bandwidth_lines(data, summary)
    tol = ", ".join(f"{e} {r:g}/{a:g}" for e, (r, a) in TOLERANCE.items())
    lines.append("pathways results checked against numpy (matmul vs float64 reference, rel. err < 1e-5 "
                 f"f32 / 1e-12 f64; the other rows allclose to numpy's float32 result, rtol/atol {tol}): "
                 + _checked(summary, "checks", CASES))
    if data["has_jax"]:
        lines.append("jax.jit results checked against numpy (the same tolerances): "
                     + _checked(summary, "jax_checks", [c for c in CASES if not _is_matmul(c)]))
    else:
        lines.append(f"jax.jit columns: jax {h.MISSING}")
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
    jax_runs = [r["jax"]["result"] for r in data["runs"] if r.get("jax", {}).get("ok")]
    if jax_runs:
        cores = [c["cpu_per_wall"] for j in jax_runs for c in j["cases"].values()]
        lines.append(f"jax {jax_runs[0]['jax']} on {jax_runs[0]['backend']}: CPU seconds per wall second "
                     f"while timed {min(cores):.2f}-{max(cores):.2f} (1 = one thread)")
    loads = []
    for i, r in enumerate(data["runs"]):
        for sysname, res in r.items():
            la = res.get("load_at_start")
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
        "  jax/call: jax.jit of the same function (jax.numpy) on the CPU backend, the same way",
        "  (k calls dispatched, then block_until_ready on the last output).",
        "- throughput: matmul 2*m*n*k (*batch) FLOP per call; the other rows the minimum traffic:",
        "  every input read once and every output written once: bytes per element 12 for the",
        "  chains (a, b, out), 8 for softmax and gelu (x, out), 8 for layer norm (x, out; plus",
        "  gamma and beta once), 28 for adam (p, g, m, v in; p, m, v out), 4 for cross-entropy",
        "  (logits; plus the labels and the loss), whatever either side really moves (numpy writes",
        "  and rereads a temporary per op). ratio = pathways per-call throughput / numpy; (rounds) =",
        "  the same ratio in each round; ratio dev = pathways device-time throughput / numpy;",
        "  pw/jax = pathways per-call throughput / jax.jit's.",
        "- share of limit: pathways per-call throughput / the triad's bandwidth measured in the same",
        "  run (a[i] = b[i] + s*c[i] in C on one thread per core, as a large fused loop runs in",
        "  blocks on every executor thread; 12 bytes per element; the triad writes into memory it",
        "  has already touched, while every pathways call writes fresh output memory).",
        "- each round runs pathways, then numpy, jax and the triad, each in its own process (their",
        "  thread pools never compete). A cell is the median of 3 batches in the best round for that",
        "  system: other work on this 2-core VM only slows a round down (a BLAS call whose second",
        "  thread loses its core can take 100x longer). (rounds) = min-max of the per-round ratios;",
        "  busy = median over rounds. The JSON keeps every batch and every recorded gang duration.",
        "- elementwise: numpy ufuncs run on one thread; pathways runs a fused loop of 64K elements",
        "  or more in blocks on its executor threads, and XLA:CPU splits a large fused loop over its",
        "  thread pool (the CPU seconds per wall second above: up to 2 on this 2-core VM), so both",
        "  use both cores. tanh rows measure the transcendental more than memory.",
        "",
        f"total time {elapsed:.0f} s",
    ]
    return "\n".join(lines)


def _checked(summary: dict, field: str, cases: list) -> str:
    """"all ok", or the rows whose check failed or is missing (with the largest error)."""
    bad = []
    for case in cases:
        checks = summary[case["key"]][field]
        if not checks or not all(c["ok"] for c in checks):
            err = max((c["max_err"] for c in checks), default=None)
            bad.append(case["key"] + (f" (max abs err {err:.2g})" if err is not None else " (missing)"))
    return "all ok" if not bad else "WRONG or missing: " + ", ".join(bad)


def _bandwidth_lines(data: dict, summary: dict) -> list:
    """The triad's bandwidth, and the goal's verdict for each row at GOAL_SIZE elements."""
    t = triad_bandwidth(data)
    if "gb_per_s" not in t:
        return ["memory bandwidth (triad): not measured (" + "; ".join(t["errors"]) + "); "
                f"goal (pathways >= {GOAL_SHARE:.0%} of it at {GOAL_SIZE // M}M elements): not decided"]
    one = t.get("one_thread")
    lines = [f"memory bandwidth, triad a = b + s*c over {TRIAD_N // M}M float32 on "
             f"{t.get('cores', 1)} threads ({t['compiler']}): {t['gb_per_s']:.1f} GB/s, best of "
             f"{TRIAD_REPS} passes"
             + (f"; per round: {', '.join(f'{r:.1f}' for r in t['rounds'])}" if len(t["rounds"]) > 1 else "")
             + (f" (one thread: {one:.1f} GB/s)" if one else "")]
    verdicts = []
    for case in CASES:
        s = summary[case["key"]]
        if _is_matmul(case) or _elements(case) != GOAL_SIZE:
            continue
        v = "not measured" if "share" not in s else \
            f"{s['share']:.0%} {'PASS' if s['share'] >= GOAL_SHARE else 'MISS'}"
        verdicts.append(f"{case['op']} {v}")
    met = sum(v.endswith("PASS") for v in verdicts)
    lines.append(f"goal: pathways per-call throughput >= {GOAL_SHARE:.0%} of the triad at "
                 f"{GOAL_SIZE // M}M elements: {met} of {len(verdicts)} rows; " + ", ".join(verdicts))
    return lines


def _short_label(case: dict) -> str:
    dt = "f32" if case["dtype"] == "float32" else "f64"
    if _is_matmul(case):
        m = case["mnk"][0]
        return f"bmm {dt}\n{case['batch']}x{m}" if case.get("batch") else f"{dt}\n{m}"
    return f"{case['expr']}\n{shape_text(case)}"


def plot(summary: dict, path: str, triad_gb_per_s=None) -> None:
    plt = h.pyplot()
    if plt is None:
        return
    groups = [("matmul (GFLOP/s)", [c for c in CASES if _is_matmul(c)]),
              ("fused elementwise and reductions (GB/s, minimum traffic)",
               [c for c in CASES if not _is_matmul(c)])]
    fig, axes = plt.subplots(2, 1, figsize=(14, 9), gridspec_kw={"height_ratios": [1, 1]})
    series = [("pw_thru", "pathways (per call)", "tab:blue"),
              ("dev_thru", "pathways (device time)", "lightsteelblue"),
              ("np_thru", "numpy", "tab:orange"),
              ("jax_thru", "jax.jit", "tab:green")]
    for ax, (title, cases) in zip(axes, groups):
        xs = list(range(len(cases)))
        shown = [f for f in series if any(summary[c["key"]].get(f[0]) for c in cases)]
        width = 0.8 / max(1, len(shown))
        for j, (field, label, color) in enumerate(shown):
            ys = [(summary[c["key"]].get(field) or 0) / 1e9 for c in cases]
            ax.bar([x + (j - (len(shown) - 1) / 2) * width for x in xs], ys, width, label=label,
                   color=color)
        for x, c in zip(xs, cases):
            s = summary[c["key"]]
            if "ratio" in s:
                top = max((s.get(f) or 0) for f, _, _ in series) / 1e9
                ax.annotate(f"{s['ratio']:.2f}x", (x, top), ha="center", va="bottom", fontsize=8)
        if triad_gb_per_s and not _is_matmul(cases[0]):
            ax.axhline(triad_gb_per_s, color="gray", linestyle="--", linewidth=1,
                       label=f"triad (memory bandwidth) {triad_gb_per_s:.1f} GB/s")
            ax.axhline(GOAL_SHARE * triad_gb_per_s, color="gray", linestyle=":", linewidth=1,
                       label=f"goal: {GOAL_SHARE:.0%} of the triad")
        ax.set_xticks(xs)
        ax.set_xticklabels([_short_label(c) for c in cases], fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Kernels on one simulated device vs numpy and jax.jit "
                 "(labels: pathways per-call / numpy)", fontsize=11)
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
    data["triad"] = triad_bandwidth(data)
    h.write_results(args.out_dir, NAME, text, data)
    plot(summary, os.path.join(args.out_dir, f"{NAME}.png"), data["triad"].get("gb_per_s"))


if __name__ == "__main__":
    main()
