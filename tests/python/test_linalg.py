"""pathways.numpy.linalg: svd and what is built from it (svdvals, the matrix 2-norm, -2-norm
and nuclear norm, matrix_rank), the LU decomposition and what is built from it (solve, inv,
det, slogdet), eigh, eigvalsh, cholesky, qr, pinv, lstsq, cond, vector_norm and matrix_norm: against numpy per device over shapes,
batches, dtypes, empty, singular and non-finite matrices, and gradients against JAX's.
"""

import re

import ml_dtypes
import numpy as np
import pytest

import pathways as pw
import pathways.numpy as pnp

RNG = np.random.default_rng(7)
SHAPES = [(1, 1), (3, 3), (5, 3), (3, 5), (1, 4), (4, 1), (2, 4, 3), (2, 1, 3, 6)]


def per_device(tpus, fn, *args):
    out = pw.pmap(fn, devices=tpus)(*args)
    if isinstance(out, tuple):
        return tuple(np.asarray(o) for o in out)
    return np.asarray(out)


def batch(shape, dtype=np.float64, n=2):
    return RNG.standard_normal((n,) + shape).astype(dtype)


def check_decomposition(x, u, s, vt, full, tol):
    m, n = x.shape[-2:]
    k = min(m, n)
    assert s.shape == x.shape[:-2] + (k,)
    assert u.shape == x.shape[:-2] + ((m, m) if full else (m, k))
    assert vt.shape == x.shape[:-2] + ((n, n) if full else (k, n))
    np.testing.assert_allclose(s, np.linalg.svd(x, compute_uv=False), rtol=tol, atol=tol)
    assert np.all(np.diff(s, axis=-1) <= 0) and np.all(s >= 0)
    rebuilt = (u[..., :, :k] * s[..., None, :]) @ vt[..., :k, :]
    np.testing.assert_allclose(rebuilt, x, rtol=tol, atol=tol * 10)
    eye_u = np.broadcast_to(np.eye(u.shape[-1]), u.shape[:-2] + (u.shape[-1],) * 2)
    eye_v = np.broadcast_to(np.eye(vt.shape[-2]), vt.shape[:-2] + (vt.shape[-2],) * 2)
    np.testing.assert_allclose(np.swapaxes(u, -1, -2) @ u, eye_u, atol=tol * 10)
    np.testing.assert_allclose(vt @ np.swapaxes(vt, -1, -2), eye_v, atol=tol * 10)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("full", [False, True])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_svd_decomposes_like_numpy(tpus2, shape, full, dtype):
    x = batch(shape, dtype)
    u, s, vt = per_device(tpus2, lambda a: tuple(pnp.linalg.svd(a, full_matrices=full)), x)
    assert u.dtype == s.dtype == vt.dtype == dtype
    check_decomposition(x, u, s, vt, full, 1e-12 if dtype == np.float64 else 3e-5)
    # The singular vectors are LAPACK's, as numpy's: the same up to sign.
    nu, ns, nvt = np.linalg.svd(x, full_matrices=full)
    if shape[-1] > 1 and shape[-2] > 1 and not full:
        np.testing.assert_allclose(np.abs(u), np.abs(nu), atol=1e-10 if dtype == np.float64 else 1e-4)
    only_s = per_device(tpus2, lambda a: pnp.linalg.svd(a, compute_uv=False), x)
    np.testing.assert_array_equal(only_s, s)
    np.testing.assert_array_equal(per_device(tpus2, pnp.linalg.svdvals, x), s)


def test_svd_result_unpacks_and_names_its_fields(tpus2):
    def fn(a):
        r = pnp.linalg.svd(a, full_matrices=False)
        assert isinstance(r, pnp.linalg.SVDResult) and r._fields == ("U", "S", "Vh")
        u, s, vh = r
        assert u is r.U and s is r.S and vh is r.Vh
        return r.S

    per_device(tpus2, fn, batch((3, 2)))
    # Concrete arrays get numpy's own.
    r = pnp.linalg.svd(np.eye(2) * 3)
    np.testing.assert_array_equal(r.S, [3, 3])


def test_numpy_svd_on_a_traced_value_is_routed_here(tpus2):
    x = batch((4, 3))
    s = per_device(tpus2, lambda a: np.linalg.svd(a, compute_uv=False), x)
    np.testing.assert_allclose(s, np.linalg.svd(x, compute_uv=False), rtol=1e-13)
    n = per_device(tpus2, lambda a: np.linalg.norm(a, "nuc"), x)
    np.testing.assert_allclose(n, np.linalg.norm(x, "nuc", axis=(1, 2)), rtol=1e-13)
    r = per_device(tpus2, lambda a: np.linalg.matrix_rank(a), x)
    np.testing.assert_array_equal(r, np.linalg.matrix_rank(x))
    c = per_device(tpus2, lambda a: np.linalg.cond(a), x)
    np.testing.assert_allclose(c, np.linalg.cond(x), rtol=1e-12)
    sq = well_conditioned((3, 3))
    np.testing.assert_allclose(per_device(tpus2, lambda a: np.linalg.inv(a), sq), np.linalg.inv(sq),
                               rtol=1e-12)


def test_rank_deficient_zero_and_known_matrices(tpus2):
    outer = np.stack([np.outer([1.0, 2, -1], [0.5, 1, 2, 3]), np.zeros((3, 4))])
    u, s, vt = per_device(tpus2, lambda a: tuple(pnp.linalg.svd(a)), outer)
    check_decomposition(outer, u, s, vt, True, 1e-12)
    np.testing.assert_allclose(s[0], [np.sqrt(6 * 14.25), 0, 0], atol=1e-12)
    np.testing.assert_array_equal(s[1], 0)
    diag = np.stack([np.diag([3.0, -4.0]), np.diag([0.0, 2.0])])
    np.testing.assert_array_equal(per_device(tpus2, pnp.linalg.svdvals, diag), [[4, 3], [2, 0]])


def test_empty_matrices_as_numpy(tpus2):
    for shape in [(0, 3), (3, 0), (0, 0), (2, 0, 4)]:
        x = np.zeros((2,) + shape)
        u, s, vt = per_device(tpus2, lambda a: tuple(pnp.linalg.svd(a)), x)
        nu, ns, nvt = np.linalg.svd(x)
        assert (u.shape, s.shape, vt.shape) == (nu.shape, ns.shape, nvt.shape)
        np.testing.assert_array_equal(u, nu)
        np.testing.assert_array_equal(vt, nvt)
        thin = per_device(tpus2, lambda a: tuple(pnp.linalg.svd(a, full_matrices=False)), x)
        assert [t.shape for t in thin] == [t.shape for t in np.linalg.svd(x, full_matrices=False)]
        for ord in (2, "nuc"):
            np.testing.assert_array_equal(
                per_device(tpus2, lambda a: pnp.linalg.norm(a, ord, axis=(-2, -1)), x),
                np.linalg.norm(x, ord, axis=(-2, -1)))
        np.testing.assert_array_equal(per_device(tpus2, pnp.linalg.matrix_rank, x),
                                      np.linalg.matrix_rank(x))


