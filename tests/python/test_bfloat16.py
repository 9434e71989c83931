"""bfloat16: stored in bfloat16, computed in float32, against ml_dtypes, numpy and JAX.

Conversions give ml_dtypes' bits (round to nearest even, NaN kept); every op
on bfloat16 gives the float32 result of its bfloat16 inputs rounded once
(checked bit for bit against numpy's float32, or pathways' own float32
kernels for the transcendental functions and reductions, rounded by
ml_dtypes); promotion follows JAX's lattice; gradients flow in bfloat16
(cotangents of bfloat16 values are bfloat16, as in JAX) and match finite
differences to bfloat16's precision; a mixed-precision training step (float32
master weights, bfloat16 compute) runs in one pw.pmap.
"""

import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import pathways as pw
import pathways.numpy as pnp

from test_grad import numeric_grad

BF16 = np.dtype(ml_dtypes.bfloat16)
SUPPORTED = "float32, float64, int32, bool, uint32, bfloat16"

# numpy warns when it casts NaN and infinities, which these tests do on purpose.
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered in cast",
                                        "ignore:overflow encountered in cast")


def run(devices, fn, *args, axis_name=None):
    return pw.pmap(fn, devices=devices, axis_name=axis_name)(*args)


def bits(a):
    """The bfloat16 (or float32) values of `a` as their bit patterns, for exact comparison."""
    a = np.asarray(a)
    return a.view(np.uint16 if a.dtype == BF16 else np.uint32)


def assert_same_bits(got, want):
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    np.testing.assert_array_equal(bits(got), bits(want))


