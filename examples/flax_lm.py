# %% [markdown]
# # A Flax + optax transformer LM, unchanged, on pathways
#
# The model below is written as a JAX user writes it: a `flax.linen` module
# with dropout, `optax.adamw`, `jax.value_and_grad`, `jax.lax.pmean` over the
# data-parallel axis. Nothing in it knows about pathways. `pw.pmap` hands the
# step to JAX's tracer, lowers the jaxpr into pathways' function IR, compiles
# it once per input signature and runs it on virtual devices (the paper runs
# JAX's programs the same way: JAX traces, Pathways runs).
#
# Two ways to train it, each checked against `jax.jit` at every step:
#
# 1. **Data parallel over 2 devices**: one `pw.pmap` of the whole train step.
#    The reference is `jax.jit(jax.vmap(step, axis_name="d"))`, which computes
#    what `jax.pmap` computes, on one CPU device.
# 2. **A 2-stage pipeline in one `@pw.program`**: the model cut in two, each
#    stage on its own slice of 2 devices (data parallel inside the stage),
#    2 micro-batches per step. Stage 1's forward returns `jax.vjp`'s pullback,
#    a pytree whose leaves (the residuals) stay on stage 1's devices; stage 2
#    computes its loss and gradients; stage 1's backward applies the pullback
#    to stage 2's cotangent. Gradients accumulate per stage and each stage
#    takes its own `optax.adamw` step. The whole step is one program: one
#    dispatch, the transfers between the slices inserted by the runtime.
#
# The script exits with code 1 if pathways and JAX disagree. `--quick` runs
# 3 steps of each.

# %%
import sys
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

import pathways as pw

QUICK = "--quick" in sys.argv
STEPS = 3 if QUICK else 20
VOCAB, SEQ, D_MODEL, HEADS, DROPOUT = 64, 16, 32, 4, 0.1
DEVICES = 2
PER_DEVICE = 4  # sequences per device per step
MICRO_BATCHES = 2  # in the pipeline
LOSS_RTOL = 1e-5
PARAM_ATOL = 1e-5
# Adam divides by the gradient's RMS, so where a gradient is exactly zero
# (attention's key bias: softmax does not see it) float32 round-off of 1e-9
# moves that parameter by up to the learning rate per step, in JAX as in
# pathways: those parameters are held to that bound, the others to PARAM_ATOL.
LR = 1e-3
KEY_BIAS_ATOL_PER_STEP = 2.5 * LR


# %% [markdown]
# ## The model (plain Flax)

# %%
class Block(nn.Module):
    @nn.compact
    def __call__(self, x, train):
        mask = nn.make_causal_mask(jnp.ones(x.shape[:2]))
        h = nn.SelfAttention(num_heads=HEADS, dropout_rate=DROPOUT, deterministic=not train)(
            nn.LayerNorm()(x), mask=mask)
        x = x + nn.Dropout(DROPOUT, deterministic=not train)(h)
        h = nn.Dense(D_MODEL)(nn.gelu(nn.Dense(4 * D_MODEL)(nn.LayerNorm()(x))))
        return x + nn.Dropout(DROPOUT, deterministic=not train)(h)


class Embed(nn.Module):  # stage 1: tokens -> activations
    @nn.compact
    def __call__(self, tokens, train):
        x = nn.Embed(VOCAB, D_MODEL)(tokens)
        x = x + self.param("pos", nn.initializers.normal(0.02), (SEQ, D_MODEL))
        return Block()(x, train)


class Head(nn.Module):  # stage 2: activations -> logits
    @nn.compact
    def __call__(self, x, train):
        return nn.Dense(VOCAB)(nn.LayerNorm()(Block()(x, train)))


embed, head = Embed(), Head()
tx = optax.adamw(LR)


def loss_fn(params, tokens, key):
    k1, k2 = jax.random.split(key)
    x = embed.apply(params["embed"], tokens[:, :-1], True, rngs={"dropout": k1})
    logits = head.apply(params["head"], x, True, rngs={"dropout": k2})
    return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()


def train_step(params, opt_state, tokens, key):
    loss, grads = jax.value_and_grad(loss_fn)(params, tokens, key)
    grads = jax.lax.pmean(grads, "d")
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, jax.lax.pmean(loss, "d")