def test_non_finite_matrices_give_nan_and_leave_the_others_alone(tpus2):
    x = batch((3, 4, 2))
    x[0, 1, 2, 1] = np.nan
    x[1, 0, 0, 0] = np.inf
    u, s, vt = per_device(tpus2, lambda a: tuple(pnp.linalg.svd(a, full_matrices=False)), x)
    for d, bad in ((0, 1), (1, 0)):
        for r in (u, s, vt):
            assert np.isnan(r[d, bad]).all()
            good = [i for i in range(3) if i != bad]
            assert np.isfinite(r[d, good]).all()
    np.testing.assert_allclose(s[0, 0], np.linalg.svd(x[0, 0], compute_uv=False), rtol=1e-13)
    # The norms follow: NaN (JAX's answer; numpy raises LinAlgError).
    n = per_device(tpus2, lambda a: pnp.linalg.norm(a, 2, axis=(1, 2)), x)
    assert np.isnan(n[0, 1]) and np.isnan(n[1, 0]) and np.isfinite(n[0, 0])


def test_dtypes_integers_in_float64_bfloat16_rounded_back(tpus2):
    xi = RNG.integers(-5, 5, size=(2, 3, 4)).astype(np.int32)
    s = per_device(tpus2, pnp.linalg.svdvals, xi)
    assert s.dtype == np.float64
    np.testing.assert_allclose(s, np.linalg.svd(xi.astype(np.float64), compute_uv=False),
                               rtol=1e-13, atol=1e-13)
    sb = per_device(tpus2, pnp.linalg.svdvals, xi > 0)
    np.testing.assert_allclose(sb, np.linalg.svd((xi > 0).astype(np.float64), compute_uv=False),
                               atol=1e-13)
    xb = batch((3, 4)).astype(ml_dtypes.bfloat16)
    u, s, vt = per_device(tpus2, lambda a: tuple(pnp.linalg.svd(a, full_matrices=False)), xb)
    assert u.dtype == s.dtype == vt.dtype == ml_dtypes.bfloat16
    want = np.linalg.svd(xb.astype(np.float32), compute_uv=False)
    np.testing.assert_array_equal(s, want.astype(ml_dtypes.bfloat16))


@pytest.mark.parametrize("ord", [2, -2, "nuc", None, "fro", 1, -1, np.inf, -np.inf])
@pytest.mark.parametrize("keepdims", [False, True])
def test_matrix_norm_like_numpy(tpus2, ord, keepdims):
    x = batch((3, 4, 5))
    got = per_device(tpus2, lambda a: pnp.linalg.matrix_norm(a, ord="fro" if ord is None else ord,
                                                             keepdims=keepdims), x)
    want = np.linalg.matrix_norm(x, ord="fro" if ord is None else ord, keepdims=keepdims)
    np.testing.assert_allclose(got, want, rtol=1e-13)
    # Any pair of axes, batch axes before, between and after them.
    y = batch((3, 2, 4, 5))
    got = per_device(tpus2, lambda a: pnp.linalg.norm(a, ord, axis=(2, 0), keepdims=keepdims), y)
    want = np.linalg.norm(y, ord, axis=(3, 1), keepdims=keepdims)
    np.testing.assert_allclose(got, want, rtol=1e-13)


@pytest.mark.parametrize("axis", [None, 0, -1, (0, 2), (2, 0, 1)])
@pytest.mark.parametrize("ord", [2, 1, np.inf, -np.inf, 0, 3.5])
@pytest.mark.parametrize("keepdims", [False, True])
def test_vector_norm_like_numpy(tpus2, axis, ord, keepdims):
    x = batch((3, 4, 5))
    got = per_device(tpus2, lambda a: pnp.linalg.vector_norm(a, axis=axis, ord=ord, keepdims=keepdims), x)
    shifted = None if axis is None else (tuple(a + 1 if a >= 0 else a for a in axis)
                                         if isinstance(axis, tuple) else (axis + 1 if axis >= 0 else axis))
    if axis is None:
        want = np.stack([np.linalg.vector_norm(d, ord=ord, keepdims=keepdims) for d in x])
    else:
        want = np.linalg.vector_norm(x, axis=shifted, ord=ord, keepdims=keepdims)
    np.testing.assert_allclose(got, want, rtol=1e-13)


def test_matrix_rank_like_numpy(tpus2):
    low = RNG.standard_normal((2, 3, 6, 2)) @ RNG.standard_normal((2, 3, 2, 5))
    low[:, 1] = RNG.standard_normal((2, 6, 5))
    low[:, 2] = 0
    for kwargs in ({}, {"tol": 0.5}, {"rtol": 1e-3}, {"tol": np.array([1e-9, 1e3, 1.0])}):
        got = per_device(tpus2, lambda a: pnp.linalg.matrix_rank(a, **kwargs), low)
        want = np.stack([np.linalg.matrix_rank(d, **kwargs) for d in low])
        assert got.dtype == np.int32
        np.testing.assert_array_equal(got, want)
    v = np.array([[0.0, 0, 0], [0, 1, 0]])
    np.testing.assert_array_equal(per_device(tpus2, pnp.linalg.matrix_rank, v), [0, 1])
    f32 = low.astype(np.float32)
    np.testing.assert_array_equal(per_device(tpus2, pnp.linalg.matrix_rank, f32),
                                  np.stack([np.linalg.matrix_rank(d) for d in f32]))


def well_conditioned(shape, dtype=np.float64):
    """Random square matrices with a strong diagonal (condition numbers around 10)."""
    x = batch(shape, dtype)
    return (x + 3 * np.eye(shape[-1], dtype=dtype)).astype(dtype)


