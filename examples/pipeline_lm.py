# %% [markdown]
# # Pipelined training of a transformer LM with `pw.vjp` (GPipe)
#
# Pathways exists for programs that one SPMD computation expresses badly; a
# pipeline is the first of them (paper §1, §5.3). Here a decoder-only LM is
# cut into S = 4 stages, each on its own slice of 2 devices. A training step
# runs M = 8 micro-batches GPipe style: every micro-batch's forward through
# the 4 stages, then every micro-batch's backward in reverse. Gradients are
# accumulated per stage, and each stage takes its own Adam step.
#
# `pw.vjp` on a pmap'd stage makes two nodes of the program: the forward one
# also outputs the stage's *residuals* (the activations its backward reads),
# and the backward one reads them on the stage's devices with the cotangent
# from the next stage. So nothing is recomputed. The whole step, S x M
# forwards, S x M backwards, the accumulations and the optimizer steps, is one
# `@pw.program`: one dispatch from Python, with the transfers between the
# slices inserted by the runtime.
#
# The check: the same model trained with the same data on one device (no
# pipeline, one `pw.value_and_grad` over the whole batch) gives the same
# losses to 1e-5 over 20 steps, in float32. The script exits with code 1
# if it does not. Run with `--quick` for a 3-step check.

# %%
import sys
import time

import numpy as np

import pathways as pw

import lm  # examples/lm.py: the transformer's pieces and Adam

QUICK = "--quick" in sys.argv
STAGES = 4  # S
MICRO_BATCHES = 8  # M
DEVICES_PER_STAGE = 2  # data parallel inside each stage
STEPS = 3 if QUICK else 20
VOCAB, SEQ, D_MODEL, HEADS = 64, 16, 32, 2
BLOCKS_PER_STAGE = 1
GLOBAL_BATCH = 32  # sequences per step: 2 per device per micro-batch
RTOL = 1e-5

assert GLOBAL_BATCH % (MICRO_BATCHES * DEVICES_PER_STAGE) == 0
PER_DEVICE = GLOBAL_BATCH // (MICRO_BATCHES * DEVICES_PER_STAGE)
print(f"{STAGES} stages x {DEVICES_PER_STAGE} devices, {MICRO_BATCHES} micro-batches of "
      f"{GLOBAL_BATCH // MICRO_BATCHES} sequences, {STEPS} steps")

# %% [markdown]
# ## The model, cut into stages
#
# Pre-layer-norm blocks (causal self-attention, then a GELU MLP; see
# `examples/lm.py`). Stage 0 also embeds the tokens; the last stage also
# holds the final layer norm, the output projection and the cross-entropy
# loss. `stage_fn(s)` is stage `s`'s function of (its parameters, its
# input); the single-device reference composes the same functions.

# %%
def stage_fn(s):
    def middle(p, x):
        for bp in p["blocks"]:
            x = lm.block(bp, x, HEADS)
        return x

    def first(p, tokens):
        return middle(p, lm.embed(p, tokens))

    def last(p, x, targets):
        return lm.loss(p, middle(p, x), targets)

    return first if s == 0 else last if s == STAGES - 1 else middle


def init_params(seed=0):
    r = np.random.default_rng(seed)
    stages = [{"blocks": [lm.init_block(r, D_MODEL) for _ in range(BLOCKS_PER_STAGE)]}
              for _ in range(STAGES)]
    stages[0].update(lm.init_embedding(r, VOCAB, SEQ, D_MODEL))
    stages[-1].update(lm.init_head(r, VOCAB, D_MODEL))
    return stages


tokens_all = lm.permutation_tokens(STEPS, GLOBAL_BATCH, SEQ, VOCAB)

# %% [markdown]
# ## The pipeline
#
# Each stage's functions are pmap'd over its slice (axis "d"): the forward
# `stages[s]` (taken apart by `pw.vjp`), `accumulate` for the gradients of
# the micro-batches, and `update`, which sums the gradients over the slice's
# devices (`pw.psum`) and takes the Adam step. The cotangent of each
# micro-batch's loss on each device is 1 / (M x devices), so the summed
# gradients are those of the mean loss over the whole batch.

# %%
vds = pw.make_virtual_device_set()
slices = [vds.add_slice(tpu_devices=DEVICES_PER_STAGE) for _ in range(STAGES)]
stages = [pw.pmap(stage_fn(s), devices=slices[s].tpus, axis_name="d") for s in range(STAGES)]
accumulate = [pw.pmap(lambda a, g: pw.tree_map(lambda x, y: x + y, a, g), devices=sl.tpus)
              for sl in slices]


update = [pw.pmap(lambda p, state, g: lm.adam(p, state, pw.psum(g, "d")), devices=sl.tpus,
                  axis_name="d") for sl in slices]
LOSS_CT = np.full((DEVICES_PER_STAGE,), 1.0 / (MICRO_BATCHES * DEVICES_PER_STAGE), np.float32)


