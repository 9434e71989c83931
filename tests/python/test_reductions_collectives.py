"""Reductions (sum/mean/max/min/argmax) and collectives (pmean, pmax, pmin,
axis_index, all_gather, ppermute) inside pw.pmap, checked against numpy."""

import re

import numpy as np
import pytest

import pathways as pw
import pathways.numpy as pnp
from pathways import _core

from conftest import get_devices, random_axes




def devices(n):
    """A fresh slice of n TPUs (released when the test drops it)."""
    return get_devices(n)


def random_input(rng, n, shape, dtype):
    shape = (n,) + tuple(shape)
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if dtype == np.int32:
        return rng.integers(-50, 50, size=shape).astype(np.int32)
    return rng.standard_normal(shape).astype(dtype)




def per_device(fn, x):
    """numpy `fn` applied to every device's slice, stacked."""
    return np.stack([np.asarray(fn(x[i])) for i in range(x.shape[0])])


def check(got, want, dtype):
    got = np.asarray(got)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    if np.issubdtype(want.dtype, np.floating):
        rtol = 1e-5 if dtype == np.float32 else 1e-12
        np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol)
    else:
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.bool_])
@pytest.mark.parametrize("seed", range(6))
def test_reductions_match_numpy(n, dtype, seed):
    rng = np.random.default_rng(seed * 100 + n)
    ndim = int(rng.integers(0, 4))
    shape = tuple(int(d) for d in rng.integers(1, 5, size=ndim))
    x = random_input(rng, n, shape, dtype)
    axis = random_axes(rng, ndim)
    keepdims = bool(rng.random() < 0.5)
    arg_axis = None if ndim == 0 or rng.random() < 0.3 else int(rng.integers(-ndim, ndim))

    def f(a):
        return (
            a.sum(axis=axis, keepdims=keepdims),
            pnp.mean(a, axis=axis, keepdims=keepdims),
            a.max(axis=axis, keepdims=keepdims),
            pnp.min(a, axis, keepdims=keepdims),
            a.argmax(axis=arg_axis, keepdims=keepdims),
            pnp.sum(a),
        )

    got = pw.pmap(f, devices=devices(n))(x)
    wants = [
        per_device(lambda v: np.sum(v, axis=axis, keepdims=keepdims), x),
        per_device(lambda v: np.mean(v, axis=axis, keepdims=keepdims), x),
        per_device(lambda v: np.max(v, axis=axis, keepdims=keepdims), x),
        per_device(lambda v: np.min(v, axis=axis, keepdims=keepdims), x),
        per_device(lambda v: np.argmax(v, axis=arg_axis, keepdims=keepdims), x).astype(np.int32),
        per_device(np.sum, x),
    ]
    if dtype == np.bool_:
        wants[0] = wants[0].astype(np.int32)
        wants[5] = wants[5].astype(np.int32)
    elif dtype == np.int32:
        wants[0] = wants[0].astype(np.int32)
        wants[5] = wants[5].astype(np.int32)
    for g, w in zip(got, wants):
        check(g, w, dtype)


def test_result_dtypes():
    def f(a, b, c):
        return a.sum(), a.mean(), b.sum(), b.mean(), c.argmax(), c.mean(axis=0)

    ints = np.arange(6, dtype=np.int32).reshape(2, 3)
    bools = ints % 2 == 0
    floats = np.ones((2, 3), np.float32)
    out = pw.pmap(f, devices=devices(2))(ints, bools, floats)
    assert [np.asarray(o).dtype for o in out] == [
        np.int32, np.float64, np.int32, np.float64, np.int32, np.float32
    ]
    np.testing.assert_array_equal(np.asarray(out[2]), [2, 1])


