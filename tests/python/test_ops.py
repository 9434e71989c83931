"""The elementwise op set of compiled functions, checked against numpy.

Each case runs inside `pw.pmap` over 2 devices with random shapes (numpy
broadcasting between per-shard arrays and against constants) and random
values, seeded so that failures reproduce; the expected value is numpy's,
computed shard by shard.
"""

import itertools
import re
import zlib

import numpy as np
import pytest

import pathways as pw
import pathways.numpy as pnp

DTYPES = [np.float32, np.float64, np.int32, np.bool_]
NUM_DEVICES = 2


@pytest.fixture(scope="module")
def tpus():
    return pw.make_virtual_device_set().add_slice(tpu_devices=NUM_DEVICES).tpus


def random_shapes(rng, count):
    """Per-shard shapes of `count` operands that broadcast together."""
    rank = int(rng.integers(0, 4))
    out = [int(d) for d in rng.integers(1, 5, size=rank)]
    shapes = []
    for _ in range(count):
        r = int(rng.integers(0, rank + 1))
        shape = [d if rng.random() < 0.6 else 1 for d in out[rank - r :]]
        shapes.append(tuple(shape))
    return shapes


def random_values(rng, shape, dtype, positive=False, small=False):
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if dtype == np.int32:
        if small:
            lo, hi = (0, 6) if positive else (-5, 6)
        else:
            lo, hi = (1, 50) if positive else (-50, 50)
        return rng.integers(lo, hi, size=shape).astype(np.int32)
    v = rng.normal(size=shape) * (2.0 if small else 10.0)
    if positive:
        v = np.abs(v) + 0.1
    return v.astype(dtype)


def run(tpus, fn, *args):
    out = pw.pmap(fn, devices=tpus)(*args)
    return np.asarray(out)


def expected(fn, *args):
    """numpy's result, shard by shard."""
    return np.stack([np.asarray(fn(*[a[i] for a in args])) for i in range(NUM_DEVICES)])


def assert_matches(got, want, dtype=None):
    want_dtype = np.dtype(dtype) if dtype is not None else want.dtype
    assert got.dtype == want_dtype, (got.dtype, want_dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    if want_dtype.kind == "f":
        rtol = 2e-6 if want_dtype == np.float32 else 1e-13
        np.testing.assert_allclose(got, want.astype(want_dtype), rtol=rtol, atol=rtol)
    else:
        np.testing.assert_array_equal(got, want)


def stacked(rng, shape, dtype, **kw):
    return random_values(rng, (NUM_DEVICES,) + tuple(shape), dtype, **kw)


# --- binary ops ---------------------------------------------------------------

BINARY = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b,
    "pow": lambda a, b: a**b,
    "maximum": pnp.maximum,
    "minimum": pnp.minimum,
    "eq": lambda a, b: a == b,
    "ne": lambda a, b: a != b,
    "lt": lambda a, b: a < b,
    "le": lambda a, b: a <= b,
    "gt": lambda a, b: a > b,
    "ge": lambda a, b: a >= b,
    "equal": pnp.equal,
    "not_equal": pnp.not_equal,
    "less": pnp.less,
    "less_equal": pnp.less_equal,
    "greater": pnp.greater,
    "greater_equal": pnp.greater_equal,
}


def binary_cases():
    for name in BINARY:
        for da, db in itertools.product(DTYPES, DTYPES):
            if da == db == np.bool_ and name in ("sub", "pow"):
                continue  # numpy: error / int8
            yield name, da, db


@pytest.mark.parametrize(
    "name, da, db",
    [
        pytest.param(*c, id=f"{c[0]}-{np.dtype(c[1]).name}-{np.dtype(c[2]).name}")
        for c in binary_cases()
    ],
)
def test_binary_matches_numpy(tpus, name, da, db):
    fn = BINARY[name]
    seed = zlib.crc32(f"{name}-{np.dtype(da).name}-{np.dtype(db).name}".encode())
    rng = np.random.default_rng(seed)
    for _ in range(4):
        sa, sb = random_shapes(rng, 2)
        if name == "pow":
            a = stacked(rng, sa, da, positive=True, small=True)
            b = stacked(rng, sb, db, positive=True, small=True)
        else:
            a = stacked(rng, sa, da)
            b = stacked(rng, sb, db, positive=(name == "div"))
        with np.errstate(all="ignore"):
            want = expected(fn, a, b)
        assert_matches(run(tpus, fn, a, b), want)