def assert_same_values(got, want):
    """Bit for bit, except that any NaN matches any NaN (payloads carry no meaning)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape
    nan = np.isnan(want.astype(np.float32))
    np.testing.assert_array_equal(np.isnan(got.astype(np.float32)), nan)
    np.testing.assert_array_equal(bits(got)[~nan], bits(want)[~nan])


def f32_of_bits(u):
    return np.asarray(u, np.uint32).view(np.float32)


def edge_floats():
    """float32 values where rounding to bfloat16 is decided: specials, ties, subnormals."""
    specials = f32_of_bits([
        0x00000000, 0x80000000,  # +-0
        0x7F800000, 0xFF800000,  # +-inf
        0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFA00000, 0x7FFFFFFF,  # NaNs, payloads
        0x00000001, 0x00008000, 0x00008001, 0x00018000, 0x807FFFFF,  # float32 subnormals
        0x00010000, 0x80010000,  # the smallest bfloat16 subnormals
        0x7F7FFFFF, 0x7F7F7FFF, 0x7F7F8000, 0xFF7F8001,  # near the largest: inf or not
        0x3F808000, 0x3F818000, 0x3F807FFF, 0x3F808001,  # ties to even, and either side
    ])
    rng = np.random.default_rng(0)
    upper = rng.integers(0, 2**16, size=4000, dtype=np.uint32) << 16
    lows = np.array([0x0000, 0x7FFF, 0x8000, 0x8001, 0xFFFF], np.uint32)
    around = (upper[:, None] | lows[None, :]).reshape(-1)
    random = rng.integers(0, 2**32, size=20000, dtype=np.uint64).astype(np.uint32)
    return np.concatenate([specials, f32_of_bits(around), f32_of_bits(random)])


def all_bfloat16():
    return np.arange(2**16, dtype=np.uint32).astype(np.uint16).view(BF16)


def random_bf16(rng, shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(BF16)


# --- In and out ----------------------------------------------------------------------


def test_bfloat16_is_ml_dtypes_and_jax_bfloat16():
    assert pnp.bfloat16 is ml_dtypes.bfloat16
    assert pw.numpy.bfloat16 is ml_dtypes.bfloat16
    assert np.dtype(jnp.bfloat16) == np.dtype(pnp.bfloat16) == BF16


def test_arrays_in_and_out_keep_their_bits(tpus2):
    x = all_bfloat16().reshape(2, -1)
    out = run(tpus2, lambda v: v, x)
    assert out.dtype == BF16
    assert_same_bits(out, x)  # NaN payloads included: nothing computes on them
    buf = pw.device_put(x, tpus2)
    assert buf.dtype == BF16
    assert_same_bits(buf, x)
    assert_same_bits(run(tpus2, lambda v: v, buf), x)
    # A bfloat16 scalar per device, and a one-element buffer's item().
    s = np.array([ml_dtypes.bfloat16(1.5), ml_dtypes.bfloat16(-2)])
    got = run(tpus2, lambda v: v * 2, s)
    assert_same_bits(got, np.array([3, -4], BF16))
    one = run(tpus2, lambda v: v.sum(), np.ones((2, 3), BF16))
    assert np.asarray(one)[0] == 3
    assert float(pw.device_put(np.array([2.5], BF16), tpus2[:1])) == 2.5


def test_empty_arrays(tpus2):
    x = np.zeros((2, 0, 3), BF16)
    outs = run(tpus2, lambda v: (v + 1, v.sum(axis=0), v.astype(np.float32)), x)
    assert [(np.asarray(o).dtype, np.asarray(o).shape) for o in outs] == [
        (BF16, (2, 0, 3)), (BF16, (2, 3)), (np.float32, (2, 0, 3))]
    np.testing.assert_array_equal(np.asarray(outs[1]).astype(np.float32), 0)


# --- Conversions: ml_dtypes' bits ------------------------------------------------------


def test_float32_to_bfloat16_rounds_as_ml_dtypes(tpus2):
    x = edge_floats()
    x = x[: x.size // 2 * 2].reshape(2, -1)
    assert_same_bits(run(tpus2, lambda v: v.astype(pnp.bfloat16), x), x.astype(BF16))
    # Ties go to even: 1 + 2^-8 to 1, 1 + 3 * 2^-8 up to 1 + 2^-6; NaN stays NaN with its sign.
    t = np.array([[1 + 2**-8, 1 + 3 * 2**-8, -np.nan, 3.4e38]] * 2, np.float32)
    got = np.asarray(run(tpus2, lambda v: v.astype(jnp.bfloat16), t))
    np.testing.assert_array_equal(bits(got)[0], [0x3F80, 0x3F82, 0xFFC0, 0x7F80])


def test_bfloat16_to_float32_and_float64_is_exact(tpus2):
    x = all_bfloat16().reshape(2, -1)
    f32, f64 = run(tpus2, lambda v: (v.astype(np.float32), v.astype(np.float64)), x)
    assert_same_bits(f32, x.astype(np.float32))
    np.testing.assert_array_equal(np.asarray(f64), x.astype(np.float64))  # NaN where NaN


@pytest.mark.parametrize("dtype", [np.float64, np.int32, np.uint32, np.bool_])
def test_other_dtypes_to_bfloat16_as_ml_dtypes(tpus2, dtype):
    rng = np.random.default_rng(1)
    if dtype == np.float64:
        # 1 + 2^-8 + 2^-30 rounds to a float32 tie first, then to 1: ml_dtypes
        # (and so numpy's astype) go through float32.
        x = np.concatenate([
            [1 + 2**-8 + 2**-30, 1e300, -1e-300, np.nan, -np.inf, -0.0, 0.1],
            rng.standard_normal(993) * 10.0 ** rng.integers(-40, 40, 993)])
    elif dtype == np.bool_:
        x = rng.random(1000) < 0.5
    else:
        info = np.iinfo(dtype)
        x = np.concatenate([[info.min, info.max, 0, 2**24 + 1, 2**24 + 3, 257, 259],
                            rng.integers(info.min, info.max, 993, dtype=np.int64)]).astype(dtype)
    x = x.astype(dtype).reshape(2, -1)
    assert_same_bits(run(tpus2, lambda v: v.astype(pnp.bfloat16), x), x.astype(BF16))


def test_bfloat16_to_integers_and_bool(tpus2):
    x = all_bfloat16()
    finite = x[np.isfinite(x.astype(np.float32))]
    in_range = finite[np.abs(finite.astype(np.float32)) < 2**31]
    in_range = in_range[: in_range.size // 2 * 2].reshape(2, -1)
    i32, b = run(tpus2, lambda v: (v.astype(np.int32), v.astype(np.bool_)), in_range)
    np.testing.assert_array_equal(np.asarray(i32), in_range.astype(np.int32))  # truncated
    np.testing.assert_array_equal(np.asarray(b), in_range.astype(np.bool_))
    nonneg = in_range[in_range.astype(np.float32) >= 0]
    nonneg = nonneg[: nonneg.size // 2 * 2].reshape(2, -1)
    np.testing.assert_array_equal(np.asarray(run(tpus2, lambda v: v.astype(np.uint32), nonneg)),
                                  nonneg.astype(np.uint32))
    # Out of range, NaN and -0 by the rules for float32 (int32: INT32_MIN as numpy on x86;
    # uint32 saturates as XLA; bool: NaN is True, -0 False).
    odd = np.array([[np.nan, np.inf, -np.inf, 5e9, -0.0, -2.5]] * 2, BF16)
    i32, u32, b = run(tpus2, lambda v: (v.astype(np.int32), v.astype(np.uint32), v.astype(bool)),
                      odd)
    m = np.iinfo(np.int32).min
    np.testing.assert_array_equal(np.asarray(i32)[0], [m, m, m, m, 0, -2])
    np.testing.assert_array_equal(np.asarray(u32)[0], [0, 2**32 - 1, 0, 2**32 - 1, 0, 0])
    np.testing.assert_array_equal(np.asarray(b)[0], [True, True, True, True, False, True])


def test_constants_fold_with_the_same_rounding(tpus2):
    # An int32 constant meeting a bfloat16 value becomes a bfloat16 constant at
    # trace time; it must round as the kernel (and ml_dtypes) do.
    c = np.array([2**24 + 1, 2**24 + 3, 257, 259, -(2**31), 2**31 - 1], np.int32)
    x = np.zeros((2, 6), BF16)
    f = pw.pmap(lambda v: v + c, devices=tpus2)
    assert "const bf16[6]" in f.as_text(x)
    assert_same_bits(f(x), np.broadcast_to(c.astype(BF16), (2, 6)))


# --- Arithmetic: float32 of the bfloat16 inputs, rounded once ------------------------------

BINARY = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "/": lambda a, b: a / b,
    "maximum": pnp.maximum,
    "minimum": pnp.minimum,
}
NUMPY_BINARY = {"+": np.add, "-": np.subtract, "*": np.multiply, "/": np.divide,
                "maximum": np.maximum, "minimum": np.minimum}


def operands(rng, n):
    """Pairs of bfloat16 values over many magnitudes, with edge values of both kinds."""
    a = (rng.standard_normal(n) * 10.0 ** rng.integers(-20, 20, n)).astype(BF16)
    b = (rng.standard_normal(n) * 10.0 ** rng.integers(-20, 20, n)).astype(BF16)
    edge = np.array([0, -0.0, np.inf, -np.inf, np.nan, 1, -1, 3.3895e38, 9.2e-41], BF16)
    a = np.concatenate([np.repeat(edge, edge.size), a])
    b = np.concatenate([np.tile(edge, edge.size), b])
    m = a.size // 2 * 2
    return a[:m].reshape(2, -1), b[:m].reshape(2, -1)


@pytest.mark.parametrize("name", list(BINARY))
def test_binary_ops_round_the_float32_result_once(tpus2, name):
    a, b = operands(np.random.default_rng(2), 2000)
    with np.errstate(all="ignore"):
        want = NUMPY_BINARY[name](a.astype(np.float32), b.astype(np.float32)).astype(BF16)
    assert_same_bits(run(tpus2, BINARY[name], a, b), want)


def test_pow_and_square_round_the_float32_result_once(tpus2):
    rng = np.random.default_rng(3)
    a = np.abs(random_bf16(rng, (2, 300), 3.0))
    b = random_bf16(rng, (2, 300), 2.0)
    ours32 = np.asarray(run(tpus2, lambda x, y: x ** y, a.astype(np.float32), b.astype(np.float32)))
    assert_same_bits(run(tpus2, lambda x, y: x ** y, a, b), ours32.astype(BF16))
    # x ** 2 is x * x (as JAX's integer_pow), rounded once.
    assert_same_bits(run(tpus2, lambda x: (x ** 2, pnp.square(x)), a)[0],
                     (a.astype(np.float32) ** 2).astype(BF16))


UNARY = {
    "exp": pnp.exp, "log": pnp.log, "tanh": pnp.tanh, "sqrt": pnp.sqrt, "rsqrt": pnp.rsqrt,
    "sin": pnp.sin, "cos": pnp.cos, "neg": lambda x: -x, "abs": pnp.abs, "sign": pnp.sign,
}


@pytest.mark.parametrize("name", list(UNARY))
def test_unary_ops_are_the_float32_kernels_rounded_once(tpus2, name):
    # The reference is pathways' own float32 kernel (whose accuracy
    # test_vector_math measures), rounded by ml_dtypes: bfloat16 must add
    # nothing but that one rounding.
    x = all_bfloat16().reshape(2, -1)
    fn = UNARY[name]
    want = np.asarray(run(tpus2, fn, x.astype(np.float32))).astype(BF16)
    got = run(tpus2, fn, x)
    assert np.asarray(got).dtype == BF16
    assert_same_values(got, want)  # sign(NaN) passes its NaN through, as a select does


def test_comparisons_and_where(tpus2):
    a, b = operands(np.random.default_rng(4), 500)
    fa, fb = a.astype(np.float32), b.astype(np.float32)
    lt, ge, eq, ne = run(tpus2, lambda x, y: (x < y, x >= y, x == y, x != y), a, b)
    with np.errstate(invalid="ignore"):
        for got, want in [(lt, fa < fb), (ge, fa >= fb), (eq, fa == fb), (ne, fa != fb)]:
            assert np.asarray(got).dtype == np.bool_
            np.testing.assert_array_equal(np.asarray(got), want)
    sel = run(tpus2, lambda x, y: pnp.where(x > y, x, y), a, b)
    assert_same_bits(sel, np.where(fa > fb, a, b))


def test_chains_round_after_every_op(tpus2):
    # (a * b) + c rounds the product to bfloat16 before the sum, as JAX does
    # op by op; a fused float32 a * b + c would not: (1 + 2^-5)^2 - 1 is
    # 2^-4 + 2^-10 in float32, but the product rounds to 1 + 2^-4 first.
    a = np.array([[1 + 2**-5, 3.0]] * 2, BF16)
    b = np.array([[1 + 2**-5, 5.0]] * 2, BF16)
    c = np.array([[-1.0, 1.0]] * 2, BF16)
    got = np.asarray(run(tpus2, lambda x, y, z: x * y + z, a, b, c))
    prod = (a.astype(np.float32) * b.astype(np.float32)).astype(BF16)
    want = (prod.astype(np.float32) + c.astype(np.float32)).astype(BF16)
    assert_same_bits(got, want)
    assert got[0, 0] == 2**-4


# --- Promotion (JAX's lattice) -----------------------------------------------------------

PROMOTION = [
    (np.float32, np.float32),
    (np.float64, np.float64),
    (np.int32, BF16),
    (np.uint32, BF16),
    (np.bool_, BF16),
    (BF16, BF16),
]


@pytest.mark.parametrize("other, result", PROMOTION, ids=lambda d: np.dtype(d).name)
def test_promotion_with_arrays_as_jax(tpus2, other, result):
    assert np.dtype(jnp.promote_types(jnp.bfloat16, other)) == np.dtype(result)
    x = np.full((2, 3), 1.5, BF16)
    y = np.ones((2, 3), other)
    outs = run(tpus2, lambda a, b: (a + b, b * a, pnp.maximum(a, b), pnp.where(a > 0, a, b),
                                    pnp.concatenate([a, b], -1)), x, y)
    for o in outs:
        assert np.asarray(o).dtype == np.dtype(result)
    np.testing.assert_array_equal(np.asarray(outs[0]).astype(np.float64), 2.5)


def test_promotion_with_scalars_as_jax(tpus2):
    x = np.full((2, 3), 1.5, BF16)
    cases = {
        "python float": (lambda a: a * 0.1, BF16),  # weak: bfloat16(0.1)
        "python int": (lambda a: a + 3, BF16),
        "python bool": (lambda a: a * True, BF16),
        # numpy scalars are weak here (README, "Coming from JAX"), where JAX's are strong.
        "numpy float32": (lambda a: a + np.float32(1), BF16),
        "numpy float64": (lambda a: a + np.float64(1), BF16),
        "numpy float32 array": (lambda a: a + np.array(1, np.float32), np.float32),
        "numpy float64 array": (lambda a: a + np.array(1, np.float64), np.float64),
        "numpy int32": (lambda a: a + np.int32(1), BF16),
        "int32 / int32": (lambda a: a.astype(np.int32) / 3, np.float64),
        "true division": (lambda a: a / 3, BF16),
        "mean": (lambda a: a.mean(), BF16),
    }
    for name, (fn, dtype) in cases.items():
        assert np.asarray(run(tpus2, fn, x)).dtype == np.dtype(dtype), name
    # The weak float is rounded to bfloat16 before the product, as in JAX.
    got = np.asarray(run(tpus2, lambda a: a * 0.1, x))
    assert_same_bits(got, (x.astype(np.float32) * np.float32(BF16.type(0.1))).astype(BF16))
    jax_got = np.asarray(jnp.asarray(x) * 0.1)
    assert_same_bits(got, jax_got)
    # A traced int32 value with a bfloat16 one rounds the integer to bfloat16 first.
    k = np.array([[257, 2**24 + 1, -3]] * 2, np.int32)
    got = run(tpus2, lambda a, b: a * 1 + b, np.zeros((2, 3), BF16), k)
    assert_same_bits(got, k.astype(BF16))


# --- Reductions and matmul: accumulated in float32, rounded once ---------------------------


def test_sum_accumulates_in_float32(tpus2):
    # In bfloat16 steps 256 + 1 stays 256 (the spacing there is 2); summed in
    # float32 and rounded once it is 256 + 8.
    x = np.array([[256] + [1] * 8] * 2, BF16)
    s, m = run(tpus2, lambda v: (v.sum(), v.mean()), x)
    np.testing.assert_array_equal(np.asarray(s).astype(np.float32), [264, 264])
    assert np.asarray(s).dtype == BF16
    assert_same_bits(m, np.array([264 / 9] * 2, np.float32).astype(BF16))
    assert jnp.asarray(x[0]).sum() == 264  # JAX (XLA) too


@pytest.mark.parametrize("kind", ["sum", "mean", "max", "min"])
def test_reductions_over_every_axis(tpus2, kind):
    rng = np.random.default_rng(5)
    x = random_bf16(rng, (2, 3, 4, 5), 4.0)
    x[0, 1, 2, 3] = np.nan if kind in ("max", "min") else x[0, 1, 2, 3]
    for axis in [None, 0, 1, 2, -1, -2, (0, 2), (-1, 0)]:
        for keepdims in (False, True):
            fn = lambda v: getattr(v, kind)(axis=axis, keepdims=keepdims)  # noqa: E731
            want = np.asarray(run(tpus2, fn, x.astype(np.float32))).astype(BF16)
            got = run(tpus2, fn, x)
            assert_same_bits(got, want)


def test_argmax_and_top_k(tpus2):
    x = np.array([[[1, 3, np.nan, 3], [-0.0, 0.0, -np.inf, 2]]] * 2, BF16)
    am = run(tpus2, lambda v: v.argmax(axis=-1), x)
    np.testing.assert_array_equal(np.asarray(am)[0], [2, 3])  # the first NaN, as numpy
    vals, idx = run(tpus2, lambda v: pw.lax.top_k(v, 3), x)
    assert np.asarray(vals).dtype == BF16
    # Ranked as float32 in totalOrder, as jax.lax.top_k: NaN first, +0 above -0.
    jv, ji = jax.lax.top_k(jnp.asarray(x[0]), 3)
    np.testing.assert_array_equal(np.asarray(idx)[0], np.asarray(ji))
    assert_same_bits(np.asarray(vals)[0], np.asarray(jv))


def test_matmul_and_einsum_accumulate_in_float32(tpus2):
    rng = np.random.default_rng(6)
    a = random_bf16(rng, (2, 3, 4, 40))
    b = random_bf16(rng, (2, 40, 5))
    want = np.asarray(run(tpus2, lambda x, y: x @ y, a.astype(np.float32),
                          b.astype(np.float32))).astype(BF16)
    got = run(tpus2, lambda x, y: x @ y, a, b)
    assert_same_bits(got, want)
    e = run(tpus2, lambda x, y: pnp.einsum("bij,jk->bik", x, y), a, b)
    assert np.asarray(e).dtype == BF16
    np.testing.assert_allclose(np.asarray(e).astype(np.float32),
                               np.asarray(want).astype(np.float32),
                               rtol=2**-7, atol=1e-6)
    # 256 + eight products of 1: float32 accumulation, one rounding.
    r = np.array([[[256] + [1] * 8]] * 2, BF16)
    c = np.ones((2, 9, 1), BF16)
    rc = np.asarray(run(tpus2, lambda x, y: x @ y, r, c))
    np.testing.assert_array_equal(rc.astype(np.float32), [[[264]]] * 2)
    # Mixed: bfloat16 @ float32 is float32, int32 @ bfloat16 bfloat16.
    assert np.asarray(run(tpus2, lambda x, y: x @ y, a, b.astype(np.float32))).dtype == np.float32
    assert np.asarray(run(tpus2, lambda x, y: x @ y, a, b.astype(np.int32))).dtype == BF16


# --- Data movement and collectives ----------------------------------------------------------


def test_shape_ops_and_indexing_move_bits(tpus2):
    x = all_bfloat16()[:2 * 240].reshape(2, 4, 6, 10)
    outs = run(tpus2, lambda v: (v.T, v[1:, ::-2, 3], v.reshape(6, 40), pnp.flip(v, 1),
                                 pnp.concatenate([v, v], 0), pnp.stack([v[0], v[1]]),
                                 pnp.take(v, np.array([2, 0, -1]), axis=1),
                                 pnp.broadcast_to(v[:1], (3, 6, 10))), x)
    wants = [np.transpose(x, (0, 3, 2, 1)), x[:, 1:, ::-2, 3], x.reshape(2, 6, 40), x[:, :, ::-1],
             np.concatenate([x, x], 1), np.stack([x[:, 0], x[:, 1]], 1),
             np.take(x, [2, 0, -1], axis=2), np.broadcast_to(x[:, :1], (2, 3, 6, 10))]
    for got, want in zip(outs, wants):
        assert_same_bits(got, np.ascontiguousarray(want))
    # Out-of-range traced indices give NaN, as jax.numpy.take's default fill.
    idx = np.array([[0, 7], [1, -9]], np.int32)
    t = np.asarray(run(tpus2, lambda v, i: pnp.take(v, i), np.ones((2, 3), BF16), idx))
    assert t.dtype == BF16
    np.testing.assert_array_equal(t.astype(np.float32), [[1, np.nan], [1, np.nan]])


def test_collectives(tpus4):
    rng = np.random.default_rng(7)
    x = random_bf16(rng, (4, 4, 3), 100.0)
    f32 = x.astype(np.float32)

    def fn(v):
        return (pw.psum(v, "i"), pw.pmean(v, "i"), pw.pmax(v, "i"), pw.pmin(v, "i"),
                pw.all_gather(v, "i"), pw.ppermute(v, "i", [(0, 1), (1, 2), (2, 3)]),
                pw.all_to_all(v, "i", 0, 1), pw.psum_scatter(v, "i"))

    outs = [np.asarray(o) for o in run(tpus4, fn, x, axis_name="i")]
    assert all(o.dtype == BF16 for o in outs)
    # The reductions: float32 over the devices, rounded once (the order of a
    # float32 sum is the runtime's, so compare with its float32 result).
    outs32 = [np.asarray(o) for o in run(tpus4, fn, f32, axis_name="i")]
    for k in (0, 1, 2, 3, 7):
        assert_same_bits(outs[k], outs32[k].astype(BF16))
    np.testing.assert_allclose(outs[0][0].astype(np.float32), f32.sum(0), rtol=2**-8, atol=1e-3)
    # The rest move bits.
    assert_same_bits(outs[4], np.broadcast_to(x, (4,) + x.shape))
    assert_same_bits(outs[5], np.concatenate([np.zeros((1, 4, 3), BF16), x[:3]]))
    assert_same_bits(outs[6], outs32[6].astype(BF16))


# --- Gradients ------------------------------------------------------------------------------


def test_cotangents_of_bfloat16_values_are_bfloat16(tpus2):
    x = np.array([[1.5, -2.0, 0.25]] * 2, BF16)
    # d/dx sum(float32(x)^2) = 2x, exact in bfloat16.
    g = run(tpus2, pw.grad(lambda v: (v.astype(np.float32) ** 2).sum()), x)
    assert np.asarray(g).dtype == BF16
    assert_same_bits(g, (2 * x.astype(np.float32)).astype(BF16))
    # A bfloat16 loss: its seed and every cotangent are bfloat16.
    vg = run(tpus2, pw.value_and_grad(lambda v: (v * v).sum()), x)
    assert np.asarray(vg[0]).dtype == BF16 and np.asarray(vg[1]).dtype == BF16
    assert_same_bits(vg[1], (2 * x.astype(np.float32)).astype(BF16))
    # The same in JAX.
    jg = jax.grad(lambda v: (v * v).sum())(jnp.asarray(x[0]))
    assert jg.dtype == jnp.bfloat16
    assert_same_bits(np.asarray(vg[1])[0], np.asarray(jg))


def loss32(w, x, y):
    """A two-layer model's loss in float32 (the reference of the bfloat16 one)."""
    h = np.tanh(x @ w[:12].reshape(3, 4))
    p = h @ w[12:].reshape(4, 2)
    return ((p - y) ** 2).mean()


