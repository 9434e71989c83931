"""Answers that JAX's own test cases check, and that pathways once got wrong (issue 12).

One test (or parametrized group) per item of the issue, named after it. The
references are numpy, or derivatives worked out by hand; gradients are also
checked against finite differences with the helpers of test_grad.py.
"""

import numpy as np
import pytest

import pathways as pw
import pathways.nn as pnn

from test_grad import check_grads, pmap_grads


def _grad_in_pmap(devices, fn, x):
    """`pw.grad(lambda x: fn(x).sum())` inside `pw.pmap`, as a numpy array."""
    (g,) = pmap_grads(devices, lambda x: fn(x).sum(), [x], (0,))
    return g


# --- 1. sigmoid and silu at saturated logits ------------------------------------


def _sigmoid_derivative(x):
    """d/dx 1/(1+exp(-x)) = exp(-|x|) / (1 + exp(-|x|))**2, in float64 (never overflows)."""
    e = np.exp(-np.abs(x.astype(np.float64)))
    return e / (1 + e) ** 2


SATURATED = {
    np.float32: [-1000.0, -104.0, -100.0, -89.0, -88.0, 0.0, 88.0, 89.0, 1000.0],
    np.float64: [-1e5, -746.0, -745.0, -710.0, -709.0, 0.0, 709.0, 710.0, 1e5],
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sigmoid_and_silu_gradients_at_saturated_logits(tpus2, dtype):
    x = np.array([SATURATED[dtype], [-3.0, -0.5, -1e-3, 1e-3, 0.5, 3.0, 20.0, -20.0, 0.0]], dtype)
    tiny = np.finfo(dtype).tiny  # below it (subnormals) relative precision degrades
    s_prime = _sigmoid_derivative(x)
    with np.errstate(over="ignore"):  # exp(1e5) = inf gives 1 / inf = 0, the right forward value
        s = 1 / (1 + np.exp(-x.astype(np.float64)))

    got = pw.pmap(pnn.sigmoid, devices=tpus2)(x)
    assert got.dtype == dtype
    np.testing.assert_allclose(np.asarray(got), s, rtol=4 * np.finfo(dtype).eps, atol=tiny)

    g = _grad_in_pmap(tpus2, pnn.sigmoid, x)
    assert g.dtype == dtype and np.all(np.isfinite(g))
    np.testing.assert_allclose(g, s_prime, rtol=8 * np.finfo(dtype).eps, atol=tiny)

    # silu(x) = x sigmoid(x): d/dx = sigmoid(x) + x sigmoid'(x).
    g = _grad_in_pmap(tpus2, pnn.silu, x)
    assert np.all(np.isfinite(g))
    np.testing.assert_allclose(g, s + x * s_prime, rtol=16 * np.finfo(dtype).eps, atol=tiny)

    # Second derivatives stay finite too: s'' = s' (1 - 2 s) (1 - 2 s cancels near 0).
    g2 = _grad_in_pmap(tpus2, lambda v: pw.grad(lambda u: pnn.sigmoid(u).sum())(v), x)
    assert np.all(np.isfinite(g2))
    np.testing.assert_allclose(g2, s_prime * (1 - 2 * s), rtol=1e-3 if dtype == np.float32
                               else 1e-10, atol=1e4 * tiny)

    # Outside a trace the same formula runs on numpy, without overflow warnings.
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        np.testing.assert_allclose(pnn.sigmoid(x.astype(np.float64)), s, rtol=1e-15,
                                   atol=np.finfo(np.float64).tiny)


def test_sigmoid_gradient_matches_finite_differences(tpus2):
    x = np.random.default_rng(1).standard_normal((2, 3, 4)) * 4
    x[0, 0, 0] = 0.0
    check_grads(tpus2, lambda v: (pnn.sigmoid(v) ** 2).sum(), [x], rtol=1e-6, atol=1e-8)
    check_grads(tpus2, lambda v: (pnn.silu(v) * v).sum(), [x], rtol=1e-6, atol=1e-8)


# --- 2. relu's gradient at 0 -------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_relu_grad_at_zero(tpus2, dtype):
    x = np.array([[-2.0, -0.0, 0.0, 1e-30, 3.0], [0.0, -1e-30, np.nan, -np.inf, np.inf]], dtype)
    got = np.asarray(pw.pmap(pnn.relu, devices=tpus2)(x))
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, np.maximum(x, 0))  # NaN propagates, as numpy's maximum
    g = _grad_in_pmap(tpus2, pnn.relu, x)
    assert g.dtype == dtype
    np.testing.assert_array_equal(g, (x > 0).astype(dtype))  # 0 at 0, as JAX's testReluGradAtZero
    # pw.grad outside a trace, on a Python float, as JAX's test writes it.
    assert pw.grad(pnn.relu)(0.0) == 0.0
    assert pw.grad(pnn.relu)(2.0) == 1.0
    # maximum itself keeps JAX's rule for ties: half the cotangent to each side.
    (ga, gb) = pmap_grads(tpus2, lambda a, b: pw.numpy.maximum(a, b).sum(), [x, np.zeros_like(x)],
                          (0, 1))
    np.testing.assert_array_equal(ga[x == 0], 0.5)
    np.testing.assert_array_equal(gb[x == 0], 0.5)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_abs_grad_at_zero_is_one_as_jax(tpus2, dtype):
    # JAX's rule is select(x >= 0, g, -g): 1 at 0 and at -0.0 (found by a probe
    # against jax.grad(jnp.abs), after this module's first version).
    x = np.array([[-2.0, -0.0, 0.0, 1e-30], [0.0, -1e-30, -np.inf, np.inf]], dtype)
    g = _grad_in_pmap(tpus2, pw.numpy.abs, x)
    assert g.dtype == dtype
    np.testing.assert_array_equal(g, np.where(x >= 0, 1.0, -1.0).astype(dtype))
    assert pw.grad(pw.numpy.abs)(0.0) == 1.0
    assert pw.grad(lambda v: abs(v))(-0.0) == 1.0
    assert pw.grad(pw.numpy.abs)(-3.0) == -1.0