rng = np.random.default_rng(0)
# Each sequence counts up from a random start (mod VOCAB): learnable.
starts = rng.integers(0, VOCAB, (STEPS, DEVICES, PER_DEVICE, 1))
data = ((starts + np.arange(SEQ + 1)) % VOCAB).astype(np.int32)
init_tokens = data[0, 0, :, :-1]
params = {"embed": embed.init(jax.random.PRNGKey(0), init_tokens, False),
          "head": head.init(jax.random.PRNGKey(1), jnp.zeros((PER_DEVICE, SEQ, D_MODEL)), False)}
opt_state = tx.init(params)


def replicate(tree):
    return jax.tree_util.tree_map(lambda a: np.broadcast_to(np.asarray(a), (DEVICES,) + np.shape(a)), tree)


def step_keys(step):
    return jax.random.split(jax.random.PRNGKey(100 + step), DEVICES)


def max_abs_diffs(a, b):
    """(attention key biases, every other parameter): the largest absolute difference."""
    out = [0.0, 0.0]
    for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree_util.tree_leaves(b)):
        key_bias = "'key'" in jax.tree_util.keystr(path) and "'bias'" in jax.tree_util.keystr(path)
        d = float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))))
        out[0 if key_bias else 1] = max(out[0 if key_bias else 1], d)
    return out


def params_agree(a, b, step):
    key_bias, rest = max_abs_diffs(a, b)
    print(f"  {rest:.1e} / {key_bias:.1e}")
    return rest <= PARAM_ATOL and key_bias <= KEY_BIAS_ATOL_PER_STEP * (step + 1)


ok = True

# %% [markdown]
# ## 1. Data parallel: one `pw.pmap` of the train step

# %%
devices = pw.make_virtual_device_set().add_slice(tpu_devices=DEVICES).tpus
pw_step = pw.pmap(train_step, axis_name="d", devices=devices)
jax_step = jax.jit(jax.vmap(train_step, axis_name="d"))

state_pw = state_jax = (replicate(params), replicate(opt_state))
print("data parallel over 2 devices: step, loss (pathways), loss (jax.jit), max |param diff| "
      "(others / attention key biases)")
worst = 0.0
for step in range(STEPS):
    *state_pw, loss_pw = pw_step(*state_pw, data[step], step_keys(step))
    *state_jax, loss_jax = jax_step(*state_jax, data[step], step_keys(step))
    lp, lj = float(np.asarray(loss_pw)[0]), float(np.asarray(loss_jax)[0])
    worst = max(worst, abs(lp - lj) / abs(lj))
    print(f"  {step:3d}  {lp:.6f}  {lj:.6f}", end="")
    ok = params_agree(state_pw[0], state_jax[0], step) and ok
print(f"max relative difference of the losses: {worst:.2e}")
ok = ok and worst < LOSS_RTOL

# %% [markdown]
# ## 2. A 2-stage pipeline in one `@pw.program`
#
# Per stage, two pmaps over the stage's slice: stage 1's forward returns its
# output and `jax.vjp`'s pullback; stage 2 computes loss and gradients and
# the cotangent of its input; stage 1's backward calls the pullback. The
# dropout keys of the two stages are split from one key per micro-batch,
# as `loss_fn` splits them.

# %%
stage1_devices = pw.make_virtual_device_set().add_slice(tpu_devices=DEVICES).tpus
stage2_devices = pw.make_virtual_device_set().add_slice(tpu_devices=DEVICES).tpus


def stage1_forward(p, tokens, key):
    k1, _ = jax.random.split(key)
    x, pullback = jax.vjp(lambda p: embed.apply(p, tokens[:, :-1], True, rngs={"dropout": k1}), p)
    return x, pullback


def stage2_forward_backward(p, x, tokens, key):
    _, k2 = jax.random.split(key)

    def stage_loss(p, x):
        logits = head.apply(p, x, True, rngs={"dropout": k2})
        return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

    loss, (grads, dx) = jax.value_and_grad(stage_loss, argnums=(0, 1))(p, x)
    return loss, grads, dx


def stage1_backward(pullback, dx):
    (grads,) = pullback(dx)
    return grads


