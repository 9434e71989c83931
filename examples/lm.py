"""A small decoder-only transformer LM shared by the workload examples.

Written with `pathways.numpy` and `pw.nn`, so every function here runs inside
a `pw.pmap`'d function on one device's shard. Pre-layer-norm blocks:
`x + attention(ln1(x))`, then `x + ffn(ln2(x))`, where the feed-forward
layer is the GELU MLP below unless the example passes its own (the
mixture-of-experts example does).
"""

import math

import numpy as np

import pathways as pw
import pathways.numpy as pnp


def normal(r, *shape, std=0.02):
    return (r.standard_normal(shape) * std).astype(np.float32)


def init_block(r, d):
    """One block's parameters: attention and the MLP (GPT-2-style init)."""
    ones, zeros = np.ones(d, np.float32), np.zeros(d, np.float32)
    return {"ln1_g": ones, "ln1_b": zeros, "w_qkv": normal(r, d, 3 * d),
            "b_qkv": np.zeros(3 * d, np.float32), "w_o": normal(r, d, d),
            "ln2_g": ones, "ln2_b": zeros, "w_1": normal(r, d, 4 * d),
            "b_1": np.zeros(4 * d, np.float32), "w_2": normal(r, 4 * d, d)}


def init_embedding(r, vocab, seq, d):
    return {"wte": normal(r, vocab, d), "wpe": normal(r, seq, d, std=0.01)}


def init_head(r, vocab, d):
    return {"lnf_g": np.ones(d, np.float32), "lnf_b": np.zeros(d, np.float32),
            "w_out": normal(r, d, vocab)}


def attention(p, x, heads):
    """Causal multi-head self-attention of x [b, t, d]."""
    b, t, d = x.shape
    dh = d // heads
    qkv = (x @ p["w_qkv"] + p["b_qkv"]).reshape(b, t, 3, heads, dh)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    s = pnp.einsum("bqhd,bkhd->bhqk", q, k) * (1.0 / math.sqrt(dh))
    a = pw.nn.softmax(pnp.where(np.tril(np.ones((t, t), bool)), s, -1e9), axis=-1)
    return pnp.einsum("bhqk,bkhd->bqhd", a, v).reshape(b, t, d) @ p["w_o"]


def mlp(p, x):
    return pw.nn.gelu(x @ p["w_1"] + p["b_1"]) @ p["w_2"]


def block(p, x, heads, ffn=mlp):
    x = x + attention(p, pw.nn.layer_norm(x, p["ln1_g"], p["ln1_b"]), heads)
    return x + ffn(p, pw.nn.layer_norm(x, p["ln2_g"], p["ln2_b"]))


def stack_blocks(blocks):
    """The blocks' parameters as one pytree of arrays stacked along a leading layer axis."""
    return pw.tree_map(lambda *layers: np.stack(layers), *blocks)


def blocks_loop(blocks, x, heads, ffn=mlp):
    """The blocks applied in a Python loop: traced (and in the IR) once per layer."""
    for bp in blocks:
        x = block(bp, x, heads, ffn)
    return x


def blocks_scan(stacked, x, heads, ffn=mlp, remat=False):
    """The blocks applied by `pw.lax.scan` over stacked parameters: one block in the IR,
    whatever the depth. With `remat`, each block's backward recomputes its forward
    (`pw.checkpoint`), so only the activations between blocks are kept."""
    def step(x, bp):
        return block(bp, x, heads, ffn), None

    return pw.lax.scan(pw.checkpoint(step) if remat else step, x, stacked)[0]


def init_lm(vocab, seq, d, blocks, seed=0):
    """A whole LM's parameters: `blocks` blocks, the embeddings and the head."""
    r = np.random.default_rng(seed)
    p = {"blocks": [init_block(r, d) for _ in range(blocks)]}
    p.update(init_embedding(r, vocab, seq, d))
    p.update(init_head(r, vocab, d))
    return p


def lm_loss(p, tokens, heads):
    """Next-token loss of a [b, t + 1] token batch through the blocks of `p`."""
    x = embed(p, tokens[:, :-1])
    for bp in p["blocks"]:
        x = block(bp, x, heads)
    return loss(p, x, tokens[:, 1:])


def embed(p, tokens):
    return p["wte"][tokens] + p["wpe"]


def loss(p, x, targets):
    """Mean next-token cross-entropy of the final layer norm and output projection."""
    x = pw.nn.layer_norm(x, p["lnf_g"], p["lnf_b"])
    logp = pw.nn.log_softmax(x @ p["w_out"], axis=-1)
    return -pnp.mean(pnp.sum(pw.nn.one_hot(targets, p["w_out"].shape[-1]) * logp, axis=-1))


LR, B1, B2, EPS = 3e-3, 0.9, 0.999, 1e-8


def zero_adam(params):
    """Adam's state for a parameter pytree of numpy arrays."""
    return {"m": pw.tree_map(np.zeros_like, params), "v": pw.tree_map(np.zeros_like, params),
            "t": np.zeros((), np.float32)}


def adam(params, state, grads):
    """One bias-corrected Adam step: (params, state) after `grads`."""
    t = state["t"] + 1.0
    m = pw.tree_map(lambda m, g: B1 * m + (1.0 - B1) * g, state["m"], grads)
    v = pw.tree_map(lambda v, g: B2 * v + (1.0 - B2) * (g * g), state["v"], grads)
    c1, c2 = 1.0 - B1 ** t, 1.0 - B2 ** t
    params = pw.tree_map(lambda p, m, v: p - LR * (m / c1) / (pnp.sqrt(v / c2) + EPS),
                         params, m, v)
    return params, {"m": m, "v": v, "t": t}


def permutation_tokens(steps, batch, seq, vocab, seed=1):
    """Learnable int32 data [steps, batch, seq + 1]: each sequence follows a
    fixed random permutation of the vocabulary from a random first token."""
    r = np.random.default_rng(seed)
    perm = r.permutation(vocab)
    tokens = np.empty((steps, batch, seq + 1), np.int32)
    tokens[..., 0] = r.integers(0, vocab, size=(steps, batch))
    for i in range(seq):
        tokens[..., i + 1] = perm[tokens[..., i]]
    return tokens


def replicate(tree, devices):
    """A copy of a numpy pytree on every device (leading axis = devices)."""
    return pw.device_put(pw.tree_map(lambda x: np.stack([x] * len(devices)), tree), devices)


def compare_losses(name, losses, reference_name, reference_losses):
    """Prints both runs' losses step by step; returns the largest relative difference."""
    print(f"\n{'step':>4}  {name:>14}  {reference_name:>14}  {'rel. diff':>9}")
    worst = 0.0
    for step, (a, b) in enumerate(zip(losses, reference_losses)):
        rel = abs(a - b) / abs(b)
        worst = max(worst, rel)
        print(f"{step:4d}  {a:14.9f}  {b:14.9f}  {rel:9.2e}")
    return worst
