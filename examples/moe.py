# %% [markdown]
# # A mixture-of-experts layer, GShard style
#
# Sparse models put their experts on devices of their own, and route each
# token to a few of them (paper §1; GShard, Lepikhin et al. 2020). Here a
# small LM has one mixture-of-experts layer in place of the MLP of its
# second block, with E = 4 experts on a 4-device expert slice: expert e's
# weights live on device e. Each device also holds a quarter of the batch
# (a *group* of tokens, in GShard's words). For each group:
#
# 1. The gate (`x @ w_gate`, softmax) scores every expert; `pw.lax.top_k`
#    picks each token's top 2 and their weights (renormalized to sum to 1).
# 2. Each expert takes at most C = capacity_factor x 2 x tokens / E tokens of
#    the group, in token order, first choices before second ones; the rest
#    are dropped (their output is the residual alone).
# 3. A dispatch tensor [tokens, E, C] gathers each expert's tokens into
#    [E, C, d]; `pw.all_to_all` over the expert axis sends block e to device
#    e, which runs its expert on the tokens of all groups; a second
#    `all_to_all` sends the results back, and a combine tensor (the dispatch
#    tensor times the gate weights) adds them up per token.
#
# The check: a dense reference on one device computes the same routing and
# capacity per group, runs every expert on every token and weights the
# results by the same combine tensor. Over a few training steps (Adam) the
# losses agree to 1e-5 in float32, and the script exits with code 1 if not.
# Run with `--quick` for 3 steps.

# %%
import math
import sys

import numpy as np

import pathways as pw
import pathways.numpy as pnp

import lm  # examples/lm.py: the transformer's pieces and Adam

QUICK = "--quick" in sys.argv
STEPS = 3 if QUICK else 10
EXPERTS = 4  # one per device of the expert slice
VOCAB, SEQ, D_MODEL, HEADS, HIDDEN = 64, 16, 32, 2, 64
GLOBAL_BATCH = 16  # sequences per step: 4 per device (a group of 64 tokens)
CAPACITY_FACTOR = 1.0
AUX_WEIGHT = 0.01  # GShard's load-balancing loss
RTOL = 1e-5
GROUP_TOKENS = GLOBAL_BATCH // EXPERTS * SEQ
CAPACITY = math.ceil(CAPACITY_FACTOR * 2 * GROUP_TOKENS / EXPERTS)
print(f"{EXPERTS} experts on {EXPERTS} devices, top-2 gating, {GROUP_TOKENS} tokens per group, "
      f"capacity {CAPACITY} tokens per expert and group, {STEPS} steps")

# %% [markdown]
# ## Routing: top-2 gating with a capacity
#
# `route` works on one group's tokens x [n, d]. A token's position in an
# expert's buffer is the number of tokens before it that chose the same
# expert: a cumulative sum, computed as a product with a lower triangular
# matrix of ones. Second choices queue after all first choices, as in GShard.

# %%
TRIL = np.tril(np.ones((GROUP_TOKENS, GROUP_TOKENS), np.float32))


def route(w_gate, x):
    """(dispatch [n, E, C] of 0/1, combine [n, E, C] of gate weights, aux loss)."""
    probs = pw.nn.softmax(x @ w_gate, axis=-1)  # [n, E]
    top, idx = pw.lax.top_k(probs, 2)  # [n, 2] each
    gates = top / top.sum(axis=-1, keepdims=True)
    masks = [pw.nn.one_hot(idx[:, k], EXPERTS) for k in range(2)]  # [n, E] each
    filled = pnp.zeros_like(masks[0][0])  # [E]: slots taken by earlier choices
    dispatch = combine = 0.0
    for k in range(2):
        pos = TRIL @ masks[k] - 1.0 + filled  # position in the expert's buffer
        filled = filled + masks[k].sum(axis=0)
        keep = masks[k] * (pos < CAPACITY)  # [n, E]: 1 where the token got a slot
        slot = pw.nn.one_hot((pos * keep).sum(axis=-1).astype(np.int32), CAPACITY)  # [n, C]
        d = keep[:, :, None] * slot[:, None, :]
        dispatch = dispatch + d
        combine = combine + d * gates[:, k, None, None]
    # Load balancing (GShard): fraction of first choices times mean gate probability.
    aux = EXPERTS * (masks[0].mean(axis=0) * probs.mean(axis=0)).sum()
    return dispatch, combine, aux