# --- 3. logsumexp of rows holding infinities ----------------------------------------


INF_ROWS = [
    [np.inf, 0.0, 1.0, -3.0],
    [np.inf, -np.inf, 0.0, 2.0],
    [np.inf, np.inf, -np.inf, 0.0],
    [-np.inf, -np.inf, -np.inf, -np.inf],
    [np.nan, np.inf, 0.0, 1.0],
    [-np.inf, 1000.0, 1000.0, -1000.0],
    [-np.inf, -1e30, 3.0, -np.inf],
    [0.5, -2.0, 3.0, 1.0],
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_logsumexp_of_infinite_rows(tpus2, dtype):
    x = np.array([INF_ROWS[:4], INF_ROWS[4:]], dtype)
    with np.errstate(invalid="ignore"):  # the NaN row
        want = np.logaddexp.reduce(x.astype(np.float64), axis=-1)  # numpy's own reference
    assert np.isposinf(want[0, :3]).all() and np.isneginf(want[0, 3]) and np.isnan(want[1, 0])
    rtol = 1e-6 if dtype == np.float32 else 1e-14
    for kwargs, reduce in [({"axis": -1}, lambda w: w),
                           ({"axis": 1, "keepdims": True}, lambda w: w[..., None])]:
        got = np.asarray(pw.pmap(lambda v: pnn.logsumexp(v, **kwargs), devices=tpus2)(x))
        assert got.dtype == dtype
        np.testing.assert_allclose(got, reduce(want), rtol=rtol)
        with np.errstate(divide="ignore"):  # numpy's log(0) for the -inf row
            np.testing.assert_allclose(pnn.logsumexp(x[0], **kwargs), reduce(want)[0], rtol=rtol)
    # axis=None: the whole shard.
    got = np.asarray(pw.pmap(pnn.logsumexp, devices=tpus2)(x))
    np.testing.assert_array_equal(got, [np.inf, np.nan])
    got = np.asarray(pw.pmap(pnn.logsumexp, devices=tpus2)(np.full((2, 3), -np.inf, dtype)))
    np.testing.assert_array_equal(got, [-np.inf, -np.inf])

    # The gradient is softmax, finite wherever the row's logsumexp is finite (where JAX's is):
    # -inf entries get 0, and large values do not overflow.
    finite = np.array([INF_ROWS[5:8], INF_ROWS[5:8]], dtype)
    g = _grad_in_pmap(tpus2, lambda v: pnn.logsumexp(v, axis=-1), finite)
    e = np.exp(finite - finite.max(-1, keepdims=True).astype(np.float64))
    assert np.all(np.isfinite(g))
    np.testing.assert_allclose(g, e / e.sum(-1, keepdims=True), rtol=rtol, atol=1e-30)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_softmax_of_infinite_rows_as_jax(tpus2, dtype):
    # JAX's softmax and log_softmax shift by the max itself: a row holding +inf,
    # or of -inf only, is NaN throughout (softmax once gave [0, nan] for [1, inf]).
    x = np.array([INF_ROWS[:4], INF_ROWS[4:]], dtype)
    with np.errstate(invalid="ignore", divide="ignore"):
        shifted = x - x.max(-1, keepdims=True)
        e = np.exp(shifted)
        want_softmax = e / e.sum(-1, keepdims=True)
        want_log = shifted - np.log(e.sum(-1, keepdims=True))
    assert np.isnan(want_softmax[0]).all() and not np.isnan(want_softmax[1, 1:]).any()
    got_softmax, got_log = (np.asarray(o) for o in pw.pmap(
        lambda v: (pnn.softmax(v), pnn.log_softmax(v)), devices=tpus2)(x))
    rtol = 1e-6 if dtype == np.float32 else 1e-14
    np.testing.assert_allclose(got_softmax, want_softmax, rtol=rtol, atol=1e-30)
    np.testing.assert_allclose(got_log, want_log, rtol=rtol)


def test_softmax_and_logsumexp_over_no_elements(tpus2):
    # As JAX: an empty softmax, and logsumexp -inf (the max of nothing is not taken).
    e = np.zeros((2, 3, 0))
    soft, log_soft, lse, lse_keep = (np.asarray(o) for o in pw.pmap(
        lambda v: (pnn.softmax(v), pnn.log_softmax(v), pnn.logsumexp(v, axis=1),
                   pnn.logsumexp(v, axis=(0, 1), keepdims=True)), devices=tpus2)(e))
    assert soft.shape == log_soft.shape == (2, 3, 0)
    np.testing.assert_array_equal(lse, np.full((2, 3), -np.inf))
    np.testing.assert_array_equal(lse_keep, np.full((2, 1, 1), -np.inf))
    with np.errstate(divide="ignore"):
        np.testing.assert_array_equal(pnn.logsumexp(np.zeros((3, 0)), axis=1), [-np.inf] * 3)


# --- 4. where advanced indexing puts the array's dimensions -------------------------

S = slice(None)
A3 = np.array([1, 0, 1])  # valid for dimensions of size 2 and 3
A22 = np.array([[1, 0], [0, 1]])

# (shape of one shard, index); "A" marks where the index array goes, so that the
# same index runs with a constant array and with a traced int32 one.
ADVANCED_INDEXES = [
    ((3, 2, 3), (0, S, "A")),  # the case: numpy gives (3, 2)
    ((3, 2, 3), ("A", S, 0)),
    ((3, 2, 3), (S, 0, "A")),  # side by side: in place
    ((3, 2, 3), (0, "A")),
    ((3, 2, 3), ("A", 1)),
    ((3, 2, 3), (1, "A", S)),
    ((3, 2, 3), (0, None, "A")),  # None separates
    ((3, 2, 3), (None, 0, ..., "A")),  # so does '...', even where it stands for no dimension
    ((3, 2, 3), ("A", ..., 2)),
    ((3, 2, 3), (..., 1, "A")),
    ((3, 2, 3), (None, "A", S, None)),  # one array and no int: in place
    ((3, 2, 3), (S, None, "A")),
    ((3, 2, 3), (-1, slice(None, None, -1), "A")),
    ((3, 3, 2, 3), (1, S, S, "A")),
    ((3, 3, 2, 3), (S, 2, S, "A")),
    ((3, 3, 2, 3), (S, 2, 1, "A")),
    ((3, 3, 2, 3), (0, ..., "A")),
    ((2, 3, 3), (1, S, "A2")),  # a 2-d index array
    ((2, 3, 3), (S, "A2", 0)),
    ((2, 3, 3), (1, S, "A0")),  # a 0-d index array is advanced too
]


def _index_with(index, arr):
    return tuple(arr if e in ("A", "A2", "A0") else e for e in index)


def _index_array(index):
    kind = next(e for e in index if isinstance(e, str))
    return {"A": A3, "A2": A22, "A0": np.array(1)}[kind]


@pytest.mark.parametrize("shape, index", ADVANCED_INDEXES, ids=lambda v: repr(v))
def test_advanced_index_dimensions_come_first_when_separated(tpus2, shape, index):
    x = np.random.default_rng(4).standard_normal((2,) + shape)
    arr = _index_array(index)
    want = np.stack([x[d][_index_with(index, arr)] for d in range(2)])
    # A constant index array.
    got = np.asarray(pw.pmap(lambda v: v[_index_with(index, arr)], devices=tpus2)(x))
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    # A traced int32 index.
    traced = np.stack([arr, arr]).astype(np.int32)
    got = np.asarray(pw.pmap(lambda v, i: v[_index_with(index, i)], devices=tpus2)(x, traced))
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    # The gradient goes back through the moved dimensions.
    w = np.random.default_rng(5).standard_normal(want.shape[1:])
    check_grads(tpus2, lambda v: (pw.numpy.sin(v)[_index_with(index, arr)] * w).sum(), [x])


def test_boolean_scalar_index_is_refused(tpus2, runtime_ok):
    f = pw.pmap(lambda v: v[True], devices=tpus2)
    with pytest.raises(IndexError, match="boolean scalar"):
        f(np.zeros((2, 3)))
    runtime_ok()


# --- 5. negative traced indices count from the end ---------------------------------


def _jax_getitem_index(i, n):
    """JAX's indexing: a negative index gets n added, then out-of-range ones are clamped."""
    return np.clip(np.where(i < 0, i + n, i), 0, n - 1)


def test_negative_traced_index_wraps(tpus2):
    x = np.random.default_rng(6).standard_normal((2, 4, 3))
    scalar = pw.pmap(lambda v, i: v[i], devices=tpus2)
    for i in [-1, -4, -2, 0, 3, -5, 4, 100, -100]:  # the last four: out of range, clamped
        idx = np.full(2, i, np.int32)
        want = np.stack([x[d][_jax_getitem_index(i, 4)] for d in range(2)])
        np.testing.assert_array_equal(np.asarray(scalar(x, idx)), want)
    # Index arrays, on their own and after an int (where the dims go is numpy's, item 4).
    idx = np.array([[-1, 0, -3, 2], [1, -2, -2, 7]], np.int32)
    got = np.asarray(pw.pmap(lambda v, i: v[i], devices=tpus2)(x, idx))
    np.testing.assert_array_equal(got, np.stack([x[d][_jax_getitem_index(idx[d], 4)]
                                                 for d in range(2)]))
    z = np.random.default_rng(7).standard_normal((2, 2, 3, 4))
    got = np.asarray(pw.pmap(lambda v, i: v[1, :, i], devices=tpus2)(z, idx))
    np.testing.assert_array_equal(got, np.stack([z[d][1, :, _jax_getitem_index(idx[d], 4)]
                                                 for d in range(2)]))
    # The gradient lands on the element read.
    (g,) = pmap_grads(tpus2, lambda v, i: (v[i] * np.arange(3.0)).sum(), [x, idx[:, :1]], (0,))
    want = np.zeros_like(x)
    want[0, 3] = want[1, 1] = np.arange(3.0)
    np.testing.assert_array_equal(g, want)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.bool_])
