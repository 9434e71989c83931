"""Transformer: a decoder-only LM train step (forward, backward, Adam), pathways vs JAX.

One train step = forward + backward + Adam, written once as a JAX user would
write it and run with `xp` = `pathways.numpy` inside `pw.pmap`, or
`jax.numpy` inside `jax.jit` / `jax.pmap`:

  tokens -> token embedding (wte[tokens]) + learned position embedding
  -> L pre-layer-norm blocks: x + attn(ln1(x)); x + mlp(ln2(x))
     attn: one QKV matmul, H heads, causal softmax(q k^T / sqrt(dh)), output matmul
     mlp:  gelu (tanh approximation) over a 4*d hidden layer
  -> final layer norm -> logits = x @ wte^T (tied output projection)
  -> mean softmax cross-entropy of the next token
  -> Adam (lr 1e-3, b1 0.9, b2 0.999, eps 1e-8, bias-corrected), by hand:
     (params, Adam state m/v/t, tokens) in, (params, state, loss) out, one
     compiled function.

Sizes (float32, vocabulary 256):
  small  2 layers, d_model 64,  4 heads, sequence 32,  batch 16 sequences (512 tokens/step)
  large  4 layers, d_model 256, 4 heads, sequence 128, batch  8 sequences (1024 tokens/step)

Configurations, each in a fresh process (`_harness.run_isolated`), all in one run:
  pw 1 dev     pw.pmap over a 1-device slice (PATHWAYS_TOPOLOGY: 1 host x 1 device)
  pw DP n      pw.pmap over an n-device slice, n = 2, 4 (1 host x n devices, the
               other benchmarks' topology_for(n)): each device holds B/n sequences,
               gradients and loss averaged with pw.pmean; tokens/s counts global tokens
  jax.jit      one XLA:CPU device
  jax.pmap n   n = 2, 4 forced host devices (XLA_FLAGS=--xla_force_host_platform_device_count=n)

Measured: tokens/s (per process, the median of 3 timed slices after a
warm-up; reported, the median over ROUNDS rounds, each round running every
configuration once in turn, so pathways and its peers are interleaved; every
step's loss is waited for before the next step is issued: "sync"; pathways and
jax.jit also with up to 2 steps in flight: "async"), and trace+compile time
of the step (pathways: `PmapFunction.compiled(...)`, which traces, compiles
and lowers without running; JAX: `.lower(...)` + `.compile()`), plus the
first call's extra time over a steady step for pathways.

Checked: from the same seeded numpy parameters and batches, the losses of
the first CHECK_STEPS steps on pathways 1 device match jax.jit (relative
1e-5), pathways data parallel matches pathways 1 device and jax.pmap matches
jax.jit (same global batch, relative DP_RTOL). A mismatch prints a FAILED
line and the script exits with code 1.

Targets (issue 26): pathways 1 device >= 1.1x jax.jit tokens/s at both
sizes; pathways DP over 2 devices >= 1.6x pathways 1 device; pathways
trace+compile >= 10x faster than JAX's (trace + XLA compile).

A pathways device splits a large product or fused loop over every executor
thread (as XLA:CPU's intra-op pool does for jax.jit), so one device already
uses both cores of this VM. Two more configurations give each device one
thread (`intra_op_threads=1`), as devices of one core each: "pathways 1
device, 1 thread" and "pathways DP 2 devices, 1 thread each"; their ratio is
the data-parallel speedup of the runtime itself.

The same LM written with Flax (`flax.linen`: nn.Embed with a tied `attend`
output, nn.SelfAttention with a causal mask, nn.LayerNorm, nn.Dense, gelu)
and optax.adam, unchanged, is run in three more configurations: "flax pw 1
dev" and "flax pw DP 2" (`pw.pmap` of the Flax step: JAX traces it, pathways
lowers the jaxpr) and "flax jax.jit". Measured: tokens/s as above, and the
first call of a fresh step function (trace + translate + compile + run, the
loss fetched). Checked: Flax on pathways 1 device vs Flax on jax.jit, DP 2
vs 1 device (relative 1e-5). Targets (issue 24): the first call on pathways
at most half of jax.jit's; tokens/s on 1 device at least jax.jit's; DP over
2 devices at least 1.6x 1 device.

`--profile` instead runs the pathways 1-device step (size `--profile-size`,
default large) for `--profile-seconds` under `perf record -g` and prints the
top symbols (and a pw.timeline() summary of the same window).

Usage: python benchmarks/transformer.py [--quick] [--profile [--profile-size small|large]]
"""

from __future__ import annotations

import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _harness as h  # noqa: E402

NAME = "transformer"
VOCAB = 256
SIZES = {
    "small": {"layers": 2, "d_model": 64, "heads": 4, "seq": 32, "batch": 16, "vocab": VOCAB},
    "large": {"layers": 4, "d_model": 256, "heads": 4, "seq": 128, "batch": 8, "vocab": VOCAB},
}
LR, B1, B2, EPS = 1e-3, 0.9, 0.999, 1e-8
CHECK_STEPS = 3
JIT_RTOL = 1e-5  # pathways 1 device vs jax.jit, relative, per step's loss
DP_RTOL = 1e-5  # data parallel vs 1 device (same global batch), relative
DP_DEVICES = (2, 4)
ROUNDS = 3  # every configuration once per round, in turn (--quick: 1)
IN_FLIGHT = 2  # "async" (small size only): steps in flight
TIMELINE_STEPS = 3  # at least this many steps (and 1 s) recorded with pw.timeline for the device time
TARGET_JIT_RATIO = 1.1  # issue 26
TARGET_FLAX_JIT_RATIO = 1.0  # issue 24
TARGET_DP2_SPEEDUP = 1.6
TARGET_COMPILE_SPEEDUP = 10.0
TARGET_FLAX_FIRST_CALL = 0.5  # pathways' first call / jax.jit's
FLAX_DP_DEVICES = (2,)


def tokens_per_step(cfg: dict) -> int:
    return cfg["batch"] * cfg["seq"]


# --------------------------------------------------------------------------
# The model, written once over an `ops` namespace (pathways or JAX).


class PathwaysOps:
    """What the model needs, from pathways (`pw.numpy`, `pw.nn`)."""

    def __init__(self):
        import pathways as pw
        import pathways.numpy as pnp

        self.xp = pnp
        self.softmax = pw.nn.softmax
        self.log_softmax = pw.nn.log_softmax
        self.gelu = pw.nn.gelu
        self.layer_norm = pw.nn.layer_norm
        self.one_hot = pw.nn.one_hot
        self.value_and_grad = pw.value_and_grad
        self.tree_map = pw.tree_map
        self.pmean = pw.pmean


