"""Generated conformance cases over the op table, in the manner of JAX's own
tests (`lax_numpy_test`, `lax_autodiff_test`): a grid of shapes, a grid of
dtypes, edge values (nan, +-inf, -0.0, tiny and large numbers, empty arrays),
every axis with and without keepdims, broadcasting pairs, and gradients
against central finite differences.

Every family of the op table has a grid here: elementwise, reductions, shape ops,
matmul, nn, sorts and running reductions, collectives, gathers and scatters,
and gradients. The reference is numpy, with the project's documented dtype rules where they
differ from numpy's (int32 and uint32 are the integer types: numpy's int8 and
int64 results are int32 here, as JAX's without x64; float16 is float32). Where numpy raises for a case
(`np.negative` of bool, `np.max` of an empty axis), pathways must raise the
same exception type. Every case runs in a `pw.jit` compiled function.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import pathways as pw
import pathways.nn as pnn
import pathways.numpy as pnp

DTYPES = [np.float32, np.float64, np.int32, np.uint32, np.bool_]
FLOATS = [np.float32, np.float64]
SHAPES = [(), (0,), (3,), (2, 3), (1, 4, 1), (2, 0, 3)]
BROADCAST_PAIRS = [
    ((), ()), ((3,), ()), ((), (2, 3)), ((2, 3), (2, 3)), ((2, 1), (1, 3)),
    ((4, 1, 3), (2, 1)), ((0, 3), (1, 3)), ((2, 0), (2, 1)),
]
FLOAT_EDGES = [np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-30, -1e-30, 1.5, -2.5, 700.0, -700.0, 3e3]
INT_EDGES = [0, 1, -1, 7, -13, 2**20, -(2**20)]
UINT_EDGES = [0, 1, 7, 13, 2**20, 2**31 + 5, 2**32 - 1]


def _values(rng: np.random.Generator, shape: tuple, dtype, edges: bool = True) -> np.ndarray:
    """Random values of `shape`, with the dtype's edge values mixed in."""
    dtype = np.dtype(dtype)
    size = int(np.prod(shape))
    if dtype == np.bool_:
        flat = rng.random(size) < 0.5
    elif dtype.kind in "iu":
        pool = (INT_EDGES if dtype.kind == "i" else UINT_EDGES) if edges else list(range(0, 10))
        if dtype.kind == "i" and not edges:
            pool = list(range(-9, 10))
        flat = rng.choice(np.array(pool, dtype=np.int64), size).astype(dtype)
    else:
        flat = rng.normal(scale=3.0, size=size)
        if edges and size:
            pick = rng.random(size) < 0.5
            flat[pick] = rng.choice(np.array(FLOAT_EDGES), int(pick.sum()))
        flat = flat.astype(dtype)
    return flat.reshape(shape)


def _our_dtype(dtype: np.dtype) -> np.dtype:
    """numpy's result dtype as pathways' rules have it."""
    dtype = np.dtype(dtype)
    if dtype in (np.uint32, np.uint64):  # a sum of uint32 is uint32, as JAX's
        return np.dtype(np.uint32)
    if dtype.kind in "iu":
        return np.dtype(np.int32)
    if dtype == np.float16:
        return np.dtype(np.float32)
    return dtype


def _computed_as(x: np.ndarray, result: np.dtype) -> np.ndarray:
    """The input numpy should compute from to get pathways' result dtype:
    bool operands of float16 or int8 results are computed as float32 / int32."""
    if x.dtype == np.bool_ and result in (np.float16, np.int8):
        return x.astype(np.float32 if result == np.float16 else np.int32)
    return x