@pytest.mark.parametrize("a_shape, b_shape", [
    ((3, 3), (3,)), ((3, 3), (3, 2)), ((2, 4, 4), (2, 4, 3)), ((2, 4, 4), (4, 1)),
    ((1, 3, 3), (2, 3, 5)), ((1, 1), (1, 1)), ((3, 3), (3, 0)), ((2, 0, 0), (2, 0, 2)),
], ids=str)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_solve_like_numpy(tpus2, a_shape, b_shape, dtype):
    a, b = batch(a_shape, dtype) + 2 * np.eye(a_shape[-1], dtype=dtype), batch(b_shape, dtype)
    got = per_device(tpus2, pnp.linalg.solve, a.astype(dtype), b)
    want = np.stack([np.linalg.solve(a[i].astype(dtype), b[i]) for i in range(2)])
    assert got.dtype == dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-10 if dtype == np.float64 else 1e-4,
                               atol=1e-12 if dtype == np.float64 else 1e-5)


def test_solve_inv_det_promote_and_round_like_numpy(tpus2):
    a = well_conditioned((3, 3))
    bi = RNG.integers(-4, 4, size=(2, 3, 2)).astype(np.int32)
    got = per_device(tpus2, pnp.linalg.solve, a.astype(np.float32), bi)
    assert got.dtype == np.float64  # int32 computes in float64, and float32 with it promotes
    np.testing.assert_allclose(got, np.linalg.solve(a.astype(np.float32), bi), rtol=1e-6)
    ai = RNG.integers(-4, 4, size=(2, 3, 3)).astype(np.int32) + 9 * np.eye(3, dtype=np.int32)
    np.testing.assert_allclose(per_device(tpus2, pnp.linalg.det, ai), np.linalg.det(ai), rtol=1e-13)
    np.testing.assert_allclose(per_device(tpus2, pnp.linalg.inv, ai), np.linalg.inv(ai), rtol=1e-13)
    ab = a.astype(ml_dtypes.bfloat16)
    inv = per_device(tpus2, pnp.linalg.inv, ab)
    assert inv.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(inv, np.linalg.inv(ab.astype(np.float32)).astype(ml_dtypes.bfloat16))


@pytest.mark.parametrize("shape", [(1, 1), (3, 3), (2, 5, 5), (2, 1, 4, 4), (0, 0), (2, 0, 0)], ids=str)
def test_inv_det_slogdet_like_numpy(tpus2, shape):
    a = well_conditioned(shape) if shape[-1] else np.zeros((2,) + shape)
    np.testing.assert_allclose(per_device(tpus2, pnp.linalg.inv, a), np.linalg.inv(a), rtol=1e-12,
                               atol=1e-14)
    np.testing.assert_allclose(per_device(tpus2, pnp.linalg.det, a), np.linalg.det(a), rtol=1e-12)
    sign, logabsdet = per_device(tpus2, lambda m: tuple(pnp.linalg.slogdet(m)), a)
    want = np.linalg.slogdet(a)
    np.testing.assert_array_equal(sign, want.sign)
    np.testing.assert_allclose(logabsdet, want.logabsdet, rtol=1e-12, atol=1e-14)


def test_permutation_sign_singular_and_huge_matrices(tpus2):
    # Row swaps flip det's sign; a zero leading element needs a pivot.
    p = np.stack([np.eye(4)[[1, 0, 2, 3]], np.eye(4)[[1, 2, 3, 0]]])
    np.testing.assert_array_equal(per_device(tpus2, pnp.linalg.det, p), [-1, -1])
    np.testing.assert_array_equal(per_device(tpus2, pnp.linalg.det, np.stack([np.eye(4)[[1, 0, 3, 2]]] * 2)),
                                  [1, 1])
    singular = np.stack([np.outer([1.0, 2, 3], [1.0, 1, 2]), np.zeros((3, 3))])
    np.testing.assert_array_equal(per_device(tpus2, pnp.linalg.det, singular), [0, 0])
    sign, logabsdet = per_device(tpus2, lambda m: tuple(pnp.linalg.slogdet(m)), singular)
    np.testing.assert_array_equal(sign, [0, 0])
    np.testing.assert_array_equal(logabsdet, [-np.inf, -np.inf])
    assert not np.isfinite(per_device(tpus2, pnp.linalg.inv, singular)).all()  # JAX's; numpy raises
    # slogdet where det overflows.
    big = np.stack([np.eye(400) * 10.0, -np.eye(400) * 0.1])
    sign, logabsdet = per_device(tpus2, lambda m: tuple(pnp.linalg.slogdet(m)), big)
    np.testing.assert_array_equal(sign, [1, 1])
    np.testing.assert_allclose(logabsdet, [400 * np.log(10), 400 * np.log(0.1)], rtol=1e-13)
    np.testing.assert_array_equal(per_device(tpus2, pnp.linalg.det, big), [np.inf, 0])


@pytest.mark.parametrize("p", [None, 2, -2, "fro", "nuc", 1, -1, np.inf, -np.inf])
def test_cond_like_numpy(tpus2, p):
    x = batch((3, 4, 4))
    if p != "nuc":  # (numpy's cond "nuc" of a singular matrix raises LinAlgError; ours: inf)
        x[1, 1] = np.outer([1.0, 2, 3, 4], [1.0, 0, 1, 0])  # singular: inf (0 for p=-2)
    if p not in (None, 2, -2, "nuc"):  # (numpy's svd raises on NaN; ours gives NaN, below)
        x[0, 2, 1, 1] = np.nan  # NaN stays NaN
    with np.errstate(all="ignore"):
        want = np.linalg.cond(x, p)
    got = per_device(tpus2, lambda a: pnp.linalg.cond(a, p), x)
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-8)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    if p in (None, 2):
        assert got[1, 1] == np.inf
    if p in ("fro", "nuc"):  # through inv's infinities or NaN, as numpy's inf
        singular = np.outer([1.0, 2, 3, 4], [1.0, 0, 1, 0])[None]
        assert per_device(tpus2, lambda a: pnp.linalg.cond(a, p), np.stack([singular] * 2))[0, 0] == np.inf
    if p in (None, 2, -2):  # any shape; NaN where a NaN is
        x[0, 2, 1, 1] = np.nan
        assert np.isnan(per_device(tpus2, lambda a: pnp.linalg.cond(a, p), x)[0, 2])
        r = batch((3, 5))
        np.testing.assert_allclose(per_device(tpus2, lambda a: pnp.linalg.cond(a, p), r),
                                   np.linalg.cond(r, p), rtol=1e-12)