def test_grads_through_bfloat16_match_finite_differences(tpus2):
    # Float32 parameters computed on in bfloat16: pw.grad's gradient is float32
    # and within bfloat16's precision of the float32 model's finite differences.
    rng = np.random.default_rng(8)
    w = (rng.standard_normal((2, 20)) * 0.5).astype(np.float32)
    x = rng.standard_normal((2, 5, 3)).astype(np.float32)
    y = rng.standard_normal((2, 5, 2)).astype(np.float32)

    def loss(w, x, y):
        wb, xb = w.astype(pnp.bfloat16), x.astype(pnp.bfloat16)
        h = pnp.tanh(xb @ wb[:12].reshape(3, 4))
        p = h @ wb[12:].reshape(4, 2)
        return ((p.astype(np.float32) - y) ** 2).mean()

    g = np.asarray(run(tpus2, pw.grad(loss), w, x, y))
    assert g.dtype == np.float32
    for d in range(2):
        want = numeric_grad(lambda w: loss32(w, x[d], y[d]), [w[d]], 0)
        np.testing.assert_allclose(g[d], want, rtol=3e-2, atol=3e-2 * np.abs(want).max())
    # And the cotangents of the bfloat16 values themselves are bfloat16.
    gb = run(tpus2, pw.grad(lambda w, x, y: loss(w, x, y).astype(pnp.bfloat16)),
             w.astype(BF16), x, y)
    assert np.asarray(gb).dtype == BF16
    np.testing.assert_allclose(np.asarray(gb).astype(np.float32), g, rtol=5e-2,
                               atol=2e-2 * np.abs(g).max())


