# %% [markdown]
# # Data-parallel training of an MLP with `pw.pmap`
#
# The paper's compiled functions are SPMD: one traced function runs on every
# device of a virtual slice. Data parallelism is the simplest use of that.
# Each of 4 devices holds a copy of the parameters and computes the loss and
# its gradients (`pw.value_and_grad`) on its quarter of the global batch.
# Then `pw.pmean` over the pmap axis averages the gradients across devices,
# and every device applies the same SGD update, so the copies stay equal.
# Because the quarters are the same size, the mean of the four gradients is
# the gradient over the whole batch. We check this by running the same step
# on a 1-device slice with the full batch: the two runs match to float32
# rounding at every step. The updated parameters are returned as
# `ShardedBuffer`s and passed back into the next step, so they stay on the
# devices between steps.

# %%
import time

import numpy as np

import pathways as pw
import pathways.numpy as pnp

NUM_DEVICES = 4
NUM_CLASSES = 4
NUM_FEATURES = 16
HIDDEN = 32
GLOBAL_BATCH = 256
STEPS = 80
LEARNING_RATE = 0.2

# %% [markdown]
# ## A synthetic, learnable dataset
#
# Points from 4 Gaussian clusters in 16 dimensions, one cluster per class.
# The noise is wider than the clusters' spacing along any one axis, so the
# classes overlap and no model reaches 100% accuracy.
# The numpy seed is fixed.

# %%
rng = np.random.default_rng(0)
centers = rng.normal(scale=1.0, size=(NUM_CLASSES, NUM_FEATURES))
num_examples = GLOBAL_BATCH * 8
labels = rng.integers(0, NUM_CLASSES, size=num_examples).astype(np.int32)
noise = rng.normal(scale=1.5, size=(num_examples, NUM_FEATURES))
features = (centers[labels] + noise).astype(np.float32)
print(f"dataset: {features.shape[0]} examples, {NUM_FEATURES} features, "
      f"{NUM_CLASSES} classes, class counts {np.bincount(labels).tolist()}")


def batches():
    """Yields (features, labels) global batches forever, in a fixed shuffled order."""
    order_rng = np.random.default_rng(1)
    while True:
        order = order_rng.permutation(num_examples)
        for start in range(0, num_examples, GLOBAL_BATCH):
            idx = order[start:start + GLOBAL_BATCH]
            yield features[idx], labels[idx]


# %% [markdown]
# ## The model: an MLP with two hidden layers
#
# The parameters are a dict of float32 arrays (a pytree). The loss is the
# mean softmax cross-entropy, written with `pw.nn.log_softmax` and
# `pw.nn.one_hot`.

# %%
def init_params(seed):
    r = np.random.default_rng(seed)
    sizes = [NUM_FEATURES, HIDDEN, HIDDEN, NUM_CLASSES]
    params = {}
    for k, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:]), start=1):
        params[f"w{k}"] = (r.normal(size=(fan_in, fan_out)) / np.sqrt(fan_in)).astype(np.float32)
        params[f"b{k}"] = np.zeros(fan_out, np.float32)
    return params


def predict(params, x):
    h = pw.nn.gelu(x @ params["w1"] + params["b1"])
    h = pw.nn.gelu(h @ params["w2"] + params["b2"])
    return h @ params["w3"] + params["b3"]  # logits


def loss_fn(params, x, y):
    logp = pw.nn.log_softmax(predict(params, x))
    return -pnp.mean(pnp.sum(pw.nn.one_hot(y, NUM_CLASSES) * logp, axis=-1))


def sgd(params, grads):
    return {k: params[k] - LEARNING_RATE * grads[k] for k in params}


# %% [markdown]
# ## Two training steps
#
# `dp_step` runs on a slice of 4 devices: each computes gradients on its
# shard, then `pw.pmean` over axis `"i"` averages them (and the loss).
# `single_step` is the same step without the collectives, on a slice of 1
# device that sees the whole global batch.

# %%
device_set = pw.make_virtual_device_set()
dp_tpus = device_set.add_slice(tpu_devices=NUM_DEVICES).tpus
single_tpus = device_set.add_slice(tpu_devices=1).tpus


def dp_step_fn(params, x, y):
    loss, grads = pw.value_and_grad(loss_fn)(params, x, y)
    grads = pw.pmean(grads, "i")
    loss = pw.pmean(loss, "i")
    return sgd(params, grads), loss


def single_step_fn(params, x, y):
    loss, grads = pw.value_and_grad(loss_fn)(params, x, y)
    return sgd(params, grads), loss


dp_step = pw.pmap(dp_step_fn, devices=dp_tpus, axis_name="i")
single_step = pw.pmap(single_step_fn, devices=single_tpus)