def test_review_cases(tpus2, jax64):
    """Cases a review found: a constant a with a traced b, cond of zero and infinite
    matrices, max-based norms of nothing, bfloat16 ranks, numpy scalar orders, and
    gradients at tied singular values."""
    jax, jnp = jax64, jax64.numpy
    a = np.array([[3.0, 1], [1, 2]])
    for const in (a, a.astype(np.int32)):
        got = per_device(tpus2, lambda b: pnp.linalg.solve(const, b), np.ones((2, 2)))
        np.testing.assert_allclose(got, [[0.2, 0.4]] * 2, rtol=1e-15)
        g = per_device(tpus2, pw.grad(lambda b: (pnp.linalg.solve(const, b) * np.array([1.0, 2])).sum()),
                       np.ones((2, 2)))
        np.testing.assert_allclose(g, [np.linalg.solve(a.T, [1.0, 2])] * 2, rtol=1e-15)
    bad = np.stack([np.zeros((2, 2)), np.array([[np.inf, 1], [0, 1]])])
    for p in (None, 2, -2, "fro", 1, np.inf):
        with np.errstate(all="ignore"):
            want = np.linalg.cond(bad, p)
        np.testing.assert_array_equal(per_device(tpus2, lambda m: pnp.linalg.cond(m, p), bad), want)
    for shape, ord, axis in (((3, 0), 1, None), ((0, 3), np.inf, None), ((0,), np.inf, None),
                             ((2, 0), np.inf, 1), ((3, 0), 2, None), ((4, 0, 3), np.inf, (0, 1))):
        x = np.zeros((2,) + shape)
        got = per_device(tpus2, lambda m: pnp.linalg.norm(m, ord, axis), x)
        want = np.stack([np.linalg.norm(m, ord, axis) for m in x])
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(
        per_device(tpus2, lambda m: pnp.linalg.vector_norm(m, ord=np.inf, axis=-1), np.zeros((2, 3, 0))),
        np.zeros((2, 3)))
    eye = np.stack([np.eye(3, dtype=ml_dtypes.bfloat16)] * 2)
    np.testing.assert_array_equal(per_device(tpus2, pnp.linalg.matrix_rank, eye), [3, 3])
    v = np.array([[1.5, -0.3, 2, 0.7]] * 2)
    np.testing.assert_array_equal(per_device(tpus2, lambda m: pnp.linalg.norm(m, np.float32(3)), v),
                                  [np.linalg.norm(v[0], 3)] * 2)
    for m in (np.eye(3), np.diag([2.0, -2, 1])):
        for ord in (2, -2, "nuc"):
            got = per_device(tpus2, pw.grad(lambda q: pnp.linalg.norm(q, ord)), np.stack([m, m]))
            want = np.asarray(jax.grad(lambda q: jnp.linalg.norm(q, ord))(m))
            np.testing.assert_allclose(got, np.stack([want, want]), atol=1e-15)


def symmetric(shape, dtype=np.float64):
    x = batch(shape, dtype)
    return ((x + np.swapaxes(x, -1, -2)) / 2).astype(dtype)


def spd(shape, dtype=np.float64):
    """Symmetric positive definite matrices."""
    x = batch(shape)
    return (x @ np.swapaxes(x, -1, -2) + shape[-1] * np.eye(shape[-1])).astype(dtype)


@pytest.mark.parametrize("shape", [(1, 1), (3, 3), (2, 5, 5), (2, 1, 4, 4), (0, 0)], ids=str)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_eigh_and_eigvalsh_like_numpy(tpus2, shape, dtype):
    a = symmetric(shape, dtype)
    w, v = per_device(tpus2, lambda m: tuple(pnp.linalg.eigh(m)), a)
    nw, nv = np.linalg.eigh(a)
    tol = 1e-12 if dtype == np.float64 else 2e-5
    assert w.dtype == v.dtype == dtype and w.shape == nw.shape and v.shape == nv.shape
    np.testing.assert_allclose(w, nw, rtol=tol, atol=tol)
    np.testing.assert_allclose((v * w[..., None, :]) @ np.swapaxes(v, -1, -2), a, atol=tol * 10)
    np.testing.assert_allclose(np.abs(v), np.abs(nv), atol=tol * 100)  # distinct eigenvalues: up to sign
    np.testing.assert_array_equal(per_device(tpus2, pnp.linalg.eigvalsh, a), w)


def test_eigh_symmetrizes_or_reads_one_triangle(tpus2):
    a = batch((3, 3))  # not symmetric
    sym = (a + np.swapaxes(a, -1, -2)) / 2
    w = per_device(tpus2, lambda m: pnp.linalg.eigh(m).eigenvalues, a)
    np.testing.assert_allclose(w, np.linalg.eigvalsh(sym), rtol=1e-12)
    for uplo in ("L", "U"):
        got = per_device(tpus2, lambda m: pnp.linalg.eigvalsh(m, uplo, symmetrize_input=False), a)
        np.testing.assert_allclose(got, np.linalg.eigvalsh(a, UPLO=uplo), rtol=1e-12)
        got = per_device(tpus2, lambda m: pnp.linalg.eigh(m, UPLO=uplo, symmetrize_input=False)[0], a)
        np.testing.assert_allclose(got, np.linalg.eigh(a, UPLO=uplo)[0], rtol=1e-12)
    r = pnp.linalg.eigh(np.diag([2.0, 1.0]))  # concrete: numpy's
    np.testing.assert_array_equal(r.eigenvalues, [1, 2])
    x = symmetric((3, 3))
    x[1, 2, 0] = x[1, 0, 2] = np.nan
    w, v = per_device(tpus2, lambda m: tuple(pnp.linalg.eigh(m)), x)
    assert np.isnan(w[1]).all() and np.isnan(v[1]).all() and np.isfinite(w[0]).all()
    np.testing.assert_array_equal(per_device(tpus2, lambda m: np.linalg.eigvalsh(m), symmetric((3, 3))).shape,
                                  (2, 3))


@pytest.mark.parametrize("shape", [(1, 1), (3, 3), (2, 6, 6), (0, 0)], ids=str)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_cholesky_like_numpy(tpus2, shape, dtype):
    a = spd(shape, dtype)
    got = per_device(tpus2, pnp.linalg.cholesky, a)
    assert got.dtype == dtype
    np.testing.assert_allclose(got, np.linalg.cholesky(a), rtol=1e-12 if dtype == np.float64 else 2e-5,
                               atol=1e-12 if dtype == np.float64 else 1e-5)
    up = per_device(tpus2, lambda m: pnp.linalg.cholesky(m, upper=True), a)
    np.testing.assert_allclose(up, np.linalg.cholesky(a, upper=True), rtol=1e-4, atol=1e-5)