def test_take_negative_traced_indices(tpus2, dtype):
    x = (np.arange(2 * 5) % 3 == 1 if dtype == np.bool_ else np.arange(2 * 5) - 4.5)
    x = x.astype(dtype).reshape(2, 5)
    idx = np.array([[-1, -5, 4, 5, -6, 0], [2, -2, 100, -100, 1, -3]], np.int32)
    n = 5
    wrapped = np.where(idx < 0, idx + n, idx)
    inside = (wrapped >= 0) & (wrapped < n)
    default_fill = {np.float32: np.nan, np.float64: np.nan, np.int32: np.iinfo(np.int32).min,
                    np.bool_: True}[dtype]
    # The default mode, jax.numpy.take's "fill": negative indices wrap, out-of-range ones fill.
    for kwargs, fill in [({}, default_fill), ({"mode": "fill"}, default_fill),
                         ({"fill_value": 0}, 0)]:
        got = np.asarray(pw.pmap(lambda a, i: pw.numpy.take(a, i, **kwargs), devices=tpus2)(x, idx))
        want = np.stack([np.where(inside[d], np.take(x[d], np.where(inside[d], wrapped[d], 0)),
                                  fill) for d in range(2)]).astype(dtype)
        assert got.dtype == dtype
        np.testing.assert_array_equal(got, want)
        if kwargs:  # numpy arrays outside a trace: "fill" on request (numpy's default raises)
            np.testing.assert_array_equal(
                pw.numpy.take(x[1], idx[1], mode="fill", fill_value=kwargs.get("fill_value")),
                want[1])
    # mode="clip", as numpy's: clipped into range, negative indices too (to 0).
    got = np.asarray(pw.pmap(lambda a, i: a.take(i, mode="clip"), devices=tpus2)(x, idx))
    np.testing.assert_array_equal(got, np.stack([np.take(x[d], idx[d], mode="clip")
                                                 for d in range(2)]))
    # Constant indices: numpy's modes, decided at trace time ("fill" as for traced indices).
    for mode in ["clip", "wrap"]:
        got = np.asarray(pw.pmap(lambda a: pw.numpy.take(a, idx[0], mode=mode), devices=tpus2)(x))
        np.testing.assert_array_equal(got, np.stack([np.take(x[d], idx[0], mode=mode)
                                                     for d in range(2)]))
    got = np.asarray(pw.pmap(lambda a: pw.numpy.take(a, idx[1], mode="fill"), devices=tpus2)(x))
    want = np.where(inside[1], x[:, np.where(inside[1], wrapped[1], 0)], default_fill)
    np.testing.assert_array_equal(got, want.astype(dtype))


