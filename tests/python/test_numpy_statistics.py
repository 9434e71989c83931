"""pathways.numpy's median, quantile, percentile, average, ptp, count_nonzero, amax,
amin, nan_to_num, hypot, diff and linalg.norm, and pw.lax.map: against numpy per
device over axes, keepdims, dtypes and NaNs, with gradients where they have one.
"""

import re

import ml_dtypes
import numpy as np
import pytest

import pathways as pw
import pathways.numpy as pnp

RNG = np.random.default_rng(21)
X = RNG.standard_normal((2, 4, 5))
XN = X.copy()
XN[0, 1, 2] = np.nan
XI = RNG.integers(-9, 9, size=(2, 4, 5)).astype(np.int32)


def per_device(tpus, fn, *args):
    return np.asarray(pw.pmap(fn, devices=tpus)(*args))


def assert_like_numpy(tpus, fn, *args, rtol=1e-14, ref=None):
    got = per_device(tpus, fn, *args)
    ref = fn if ref is None else ref
    with np.errstate(all="ignore"):
        want = np.stack([np.asarray(ref(*[a[i] for a in args])) for i in range(len(tpus))])
    assert got.shape == want.shape, (got.shape, want.shape)
    if want.dtype == np.int64:
        want = want.astype(np.int32)  # no int64 on the devices
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol)


AXES = [None, 0, 1, -1, (0, 1), (1, 0)]


@pytest.mark.parametrize("axis", AXES)
@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("x", [X, XN, XI], ids=["f64", "nan", "i32"])
def test_median_like_numpy(tpus2, axis, keepdims, x):
    assert_like_numpy(tpus2, lambda a: pnp.median(a, axis=axis, keepdims=keepdims), x)


@pytest.mark.parametrize("q", [0.0, 0.25, 0.5, 0.9, 1.0, [0.1, 0.75], np.array([[0.3], [0.6]])])
@pytest.mark.parametrize("axis", [None, 1, (0, 1)])
def test_quantile_and_percentile_like_numpy(tpus2, q, axis):
    for x in (X, XN, XI):
        assert_like_numpy(tpus2, lambda a: pnp.quantile(a, q, axis=axis), x)
        assert_like_numpy(tpus2, lambda a: pnp.percentile(a, np.asarray(q) * 100, axis=axis,
                                                          keepdims=True), x)
    # float32 stays float32 whatever q is, as JAX's (numpy's float64 q array promotes).
    x32 = X.astype(np.float32)
    assert_like_numpy(tpus2, lambda a: np.quantile(a, q, axis=axis), x32, rtol=1e-6,
                      ref=lambda a: np.quantile(a, q, axis=axis).astype(np.float32))


def test_median_gradient_goes_to_the_middle_elements(tpus2):
    x = np.array([[3.0, 1.0, 2.0, 5.0], [4.0, 0.0, 9.0, 7.0]])
    g = per_device(tpus2, pw.grad(lambda a: pnp.median(a)), x)
    np.testing.assert_array_equal(g, [[0.5, 0, 0.5, 0], [0.5, 0, 0, 0.5]])


@pytest.mark.parametrize("axis", [None, 0, 1, (0, 1)])
def test_ptp_count_nonzero_amax_amin(tpus2, axis):
    for x in (X, XI, XI > 0):
        assert_like_numpy(tpus2, lambda a: pnp.count_nonzero(a, axis=axis), x)
        assert_like_numpy(tpus2, lambda a: pnp.amax(a, axis=axis), x)
        assert_like_numpy(tpus2, lambda a: pnp.amin(a, axis=axis, keepdims=True), x)
    for x in (X, XI):
        assert_like_numpy(tpus2, lambda a: pnp.ptp(a, axis=axis), x)