@pytest.mark.parametrize("name", ["exp", "tanh", "sin", "sqrt", "log"])
def test_unary_grads_in_bfloat16(tpus2, name):
    fn = UNARY[name]
    x = np.array([[0.5, 1.25, 2.0, 3.5]] * 2, BF16)
    g = np.asarray(run(tpus2, pw.grad(lambda v: fn(v).sum()), x))
    assert g.dtype == BF16
    want = numeric_grad(lambda v: float(np.sum(getattr(np, name)(v))), [x[0].astype(np.float64)], 0)
    # Within bfloat16's precision (tanh(3.5) rounds to 1, so its 1 - tanh^2 is 0).
    np.testing.assert_allclose(g[0].astype(np.float64), want, rtol=2**-6, atol=2**-7)
    jg = jax.grad(lambda v: getattr(jnp, name)(v).sum())(jnp.asarray(x[0]))
    assert jg.dtype == jnp.bfloat16
    np.testing.assert_allclose(g[0].astype(np.float32), np.asarray(jg).astype(np.float32),
                               rtol=2**-7, atol=2**-8)


def test_grads_through_collectives(tpus2):
    x = np.array([[1.0, 2.0], [3.0, 5.0]], BF16)
    g = run(tpus2, pw.grad(lambda v: (pw.psum(v, "i") * v).sum()), x, axis_name="i")
    # Each device gets d/dv of sum over devices of psum(v) * v: 2 * psum(v).
    np.testing.assert_array_equal(np.asarray(g).astype(np.float32), [[8, 14], [8, 14]])
    assert np.asarray(g).dtype == BF16