def test_take_fill_gradient_and_axis(tpus2):
    x = np.random.default_rng(7).standard_normal((2, 3, 4))
    idx = np.array([[[-1, 4], [-4, 0]], [[2, 2], [-5, -2]]], np.int32)
    w = np.random.default_rng(8).standard_normal((3, 2, 2))
    fn = lambda v, i: pw.numpy.take(v, i, axis=1)  # noqa: E731
    got = np.asarray(pw.pmap(fn, devices=tpus2)(x, idx))
    wrapped = np.where(idx < 0, idx + 4, idx)
    inside = (wrapped >= 0) & (wrapped < 4)
    want = np.stack([np.where(inside[d], np.take(x[d], np.clip(wrapped[d], 0, 3), axis=1), np.nan)
                     for d in range(2)])
    np.testing.assert_array_equal(got, want)
    # Filled positions get no gradient; repeated indices accumulate.
    (g,) = pmap_grads(tpus2, lambda v, i: (fn(v, i) * w).sum(), [x, idx], (0,))
    want = np.zeros_like(x)
    for d in range(2):
        for j in np.ndindex(2, 2):
            if inside[d][j]:
                want[d][:, wrapped[d][j]] += w[:, j[0], j[1]]
    np.testing.assert_allclose(g, want, rtol=1e-15, atol=0)
    # Against finite differences of the same function on numpy arrays (where mode="fill"
    # must be explicit: numpy's default mode raises).
    f = lambda v, i: (pw.numpy.take(pw.numpy.sin(v), i, axis=1, mode="fill",  # noqa: E731
                                    fill_value=0.0) * w).sum()
    check_grads(tpus2, f, [x, idx], argnums=(0,))