@pytest.mark.parametrize("name", ["add", "mul", "maximum", "lt", "eq", "pow", "div"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_binary_broadcasts_against_constants(tpus, name, dtype):
    fn = BINARY[name]
    rng = np.random.default_rng(7)
    if np.dtype(dtype) == np.bool_ and name == "pow":
        # numpy computes bool ** bool in int8; pathways computes it in int32.
        a = stacked(rng, (3,), np.bool_)
        c = random_values(rng, (3,), np.bool_)
        want = np.stack([np.power(a[i].astype(np.int32), c.astype(np.int32)) for i in range(NUM_DEVICES)])
        assert_matches(run(tpus, lambda x: fn(x, c), a), want)
        return
    for _ in range(4):
        sa, sc = random_shapes(rng, 2)
        small = name == "pow"
        a = stacked(rng, sa, dtype, positive=small or name == "div", small=small)
        c = random_values(rng, sc, dtype, positive=small or name == "div", small=small)
        with np.errstate(all="ignore"):
            want = np.stack([np.asarray(fn(a[i], c)) for i in range(NUM_DEVICES)])
            want_r = np.stack([np.asarray(fn(c, a[i])) for i in range(NUM_DEVICES)])
        assert_matches(run(tpus, lambda x: fn(x, c), a), want)
        assert_matches(run(tpus, lambda x: fn(c, x), a), want_r)


def test_incompatible_shapes_name_the_op(tpus):
    f = lambda a, b: a + b  # noqa: E731
    with pytest.raises(ValueError, match=re.escape("add: incompatible shapes f32[2,3] and f32[4]")):
        run(tpus, f, np.zeros((2, 2, 3), np.float32), np.zeros((2, 4), np.float32))
    with pytest.raises(ValueError, match=re.escape("lt: incompatible shapes i32[3] and f64[2]")):
        run(tpus, lambda a: a < np.zeros(2), np.zeros((2, 3), np.int32))
    with pytest.raises(ValueError, match=re.escape("select: incompatible shapes")):
        run(tpus, lambda c, x: pnp.where(c, x, 0.0), np.zeros((2, 3), bool), np.zeros((2, 2)))


def test_python_scalars_are_weakly_typed(tpus):
    i = np.arange(4, dtype=np.int32).reshape(2, 2)
    f = np.ones((2, 2), np.float32)
    b = np.array([[True, False], [False, True]])
    cases = [
        (lambda x: x + 1, i, np.int32, i + 1),
        (lambda x: x * 0.5, i, np.float64, i * 0.5),  # int32 with float32 -> float64
        (lambda x: x * 2, f, np.float32, f * 2),
        (lambda x: 2**x, f, np.float32, 2**f),
        (lambda x: x + 1, b, np.int32, b + 1),
        (lambda x: x * 0.5, b, np.float32, b * 0.5),
        (lambda x: x & True, b, np.bool_, b),
        (lambda x: x > 1, i, np.bool_, i > 1),
        (lambda x: 1 < x, i, np.bool_, i > 1),
    ]
    for fn, arg, dtype, want in cases:
        got = run(tpus, fn, arg)
        assert got.dtype == np.dtype(dtype), (got.dtype, dtype)
        np.testing.assert_allclose(got.astype(np.float64), np.asarray(want, np.float64))


def test_int32_division_is_true_division(tpus):
    a = np.array([[7, -9], [1, 3]], np.int32)
    b = np.array([[2, 4], [3, 3]], np.int32)
    got = run(tpus, lambda x, y: x / y, a, b)
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, a / b)


# --- logical ops ----------------------------------------------------------------

LOGICAL = {
    "&": lambda a, b: a & b,
    "|": lambda a, b: a | b,
    "^": lambda a, b: a ^ b,
    "logical_and": pnp.logical_and,
    "logical_or": pnp.logical_or,
    "logical_xor": pnp.logical_xor,
}


@pytest.mark.parametrize("name", list(LOGICAL))
def test_logical_binary_matches_numpy(tpus, name):
    fn = LOGICAL[name]
    rng = np.random.default_rng(11)
    dtypes = [np.bool_] if name in "&|^" else DTYPES
    for da, db in itertools.product(dtypes, dtypes):
        sa, sb = random_shapes(rng, 2)
        a = stacked(rng, sa, da, small=True)
        b = stacked(rng, sb, db, small=True)
        assert_matches(run(tpus, fn, a, b), expected(fn, a, b))
        c = random_values(rng, sb, db, small=True)
        want = np.stack([np.asarray(fn(a[i], c)) for i in range(NUM_DEVICES)])
        assert_matches(run(tpus, lambda x: fn(x, c), a), want)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_logical_not(tpus, dtype):
    rng = np.random.default_rng(3)
    for _ in range(3):
        (s,) = random_shapes(rng, 1)
        a = stacked(rng, s, dtype, small=True)
        assert_matches(run(tpus, pnp.logical_not, a), expected(np.logical_not, a))
        if np.dtype(dtype) == np.bool_:
            assert_matches(run(tpus, lambda x: ~x, a), expected(lambda x: ~x, a))


# --- unary ops --------------------------------------------------------------------

UNARY = {
    "exp": pnp.exp,
    "log": pnp.log,
    "tanh": pnp.tanh,
    "sqrt": pnp.sqrt,
    "rsqrt": pnp.rsqrt,
    "sin": pnp.sin,
    "cos": pnp.cos,
    "abs": pnp.abs,
    "abs()": abs,
    "neg": lambda x: -x,
}


@pytest.mark.parametrize("name", list(UNARY))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_unary_matches_numpy(tpus, name, dtype):
    fn = UNARY[name]
    dtype = np.dtype(dtype)
    if name == "neg" and dtype == np.bool_:
        # numpy rejects it too (a TypeError); the error names the way out.
        with pytest.raises(TypeError, match="negative of a bool is not supported.*use logical_not"):
            run(tpus, fn, stacked(np.random.default_rng(5), (3,), np.bool_))
        return
    rng = np.random.default_rng(5)
    positive = name in ("log", "sqrt", "rsqrt")
    for _ in range(4):
        (s,) = random_shapes(rng, 1)
        a = stacked(rng, s, dtype, positive=positive, small=(name == "exp"))
        if dtype == np.bool_ and name not in ("abs", "abs()"):
            # numpy computes bool in float16; we compute it in float32.
            with np.errstate(all="ignore"):
                want = expected(fn, a.astype(np.float32))
        else:
            with np.errstate(all="ignore"):
                want = expected(fn, a)
        assert_matches(run(tpus, fn, a), want)


# --- where and astype -----------------------------------------------------------


@pytest.mark.parametrize("dx, dy", list(itertools.product(DTYPES, DTYPES)))
def test_where_matches_numpy(tpus, dx, dy):
    rng = np.random.default_rng(13)
    for _ in range(3):
        sc, sx, sy = random_shapes(rng, 3)
        c = stacked(rng, sc, np.bool_)
        x = stacked(rng, sx, dx)
        y = stacked(rng, sy, dy)
        assert_matches(run(tpus, pnp.where, c, x, y), expected(np.where, c, x, y))
        # Against constants: a per-shard condition, a constant branch (an
        # array: numpy scalars are weakly typed, test_scalar_type_rule.py).
        k = np.asarray(random_values(rng, sy, dy))
        want = np.stack([np.where(c[i], x[i], k) for i in range(NUM_DEVICES)])
        assert_matches(run(tpus, lambda cc, xx: pnp.where(cc, xx, k), c, x), want)


def test_where_with_scalars_and_comparison(tpus):
    x = np.array([[-1.0, 2.0, 0.5], [3.0, -4.0, 0.0]], np.float32)
    got = run(tpus, lambda v: pnp.where(v > 0, pnp.sqrt(v), 0.0), x)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, np.where(x > 0, np.sqrt(np.abs(x)), 0.0).astype(np.float32))
    c = np.array([[True, False], [False, True]])
    got = run(tpus, lambda cc: pnp.where(cc, 1.0, 0.0), c)
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, np.where(c, 1.0, 0.0))