def test_reductions_outside_trace_call_numpy():
    x = np.arange(12.0).reshape(3, 4)
    np.testing.assert_array_equal(pnp.sum(x, axis=1), x.sum(axis=1))
    np.testing.assert_array_equal(pnp.mean(x, axis=(0, 1), keepdims=True), x.mean((0, 1), keepdims=True))
    assert pnp.max(x) == 11.0 and pnp.min(x) == 0.0 and pnp.argmax(x) == 11


def test_nan_propagates_and_argmax_picks_first_nan():
    x = np.array([[1.0, np.nan, 3.0], [5.0, 2.0, 5.0]], np.float32)
    mx, am, mn = pw.pmap(lambda a: (a.max(), a.argmax(), pnp.min(a)), devices=devices(2))(x)
    mx, am, mn = np.asarray(mx), np.asarray(am), np.asarray(mn)
    assert np.isnan(mx[0]) and mx[1] == 5.0
    assert np.isnan(mn[0]) and mn[1] == 2.0
    np.testing.assert_array_equal(am, [1, 0])


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
@pytest.mark.parametrize("seed", range(3))
def test_collectives_match_numpy(n, dtype, seed):
    rng = np.random.default_rng(seed + 7 * n)
    ndim = int(rng.integers(0, 3))
    shape = tuple(int(d) for d in rng.integers(1, 4, size=ndim))
    x = random_input(rng, n, shape, dtype)
    gather_axis = int(rng.integers(-ndim - 1, ndim + 1))
    perm = [(i, (i + 1) % n) for i in range(n - 1)]  # device n-1 sends nothing; 0 receives zeros

    def f(a):
        return (
            pw.pmean(a, "i"),
            pw.pmax(a, "i"),
            pw.pmin(a, "i"),
            pw.axis_index("i"),
            pw.all_gather(a, "i"),
            pw.all_gather(a, "i", axis=gather_axis),
            pw.ppermute(a, "i", perm),
            pw.psum(a, "i"),
        )

    got = pw.pmap(f, devices=devices(n), axis_name="i")(x)
    stacked = np.broadcast_to
    if dtype == np.int32:
        mean = x.astype(np.float64).mean(axis=0)  # as JAX's psum(x) / n: not truncated
    else:
        mean = x.mean(axis=0, dtype=np.float64).astype(dtype)
    permuted = np.zeros_like(x)
    for src, dst in perm:
        permuted[dst] = x[src]
    wants = [
        stacked(mean, x.shape),
        stacked(x.max(axis=0), x.shape),
        stacked(x.min(axis=0), x.shape),
        np.arange(n, dtype=np.int32),
        stacked(x, (n,) + x.shape),
        stacked(np.moveaxis(x, 0, gather_axis), (n,) + np.moveaxis(x, 0, gather_axis).shape),
        permuted,
        stacked(x.sum(axis=0, dtype=dtype), x.shape),
    ]
    for g, w in zip(got, wants):
        check(g, np.ascontiguousarray(w), dtype)


def test_ppermute_cycle_and_pytree():
    n = 4
    x = np.arange(8.0).reshape(4, 2)
    perm = [(i, (i + 1) % n) for i in range(n)]
    out = pw.pmap(lambda t: pw.ppermute(t, "i", perm), devices=devices(n), axis_name="i")(
        {"a": x, "b": x * 2}
    )
    np.testing.assert_array_equal(np.asarray(out["a"]), np.roll(x, 1, axis=0))
    np.testing.assert_array_equal(np.asarray(out["b"]), np.roll(x * 2, 1, axis=0))


def test_collective_of_reduction():
    x = np.arange(24.0).reshape(4, 2, 3)
    f = pw.pmap(lambda a: pw.pmax(a.sum(axis=-1), "i") - a.mean(), devices=devices(4), axis_name="i")
    want = x.sum(axis=-1).max(axis=0) - x.mean(axis=(1, 2))[:, None]
    np.testing.assert_allclose(np.asarray(f(x)), want)


# --- Errors ------------------------------------------------------------------


