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
import math
import sys
import time

import numpy as np

import pathways as pw
import pathways.numpy as pnp

QUICK = "--quick" in sys.argv
STAGES = 4  # S
MICRO_BATCHES = 8  # M
DEVICES_PER_STAGE = 2  # data parallel inside each stage
STEPS = 3 if QUICK else 20
VOCAB, SEQ, D_MODEL, HEADS = 64, 16, 32, 2
BLOCKS_PER_STAGE = 1
GLOBAL_BATCH = 32  # sequences per step: 2 per device per micro-batch
LR, B1, B2, EPS = 3e-3, 0.9, 0.999, 1e-8
RTOL = 1e-5

assert GLOBAL_BATCH % (MICRO_BATCHES * DEVICES_PER_STAGE) == 0
PER_DEVICE = GLOBAL_BATCH // (MICRO_BATCHES * DEVICES_PER_STAGE)
print(f"{STAGES} stages x {DEVICES_PER_STAGE} devices, {MICRO_BATCHES} micro-batches of "
      f"{GLOBAL_BATCH // MICRO_BATCHES} sequences, {STEPS} steps")

# %% [markdown]
# ## The model, cut into stages
#
# Pre-layer-norm blocks (causal self-attention, then a GELU MLP). Stage 0
# also embeds the tokens; the last stage also holds the final layer norm,
# the output projection and the cross-entropy loss. `stage_fn(s)` is stage
# `s`'s function of (its parameters, its input); the single-device reference
# composes the same functions.

# %%
DH = D_MODEL // HEADS
CAUSAL = np.tril(np.ones((SEQ, SEQ), bool))


def block(p, x):
    b, t, d = x.shape
    h = pw.nn.layer_norm(x, p["ln1_g"], p["ln1_b"])
    qkv = (h @ p["w_qkv"] + p["b_qkv"]).reshape(b, t, 3, HEADS, DH)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    s = pnp.einsum("bqhd,bkhd->bhqk", q, k) * (1.0 / math.sqrt(DH))
    a = pw.nn.softmax(pnp.where(CAUSAL, s, -1e9), axis=-1)
    x = x + pnp.einsum("bhqk,bkhd->bqhd", a, v).reshape(b, t, d) @ p["w_o"]
    h = pw.nn.layer_norm(x, p["ln2_g"], p["ln2_b"])
    return x + pw.nn.gelu(h @ p["w_1"] + p["b_1"]) @ p["w_2"]


def stage_fn(s):
    def first(p, tokens):
        x = p["wte"][tokens] + p["wpe"]
        for bp in p["blocks"]:
            x = block(bp, x)
        return x

    def middle(p, x):
        for bp in p["blocks"]:
            x = block(bp, x)
        return x

    def last(p, x, targets):
        x = middle(p, x)
        x = pw.nn.layer_norm(x, p["lnf_g"], p["lnf_b"])
        logp = pw.nn.log_softmax(x @ p["w_out"], axis=-1)
        return -pnp.mean(pnp.sum(pw.nn.one_hot(targets, VOCAB) * logp, axis=-1))

    return first if s == 0 else last if s == STAGES - 1 else middle


def init_params(seed=0):
    r = np.random.default_rng(seed)

    def normal(*shape, std=0.02):
        return (r.standard_normal(shape) * std).astype(np.float32)

    def blk():
        d = D_MODEL
        return {"ln1_g": np.ones(d, np.float32), "ln1_b": np.zeros(d, np.float32),
                "w_qkv": normal(d, 3 * d), "b_qkv": np.zeros(3 * d, np.float32),
                "w_o": normal(d, d), "ln2_g": np.ones(d, np.float32),
                "ln2_b": np.zeros(d, np.float32), "w_1": normal(d, 4 * d),
                "b_1": np.zeros(4 * d, np.float32), "w_2": normal(4 * d, d)}

    stages = [{"blocks": [blk() for _ in range(BLOCKS_PER_STAGE)]} for _ in range(STAGES)]
    stages[0].update(wte=normal(VOCAB, D_MODEL), wpe=normal(SEQ, D_MODEL, std=0.01))
    stages[-1].update(lnf_g=np.ones(D_MODEL, np.float32), lnf_b=np.zeros(D_MODEL, np.float32),
                      w_out=normal(D_MODEL, VOCAB))
    return stages


def adam(p, m, v, g, t):
    """One Adam step of a parameter pytree (bias-corrected)."""
    m = pw.tree_map(lambda m, g: B1 * m + (1.0 - B1) * g, m, g)
    v = pw.tree_map(lambda v, g: B2 * v + (1.0 - B2) * (g * g), v, g)
    c1, c2 = 1.0 - B1 ** t, 1.0 - B2 ** t
    p = pw.tree_map(lambda p, m, v: p - LR * (m / c1) / (pnp.sqrt(v / c2) + EPS), p, m, v)
    return p, m, v


def make_tokens(seed=1):
    """Learnable data: each sequence follows a fixed random permutation of the
    vocabulary from a random first token (next token = PERM[token])."""
    r = np.random.default_rng(seed)
    perm = r.permutation(VOCAB)
    tokens = np.empty((STEPS, GLOBAL_BATCH, SEQ + 1), np.int32)
    tokens[..., 0] = r.integers(0, VOCAB, size=(STEPS, GLOBAL_BATCH))
    for i in range(SEQ):
        tokens[..., i + 1] = perm[tokens[..., i]]
    return tokens


tokens_all = make_tokens()

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


def update_fn(p, state, grads):
    t = state["t"] + 1.0
    g = pw.psum(grads, "d")
    p, m, v = adam(p, state["m"], state["v"], g, t)
    return p, {"m": m, "v": v, "t": t}


update = [pw.pmap(update_fn, devices=sl.tpus, axis_name="d") for sl in slices]
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


def replicate(tree, devices):
    return pw.device_put(pw.tree_map(lambda x: np.stack([x] * len(devices)), tree), devices)


def micro_batches(tokens):
    """[B, T+1] -> per micro-batch: inputs and targets [devices, B/(M x devices), T]."""
    mb = tokens.reshape(MICRO_BATCHES, DEVICES_PER_STAGE, PER_DEVICE, SEQ + 1)
    return [x[..., :-1] for x in mb], [x[..., 1:] for x in mb]


def zero_state(p):
    return {"m": pw.tree_map(np.zeros_like, p), "v": pw.tree_map(np.zeros_like, p),
            "t": np.zeros((), np.float32)}


init = init_params()
params = [replicate(init[s], slices[s].tpus) for s in range(STAGES)]
states = [replicate(zero_state(init[s]), slices[s].tpus) for s in range(STAGES)]
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
    new = []
    for p, st, g in zip(params, states, grads):
        t = st["t"] + 1.0
        p, m, v = adam(p, st["m"], st["v"], g, t)
        new.append((p, {"m": m, "v": v, "t": t}))
    return [p for p, _ in new], [st for _, st in new], loss


one = vds.add_slice(tpu_devices=1).tpus
ref_step = pw.pmap(reference_step, devices=one)
ref_params = [replicate(init[s], one) for s in range(STAGES)]
ref_states = [replicate(zero_state(init[s]), one) for s in range(STAGES)]
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
print(f"\n{'step':>4}  {'pipeline loss':>14}  {'1-device loss':>14}  {'rel. diff':>9}")
worst = 0.0
for step, (a, b) in enumerate(zip(pipeline_losses, reference_losses)):
    rel = abs(a - b) / abs(b)
    worst = max(worst, rel)
    print(f"{step:4d}  {a:14.9f}  {b:14.9f}  {rel:9.2e}")

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
