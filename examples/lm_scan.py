# %% [markdown]
# # A deep LM with its layers in a loop: `pw.lax.scan` over stacked weights
#
# `examples/lm.py` applies the transformer's blocks in a Python loop, so a
# 24-layer model is traced (and its IR holds) 24 copies of a block, forward
# and backward. Stacking the blocks' weights along a leading layer axis and
# running one block per iteration of `pw.lax.scan` traces the block once:
# the IR and the tracing time of the training step no longer grow with the
# depth, and the gradient is a reverse scan over the layers. `--remat` wraps
# the block in `pw.checkpoint`, so the backward recomputes each block from its
# input instead of keeping its intermediates.
#
# The script prints, for the training step (loss, gradients, Adam) of a
# `LAYERS`-layer model, the tracing and compiling time and the IR lines of
# the unrolled and the scanned step, and the memory plan's peak per device;
# then it trains both for a few steps and checks their losses agree to
# 1e-5 (float32). It exits with code 1 if not. Run with `--quick` for a
# shallower model trained for 2 steps (the 24-layer IR is measured anyway).

# %%
import sys
import time

import numpy as np

import pathways as pw

import lm  # examples/lm.py: the transformer's pieces and Adam

QUICK = "--quick" in sys.argv
REMAT = "--remat" in sys.argv
LAYERS = 24
TRAIN_LAYERS = 4 if QUICK else 8
STEPS = 2 if QUICK else 5
VOCAB, SEQ, D_MODEL, HEADS, BATCH = 64, 16, 32, 2, 4  # BATCH sequences per device
RTOL = 1e-5
devices = pw.make_virtual_device_set().add_slice(tpu_devices=2).tpus


def init_params(layers, seed=0):
    r = np.random.default_rng(seed)
    p = {"blocks": [lm.init_block(r, D_MODEL) for _ in range(layers)]}
    p.update(lm.init_embedding(r, VOCAB, SEQ, D_MODEL))
    p.update(lm.init_head(r, VOCAB, D_MODEL))
    return p


def stacked_params(p):
    return dict(p, blocks=lm.stack_blocks(p["blocks"]))


def loss_unrolled(p, tokens):
    x = lm.blocks_loop(p["blocks"], lm.embed(p, tokens[:, :-1]), HEADS)
    return lm.loss(p, x, tokens[:, 1:])


def loss_scanned(p, tokens, remat=REMAT):
    x = lm.blocks_scan(p["blocks"], lm.embed(p, tokens[:, :-1]), HEADS, remat=remat)
    return lm.loss(p, x, tokens[:, 1:])


def train_step(loss_fn):
    def step(p, state, tokens):
        loss, g = pw.value_and_grad(loss_fn)(p, tokens)
        p, state = lm.adam(p, state, pw.pmean(g, "d"))
        return p, state, pw.pmean(loss, "d")
    step.__name__ = f"train_step_{loss_fn.__name__}"
    return pw.pmap(step, devices=devices, axis_name="d")


def shapes(p, tokens):
    """Arguments of the training step with these shapes (tracing needs no data)."""
    def stack(x):
        return np.zeros((len(devices),) + np.shape(x), np.asarray(x).dtype)

    return pw.tree_map(stack, p), pw.tree_map(stack, lm.zero_adam(p)), tokens


# %% [markdown]
# ## The size of the traced step: unrolled against scanned

# %%
tokens = lm.permutation_tokens(1, len(devices) * BATCH, SEQ, VOCAB)[0].reshape(len(devices), BATCH, SEQ + 1)
deep = init_params(LAYERS)
rows = []
for name, fn, params in (("unrolled", loss_unrolled, deep),
                         ("scan", loss_scanned, stacked_params(deep))):
    args = shapes(params, tokens)
    seconds = []
    for _ in range(3):  # the best of 3, each a fresh pmap (its own trace and compile)
        step = train_step(fn)
        start = time.perf_counter()
        text = step.as_text(*args)
        seconds.append(time.perf_counter() - start)
    seconds = min(seconds)
    peak = step.compiled(*args).scratch_bytes_per_shard
    rows.append((name, seconds, len(text.splitlines()), peak))
print(f"{LAYERS}-layer LM, training step (value_and_grad + Adam){' with pw.checkpoint' if REMAT else ''}:")
print(f"{'':>9}  {'trace+compile s':>15}  {'IR lines':>8}  {'peak scratch/device':>19}")
for name, seconds, lines, peak in rows:
    print(f"{name:>9}  {seconds:15.3f}  {lines:8d}  {peak:17d} B")
print(f"scanned IR lines: {rows[1][2]}, unrolled IR lines: {rows[0][2]}")
print(f"scanned peak scratch: {rows[1][3]}, unrolled peak scratch: {rows[0][3]}")

# %% [markdown]
# ## The same training, unrolled and scanned

# %%
init = init_params(TRAIN_LAYERS, seed=1)
data = lm.permutation_tokens(STEPS, len(devices) * BATCH, SEQ, VOCAB, seed=2)
losses = {}
for name, fn, params in (("unrolled", loss_unrolled, init),
                         ("scan", loss_scanned, stacked_params(init))):
    step = train_step(fn)
    p, state = lm.replicate(params, devices), lm.replicate(lm.zero_adam(params), devices)
    losses[name] = []
    for t in data:
        p, state, loss = step(p, state, t.reshape(len(devices), BATCH, SEQ + 1))
        losses[name].append(float(np.asarray(loss)[0]))
worst = lm.compare_losses("scan", losses["scan"], "unrolled", losses["unrolled"])
print(f"\nmax relative difference of the losses: {worst:.2e}")
if not worst < RTOL:
    print(f"FAILED: the scanned LM's losses differ from the unrolled one's by more than {RTOL}")
    sys.exit(1)
print("OK: the scanned LM matches the unrolled one")
