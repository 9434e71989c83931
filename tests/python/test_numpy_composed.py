"""pathways.numpy functions built from the op table's ops (issue 12, found missing
by a probe written as a JAX user would): isnan, isinf, isfinite; floor, ceil,
round, rint; floor_divide, remainder, fmod and divmod (`//`, `%`; on the `rem`
op for floats); log1p, expm1, log2, log10, reciprocal; prod, any, all, argmin.

Each against numpy, bit for bit where numpy's answer is exact (signs of zero
included), over edge values; log1p and expm1 within 1 ulp.
"""

import ml_dtypes
import numpy as np
import pytest

import pathways as pw
import pathways.numpy as pnp

BF16 = ml_dtypes.bfloat16


def run(tpus, fn, *args):
    """`fn` in a pmap over the devices, every device given the same `args`; device 0's result."""
    stacked = [np.stack([a] * len(tpus)) for a in args]
    return np.asarray(pw.pmap(fn, devices=tpus)(*stacked))[0]


def assert_same(got, want):
    """Equal values, dtypes and shapes; NaN equal to NaN; the sign of zeros kept."""
    want = np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape
    if got.dtype == BF16:
        got, want = got.astype(np.float32), want.astype(np.float32)
    np.testing.assert_array_equal(got, want)
    if got.dtype.kind == "f":
        np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


def edge_values(dtype):
    fi = np.finfo(dtype)
    p = 2.0 ** fi.nmant  # at and above it every float is an integer
    values = [0.0, -0.0, 0.4, -0.4, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 4.7, -4.7,
              np.nextafter(dtype(0.5), dtype(0)), p - 0.5, -(p - 0.5), p, p + 2, 1e7 + 0.5,
              fi.tiny, -fi.tiny, fi.max, -fi.max, np.nan, np.inf, -np.inf]
    return np.array(values, dtype)


ROUNDING = [(pnp.floor, np.floor), (pnp.ceil, np.ceil), (pnp.round, np.round),
            (pnp.rint, np.rint), (pnp.around, np.around)]
