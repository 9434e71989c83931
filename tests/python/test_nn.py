"""pathways.nn (softmax, log_softmax, logsumexp, relu, gelu, sigmoid, silu,
one_hot, layer_norm) inside pw.pmap and on numpy arrays, against formulas
written out in numpy here, and their gradients against finite differences."""

import math

import numpy as np
import pytest

import pathways as pw
import pathways.nn as pnn


def np_logsumexp(x, axis=None, keepdims=False):
    m = np.max(x, axis=axis, keepdims=True)
    out = np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True)) + m
    return out if keepdims else np.squeeze(out, axis=axis)


def np_gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def np_layer_norm(x, scale, offset, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * scale + offset


REFERENCES = {
    "relu": (pnn.relu, lambda x: np.where(x > 0, x, 0)),
    "gelu": (pnn.gelu, np_gelu_tanh),
    "sigmoid": (pnn.sigmoid, lambda x: 1 / (1 + np.exp(-x))),
    "silu": (pnn.silu, lambda x: x / (1 + np.exp(-x))),
    "softmax": (pnn.softmax, lambda x: np.exp(x) / np.exp(x).sum(-1, keepdims=True)),
    "softmax_axis0": (
        lambda x: pnn.softmax(x, axis=0),
        lambda x: np.exp(x) / np.exp(x).sum(0, keepdims=True),
    ),
    "log_softmax": (pnn.log_softmax, lambda x: x - np.log(np.exp(x).sum(-1, keepdims=True))),
    "logsumexp": (pnn.logsumexp, lambda x: np.log(np.exp(x).sum())),
    "logsumexp_axis": (
        lambda x: pnn.logsumexp(x, axis=1, keepdims=True),
        lambda x: np.log(np.exp(x).sum(1, keepdims=True)),
    ),
}


@pytest.mark.parametrize("name", sorted(REFERENCES))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_composites_match_numpy_formulas(tpus2, name, dtype):
    fn, ref = REFERENCES[name]
    x = (np.random.default_rng(0).standard_normal((2, 3, 5)) * 3).astype(dtype)
    got = np.asarray(pw.pmap(fn, devices=tpus2)(x))
    want = np.stack([ref(x[i].astype(np.float64)) for i in range(2)]).astype(dtype)
    assert got.dtype == dtype
    np.testing.assert_allclose(got, want, rtol=2e-5 if dtype == np.float32 else 1e-12, atol=1e-6)
    # Outside a trace the same function computes with numpy.
    np.testing.assert_allclose(fn(x[0]), want[0], rtol=2e-5, atol=1e-6)


def test_logsumexp_and_softmax_are_stable_for_large_values(tpus2):
    x = np.array([[1000.0, 1000.0, -1000.0], [-np.inf, 0.0, -np.inf]])
    lse = np.asarray(pw.pmap(pnn.logsumexp, devices=tpus2)(x))
    np.testing.assert_allclose(lse, [1000.0 + math.log(2.0), 0.0])
    sm = np.asarray(pw.pmap(pnn.softmax, devices=tpus2)(x))
    np.testing.assert_allclose(sm, [[0.5, 0.5, 0.0], [0.0, 1.0, 0.0]])
    all_inf = np.full((2, 3), -np.inf)
    assert np.all(np.asarray(pw.pmap(pnn.logsumexp, devices=tpus2)(all_inf)) == -np.inf)


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_one_hot(tpus2, axis):
    labels = np.array([[0, 3, 1], [2, 7, -1]], dtype=np.int32)  # 7 and -1: out of range
    got = np.asarray(pw.pmap(lambda l: pnn.one_hot(l, 4, axis=axis), devices=tpus2)(labels))
    eye = np.vstack([np.eye(4, dtype=np.float32), np.zeros((1, 4), np.float32)])
    want = np.stack([np.moveaxis(eye[np.where((l >= 0) & (l < 4), l, 4)], -1, axis) for l in labels])
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(pnn.one_hot(labels[0], 4, axis=axis), want[0])


def test_layer_norm(tpus2):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 4, 6))
    scale = rng.standard_normal(6)
    offset = rng.standard_normal(6)
    got = np.asarray(pw.pmap(lambda v: pnn.layer_norm(v, scale, offset), devices=tpus2)(x))
    want = np.stack([np_layer_norm(x[i], scale, offset) for i in range(2)])
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: np.dtype(d).name)
def test_gelu_exact_is_x_times_the_normal_cdf(tpus2, dtype):
    # x * Phi(x) = x/2 (1 + erf(x / sqrt 2)), from math.erfc in float64 (which keeps
    # the tiny values of negative x), against both the pmap'd and the numpy path.
    x = np.array([[-40.0, -10.0, -3.0, -0.5, -0.0, 0.0, 1e-30, 0.7, 2.0, 8.0, np.inf, -np.inf],
                  [np.nan, -1.0, 1.0, 3.5, -6.0, 0.1, -0.1, 5.0, -5.0, 100.0, -100.0, 0.25]],
                 dtype)
    # (gelu(-inf) is -inf * 0 = NaN, as JAX's.)
    with np.errstate(invalid="ignore"):
        want = np.vectorize(lambda v: 0.5 * v * math.erfc(-v / math.sqrt(2.0)))(
            x.astype(np.float64))
        on_numpy = pnn.gelu(x, approximate=False)
    got = np.asarray(pw.pmap(lambda v: pnn.gelu(v, approximate=False), devices=tpus2)(x))
    assert got.dtype == on_numpy.dtype == dtype
    # Relative error: a few roundings, and x / sqrt(2)'s rounding amplified by erfc's
    # condition number 2 z^2 = x^2 in the negative tail (in float32, JAX's too).
    eps = np.finfo(dtype).eps
    with np.errstate(invalid="ignore"):
        bound = 4 * eps * (1 + x.astype(np.float64) ** 2) * np.abs(want)
    for result in (got, on_numpy):
        same = (result == want) | (np.isnan(result) & np.isnan(want))
        with np.errstate(invalid="ignore"):  # inf - inf where the two are the same inf
            close = np.abs(result - want) <= bound
        assert np.all(same | close), (result, want)
    assert np.isnan(got[1, 0]) and np.isnan(got[0, -1]) and got[0, -2] == np.inf
    assert got[0, 1] < 0 and abs(got[0, 1] / -7.619853e-23 - 1) < 1e-5  # gelu(-10), not 0
    with pytest.raises(TypeError, match="approximate must be a bool"):
        pnn.gelu(x, approximate="no")