@pytest.mark.parametrize("size", [1, 3, 7])
def test_take_wrap_of_traced_indices_is_numpys(tpus2, size):
    x = np.arange(2 * size * 2, dtype=np.float64).reshape(2, size, 2)
    i = np.array([[-2**31, -size - 1, -size, -1, 0, 1, size, 2 * size + 1, 2**31 - 1]] * 2, np.int32)
    got = pw.pmap(lambda a, j: pw.numpy.take(a, j, axis=0, mode="wrap"), devices=tpus2)(x, i)
    want = np.stack([np.take(x[d], i[d], axis=0, mode="wrap") for d in range(2)])
    np.testing.assert_array_equal(np.asarray(got), want)


def test_take_mode_errors(tpus2, runtime_ok):
    x = np.zeros((2, 3))
    i = np.zeros((2, 2), np.int32)
    with pytest.raises(NotImplementedError, match="mode='raise' with traced indices"):
        pw.pmap(lambda a, j: pw.numpy.take(a, j, mode="raise"), devices=tpus2)(x, i)
    with pytest.raises(ValueError, match="take: mode must be one of"):
        pw.pmap(lambda a, j: pw.numpy.take(a, j, mode="nearest"), devices=tpus2)(x, i)
    with pytest.raises(IndexError, match="take: index -4 is out of bounds for axis with size 3"):
        pw.pmap(lambda a: pw.numpy.take(a, np.array([-4])), devices=tpus2)(x)
    with pytest.raises(ValueError, match=r"take: cannot index into a zero-dimensional value"):
        pw.pmap(lambda a: pw.numpy.take(a[0], np.array([0]), axis=0), devices=tpus2)(x)
    with pytest.raises(ValueError, match=r"take: cannot index into a zero-dimensional value"):
        pw.numpy.take(np.float64(1.0), np.array([0]), axis=0, mode="fill")
    runtime_ok()


# --- 6. einsum over bool stays bool ---------------------------------------------


SIZES = {"i": 3, "j": 2, "k": 4, "b": 2}


def _einsum_operands(spec, rng, dtypes):
    """Random operands (with a leading device axis of 2) for the inputs of `spec`."""
    ins = spec.split("->")[0].split(",")
    out = []
    for s, dtype in zip(ins, dtypes):
        shape = (2,) + tuple(SIZES[c] for c in s)
        if dtype == np.bool_:
            out.append(rng.random(shape) < 0.3)  # sparse enough for all-False sums
        elif dtype == np.int32:
            out.append(rng.integers(-3, 4, shape).astype(np.int32))
        else:
            out.append(rng.standard_normal(shape).astype(dtype))
    return out


def _check_einsum(devices, spec, operands):
    got = pw.pmap(lambda *ops: pw.numpy.einsum(spec, *ops), devices=devices)(*operands)
    got = np.asarray(got)
    want = np.stack([np.einsum(spec, *[op[d] for op in operands]) for d in range(2)])
    if want.dtype == np.int64:
        want = want.astype(np.int32)  # numpy's default integer; int32 is pathways' only one
    assert got.dtype == want.dtype, (spec, got.dtype, want.dtype)
    assert got.shape == want.shape, (spec, got.shape, want.shape)
    np.testing.assert_allclose(got, want, rtol=1e-12)
    return want