TESTS = [(pnp.isnan, np.isnan), (pnp.isinf, np.isinf), (pnp.isfinite, np.isfinite)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("fn, numpy_fn", ROUNDING + TESTS, ids=lambda f: getattr(f, "__name__", ""))
def test_rounding_and_float_tests_match_numpy(tpus2, dtype, fn, numpy_fn):
    x = edge_values(dtype)
    assert_same(run(tpus2, fn, x), numpy_fn(x))
    # numpy's own function on a traced value calls the namesake.
    assert_same(run(tpus2, lambda v: numpy_fn(v), x), numpy_fn(x))
    # Outside a trace, numpy's.
    assert_same(np.asarray(fn(x)), numpy_fn(x))


def test_rounding_of_bfloat16_integers_and_bool(tpus2):
    x = edge_values(np.float32).astype(BF16)
    for fn, numpy_fn in ROUNDING:
        assert_same(run(tpus2, fn, x), numpy_fn(x.astype(np.float32)).astype(BF16))
    # Integers and bool are returned as they are, as jax.numpy (numpy makes floats).
    i = np.array([-3, 0, 2**31 - 1], np.int32)
    assert_same(run(tpus2, pnp.floor, i), i)
    assert_same(run(tpus2, lambda v: v.round(), i), i)
    b = np.array([True, False])
    assert_same(run(tpus2, pnp.ceil, b), b)
    for fn, numpy_fn in TESTS:
        assert_same(run(tpus2, fn, i), numpy_fn(i))
        assert_same(run(tpus2, fn, b), numpy_fn(b))
        assert_same(run(tpus2, fn, x), numpy_fn(x.astype(np.float32)))


def test_round_with_decimals_is_refused(tpus2, runtime_ok):
    with pytest.raises(TypeError, match="round: decimals must be 0 on traced values, got 2"):
        run(tpus2, lambda v: pnp.round(v, 2), np.ones(2))
    runtime_ok()


def test_rounding_has_no_gradient(tpus2):
    x = np.array([0.3, -1.7, 2.5])
    g = run(tpus2, pw.grad(lambda v: (pnp.floor(v) + pnp.ceil(v) + pnp.round(v) * v).sum()), x)
    np.testing.assert_array_equal(g, np.round(x))


INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
NUMERATORS = np.array([7, -7, 7, -7, 0, 5, -5, INT32_MIN, INT32_MAX, -1, 3, 0, INT32_MIN,
                       INT32_MAX, INT32_MIN, 123456789], np.int32)
DENOMINATORS = np.array([2, 2, -2, -2, 0, 0, 0, -1, -1, INT32_MAX, INT32_MIN, 5, INT32_MIN,
                         INT32_MAX, 3, -10], np.int32)


def test_floor_divide_and_remainder_of_int32(tpus2):
    with np.errstate(divide="ignore", over="ignore"):  # numpy warns at x // 0 and INT32_MIN // -1
        want_q, want_r = NUMERATORS // DENOMINATORS, NUMERATORS % DENOMINATORS
    q, r = (np.asarray(o)[0] for o in pw.pmap(lambda a, b: (a // b, a % b), devices=tpus2)(
        np.stack([NUMERATORS] * 2), np.stack([DENOMINATORS] * 2)))
    assert_same(q, want_q)  # x // 0 is 0 and INT32_MIN // -1 wraps, as numpy
    assert_same(r, want_r)  # the sign of the divisor; x % 0 is 0
    assert_same(run(tpus2, lambda a, b: pnp.floor_divide(a, b), NUMERATORS, DENOMINATORS), want_q)
    assert_same(run(tpus2, lambda a, b: pnp.mod(a, b), NUMERATORS, DENOMINATORS), want_r)
    # Python scalars on either side take the traced value's dtype.
    assert_same(run(tpus2, lambda a: a // 3, NUMERATORS), NUMERATORS // np.int32(3))
    with np.errstate(divide="ignore"):
        assert_same(run(tpus2, lambda b: 100 % b, DENOMINATORS), np.int32(100) % DENOMINATORS)
        assert_same(run(tpus2, lambda b: -100 // b, DENOMINATORS), np.int32(-100) // DENOMINATORS)


def test_floor_divide_and_remainder_of_uint32_and_bool(tpus2):
    a = np.array([7, 5, 0, 2**32 - 1, 2**31, 2**32 - 1], np.uint32)
    b = np.array([2, 0, 0, 7, 3, 2**32 - 1], np.uint32)
    with np.errstate(divide="ignore"):
        assert_same(run(tpus2, lambda x, y: x // y, a, b), a // b)
        assert_same(run(tpus2, lambda x, y: x % y, a, b), a % b)
    t = np.array([True, True, False])
    assert_same(run(tpus2, lambda x: x // np.array([True, True, True]), t), t.astype(np.int32))


def float_pairs(dtype):
    """Numerators and denominators as numpy's and JAX's divmod tests pick them: signs,
    exact multiples, quotients just below integers (1.0 // 0.1 is 9), zeros, inf, NaN."""
    a = [7.5, -7.5, 7.5, -7.5, 1.0, -1.0, 6.0, -6.0, 0.0, -0.0, 0.0, 5.0, -5.0, 1e30, 3.0,
         np.inf, 2.0, np.nan, 1.0, 0.3, -0.3, 1e-30, 123456.789, -2.0, 2.0]
    b = [2.0, 2.0, -2.0, -2.0, 0.1, 0.1, 3.0, 3.0, 5.0, 5.0, -5.0, 0.0, 0.0, 7.0, np.inf,
         2.0, np.nan, 1.0, -np.inf, 0.1, 0.1, 3.0, 0.01, 4.0, -4.0]
    return np.array(a, dtype), np.array(b, dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_floor_divide_remainder_fmod_divmod_of_floats_match_numpy(tpus2, dtype):
    a, b = float_pairs(dtype)
    with np.errstate(all="ignore"):
        want = [a // b, a % b, np.fmod(a, b), *np.divmod(a, b)]
    outs = pw.pmap(lambda x, y: (x // y, x % y, pnp.fmod(x, y), *divmod(x, y)), devices=tpus2)(
        np.stack([a, a]), np.stack([b, b]))
    for got, w in zip(outs, want):
        assert_same(np.asarray(got)[0], w)  # bit for bit, signs of zero and NaN included
    # Python scalars take the traced value's type; ints with floats promote as numpy.
    with np.errstate(all="ignore"):
        assert_same(run(tpus2, lambda x: x % 0.75, a), a % dtype(0.75))
        assert_same(run(tpus2, lambda x: 10.0 // x, b), dtype(10.0) // b)
    i = np.array([7, -7, 3], np.int32)
    assert_same(run(tpus2, lambda x: x // 2.5, i), i // 2.5)
    assert_same(run(tpus2, lambda x: pnp.remainder(x, np.float32(2.5)), i),
                np.remainder(i, np.float32(2.5)))


def test_remainder_of_bfloat16_and_the_gradients(tpus2):
    a, b = float_pairs(np.float32)
    with np.errstate(all="ignore"):
        want = (a.astype(BF16).astype(np.float32) % b.astype(BF16).astype(np.float32)).astype(BF16)
    assert_same(run(tpus2, lambda x, y: x % y, a.astype(BF16), b.astype(BF16)), want)
    # d(a % b)/da = 1 and d/db = -(a // b); fmod's d/db = -trunc(a / b); // has none.
    x = np.array([7.5, -7.5, 2.25, -0.3])
    y = np.array([2.0, 2.0, -0.5, 0.1])
    ga, gb = (np.asarray(g)[0] for g in pw.pmap(
        pw.grad(lambda u, v: (u % v + 2 * pnp.fmod(u, v) + u // v).sum(), argnums=(0, 1)),
        devices=tpus2)(np.stack([x, x]), np.stack([y, y])))
    np.testing.assert_array_equal(ga, np.full(4, 3.0))
    np.testing.assert_array_equal(gb, -(x // y) - 2 * np.rint((x - np.fmod(x, y)) / y))
    # pw.lax.rem is jax.lax.rem: truncated, one dtype.
    np.testing.assert_array_equal(
        run(tpus2, lambda u, v: pw.lax.rem(u, v), x, y), np.fmod(x, y))
    np.testing.assert_array_equal(pw.lax.rem(np.array([7, -7], np.int32), 3), [1, -1])
    with pytest.raises(TypeError, match="rem: operands must have the same dtype"):
        pw.lax.rem(np.ones(2), np.ones(2, np.float32))


def ulps(got, want, dtype):
    return np.abs(got.astype(np.float64) - want.astype(np.float64)) / np.spacing(
        np.abs(want).astype(dtype)).astype(np.float64)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_log1p_and_expm1_are_accurate_for_tiny_arguments(tpus2, dtype):
    big = 700.0 if dtype == np.float64 else 80.0
    x = np.array([0.0, -0.0, 1e-30, -1e-30, 1e-10, -1e-10, 1e-5, -1e-5, 0.5, -0.5, 1.0, 10.0,
                  big, -1.0, -0.9999, -50.0, np.inf, -np.inf, np.nan, 1e30], dtype)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        for fn, numpy_fn in [(pnp.log1p, np.log1p), (pnp.expm1, np.expm1)]:
            got, want = run(tpus2, fn, x), numpy_fn(x)
            assert got.dtype == dtype
            finite = np.isfinite(want)
            assert ulps(got[finite], want[finite], dtype).max() <= 2, fn.__name__
            assert_same(got[~finite], want[~finite])
            assert_same(got[:2], want[:2])  # the sign of zero
    # log1p of a grid of magnitudes, and its gradient 1 / (1 + x).
    y = np.geomspace(1e-20, 1e20, 81).astype(dtype)
    assert ulps(run(tpus2, pnp.log1p, y), np.log1p(y), dtype).max() <= 2
    g = run(tpus2, pw.grad(lambda v: pnp.log1p(v).sum()), y)
    # Differentiated through the form above: a few tens of ulp where x is large.
    np.testing.assert_allclose(g, 1 / (1 + y.astype(np.float64)), rtol=64 * np.finfo(dtype).eps)


def test_log2_log10_reciprocal(tpus2):
    x = np.array([1.0, 2.0, 8.0, 10.0, 0.001, 1e300, 0.0, np.inf])
    with np.errstate(divide="ignore"):
        np.testing.assert_allclose(run(tpus2, pnp.log2, x), np.log2(x), rtol=4e-16)
        np.testing.assert_allclose(run(tpus2, pnp.log10, x), np.log10(x), rtol=4e-16)
        assert_same(run(tpus2, pnp.reciprocal, x), np.reciprocal(x))
    i = np.array([1, 4], np.int32)
    assert run(tpus2, pnp.log2, i).dtype == np.float64


REDUCE_X = np.array([[1.0, 2, 0, -3], [np.nan, 1, 1, 2], [0.5, 0.5, 4, -1]], np.float32)


@pytest.mark.parametrize("axis", [None, 0, 1, -1, (0, 1), (1, 0)])
@pytest.mark.parametrize("keepdims", [False, True])
def test_prod_any_all_argmin_match_numpy(tpus2, axis, keepdims):
    x = REDUCE_X
    assert_same(run(tpus2, lambda v: pnp.prod(v, axis=axis, keepdims=keepdims), x),
                np.prod(x, axis=axis, keepdims=keepdims))
    assert_same(run(tpus2, lambda v: v.any(axis=axis, keepdims=keepdims), x),
                np.any(x, axis=axis, keepdims=keepdims))
    assert_same(run(tpus2, lambda v: pnp.all(v, axis=axis, keepdims=keepdims), x),
                np.all(x, axis=axis, keepdims=keepdims))
    if not isinstance(axis, tuple):
        assert_same(run(tpus2, lambda v: v.argmin(axis=axis, keepdims=keepdims), x),
                    np.argmin(x, axis=axis, keepdims=keepdims).astype(np.int32))


def test_reductions_of_integers_bool_and_empty_axes(tpus2):
    i = np.array([[3, INT32_MIN, 5], [INT32_MAX, 0, -1], [INT32_MAX, INT32_MAX, 7]], np.int32)
    assert_same(run(tpus2, lambda v: v.argmin(axis=1), i), np.argmin(i, axis=1).astype(np.int32))
    assert_same(run(tpus2, lambda v: v.prod(axis=0), i), np.prod(i, axis=0).astype(np.int32))
    u = np.array([[3, 0, 2**32 - 1], [2**31, 1, 7]], np.uint32)
    assert_same(run(tpus2, lambda v: v.argmin(axis=1), u), np.argmin(u, axis=1).astype(np.int32))
    b = np.array([[True, False], [True, True]])
    assert_same(run(tpus2, lambda v: v.prod(axis=1), b), np.prod(b, axis=1).astype(np.int32))
    assert_same(run(tpus2, lambda v: v.argmin(axis=1), b), np.argmin(b, axis=1).astype(np.int32))
    assert_same(run(tpus2, lambda v: v.all(axis=1), b), np.all(b, axis=1))
    e = np.zeros((3, 0), np.float32)  # no elements: prod 1, any False, all True
    assert_same(run(tpus2, lambda v: v.prod(axis=1), e), np.prod(e, axis=1))
    assert_same(run(tpus2, lambda v: v.any(axis=1), e), np.any(e, axis=1))
    assert_same(run(tpus2, lambda v: v.all(axis=1), e), np.all(e, axis=1))


def test_prod_gradient_is_exact_with_zeros(tpus2):
    x = np.array([[1.5, 2.0, 0.0, -3.0], [0.5, -2.0, 4.0, 1.0]])
    g = run(tpus2, pw.grad(lambda v: (pnp.prod(v, axis=1) ** 2).sum()), x)
    p = np.prod(x, axis=1, keepdims=True)
    others = np.stack([[np.prod(np.delete(row, k)) for k in range(4)] for row in x])
    np.testing.assert_allclose(g, 2 * p * others, rtol=1e-14)


def test_axis_errors_name_the_function(tpus2, runtime_ok):
    with pytest.raises(ValueError, match=r"prod: axis 2 is out of range for f64\[2,2\]"):
        run(tpus2, lambda v: v.prod(axis=2), np.ones((2, 2)))
    with pytest.raises(TypeError, match="prod: axis must be None, an int or a tuple of ints"):
        run(tpus2, lambda v: v.prod(axis=1.5), np.ones((2, 2)))
    runtime_ok()
