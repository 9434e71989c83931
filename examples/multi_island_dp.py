# %% [markdown]
# # Data parallelism across two islands (paper §5.3)
#
# The paper trains a 136B-parameter LM on two islands of 512 TPUs each: data
# parallel inside each island over ICI, and the gradients combined across the
# islands over the slower DCN, within one program. This example does the
# same with a small LM on two 4-device slices, one per island:
#
# 1. On each island, one compiled function computes the loss and gradients
#    of its share of the batch and reduces them over the island's devices
#    with `pw.psum_scatter` (ICI): device i holds slice i of the island's sum.
# 2. On each island, a second function receives the other island's slices
#    (device i from device i, over DCN: each island sends one gradient's
#    worth in total, split over its devices), adds its own,
#    `pw.all_gather`s the total (ICI) and takes the Adam step.
#
# Both islands run one `@pw.program` per step, four nodes, and the runtime
# inserts the DCN transfers between them. The check: the same model and
# batches on one island, data parallel over 8 devices with `pw.pmean`, give
# the same losses to 1e-5 (float32). The script exits with code 1 if not.
# Run with `--quick` for 3 steps.

# %%
import sys

import numpy as np

import pathways as pw
import pathways.numpy as pnp

import lm  # examples/lm.py: the transformer's pieces and Adam

QUICK = "--quick" in sys.argv
STEPS = 3 if QUICK else 10
PER_ISLAND = 4  # devices per island
VOCAB, SEQ, D_MODEL, HEADS, BLOCKS = 64, 16, 32, 2, 2
GLOBAL_BATCH = 32  # sequences per step: 4 per device
RTOL = 1e-5
print(f"2 islands x {PER_ISLAND} devices against 1 island x {2 * PER_ISLAND} devices, "
      f"{GLOBAL_BATCH} sequences per step, {STEPS} steps")

# %% [markdown]
# ## Two slices, one per island
#
# The resource manager puts a new slice on the least-loaded island, so the
# first two slices of a fresh runtime land on different islands.

# %%
vds = pw.make_virtual_device_set()
islands = [vds.add_slice(tpu_devices=PER_ISLAND) for _ in range(2)]
where = [s.island for s in islands]
print(f"slice A on island {where[0]}, slice B on island {where[1]}")
assert where[0] != where[1], "the two slices must be on different islands"


def init_params(seed=0):
    return lm.init_lm(VOCAB, SEQ, D_MODEL, BLOCKS, seed)


def loss_fn(p, tokens):
    return lm.lm_loss(p, tokens, HEADS)