@pytest.mark.parametrize("spec, dtypes", [
    ("ij->", [np.bool_]),
    ("ij", [np.bool_]),
    ("ij->i", [np.bool_]),
    ("ij->ji", [np.bool_]),
    ("ij,jk->ik", [np.bool_, np.bool_]),
    ("ij,jk->", [np.bool_, np.bool_]),
    ("ij,jk->k", [np.bool_, np.bool_]),
    ("ij,j,i->", [np.bool_, np.bool_, np.bool_]),
    ("ii->", [np.bool_]),
    ("ij,j->", [np.bool_, np.int32]),  # numbers: True counts as 1
    ("ij,jk->ik", [np.bool_, np.float32]),
    ("ij->", [np.int32]),
])
def test_einsum_bool(tpus2, spec, dtypes):
    rng = np.random.default_rng(9)
    for _ in range(3):
        want = _check_einsum(tpus2, spec, _einsum_operands(spec, rng, dtypes))
    if all(d == np.bool_ for d in dtypes):
        assert want.dtype == np.bool_


# --- 7. einsum with a letter repeated in an operand (diagonals) --------------------------


@pytest.mark.parametrize("spec", [
    "ii->i", "ii->", "ii", "iij->j", "iij->ji", "iji->j", "ii,i->i", "ii,i", "iii->i", "iii->",
    "jii->ij", "bii->bi", "ij,jj->i", "ii,jj->ij", "ii,ii->i", "iijj->ij", "iijj->", "ijij->ji",
])
def test_einsum_repeated_letters(tpus2, spec):
    rng = np.random.default_rng(10)
    ops = _einsum_operands(spec, rng, [np.float64] * (spec.count(",") + 1))
    want = _check_einsum(tpus2, spec, ops)
    _check_einsum(tpus2, spec, _einsum_operands(spec, rng, [np.int32] * len(ops)))
    # Gradients against finite differences (each operand that depends on the inputs).
    w = rng.standard_normal(want.shape[1:])
    check_grads(tpus2, lambda *o: (pw.numpy.einsum(spec, *o) * w).sum(), ops)


@pytest.mark.parametrize("n", [0, 1])
def test_einsum_repeated_letters_small_sizes(tpus2, n):
    x = np.arange(2 * n * n * 2, dtype=np.float64).reshape(2, n, n, 2)
    for spec in ["iij->ij", "iij->j", "iij->"]:
        _check_einsum(tpus2, spec, [x])


def test_einsum_repeated_letter_of_different_sizes_is_an_error(tpus2, runtime_ok):
    f = pw.pmap(lambda x: pw.numpy.einsum("iji->j", x), devices=tpus2)
    with pytest.raises(ValueError, match=r"einsum: letter 'i' repeats in 'iji' over axes of "
                                         r"different sizes \[2, 3\]"):
        f(np.zeros((2, 2, 4, 3)))
    runtime_ok()


# --- 8. dtypes: square of bool, collectives of Python scalars --------------------------


def test_square_of_bool_is_an_integer(tpus2):
    b = np.array([[True, False, True], [False, False, True]])
    got = np.asarray(pw.pmap(pw.numpy.square, devices=tpus2)(b))
    want = np.square(b)
    assert want.dtype.kind == "i"  # numpy: int8; int32 is the smallest integer dtype here
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, want)
    # An integer result takes part in integer arithmetic: 2 * square(True) is 2, not True.
    got = np.asarray(pw.pmap(lambda v: 2 * pw.numpy.square(v), devices=tpus2)(b))
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, 2 * np.square(b).astype(np.int32))