def expert_ffn(w1, w2, x):
    return pw.nn.gelu(x @ w1) @ w2


# %% [markdown]
# ## The model
#
# Block 1 is a plain block; block 2's feed-forward layer is the
# mixture of experts. `moe_ffn` is the sharded version (one group per device,
# experts over the "e" axis); `dense_ffn` the reference (all groups, every
# expert on every token).

# %%
def moe_ffn(p, x):
    """x [1, n, d]: this device's group."""
    dispatch, combine, aux = route(p["w_gate"], x[0])
    expert_in = pnp.einsum("nec,nd->ecd", dispatch, x[0])  # [E, C, d] for each expert
    expert_in = pw.all_to_all(expert_in, "e", 0, 0)  # [groups, C, d] for my expert
    y = expert_ffn(p["w1"], p["w2"], expert_in)
    y = pw.all_to_all(y, "e", 0, 0)  # [E, C, d] back from each expert
    return pnp.einsum("nec,ecd->nd", combine, y)[None], aux


def dense_ffn(p, x):
    """x [groups, n, d]: all groups."""
    out, aux = [], 0.0
    for i in range(x.shape[0]):
        _, combine, a = route(p["w_gate"], x[i])
        weights = combine.sum(axis=-1)  # [n, E]
        ys = [expert_ffn(p["w1"][e], p["w2"][e], x[i]) for e in range(EXPERTS)]
        out.append(sum(weights[:, e, None] * ys[e] for e in range(EXPERTS)))
        aux = aux + a * (1.0 / x.shape[0])
    return pnp.stack(out), aux


def moe_input(p, tokens):
    """The residual stream x [b, t, d] before the MoE layer, and its input [groups, n, d]."""
    x = lm.embed(p, tokens[:, :-1])
    x = lm.block(p["block1"], x, HEADS)
    b2 = p["block2"]
    x = x + lm.attention(b2, pw.nn.layer_norm(x, b2["ln1_g"], b2["ln1_b"]), HEADS)
    h = pw.nn.layer_norm(x, b2["ln2_g"], b2["ln2_b"])
    return x, h.reshape(-1, GROUP_TOKENS, D_MODEL)


def forward(p, tokens, ffn):
    """The last hidden state [b, t, d] and the load-balancing loss."""
    x, h = moe_input(p, tokens)
    h, aux = ffn(p["moe"], h)
    return x + h.reshape(x.shape), aux


def init_params(seed=0):
    r = np.random.default_rng(seed)
    p = {"block1": lm.init_block(r, D_MODEL), "block2": lm.init_block(r, D_MODEL)}
    p.update(lm.init_embedding(r, VOCAB, SEQ, D_MODEL))
    p.update(lm.init_head(r, VOCAB, D_MODEL))
    p["moe"] = {"w_gate": lm.normal(r, D_MODEL, EXPERTS, std=0.5),
                "w1": lm.normal(r, EXPERTS, D_MODEL, HIDDEN),
                "w2": lm.normal(r, EXPERTS, HIDDEN, D_MODEL)}
    return p


# %% [markdown]
# ## Training step on the expert slice, and the reference
#
# On the slice, the experts' weights are sharded (device e holds expert e)
# and everything else is replicated. `pw.grad` inside the pmap has
# `jax.pmap`'s semantics: each device gets the gradient of the sum of all
# devices' losses, the transpose of `all_to_all` bringing each expert the
# gradient from every group. So the replicated parameters' gradients are
# averaged with `pw.pmean`, and the experts' divided by the number of groups.

# %%
def split(p):
    experts = {"w1": p["moe"]["w1"], "w2": p["moe"]["w2"]}
    rest = dict(p, moe={"w_gate": p["moe"]["w_gate"]})
    return rest, experts


def sharded_loss(rest, experts, tokens):
    p = dict(rest, moe=dict(rest["moe"], **experts))
    x, aux = forward(p, tokens, moe_ffn)
    return lm.loss(p, x, tokens[:, 1:]) + AUX_WEIGHT * aux


