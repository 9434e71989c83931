"""uint32 and the bitwise ops (`& | ^ ~ << >>`, pw.lax's shifts and bitcast), against numpy and JAX.

uint32 values go through every kind of kernel: elementwise (wrapping
arithmetic, comparisons, conversions), reductions, collectives, indexing,
top_k and matmul; bitwise ops follow numpy (bitwise on integers, logical on
bools), and shift counts outside [0, 32) follow XLA (jax.lax), which numpy
leaves undefined.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pathways as pw
import pathways.numpy as pnp

U32_MAX = np.iinfo(np.uint32).max


def run(devices, fn, *args):
    return pw.pmap(fn, devices=devices)(*args)


def big_uint32(rng, shape):
    """uint32 values over the whole range, the extremes included."""
    v = rng.integers(0, 2**32, size=shape, dtype=np.uint64).astype(np.uint32)
    flat = v.reshape(-1)
    flat[: min(3, flat.size)] = np.array([0, U32_MAX, 2**31], np.uint32)[: min(3, flat.size)]
    return v


def big_int32(rng, shape):
    return big_uint32(rng, shape).view(np.int32)


def test_uint32_arrays_in_and_out(tpus2):
    x = np.array([[1, U32_MAX, 2**31], [7, 0, 123456789]], np.uint32)
    out = run(tpus2, lambda v: v, x)
    assert out.dtype == np.uint32
    got = np.asarray(out)
    assert got.dtype == np.uint32
    np.testing.assert_array_equal(got, x)
    buf = pw.device_put(x, tpus2)
    assert buf.dtype == np.uint32
    np.testing.assert_array_equal(np.asarray(run(tpus2, lambda v: v + 1, buf)), x + np.uint32(1))
    # Scalars of numpy's uint32 type too (a pytree leaf each).
    got = np.asarray(run(tpus2, lambda v, s: v * s, x, np.array([np.uint32(3)] * 2)[:, None]))
    np.testing.assert_array_equal(got, x * np.uint32(3))


ARITHMETIC = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "/": lambda a, b: a / b,
    "max": np.maximum,
    "min": np.minimum,
    "<": lambda a, b: a < b,
    ">=": lambda a, b: a >= b,
    "==": lambda a, b: a == b,
}


@pytest.mark.parametrize("name", list(ARITHMETIC))
def test_uint32_arithmetic_wraps_as_numpy(tpus2, name):
    fn = ARITHMETIC[name]
    rng = np.random.default_rng(5)
    a = big_uint32(rng, (2, 3, 4))
    b = big_uint32(rng, (2, 4))
    b[b == 0] = 1
    got = np.asarray(run(tpus2, fn, a, b))
    with np.errstate(over="ignore"):
        want = np.stack([fn(a[i], b[i]) for i in range(2)])
    assert got.dtype == want.dtype, name
    np.testing.assert_array_equal(got, want)


def test_uint32_unary_pow_and_abs(tpus2):
    a = np.array([[0, 1, 3, U32_MAX], [2**31, 5, 7, 2]], np.uint32)
    e = np.array([[5, 0, 21, 2], [1, 13, 0, 31]], np.uint32)
    got = run(tpus2, lambda x, y: (-x, x ** y, abs(x), pnp.square(x)), a, e)
    with np.errstate(over="ignore"):
        want = (-a, a ** e, np.abs(a), np.square(a))
    for g, w in zip(got, want):
        g = np.asarray(g)
        assert g.dtype == np.uint32
        np.testing.assert_array_equal(g, w)
    exp = np.asarray(run(tpus2, pnp.exp, np.array([[0, 1], [2, 3]], np.uint32)))
    assert exp.dtype == np.float64  # integers compute in float64, as numpy
    np.testing.assert_allclose(exp, np.exp(np.array([[0, 1], [2, 3]], np.float64)), rtol=1e-15)


def test_uint32_promotion(tpus2):
    u = np.array([[1, 2**31 + 5], [3, U32_MAX]], np.uint32)
    i = np.array([[-1, 2], [3, -4]], np.int32)
    f = np.array([[0.5, 1.5], [2.5, 3.5]], np.float32)
    d = np.array([[0.5, 1.5], [2.5, 3.5]], np.float64)
    p = np.array([[True, False], [True, True]])
    got = run(tpus2, lambda u, i, f, d, p: (u + i, u + f, u * d, u + p, p & u, u + 7, u * 0.5,
                                           u + np.uint32(1), np.float32(2) * u), u, i, f, d, p)
    dtypes = [np.asarray(g).dtype for g in got]
    # int32 with uint32 is int32, as JAX's (numpy: int64); the rest as numpy.
    assert dtypes == [np.int32, np.float64, np.float64, np.uint32, np.uint32, np.uint32,
                      np.float64, np.uint32, np.float64]
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(np.asarray(got[0]), (u.view(np.int32) + i))
        np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(
            jnp.asarray(u) + jnp.asarray(i)))
        np.testing.assert_array_equal(np.asarray(got[1]), u + f)
        np.testing.assert_array_equal(np.asarray(got[5]), u + np.uint32(7))
        np.testing.assert_array_equal(np.asarray(got[6]), u * 0.5)
    with pytest.raises(OverflowError, match="-1 out of bounds for uint32"):
        run(tpus2, lambda u: u + -1, u)


def test_conversions_to_and_from_uint32(tpus2):
    u = np.array([[0, 1, 2**31, U32_MAX], [16777217, 5, 2**24, 7]], np.uint32)
    got = run(tpus2, lambda x: (x.astype(np.float32), x.astype(np.float64), x.astype(np.int32),
                                x.astype(np.bool_)), u)
    for g, dt in zip(got, (np.float32, np.float64, np.int32, np.bool_)):
        np.testing.assert_array_equal(np.asarray(g), u.astype(dt))
    f = np.array([[0.0, 3.99, 4294967040.0, 1.5], [2.0**31, -0.75, 16777216.0, 7.0]], np.float32)
    i = np.array([[-1, 0, 5, -(2**31)], [2**31 - 1, 3, -7, 1]], np.int32)
    p = np.array([[True, False, True, True], [False, False, True, False]])
    got = run(tpus2, lambda f, i, p: (f.astype(np.uint32), f.astype(np.float64).astype(np.uint32),
                                      i.astype(np.uint32), p.astype(np.uint32)), f, i, p)
    # In range: numpy's (truncation toward zero; int32 keeps its bits).
    np.testing.assert_array_equal(np.asarray(got[0]), np.trunc(f).astype(np.uint32))
    np.testing.assert_array_equal(np.asarray(got[1]), np.trunc(f).astype(np.uint32))
    np.testing.assert_array_equal(np.asarray(got[2]), i.view(np.uint32))
    np.testing.assert_array_equal(np.asarray(got[3]), p.astype(np.uint32))


def test_float_to_uint32_out_of_range_saturates_as_jax(tpus2):
    # numpy leaves these undefined (its scalar and vector paths disagree); XLA saturates.
    vals = np.array([[-1.5, 5e9, np.nan, np.inf], [-np.inf, 4294967296.0, -0.5, 1e30]], np.float32)
    got = np.asarray(run(tpus2, lambda x: x.astype(np.uint32), vals))
    want = np.asarray(jnp.asarray(vals).astype(jnp.uint32))
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, [[0, U32_MAX, 0, U32_MAX], [0, U32_MAX, 0, U32_MAX]])


BITWISE = {
    "&": lambda a, b: a & b,
    "|": lambda a, b: a | b,
    "^": lambda a, b: a ^ b,
    "bitwise_and": pnp.bitwise_and,
    "bitwise_or": pnp.bitwise_or,
    "bitwise_xor": pnp.bitwise_xor,
    "np.bitwise_and": np.bitwise_and,  # numpy's ufunc on a traced value: pnp's namesake
}


@pytest.mark.parametrize("name", list(BITWISE))
@pytest.mark.parametrize("dtype", [np.int32, np.uint32, np.bool_], ids=lambda d: np.dtype(d).name)
def test_bitwise_ops_match_numpy(tpus2, name, dtype):
    fn = BITWISE[name]
    rng = np.random.default_rng(7)
    if dtype == np.bool_:
        a, b = rng.random((2, 3, 5)) < 0.5, rng.random((2, 5)) < 0.5
    else:
        a, b = big_uint32(rng, (2, 3, 5)).view(dtype), big_uint32(rng, (2, 5)).view(dtype)
    got = np.asarray(run(tpus2, fn, a, b))
    want = np.stack([fn(a[i], b[i]) for i in range(2)])
    assert got.dtype == want.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got, want)
    # With a constant operand on either side, and a numpy array on the left (numpy's ufunc).
    c = b[0]
    np.testing.assert_array_equal(np.asarray(run(tpus2, lambda x: fn(c, x), a)),
                                  np.stack([fn(c, a[i]) for i in range(2)]))


def test_bitwise_with_python_ints_and_mixed_types(tpus2):
    u = np.array([[0xF0F0F0F0, 1], [U32_MAX, 6]], np.uint32)
    i = np.array([[-8, 1], [12, -1]], np.int32)
    p = np.array([[True, False], [True, True]])
    got = run(tpus2, lambda u, i, p: (u & 0xFF, 0xFFFF0000 | u, u ^ i, p & i, p ^ True, i | 3), u, i, p)
    np.testing.assert_array_equal(np.asarray(got[0]), u & 0xFF)
    np.testing.assert_array_equal(np.asarray(got[1]), u | np.uint32(0xFFFF0000))
    assert np.asarray(got[2]).dtype == np.int32  # int32 with uint32: int32 (JAX)
    np.testing.assert_array_equal(np.asarray(got[2]), u.view(np.int32) ^ i)
    assert np.asarray(got[3]).dtype == np.int32
    np.testing.assert_array_equal(np.asarray(got[3]), p & i)
    np.testing.assert_array_equal(np.asarray(got[4]), p ^ True)
    np.testing.assert_array_equal(np.asarray(got[5]), i | 3)


@pytest.mark.parametrize("dtype", [np.int32, np.uint32, np.bool_], ids=lambda d: np.dtype(d).name)
def test_invert(tpus2, dtype):
    rng = np.random.default_rng(9)
    a = (rng.random((2, 7)) < 0.5) if dtype == np.bool_ else big_uint32(rng, (2, 7)).view(dtype)
    for fn in (lambda x: ~x, pnp.invert, pnp.bitwise_not, np.invert):
        got = np.asarray(run(tpus2, fn, a))
        assert got.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(got, ~a)  # logical for bool, not ~1 = 254


def jax_shift(name, x, n):
    return np.asarray(getattr(jax.lax, name)(jnp.asarray(x), jnp.asarray(n)))


@pytest.mark.parametrize("dtype", [np.int32, np.uint32], ids=lambda d: np.dtype(d).name)
def test_shift_operators_match_numpy_in_range_and_jax_out_of_range(tpus2, dtype):
    rng = np.random.default_rng(13)
    x = big_uint32(rng, (2, 40)).view(dtype)
    n = rng.integers(0, 32, size=(2, 40)).astype(dtype)
    got_l, got_r = run(tpus2, lambda x, n: (x << n, x >> n), x, n)
    np.testing.assert_array_equal(np.asarray(got_l), x << n)
    np.testing.assert_array_equal(np.asarray(got_r), x >> n)  # arithmetic for int32
    np.testing.assert_array_equal(np.asarray(pnp.left_shift(x, n)), x << n)  # numpy outside
    got = run(tpus2, lambda x, n: (pnp.left_shift(x, n), pnp.right_shift(x, n)), x, n)
    np.testing.assert_array_equal(np.asarray(got[0]), x << n)
    np.testing.assert_array_equal(np.asarray(got[1]), x >> n)
    # Counts outside [0, 32): every bit shifted out, as XLA.
    wide = np.array([[32, 33, 1000, -1], [-32, 2**31 - 1, 31, 0]], np.int64).astype(dtype)
    xs = np.array([[-8, 5, -1, 7], [-(2**31), 9, -2, 3]], np.int64).astype(dtype)
    got_l, got_r = run(tpus2, lambda x, n: (x << n, x >> n), xs, wide)
    right = "shift_right_arithmetic" if dtype == np.int32 else "shift_right_logical"
    np.testing.assert_array_equal(np.asarray(got_l), jax_shift("shift_left", xs, wide))
    np.testing.assert_array_equal(np.asarray(got_r), jax_shift(right, xs, wide))


@pytest.mark.parametrize("name", ["shift_left", "shift_right_logical", "shift_right_arithmetic"])
@pytest.mark.parametrize("dtype", [np.int32, np.uint32], ids=lambda d: np.dtype(d).name)
def test_lax_shifts_match_jax(tpus2, name, dtype):
    rng = np.random.default_rng(17)
    x = big_uint32(rng, (2, 64)).view(dtype)
    n = rng.integers(-40, 40, size=(2, 64)).astype(np.int64).astype(dtype)
    want = jax_shift(name, x, n)
    fn = getattr(pw.lax, name)
    got = np.asarray(run(tpus2, fn, x, n))
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got, want)
    # Outside a trace (one device), and with a Python int count taking x's dtype.
    np.testing.assert_array_equal(fn(x[0], n[0]), want[0])
    np.testing.assert_array_equal(np.asarray(run(tpus2, lambda v: fn(v, 3), x)),
                                  jax_shift(name, x, np.full_like(x, 3)))
    assert fn(x[0], 3).dtype == np.dtype(dtype)


def test_lax_shift_errors(tpus2, runtime_ok):
    with pytest.raises(TypeError, match=re.escape(
            "shift_left: operands must have the same dtype (as jax.lax.shift_left), got int32 "
            "and uint32")):
        pw.lax.shift_left(np.int32(1), np.uint32(2))
    with pytest.raises(TypeError, match="shift_right_logical: operands must have the same dtype"):
        run(tpus2, lambda x: pw.lax.shift_right_logical(x, x.astype(np.uint32)),
            np.zeros((2, 3), np.int32))
    with pytest.raises(TypeError, match=re.escape(
            "shift_left: operands must be integers, got f32[3] and f32[3]")):
        run(tpus2, lambda x: pw.lax.shift_left(x, x), np.zeros((2, 3), np.float32))
    runtime_ok()


@pytest.mark.parametrize("src, dst", [(np.float32, np.uint32), (np.float32, np.int32),
                                      (np.uint32, np.float32), (np.int32, np.float32),
                                      (np.int32, np.uint32), (np.uint32, np.int32)])
def test_bitcast_convert_type_matches_jax(tpus2, src, dst):
    rng = np.random.default_rng(19)
    bits = big_uint32(rng, (2, 50))
    bits[0, 3:7] = [0x7FC00000, 0xFFC00001, 0x80000000, 0x7F800000]  # NaNs (payloads), -0, inf
    x = bits.view(src)
    got = run(tpus2, lambda v: pw.lax.bitcast_convert_type(v, dst), x)
    assert got.dtype == np.dtype(dst)
    want = np.asarray(jax.lax.bitcast_convert_type(jnp.asarray(x), dst))
    np.testing.assert_array_equal(np.asarray(got).view(np.uint32), want.view(np.uint32))
    np.testing.assert_array_equal(pw.lax.bitcast_convert_type(x, dst).view(np.uint32), bits)


def test_bitcast_convert_type_errors(tpus2, runtime_ok):
    msg = "bitcast_convert_type: float64 to uint32 is not supported: only float32, int32 and uint32"
    with pytest.raises(TypeError, match=msg):
        pw.lax.bitcast_convert_type(np.zeros(3), np.uint32)
    with pytest.raises(TypeError, match="bitcast_convert_type: float32 to bool is not supported"):
        run(tpus2, lambda v: pw.lax.bitcast_convert_type(v, np.bool_), np.zeros((2, 3), np.float32))
    with pytest.raises(TypeError, match="bitcast_convert_type: new_dtype must be a dtype"):
        pw.lax.bitcast_convert_type(np.zeros(3, np.float32), "nope")
    runtime_ok()


def test_no_gradient_flows_through_integer_bits(tpus2):
    # A float built from integer bits is a constant to grad; the float path still differentiates.
    def loss(w, bits):
        mantissa = pw.lax.bitcast_convert_type((bits >> 9) | 0x3F800000, np.float32) - 1.0
        return (w * mantissa).sum() + (w * w).sum()

    bits = np.array([[0xDEADBEEF, 0x12345678, 7], [1, 2**31, U32_MAX]], np.uint32)
    w = np.array([[0.5, -1.0, 2.0], [1.0, 3.0, -2.0]], np.float32)
    got = np.asarray(run(tpus2, pw.grad(loss), w, bits))
    mantissa = ((bits >> 9) | 0x3F800000).view(np.float32) - np.float32(1)
    np.testing.assert_allclose(got, mantissa + 2 * w, rtol=1e-6)


def test_uint32_reductions_wrap_as_jax(tpus2):
    x = np.array([[[U32_MAX, 2, 3], [1, 2**31, 0]], [[5, U32_MAX - 1, 7], [8, 9, 10]]], np.uint32)
    got = run(tpus2, lambda v: (v.sum(), v.sum(axis=0), v.max(axis=1), v.min(), v.argmax(axis=-1),
                                v.mean()), x)
    sums = np.asarray(got[0])
    assert sums.dtype == np.uint32  # as JAX without x64 (numpy: uint64)
    np.testing.assert_array_equal(sums, [np.asarray(jnp.sum(jnp.asarray(x[i]))) for i in range(2)])
    np.testing.assert_array_equal(np.asarray(got[1]), np.stack([
        (x[i].astype(np.uint64).sum(axis=0) % 2**32).astype(np.uint32) for i in range(2)]))
    np.testing.assert_array_equal(np.asarray(got[2]), x.max(axis=2))
    np.testing.assert_array_equal(np.asarray(got[3]), x.reshape(2, -1).min(axis=1))
    np.testing.assert_array_equal(np.asarray(got[4]), x.argmax(axis=-1))
    mean = np.asarray(got[5])
    assert mean.dtype == np.float64
    np.testing.assert_allclose(mean, x.reshape(2, -1).mean(axis=1), rtol=1e-15)


def test_uint32_collectives(tpus2):
    x = np.array([[U32_MAX, 2, 2**31], [1, 2**31 + 1, 0]], np.uint32)
    f = pw.pmap(lambda v: (pw.psum(v, "i"), pw.pmax(v, "i"), pw.pmin(v, "i"),
                           pw.all_gather(v, "i"), pw.ppermute(v, "i", [(0, 1), (1, 0)])),
                devices=tpus2, axis_name="i")
    s, mx, mn, g, p = (np.asarray(o) for o in f(x))
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(s, np.stack([x[0] + x[1]] * 2))
    np.testing.assert_array_equal(mx, np.stack([np.maximum(x[0], x[1])] * 2))
    np.testing.assert_array_equal(mn, np.stack([np.minimum(x[0], x[1])] * 2))
    np.testing.assert_array_equal(g, np.stack([x, x]))
    np.testing.assert_array_equal(p, x[::-1])
    assert s.dtype == mx.dtype == g.dtype == p.dtype == np.uint32
    # pmean of integers is float64, as JAX's psum(x) / n (the sum wrapping as psum's).
    mean = np.asarray(pw.pmap(lambda v: pw.pmean(v, "i"), devices=tpus2, axis_name="i")(x))
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(mean, np.stack([(x[0] + x[1]) / 2.0] * 2))
    assert mean.dtype == np.float64
    np.testing.assert_array_equal(mean[0], [0.0, (2**31 + 3) / 2, 2**30])  # 2**32 wraps to 0


def test_uint32_indexing_top_k_and_matmul(tpus2):
    rng = np.random.default_rng(23)
    x = big_uint32(rng, (2, 4, 6))
    idx = np.array([[3, -1, 9], [0, 5, -7]], np.int32)
    got = run(tpus2, lambda v, i: (v[1], v[:, ::2], pnp.take(v, i, axis=1),
                                   pw.lax.top_k(v, 3), v @ v.transpose(1, 0)), x, idx)
    np.testing.assert_array_equal(np.asarray(got[0]), x[:, 1])
    np.testing.assert_array_equal(np.asarray(got[1]), x[:, :, ::2])
    want_take = np.asarray(jax.vmap(lambda v, i: jnp.take(v, i, axis=1))(jnp.asarray(x),
                                                                          jnp.asarray(idx)))
    np.testing.assert_array_equal(np.asarray(got[2]), want_take)  # fill: the largest uint32
    assert (np.asarray(got[2])[:, :, 2] == U32_MAX).all()
    values, indices = (np.asarray(o) for o in got[3])
    want_v, want_i = jax.vmap(lambda v: jax.lax.top_k(v, 3))(jnp.asarray(x))
    np.testing.assert_array_equal(values, np.asarray(want_v))
    np.testing.assert_array_equal(indices, np.asarray(want_i))
    mm = np.asarray(got[4])
    assert mm.dtype == np.uint32
    # Modulo 2**32, through Python ints (uint64 sums of 32-bit products overflow).
    want_exact = np.array([[[sum(int(a) * int(b) for a, b in zip(x[s, r], x[s, c])) % 2**32
                             for c in range(4)] for r in range(4)] for s in range(2)], np.uint32)
    np.testing.assert_array_equal(mm, want_exact)


def test_uint32_creation_and_program(tpus2):
    got = run(tpus2, lambda v: (pnp.zeros(3, dtype=np.uint32), pnp.full((2,), 7, np.uint32) + v,
                                pnp.arange(4, dtype=np.uint32)),
              np.array([1, 2], np.uint32)[:, None])
    assert [np.asarray(g).dtype for g in got] == [np.uint32] * 3
    np.testing.assert_array_equal(np.asarray(got[1]), [[8, 8], [9, 9]])

    step = pw.pmap(lambda v: v * np.uint32(3) + 1, devices=tpus2)

    @pw.program
    def prog(v):
        return step(step(v))

    x = np.array([[1, U32_MAX], [2**31, 5]], np.uint32)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(np.asarray(prog(x)), (x * 3 + 1) * 3 + 1)