def test_cholesky_of_non_positive_definite_and_one_triangle(tpus2):
    a = spd((3, 3))
    a[1] = -a[1]  # negative definite: NaN, as JAX (numpy raises)
    got = per_device(tpus2, pnp.linalg.cholesky, a)
    assert np.isnan(got[1]).all()
    np.testing.assert_allclose(got[0], np.linalg.cholesky(a[0]), rtol=1e-12)
    lower_only = np.tril(spd((3, 3))) + np.triu(np.full((3, 3), 50.0), 1)
    np.testing.assert_allclose(
        per_device(tpus2, lambda m: pnp.linalg.cholesky(m, symmetrize_input=False), lower_only),
        np.linalg.cholesky(lower_only), rtol=1e-12)
    xb = spd((3, 3)).astype(ml_dtypes.bfloat16)
    got = per_device(tpus2, pnp.linalg.cholesky, xb)
    assert got.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(got, np.linalg.cholesky(
        ((xb.astype(np.float32) + np.swapaxes(xb.astype(np.float32), -1, -2)) / 2)).astype(ml_dtypes.bfloat16))


def test_gradients_of_one_triangle_are_the_functions_as_read(tpus2):
    """With symmetrize_input=False only the lower triangle is read, so the gradient is 0 above
    it (JAX gives the symmetric matrix's instead): central differences of numpy's own."""
    a = spd((4, 4))[0]
    w = RNG.standard_normal((4, 4))

    def f_np(m):
        return (np.linalg.cholesky(m) * w).sum() + (np.linalg.eigvalsh(m) * w[0]).sum()

    got = per_device(tpus2, pw.grad(lambda m: (pnp.linalg.cholesky(m, symmetrize_input=False) * w).sum()
                                    + (pnp.linalg.eigvalsh(m, symmetrize_input=False) * w[0]).sum()),
                     np.stack([a, a]))[0]
    eps = 1e-6
    want = np.zeros((4, 4))
    for i in range(4):
        for j in range(4):
            d = np.zeros((4, 4))
            d[i, j] = eps
            want[i, j] = (f_np(a + d) - f_np(a - d)) / (2 * eps)
    assert np.all(np.triu(got, 1) == 0)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("name", ["eigh", "eigvalsh", "cholesky"])
def test_symmetric_gradients_equal_jax(tpus2, jax64, name):
    jax = jax64
    jnp = jax.numpy
    a = spd((2, 4, 4)) + batch((2, 4, 4)) * 0.1  # not quite symmetric: the symmetrization counts
    w = RNG.standard_normal((4, 4))
    fns = {
        "eigh": lambda lib, m: ((lib.linalg.eigh(m)[1] ** 2) * w).sum() + (lib.linalg.eigh(m)[0] * w[0]).sum(),
        "eigvalsh": lambda lib, m: (lib.linalg.eigvalsh(m) ** 2 * w[0]).sum(),
        "cholesky": lambda lib, m: (lib.linalg.cholesky(m) * w).sum(),
    }
    assert_gradients_equal_jax(tpus2, jax, fns[name], a, (1, 0))


def test_second_review_cases(tpus2):
    """slogdet's sign with a NaN (numpy's 1), lowercase UPLO, the 'f' alias of 'fro', integer
    flags and a keyword a, as numpy and JAX take them."""
    m = np.stack([np.array([[4.0, 1, np.nan], [1, 3, 0.2], [0.5, 0.2, 2]]), np.eye(3)])
    sign, logabsdet = per_device(tpus2, lambda q: tuple(pnp.linalg.slogdet(q)), m)
    np.testing.assert_array_equal(sign, [1, 1])
    assert np.isnan(logabsdet[0]) and logabsdet[1] == 0
    a = batch((3, 3))
    for uplo in ("l", "u"):
        np.testing.assert_allclose(
            per_device(tpus2, lambda q: np.linalg.eigvalsh(q, uplo), a),  # numpy's own call, routed
            np.linalg.eigvalsh((a + np.swapaxes(a, -1, -2)) / 2), rtol=1e-12)
        np.testing.assert_allclose(
            per_device(tpus2, lambda q: pnp.linalg.eigh(q, uplo, symmetrize_input=0).eigenvalues, a),
            np.linalg.eigh(a, UPLO=uplo.upper()).eigenvalues, rtol=1e-12)
    np.testing.assert_allclose(per_device(tpus2, lambda q: pnp.linalg.cond(q, "f"), a),
                               np.linalg.cond(a, "fro"), rtol=1e-12)
    np.testing.assert_allclose(per_device(tpus2, lambda q: pnp.linalg.norm(q, "f"), a),
                               np.linalg.norm(a, "fro", axis=(1, 2)), rtol=1e-14)
    s = spd((3, 3))
    np.testing.assert_allclose(per_device(tpus2, lambda q: pnp.linalg.cholesky(a=q, upper=1), s),
                               np.linalg.cholesky(s, upper=True), rtol=1e-12)
    u, sv, vt = per_device(tpus2, lambda q: tuple(pnp.linalg.svd(q, full_matrices=np.int64(0))), batch((4, 3)))
    assert u.shape == (2, 4, 3)