def sharded_step(rest, experts, state_rest, state_experts, tokens):
    loss, (g_rest, g_experts) = pw.value_and_grad(sharded_loss, argnums=(0, 1))(
        rest, experts, tokens)
    g_rest = pw.pmean(g_rest, "e")
    g_experts = pw.tree_map(lambda g: g * (1.0 / EXPERTS), g_experts)
    rest, state_rest = lm.adam(rest, state_rest, g_rest)
    experts, state_experts = lm.adam(experts, state_experts, g_experts)
    return rest, experts, state_rest, state_experts, pw.pmean(loss, "e")


def dense_loss(p, tokens):  # all groups' tokens, group after group
    x, aux = forward(p, tokens, dense_ffn)
    return lm.loss(p, x, tokens[:, 1:]) + AUX_WEIGHT * aux


def dense_step(p, state, tokens):
    loss, g = pw.value_and_grad(dense_loss)(p, tokens)
    p, state = lm.adam(p, state, g)
    return p, state, loss


vds = pw.make_virtual_device_set()
expert_slice = vds.add_slice(tpu_devices=EXPERTS)
one = vds.add_slice(tpu_devices=1)
step_moe = pw.pmap(sharded_step, devices=expert_slice.tpus, axis_name="e")
step_dense = pw.pmap(dense_step, devices=one.tpus)

init = init_params()
rest, experts = split(init)
rest_s, experts_s = lm.replicate(rest, expert_slice.tpus), pw.device_put(experts, expert_slice.tpus)
state_rest = lm.replicate(lm.zero_adam(rest), expert_slice.tpus)
state_experts = {"m": pw.device_put(pw.tree_map(np.zeros_like, experts), expert_slice.tpus),
                 "v": pw.device_put(pw.tree_map(np.zeros_like, experts), expert_slice.tpus),
                 "t": lm.replicate(np.zeros((), np.float32), expert_slice.tpus)}
dense_p, dense_state = lm.replicate(init, one.tpus), lm.replicate(lm.zero_adam(init), one.tpus)
tokens_all = lm.permutation_tokens(STEPS, GLOBAL_BATCH, SEQ, VOCAB)

moe_losses, dense_losses = [], []
for step in range(STEPS):
    groups = tokens_all[step].reshape(EXPERTS, -1, SEQ + 1)
    rest_s, experts_s, state_rest, state_experts, loss = step_moe(
        rest_s, experts_s, state_rest, state_experts, groups)
    moe_losses.append(float(np.asarray(loss)[0]))
    dense_p, dense_state, loss = step_dense(dense_p, dense_state, tokens_all[step][None])
    dense_losses.append(float(np.asarray(loss)[0]))

# %% [markdown]
# ## Results

# %%
worst = lm.compare_losses("experts sharded", moe_losses, "dense", dense_losses)


def expert_load(p, tokens):
    """Per expert, over all groups: token choices routed to it, and those it kept."""
    _, h = moe_input(p, tokens)
    chosen = kept = 0.0
    for i in range(h.shape[0]):
        probs = pw.nn.softmax(h[i] @ p["moe"]["w_gate"], axis=-1)
        idx = pw.lax.top_k(probs, 2)[1]
        chosen = chosen + pw.nn.one_hot(idx, EXPERTS).sum(axis=(0, 1))
        kept = kept + route(p["moe"]["w_gate"], h[i])[0].sum(axis=(0, 2))
    return chosen, kept


chosen, kept = (np.asarray(v)[0].astype(int) for v in
                pw.pmap(expert_load, devices=one.tpus)(dense_p, tokens_all[-1][None]))
print(f"\nlast batch with the final parameters: token choices per expert {chosen.tolist()}, "
      f"kept {kept.tolist()} (capacity {EXPERTS} groups x {CAPACITY}); "
      f"dropped {int((chosen - kept).sum())} of {int(chosen.sum())}")
print(f"\nmax relative difference of the losses: {worst:.2e}")
if worst > RTOL or not dense_losses[-1] < dense_losses[0]:
    print(f"FAILED: the sharded experts differ from the dense reference by {worst:.2e} "
          f"(limit {RTOL:g}), or the loss did not go down")
    sys.exit(1)
print("OK: the mixture of experts over all_to_all matches the dense reference")