class JaxOps:
    """The same from JAX. jax.nn has no layer_norm: written out as pw.nn.layer_norm is."""

    def __init__(self):
        import jax
        import jax.numpy as jnp

        self.xp = jnp
        self.softmax = jax.nn.softmax
        self.log_softmax = jax.nn.log_softmax
        self.gelu = jax.nn.gelu  # approximate=True (tanh), as pw.nn.gelu
        self.one_hot = jax.nn.one_hot
        self.value_and_grad = jax.value_and_grad
        self.tree_map = jax.tree_util.tree_map
        self.pmean = jax.lax.pmean

        def layer_norm(x, scale, offset, epsilon=1e-5):
            mean = jnp.mean(x, axis=-1, keepdims=True)
            centered = x - mean
            var = jnp.mean(centered * centered, axis=-1, keepdims=True)
            return centered * jax.lax.rsqrt(var + epsilon) * scale + offset

        self.layer_norm = layer_norm


def init_params(cfg: dict, seed: int = 0) -> dict:
    """GPT-2-style initialization (normal, std 0.02; LN scale 1, biases 0), float32, numpy."""
    import numpy as np

    r = np.random.default_rng(seed)
    d, v, t = cfg["d_model"], cfg["vocab"], cfg["seq"]

    def normal(*shape, std=0.02):
        return (r.standard_normal(shape) * std).astype(np.float32)

    def zeros(*shape):
        return np.zeros(shape, np.float32)

    def ones(*shape):
        return np.ones(shape, np.float32)

    proj_std = 0.02 / math.sqrt(2 * cfg["layers"])
    blocks = []
    for _ in range(cfg["layers"]):
        blocks.append({
            "ln1_g": ones(d), "ln1_b": zeros(d),
            "w_qkv": normal(d, 3 * d), "b_qkv": zeros(3 * d),
            "w_o": normal(d, d, std=proj_std), "b_o": zeros(d),
            "ln2_g": ones(d), "ln2_b": zeros(d),
            "w_1": normal(d, 4 * d), "b_1": zeros(4 * d),
            "w_2": normal(4 * d, d, std=proj_std), "b_2": zeros(d),
        })
    return {"wte": normal(v, d), "wpe": normal(t, d, std=0.01), "blocks": blocks,
            "lnf_g": ones(d), "lnf_b": zeros(d)}


def init_adam(params: dict) -> dict:
    import numpy as np

    from pathways import tree_map  # pure Python pytrees; works on numpy leaves

    return {"m": tree_map(np.zeros_like, params), "v": tree_map(np.zeros_like, params),
            "t": np.zeros((), np.float32)}


def make_batches(cfg: dict, steps: int, seed: int = 1):
    """`steps` global batches of int32 tokens [batch, seq + 1] (inputs and next-token targets)."""
    import numpy as np

    r = np.random.default_rng(seed)
    return r.integers(0, cfg["vocab"], size=(steps, cfg["batch"], cfg["seq"] + 1)).astype(np.int32)


def make_train_step(ops, cfg: dict, axis_name=None):
    """The train step: (params, adam, tokens [b, seq+1]) -> (params, adam, loss)."""
    import numpy as np

    xp = ops.xp
    heads, d = cfg["heads"], cfg["d_model"]
    dh = d // heads
    causal = np.tril(np.ones((cfg["seq"], cfg["seq"]), bool))  # a constant of the step

    def attention(x, p):
        b, t, _ = x.shape
        qkv = (x @ p["w_qkv"] + p["b_qkv"]).reshape(b, t, 3, heads, dh)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]  # [b, t, h, dh]
        s = xp.einsum("bqhd,bkhd->bhqk", q, k) * (1.0 / math.sqrt(dh))
        s = xp.where(causal, s, -1e9)
        a = ops.softmax(s, axis=-1)
        o = xp.einsum("bhqk,bkhd->bqhd", a, v).reshape(b, t, d)
        return o @ p["w_o"] + p["b_o"]

    def mlp(x, p):
        return ops.gelu(x @ p["w_1"] + p["b_1"]) @ p["w_2"] + p["b_2"]

    def loss_fn(params, inputs, targets):
        x = params["wte"][inputs] + params["wpe"]  # [b, t, d]
        for p in params["blocks"]:
            x = x + attention(ops.layer_norm(x, p["ln1_g"], p["ln1_b"]), p)
            x = x + mlp(ops.layer_norm(x, p["ln2_g"], p["ln2_b"]), p)
        x = ops.layer_norm(x, params["lnf_g"], params["lnf_b"])
        logits = x @ params["wte"].T  # tied output projection
        logp = ops.log_softmax(logits, axis=-1)
        return -xp.mean(xp.sum(ops.one_hot(targets, cfg["vocab"]) * logp, axis=-1))

    def train_step(params, adam, tokens):
        loss, grads = ops.value_and_grad(loss_fn)(params, tokens[:, :-1], tokens[:, 1:])
        if axis_name is not None:
            grads = ops.pmean(grads, axis_name)
            loss = ops.pmean(loss, axis_name)
        t = adam["t"] + 1.0
        m = ops.tree_map(lambda m, g: B1 * m + (1.0 - B1) * g, adam["m"], grads)
        v = ops.tree_map(lambda v, g: B2 * v + (1.0 - B2) * (g * g), adam["v"], grads)
        c1 = 1.0 - B1 ** t
        c2 = 1.0 - B2 ** t
        params = ops.tree_map(lambda p, m, v: p - LR * (m / c1) / (xp.sqrt(v / c2) + EPS),
                              params, m, v)
        return params, {"m": m, "v": v, "t": t}, loss

    return train_step


def count_params(cfg: dict) -> int:
    import numpy as np

    from pathways import tree_leaves

    return int(sum(np.size(x) for x in tree_leaves(init_params(cfg))))


# --------------------------------------------------------------------------
# Workers (each in a fresh process).


def _replicate(tree, n):
    import numpy as np

    from pathways import tree_map

    return tree_map(lambda a: np.ascontiguousarray(np.broadcast_to(a, (n,) + np.shape(a))), tree)


