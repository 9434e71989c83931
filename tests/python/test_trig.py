"""tan, the inverse and hyperbolic trigonometric functions and arctan2: ops of
the function IR (C's functions in double, a float result rounded once).

Against numpy per dtype (float64 within an ulp, float32 within an ulp of
numpy's float64 answer rounded), over edge values and out of the domain; the
result dtypes; numpy's own functions on traced values; gradients against
finite differences.
"""

import ml_dtypes
import numpy as np
import pytest

import pathways as pw
import pathways.numpy as pnp

UNARY = ["tan", "arcsin", "arccos", "arctan", "sinh", "cosh", "arcsinh", "arccosh", "arctanh"]
EDGES = np.array([0.0, -0.0, 0.5, -0.9, 1.0, -1.0, 1.5, 10.0, -30.0, 1e-30, 800.0,
                  np.inf, -np.inf, np.nan, 2.0, 0.999999])


def run(tpus, fn, *args):
    """`fn` in a pmap over the devices, every device given the same `args`; device 0's result."""
    stacked = [np.stack([a] * len(tpus)) for a in args]
    return np.asarray(pw.pmap(fn, devices=tpus)(*stacked))[0]


def assert_close(got, want, ulps):
    want = np.asarray(want)
    assert got.shape == want.shape
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    finite = ~np.isnan(want)
    np.testing.assert_array_max_ulp(got[finite], want[finite].astype(got.dtype), maxulp=ulps)


@pytest.mark.parametrize("name", UNARY)
def test_unary_like_numpy(tpus2, name):
    fn = getattr(pnp, name)
    ref = getattr(np, name)
    with np.errstate(all="ignore"):
        got = run(tpus2, fn, EDGES)
        assert got.dtype == np.float64
        assert_close(got, ref(EDGES), 1)
        got32 = run(tpus2, fn, EDGES.astype(np.float32))
        assert got32.dtype == np.float32
        assert_close(got32, ref(EDGES.astype(np.float32).astype(np.float64)), 1)
        ints = np.array([0, 1, -1, 2, 5, -7], np.int32)
        got = run(tpus2, fn, ints)
        assert got.dtype == np.float64
        assert_close(got, ref(ints.astype(np.float64)), 1)
        got = run(tpus2, fn, np.array([True, False]))
        assert got.dtype == np.float32  # numpy's float16 is no dtype here; JAX's float32
        assert_close(got, ref(np.array([1.0, 0.0])), 1)
        bf = EDGES.astype(ml_dtypes.bfloat16)
        got = run(tpus2, fn, bf)
        assert got.dtype == ml_dtypes.bfloat16
        want = ref(bf.astype(np.float64)).astype(np.float32).astype(ml_dtypes.bfloat16)
        np.testing.assert_array_equal(got.astype(np.float64), want.astype(np.float64))


def test_short_names_and_numpys_own_functions(tpus2):
    x = np.array([0.25, -0.5])
    for short, long in [("asin", "arcsin"), ("acos", "arccos"), ("atan", "arctan"),
                        ("asinh", "arcsinh"), ("acosh", "arccosh"), ("atanh", "arctanh")]:
        assert getattr(pnp, short) is getattr(pnp, long)
    for fn in (np.arcsin, np.cosh, lambda a: np.arctan2(a, 1.0)):
        np.testing.assert_allclose(run(tpus2, fn, x), fn(x), rtol=1e-15)


def test_arctan2_quadrants_zeros_and_infinities(tpus2):
    y = np.array([1.0, 1.0, -1.0, -1.0, 0.0, -0.0, 0.0, -0.0, np.inf, np.inf, -np.inf, 3.0, np.nan])
    x = np.array([1.0, -1.0, 1.0, -1.0, 0.0, 0.0, -0.0, -0.0, np.inf, -np.inf, 5.0, -np.inf, 1.0])
    got = run(tpus2, pnp.arctan2, y, x)
    want = np.arctan2(y, x)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
    got32 = run(tpus2, pnp.arctan2, y.astype(np.float32), x.astype(np.float32))
    assert got32.dtype == np.float32
    assert_close(got32, want, 1)
    # Broadcasting, integers in float64, a Python scalar taking the traced dtype.
    yi = np.array([[1], [-2]], np.int32)
    got = run(tpus2, pnp.arctan2, yi, np.array([3, 0, -4], np.int32))
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, np.arctan2(yi, np.array([3, 0, -4])), rtol=1e-15)
    got = run(tpus2, lambda a: pnp.arctan2(a, 2.0), np.array([1.0, -3.0], np.float32))
    assert got.dtype == np.float32


# Points inside every function's domain, away from its poles.
GRAD_POINTS = np.array([[0.3, -0.45, 0.7], [0.1, 0.55, -0.2]])


@pytest.mark.parametrize("name", UNARY)
def test_unary_gradients_against_finite_differences(tpus2, name):
    fn = getattr(pnp, name)
    x = GRAD_POINTS + (1.5 if name == "arccosh" else 0.0)
    g = np.asarray(pw.pmap(pw.grad(lambda v: fn(v).sum()), devices=tpus2)(x))
    eps = 1e-6
    ref = getattr(np, name)
    fd = (ref(x + eps) - ref(x - eps)) / (2 * eps)
    np.testing.assert_allclose(g, fd, rtol=1e-7, atol=1e-9)


def test_arctan2_gradients_with_broadcasting(tpus2):
    y = GRAD_POINTS
    x = np.array([[0.8], [-1.3]])

    def f(a, b):
        return pnp.arctan2(a, b).sum()

    gy, gx = pw.pmap(pw.grad(f, argnums=(0, 1)), devices=tpus2)(y, x)
    r2 = x * x + y * y
    np.testing.assert_allclose(np.asarray(gy), x / r2, rtol=1e-14)
    np.testing.assert_allclose(np.asarray(gx), (-y / r2).sum(axis=1, keepdims=True), rtol=1e-14)