def _reference(fn, *xs):
    """numpy's result as pathways should give it, or the exception type numpy raises."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # mean of an empty slice ...
        try:
            want = np.asarray(fn(*xs))
        except TypeError:  # numpy's UFuncTypeError too
            return TypeError
        except OverflowError:  # a Python int out of an unsigned dtype's range
            return OverflowError
        except ValueError:
            return ValueError
        if want.dtype in (np.float16, np.int8):
            want = np.asarray(fn(*[_computed_as(x, want.dtype) for x in xs]))
    return want.astype(_our_dtype(want.dtype))


def _tolerance(dtype: np.dtype, loose: bool = False) -> float:
    if dtype == np.float32:
        return 3e-5 if loose else 2e-6
    if dtype == np.float64:
        return 1e-12 if loose else 1e-14
    return 0.0


def _check(ours, want, loose: bool = False, where: str = "") -> None:
    got = np.asarray(ours)
    assert got.dtype == want.dtype, (where, got.dtype, want.dtype)
    assert got.shape == want.shape, (where, got.shape, want.shape)
    if want.dtype.kind == "f":
        tol = _tolerance(want.dtype, loose)
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol, equal_nan=True, err_msg=where)
        # -0.0 and 0.0 compare equal; their signs must agree where numpy's is exact.
        zeros = (want == 0) & np.isfinite(got)
        if not loose:
            assert np.array_equal(np.signbit(got[zeros]), np.signbit(want[zeros])), where
    else:
        np.testing.assert_array_equal(got, want, err_msg=where)


def _run_case(ours_fn, numpy_fn, xs, loose=False, where=""):
    want = _reference(numpy_fn, *xs)
    if isinstance(want, type):
        with pytest.raises(want):
            np.asarray(pw.jit(ours_fn)(*xs))
        return
    _check(pw.jit(ours_fn)(*xs), want, loose, where)


# --- unary elementwise ---------------------------------------------------------

UNARY = {
    "negative": (pnp.negative, np.negative, False),
    "abs": (pnp.abs, np.abs, False),
    "exp": (pnp.exp, np.exp, True),
    "log": (pnp.log, np.log, True),
    "tanh": (pnp.tanh, np.tanh, True),
    "sqrt": (pnp.sqrt, np.sqrt, True),
    "sin": (pnp.sin, np.sin, True),
    "cos": (pnp.cos, np.cos, True),
    "square": (pnp.square, np.square, False),
    "sign": (pnp.sign, np.sign, False),
    "logical_not": (pnp.logical_not, np.logical_not, False),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("name", list(UNARY))
def test_unary(name, dtype):
    ours, ref, loose = UNARY[name]
    rng = np.random.default_rng(abs(hash((name, np.dtype(dtype).name))) % 2**32)
    for shape in SHAPES:
        x = _values(rng, shape, dtype)
        if name in ("sin", "cos") and np.dtype(dtype).kind == "f":
            x = np.where(np.abs(x) > 1e3, np.float32(2.0), x).astype(dtype)  # large-argument reduction
        _run_case(ours, ref, [x], loose, f"{name}{shape}")


# --- binary elementwise, with broadcasting -----------------------------------------

BINARY_NAMES = [
    "add", "subtract", "multiply", "divide", "power", "maximum", "minimum",
    "equal", "not_equal", "less", "less_equal", "greater", "greater_equal",
]
BINARY = {name: (getattr(pnp, name), getattr(np, name)) for name in BINARY_NAMES}


@pytest.mark.parametrize("dy", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("dx", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("name", list(BINARY))
def test_binary(name, dx, dy):
    ours, ref = BINARY[name]
    rng = np.random.default_rng(abs(hash((name, np.dtype(dx).name, np.dtype(dy).name))) % 2**32)
    for sx, sy in BROADCAST_PAIRS:
        x = _values(rng, sx, dx, edges=name != "power")
        y = _values(rng, sy, dy, edges=name != "power")
        if name == "power":
            # numpy refuses negative integer powers of integers, and int32 overflows.
            if np.dtype(dy).kind == "i":
                y = np.abs(y) % 4
            if np.dtype(dx).kind == "i":
                x = np.clip(x, -9, 9)
            if np.dtype(dy).kind == "f":
                y = np.round(y).astype(dy)  # real powers of negatives are nan in both
        if {np.dtype(dx), np.dtype(dy)} == {np.dtype(np.int32), np.dtype(np.uint32)} and (
            name not in ("equal", "not_equal", "less", "less_equal", "greater", "greater_equal")
        ):
            # int32 with uint32 computes in int32 (README: JAX's lattice, no int64), where
            # numpy computes in int64: they agree below 2^31. Comparisons are exact throughout.
            x, y = (v % 2**31 if v.dtype == np.uint32 else v for v in (x, y))
        # pow of floats loses a few ulps more than the arithmetic.
        _run_case(ours, ref, [x, y], name in ("power", "divide"), f"{name}{sx}{sy}")


@pytest.mark.parametrize("name", ["logical_and", "logical_or", "logical_xor"])
def test_logical(name):
    rng = np.random.default_rng(7)
    for sx, sy in BROADCAST_PAIRS:
        x, y = _values(rng, sx, np.bool_), _values(rng, sy, np.bool_)
        _run_case(getattr(pnp, name), getattr(np, name), [x, y], where=f"{name}{sx}{sy}")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_where_and_clip(dtype):
    rng = np.random.default_rng(3)
    for (sc, sx), sy in zip(BROADCAST_PAIRS, [(), (3,), (2, 1), (1,), (1, 1), (2, 1), (3,), ()]):
        c = _values(rng, sc, np.bool_)
        x, y = _values(rng, sx, dtype), _values(rng, sy, dtype)
        _run_case(pnp.where, np.where, [c, x, y], where=f"where{sc}{sx}{sy}")
    if dtype != np.bool_:
        for shape in SHAPES:
            x = _values(rng, shape, dtype)
            lo = 1 if dtype == np.uint32 else -2  # -2 is out of uint32's range (OverflowError)
            _run_case(lambda v: pnp.clip(v, lo, 5), lambda v: np.clip(v, lo, 5), [x],
                      where=f"clip{shape}")


# --- reductions: every axis, negative axes, tuples, keepdims, empty axes ------------------


def _axes(ndim: int) -> list:
    out = [None] + list(range(ndim)) + [-a for a in range(1, ndim + 1)]
    if ndim >= 2:
        out += [(0, ndim - 1), tuple(range(ndim))]
    return out


REDUCTIONS = {
    name: (getattr(pnp, name), getattr(np, name))
    for name in ["sum", "mean", "max", "min", "var", "std", "argmax"]
}


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("name", list(REDUCTIONS))
def test_reductions(name, dtype):
    ours, ref = REDUCTIONS[name]
    rng = np.random.default_rng(abs(hash((name, np.dtype(dtype).name))) % 2**32)
    for shape in [(), (5,), (2, 3), (2, 3, 4), (0, 3), (3, 0)]:
        # Random values only: sums of edge values are nan/inf either way, and the
        # order of float additions differs (pairwise in numpy).
        x = _values(rng, shape, dtype, edges=False)
        for axis in _axes(len(shape)):
            if name == "argmax" and isinstance(axis, tuple):
                continue
            keepdims_options = [False] if name == "argmax" else [False, True]
            for keepdims in keepdims_options:
                kw = {"axis": axis} if name == "argmax" else {"axis": axis, "keepdims": keepdims}
                _run_case(lambda v: ours(v, **kw), lambda v: ref(v, **kw), [x],
                          loose=name in ("var", "std", "mean", "sum"),
                          where=f"{name}{shape} {kw}")


def test_reductions_propagate_nan_and_inf():
    x = np.array([[1.0, np.nan, 3.0], [np.inf, -np.inf, 2.0], [-1.0, 0.0, np.inf]], np.float32)
    for name, (ours, ref) in REDUCTIONS.items():
        for axis in (None, 0, 1):
            _run_case(lambda v: ours(v, axis=axis), lambda v: ref(v, axis=axis), [x], loose=True,
                      where=f"{name} axis={axis}")


# --- shape ops ----------------------------------------------------------------------------

SHAPE_CASES = [
    ("reshape", lambda v: pnp.reshape(v, (-1,)), lambda v: np.reshape(v, (-1,))),
    ("reshape2", lambda v: v.reshape(v.shape[::-1]), lambda v: v.reshape(v.shape[::-1])),
    ("transpose", pnp.transpose, np.transpose),
    ("swapaxes", lambda v: pnp.swapaxes(v, 0, -1), lambda v: np.swapaxes(v, 0, -1)),
    ("moveaxis", lambda v: pnp.moveaxis(v, 0, -1), lambda v: np.moveaxis(v, 0, -1)),
    ("expand_dims", lambda v: pnp.expand_dims(v, 1), lambda v: np.expand_dims(v, 1)),
    ("flip", pnp.flip, np.flip),
    ("flip0", lambda v: pnp.flip(v, 0), lambda v: np.flip(v, 0)),
    ("squeeze", pnp.squeeze, np.squeeze),
    ("ravel", pnp.ravel, np.ravel),
    ("broadcast_to", lambda v: pnp.broadcast_to(v, (2,) + v.shape),
     lambda v: np.broadcast_to(v, (2,) + v.shape)),
    ("concatenate", lambda v: pnp.concatenate([v, v], axis=-1),
     lambda v: np.concatenate([v, v], axis=-1)),
    ("stack", lambda v: pnp.stack([v, v], axis=1), lambda v: np.stack([v, v], axis=1)),
    ("cumulative_slice", lambda v: v[::-1, 1:], lambda v: v[::-1, 1:]),
    ("tril", pnp.tril, np.tril),
    ("triu", lambda v: pnp.triu(v, 1), lambda v: np.triu(v, 1)),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", SHAPE_CASES, ids=lambda c: c[0])
def test_shape_ops(case, dtype):
    name, ours, ref = case
    rng = np.random.default_rng(11)
    for shape in [(2, 3), (1, 4, 1), (3, 1, 2, 2), (0, 3), (2, 0)]:
        x = _values(rng, shape, dtype)
        _run_case(ours, ref, [x], where=f"{name}{shape}")


# --- contractions ----------------------------------------------------------------------


@pytest.mark.parametrize("dy", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("dx", DTYPES, ids=lambda d: np.dtype(d).name)
def test_matmul_dtypes_and_shapes(dx, dy):
    rng = np.random.default_rng(5)
    for sx, sy in [((3,), (3,)), ((2, 3), (3,)), ((3,), (3, 4)), ((2, 3), (3, 4)),
                   ((5, 2, 3), (3, 4)), ((1, 2, 3), (5, 3, 4)), ((2, 0), (0, 3)), ((0, 3), (3, 2))]:
        x, y = _values(rng, sx, dx, edges=False), _values(rng, sy, dy, edges=False)
        _run_case(pnp.matmul, np.matmul, [x, y], loose=True, where=f"matmul{sx}{sy}")


# --- nn ----------------------------------------------------------------------------------


def _np_logsumexp(x, axis=None, keepdims=False):
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    out = np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True)) + m
    return out if keepdims else np.squeeze(out, axis=axis)


NN = {
    "relu": (pnn.relu, lambda v: np.maximum(v, 0)),
    "sigmoid": (pnn.sigmoid, lambda v: 1 / (1 + np.exp(-v.astype(np.float64)))),
    "silu": (pnn.silu, lambda v: v / (1 + np.exp(-v.astype(np.float64)))),
    "softmax": (pnn.softmax, lambda v: np.exp(v - _np_logsumexp(v, -1, True))),
    "log_softmax": (pnn.log_softmax, lambda v: v - _np_logsumexp(v, -1, True)),
    "logsumexp0": (lambda v: pnn.logsumexp(v, axis=0), lambda v: _np_logsumexp(v, 0)),
}


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("name", list(NN))
def test_nn(name, dtype):
    ours, ref = NN[name]
    rng = np.random.default_rng(17)
    for shape in [(3,), (2, 5), (4, 1)]:
        x = _values(rng, shape, dtype, edges=False) * 4
        want = np.asarray(ref(x.astype(np.float64)), dtype=np.float64).astype(dtype)
        _check(pw.jit(ours)(x), want, loose=True, where=f"{name}{shape}")


# --- gradients against central finite differences -------------------------------------------

GRAD_CASES = {
    "exp": lambda v: pnp.exp(v),
    "log": lambda v: pnp.log(pnp.abs(v) + 1.0),
    "tanh": pnp.tanh,
    "sqrt": lambda v: pnp.sqrt(v * v + 1.0),
    "sin": pnp.sin,
    "cos": pnp.cos,
    "square": pnp.square,
    "abs": lambda v: pnp.abs(v + 0.5),
    "power": lambda v: pnp.power(pnp.abs(v) + 0.5, 1.7),
    "power_xy": lambda v: pnp.power(pnp.abs(v) + 0.5, v),
    "divide": lambda v: v / (v * v + 1.0),
    "maximum": lambda v: pnp.maximum(v, 0.3),
    "where": lambda v: pnp.where(v > 0.1, v * v, -v),
    "sum_axis": lambda v: v.sum(axis=0),
    "mean_axis": lambda v: v.mean(axis=-1, keepdims=True),
    "max_axis": lambda v: v.max(axis=1),
    "var": lambda v: v.var(axis=0),
    "std": lambda v: pnp.std(v + pnp.arange(v.shape[-1]) * 2.0),
    "transpose": lambda v: pnp.transpose(v) * pnp.arange(v.size).reshape(v.shape[::-1]),
    "reshape_flip": lambda v: pnp.flip(v.reshape(-1), 0) * pnp.arange(v.size),
    "slice": lambda v: v[1:, ::-1] * 3.0,
    "matmul": lambda v: v @ v.T,
    "einsum": lambda v: pnp.einsum("ij,kj->ik", v, v * v),
    "softmax": lambda v: pnn.softmax(v) * pnp.arange(v.shape[-1]),
    "logsumexp": lambda v: pnn.logsumexp(v, axis=0),
    "sigmoid": pnn.sigmoid,
    "gelu": pnn.gelu,
    "layer_norm": lambda v: pnn.layer_norm(v, pnp.ones(v.shape[-1]), pnp.zeros(v.shape[-1]))
    * pnp.arange(v.shape[-1]),
}


@pytest.mark.parametrize("name", list(GRAD_CASES))
def test_gradients_match_finite_differences(name):
    f = GRAD_CASES[name]
    rng = np.random.default_rng(abs(hash(name)) % 2**32)
    x = rng.normal(size=(3, 4))
    # Keep away from kinks (abs, maximum, where) where finite differences are wrong.
    x = np.where(np.abs(x - 0.3) < 0.05, x + 0.2, x)
    x = np.where(np.abs(x - 0.1) < 0.05, x + 0.2, x)
    x = np.where(np.abs(x + 0.5) < 0.05, x + 0.2, x)
    weights = rng.normal(size=np.asarray(pw.jit(f)(x)).shape)

    def loss(v):
        return (f(v) * weights).sum()

    g = np.asarray(pw.jit(pw.grad(loss))(x))
    eps = 1e-6
    fd = np.zeros_like(x)
    loss_jit = pw.jit(loss)
    for idx in np.ndindex(x.shape):
        up, down = x.copy(), x.copy()
        up[idx] += eps
        down[idx] -= eps
        fd[idx] = (float(loss_jit(up)) - float(loss_jit(down))) / (2 * eps)
    np.testing.assert_allclose(g, fd, rtol=1e-5, atol=1e-6, err_msg=name)


# --- weak types: Python and numpy scalars with every dtype -------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("scalar", [2, 2.5, True, np.float64(2.5), np.int64(3), np.float32(0.5)],
                         ids=repr)
def test_scalars_are_weakly_typed(dtype, scalar):
    x = _values(np.random.default_rng(1), (2, 3), dtype, edges=False)
    got = np.asarray(pw.jit(lambda v: v * scalar)(x))
    # As a Python scalar of the same kind (numpy scalars are weak too, README).
    py = scalar.item() if isinstance(scalar, np.generic) else scalar
    kind = np.dtype(dtype).kind
    if isinstance(py, float):
        weak_dtype = dtype if kind == "f" else np.float32
    elif isinstance(py, bool):
        weak_dtype = dtype
    else:
        weak_dtype = dtype if kind != "b" else np.int32
    want_dtype = np.result_type(np.dtype(dtype), np.dtype(weak_dtype))
    if dtype == np.bool_ and isinstance(py, bool):
        want_dtype = np.dtype(np.bool_)
    assert got.dtype == _our_dtype(want_dtype), (got.dtype, want_dtype)
    with np.errstate(all="ignore"):
        np.testing.assert_allclose(got.astype(np.float64),
                                   (x.astype(np.float64) * float(py)).astype(got.dtype)
                                   .astype(np.float64), rtol=1e-6)


# --- sorts and running reductions over every dtype and axis ------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_sorts_and_running_reductions(dtype):
    rng = np.random.default_rng(23)
    for shape in [(5,), (2, 3), (3, 1, 4), (0, 3)]:
        # Integer products wrap in both (numpy's in 64 bits keeps the low 32).
        x = _values(rng, shape, dtype)
        for axis in list(range(-len(shape), len(shape))) + [None]:
            kw = {"axis": axis}
            for ours, ref in [(pnp.sort, np.sort), (pnp.argsort, np.argsort),
                              (pnp.cumsum, np.cumsum), (pnp.cumprod, np.cumprod)]:
                if ref is np.argsort:
                    ref = lambda v, **k: np.argsort(v, kind="stable", **k)  # noqa: E731
                _run_case(lambda v: ours(v, **kw), lambda v: ref(v, **kw), [x], loose=True,
                          where=f"{ours.__name__}{shape} {kw}")


# --- collectives over the pmap axis: every dtype, shapes, 1 to 3 devices --------------------

COLLECTIVES = {
    "psum": (lambda v: pw.psum(v, "i"), lambda xs: np.sum(xs, axis=0)),
    "pmax": (lambda v: pw.pmax(v, "i"), lambda xs: np.max(xs, axis=0)),
    "pmin": (lambda v: pw.pmin(v, "i"), lambda xs: np.min(xs, axis=0)),
    "pmean": (lambda v: pw.pmean(v, "i"), lambda xs: np.mean(xs, axis=0)),
    "all_gather": (lambda v: pw.all_gather(v, "i"), lambda xs: xs),
    "all_gather1": (lambda v: pw.all_gather(v, "i", axis=-1) if v.ndim else pw.all_gather(v, "i"),
                    lambda xs: np.moveaxis(xs, 0, -1)),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("name", list(COLLECTIVES))
def test_collectives(name, dtype):
    ours, ref = COLLECTIVES[name]
    rng = np.random.default_rng(29)
    for n in (1, 2, 3):
        devices = pw.make_virtual_device_set().add_slice(tpu_devices=n).tpus
        for shape in [(), (3,), (2, 2), (0,)]:
            xs = _values(rng, (n,) + shape, dtype, edges=False)
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                try:
                    want = np.asarray(ref(xs))
                except (TypeError, ValueError) as e:
                    want = TypeError if isinstance(e, TypeError) else ValueError
            f = pw.pmap(ours, "i", devices=devices)
            if isinstance(want, type):
                with pytest.raises(want):
                    np.asarray(f(xs))
                continue
            if name == "pmean" and np.dtype(dtype) == np.bool_:
                with pytest.raises(TypeError):  # README: pmean of bool is an error
                    np.asarray(f(xs))
                continue
            got = np.asarray(f(xs))
            # Every device gets the reduction (or the gathered value).
            want = np.broadcast_to(want, (n,) + want.shape)
            _check(got, want.astype(_our_dtype(want.dtype)), loose=True, where=f"{name} n={n}{shape}")


# --- gathers and scatters: every dtype, every axis, negative and repeated indices ------------


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_gathers_and_scatters(dtype):
    rng = np.random.default_rng(31)
    for shape in [(4,), (3, 4), (2, 3, 2)]:
        x = _values(rng, shape, dtype)
        for axis in range(-len(shape), len(shape)):
            size = shape[axis]
            idx = np.array([0, size - 1, -1, -size, 1 % size, 0], np.int32)  # negatives, repeats
            _run_case(lambda v, i: pnp.take(v, i, axis=axis), lambda v, i: np.take(v, i, axis=axis),
                      [x, idx], where=f"take{shape} axis={axis}")
            along = rng.integers(-size, size, size=shape).astype(np.int32)
            _run_case(lambda v, i: pnp.take_along_axis(v, i, axis=axis),
                      lambda v, i: np.take_along_axis(v, np.where(i < 0, i + size, i), axis=axis),
                      [x, along], where=f"take_along_axis{shape} axis={axis}")
        # x.at[i].add / .max on the first axis with repeated and negative indices, as np.add.at.
        idx = np.array([0, -1, 0, 1], np.int32)
        upd = _values(rng, (4,) + shape[1:], dtype, edges=False)
        for method, ufunc in [("add", np.add), ("max", np.maximum), ("min", np.minimum)]:
            if method == "add" and dtype == np.bool_:
                with pytest.raises(TypeError):  # add into bool is refused, as in JAX
                    np.asarray(pw.jit(lambda v, i, u: v.at[i].add(u))(x, idx, upd))
                continue

            def numpy_at(v, i, u, ufunc=ufunc):
                out = v.copy()
                ufunc.at(out, i, u)
                return out

            _run_case(lambda v, i, u, m=method: getattr(v.at[i], m)(u), numpy_at, [x, idx, upd],
                      where=f"at.{method}{shape}")