def test_mixed_precision_training_step(tpus2):
    """float32 master weights; a bfloat16 copy for the forward and backward
    passes; bfloat16 gradients averaged over devices (pmean of bfloat16),
    then applied to the float32 master copy."""
    rng = np.random.default_rng(9)
    master = (rng.standard_normal(20) * 0.5).astype(np.float32)
    x = rng.standard_normal((2, 16, 3)).astype(np.float32)
    y = rng.standard_normal((2, 16, 2)).astype(np.float32)
    lr = 0.1

    def loss_bf16(wb, x, y):
        h = pnp.tanh(x.astype(pnp.bfloat16) @ wb[:12].reshape(3, 4))
        p = h @ wb[12:].reshape(4, 2)
        return ((p - y.astype(pnp.bfloat16)) ** 2).mean()

    def step(w, x, y):
        wb = w.astype(pnp.bfloat16)
        loss, g = pw.value_and_grad(loss_bf16)(wb, x, y)
        g = pw.pmean(g, "i")
        return w - lr * g.astype(np.float32), pw.pmean(loss.astype(np.float32), "i"), g

    step_fn = pw.pmap(step, devices=tpus2, axis_name="i")
    w = np.stack([master, master])
    new_w, loss, g = step_fn(w, x, y)
    new_w, loss, g = np.asarray(new_w), np.asarray(loss), np.asarray(g)
    assert new_w.dtype == np.float32 and loss.dtype == np.float32 and g.dtype == BF16
    np.testing.assert_array_equal(new_w[0], new_w[1])  # replicas stay in step
    # Against the float32 model: the gradient of the mean loss over both devices.
    want_g = numeric_grad(lambda m: (loss32(m, x[0], y[0]) + loss32(m, x[1], y[1])) / 2,
                          [master], 0)
    np.testing.assert_allclose(g[0].astype(np.float32), want_g, rtol=5e-2,
                               atol=3e-2 * np.abs(want_g).max())
    np.testing.assert_allclose(new_w[0], master - lr * want_g, rtol=0, atol=3e-3)
    want_loss = (loss32(master, x[0], y[0]) + loss32(master, x[1], y[1])) / 2
    np.testing.assert_allclose(loss[0], want_loss, rtol=2e-2)
    # Training goes on: twenty steps lower the loss, and the master copy
    # accumulates updates smaller than bfloat16 could hold.
    losses = []
    for _ in range(20):
        w, loss, _ = step_fn(w, x, y)
        losses.append(float(np.asarray(loss)[0]))
    assert losses[-1] < 0.8 * losses[0]
    assert np.asarray(w).dtype == np.float32