def _shard(batch, n):
    """[B, ...] -> [n, B/n, ...]."""
    return batch.reshape((n, batch.shape[0] // n) + batch.shape[1:])


def _timed_loop(step, state, tokens, wait, *, seconds, warmup, window):
    """`_harness.measure` over steps that feed their params/state to the next step."""

    def issue():
        p, a, loss = step(state[0], state[1], tokens)
        state[0], state[1] = p, a
        return loss

    return h.measure(issue, wait, seconds=seconds, warmup=warmup, window=window)


def _first_steps(out: dict, step, params, adam, tok: list) -> tuple:
    """Runs one step per batch of `tok` (the first also times a first call on a
    compiled function); out["losses"] ([step][device], checked by the parent)
    and out["first_steps_s"]. Returns the params and Adam state after them."""
    import numpy as np

    losses, step_s = [], []
    for b in tok:
        t0 = time.perf_counter()
        params, adam, loss = step(params, adam, b)
        loss = np.asarray(loss)
        step_s.append(time.perf_counter() - t0)
        losses.append(np.atleast_1d(loss).tolist())
    out["losses"] = losses
    out["first_steps_s"] = step_s
    return params, adam


def _measure_steps(out: dict, step, state: list, tokens, seconds: float, warmup: float,
                   async_mode: bool) -> None:
    """out["sync"] (each step's loss waited for) and, if `async_mode`, out["async"]
    (IN_FLIGHT steps in flight): _timed_loop of `step` from `state` on `tokens`."""

    def wait(loss):
        return loss.block_until_ready()

    pw = sys.modules.get("pathways")
    if pw is not None and "jax" not in str(type(tokens)).lower():
        # pathways compiles a function's fused loops to native code in the
        # background after its second run: two steps, then wait for it, so
        # the timed steps run it (the wait is reported, not timed).
        for _ in range(2):
            p, a, loss = step(state[0], state[1], tokens)
            state[0], state[1] = p, a
            wait(loss)
        t0 = time.perf_counter()
        pw.wait_for_native_kernels()
        out["native_wait_s"] = time.perf_counter() - t0
        out["native"] = pw.native_kernel_stats()
    out["sync"] = _timed_loop(step, state, tokens, wait, seconds=seconds, warmup=warmup, window=0)
    if async_mode:
        out["async"] = _timed_loop(step, state, tokens, wait, seconds=seconds, warmup=warmup,
                                   window=IN_FLIGHT)


def pw_worker(size: str, n: int, seconds: float, warmup: float, async_mode: bool) -> dict:
    import numpy as np

    import pathways as pw
    from pathways import _core

    cfg = SIZES[size]
    out = {"system": "pathways", "size": size, "devices": n, "topology": pw.topology()}
    tpus = pw.make_virtual_device_set().add_slice(tpu_devices=n).tpus
    axis = "i" if n > 1 else None
    ops = PathwaysOps()
    step = pw.pmap(make_train_step(ops, cfg, axis), devices=tpus, axis_name=axis)

    params0, adam0 = _replicate(init_params(cfg), n), _replicate(init_adam(init_params(cfg)), n)
    batches = make_batches(cfg, CHECK_STEPS)
    params, adam = pw.device_put(params0, tpus), pw.device_put(adam0, tpus)
    tok = [pw.device_put(_shard(b, n), tpus) for b in batches]
    pw.block_until_ready((params, adam, tok))

    # Trace + compile (+ lower to a one-node program), without running; the
    # part spent in the C++ compiler is timed by wrapping _core.compile.
    core_compile = []
    real_compile = _core.compile

    def timed_compile(*a, **k):
        t0 = time.perf_counter()
        r = real_compile(*a, **k)
        core_compile.append(time.perf_counter() - t0)
        return r

    _core.compile = timed_compile
    try:
        t0 = time.perf_counter()
        step.compiled(params, adam, tok[0])
        out["trace_compile_s"] = time.perf_counter() - t0
    finally:
        _core.compile = real_compile
    out["core_compile_s"] = sum(core_compile)
    out["ir_ops"] = _ir_op_counts(step.as_text(params, adam, tok[0]))

    # The first CHECK_STEPS steps (the first one also timed: first call on a
    # compiled function), losses checked by the parent.
    params, adam = _first_steps(out, step, params, adam, tok)

    # A fresh PmapFunction: its first call traces, compiles, lowers and runs.
    # Its host-side time = wall time - the step's own gang (pw.timeline).
    step2 = pw.pmap(make_train_step(ops, cfg, axis), devices=tpus, axis_name=axis)
    with pw.timeline() as tl:
        t0 = time.perf_counter()
        np.asarray(step2(params, adam, tok[0])[2])
        out["first_call_s"] = time.perf_counter() - t0
    out["first_call_gang_s"] = max(e["end_us"] - e["start_us"] for e in tl.events()) / 1e6

    state = [params, adam]
    _measure_steps(out, step, state, tok[0], seconds, warmup, async_mode)
    # Device time per step (gang duration) over a few more steps.
    with pw.timeline() as tl:
        t0, k = time.perf_counter(), 0
        while k < TIMELINE_STEPS or time.perf_counter() - t0 < 1.0:
            state[0], state[1], loss = step(state[0], state[1], tok[0])
            loss.block_until_ready()
            k += 1
    out["gang_us"] = [e["end_us"] - e["start_us"] for e in tl.events()]
    return out


def _ir_op_counts(text: str) -> dict:
    """Op kinds of a function's IR text and how many of each ("%3 = matmul %1, %2 ...")."""
    counts: dict = {}
    for m in re.finditer(r"^\s*%\d+ = ([a-z_][a-z_0-9]*)", text, re.M):
        counts[m.group(1)] = counts.get(m.group(1), 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def jax_worker(size: str, n: int, kind: str, seconds: float, warmup: float, async_mode: bool) -> dict:
    import numpy as np

    import jax

    cfg = SIZES[size]
    out = {"system": "jax", "kind": kind, "size": size, "devices": n,
           "jax_devices": len(jax.devices()), "backend": jax.default_backend()}
    ops = JaxOps()
    batches = make_batches(cfg, CHECK_STEPS)
    if kind == "jit":
        assert n == 1
        fn = jax.jit(make_train_step(ops, cfg))
        params = jax.device_put(init_params(cfg))
        adam = jax.device_put(init_adam(init_params(cfg)))
        tok = [jax.device_put(b) for b in batches]
    else:
        fn = jax.pmap(make_train_step(ops, cfg, "i"), axis_name="i", devices=jax.devices()[:n])
        devs = jax.devices()[:n]
        # jax.device_put_replicated/_sharded are deprecated: an identity pmap
        # puts each leading-axis slice on its device.
        put = jax.pmap(lambda x: x, devices=devs)
        params = jax.tree_util.tree_map(put, _replicate(init_params(cfg), n))
        adam = jax.tree_util.tree_map(put, _replicate(init_adam(init_params(cfg)), n))
        tok = [put(_shard(b, n)) for b in batches]
    jax.block_until_ready((params, adam, tok))

    t0 = time.perf_counter()
    lowered = fn.lower(params, adam, tok[0])
    t1 = time.perf_counter()
    step = lowered.compile()
    t2 = time.perf_counter()
    out["trace_s"], out["compile_s"], out["trace_compile_s"] = t1 - t0, t2 - t1, t2 - t0

    params, adam = _first_steps(out, step, params, adam, tok)

    _measure_steps(out, step, [params, adam], tok[0], seconds, warmup, async_mode)
    return out


def make_flax_step(cfg: dict, axis_name=None):
    """The LM of make_train_step written with flax.linen and optax, as a JAX user writes it:
    (model, tx, step) with step(params, opt_state, tokens) -> (params, opt_state, loss)."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    import optax

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x):
            mask = nn.make_causal_mask(jnp.ones(x.shape[:2]))
            x = x + nn.SelfAttention(num_heads=cfg["heads"])(nn.LayerNorm()(x), mask=mask)
            h = nn.gelu(nn.Dense(4 * cfg["d_model"])(nn.LayerNorm()(x)))
            return x + nn.Dense(cfg["d_model"])(h)

    class LM(nn.Module):
        @nn.compact
        def __call__(self, tokens):
            wte = nn.Embed(cfg["vocab"], cfg["d_model"])
            x = wte(tokens) + self.param("wpe", nn.initializers.normal(0.01), (cfg["seq"], cfg["d_model"]))
            for _ in range(cfg["layers"]):
                x = Block()(x)
            return wte.attend(nn.LayerNorm()(x))

    model = LM()
    tx = optax.adam(LR, B1, B2, EPS)

    def loss_fn(params, tokens):
        logits = model.apply(params, tokens[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

    def step(params, opt_state, tokens):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens)
        if axis_name is not None:
            grads = jax.lax.pmean(grads, axis_name)
            loss = jax.lax.pmean(loss, axis_name)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return model, tx, step


def flax_worker(size: str, n: int, system: str, seconds: float, warmup: float) -> dict:
    import numpy as np

    import jax

    cfg = SIZES[size]
    out = {"system": system, "flax": True, "size": size, "devices": n}
    axis = "i" if n > 1 else None
    model, tx, step_fn = make_flax_step(cfg, axis)
    batches = make_batches(cfg, CHECK_STEPS)
    params = model.init(jax.random.PRNGKey(0), batches[0][:, :-1])
    opt_state = tx.init(params)
    if system == "pathways":
        import pathways as pw

        tpus = pw.make_virtual_device_set().add_slice(tpu_devices=n).tpus
        params, opt_state = pw.device_put(_replicate((params, opt_state), n), tpus)
        tok = [pw.device_put(_shard(b, n), tpus) for b in batches]
        pw.block_until_ready((params, opt_state, tok))

        def make():
            return pw.pmap(step_fn, axis_name=axis, devices=tpus)
    else:
        assert n == 1
        params, opt_state = jax.device_put((params, opt_state))
        tok = [jax.device_put(b) for b in batches]
        jax.block_until_ready((params, opt_state, tok))

        def make():
            return jax.jit(step_fn)

    # The first call of a fresh step function: trace, translate, compile, run, fetch the loss.
    step = make()
    t0 = time.perf_counter()
    p, o, loss = step(params, opt_state, tok[0])
    np.asarray(loss)
    out["first_call_s"] = time.perf_counter() - t0
    out["trace_compile_s"] = out["first_call_s"]
    params, opt_state = _first_steps(out, step, params, opt_state, tok)
    _measure_steps(out, step, [params, opt_state], tok[0], seconds, warmup, False)
    return out


# --------------------------------------------------------------------------
# The run.


def configs():
    """(key, label, target, kwargs, env) per configuration and size."""
    out = []
    for size in SIZES:
        out.append((f"pw1_{size}", "pathways 1 device", "transformer:pw_worker",
                    {"size": size, "n": 1, "async_mode": size == "small"},
                    {"PATHWAYS_TOPOLOGY": h.topology_for(1)}))
        for n in DP_DEVICES:
            out.append((f"pw{n}_{size}", f"pathways DP {n} devices", "transformer:pw_worker",
                        {"size": size, "n": n, "async_mode": size == "small"},
                        {"PATHWAYS_TOPOLOGY": h.topology_for(n)}))
        # One thread per device (no intra-op split): the runtime's own DP speedup.
        for n in (1, 2):
            out.append((f"pw{n}t1_{size}",
                        "pathways 1 device, 1 thread" if n == 1 else f"pathways DP {n} devices, 1 thread each",
                        "transformer:pw_worker", {"size": size, "n": n, "async_mode": False},
                        {"PATHWAYS_TOPOLOGY": h.topology_for(n) + ",intra_op_threads=1"}))
        out.append((f"jit_{size}", "jax.jit 1 device", "transformer:jax_worker",
                    {"size": size, "n": 1, "kind": "jit", "async_mode": size == "small"},
                    {"XLA_FLAGS": None, "JAX_PLATFORMS": "cpu"}))
        for n in DP_DEVICES:
            # Synchronous only: jax.pmap calls in flight deadlocked XLA:CPU's
            # all-reduce rendezvous here (see README, Figure 5).
            out.append((f"jaxpmap{n}_{size}", f"jax.pmap {n} devices", "transformer:jax_worker",
                        {"size": size, "n": n, "kind": "pmap", "async_mode": False},
                        {"XLA_FLAGS": f"--xla_force_host_platform_device_count={n}",
                         "JAX_PLATFORMS": "cpu"}))
        # The same LM written with Flax and optax (issue 24).
        for n in (1,) + FLAX_DP_DEVICES:
            out.append((f"flaxpw{n}_{size}", f"flax pw {'1 device' if n == 1 else f'DP {n} devices'}",
                        "transformer:flax_worker", {"size": size, "n": n, "system": "pathways"},
                        {"PATHWAYS_TOPOLOGY": h.topology_for(n), "JAX_PLATFORMS": "cpu"}))
        out.append((f"flaxjit_{size}", "flax jax.jit 1 device", "transformer:flax_worker",
                    {"size": size, "n": 1, "system": "jax"}, {"XLA_FLAGS": None, "JAX_PLATFORMS": "cpu"}))
    return out


def sweep(args) -> dict:
    """Every configuration once per round, in turn. runs[key] is the round with the median
    sync tokens/s (its losses, device time and compile times are reported), with
    "rounds_per_s": every round's sync steps/s; "all_rounds" keeps each round's result."""
    seconds, warmup = (0.6, 0.2) if args.quick else (4.5, 1.0)
    rounds = 1 if args.quick else ROUNDS
    have_jax = h.has_module("jax")
    have_flax = h.has_module("flax") and h.has_module("optax")
    per_round = {}
    cpu0 = h.cpu_times()
    for r in range(rounds):
        for key, label, target, kw, env in configs():
            if ("jax_worker" in target and not have_jax) or ("flax" in target and not have_flax):
                per_round.setdefault(key, []).append({"ok": False, "error": h.MISSING})
                continue
            h.log(f"[{NAME}] round {r + 1}/{rounds}: {key}: {label}")
            res = h.run_isolated(target, dict(kw, seconds=seconds, warmup=warmup), env=env, timeout=600)
            if not res["ok"]:
                h.log(f"[{NAME}]   failed: {res['error']}")
            per_round.setdefault(key, []).append(res)
    runs = {}
    for key, results in per_round.items():
        ok = sorted((x for x in results if x["ok"]), key=lambda x: x["result"]["sync"]["per_s"])
        if not ok:
            runs[key] = results[0]
            continue
        runs[key] = dict(ok[len(ok) // 2], rounds_per_s=[x["result"]["sync"]["per_s"] for x in ok],
                         failed_rounds=len(results) - len(ok))
    return {"seconds": seconds, "warmup": warmup, "rounds": rounds, "runs": runs, "all_rounds": per_round,
            "steal": h.steal_fraction(cpu0, h.cpu_times())}


def _rel(a, b) -> float:
    import numpy as np

    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-30)))


def check(data: dict) -> list:
    """[(description, max relative difference or None, tolerance, ok)]; ok is None when
    a side is missing because its peer is not installed (not a failure)."""
    import numpy as np

    runs = data["runs"]

    def losses(key):
        r = runs.get(key)
        if not r or not r["ok"]:
            return None
        return np.asarray(r["result"]["losses"], np.float64)  # [steps, devices]

    def missing_peer(key):
        r = runs.get(key)
        return bool(r) and not r["ok"] and r["error"] == h.MISSING

    out = []
    for size in SIZES:
        pairs = [(f"{size}: pathways 1 device vs jax.jit", f"pw1_{size}", f"jit_{size}", JIT_RTOL)]
        for n in DP_DEVICES:
            pairs.append((f"{size}: pathways DP {n} devices vs pathways 1 device", f"pw{n}_{size}",
                          f"pw1_{size}", DP_RTOL))
        pairs.append((f"{size}: pathways DP 2 devices, 1 thread each vs pathways 1 device",
                      f"pw2t1_{size}", f"pw1_{size}", DP_RTOL))
        for n in DP_DEVICES:
            pairs.append((f"{size}: jax.pmap {n} devices vs jax.jit", f"jaxpmap{n}_{size}",
                          f"jit_{size}", DP_RTOL))
        pairs.append((f"{size}: flax on pathways 1 device vs flax on jax.jit", f"flaxpw1_{size}",
                      f"flaxjit_{size}", JIT_RTOL))
        for n in FLAX_DP_DEVICES:
            pairs.append((f"{size}: flax on pathways DP {n} devices vs 1 device", f"flaxpw{n}_{size}",
                          f"flaxpw1_{size}", DP_RTOL))
        for what, key, ref_key, tol in pairs:
            got, ref = losses(key), losses(ref_key)
            if got is None or ref is None:
                out.append((what, None, tol, None if missing_peer(key) or missing_peer(ref_key) else False))
                continue
            same = bool((got == got[:, :1]).all())  # every device holds the same pmean'd loss
            d = _rel(got[:, 0], ref[:, 0])
            out.append((what + ("" if same else " (its devices DISAGREE)"), d, tol, same and d <= tol))
    return out


def summarize(data: dict) -> dict:
    s = {}
    for key, r in data["runs"].items():
        size = key.rsplit("_", 1)[1]
        tps = tokens_per_step(SIZES[size])
        if not r["ok"]:
            s[key] = {"error": r["error"]}
            continue
        res = r["result"]
        per_s = statistics.median(r.get("rounds_per_s") or [res["sync"]["per_s"]])
        # The spread: every round's median when there are rounds, else the slices of one.
        spread = r.get("rounds_per_s") if len(r.get("rounds_per_s") or []) > 1 else res["sync"]["runs_per_s"]
        e = {"tokens_s": per_s * tps, "step_ms": 1e3 / per_s,
             "runs_tokens_s": [x * tps for x in spread],
             "trace_compile_s": res["trace_compile_s"]}
        if res.get("flax"):
            e["first_call_s"] = res["first_call_s"]
            s[key] = e
            continue
        if "async" in res:
            e["async_tokens_s"] = res["async"]["per_s"] * tps
        if res["system"] == "pathways":
            e["first_call_host_s"] = res["first_call_s"] - res["first_call_gang_s"]
            e["core_compile_s"] = res["core_compile_s"]
            if res.get("gang_us"):
                e["gang_ms"] = statistics.median(res["gang_us"]) / 1e3
        else:
            e["trace_s"], e["compile_s"] = res["trace_s"], res["compile_s"]
        s[key] = e
    return s


def _throughput_targets(size: str, what: str, one: dict, peer: dict, two: dict, jit_ratio: float) -> list:
    """The tokens/s targets of one model: 1 device vs its JAX peer, and DP 2 vs 1 device."""
    lines = []
    if "tokens_s" in one and "tokens_s" in peer:
        r = one["tokens_s"] / peer["tokens_s"]
        lines.append((f"{size}: {what}pathways 1 device / {what}jax.jit tokens/s = {r:.2f} "
                      f"({h.fmt_rate(one['tokens_s'])} vs {h.fmt_rate(peer['tokens_s'])}; "
                      f"target >= {jit_ratio:.1f})", r >= jit_ratio))
    if "tokens_s" in one and "tokens_s" in two:
        r = two["tokens_s"] / one["tokens_s"]
        lines.append((f"{size}: {what}pathways DP 2 devices / 1 device tokens/s = {r:.2f} "
                      f"(target >= {TARGET_DP2_SPEEDUP})", r >= TARGET_DP2_SPEEDUP))
    return lines


def targets(summary: dict) -> list:
    """[(line, met or None)]."""
    lines = []
    for size in SIZES:
        pw1, jit, pw2 = (summary.get(f"{k}_{size}", {}) for k in ("pw1", "jit", "pw2"))
        lines += _throughput_targets(size, "", pw1, jit, pw2, TARGET_JIT_RATIO)
        one, two = (summary.get(f"{k}_{size}", {}) for k in ("pw1t1", "pw2t1"))
        if "tokens_s" in one and "tokens_s" in two:
            r = two["tokens_s"] / one["tokens_s"]
            lines.append((f"{size}: pathways DP 2 devices / 1 device, 1 thread each (intra_op_threads=1) "
                          f"tokens/s = {r:.2f} (target >= {TARGET_DP2_SPEEDUP})", r >= TARGET_DP2_SPEEDUP))
        if "trace_compile_s" in pw1 and "trace_compile_s" in jit:
            r = jit["trace_compile_s"] / pw1["trace_compile_s"]
            lines.append((f"{size}: trace+compile jax.jit {jit['trace_compile_s'] * 1e3:.0f} ms / "
                          f"pathways {pw1['trace_compile_s'] * 1e3:.0f} ms = {r:.1f}x "
                          f"(target >= {TARGET_COMPILE_SPEEDUP:.0f}x)", r >= TARGET_COMPILE_SPEEDUP))
        fpw1, fjit, fpw2 = (summary.get(f"{k}_{size}", {}) for k in ("flaxpw1", "flaxjit", "flaxpw2"))
        if "first_call_s" in fpw1 and "first_call_s" in fjit:
            r = fpw1["first_call_s"] / fjit["first_call_s"]
            lines.append((f"{size}: flax first call, pathways {fpw1['first_call_s'] * 1e3:.0f} ms / "
                          f"jax.jit {fjit['first_call_s'] * 1e3:.0f} ms = {r:.2f} "
                          f"(target <= {TARGET_FLAX_FIRST_CALL})", r <= TARGET_FLAX_FIRST_CALL))
        lines += _throughput_targets(size, "flax ", fpw1, fjit, fpw2, TARGET_FLAX_JIT_RATIO)
    return lines


def _ms(x) -> str:
    return "-" if x is None else (f"{x * 1e3:.0f}" if x >= 0.01 else f"{x * 1e3:.1f}")


def report(data: dict, summary: dict, checks: list, info: dict, elapsed: float) -> str:
    lines = [h.machine_header(info), ""]
    for size, cfg in SIZES.items():
        lines.append(
            f"{size}: {cfg['layers']} layers, d_model {cfg['d_model']}, {cfg['heads']} heads, seq "
            f"{cfg['seq']}, vocab {cfg['vocab']}, global batch {cfg['batch']} sequences = "
            f"{tokens_per_step(cfg)} tokens/step, {count_params(cfg) / 1e3:.0f}k parameters, float32")
    lines.append(f"tokens/s: median over {data.get('rounds', 1)} round(s), each running every configuration "
                 f"in turn in its own process; a round's figure is the median of 3 slices of "
                 f"{data['seconds'] / 3:.1f} s after {data['warmup']:.1f} s warm-up")
    lines.append("(rounds) = min-max over the rounds (over the slices with one round); the other columns are "
                 "the median round's; sync = each step's loss waited for, "
                 f"async (small only) = up to {IN_FLIGHT} steps in flight")
    lines.append("")
    rows, flax_rows = [], []
    for key, label, *_ in configs():
        size = key.rsplit("_", 1)[1]
        e = summary[key]
        if key.startswith("flax"):
            if "error" in e:
                flax_rows.append([size, label, e["error"][:90]])
                continue
            rr = e["runs_tokens_s"]
            flax_rows.append([size, label, h.fmt_rate(e["tokens_s"]),
                              f"{h.fmt_rate(min(rr))}-{h.fmt_rate(max(rr))}", f"{e['step_ms']:.2f}",
                              _ms(e["first_call_s"])])
            continue
        if "error" in e:
            rows.append([size, label, e["error"][:90]])
            continue
        comp = (f"{_ms(e['trace_s'])} + {_ms(e['compile_s'])}" if "compile_s" in e
                else f"{_ms(e['trace_compile_s'] - e['core_compile_s'])} + {_ms(e['core_compile_s'])}")
        rr = e["runs_tokens_s"]
        rows.append([
            size, label, h.fmt_rate(e["tokens_s"]), f"{h.fmt_rate(min(rr))}-{h.fmt_rate(max(rr))}",
            h.fmt_rate(e.get("async_tokens_s")), f"{e['step_ms']:.2f}",
            f"{e['gang_ms']:.2f}" if "gang_ms" in e else "-",
            _ms(e["trace_compile_s"]), comp,
            _ms(e.get("first_call_host_s")),
        ])
    lines.append(h.table(
        ["size", "config", "tokens/s", "(rounds)", "async", "step ms", "device ms",
         "trace+compile ms", "(trace + compile)", "1st call - device ms"],
        rows, align="llrrrrrrrr"))
    lines.append("")
    lines.append("The same LM written with Flax + optax (unchanged; on pathways JAX traces, pathways lowers):")
    lines.append(h.table(["size", "config", "tokens/s", "(rounds)", "step ms",
                          "1st call ms (trace + translate + compile + run)"],
                         flax_rows, align="llrrrr"))
    lines.append("")
    lines.append(f"Loss checks (first {CHECK_STEPS} steps, same initial parameters and batches; "
                 "max relative difference of the losses):")
    for what, d, tol, ok in checks:
        verdict = "not checked (peer missing)" if ok is None else ("ok" if ok else "FAILED")
        lines.append(f"  {what}: " + ("not measured" if d is None else f"{d:.2e}")
                     + f" (tolerance {tol:.0e}): {verdict}")
    ref = data["runs"].get("jit_small")
    if ref and ref["ok"]:
        lines.append("  jax.jit losses (small): " + ", ".join(f"{l[0]:.6f}" for l in ref["result"]["losses"]))
    lines.append("")
    lines.append("Targets:")
    for line, met in targets(summary):
        lines.append(f"- {line}: {'MET' if met else 'MISSED'}")
    loads = [f"{k} {r['load_at_start'][0]:.2f}" for k, r in data["runs"].items() if r.get("load_at_start")]
    if loads:
        lines.append("")
        lines.append("1-min load average at each process start: " + ", ".join(loads))
    if data.get("steal") is not None:
        lines.append(f"CPU steal during the run: {100 * data['steal']:.1f}%")
    pw1 = data["runs"].get("pw1_large")
    if pw1 and pw1["ok"]:
        ops = pw1["result"]["ir_ops"]
        lines.append("pathways IR of the large step (ops by kind): "
                     + ", ".join(f"{k} {v}" for k, v in ops.items()))
    lines += [
        "",
        "Notes:",
        "- pathways DP n: one island, 1 host x n devices (_harness.topology_for); a gang's shards run",
        "  as parts on the executor's threads (2 here). A device's large products and fused loops are",
        "  split over the executor threads not busy with other parts (one BLAS thread per piece);",
        "  '1 thread' rows turn that off (intra_op_threads=1). jax.jit: XLA:CPU's intra-op pool, one",
        "  thread per core. jax.pmap n: n XLA:CPU host devices.",
        "- trace+compile: pathways PmapFunction.compiled() (trace in Python + _core.compile + lowering",
        "  to a one-node program; '(trace + compile)' = everything else + _core.compile); JAX",
        "  .lower() (trace to StableHLO) + .compile() (XLA). '1st call - device': a second fresh",
        "  pw.pmap's first call (trace, compile, lower, dispatch, run, fetch the loss) minus its gang's",
        "  duration (pw.timeline): the host-side cost of a first call.",
        f"- device ms: median gang duration (pw.timeline) over >= {TIMELINE_STEPS} steps and 1 s: the",
        "  step's kernels alone.",
        "- jax.pmap runs synchronously only (calls in flight deadlocked XLA:CPU collectives here).",
        "",
        f"total time {elapsed:.0f} s",
    ]
    return "\n".join(lines)


def plot(summary: dict, path: str) -> None:
    plt = h.pyplot()
    if plt is None:
        return
    labels = [(key.rsplit("_", 1)[0], label) for key, label, *_ in configs() if key.endswith("_small")]
    colors = {"pw1": "tab:blue", "pw2": "cornflowerblue", "pw4": "lightsteelblue",
              "pw1t1": "slategray", "pw2t1": "lightslategray",
              "jit": "tab:orange", "jaxpmap2": "sandybrown", "jaxpmap4": "peachpuff",
              "flaxpw1": "tab:green", "flaxpw2": "mediumseagreen", "flaxjit": "tab:red"}
    fig, axes = plt.subplots(1, len(SIZES), figsize=(11, 4.5))
    for ax, size in zip(axes, SIZES):
        ys = [summary.get(f"{k}_{size}", {}).get("tokens_s") or 0 for k, _ in labels]
        xs = range(len(labels))
        ax.bar(xs, [y / 1e3 for y in ys], color=[colors[k] for k, _ in labels])
        for x, y in zip(xs, ys):
            if y:
                ax.annotate(h.fmt_rate(y), (x, y / 1e3), ha="center", va="bottom", fontsize=8)
        ax.set_xticks(list(xs))
        ax.set_xticklabels([l.replace(" devices", "").replace(" device", "").replace("pathways", "pw")
                            for _, l in labels], rotation=30, ha="right", fontsize=8)
        cfg = SIZES[size]
        ax.set_title(f"{size}: {cfg['layers']}L d{cfg['d_model']} seq {cfg['seq']}, "
                     f"{tokens_per_step(cfg)} tok/step", fontsize=10)
        ax.set_ylabel("k tokens/s (sync)")
        ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle("Transformer LM train step (fwd + bwd + Adam): pathways vs JAX on XLA:CPU", fontsize=11)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------
# --profile: perf record of the pathways 1-device step.


def profile_child(size: str, seconds: float) -> None:
    """Warms up, prints READY, waits for a line on stdin, runs steps for `seconds`
    (recording a timeline), prints the timeline summary as JSON."""
    import json

    import pathways as pw

    cfg = SIZES[size]
    tpus = pw.make_virtual_device_set().add_slice(tpu_devices=1).tpus
    step = pw.pmap(make_train_step(PathwaysOps(), cfg), devices=tpus)
    params = pw.device_put(_replicate(init_params(cfg), 1), tpus)
    adam = pw.device_put(_replicate(init_adam(init_params(cfg)), 1), tpus)
    tok = pw.device_put(_shard(make_batches(cfg, 1)[0], 1), tpus)
    for _ in range(5):
        params, adam, loss = step(params, adam, tok)
        loss.block_until_ready()
    print("READY", os.getpid(), flush=True)
    sys.stdin.readline()
    steps = 0
    t0 = time.perf_counter()
    with pw.timeline() as tl:
        while time.perf_counter() - t0 < seconds:
            params, adam, loss = step(params, adam, tok)
            loss.block_until_ready()
            steps += 1
    wall = time.perf_counter() - t0
    gangs = [e["end_us"] - e["start_us"] for e in tl.events()]
    print(json.dumps({"steps": steps, "wall_s": wall, "gang_us_median": statistics.median(gangs),
                      "busy": sum(gangs) / 1e6 / wall}), flush=True)


def _core_functions(so_path: str) -> tuple:
    """(sorted [(start, end)] of every function of the stripped `_core`, from its
    .eh_frame FDEs; sorted [(address, name)] of its exported symbols)."""
    ranges, exports = [], []
    try:
        text = subprocess.run(["readelf", "--debug-dump=frames", so_path], capture_output=True,
                              text=True).stdout
        for m in re.finditer(r"FDE cie=\S+ pc=([0-9a-f]+)\.\.([0-9a-f]+)", text):
            ranges.append((int(m.group(1), 16), int(m.group(2), 16)))
        text = subprocess.run(["nm", "-D", "-C", "--defined-only", so_path], capture_output=True,
                              text=True).stdout
        for line in text.splitlines():
            parts = line.split(" ", 2)
            if len(parts) == 3 and parts[1] in "TtWw":
                exports.append((int(parts[0], 16), parts[2]))
    except OSError:
        pass
    return sorted(ranges), sorted(exports)


def _plt_calls(so_path: str, start: int, end: int) -> list:
    """The PLT functions (libm, libc, ...) a function of `so_path` calls, most called first:
    a hint of what an unnamed function does."""
    try:
        text = subprocess.run(["objdump", "-d", "--no-show-raw-insn", f"--start-address=0x{start:x}",
                               f"--stop-address=0x{end:x}", so_path], capture_output=True,
                              text=True).stdout
    except OSError:
        return []
    counts: dict = {}
    for m in re.finditer(r"call\s+\S+\s+<([^>@]+)@plt>", text):
        counts[m.group(1)] = counts.get(m.group(1), 0) + 1
    names = sorted(counts, key=lambda k: -counts[k])
    try:
        names = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True,
                               text=True).stdout.split("\n")[: len(names)]
    except OSError:
        pass
    return [_short(n, 30) for n in names]


def _short(sym: str, width: int = 70) -> str:
    sym = re.sub(r"\(.*\)( const)?$", "", sym)  # drop the argument list
    return sym if len(sym) <= width else sym[: width - 3] + "..."


def _dso_short(dso: str) -> str:
    base = os.path.basename(dso)
    for key, short in (("kernel", "kernel"), ("_core.cpython", "_core"), ("openblas", "openblas"),
                       ("libm.", "libm"), ("libc.", "libc"), ("python", "python")):
        if key in base:
            return short
    return base[:9]


def _category(dso: str, sym: str) -> str:
    base = os.path.basename(dso)
    if "kernel" in dso:
        if "sched" in sym or "schedule" in sym or "yield" in sym or "futex" in sym:
            return "Linux: scheduler (sched_yield, futex, context switches)"
        if "fault" in sym or "page" in sym or "clear_" in sym:
            return "Linux: page faults"
        return "Linux: other"
    if "openblas" in base:
        return "OpenBLAS (matmul)"
    if base.startswith("libm"):
        return "libm (exp, tanh, log, ...)"
    if base.startswith("libc"):
        if "yield" in sym:
            return "libc: sched_yield"
        if "mem" in sym:
            return "libc: memcpy/memset"
        return "libc: other"
    if "_core" in base:
        if sym.startswith("pw::StridedCopy"):
            return "_core: strided copy (reshape, transpose, slice, pad, broadcast)"
        return "_core: other kernels and runtime"
    if "python" in base:
        return "Python interpreter"
    return base or "unknown"


def analyze_perf(data_path: str, pid: int) -> dict:
    """Per-sample self frames from `perf script`, aggregated by category, thread
    and function; `_core` samples without a name grouped by their function
    (FDE range) and labeled by the exported symbols around it."""
    text = subprocess.run(["perf", "script", "-i", data_path, "-F", "tid,period,ip,sym,dso"],
                          capture_output=True, text=True).stdout
    samples = []  # (tid, [(ip, sym, dso), ...])
    for block in text.split("\n\n"):
        lines = [l for l in block.splitlines() if l.strip()]
        if not lines:
            continue
        head = lines[0].split()
        frames = []
        for l in lines[1:]:
            m = re.match(r"\s*([0-9a-f]+)\s+(.*?)\s+\((.*)\)\s*$", l)
            if m:
                frames.append((int(m.group(1), 16), m.group(2), m.group(3)))
        if frames and head:
            samples.append((int(head[0]), frames))
    total = len(samples)
    if not total:
        return {"samples": 0}
    core_so = next((d for _, fr in samples for _, _, d in fr if "_core.cpython" in d), None)
    ranges, exports = _core_functions(core_so) if core_so else ([], [])
    starts = [r[0] for r in ranges]
    export_addrs = [a for a, _ in exports]
    import bisect

    def core_label(ip: int) -> str:
        i = bisect.bisect_right(starts, ip) - 1
        if i < 0 or ip >= ranges[i][1]:
            return f"_core 0x{ip:x} (no FDE)"
        a, b = ranges[i]
        j = bisect.bisect_left(export_addrs, a)
        if j < len(exports) and exports[j][0] == a:
            return exports[j][1]
        after = _short(exports[j][1], 40) if j < len(exports) else "-"
        calls = _plt_calls(core_so, a, b)
        return (f"[_core fn 0x{a:x}, {(b - a) / 1024:.1f} KB, before {after}; "
                f"calls {', '.join(calls[:4]) if calls else 'nothing through the PLT'}]")

    kinds: dict = {}
    for tid, fr in samples:
        k = kinds.setdefault(tid, set())
        for _, sym, dso in fr:
            if "_core.cpython" in dso:
                k.add("core")
            if "openblas" in dso:
                k.add("blas")

    def thread_kind(tid: int) -> str:
        if tid == pid:
            return "main thread (Python)"
        if "core" in kinds[tid]:
            return "pathways runtime threads (executor, ...)"
        if "blas" in kinds[tid]:
            return "OpenBLAS worker threads"
        return "other threads"

    cats, threads, funcs = {}, {}, {}
    for tid, fr in samples:
        ip, sym, dso = fr[0]
        if "_core.cpython" in dso and (sym == "[unknown]" or sym.startswith("0x")):
            sym = core_label(ip)
        else:
            sym = _short(sym)
        name = f"{_dso_short(dso):9s} {sym}"
        cat = _category(dso, sym)
        cats[cat] = cats.get(cat, 0) + 1
        tk = thread_kind(tid)
        threads[tk] = threads.get(tk, 0) + 1
        funcs[name] = funcs.get(name, 0) + 1

    def pct(d):
        return [(100.0 * v / total, k) for k, v in sorted(d.items(), key=lambda kv: -kv[1])]

    return {"samples": total, "categories": pct(cats), "threads": pct(threads),
            "functions": pct(funcs)}


def profile(args) -> int:
    import json

    size, seconds = args.profile_size, args.profile_seconds
    cfg = SIZES[size]
    lines = [h.machine_header(), "",
             f"Profile: pathways 1 device, {size} train step ({tokens_per_step(cfg)} tokens/step), "
             f"{seconds:.0f} s of steps (each loss waited for), perf record -F 999 -g -p PID"]
    perf = shutil.which("perf")
    env = dict(os.environ, PATHWAYS_TOPOLOGY=h.topology_for(1), PYTHONUNBUFFERED="1")
    child = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--profile-child", size, str(seconds)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=h.REPO_DIR)
    ready = child.stdout.readline().split()
    if not ready or ready[0] != "READY":
        child.kill()
        print("FAILED: the profiled child did not start")
        return 1
    pid = int(ready[1])
    tmpdir = tempfile.mkdtemp(prefix="pw_perf_")
    data_path = os.path.join(tmpdir, "perf.data")
    perf_proc, perf_err = None, None
    if perf:
        perf_proc = subprocess.Popen(
            [perf, "record", "-F", "999", "-g", "-p", str(pid), "-o", data_path, "--", "sleep",
             str(seconds)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        time.sleep(0.3)  # perf attached before the steps start
    child.stdin.write("go\n")
    child.stdin.flush()
    tl = json.loads(child.stdout.readline())
    child.wait()
    if perf_proc is not None:
        _, err = perf_proc.communicate()
        if perf_proc.returncode != 0 or not os.path.exists(data_path):
            perf_err = (err.strip().splitlines() or ["perf record failed"])[-1]
    tps = tokens_per_step(cfg)
    lines.append(
        f"{tl['steps']} steps in {tl['wall_s']:.1f} s = {tl['steps'] * tps / tl['wall_s']:.0f} tokens/s; "
        f"pw.timeline: median gang (the step's kernels) {tl['gang_us_median'] / 1e3:.2f} ms, "
        f"device busy {100 * tl['busy']:.0f}% of the wall time")
    result = {"size": size, "seconds": seconds, "timeline": tl}
    if perf is None or perf_err:
        lines.append(f"perf does not work here ({perf_err or 'not installed'}): only the timeline above")
    else:
        a = analyze_perf(data_path, pid)
        result["perf"] = a
        lines.append(f"{a['samples']} samples (all threads of the process; 100% = all samples)")
        lines.append("")
        lines.append("By thread:")
        lines += [f"  {p:5.1f}%  {k}" for p, k in a["threads"]]
        lines.append("")
        lines.append("By kind of work (self time):")
        lines += [f"  {p:5.1f}%  {k}" for p, k in a["categories"] if p >= 0.3]
        lines.append("")
        lines.append("Top 25 functions (self time). _core is stripped: unexported functions are")
        lines.append("grouped by their .eh_frame range and named by the exported symbols around them:")
        lines += [f"  {p:5.1f}%  {k}" for p, k in a["functions"][:25]]
    shutil.rmtree(tmpdir, ignore_errors=True)
    text = "\n".join(lines)
    print(text)
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, f"{NAME}_profile.txt"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(args.out_dir, f"{NAME}_profile.json"), "w") as f:
        json.dump(result, f, indent=1)
    return 0


def main(argv=None) -> int:
    if argv is None and len(sys.argv) >= 2 and sys.argv[1] == "--profile-child":
        profile_child(sys.argv[2], float(sys.argv[3]))
        return 0
    p = h.argument_parser(__doc__.splitlines()[0])
    p.add_argument("--profile", action="store_true",
                   help="perf profile of the pathways 1-device step instead of the comparison")
    p.add_argument("--profile-size", choices=list(SIZES), default="large")
    p.add_argument("--profile-seconds", type=float, default=5.0)
    args = p.parse_args(argv)
    if args.profile:
        return profile(args)
    os.makedirs(args.out_dir, exist_ok=True)
    sw = h.Stopwatch()
    info = h.machine_info()
    data = sweep(args)
    summary = summarize(data)
    checks = check(data)
    text = report(data, summary, checks, info, sw.elapsed())
    failed = [c for c in checks if c[3] is False]
    if failed:
        text += "\nFAILED: loss check(s): " + "; ".join(c[0] for c in failed)
    print(text)
    data["machine"] = info
    data["summary"] = summary
    data["checks"] = [{"what": w, "max_rel_diff": d, "tolerance": t, "ok": ok} for w, d, t, ok in checks]
    h.write_results(args.out_dir, NAME, text, data)
    plot(summary, os.path.join(args.out_dir, f"{NAME}.png"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
