"""The numpy and JAX names added for issue 12: erf/erfc (and gelu's exact form), cumsum,
cumprod and lax's cummax/cummin, sort/argsort, take_along_axis, and `x.at[index]`.

Each runs inside `pw.pmap` over 2 devices (each device its own data) and is checked
against numpy, or hand-worked references where numpy has no counterpart (erf: math.erf
per element; descending argsort: a stable sort by the negated key, JAX's semantics;
`.at`: numpy's `ufunc.at` and assignment at the same index), over dtype grids, shapes
with empty and zero-dimensional ones, every axis, and nan/inf/-0.0; gradients against
central finite differences (test_grad's helpers), with zeros and repeated indices where
they matter.
"""

import math
import zlib

import numpy as np
import pytest

import pathways as pw
import pathways.numpy as pnp

from test_grad import check_grads, pmap_grads

DTYPES = [np.float32, np.float64, np.int32, np.bool_]
FLOATS = [np.float32, np.float64]


def dtype_id(d):
    return np.dtype(d).name


def rng_for(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def values(rng, dtype, shape, specials=True):
    """Per-device data of `dtype` from a small set (ties), with nan/inf/-0.0 in floats."""
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    v = rng.integers(-4, 5, size=shape)
    if np.dtype(dtype).kind != "f":
        return v.astype(dtype)
    v = v + rng.choice([0.0, 0.25, 0.5], size=shape)
    v = v.astype(dtype)
    if specials and v.size:
        mask = rng.random(shape) < 0.15
        v[mask] = rng.choice(np.array([np.nan, np.inf, -np.inf, 0.0, -0.0], dtype),
                             size=int(mask.sum()))
    return v


def pmapped(tpus, fn, *args):
    """`fn` pmap'd over the leading axis of `args`; numpy outputs (a tuple for several)."""
    out = pw.pmap(fn, devices=tpus)(*args)
    if isinstance(out, tuple):
        return tuple(np.asarray(o) for o in out)
    return np.asarray(out)


def per_device(fn, *args):
    """numpy reference: `fn` on each device's data, stacked (numpy's NaN warnings off)."""
    with np.errstate(all="ignore"):
        return np.stack([np.asarray(fn(*[a[d] for a in args])) for d in range(args[0].shape[0])])


def assert_same(got, want):
    """Equal values and dtype, NaN equal to NaN (of any sign), and the sign of every zero."""
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    np.testing.assert_array_equal(got, want)
    if got.dtype.kind == "f":
        numbers = ~np.isnan(want)
        np.testing.assert_array_equal(np.signbit(got[numbers]), np.signbit(want[numbers]))


# --- erf, erfc --------------------------------------------------------------------------

_erf64 = np.vectorize(math.erf, otypes=[np.float64])
_erfc64 = np.vectorize(math.erfc, otypes=[np.float64])

ERF_POINTS = np.array([0.0, -0.0, 1e-300, -1e-30, 1e-8, 0.1, -0.46, 0.47, 0.5, 0.84, 0.85, -0.9,
                       1.0, -1.5, 2.0, 3.9, -5.9, 6.0, 9.0, 10.05, 26.0, -27.0, 28.0, 1e300,
                       np.inf, -np.inf, np.nan])


@pytest.mark.parametrize("name", ["erf", "erfc"])
@pytest.mark.parametrize("dtype", FLOATS, ids=dtype_id)
def test_erf_matches_math_to_the_ulp(tpus2, name, dtype):
    rng = rng_for("erf", name, dtype_id(dtype))
    with np.errstate(over="ignore"):  # 1e300 is inf in float32
        x = np.concatenate([ERF_POINTS, rng.standard_normal(300) * 3,
                            rng.uniform(-30, 30, 300)]).astype(dtype)
    x = np.stack([x, -x])
    got = pmapped(tpus2, getattr(pnp, name), x)
    want = (_erf64 if name == "erf" else _erfc64)(x.astype(np.float64)).astype(dtype)
    assert got.dtype == dtype
    # float32 is rounded once from double (math's is within 1 ulp of double); the
    # float64 kernels are within 1 (erf) and 2.5 (erfc) ulp, math's within 1.
    np.testing.assert_array_max_ulp(got, want, maxulp=1 if dtype == np.float32 else
                                    (2 if name == "erf" else 4))
    np.testing.assert_array_equal(np.signbit(got[np.isfinite(x) & (x == 0)]),
                                  np.signbit(want[np.isfinite(x) & (x == 0)]))
    assert np.isnan(got[np.isnan(x)]).all()
    # And on numpy arrays (math per element).
    np.testing.assert_array_equal(getattr(pnp, name)(x), want)


def test_erf_saturates_and_erfc_keeps_tiny_values(tpus2):
    x = np.array([[6.0, -7.0, np.inf, -np.inf, 26.8, 27.5], [-6.0, 7.0, 10.1, 9.5, -30.0, 0.0]])
    erf, erfc = pmapped(tpus2, lambda v: (pnp.erf(v), pnp.erfc(v)), x)
    np.testing.assert_array_equal(erf[0, :4], [1.0, -1.0, 1.0, -1.0])
    np.testing.assert_array_equal(erfc[0, 2:4], [0.0, 2.0])
    assert 0 < erfc[0, 4] < np.finfo(np.float64).tiny  # a denormal, not 0
    assert erfc[0, 5] == 0.0 and erfc[1, 4] == 2.0
    np.testing.assert_allclose(erfc[1, 2:4], _erfc64(x[1, 2:4]), rtol=1e-15)
    erfc32 = pmapped(tpus2, pnp.erfc, x.astype(np.float32))
    assert 0 < erfc32[1, 3] < np.finfo(np.float32).tiny and erfc32[1, 2] == 0.0


@pytest.mark.parametrize("dtype, result", [(np.int32, np.float64), (np.bool_, np.float32)],
                         ids=["int32", "bool"])
def test_erf_of_integers_and_bools_is_float(tpus2, dtype, result):
    x = np.array([[0, 1, 3], [1, 0, -2]]).astype(dtype)
    for name, ref in (("erf", _erf64), ("erfc", _erfc64)):
        got = pmapped(tpus2, getattr(pnp, name), x)
        assert got.dtype == result
        np.testing.assert_array_max_ulp(got, ref(x.astype(np.float64)).astype(result), maxulp=2)
        assert getattr(pnp, name)(x).dtype == result


@pytest.mark.parametrize("shape", [(), (0,), (3, 0, 2)], ids=str)
def test_erf_of_empty_and_scalar_shapes(tpus2, shape):
    x = np.full((2,) + shape, 0.5)
    for name in ("erf", "erfc"):
        got = pmapped(tpus2, getattr(pnp, name), x)
        assert got.shape == x.shape
        np.testing.assert_array_equal(got, np.full(x.shape, getattr(math, name)(0.5)))


def test_lax_erf_inside_and_outside_a_trace(tpus2):
    x = np.array([[0.3, -2.0], [1.5, np.nan]], np.float32)
    inside = pmapped(tpus2, lambda v: (pw.lax.erf(v), pw.lax.erfc(v)), x)
    outside = pw.lax.erf(x), pw.lax.erfc(x)
    for a, b, ref in zip(inside, outside, (_erf64, _erfc64)):
        assert a.dtype == b.dtype == np.float32
        np.testing.assert_array_equal(a, b)  # the same kernels
        np.testing.assert_array_max_ulp(a, ref(x.astype(np.float64)).astype(np.float32), 1)


def test_erf_gradients(tpus2):
    rng = rng_for("erf grad")
    x = rng.standard_normal((2, 3, 4)) * 2
    w = rng.standard_normal((2, 3, 4))
    for fn in (pnp.erf, pnp.erfc, pw.lax.erf):
        check_grads(tpus2, lambda x, w: (fn(x) * w).sum(), [x, w], argnums=(0,),
                    total=lambda x, w: float(sum(((_erf64(x[d]) if fn is not pnp.erfc else
                                                   _erfc64(x[d])) * w[d]).sum() for d in range(2))))
    # The closed form, and second derivatives: d2 erf = -2x d erf.
    (g,) = pmap_grads(tpus2, lambda x: pnp.erf(x).sum(), [x], (0,))
    np.testing.assert_allclose(g, 2 / math.sqrt(math.pi) * np.exp(-x * x), rtol=1e-14)
    (g2,) = pmap_grads(tpus2, lambda x: pw.grad(lambda y: pnp.erf(y).sum())(x).sum(), [x], (0,))
    np.testing.assert_allclose(g2, -2 * x * 2 / math.sqrt(math.pi) * np.exp(-x * x), rtol=1e-13,
                               atol=1e-300)
    # float32 keeps float32; the gradient of erfc is minus erf's.
    x32 = x.astype(np.float32)
    (g32,) = pmap_grads(tpus2, lambda x: pnp.erfc(x).sum(), [x32], (0,))
    assert g32.dtype == np.float32
    np.testing.assert_allclose(g32, -2 / math.sqrt(math.pi) * np.exp(-x32.astype(np.float64) ** 2),
                               rtol=1e-6, atol=1e-30)


def test_gelu_exact_gradient_and_default(tpus2):
    rng = rng_for("gelu")
    x = rng.standard_normal((2, 5)) * 3
    phi = lambda v: 0.5 * (1 + _erf64(v / math.sqrt(2)))  # noqa: E731
    (g,) = pmap_grads(tpus2, lambda x: pw.nn.gelu(x, approximate=False).sum(), [x], (0,))
    np.testing.assert_allclose(g, phi(x) + x * np.exp(-x * x / 2) / math.sqrt(2 * math.pi),
                               rtol=1e-13)
    # The default stays the tanh approximation (JAX's default too).
    approx = pmapped(tpus2, pw.nn.gelu, x)
    tanh_form = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    np.testing.assert_allclose(approx, tanh_form, rtol=1e-13)
    assert not np.allclose(approx, x * phi(x), rtol=1e-6)


# --- cumsum, cumprod, cummax, cummin --------------------------------------------------

CUM_SHAPES = [(5,), (3, 4), (2, 3, 4), (0,), (3, 0), (2, 1, 3)]


def cum_axes(ndim):
    return [None] + list(range(ndim)) + [-1]


def jax_cum_dtype(x):
    """numpy's result dtype of cumsum/cumprod with int64 as JAX's int32."""
    return np.int32 if x.dtype.kind in "bi" else x.dtype


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("shape", CUM_SHAPES, ids=str)
def test_cumsum_and_cumprod_match_numpy(tpus2, dtype, shape):
    rng = rng_for("cum", dtype_id(dtype), shape)
    x = values(rng, dtype, (2,) + shape)
    for axis in cum_axes(len(shape)):
        for name in ("cumsum", "cumprod"):
            got = pmapped(tpus2, lambda v: getattr(pnp, name)(v, axis=axis), x)
            want = per_device(lambda v: getattr(np, name)(v, axis=axis, dtype=jax_cum_dtype(v)), x)
            assert_same(got, want)
            # The method, and numpy's function on a traced value, are the same op.
            got_method = pmapped(tpus2, lambda v: getattr(v, name)(axis), x)
            got_np = pmapped(tpus2, lambda v: getattr(np, name)(v, axis=axis), x)
            assert_same(got_method, want)
            assert_same(got_np, want)


def test_cumsum_adds_in_order_and_wraps_int32(tpus2):
    # numpy's float32 cumsum adds in order: 1e8 + 1 + 1 stays 1e8.
    x = np.array([[1e8, 1, 1, -1e8], [0.1, 0.2, 0.3, 0.4]], np.float32)
    assert_same(pmapped(tpus2, pnp.cumsum, x), per_device(np.cumsum, x))
    big = np.array([[2**31 - 1, 1, 1], [-(2**31), -1, 5]], np.int32)
    assert_same(pmapped(tpus2, pnp.cumsum, big),
                per_device(lambda v: np.cumsum(v, dtype=np.int32), big))
    assert_same(pmapped(tpus2, pnp.cumprod, np.full((2, 3), 65536, np.int32)),
                np.array([[65536, 0, 0]] * 2, np.int32))


def test_cumsum_dtype_argument_and_scalars(tpus2):
    x = np.array([[1.7, 2.6, -3.5], [0.5, 0.5, 0.5]])
    assert_same(pmapped(tpus2, lambda v: pnp.cumsum(v, dtype=np.int32), x),
                per_device(lambda v: np.cumsum(v.astype(np.int32)).astype(np.int32), x))
    assert_same(pmapped(tpus2, lambda v: pnp.cumprod(v, dtype=np.float32), x),
                per_device(lambda v: np.cumprod(v.astype(np.float32)), x))
    s = np.array([3.0, -2.0])  # a scalar per device: axis None gives shape (1,)
    assert_same(pmapped(tpus2, pnp.cumsum, s), s.reshape(2, 1))


@pytest.mark.parametrize("name, fn", [("cummax", np.maximum), ("cummin", np.minimum)])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("shape", [(6,), (3, 4), (2, 3, 4), (0, 2)], ids=str)
def test_lax_cummax_cummin_match_ufunc_accumulate(tpus2, name, fn, dtype, shape):
    rng = rng_for(name, dtype_id(dtype), shape)
    x = values(rng, dtype, (2,) + shape)
    for axis in range(-len(shape), len(shape)):
        for reverse in (False, True):
            got = pmapped(tpus2, lambda v: getattr(pw.lax, name)(v, axis=axis, reverse=reverse), x)

            def want_fn(v):
                if not reverse:
                    return fn.accumulate(v, axis=axis)
                return np.flip(fn.accumulate(np.flip(v, axis), axis=axis), axis)

            assert_same(got, per_device(want_fn, x))


@pytest.mark.parametrize("name", ["cumsum", "cumprod"])
def test_lax_cumsum_cumprod_reverse_and_outside_a_trace(tpus2, name):
    rng = rng_for("lax", name)
    x = values(rng, np.float64, (2, 3, 4), specials=False)
    ref = getattr(np, name)
    for axis in (0, 1, -1):
        for reverse in (False, True):
            got = pmapped(tpus2, lambda v: getattr(pw.lax, name)(v, axis, reverse), x)
            want = per_device(lambda v: np.flip(ref(np.flip(v, axis), axis=axis), axis)
                              if reverse else ref(v, axis=axis), x)
            np.testing.assert_allclose(got, want, rtol=1e-15)
            outside = getattr(pw.lax, name)(x[0], axis, reverse)
            assert isinstance(outside, np.ndarray)
            np.testing.assert_array_equal(outside, got[0])


def test_cumulative_errors(tpus2, runtime_ok):
    x = np.zeros((2, 3, 4))
    with pytest.raises(ValueError, match="cumsum: axis 2 is out of range for shape"):
        pmapped(tpus2, lambda v: pnp.cumsum(v, axis=2), x)
    with pytest.raises(TypeError, match="cumprod: axis must be an int"):
        pmapped(tpus2, lambda v: pnp.cumprod(v, axis=1.0), x)
    with pytest.raises(ValueError, match="zero-dimensional"):
        pmapped(tpus2, lambda v: pnp.cumsum(v, axis=0), np.zeros(2))
    with pytest.raises(TypeError, match="cumsum: dtype float16 is not supported"):
        pmapped(tpus2, lambda v: pnp.cumsum(v, dtype=np.float16), x)
    with pytest.raises(ValueError, match="cummax: axis -3 is out of range for f64\\[3,4\\]"):
        pmapped(tpus2, lambda v: pw.lax.cummax(v, axis=-3), x)
    with pytest.raises(TypeError, match="cummin: reverse must be a bool"):
        pw.lax.cummin(x[0], 0, reverse=1)
    runtime_ok()


def test_cumsum_and_cumprod_on_numpy_arrays_are_numpys():
    x = np.arange(1, 7, dtype=np.int32).reshape(2, 3)
    np.testing.assert_array_equal(pnp.cumsum(x, axis=1), np.cumsum(x, axis=1))
    assert pnp.cumprod(x).dtype == np.cumprod(x).dtype


def test_cumsum_gradient_is_the_reverse_cumsum(tpus2):
    rng = rng_for("cumsum grad")
    x = rng.standard_normal((2, 3, 4))
    w = rng.standard_normal((2, 3, 4))
    for axis in (None, 0, 1, -1):
        wv = w.reshape(2, -1) if axis is None else w
        check_grads(tpus2, lambda x, w: (pnp.cumsum(x, axis=axis) * w).sum(), [x, wv],
                    argnums=(0,))
    for reverse in (False, True):
        (g,) = pmap_grads(tpus2, lambda x, w: (pw.lax.cumsum(x, 1, reverse) * w).sum(), [x, w],
                          (0,))
        want = np.flip(np.cumsum(np.flip(w, 2), axis=2), 2) if not reverse else np.cumsum(w, 2)
        np.testing.assert_allclose(g, want, rtol=1e-14)


def test_cumprod_gradient_with_zeros(tpus2):
    # Rows with no zero, one zero (first, middle, last), two zeros and all zeros.
    x = np.array([[[2.0, 3.0, -1.5, 0.5, 4.0], [0.0, 2.0, 3.0, -1.0, 2.0],
                   [1.5, 2.0, 0.0, 3.0, -2.0], [2.0, 1.0, 3.0, 2.0, 0.0]],
                  [[0.5, 0.0, 2.0, 0.0, 3.0], [0.0, 0.0, 0.0, 0.0, 0.0],
                   [-1.0, 2.0, 3.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0, 1.0]]])
    w = rng_for("cumprod grad").standard_normal((2, 4, 5))
    for axis in (1, -1):
        for reverse in (False, True):
            check_grads(tpus2, lambda x, w: (pw.lax.cumprod(x, axis, reverse) * w).sum(), [x, w],
                        argnums=(0,))
    check_grads(tpus2, lambda x, w: (pnp.cumprod(x, axis=None) * w.reshape(-1)).sum(), [x, w],
                argnums=(0,))
    # JAX's value for [2, 0, 3, 0, 4]: only the first zero's position and before get one.
    (g,) = pmap_grads(tpus2, lambda x: pnp.cumprod(x).sum(),
                      [np.array([[2.0, 0.0, 3.0, 0.0, 4.0], [1.0, 2.0, 3.0, 4.0, 5.0]])], (0,))
    np.testing.assert_array_equal(g[0], [1.0, 8.0, 0.0, 0.0, 0.0])


def test_cummax_cummin_gradient_goes_to_the_first_position_attaining_it(tpus2):
    rng = rng_for("cummax grad")
    x = rng.standard_normal((2, 3, 6))  # distinct values: differentiable
    w = rng.standard_normal((2, 3, 6))
    for name in ("cummax", "cummin"):
        for axis in (0, 1):
            for reverse in (False, True):
                check_grads(tpus2, lambda x, w: (getattr(pw.lax, name)(x, axis, reverse) * w).sum(),
                            [x, w], argnums=(0,))
    # Ties: out = [1, 3, 3, 3, 5] takes its 3s from position 1, the first to attain it.
    t = np.array([[1.0, 3.0, 3.0, 2.0, 5.0], [4.0, 4.0, 1.0, 4.0, 0.0]])
    (g,) = pmap_grads(tpus2, lambda x: pw.lax.cummax(x).sum(), [t], (0,))
    np.testing.assert_array_equal(g, [[1, 3, 0, 0, 1], [5, 0, 0, 0, 0]])
    (g,) = pmap_grads(tpus2, lambda x: pw.lax.cummin(x, reverse=True).sum(), [t], (0,))
    np.testing.assert_array_equal(g, [[1, 0, 0, 3, 1], [0, 0, 0, 0, 5]])


# --- sort, argsort ----------------------------------------------------------------------

SORT_SHAPES = [(7,), (3, 5), (2, 3, 4), (0,), (4, 0), (1, 1), (3, 1, 2)]


def descending_argsort(v, axis):
    """JAX's argsort(descending=True), by hand: larger first, NaN first, ties (-0.0 == 0.0
    too) in increasing position: a stable sort by a key that reverses the order."""
    if axis is None:
        v, axis = v.ravel(), 0
    moved = np.moveaxis(v, axis, -1)
    out = np.empty(moved.shape, np.int64)
    for idx in np.ndindex(*moved.shape[:-1]):
        row = moved[idx]
        key = (lambda i: (0, 0) if row[i] != row[i] else (1, -float(row[i])))  # noqa: E731
        out[idx] = sorted(range(row.shape[0]), key=key)
    return np.moveaxis(out, -1, axis)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("shape", SORT_SHAPES, ids=str)
def test_argsort_and_sort_match_numpy_stable_sort(tpus2, dtype, shape):
    rng = rng_for("sort", dtype_id(dtype), shape)
    x = values(rng, dtype, (2,) + shape)
    for axis in [None] + list(range(-len(shape), len(shape))):
        idx, vals = pmapped(tpus2, lambda v: (pnp.argsort(v, axis=axis),
                                              pnp.sort(v, axis=axis)), x)
        want_idx = per_device(lambda v: np.argsort(v, axis=axis, kind="stable"), x)
        assert idx.dtype == np.int32
        np.testing.assert_array_equal(idx, want_idx)
        # The values are the elements themselves (signs of zeros included).
        assert_same(vals, per_device(lambda v: np.sort(v, axis=axis, kind="stable"), x))
        down_idx, down = pmapped(tpus2, lambda v: (pnp.argsort(v, axis=axis, descending=True),
                                                   pnp.sort(v, axis=axis, descending=True)), x)
        want_down = per_device(lambda v: descending_argsort(v, axis), x)
        np.testing.assert_array_equal(down_idx, want_down)
        flat = x.reshape(2, -1) if axis is None else x
        assert_same(down, np.take_along_axis(flat, want_down, -1 if axis is None else axis + (
            axis >= 0)))


def test_sort_order_of_nan_inf_and_zeros(tpus2):
    row = np.array([1.0, np.nan, 3.0, -np.inf, np.inf, 0.0, -0.0, -np.nan, 3.0, -0.0])
    x = np.stack([row, row[::-1]])
    for dtype in FLOATS:
        up = pmapped(tpus2, pnp.argsort, x.astype(dtype))
        np.testing.assert_array_equal(up[0], [3, 5, 6, 9, 0, 2, 8, 4, 1, 7])  # numpy's stable
        np.testing.assert_array_equal(up, np.argsort(x, axis=-1, kind="stable"))
        down = pmapped(tpus2, lambda v: pnp.argsort(v, descending=True), x.astype(dtype))
        np.testing.assert_array_equal(down[0], [1, 7, 4, 2, 8, 0, 5, 6, 9, 3])  # jax.numpy's
        vals = pmapped(tpus2, pnp.sort, x.astype(dtype))
        np.testing.assert_array_equal(np.signbit(vals[0, 1:4]), [False, True, True])


def test_sort_methods_numpy_functions_and_kind(tpus2):
    x = values(rng_for("sort methods"), np.float32, (2, 3, 6))
    want = per_device(lambda v: np.argsort(v, axis=1, kind="stable"), x)
    for fn in (lambda v: v.argsort(axis=1), lambda v: np.argsort(v, axis=1),
               lambda v: pnp.argsort(v, 1, kind="quicksort", stable=False)):
        np.testing.assert_array_equal(pmapped(tpus2, fn, x), want)
    stable = lambda v, axis=-1: np.sort(v, axis, kind="stable")  # noqa: E731
    assert_same(pmapped(tpus2, lambda v: v.sort(axis=0), x), per_device(lambda v: stable(v, 0), x))
    assert_same(pmapped(tpus2, np.sort, x), per_device(stable, x))


def test_sort_on_numpy_arrays_is_numpys():
    x = np.array([[3, 1, 2], [1, 1, 0]], np.int32)
    np.testing.assert_array_equal(pnp.sort(x, axis=0), np.sort(x, axis=0))
    np.testing.assert_array_equal(pnp.argsort(x, axis=None), np.argsort(x, axis=None, kind="stable"))
    f = np.array([2.0, np.nan, 2.0, -1.0])
    np.testing.assert_array_equal(pnp.argsort(f, descending=True), [1, 0, 2, 3])
    np.testing.assert_array_equal(pnp.sort(f, descending=True), [np.nan, 2.0, 2.0, -1.0])


def test_sort_errors(tpus2, runtime_ok):
    with pytest.raises(ValueError, match="zero-dimensional"):
        pmapped(tpus2, pnp.sort, np.zeros(2))
    assert_same(pmapped(tpus2, lambda v: pnp.sort(v, axis=None), np.array([2.0, 1.0])),
                np.array([[2.0], [1.0]]))
    with pytest.raises(ValueError, match="argsort: axis 2 is out of range"):
        pmapped(tpus2, lambda v: pnp.argsort(v, axis=2), np.zeros((2, 3, 4)))
    with pytest.raises(ValueError, match="kind must be"):
        pmapped(tpus2, lambda v: pnp.sort(v, kind="bogo"), np.zeros((2, 3)))
    with pytest.raises(ValueError, match="order"):
        pmapped(tpus2, lambda v: pnp.argsort(v, order="x"), np.zeros((2, 3)))
    with pytest.raises(TypeError, match="sort: axis must be an int"):
        pmapped(tpus2, lambda v: pnp.sort(v, axis="0"), np.zeros((2, 3)))
    runtime_ok()


def test_sort_gradient_goes_back_to_each_values_position(tpus2):
    rng = rng_for("sort grad")
    x = rng.standard_normal((2, 3, 5))
    w = rng.standard_normal((2, 3, 5))
    for axis in (0, 1, -1):
        for descending in (False, True):
            check_grads(tpus2, lambda x, w: (pnp.sort(x, axis=axis, descending=descending) * w).sum(),
                        [x, w], argnums=(0,))
    check_grads(tpus2, lambda x, w: (pnp.sort(x, axis=None) * w.reshape(-1)).sum(), [x, w],
                argnums=(0,))
    # The cotangent of the sorted values, scattered: sorted[j] came from argsort[j].
    (g,) = pmap_grads(tpus2, lambda x, w: (pnp.sort(x) * w).sum(), [x, w], (0,))
    want = np.zeros_like(x)
    np.put_along_axis(want, np.argsort(x, axis=-1), w, axis=-1)
    np.testing.assert_array_equal(g, want)


# --- take_along_axis --------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("shape", [(5,), (3, 4), (2, 3, 4)], ids=str)
def test_take_along_axis_matches_numpy_with_traced_and_constant_indices(tpus2, dtype, shape):
    rng = rng_for("tala", dtype_id(dtype), shape)
    x = values(rng, dtype, (2,) + shape)
    for axis in range(-len(shape), len(shape)):
        n = shape[axis]
        # Indices longer than the axis, negative ones, and size-1 dims off the axis on
        # either side (numpy broadcasts them).
        ishape = [1 if rng.random() < 0.3 else d for d in shape]
        ishape[axis] = n + 2
        idx = rng.integers(-n, n, size=(2,) + tuple(ishape)).astype(np.int32)
        want = per_device(lambda v, i: np.take_along_axis(v, i, axis), x, idx)
        got = pmapped(tpus2, lambda v, i: pnp.take_along_axis(v, i, axis), x, idx)
        assert_same(got, want)
        # Constant indices (the same for both devices), and numpy's function.
        got_c = pmapped(tpus2, lambda v: np.take_along_axis(v, idx[0], axis), x)
        assert_same(got_c, per_device(lambda v: np.take_along_axis(v, idx[0], axis), x))
    # An array with size-1 dims where the indices have more.
    if len(shape) >= 2:
        x1 = x[:, :1]
        idx = rng.integers(0, shape[-1], size=(2,) + shape).astype(np.int32)
        assert_same(pmapped(tpus2, lambda v, i: pnp.take_along_axis(v, i, -1), x1, idx),
                    per_device(lambda v, i: np.take_along_axis(v, i, -1), x1, idx))


def test_take_along_axis_none_and_empty(tpus2):
    x = np.arange(24.0).reshape(2, 3, 4)
    idx = np.array([[5, -1, 0], [11, 3, 3]], np.int32)
    assert_same(pmapped(tpus2, lambda v, i: pnp.take_along_axis(v, i, None), x, idx),
                per_device(lambda v, i: np.take_along_axis(v, i, None), x, idx))
    empty = np.zeros((2, 3, 0), np.int32)
    assert_same(pmapped(tpus2, lambda v, i: pnp.take_along_axis(v, i, -1), x, empty),
                np.zeros((2, 3, 0)))
    assert_same(pmapped(tpus2, lambda v, i: pnp.take_along_axis(v, i, 0), np.zeros((2, 0, 2)),
                        np.zeros((2, 0, 2), np.int32)), np.zeros((2, 0, 2)))


@pytest.mark.parametrize("dtype, fill", [(np.float32, np.nan), (np.int32, -(2**31)),
                                         (np.bool_, True)], ids=["float32", "int32", "bool"])
def test_take_along_axis_out_of_range_traced_indices_fill_or_clip(tpus2, dtype, fill):
    x = np.array([[0, 1, 2, 3], [4, 5, 6, 7]]).astype(dtype)
    if dtype == np.bool_:
        x = np.zeros((2, 4), np.bool_)
    idx = np.array([[4, -5, -4, 3], [9, -1, 0, -100]], np.int32)
    got = pmapped(tpus2, lambda v, i: pnp.take_along_axis(v, i, 0), x, idx)
    inside = (idx >= -4) & (idx < 4)
    want = np.where(inside, np.take_along_axis(x, np.where(inside, idx, 0), 1),
                    np.array(fill).astype(dtype))
    assert_same(got, want.astype(dtype))
    got_7 = pmapped(tpus2, lambda v, i: pnp.take_along_axis(v, i, 0, fill_value=7), x, idx)
    assert_same(got_7, np.where(inside, want, np.array(7).astype(dtype)).astype(dtype))
    clipped = pmapped(tpus2, lambda v, i: pnp.take_along_axis(v, i, 0, mode="clip"), x, idx)
    wrapped = np.where(idx < 0, idx + 4, idx)
    assert_same(clipped, np.take_along_axis(x, np.clip(wrapped, 0, 3), 1))


def test_take_along_axis_errors(tpus2, runtime_ok):
    x = np.zeros((2, 3, 4))
    with pytest.raises(IndexError, match="index 4 is out of bounds"):
        pmapped(tpus2, lambda v: pnp.take_along_axis(v, np.array([[4]]), 1), x)
    with pytest.raises(ValueError, match="must have the rank of the array"):
        pmapped(tpus2, lambda v, i: pnp.take_along_axis(v, i, 1), x, np.zeros((2, 3), np.int32))
    with pytest.raises(ValueError, match="do not broadcast against"):
        pmapped(tpus2, lambda v, i: pnp.take_along_axis(v, i, 1), x, np.zeros((2, 2, 4), np.int32))
    with pytest.raises(TypeError, match="indices must be int32"):
        pmapped(tpus2, lambda v, i: pnp.take_along_axis(v, i, 1), x, np.zeros((2, 3, 4)))
    with pytest.raises(TypeError, match="indices must be integers"):
        pmapped(tpus2, lambda v: pnp.take_along_axis(v, np.zeros((3, 4)), 1), x)
    with pytest.raises(ValueError, match="mode must be"):
        pmapped(tpus2, lambda v: pnp.take_along_axis(v, np.zeros((3, 4), int), 1, mode="wrap"), x)
    with pytest.raises(ValueError, match="axis 3 is out of range"):
        pmapped(tpus2, lambda v: pnp.take_along_axis(v, np.zeros((3, 4), int), 3), x)
    runtime_ok()


def test_take_along_axis_gradient_accumulates_repeats(tpus2):
    rng = rng_for("tala grad")
    x = rng.standard_normal((2, 3, 4))
    idx = np.array([[[0, 0, 3], [2, 2, 2], [1, 3, -1]], [[3, 3, 3], [0, 1, 2], [-4, 0, 0]]],
                   np.int32)
    w = rng.standard_normal((2, 3, 3))
    check_grads(tpus2, lambda x, i, w: (pnp.take_along_axis(x, i, 1) * w).sum(), [x, idx, w],
                argnums=(0,), total=lambda x, i, w: float(sum(
                    (np.take_along_axis(x[d], i[d], 1) * w[d]).sum() for d in range(2))))
    (g,) = pmap_grads(tpus2, lambda x, i, w: (pnp.take_along_axis(x, i, 1) * w).sum(),
                      [x, idx, w], (0,))
    want = np.zeros_like(x)
    for d in range(2):
        np.add.at(want[d], (np.arange(3)[:, None], idx[d] % 4), w[d])
    np.testing.assert_allclose(g, want, rtol=1e-15)


# --- x.at[index] ------------------------------------------------------------------------

UFUNCS = {"add": np.add, "multiply": np.multiply, "mul": np.multiply, "min": np.minimum,
          "max": np.maximum, "subtract": np.subtract}


def np_at(x, index, method, v):
    """numpy's reference of `x.at[index].method(v)`: ufunc.at (repeats accumulate), or
    assignment in order at each position (the last repeat wins) for set."""
    y = np.array(x, copy=True)
    if method == "get":
        return y[index]
    if method == "set":
        pos = np.arange(y.size).reshape(y.shape)[index]
        vb = np.broadcast_to(np.asarray(v).astype(y.dtype), pos.shape)
        flat = y.reshape(-1)
        for p, u in zip(pos.reshape(-1), vb.reshape(-1)):
            flat[p] = u
        return flat.reshape(y.shape)
    with np.errstate(all="ignore"):
        UFUNCS[method].at(y, index, np.asarray(v).astype(y.dtype))
    return y


# Static index forms on a (4, 5, 3) shard: the values' shape is that of x[index].
STATIC_INDICES = [
    2, -1, (1, -2), (slice(None), 3), (slice(1, None, 2), slice(None, None, -2), 0),
    (Ellipsis, 1), (None, 0), (0, None, slice(None), Ellipsis), np.array([3, 0, 3, -1]),
    (slice(None), np.array([[1, 1], [4, 0]])), (np.array([0, 2, 0]), slice(None), np.array([1, 1, 2])),
    (0, slice(None), np.array([2, 0])), np.array([True, False, True, True]),
    (slice(None), np.array([False, True, True, False, True])), (),
]


@pytest.mark.parametrize("index", STATIC_INDICES, ids=repr)
@pytest.mark.parametrize("method", ["set", "add", "subtract", "multiply", "min", "max", "get"])
def test_at_static_indices_match_numpy(tpus2, index, method):
    rng = rng_for("at", repr(index), method)
    x = values(rng, np.float64, (2, 4, 5, 3), specials=False)
    shape = x[0][index].shape
    v = values(rng, np.float64, (2,) + shape, specials=False)
    if method == "get":
        got = pmapped(tpus2, lambda x: x.at[index].get(), x)
    else:
        got = pmapped(tpus2, lambda x, v: getattr(x.at[index], method)(v), x, v)
    assert_same(got, per_device(lambda x, v: np_at(x, index, method, v), x, v))


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_at_dtypes_values_are_cast_and_broadcast(tpus2, dtype):
    rng = rng_for("at dtypes", dtype_id(dtype))
    x = values(rng, dtype, (2, 3, 4))
    index = (slice(None), np.array([0, 2, 0]))
    methods = ["set", "min", "max"] + (["add", "multiply"] if dtype != np.bool_ else [])
    for method in methods:
        for v in (2.7, np.array([1, 0, 5]), values(rng, np.float64, (3, 1))):
            got = pmapped(tpus2, lambda x: getattr(x.at[index], method)(v), x)
            assert got.dtype == dtype
            want = per_device(lambda x: np_at(x, index, method, np.asarray(v).astype(dtype)), x)
            assert_same(got, want)
    if dtype == np.bool_:
        for method in ("add", "multiply"):
            with pytest.raises(TypeError, match=f"scatter: {'add' if method == 'add' else 'mul'} "
                                                "into a bool operand"):
                pmapped(tpus2, lambda x: getattr(x.at[0], method)(True), x)


def test_at_traced_indices_wrap_negatives_and_drop_out_of_range(tpus2):
    x = np.arange(2 * 4 * 3, dtype=np.float32).reshape(2, 4, 3)
    i = np.array([[1, -1, 9, -9, 1], [0, 0, 3, -4, 4]], np.int32)  # 9, -9, 4: out of range
    v = np.full((2, 5, 3), 100.0, np.float32)

    def ref(x, i, method, v):
        keep = (i >= -4) & (i < 4)
        return np_at(x, i[keep] % 4, method, v[keep])

    for method in ("set", "add", "multiply", "min", "max"):
        got = pmapped(tpus2, lambda x, i, v: getattr(x.at[i], method)(v), x, i, v)
        assert_same(got, per_device(lambda x, i, v: ref(x, i, method, v), x, i, v))
        # Along the second axis, where a wrong flat position would land in the next row.
        j = np.array([[3, 5], [-3, -4]], np.int32)
        got = pmapped(tpus2, lambda x, j: getattr(x.at[:, j], method)(7.0), x, j)
        assert_same(got, per_device(
            lambda x, j: np_at(x, (slice(None), j[(j >= -3) & (j < 3)] % 3), method, 7.0), x, j))
        # Beside a partial slice, the general path (positions in x flattened) drops them too.
        got = pmapped(tpus2, lambda x, j: getattr(x.at[1:, j], method)(7.0), x, j)
        assert_same(got, per_device(
            lambda x, j: np_at(x, (slice(1, None), j[(j >= -3) & (j < 3)] % 3), method, 7.0), x, j))
    # mode="clip" clips instead; get clips (as x[i]) or fills: along one axis
    # (x.at[:, j]) and by the general path (x.at[1:, j]).
    j = np.array([[3, 5], [-3, -4]], np.int32)
    clipped = np.clip(np.where(j < 0, j + 3, j), 0, 2)
    inside = ((j >= -3) & (j < 3))[:, None, :]
    for start in (0, 1):
        rows = slice(start, None)
        form = (lambda x, j: x.at[:, j]) if start == 0 else (lambda x, j: x.at[1:, j])
        got = pmapped(tpus2, lambda x, j: form(x, j).add(1.0, mode="clip"), x, j)
        assert_same(got, per_device(lambda x, c: np_at(x, (rows, c), "add", 1.0), x, clipped))
        want_get = per_device(lambda x, c: x[rows, c], x, clipped)
        assert_same(pmapped(tpus2, lambda x, j: form(x, j).get(), x, j), want_get)
        assert_same(pmapped(tpus2, lambda x, j: form(x, j).get(mode="fill"), x, j),
                    np.where(inside, want_get, np.float32(np.nan)))
    got = pmapped(tpus2, lambda x, i, v: x.at[i].set(v, mode="clip"), x, i, v)
    assert_same(got, per_device(lambda x, i, v: np_at(x, np.clip(np.where(i < 0, i + 4, i), 0, 3),
                                                      "set", v), x, i, v))
    got = pmapped(tpus2, lambda x, i: (x.at[i].get(), x.at[i].get(mode="fill")), x, i)
    clip = per_device(lambda x, i: x[np.clip(np.where(i < 0, i + 4, i), 0, 3)], x, i)
    assert_same(got[0], clip)
    inside = ((i >= -4) & (i < 4))[..., None]
    assert_same(got[1], np.where(inside, clip, np.float32(np.nan)))


def test_at_traced_index_with_slices_ints_and_none(tpus2):
    rng = rng_for("at mixed")
    x = values(rng, np.float64, (2, 3, 4, 5), specials=False)
    i = np.array([[[2, -1]], [[0, -4]]], np.int32)  # (1, 2) per device
    cases = [
        (lambda t: (0, slice(None), t), lambda a: (0, slice(None), a)),  # arrays first
        (lambda t: (slice(None), t), lambda a: (slice(None), a)),
        (lambda t: (Ellipsis, t), lambda a: (Ellipsis, a)),
        (lambda t: (None, 1, t, slice(1, None, 2)), lambda a: (None, 1, a, slice(1, None, 2))),
        (lambda t: (t[0, 0],), lambda a: (a[0, 0],)),  # a traced scalar index
    ]
    for traced_index, numpy_index in cases:
        shape = x[0][numpy_index(i[0])].shape
        v = values(rng, np.float64, (2,) + shape, specials=False)
        for method in ("set", "add", "get"):
            if method == "get":
                got = pmapped(tpus2, lambda x, i: x.at[traced_index(i)].get(), x, i)
            else:
                got = pmapped(tpus2, lambda x, i, v: getattr(x.at[traced_index(i)], method)(v),
                              x, i, v)
            want = per_device(lambda x, i, v: np_at(x, numpy_index(i), method, v), x, i, v)
            assert_same(got, want)


def test_at_on_zero_dimensional_and_empty_values(tpus2):
    s = np.array([1.5, -2.0])
    assert_same(pmapped(tpus2, lambda x: x.at[()].set(3.0), s), np.array([3.0, 3.0]))
    assert_same(pmapped(tpus2, lambda x: x.at[...].add(1.0), s), s + 1)
    e = np.zeros((2, 0, 3))
    assert_same(pmapped(tpus2, lambda x: x.at[:, 1].set(5.0), e), e)
    assert_same(pmapped(tpus2, lambda x: x.at[np.array([], np.int32)].add(1.0), e), e)


def test_at_errors(tpus2, runtime_ok):
    x = np.zeros((2, 3, 4), np.float32)
    with pytest.raises(ValueError, match=r"values of shape \(2,\) do not broadcast to the indexed "
                                         r"shape \(4,\)"):
        pmapped(tpus2, lambda x: x.at[0].set(np.ones(2)), x)
    with pytest.raises(IndexError, match="out of bounds"):
        pmapped(tpus2, lambda x: x.at[5].set(1.0), x)
    with pytest.raises(IndexError, match="too many indices"):
        pmapped(tpus2, lambda x: x.at[0, 0, 0].get(), x)
    with pytest.raises(IndexError, match="traced boolean mask"):
        pmapped(tpus2, lambda x: x.at[x > 0].set(1.0), x)
    with pytest.raises(TypeError, match="traced index must be int32"):
        pmapped(tpus2, lambda x: x.at[x[0, 0]].set(1.0), x)
    with pytest.raises(ValueError, match="mode must be"):
        pmapped(tpus2, lambda x: x.at[0].set(1.0, mode="wrap"), x)
    with pytest.raises(TypeError, match="values must be an array or a number"):
        pmapped(tpus2, lambda x: x.at[0].add("one"), x)
    buf = pw.device_put(x, tpus2)
    with pytest.raises(TypeError, match="ShardedBuffer.at"):
        buf.at[0].set(1.0)
    runtime_ok()


@pytest.mark.parametrize("method", ["set", "add", "subtract", "multiply", "min", "max", "get"])
def test_at_gradients_with_repeated_indices(tpus2, method):
    rng = rng_for("at grad", method)
    x = rng.standard_normal((2, 3, 4))
    index = (slice(None), np.array([1, 1, 3, -1, 0]))  # 3 and -1 land on the same column
    v = rng.standard_normal((2, 3, 5))
    w = rng.standard_normal((2, 3, 4) if method != "get" else (2, 3, 5))
    if method in ("min", "max"):
        # Distinct values (differentiable) and a tie: x[0,0,0] == v[0,0,4].
        v[0, 0, 4] = x[0, 0, 0]

    def f(x, v, w):
        out = x.at[index].get() * v if method == "get" else getattr(x.at[index], method)(v)
        return (out * w).sum()

    def total(x, v, w):
        def one(x, v, w):
            if method == "get":
                return (np_at(x, index, "get", None) * v * w).sum()
            return (np_at(x, index, method, v) * w).sum()

        return float(sum(one(x[d], v[d], w[d]) for d in range(2)))

    if method in ("min", "max"):
        (gx, gv) = pmap_grads(tpus2, f, [x, v, w], (0, 1))
        # At the tie the cotangent is shared equally by x and the update, as JAX's.
        kept = x[0, 0, 0] == np_at(x[0], index, method, v[0])[0, 0]
        assert kept
        np.testing.assert_allclose([gx[0, 0, 0], gv[0, 0, 4]], [w[0, 0, 0] / 2] * 2, rtol=1e-15)
        v[0, 0, 4] += 0.125  # off the tie, against finite differences
    check_grads(tpus2, f, [x, v, w], argnums=(0, 1), total=total)


def test_at_multiply_gradient_with_zero_updates(tpus2):
    rng = rng_for("at mul zeros")
    x = rng.standard_normal((2, 5))
    i = np.array([1, 1, 1, 3, 3, 0])
    v = rng.standard_normal((2, 6))
    v[0, 0] = v[0, 3] = 0.0  # one zero at 1, one at 3
    v[1, 0] = v[1, 1] = 0.0  # two zeros at 1
    w = rng.standard_normal((2, 5))
    check_grads(tpus2, lambda x, v, w: (x.at[i].multiply(v) * w).sum(), [x, v, w], argnums=(0, 1),
                total=lambda x, v, w: float(sum((np_at(x[d], i, "multiply", v[d]) * w[d]).sum()
                                                for d in range(2))))


def test_at_set_gradient_goes_to_the_winning_update(tpus2):
    x = np.arange(10.0).reshape(2, 5)
    v = np.array([[5.0, 6.0, 7.0], [1.0, 2.0, 3.0]])
    w = np.arange(1.0, 6.0)
    gx, gv = pmap_grads(tpus2, lambda x, v: (x.at[np.array([1, 1, 2])].set(v) * w).sum(), [x, v],
                        (0, 1))
    np.testing.assert_array_equal(gx, [[1, 0, 0, 4, 5]] * 2)  # jax.grad's values
    np.testing.assert_array_equal(gv, [[0, 2, 3]] * 2)