def replicate(tree, n):
    """One copy of every leaf per device: a new leading axis of size n."""
    return pw.tree_map(lambda a: np.broadcast_to(a, (n,) + a.shape), tree)


def shard(a, n):
    """Splits a global batch along its first axis into n equal shards."""
    return a.reshape((n, a.shape[0] // n) + a.shape[1:])


init = init_params(seed=42)

# The compiled function one device runs: forward, backward, then one pmean
# per gradient leaf and one for the loss.
x0, y0 = next(batches())
ir = dp_step.as_text(replicate(init, NUM_DEVICES), shard(x0, NUM_DEVICES), shard(y0, NUM_DEVICES))
ir_lines = ir.splitlines()
print(ir_lines[0])
print(f"  ... {len(ir_lines) - 2} lines, of which the collectives:")
print("\n".join(line for line in ir_lines if "pmean" in line))
print(ir_lines[-2])

# %% [markdown]
# ## Training
#
# Both runs start from the same weights and get the same batches. The
# parameters returned by a step (`ShardedBuffer`s on the step's devices) go
# straight into the next step. The losses are kept as buffers and read only
# after the loop, so the loop does not wait on the devices.

# %%
dp_params = replicate(init, NUM_DEVICES)
single_params = replicate(init, 1)
dp_losses, single_losses = [], []
data = batches()
start = time.perf_counter()
for step in range(STEPS):
    x, y = next(data)
    dp_params, loss = dp_step(dp_params, shard(x, NUM_DEVICES), shard(y, NUM_DEVICES))
    dp_losses.append(loss)
    single_params, loss = single_step(single_params, shard(x, 1), shard(y, 1))
    single_losses.append(loss)
pw.block_until_ready((dp_params, single_params))
elapsed = time.perf_counter() - start
print(f"type of the returned parameters: {type(dp_params['w1']).__name__}")
print(f"{STEPS} steps of each in {elapsed:.2f} s")

# Every device returns the (pmean'd) loss; all copies must be equal.
dp_all = np.stack([np.asarray(l) for l in dp_losses])      # [STEPS, 4]
assert (dp_all == dp_all[:, :1]).all(), "devices disagree on the pmean'd loss"
dp_loss = dp_all[:, 0]
single_loss = np.stack([np.asarray(l) for l in single_losses])[:, 0]
rel = np.abs(dp_loss - single_loss) / np.abs(single_loss)

print(f"{'step':>4}  {'4 devices':>10}  {'1 device':>10}  {'rel. diff':>9}")
for step in list(range(0, STEPS, 5)) + [STEPS - 1]:
    print(f"{step:4d}  {dp_loss[step]:10.6f}  {single_loss[step]:10.6f}  {rel[step]:9.2e}")
print(f"max relative difference of the losses: {rel.max():.2e}")

# %% [markdown]
# ## Checks
#
# The losses match at every step, training worked, the 4 copies of the
# parameters are identical, and the data-parallel parameters match the
# single-device ones.

# %%
assert rel.max() < 1e-5, rel.max()
assert dp_loss[-1] < 0.5 * dp_loss[0], (dp_loss[0], dp_loss[-1])

dp_final = {k: np.asarray(v) for k, v in dp_params.items()}
single_final = {k: np.asarray(v)[0] for k, v in single_params.items()}
max_param_diff = 0.0
for k in sorted(dp_final):
    copies = dp_final[k]
    assert (copies == copies[:1]).all(), f"replicas of {k} diverged"
    np.testing.assert_allclose(copies[0], single_final[k], rtol=1e-5, atol=1e-6)
    max_param_diff = max(max_param_diff, float(np.abs(copies[0] - single_final[k]).max()))
print(f"max abs difference of the final parameters: {max_param_diff:.2e}")

# %% [markdown]
# ## Accuracy
#
# Evaluation is data parallel too: each device scores its quarter of the
# dataset and `pw.pmean` averages the four accuracies.

# %%
def accuracy_fn(params, x, y):
    correct = pnp.argmax(predict(params, x), axis=-1) == y
    return pw.pmean(pnp.mean(correct), "i")


accuracy = pw.pmap(accuracy_fn, devices=dp_tpus, axis_name="i")
acc = np.asarray(accuracy(dp_params, shard(features, NUM_DEVICES), shard(labels, NUM_DEVICES)))
initial_acc = np.asarray(accuracy(replicate(init, NUM_DEVICES), shard(features, NUM_DEVICES),
                                  shard(labels, NUM_DEVICES)))
print(f"accuracy on all {num_examples} examples: {initial_acc[0]:.3f} at init, "
      f"{acc[0]:.3f} after {STEPS} steps")
assert acc[0] > 0.8, acc[0]