@pw.program
def train_step(params, states, inputs, targets):
    # All forwards: micro-batch m through stage 0, 1, ..., S-1.
    pullbacks, losses = [], []
    for m in range(MICRO_BATCHES):
        h = inputs[m]
        pbs = []
        for s in range(STAGES):
            args = (params[s], h, targets[m]) if s == STAGES - 1 else (params[s], h)
            h, pb = pw.vjp(stages[s], *args)
            pbs.append(pb)
        pullbacks.append(pbs)
        losses.append(h)
    # All backwards, with the gradients accumulated per stage.
    grads = [None] * STAGES
    for m in range(MICRO_BATCHES):
        ct = LOSS_CT
        for s in reversed(range(STAGES)):
            g, ct, *_ = pullbacks[m][s](ct)  # stage 0's ct: the (zero) one of its tokens
            grads[s] = g if grads[s] is None else accumulate[s](grads[s], g)
    new = [update[s](params[s], states[s], grads[s]) for s in range(STAGES)]
    return [p for p, _ in new], [st for _, st in new], losses


def micro_batches(tokens):
    """[B, T+1] -> per micro-batch: inputs and targets [devices, B/(M x devices), T]."""
    mb = tokens.reshape(MICRO_BATCHES, DEVICES_PER_STAGE, PER_DEVICE, SEQ + 1)
    return [x[..., :-1] for x in mb], [x[..., 1:] for x in mb]


init = init_params()
params = [lm.replicate(init[s], slices[s].tpus) for s in range(STAGES)]
states = [lm.replicate(lm.zero_adam(init[s]), slices[s].tpus) for s in range(STAGES)]
inputs, targets = micro_batches(tokens_all[0])
prog = train_step.trace(params, states, inputs, targets)
print(f"one program per step: {prog.num_nodes} nodes "
      f"({STAGES * MICRO_BATCHES} forward, {STAGES * MICRO_BATCHES} backward, "
      f"{STAGES * (MICRO_BATCHES - 1)} accumulations, {STAGES} optimizer steps)")

pipeline_losses = []
t0 = time.perf_counter()
for step in range(STEPS):
    inputs, targets = micro_batches(tokens_all[step])
    if step == STEPS - 1:
        with pw.timeline() as tl:
            params, states, losses = train_step(params, states, inputs, targets)
            pw.block_until_ready(losses)
    else:
        params, states, losses = train_step(params, states, inputs, targets)
    pipeline_losses.append(float(np.mean([np.asarray(x, np.float64) for x in losses])))
pipeline_seconds = time.perf_counter() - t0

# %% [markdown]
# ## The reference: the same model on one device
#
# The stages composed into one loss over the whole batch, its gradient by
# `pw.value_and_grad`, and the same Adam step, on a 1-device slice.

# %%
def reference_step(params, states, tokens):
    def loss_fn(params):
        h = tokens[:, :-1]
        for s in range(STAGES - 1):
            h = stage_fn(s)(params[s], h)
        return stage_fn(STAGES - 1)(params[-1], h, tokens[:, 1:])

    loss, grads = pw.value_and_grad(loss_fn)(params)
    new = [lm.adam(p, st, g) for p, st, g in zip(params, states, grads)]
    return [p for p, _ in new], [st for _, st in new], loss


one = vds.add_slice(tpu_devices=1).tpus
ref_step = pw.pmap(reference_step, devices=one)
ref_params = [lm.replicate(init[s], one) for s in range(STAGES)]
ref_states = [lm.replicate(lm.zero_adam(init[s]), one) for s in range(STAGES)]
reference_losses = []
for step in range(STEPS):
    ref_params, ref_states, loss = ref_step(ref_params, ref_states, tokens_all[step][None])
    reference_losses.append(float(np.asarray(loss)[0]))

# %% [markdown]
# ## Results
#
# The bubble fraction is read from the timeline of the last step: the share
# of the step's span (first gang start to last gang end) in which a stage
# device was idle, averaged over the devices. GPipe's bubble with equal
# stages is (S - 1) / (M + S - 1); here every device shares this machine's
# cores with the others, so the measured one is only indicative.

# %%
worst = lm.compare_losses("pipeline loss", pipeline_losses, "1-device loss", reference_losses)

events = [e for e in tl.events() if e["program"] == "train_step"]
span = max(e["end_us"] for e in events) - min(e["start_us"] for e in events)
busy = {}
for e in events:
    busy[e["device"]] = busy.get(e["device"], 0.0) + e["end_us"] - e["start_us"]
bubble = 1.0 - sum(busy.values()) / (len(busy) * span)
print(f"\nbubble fraction of the last step (timeline): {bubble:.2f} "
      f"(GPipe ideal: {(STAGES - 1) / (MICRO_BATCHES + STAGES - 1):.2f}); "
      f"{STEPS} steps in {pipeline_seconds:.2f} s")
print(f"max relative difference of the losses: {worst:.2e}")
learned = reference_losses[-1] < reference_losses[0]
if worst > RTOL or not learned:
    print(f"FAILED: the pipeline's losses differ from the single-device run by {worst:.2e} "
          f"(limit {RTOL:g}), or the loss did not go down")
    sys.exit(1)
print("OK: the pipeline matches the single-device run")