@pytest.mark.parametrize("src, dst", list(itertools.product(DTYPES, DTYPES)))
def test_astype_matches_numpy(tpus, src, dst):
    rng = np.random.default_rng(17)
    (s,) = random_shapes(rng, 1)
    a = stacked(rng, s, src)
    assert_matches(run(tpus, lambda x: x.astype(dst), a), a.astype(dst))


def test_int_and_bool_inputs_and_outputs(tpus):
    i = np.array([[1, 2], [3, 4]], np.int32)
    b = np.array([[True, False], [True, True]])
    out = pw.pmap(lambda x, p: (x * 2, ~p, pw.psum(x, "i")), devices=tpus, axis_name="i")(i, b)
    np.testing.assert_array_equal(np.asarray(out[0]), i * 2)
    assert np.asarray(out[0]).dtype == np.int32
    np.testing.assert_array_equal(np.asarray(out[1]), ~b)
    assert np.asarray(out[1]).dtype == np.bool_
    np.testing.assert_array_equal(np.asarray(out[2]), np.stack([i.sum(0)] * 2))
    count = pw.pmap(lambda p: pw.psum(p, "i"), devices=tpus, axis_name="i")(b)
    assert np.asarray(count).dtype == np.int32
    np.testing.assert_array_equal(np.asarray(count), np.stack([b.sum(0)] * 2))
    buf = pw.device_put(b, tpus)
    assert buf.dtype == np.bool_
    np.testing.assert_array_equal(np.asarray(pw.pmap(lambda p: p ^ True, devices=tpus)(buf)), ~b)
    ibuf = pw.device_put(i, tpus)
    assert ibuf.dtype == np.int32
    np.testing.assert_array_equal(np.asarray(ibuf), i)


def test_numpy_module_outside_trace_calls_numpy():
    x = np.array([0.25, 4.0])
    np.testing.assert_array_equal(pnp.sqrt(x), np.sqrt(x))
    np.testing.assert_array_equal(pnp.rsqrt(x), 1 / np.sqrt(x))
    np.testing.assert_array_equal(pnp.where(x > 1, x, 0.0), np.where(x > 1, x, 0.0))
    assert pw.numpy is pnp
    assert pnp.int32 is np.int32 and pnp.bool_ is np.bool_


def test_bool_of_comparison_still_raises(tpus):
    def f(x):
        if x > 0:
            return x
        return -x

    with pytest.raises(pw.TracerError, match=re.escape("bool() of a traced value (pred[]")):
        run(tpus, f, np.array([1.0, -1.0]))