def test_average(tpus2):
    w = np.abs(RNG.standard_normal((2, 4, 5))) + 0.1
    assert_like_numpy(tpus2, lambda a: pnp.average(a), X)
    assert_like_numpy(tpus2, lambda a, b: pnp.average(a, axis=1, weights=b), X, w)
    assert_like_numpy(tpus2, lambda a, b: pnp.average(a, weights=b, keepdims=True), X, w)
    w1 = np.stack([np.arange(1.0, 6.0)] * 2)
    assert_like_numpy(tpus2, lambda a, b: pnp.average(a, axis=-1, weights=b), X, w1)
    got = pw.pmap(lambda a, b: pnp.average(a, axis=0, weights=b, returned=True), devices=tpus2)(X, w)
    want = [np.average(X[i], axis=0, weights=w[i], returned=True) for i in range(2)]
    for k in range(2):
        np.testing.assert_allclose(np.asarray(got[k]), np.stack([v[k] for v in want]), rtol=1e-14)
    avg, count = pw.pmap(lambda a: pnp.average(a, axis=1, returned=True), devices=tpus2)(X)
    np.testing.assert_array_equal(np.asarray(count), np.full((2, 4), 5.0))


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")
def test_nan_to_num(tpus2):
    x = np.array([[np.nan, np.inf, -np.inf, 1.5, -0.0], [2.0, np.nan, 3.0, -np.inf, np.inf]])
    for dtype in (np.float64, np.float32, ml_dtypes.bfloat16):
        xs = x.astype(dtype)
        got = per_device(tpus2, pnp.nan_to_num, xs)
        assert got.dtype == xs.dtype
        want = np.nan_to_num(x.astype(np.float32 if dtype == ml_dtypes.bfloat16 else dtype))
        if dtype == ml_dtypes.bfloat16:
            want = np.nan_to_num(xs.astype(np.float64), posinf=float(ml_dtypes.finfo(dtype).max),
                                 neginf=float(ml_dtypes.finfo(dtype).min))
        np.testing.assert_array_equal(got.astype(np.float64), np.asarray(want, np.float64))
    assert_like_numpy(tpus2, lambda a: pnp.nan_to_num(a, nan=-1.0, posinf=9.0, neginf=-9.0), x)
    assert_like_numpy(tpus2, lambda a: np.nan_to_num(a), XI)


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")
def test_hypot(tpus2):
    a = np.array([[3.0, 1e200, 1e-200, 0.0, np.inf, np.nan, -5.0], [1.0, 2.0, -7.0, 0.0, 1.0, 2.0, 0.5]])
    b = np.array([[4.0, 1e200, 1e-200, 0.0, np.nan, np.inf, 12.0], [-1.0, 3.0, 0.0, 2.0, np.nan, 1.0, 0.25]])
    got = per_device(tpus2, pnp.hypot, a, b)
    np.testing.assert_array_max_ulp(got, np.hypot(a, b), maxulp=2)
    assert_like_numpy(tpus2, lambda p, q: np.hypot(p, q), a.astype(np.float32), b.astype(np.float32),
                      rtol=3e-7)
    g = per_device(tpus2, pw.grad(lambda p: pnp.hypot(p, 2.0).sum()), np.array([[1.5], [-3.0]]))
    np.testing.assert_allclose(g, [[1.5 / 2.5], [-3.0 / np.hypot(3.0, 2.0)]], rtol=1e-15)


@pytest.mark.parametrize("n, axis, prepend, append", [
    (1, -1, None, None), (2, 0, None, None), (3, 1, None, None), (0, -1, None, None),
    (1, -1, 0.0, None), (1, 0, None, np.ones((1, 5))), (2, -1, -1.0, 2.0), (9, -1, None, None),
])
def test_diff_like_numpy(tpus2, n, axis, prepend, append):
    assert_like_numpy(tpus2, lambda a: pnp.diff(a, n=n, axis=axis, prepend=prepend, append=append), X)
    assert_like_numpy(tpus2, lambda a: pnp.diff(a, n=n, axis=axis), XI)
    assert_like_numpy(tpus2, lambda a: pnp.diff(a, axis=axis), XI > 0)


NORMS = [
    (None, None), (2, 0), (1, -1), (np.inf, 1), (-np.inf, 0), (0, 1), (3, -1), (0.5, 0),
    ("fro", (0, 1)), (1, (0, 1)), (-1, (1, 0)), (np.inf, (0, 1)), (-np.inf, (0, 1)), (None, (1, 0)),
    (2, (0, 1)), (-2, (1, 0)), ("nuc", (0, 1)), (2, (1, 0)), ("nuc", (-1, 0)),
]


@pytest.mark.parametrize("ord, axis", NORMS, ids=[f"{o}-{a}" for o, a in NORMS])
@pytest.mark.parametrize("keepdims", [False, True])
def test_norm_like_numpy(tpus2, ord, axis, keepdims):
    x = X[:, :, :4]
    assert_like_numpy(tpus2, lambda a: pnp.linalg.norm(a, ord=ord, axis=axis, keepdims=keepdims), x,
                      rtol=1e-13)
    assert_like_numpy(tpus2, lambda a: np.linalg.norm(a, ord, axis), XI, rtol=1e-13)


def test_norm_of_vectors_and_matrices_by_rank(tpus2):
    v = X[:, 0, :]
    m = X[:, :, :3]
    for ord in (None, 1, 2, np.inf, -np.inf, 0, 3):
        assert_like_numpy(tpus2, lambda a: pnp.linalg.norm(a, ord), v)
    for ord in (None, "fro", 1, -1, np.inf, -np.inf, 2, -2, "nuc"):
        assert_like_numpy(tpus2, lambda a: pnp.linalg.norm(a, ord), m, rtol=1e-13)
    g = per_device(tpus2, pw.grad(lambda a: pnp.linalg.norm(a)), v)
    np.testing.assert_allclose(g, v / np.linalg.norm(v, axis=1, keepdims=True), rtol=1e-15)