# --- The IR, and errors ------------------------------------------------------------------------


def test_ir_text_shows_the_float32_compute(tpus2):
    f = pw.pmap(lambda v: (pnp.exp(v) * v).sum(), devices=tpus2)
    text = f.as_text(np.ones((2, 3), BF16))
    assert text.startswith("func @lambda(%0: bf16[3])")
    assert "%1 = convert %0 : f32[3]" in text  # widened once, read by exp and mul
    assert "exp %1 : f32[3]" in text
    assert re.search(r"mul %\d+, %1 : f32\[3\]", text)
    assert re.search(r"sum\[axes=\(0\)\] %\d+ : f32\[\]", text)
    assert text.count(": bf16[]") == 1  # the result, rounded once


def test_errors(tpus2, runtime_ok):
    x = np.ones((2, 3), BF16)
    for fn, msg in [
        (lambda v: v & 1, "and: operands must be bool or integers, got bf16[3]"),
        (lambda v: v << 1, "shift_left: operands must be integers, got bf16[3]"),
        (lambda v: ~v, "not: operand must be bool or an integer, got bf16[3]"),
        (lambda v: pw.lax.bitcast_convert_type(v, np.int32),
         "bitcast_convert_type: bfloat16 to int32 is not supported"),
        (lambda v: v.astype(np.float16), f"supported dtypes: {SUPPORTED}"),
        (lambda v: pnp.take(np.ones(3), v), "take: indices must be int32, got bf16[3]"),
    ]:
        with pytest.raises(TypeError, match=re.escape(msg)):
            run(tpus2, fn, x)
    with pytest.raises(TypeError, match=re.escape(
            f"has dtype float16; supported dtypes: {SUPPORTED}")):
        pw.device_put(np.ones(2, np.float16), tpus2)
    with pytest.raises(TypeError, match=re.escape("grad requires real-valued outputs (float32, "
                                                  "float64 or bfloat16), got i32[]")):
        run(tpus2, pw.grad(lambda v: v.argmax()), x)
    runtime_ok()