def finite_difference_grad(f, x, eps=1e-6):
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        d = np.zeros_like(x)
        d[i] = eps
        g[i] = (f(x + d) - f(x - d)) / (2 * eps)
    return g


GRAD_CASES = {
    "softmax": (lambda x: (pnn.softmax(x) * np.arange(5.0)).sum(),
                lambda x: (np.exp(x) / np.exp(x).sum(-1, keepdims=True) * np.arange(5.0)).sum()),
    "log_softmax": (lambda x: pnn.log_softmax(x)[..., 2].sum(),
                    lambda x: (x - np_logsumexp(x, -1, True))[..., 2].sum()),
    "logsumexp": (lambda x: pnn.logsumexp(x, axis=0).sum(), lambda x: np_logsumexp(x, 0).sum()),
    "gelu": (lambda x: pnn.gelu(x).sum(), lambda x: np_gelu_tanh(x).sum()),
    "silu": (lambda x: pnn.silu(x).sum(), lambda x: (x / (1 + np.exp(-x))).sum()),
    "layer_norm": (lambda x: (pnn.layer_norm(x) ** 3).sum(),
                   lambda x: (np_layer_norm(x, 1.0, 0.0) ** 3).sum()),
    "cross_entropy": (
        lambda x: -(pnn.one_hot(np.array([1, 4, 0]), 5, dtype=np.float64) * pnn.log_softmax(x)).sum(),
        lambda x: -(np.eye(5)[[1, 4, 0]] * (x - np_logsumexp(x, -1, True))).sum(),
    ),
}


@pytest.mark.parametrize("name", sorted(GRAD_CASES))
def test_composite_gradients_against_finite_differences(tpus2, name):
    fn, ref = GRAD_CASES[name]
    x = np.random.default_rng(2).standard_normal((2, 3, 5))
    got = np.asarray(pw.pmap(pw.grad(fn), devices=tpus2)(x))
    want = np.stack([finite_difference_grad(ref, x[i]) for i in range(2)])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


# --- The rest of jax.nn's activations, against jax.nn itself ---------------------------

ACTIVATIONS = ["softplus", "log_sigmoid", "elu", "selu", "celu", "leaky_relu", "relu6", "hard_tanh",
               "hard_sigmoid", "hard_silu", "swish", "hard_swish"]
# Ties and kinks included: JAX's gradients there are part of what is compared.
POINTS = np.array([[-90.0, -7.0, -3.0, -1.0, -0.5, 0.0], [0.5, 1.0, 3.0, 6.0, 8.0, 90.0]], np.float32)


@pytest.mark.parametrize("name", ACTIVATIONS)
def test_activations_and_gradients_match_jax_nn(tpus2, name):
    jax = pytest.importorskip("jax")
    ours = getattr(pnn, name)
    theirs = getattr(jax.nn, name)
    got = np.asarray(pw.pmap(ours, devices=tpus2)(POINTS))
    grad = np.asarray(pw.pmap(pw.grad(lambda v: ours(v).sum()), devices=tpus2)(POINTS))
    for k in range(2):
        np.testing.assert_allclose(got[k], np.asarray(theirs(POINTS[k])), rtol=2e-6, atol=1e-7)
        want = jax.vmap(jax.grad(theirs))(POINTS[k])
        np.testing.assert_allclose(grad[k], np.asarray(want), rtol=2e-6, atol=1e-7)
    assert got.dtype == np.float32


def test_glu_and_standardize_match_jax_nn(tpus2):
    jax = pytest.importorskip("jax")
    x = np.random.default_rng(3).standard_normal((2, 3, 8)).astype(np.float32)
    for axis in (-1, 0):
        got = np.asarray(pw.pmap(lambda v: pnn.glu(v, axis=axis) if axis else pnn.glu(v[:2], 0),
                                 devices=tpus2)(x))
        for k in range(2):
            want = jax.nn.glu(x[k], axis=-1) if axis else jax.nn.glu(x[k][:2], 0)
            np.testing.assert_allclose(got[k], np.asarray(want), rtol=1e-6)
    got = np.asarray(pw.pmap(lambda v: pnn.standardize(v, axis=-1), devices=tpus2)(x))
    for k in range(2):
        np.testing.assert_allclose(got[k], np.asarray(jax.nn.standardize(x[k], axis=-1)), rtol=2e-5,
                                   atol=2e-6)
    with pytest.raises(ValueError, match="split: array split does not result in an equal division"):
        pw.pmap(lambda v: pnn.glu(v, axis=0), devices=tpus2)(x)  # 3 rows: no halves