ERRORS = [
    (lambda a: pnp.linalg.norm(a, "nuc", 0), ValueError, "norm: invalid norm order 'nuc' for vectors"),
    (lambda a: pnp.linalg.norm(a[:, :0], -2, (0, 1)), ValueError, "norm: ord=-2 of empty matrices"),
    (lambda a: pnp.linalg.norm(a, "fro", 0), ValueError, "norm: invalid norm order 'fro' for vectors"),
    (lambda a: pnp.linalg.norm(a[None], 1), ValueError, "norm: improper number of dimensions to norm (f64[1,4,5]) with ord=1"),
    (lambda a: pnp.linalg.norm(a, None, (0, 0)), ValueError, "norm: duplicate axes given"),
    (lambda a: pnp.quantile(a, 1.5), ValueError, "quantile: q must be in the range [0, 1], got 1.5"),
    (lambda a: pnp.quantile(a, 0.5, method="nearest"), ValueError, "quantile: only method='linear' is supported"),
    (lambda a: pnp.quantile(a, a[0, 0]), TypeError, "quantile: q must be known when tracing"),
    (lambda a: pnp.percentile(a, -1), ValueError, "percentile: q must be in the range [0, 100], got -1"),
    (lambda a: pnp.median(a[:, :0], axis=1), ValueError, "median: there are no elements to reduce over"),
    (lambda a: pnp.diff(a, n=-1), ValueError, "diff: order must be non-negative, got -1"),
    (lambda a: pnp.average(a, axis=0, weights=np.ones(3)), ValueError, "average: weights f64[3] must have the shape of a"),
    (lambda a: pnp.average(a, weights=np.zeros((4, 5))), ZeroDivisionError, "average: weights sum to zero"),
    (lambda a: pnp.average(a, axis=1, weights=np.array([1.0, -1.0, 2.0, 0.0, -2.0])), ZeroDivisionError,
     "average: weights sum to zero"),
    (lambda a: pnp.average(a, axis=-4, weights=np.ones(3)), ValueError, "average: axis -4 is out of range"),
    (lambda a: pw.lax.map(lambda r: r, a, batch_size=0), ValueError, "pw.lax.map: batch_size must be >= 1, got 0"),
    (lambda a: pw.lax.map(lambda r: r, a, batch_size=1.5), TypeError, "pw.lax.map: batch_size must be a static int"),
    (lambda a: pnp.linalg.norm(a[0], "fro"), ValueError, "norm: invalid norm order 'fro' for vectors"),
    (lambda a: pnp.linalg.norm(a, [1]), ValueError, "norm: invalid norm order [1]"),
    (lambda a: pnp.quantile(a, "x"), TypeError, "quantile: q must be a number or an array of numbers, got 'x'"),
    (lambda a: pnp.median(a, axis=(0, 0)), ValueError, "median: repeated axis in (0, 0)"),
    (lambda a: pnp.nan_to_num(a, nan=None), TypeError, "nan_to_num: nan must be a number, got None"),
]


@pytest.mark.parametrize("body, exc, message", ERRORS, ids=[e[2][:40] for e in ERRORS])
def test_errors(tpus2, runtime_ok, body, exc, message):
    with pytest.raises(exc, match=re.escape(message)):
        pw.pmap(body, devices=tpus2)(X)
    runtime_ok()


def test_lax_map(tpus2):
    got = per_device(tpus2, lambda a: pw.lax.map(lambda r: (r * r).sum(), a), X)
    np.testing.assert_allclose(got, (X * X).sum(axis=2), rtol=1e-15)
    res = pw.pmap(lambda a: pw.lax.map(lambda r: {"s": r[0].sum() + r[1].sum(), "m": r[0].max()},
                                       (a, 2 * a)), devices=tpus2)(X)
    np.testing.assert_allclose(np.asarray(res["s"]), 3 * X.sum(axis=2), rtol=1e-14)
    np.testing.assert_array_equal(np.asarray(res["m"]), X.max(axis=2))
    g = per_device(tpus2, pw.grad(lambda a: pw.lax.map(lambda r: pnp.sin(r).sum(), a).sum()), X)
    np.testing.assert_allclose(g, np.cos(X), rtol=1e-15)
    np.testing.assert_allclose(pw.lax.map(lambda r: r * 2, np.arange(3.0)), [0.0, 2.0, 4.0])
    # batch_size gives the same results, as JAX's (here and in JAX).
    jax = pytest.importorskip("jax")
    unbatched = per_device(tpus2, lambda a: pw.lax.map(lambda r: (r * r).sum(), a), X)
    for b in (1, 2, 3, 7):
        got = per_device(tpus2, lambda a: pw.lax.map(lambda r: (r * r).sum(), a, batch_size=b), X)
        np.testing.assert_array_equal(got, unbatched)
        want = jax.lax.map(lambda r: (r * r).sum(), X[0].astype(np.float32), batch_size=b)
        np.testing.assert_allclose(got[0], np.asarray(want), rtol=1e-6)


def test_empty_q_and_integer_averages(tpus2):
    assert_like_numpy(tpus2, lambda a: pnp.quantile(a, [], axis=1), X)
    w = np.ones((2, 4, 5), np.float32)
    assert_like_numpy(tpus2, lambda a, b: pnp.average(a, weights=b), XI, w)
    assert_like_numpy(tpus2, lambda a, b: pnp.average(a, axis=0, weights=b), XI > 0, w)