def accumulate(a, b):
    return jax.tree_util.tree_map(jnp.add, a, b)


def adam_step(p, opt_state, grads):
    grads = jax.lax.pmean(jax.tree_util.tree_map(lambda g: g / MICRO_BATCHES, grads), "d")
    updates, opt_state = tx.update(grads, opt_state, p)
    return optax.apply_updates(p, updates), opt_state


def pipeline(fwd1, fwdbwd2, bwd1, acc1, acc2, opt1, opt2, mean_loss):
    """The train step, given each stage's functions: pmaps on the stages' slices for
    pathways, the plain functions for the JAX reference."""

    def step(p1, p2, o1, o2, micro_tokens, micro_keys):
        g1 = g2 = None
        losses = []
        for tokens, key in zip(micro_tokens, micro_keys):
            x, pullback = fwd1(p1, tokens, key)
            loss, grads2, dx = fwdbwd2(p2, x, tokens, key)
            grads1 = bwd1(pullback, dx)
            g1 = grads1 if g1 is None else acc1(g1, grads1)
            g2 = grads2 if g2 is None else acc2(g2, grads2)
            losses.append(loss)
        p1, o1 = opt1(p1, o1, g1)
        p2, o2 = opt2(p2, o2, g2)
        return p1, p2, o1, o2, mean_loss(*losses)

    return step


def mean_of(*losses):
    return jax.lax.pmean(sum(losses) / len(losses), "d")


def on(devices, fn, axis_name=None):
    return pw.pmap(fn, axis_name=axis_name, devices=devices)


s1, s2 = stage1_devices, stage2_devices
pipeline_step = pw.program(pipeline(
    on(s1, stage1_forward), on(s2, stage2_forward_backward), on(s1, stage1_backward),
    on(s1, accumulate), on(s2, accumulate), on(s1, adam_step, "d"), on(s2, adam_step, "d"),
    on(s2, mean_of, "d")))
reference_step = pipeline(stage1_forward, stage2_forward_backward, stage1_backward, accumulate,
                          accumulate, adam_step, adam_step, mean_of)
jax_pipeline = jax.jit(jax.vmap(reference_step, axis_name="d"))


def micro(step):
    tokens = np.split(data[step], MICRO_BATCHES, axis=1)  # devices x (batch / M) x seq
    keys = [jax.random.split(jax.random.PRNGKey(1000 * step + m), DEVICES) for m in range(MICRO_BATCHES)]
    return tokens, keys


state_pw = state_jax = (replicate(params["embed"]), replicate(params["head"]),
                        replicate(tx.init(params["embed"])), replicate(tx.init(params["head"])))
prog = pipeline_step.trace(*state_pw, *micro(0))
print(f"one program per step: {prog.num_nodes} nodes ({MICRO_BATCHES} x 3 stage calls, "
      f"{2 * (MICRO_BATCHES - 1)} accumulations, 2 optimizer steps, 1 mean of the losses)")
print(f"\n2-stage pipeline, {MICRO_BATCHES} micro-batches, one program per step: step, loss (pathways), "
      "loss (jax.jit), max |param diff| (others / attention key biases)")
worst = 0.0
times = []
for step in range(STEPS):
    t0 = time.perf_counter()
    *state_pw, loss_pw = pipeline_step(*state_pw, *micro(step))
    loss_value = np.asarray(loss_pw)
    times.append(time.perf_counter() - t0)
    *state_jax, loss_jax = jax_pipeline(*state_jax, *micro(step))
    lp, lj = float(loss_value[0]), float(np.asarray(loss_jax)[0])
    worst = max(worst, abs(lp - lj) / abs(lj))
    print(f"  {step:3d}  {lp:.6f}  {lj:.6f}", end="")
    ok = params_agree(state_pw[:2], state_jax[:2], step) and ok
print(f"max relative difference of the losses: {worst:.2e}")
ok = ok and worst < LOSS_RTOL
print(f"pipeline step time after the first: {np.median(times[1:]) * 1e3:.1f} ms (median)"
      if len(times) > 1 else "")

if not ok:
    print("FAILED: pathways and jax.jit disagree")
    sys.exit(1)
print("OK: data parallel and the 2-stage pipeline match jax.jit at every step")