def test_the_newer_ops_on_bfloat16_compute_in_float32():
    """cumsum, sort, x.at[] and a scan on bfloat16 values: each result the float32
    computation of the bfloat16 inputs, rounded to bfloat16 (a scan step by step)."""
    x = (np.random.default_rng(0).normal(size=(2, 5)) * 3).astype(BF16)
    f32 = x.astype(np.float32)
    got = pw.jit(lambda v: (pnp.cumsum(v, axis=1), pnp.sort(v), pnp.argsort(v),
                            v.at[0, 1].add(1.5), pw.lax.cummax(v, axis=1)))(x)
    cumsum, srt, order, added, cmax = (np.asarray(g) for g in got)
    assert cumsum.dtype == srt.dtype == added.dtype == cmax.dtype == BF16
    assert_same_bits(cumsum, np.cumsum(f32, axis=1).astype(BF16))
    assert_same_bits(srt, np.sort(x, axis=-1))
    np.testing.assert_array_equal(order, np.argsort(f32, kind="stable"))
    want = x.copy()
    want[0, 1] = (f32[0, 1] + np.float32(1.5)).astype(BF16)
    assert_same_bits(added, want)
    assert_same_bits(cmax, np.maximum.accumulate(x, axis=1))

    def step(c, row):
        return c + row, c * 2

    carry, ys = pw.jit(lambda v: pw.lax.scan(step, pnp.zeros(5, BF16), v))(x)
    c = np.zeros(5, BF16)
    want_ys = []
    for row in x:
        want_ys.append((c.astype(np.float32) * 2).astype(BF16))
        c = (c.astype(np.float32) + row.astype(np.float32)).astype(BF16)
    assert np.asarray(carry).dtype == BF16 and np.asarray(ys).dtype == BF16
    assert_same_bits(np.asarray(carry), c)
    assert_same_bits(np.asarray(ys), np.stack(want_ys))


def test_sum_and_mean_of_bfloat16_numpy_arrays_accumulate_in_float32():
    # As on the devices (and XLA): numpy's own sum of bfloat16 rounds at every
    # add, so 256 + eight ones would stay 256 (bfloat16's spacing there is 2).
    v = np.array([256] + [1] * 8, BF16)
    assert pnp.sum(v).dtype == BF16 and float(pnp.sum(v)) == 264.0
    assert float(pnp.mean(np.stack([v, v]), axis=1)[0]) == np.float32(264 / 9).astype(BF16)
    assert float(pnp.sum(v, dtype=np.float32)) == 264.0