@pytest.mark.parametrize(
    "fn, message",
    [
        (lambda a: a.sum(axis=2), "sum: axis 2 is out of range for f32[3,4]"),
        (lambda a: pnp.mean(a, axis=-3), "mean: axis -3 is out of range for f32[3,4]"),
        (lambda a: a.max(axis=(1, -1)), "max: axis -1 is repeated for f32[3,4]"),
        (lambda a: a.min(axis=(0, 5)), "min: axis 5 is out of range for f32[3,4]"),
        (lambda a: a.argmax(axis=3), "argmax: axis 3 is out of range for f32[3,4]"),
        (lambda a: pw.all_gather(a, "i", axis=3), "all_gather: axis 3 is out of range for f32[3,4]"),
        (lambda a: pw.ppermute(a, "i", [(0, 2)]), "ppermute: perm pair (0, 2) is out of range for 2 shards"),
        (
            lambda a: pw.ppermute(a, "i", [(0, 1), (1, 1)]),
            "ppermute: perm pair (1, 1) repeats a source or destination",
        ),
        # pmean of bool, a wrong operand dtype, is a TypeError (test_clear_errors.py).
    ],
)
def test_trace_time_errors(fn, message):
    x = np.zeros((2, 3, 4), np.float32)
    with pytest.raises(ValueError, match=re.escape(message)):
        pw.pmap(fn, devices=devices(2), axis_name="i")(x)


def test_argmax_rejects_tuple_axis():
    x = np.zeros((2, 3, 4), np.float32)
    with pytest.raises(TypeError, match=re.escape("argmax: axis must be None or an int")):
        pw.pmap(lambda a: a.argmax(axis=(0, 1)), devices=devices(2))(x)


def test_empty_max_is_an_error():
    x = np.zeros((2, 0, 3), np.float32)
    with pytest.raises(ValueError, match=re.escape("max: zero-size reduction of f32[0,3] has no identity")):
        pw.pmap(lambda a: a.max(axis=0), devices=devices(2))(x)
    got = pw.pmap(lambda a: a.sum(axis=0), devices=devices(2))(x)
    np.testing.assert_array_equal(np.asarray(got), np.zeros((2, 3), np.float32))


@pytest.mark.parametrize(
    "collective",
    [
        lambda a: pw.pmean(a, "j"),
        lambda a: pw.pmax(a, "j"),
        lambda a: pw.pmin(a, "j"),
        lambda a: pw.axis_index("j"),
        lambda a: pw.all_gather(a, "j"),
        lambda a: pw.ppermute(a, "j", [(0, 1)]),
    ],
)
def test_unbound_axis_names(collective):
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(NameError, match=re.escape("unbound axis name: 'j' (pmap of '<lambda>' binds 'i')")):
        pw.pmap(collective, devices=devices(2), axis_name="i")(x)
    with pytest.raises(NameError, match=re.escape("unbound axis name: 'j' (pmap of '<lambda>' binds no axis name)")):
        pw.pmap(collective, devices=devices(2))(x)
    with pytest.raises(NameError, match=re.escape("unbound axis name: 'j'")):
        collective(x)


def test_axis_size_must_match_devices():
    b = _core.FunctionBuilder("g", "i")
    b.set_axis_size(3)
    x = b.parameter("float32", [2])
    fn = b.build([b.all_gather(x, "i", 0)])
    assert "axis_size=3" in fn.as_text()
    with pytest.raises(ValueError, match=re.escape("was traced for 3 shards but is placed on 2 devices")):
        _core.compile(fn, devices(2))
    with pytest.raises(ValueError, match=re.escape("set_axis_size: needs 1 <= n <= 65536 (the most devices a gang has), got 0")):
        _core.FunctionBuilder("h", "i").set_axis_size(0)
    with pytest.raises(ValueError, match=re.escape("got 1073741824")):
        _core.FunctionBuilder("h", "i").set_axis_size(1 << 30)