@pytest.mark.parametrize("shape", [(1, 1), (4, 4), (6, 3), (3, 6), (2, 5, 2), (0, 3), (3, 0)], ids=str)
@pytest.mark.parametrize("mode", ["reduced", "complete", "r"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_qr_like_numpy(tpus2, shape, mode, dtype):
    a = batch(shape, dtype)
    got = per_device(tpus2, lambda m: tuple(pnp.linalg.qr(m, mode)) if mode != "r" else pnp.linalg.qr(m, mode), a)
    want = np.linalg.qr(a, mode)
    tol = 1e-12 if dtype == np.float64 else 3e-5
    if mode == "r":
        assert got.dtype == dtype
        np.testing.assert_allclose(np.abs(got), np.abs(want), rtol=tol, atol=tol)  # signs: LAPACK's
        return
    q, r = got
    assert q.dtype == r.dtype == dtype and q.shape == want.Q.shape and r.shape == want.R.shape
    np.testing.assert_allclose(q @ r, a, atol=tol * 10)
    np.testing.assert_allclose(np.swapaxes(q, -1, -2) @ q, np.broadcast_to(np.eye(q.shape[-1]), q.shape[:-2] + (q.shape[-1],) * 2),
                               atol=tol * 10)
    assert np.all(np.tril(r, -1) == 0)
    np.testing.assert_allclose(np.abs(r), np.abs(want.R), rtol=tol, atol=tol * 10)


def test_qr_result_dtypes_and_non_finite(tpus2):
    r = per_device(tpus2, lambda m: pnp.linalg.qr(m), batch((3, 2)))
    assert isinstance(pnp.linalg.qr(np.eye(2)), tuple)  # concrete: numpy's QRResult
    xi = RNG.integers(-3, 3, size=(2, 3, 2)).astype(np.int32)
    q, r = per_device(tpus2, lambda m: tuple(pnp.linalg.qr(m)), xi)
    assert q.dtype == np.float64
    np.testing.assert_allclose(q @ r, xi, atol=1e-12)
    xb = batch((3, 2)).astype(ml_dtypes.bfloat16)
    q, r = per_device(tpus2, lambda m: tuple(pnp.linalg.qr(m)), xb)
    assert q.dtype == r.dtype == ml_dtypes.bfloat16
    x = batch((2, 3, 2))
    x[1, 0, 2, 1] = np.inf
    q, r = per_device(tpus2, lambda m: tuple(pnp.linalg.qr(m)), x)
    assert np.isnan(q[1, 0]).all() and np.isnan(r[1, 0]).all() and np.isfinite(q[1, 1]).all()


@pytest.mark.parametrize("shape, mode", [((5, 3), "reduced"), ((4, 4), "reduced"), ((4, 4), "complete"),
                                         ((2, 6, 2), "reduced"), ((5, 3), "r"), ((3, 5), "reduced"),
                                         ((3, 5), "r"), ((2, 2, 4), "complete"), ((5, 3), "complete"),
                                         ((2, 6, 2), "complete")], ids=str)
def test_qr_gradients_equal_jax(tpus2, jax64, shape, mode):
    jax = jax64
    a = batch(shape)
    w = RNG.standard_normal((6, 6))

    def f(lib, m):
        out = lib.linalg.qr(m, mode)
        if mode == "r":  # r's signs are LAPACK's in both, and the same
            return (out * w[: out.shape[-2], : out.shape[-1]]).sum()
        q, r = out
        # A function of the signs' pairs q[:, i] r[i, :] only: the same whatever the signs.
        return ((q[..., :, :1] @ r[..., :1, :]) * w[: q.shape[-2], : r.shape[-1]]).sum() + ((q * q) * w[: q.shape[-2], : q.shape[-1]]).sum() + ((r * r) * w[: r.shape[-2], : r.shape[-1]]).sum()

    got = per_device(tpus2, pw.grad(lambda m: f(pnp, m)), a)
    want = np.asarray(jax.vmap(jax.grad(lambda m: f(jax.numpy, m)))(a))
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-11)
    # And central differences of numpy's own (the same LAPACK, so the same signs).
    eps = 1e-6
    flat = a[0].reshape(-1)
    numeric = np.zeros_like(flat)
    for i in range(flat.size):
        d = np.zeros_like(flat)
        d[i] = eps
        numeric[i] = (f(np, (flat + d).reshape(a[0].shape)) - f(np, (flat - d).reshape(a[0].shape))) / (2 * eps)
    np.testing.assert_allclose(got[0].reshape(-1), numeric, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("shape", [(5, 3), (3, 5), (4, 4), (2, 3, 3), (1, 1), (0, 3), (3, 0)], ids=str)
def test_pinv_like_numpy(tpus2, shape):
    a = batch(shape)
    np.testing.assert_allclose(per_device(tpus2, pnp.linalg.pinv, a), np.linalg.pinv(a), rtol=1e-10,
                               atol=1e-12)
    # Rank-deficient, with tolerances per matrix; hermitian symmetrizes.
    low = batch((4, 1)) @ batch((1, 3))
    np.testing.assert_allclose(per_device(tpus2, pnp.linalg.pinv, low), np.linalg.pinv(low), rtol=1e-10,
                               atol=1e-12)
    got = per_device(tpus2, lambda m: pnp.linalg.pinv(m, rcond=np.array([0.5, 1e-9])), batch((2, 4, 3)))
    assert got.shape == (2, 2, 3, 4)
    sym = symmetric((3, 3))
    np.testing.assert_allclose(per_device(tpus2, lambda m: pnp.linalg.pinv(m, hermitian=True), sym),
                               np.linalg.pinv(sym, hermitian=True), rtol=1e-10, atol=1e-12)


def test_lstsq_like_numpy(tpus2):
    a, b, v = batch((6, 3)), batch((6, 2)), batch((6,))
    x, resid, rank, s = per_device(tpus2, lambda m, r: pnp.linalg.lstsq(m, r), a, b)
    for i in range(2):
        want = np.linalg.lstsq(a[i], b[i])
        np.testing.assert_allclose(x[i], want[0], rtol=1e-10)
        np.testing.assert_allclose(resid[i], want[1], rtol=1e-10)
        assert rank[i] == want[2] and rank.dtype == np.int32
        np.testing.assert_allclose(s[i], want[3], rtol=1e-12)
    x, resid, rank, s = per_device(tpus2, lambda m, r: pnp.linalg.lstsq(m, r), a, v)
    want = np.linalg.lstsq(a[0], v[0])
    np.testing.assert_allclose(x[0], want[0], rtol=1e-10)
    np.testing.assert_allclose(resid[0], want[1], rtol=1e-10)
    # Wide and rank-deficient: the minimum-norm solution; residuals as JAX's, always given.
    wide = batch((2, 1)) @ batch((1, 4))
    rhs = batch((2,))
    x, resid, rank, s = per_device(tpus2, lambda m, r: pnp.linalg.lstsq(m, r), wide, rhs)
    for i in range(2):
        np.testing.assert_allclose(x[i], np.linalg.lstsq(wide[i], rhs[i])[0], rtol=1e-8, atol=1e-10)
        np.testing.assert_allclose(resid[i], [np.sum((rhs[i] - wide[i] @ x[i]) ** 2)], rtol=1e-8, atol=1e-12)
    np.testing.assert_array_equal(rank, [1, 1])
    assert resid.shape == (2, 1)
    # A negative rcond is the dtype's eps, as numpy's: rounding-noise singular values dropped.
    low = batch((5, 2)) @ batch((2, 5))
    rhs = batch((5,))
    x, resid, rank, s = per_device(tpus2, lambda m, r: pnp.linalg.lstsq(m, r, rcond=-1.0), low, rhs)
    np.testing.assert_array_equal(rank, [2, 2])
    np.testing.assert_allclose(x[0], np.linalg.lstsq(low[0], rhs[0], rcond=-1)[0], rtol=1e-6, atol=1e-8)
    with pytest.raises(ValueError, match="pinv: only one of rtol and rcond"):
        pnp.linalg.pinv(np.eye(2), rtol=0.1, rcond=0.2)  # concrete too


@pytest.mark.parametrize("shape", [(5, 3), (3, 5), (3, 3)], ids=str)
def test_pinv_and_lstsq_gradients_equal_jax(tpus2, jax64, shape):
    jax = jax64
    jnp = jax.numpy
    a = batch(shape)
    w = RNG.standard_normal(shape[::-1])
    got = per_device(tpus2, pw.grad(lambda m: (pnp.linalg.pinv(m) * w).sum()), a)
    want = np.asarray(jax.vmap(jax.grad(lambda m: (jnp.linalg.pinv(m) * w).sum()))(a))
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
    eye = np.stack([np.eye(3)] * 2)  # repeated singular values: finite, as JAX's
    got = per_device(tpus2, pw.grad(lambda m: (pnp.linalg.pinv(m) * w[:3, :3]).sum()), eye)
    want = np.asarray(jax.vmap(jax.grad(lambda m: (jnp.linalg.pinv(m) * w[:3, :3]).sum()))(eye))
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)
    b = batch((shape[0], 2))
    got = per_device(tpus2, pw.grad(lambda m, r: (pnp.linalg.lstsq(m, r)[0] * w[:, :2]).sum()), a, b)
    want = np.asarray(jax.vmap(jax.grad(lambda m, r: (jnp.linalg.lstsq(m, r)[0] * w[:, :2]).sum()))(a, b))
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


# --- Gradients, against JAX's -----------------------------------------------------------


def loss(lib, u, s, vt, w):
    """A function of the svd that does not depend on the singular vectors' signs."""
    k = s.shape[-1]
    return (lib.sum((u * u) * w[: u.shape[-2], : u.shape[-1]])
            + lib.sum((vt * vt) * w[: vt.shape[-2], : vt.shape[-1]])
            + lib.sum(lib.sin(s) * w[0, :k])
            + lib.sum(u[..., :, :1] @ vt[..., :1, :]))


@pytest.mark.parametrize("shape", [(5, 3), (3, 5), (4, 4), (2, 4, 3)], ids=str)
def test_svd_gradients_equal_jax(tpus2, jax64, shape):
    jax = jax64
    jnp = jax.numpy
    x = batch(shape)
    w = RNG.standard_normal((6, 6))

    def ours(a):
        u, s, vt = pnp.linalg.svd(a, full_matrices=False)
        return loss(pnp, u, s, vt, w)

    def theirs(a):
        u, s, vt = jnp.linalg.svd(a, full_matrices=False)
        return loss(jnp, u, s, vt, w)

    got = per_device(tpus2, pw.grad(ours), x)
    want = np.asarray(jax.vmap(jax.grad(theirs))(x))
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    if shape[0] == shape[1]:  # square: full_matrices is the same decomposition
        got = per_device(tpus2, pw.grad(lambda a: loss(pnp, *pnp.linalg.svd(a), w)), x)
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("ord", [2, -2, "nuc"])
def test_norm_gradients_equal_jax(tpus2, jax64, ord):
    jax = jax64
    jnp = jax.numpy
    x = batch((2, 4, 3, 5)).astype(np.float32)
    got = per_device(tpus2, pw.grad(lambda a: pnp.linalg.norm(a, ord, axis=(0, 2)).sum()), x)
    want = np.asarray(jax.vmap(jax.grad(lambda a: jnp.linalg.norm(a, ord, axis=(0, 2)).sum()))(x))
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
    # The singular values alone of full_matrices=True (only s is needed, any shape).
    x = batch((3, 5))
    got = per_device(tpus2, pw.grad(lambda a: (pnp.linalg.svd(a)[1] ** 2).sum()), x)
    np.testing.assert_allclose(got, 2 * x, rtol=1e-12)  # d(sum s^2) = d|x|_F^2
    # A second derivative (through the rule's own ops).
    x2 = batch((3, 3))
    hv = per_device(tpus2, pw.grad(lambda a: pw.grad(lambda b: pnp.linalg.norm(b, "nuc"))(a)[0, 0]), x2)
    jhv = jax.vmap(jax.grad(lambda a: jax.grad(lambda b: jnp.linalg.norm(b, "nuc"))(a)[0, 0]))(x2)
    np.testing.assert_allclose(hv, np.asarray(jhv), rtol=1e-8, atol=1e-10)


def test_jvp_of_svd_equals_jax(tpus2, jax64):
    jax = jax64
    jnp = jax.numpy
    x, t = batch((4, 3)), batch((4, 3))
    w = RNG.standard_normal((6, 6))

    def ours(a):
        return loss(pnp, *pnp.linalg.svd(a, full_matrices=False), w)

    got = pw.pmap(lambda a, da: pw.jvp(ours, (a,), (da,))[1], devices=tpus2)(x, t)
    want = jax.vmap(lambda a, da: jax.jvp(lambda b: loss(jnp, *jnp.linalg.svd(b, full_matrices=False), w),
                                          (a,), (da,))[1])(x, t)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-10)