@pytest.mark.parametrize("n", [2, 4])
def test_collectives_of_python_scalars(tpus2, tpus4, n):
    devices = tpus2 if n == 2 else tpus4

    def f(x):
        return {
            "psum_int": pw.psum(1, "i"),  # JAX: the axis size, an integer
            "psum_float": pw.psum(2.5, "i"),
            "psum_bool": pw.psum(True, "i"),  # bool counts, as JAX's psum (converted to int32)
            "pmax_int": pw.pmax(3, "i"),
            "pmin_int": pw.pmin(-2, "i"),
            "pmax_float": pw.pmax(0.5, "i"),
            "pmean_int": pw.pmean(3, "i"),  # JAX: psum(3) / n, a float
            "pmean_bool": pw.pmean(True, "i"),
            "pmean_float": pw.pmean(0.25, "i"),
            "all_gather_int": pw.all_gather(7, "i"),
            "tree": pw.psum((1, [2.0, False]), "i"),
            "returned_int": 5,  # as JAX: a Python int output is int32, a bool bool
            "returned_bool": True,
            "mixed": x + pw.psum(1, "i"),  # an int32 count added to an int32 value stays int32
        }

    out = pw.pmap(f, devices=devices, axis_name="i")(np.arange(n, dtype=np.int32))
    want = {
        "psum_int": (np.int32, n),
        "psum_float": (np.float64, 2.5 * n),
        "psum_bool": (np.int32, n),
        "pmax_int": (np.int32, 3),
        "pmin_int": (np.int32, -2),
        "pmax_float": (np.float64, 0.5),
        "pmean_int": (np.float64, 3.0),
        "pmean_bool": (np.float64, 1.0),
        "pmean_float": (np.float64, 0.25),
        "returned_int": (np.int32, 5),
        "returned_bool": (np.bool_, True),
    }
    for key, (dtype, value) in want.items():
        got = np.asarray(out[key])
        assert got.dtype == dtype, (key, got.dtype)
        np.testing.assert_array_equal(got, np.full(n, value, dtype), err_msg=key)
    gathered = np.asarray(out["all_gather_int"])
    assert gathered.dtype == np.int32
    np.testing.assert_array_equal(gathered, np.full((n, n), 7))
    one, (two, false) = out["tree"]
    assert [np.asarray(v).dtype for v in (one, two, false)] == [np.int32, np.float64, np.int32]
    np.testing.assert_array_equal(np.asarray(two), np.full(n, 2.0 * n))
    np.testing.assert_array_equal(np.asarray(false), np.zeros(n))
    mixed = np.asarray(out["mixed"])
    assert mixed.dtype == np.int32
    np.testing.assert_array_equal(mixed, np.arange(n) + n)


def test_grad_of_a_python_int_output_is_an_error_as_jax(tpus2, runtime_ok):
    # A Python int output is int32 now (JAX's grad refuses integer outputs too).
    f = pw.pmap(lambda x: pw.grad(lambda v: 1)(x), devices=tpus2)
    with pytest.raises(TypeError, match=r"grad requires real-valued outputs .* got i32\[\]"):
        f(np.ones((2, 3)))
    runtime_ok()


@pytest.mark.parametrize("n", [2, 4])
def test_pmean_of_int32_is_not_truncated(tpus2, tpus4, n):
    # JAX's pmean is psum(x) / n, a float; it used to truncate to int32 here.
    tpus = tpus2 if n == 2 else tpus4
    f = pw.pmap(lambda x: pw.pmean(x, "i"), devices=tpus, axis_name="i")
    x = np.arange(1, n + 1, dtype=np.int32)[:, None] * np.array([1, -3], np.int32)
    got = np.asarray(f(x))
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, np.broadcast_to(x.mean(0), x.shape))


# --- Found by a second probe against JAX (this session's) ---------------------------


def test_sigmoid_and_silu_of_integers_compute_in_float(tpus2):
    # -x of uint32 wrapped, so sigmoid of uint32 was 0 everywhere.
    for dtype in (np.uint32, np.int32):
        x = np.array([[0, 1, 5, 100]] * 2, dtype)
        s = 1 / (1 + np.exp(-x.astype(np.float64)))
        got = np.asarray(pw.pmap(pnn.sigmoid, devices=tpus2)(x))
        assert got.dtype == np.float64
        np.testing.assert_allclose(got, s, rtol=1e-15)
        np.testing.assert_allclose(np.asarray(pw.pmap(pnn.silu, devices=tpus2)(x)), x * s,
                                   rtol=1e-15)
        np.testing.assert_allclose(pnn.sigmoid(x), s, rtol=1e-15)  # on numpy arrays too


def test_int64_constants_out_of_the_int32_range_are_refused(tpus2, runtime_ok):
    # They wrapped silently to 32 bits; as arguments they were already refused.
    x = np.array([[1, 2]] * 2, np.int32)
    with pytest.raises(ValueError, match=r"constant of dtype int64 has values outside the int32 "
                                         r"range"):
        pw.pmap(lambda v: v + np.array([2**40 + 5, 3]), devices=tpus2)(x)
    with pytest.raises(ValueError, match="constant of dtype uint64 has values outside"):
        pw.pmap(lambda v: v + np.array([2**32 + 3, 1], np.uint64), devices=tpus2)(x)
    # In range they are int32, as before.
    got = pw.pmap(lambda v: v + np.array([-(2**31) + 1, 2**31 - 3]), devices=tpus2)(x)
    np.testing.assert_array_equal(np.asarray(got)[0], [-(2**31) + 2, 2**31 - 1])
    runtime_ok()


