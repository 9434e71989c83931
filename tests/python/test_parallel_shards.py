"""A gang with enough work per shard runs its shards as parts on several
executor threads (GangTask / FunctionExecutable::RunStage); the results must
be those of numpy whatever the split, across collectives in the middle of the
function, and the runtime must stay usable (BLAS threads restored)."""

import numpy as np
import pytest

import pathways as pw


def _reference(x, w):
    h = np.tanh(x * 2.0 + 1.0) @ w  # per shard: [rows, cols]
    total = h.sum(axis=0)  # psum over the shards
    return total - h + x.sum(axis=-1, keepdims=True).mean(axis=1, keepdims=True)


@pytest.mark.parametrize("rows", [256, 257])
def test_big_gang_with_a_psum_in_the_middle_matches_numpy(tpus4, rows):
    rng = np.random.default_rng(rows)
    # 4 shards x [rows, 128]: ~33k elements per op per shard, above the
    # threshold at which a gang splits across threads.
    x = rng.standard_normal((4, rows, 128)).astype(np.float32)
    w = rng.standard_normal((4, 128, 64)).astype(np.float32) / 8

    def f(x, w):
        h = pw.numpy.tanh(x * 2.0 + 1.0) @ w
        total = pw.psum(h, "i")
        return total - h + x.sum(axis=-1, keepdims=True).mean(axis=0, keepdims=True)

    g = pw.pmap(f, devices=tpus4, axis_name="i")
    got = np.asarray(g(x, w))
    np.testing.assert_allclose(got, _reference(x, w), rtol=2e-5, atol=2e-5)
    # Again, and interleaved with a small gang on the same devices.
    small = pw.pmap(lambda v: pw.psum(v, "i") + 1.0, devices=tpus4, axis_name="i")
    for _ in range(3):
        np.testing.assert_allclose(np.asarray(small(np.ones(4, np.float32))), np.full(4, 5.0))
        np.testing.assert_array_equal(np.asarray(g(x, w)), got)


def test_data_parallel_gradients_equal_one_device(tpus2):
    """The mean gradient over 2 shards equals the gradient of the mean loss
    on one device over the whole batch (within float32 rounding)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 512, 64)).astype(np.float32)
    w = (rng.standard_normal((64, 64)) / 8).astype(np.float32)

    def loss(w, x):
        return (pw.numpy.tanh(x @ w) ** 2).mean()

    def dp_step(w, x):
        return pw.pmean(pw.grad(loss)(w, x), "i")

    dp = pw.pmap(dp_step, devices=tpus2, axis_name="i")
    got = np.asarray(dp(np.stack([w, w]), x))
    # numpy: d/dw mean(tanh(xw)^2) = x^T (2 t (1 - t^2)) / N, averaged over shards.
    grads = []
    for s in range(2):
        t = np.tanh(x[s].astype(np.float64) @ w)
        grads.append(x[s].T.astype(np.float64) @ (2 * t * (1 - t * t)) / t.size)
    want = (grads[0] + grads[1]) / 2
    np.testing.assert_allclose(got[0], want, rtol=1e-4, atol=1e-6)
    np.testing.assert_array_equal(got[0], got[1])