def assert_gradients_equal_jax(tpus, jax, f, a, entry):
    """pw.grad of `f(pnp, m)` per matrix of a's (devices, batch) equals jax.grad of
    `f(jax.numpy, m)`; and the second derivative of the gradient's `entry`, through the
    rules' own ops."""
    jnp = jax.numpy
    got = per_device(tpus, pw.grad(lambda m: f(pnp, m)), a)
    want = np.asarray(jax.vmap(jax.vmap(jax.grad(lambda m: f(jnp, m))))(a))
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-11)
    got2 = per_device(tpus, pw.grad(lambda m: pw.grad(lambda q: f(pnp, q))(m)[(..., *entry)].sum()), a)
    want2 = np.asarray(jax.vmap(jax.vmap(jax.grad(lambda m: jax.grad(lambda q: f(jnp, q))(m)[entry])))(a))
    np.testing.assert_allclose(got2, want2, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("name", ["solve", "inv", "det", "slogdet", "cond_fro"])
def test_lu_gradients_equal_jax(tpus2, jax64, name):
    jax = jax64
    jnp = jax.numpy
    a, b = well_conditioned((2, 4, 4)), batch((2, 4, 3))
    w = RNG.standard_normal((4, 4))
    fns = {
        "solve": lambda lib, m: (lib.linalg.solve(m, b[0, 0]) * w[:, :3]).sum(),
        "inv": lambda lib, m: (lib.linalg.inv(m) * w).sum(),
        "det": lambda lib, m: lib.linalg.det(m).sum(),
        "slogdet": lambda lib, m: lib.linalg.slogdet(m)[1].sum(),
        "cond_fro": lambda lib, m: lib.linalg.cond(m, "fro").sum(),
    }
    assert_gradients_equal_jax(tpus2, jax, fns[name], a, (0, 1))
    if name == "solve":  # and b's gradient
        got_b = per_device(tpus2, pw.grad(lambda m, r: (pnp.linalg.solve(m, r) * w[:, :3]).sum(),
                                          argnums=1), a, b)
        want_b = jax.vmap(jax.grad(lambda m, r: (jnp.linalg.solve(m, r) * w[:, :3]).sum(), argnums=1))(a, b)
        np.testing.assert_allclose(got_b, np.asarray(want_b), rtol=1e-10)


ERRORS = [
    (lambda a: pnp.linalg.svd(a[0]), ValueError,
     "svd: a must have at least two dimensions (a stack of matrices), got f64[4]"),
    (lambda a: pnp.linalg.svd(a, full_matrices=None), TypeError, "svd: full_matrices must be a bool, got None"),
    (lambda a: pnp.linalg.svd(a, compute_uv="no"), TypeError, "svd: compute_uv must be a bool"),
    (lambda a: pnp.linalg.svdvals(a[0, 0]), ValueError, "svdvals: x must have at least two dimensions"),
    (lambda a: pnp.linalg.cond(a, 3), ValueError, "cond: invalid norm order 3"),
    (lambda a: pnp.linalg.cond(a, "fro"), ValueError, "cond: x must be square matrices [..., n, n], got f64[3,4]"),
    (lambda a: pnp.linalg.cond(a[:, :0]), ValueError, "cond: x holds empty matrices (f64[3,0])"),
    (lambda a: pnp.linalg.solve(a, a), ValueError, "solve: a must be square matrices [..., n, n], got f64[3,4]"),
    (lambda a: pnp.linalg.solve(a[:, :3], a[0]), ValueError,
     "solve: b f64[4] does not fit a f64[3,3]: a vector needs 3 elements"),
    (lambda a: pnp.linalg.solve(a[:, :3], a[None, :2, :3]), ValueError,
     "solve: b f64[1,2,3] does not fit a f64[3,3]: b must be (n,) or (..., n, k) with n = 3"),
    (lambda a: pnp.linalg.solve(pnp.broadcast_to(a[:, :3], (2, 3, 3)), pnp.broadcast_to(a[:, :2], (3, 3, 2))),
     ValueError, "solve: the batch dims of a f64[2,3,3] and b f64[3,3,2] do not broadcast"),
    (lambda a: pnp.linalg.inv(a), ValueError, "inv: a must be square matrices"),
    (lambda a: pnp.linalg.det(a[0]), ValueError, "det: a must have at least two dimensions"),
    (lambda a: pnp.linalg.slogdet(a), ValueError, "slogdet: a must be square matrices"),
    (lambda a: np.linalg.matrix_power(a, 2), pw.TracerError, "pathways.numpy.linalg has no matrix_power"),
    (lambda a: pnp.linalg.pinv(a, rtol=0.1, rcond=0.1), ValueError, "pinv: only one of rtol and rcond may be given"),
    (lambda a: pnp.linalg.pinv(a, rtol=np.ones(3)), ValueError, "pinv: rtol f64[3] does not broadcast"),
    (lambda a: pnp.linalg.lstsq(a[None], a), ValueError, "lstsq: a must be a matrix (2-d), got f64[1,3,4]"),
    (lambda a: pnp.linalg.lstsq(a, a[:2]), ValueError, "lstsq: b must be (m,) or (m, k) with a's m = 3 rows"),
    (lambda a: pnp.linalg.lstsq(a, a, rcond=np.array([0.0, 0.0, 2.0])), ValueError,
     "lstsq: rcond must be a scalar, got f64[3]"),
    (lambda a: pnp.linalg.qr(a, "raw"), ValueError, "qr: mode must be 'reduced', 'complete' or 'r', got 'raw'"),
    (lambda a: pnp.linalg.eigh(a), ValueError, "eigh: a must be square matrices [..., n, n], got f64[3,4]"),
    (lambda a: pnp.linalg.eigh(a[:, :3], UPLO="X"), ValueError, "eigh: UPLO must be 'L' or 'U', got 'X'"),
    (lambda a: pnp.linalg.cholesky(a[:, :3], upper=None), TypeError, "cholesky: upper must be a bool"),
    (lambda a: pnp.linalg.eigvalsh(a[0]), ValueError, "eigvalsh: a must have at least two dimensions"),
    (lambda a: pnp.linalg.vector_norm(a, ord="fro"), ValueError, "vector_norm: invalid norm order 'fro'"),
    (lambda a: pnp.linalg.vector_norm(a, axis=(0, 0)), ValueError, "vector_norm: duplicate axes"),
    (lambda a: pnp.linalg.vector_norm(a, axis=(0, 5)), ValueError, "vector_norm: axis 5 is out of range"),
    (lambda a: pnp.linalg.matrix_norm(a, ord=3), ValueError, "matrix_norm: invalid norm order 3 for matrices"),
    (lambda a: pnp.linalg.matrix_rank(a, tol=0.1, rtol=0.1), ValueError,
     "matrix_rank: tol and rtol cannot both be given"),
    (lambda a: pnp.linalg.matrix_rank(pnp.broadcast_to(a, (2, 3, 4)), tol=np.ones(5)), ValueError,
     "matrix_rank: tol f64[5] does not broadcast against the matrices' batch dims (2,)"),
    (lambda a: pnp.linalg.matrix_rank(a, rtol=np.ones(2)), ValueError,
     "matrix_rank: rtol f64[2] does not broadcast against the matrices' batch dims ()"),
    (lambda a: pnp.linalg.cond(a[0]), ValueError, "cond: x must have at least two dimensions"),
    (lambda a: pw.grad(lambda b: pnp.linalg.svd(b)[0].sum())(a), NotImplementedError,
     "differentiation through u or vt of pathways.numpy.linalg.svd(full_matrices=True) of a "
     "non-square matrix"),
]


@pytest.mark.parametrize("fn, exc, message", ERRORS, ids=[m[:40] for _, _, m in ERRORS])
def test_bad_input_raises_a_clear_error_and_the_runtime_stays_usable(tpus2, fn, exc, message):
    x = batch((3, 4))
    with pytest.raises(exc, match=re.escape(message)):
        pw.pmap(fn, devices=tpus2)(x)
    np.testing.assert_allclose(per_device(tpus2, pnp.linalg.svdvals, x),
                               np.linalg.svd(x, compute_uv=False), rtol=1e-13)