def test_at_get_with_mode_drop_fills_as_jax(tpus2):
    x = np.arange(12.0, dtype=np.float32).reshape(3, 4)
    i = np.array([3, -4, 1], np.int32)

    def f(v, idx):
        return (v.at[idx].get(mode="drop")[:, 0], v.at[idx, 1].get(mode="drop"),
                v.at[idx].get(mode="drop", fill_value=-1.0)[:, 0])

    rows, elems, filled = (np.asarray(o)[0] for o in pw.pmap(f, devices=tpus2)(
        np.stack([x, x]), np.stack([i, i])))
    np.testing.assert_array_equal(rows, [np.nan, np.nan, 4.0])
    np.testing.assert_array_equal(elems, [np.nan, np.nan, 5.0])
    np.testing.assert_array_equal(filled, [-1.0, -1.0, 4.0])


def test_reductions_take_numpys_positional_arguments(tpus2, runtime_ok):
    # The third positional argument was keepdims; in numpy and JAX it is dtype
    # (sum, mean, var, std, prod) or out (max, min, argmax).
    y = np.arange(6, dtype=np.int32).reshape(2, 3)

    def f(v):
        return (pw.numpy.sum(v, 0, np.float32), v.sum(1, np.float64), pw.numpy.mean(v, 0, np.float32),
                pw.numpy.var(v, None, np.float32), v.sum(0, keepdims=True))

    outs = [np.asarray(o)[0] for o in pw.pmap(f, devices=tpus2)(np.stack([y, y]))]
    want = [y.sum(0, dtype=np.float32), y.sum(1, dtype=np.float64), y.mean(0, dtype=np.float32),
            y.var(dtype=np.float32), y.sum(0, keepdims=True).astype(np.int32)]
    for got, w in zip(outs, want):
        assert got.dtype == w.dtype and got.shape == w.shape
        np.testing.assert_allclose(got, w, rtol=1e-6)
    with pytest.raises(TypeError, match="positional argument"):
        pw.pmap(lambda v: pw.numpy.max(v, 0, True), devices=tpus2)(np.stack([y, y]))
    runtime_ok()


def test_sign_gradient_is_zero_at_nan(tpus2):
    x = np.array([[np.nan, 0.0, -0.0, 1.0, -3.0]] * 2)
    g = _grad_in_pmap(tpus2, pw.numpy.sign, x)
    np.testing.assert_array_equal(g, np.zeros_like(x))
    got = np.asarray(pw.pmap(pw.numpy.sign, devices=tpus2)(x))
    np.testing.assert_array_equal(got, np.sign(x))


CONSTANT_MASK = np.array([[True, False, True, False], [False, False, True, True],
                          [True, True, True, False]])
GATHER_INDEXES = [
    (np.array([True, False, True]),),
    (slice(None), np.array([True, False, True, False])),
    (CONSTANT_MASK,),
    (CONSTANT_MASK, 1),
    (0, np.array([False, True, True, False]), slice(1, 3)),
    (..., np.array([True, False, True, False, True])),
    ([True, False, True],),
    (np.array([0, 2]), np.array([1, 3])),
    (np.array([[0], [2]]), slice(None), np.array([1, 3])),  # separated: arrays first
    (np.array([0, 2]), 1, np.array([4, -1])),
    (np.array([2, 0]), np.array([3, 3]), np.array([0, 4])),
]


@pytest.mark.parametrize("index", GATHER_INDEXES, ids=range(len(GATHER_INDEXES)))
def test_constant_masks_and_several_integer_arrays_index_as_numpy(tpus2, index):
    # JAX takes a concrete boolean mask (its positions are known at trace time)
    # and several integer arrays; x[...] once refused both.
    x = np.arange(60.0).reshape(3, 4, 5)
    got = np.asarray(pw.pmap(lambda v: v[index], devices=tpus2)(np.stack([x, x])))[0]
    want = x[index]
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_several_traced_integer_arrays_index_and_clamp(tpus2, runtime_ok):
    x = np.arange(60.0).reshape(3, 4, 5)
    i, j = np.array([0, 2, 7], np.int32), np.array([-1, 1, 0], np.int32)
    got = np.asarray(pw.pmap(lambda v, a, b: v[a, :, b], devices=tpus2)(
        np.stack([x, x]), np.stack([i, i]), np.stack([j, j])))[0]
    np.testing.assert_array_equal(got, x[np.clip(i, 0, 2), :, j])  # out of range: clamped
    with pytest.raises(IndexError, match="with a boolean mask: the result's shape would depend"):
        pw.pmap(lambda v, m: v[m], devices=tpus2)(np.stack([x, x]),
                                                  np.stack([CONSTANT_MASK[:, 0]] * 2))
    runtime_ok()