init = init_params()
leaves, treedef = pw.tree_flatten(init)
SIZES = [x.size for x in leaves]
TOTAL = sum(SIZES)
CHUNK = -(-TOTAL // PER_ISLAND)  # each device's share of the flat gradient
print(f"{TOTAL} parameters; each device sends {CHUNK * 4} bytes of gradient over DCN per step")

# %% [markdown]
# ## The two functions of each island
#
# The gradient pytree is flattened into one vector, padded to a multiple of
# the island's size, so one `psum_scatter` and one `all_gather` move it.

# %%
def flatten(tree):
    flat = pnp.concatenate([x.ravel() for x in pw.tree_leaves(tree)])
    pad = CHUNK * PER_ISLAND - TOTAL
    return pnp.concatenate([flat, np.zeros(pad, np.float32)]) if pad else flat


def unflatten(flat):
    out, start = [], 0
    for x, n in zip(leaves, SIZES):
        out.append(flat[start:start + n].reshape(x.shape))
        start += n
    return pw.tree_unflatten(treedef, out)


def island_grads(p, tokens):
    loss, g = pw.value_and_grad(loss_fn)(p, tokens)
    # Slice i of the island's gradient sum on device i (ICI).
    return pw.pmean(loss, "d"), pw.psum_scatter(flatten(g).reshape(PER_ISLAND, CHUNK), "d", 0)


def island_update(p, state, mine, theirs):
    total = (mine + theirs) * (1.0 / (2 * PER_ISLAND))  # theirs came over DCN
    g = unflatten(pw.all_gather(total, "d", 0).reshape(-1))  # ICI
    return lm.adam(p, state, g)


grads = [pw.pmap(island_grads, devices=s.tpus, axis_name="d") for s in islands]
update = [pw.pmap(island_update, devices=s.tpus, axis_name="d") for s in islands]


@pw.program
def train_step(pa, sa, pb, sb, tokens_a, tokens_b):
    loss_a, ga = grads[0](pa, tokens_a)
    loss_b, gb = grads[1](pb, tokens_b)
    pa, sa = update[0](pa, sa, ga, gb)
    pb, sb = update[1](pb, sb, gb, ga)
    return pa, sa, pb, sb, loss_a, loss_b


tokens_all = lm.permutation_tokens(STEPS, GLOBAL_BATCH, SEQ, VOCAB)


def shards(tokens, n):
    return tokens.reshape(n, -1, SEQ + 1)


pa, pb = (lm.replicate(init, s.tpus) for s in islands)
sa, sb = (lm.replicate(lm.zero_adam(init), s.tpus) for s in islands)
half = GLOBAL_BATCH // 2
print(f"one program per step: {train_step.trace(pa, sa, pb, sb, shards(tokens_all[0][:half], PER_ISLAND), shards(tokens_all[0][half:], PER_ISLAND)).num_nodes} nodes")
before = pw.transfer_stats()
two_island_losses = []
for step in range(STEPS):
    t = tokens_all[step]
    pa, sa, pb, sb, la, lb = train_step(pa, sa, pb, sb, shards(t[:half], PER_ISLAND),
                                        shards(t[half:], PER_ISLAND))
    two_island_losses.append(float((np.asarray(la, np.float64)[0] + np.asarray(lb)[0]) / 2))
pw.block_until_ready((pa, pb))  # the last update's transfers are done
after = pw.transfer_stats()
dcn = (after["dcn_transfers"] - before["dcn_transfers"], after["dcn_bytes"] - before["dcn_bytes"])

# %% [markdown]
# ## The reference: one island, 8 devices
#
# The same global batch, data parallel over 8 devices of one island with
# `pw.pmean` of the gradients.

# %%
one_island = vds.add_slice(tpu_devices=2 * PER_ISLAND)


def reference_step(p, state, tokens):
    loss, g = pw.value_and_grad(loss_fn)(p, tokens)
    p, state = lm.adam(p, state, pw.pmean(g, "d"))
    return p, state, pw.pmean(loss, "d")


ref_step = pw.pmap(reference_step, devices=one_island.tpus, axis_name="d")
pr = lm.replicate(init, one_island.tpus)
sr = lm.replicate(lm.zero_adam(init), one_island.tpus)
reference_losses = []
for step in range(STEPS):
    pr, sr, loss = ref_step(pr, sr, shards(tokens_all[step], 2 * PER_ISLAND))
    reference_losses.append(float(np.asarray(loss)[0]))

# %% [markdown]
# ## Results

# %%
worst = lm.compare_losses("2 islands", two_island_losses, "1 island", reference_losses)
param_diff = max(float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
                 for x, y in zip(pw.tree_leaves(pa), pw.tree_leaves(pb)))
print(f"\nDCN transfers: {dcn[0]} ({dcn[1]} bytes) in {STEPS} steps")
print(f"largest difference between the two islands' parameters: {param_diff:.1e}")
print(f"max relative difference of the losses: {worst:.2e}")
ok = worst <= RTOL and param_diff == 0.0 and dcn[0] > 0
ok = ok and reference_losses[-1] < reference_losses[0]
if not ok:
    print("FAILED: the two-island run differs from the one-island run, the islands' parameters "
          "diverged, no gradient crossed DCN, or the loss did not go down")
    sys.exit(1)
print("OK: two islands over DCN match one island")
