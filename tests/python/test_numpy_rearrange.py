"""pathways.numpy's split, array_split, hstack, vstack, tile, repeat, roll, pad;
tensordot, inner, outer, vdot, dot of any rank, einsum with '...' and
broadcasting; logaddexp. Against numpy per device (and JAX where the two
differ), over dtypes and edge shapes, with gradients against finite
differences.
"""

import re

import ml_dtypes
import numpy as np
import pytest

import pathways as pw
import pathways.numpy as pnp

DTYPES = [np.float32, np.float64, np.int32, np.bool_, np.uint32]


def random_input(rng, shape, dtype):
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if np.dtype(dtype).kind in "iu":
        return rng.integers(0 if dtype == np.uint32 else -20, 20, size=shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def per_device(devices, fn, *args):
    """`fn` under pmap, and numpy's `fn` on each device's slice, as lists of leaves."""
    got = pw.pmap(fn, devices=devices)(*args)
    want = [fn(*[a[i] for a in args]) for i in range(len(devices))]
    return got, want


def assert_matches(devices, fn, *args, rtol=1e-6):
    got, want = per_device(devices, fn, *args)
    got = got if isinstance(got, (list, tuple)) else [got]
    for i, w in enumerate(want):
        w = w if isinstance(w, (list, tuple)) else [w]
        assert len(got) == len(w)
        for g, wl in zip(got, w):
            g = np.asarray(g)[i]
            wl = np.asarray(wl)
            assert g.shape == wl.shape and g.dtype == wl.dtype, (g.shape, wl.shape, g.dtype, wl.dtype)
            if g.dtype.kind == "f":
                np.testing.assert_allclose(g, wl, rtol=rtol, atol=rtol)
            else:
                np.testing.assert_array_equal(g, wl)


# --- split, array_split, hstack, vstack -----------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("how, axis", [
    (3, 0), (2, 1), (1, -1), ([1, 3], 1), ([0, 0, 5], 1), ([-2], 0), ([4, 1], 1), ([10], 0),
    (np.array([2]), 1),
])
def test_split_like_numpy(tpus2, dtype, how, axis):
    x = random_input(np.random.default_rng(1), (2, 6, 4), dtype)
    assert_matches(tpus2, lambda a: pnp.split(a, how, axis=axis), x)


@pytest.mark.parametrize("sections, axis", [(4, 0), (3, 1), (7, 1), (1, 0)])
def test_array_split_unequal(tpus2, sections, axis):
    x = random_input(np.random.default_rng(2), (2, 6, 5), np.float32)
    assert_matches(tpus2, lambda a: pnp.array_split(a, sections, axis=axis), x)


def test_split_is_what_numpys_split_gives_inside_a_trace(tpus2):
    # np.split on a traced value comes here (numpy's protocol), as does a qkv split.
    x = random_input(np.random.default_rng(3), (2, 4, 12), np.float32)
    got = pw.pmap(lambda a: [t * 1 for t in np.split(a, 3, axis=-1)], devices=tpus2)(x)
    for g, w in zip(got, np.split(x, 3, axis=-1)):
        np.testing.assert_array_equal(np.asarray(g), w)


@pytest.mark.parametrize("shapes", [[(3,), (2,)], [(3, 2), (3, 4)], [(), (2,)], [(2, 3, 1), (2, 1, 1)]])
def test_hstack(tpus2, shapes):
    rng = np.random.default_rng(4)
    xs = [random_input(rng, (2,) + s, np.float64) for s in shapes]
    assert_matches(tpus2, lambda *a: pnp.hstack(a), *xs)


@pytest.mark.parametrize("shapes", [[(3,), (3,)], [(3,), (2, 3)], [(1, 2), (4, 2)], [(2, 2, 2), (1, 2, 2)]])
def test_vstack(tpus2, shapes):
    rng = np.random.default_rng(5)
    xs = [random_input(rng, (2,) + s, np.int32) for s in shapes]
    assert_matches(tpus2, lambda *a: pnp.vstack(a), *xs)


# --- tile, repeat, roll ------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape, reps", [
    ((3,), 2), ((3,), (2, 2)), ((2, 3), 3), ((2, 3), (1, 2)), ((2, 3), (2, 1, 2)), ((), 3), ((2, 3), 0),
    ((2, 1, 3), (2, 2)),
])
def test_tile_like_numpy(tpus2, dtype, shape, reps):
    x = random_input(np.random.default_rng(6), (2,) + shape, dtype)
    assert_matches(tpus2, lambda a: pnp.tile(a, reps), x)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("repeats, axis", [
    (2, None), (3, 0), (2, 1), (0, 1), ([1, 0, 2], 0), ([2], 1), (np.array([0, 1, 2, 3]), -1),
])
def test_repeat_like_numpy(tpus2, dtype, repeats, axis):
    x = random_input(np.random.default_rng(7), (2, 3, 4), dtype)
    assert_matches(tpus2, lambda a: pnp.repeat(a, repeats, axis=axis), x)
    if isinstance(repeats, int):
        assert_matches(tpus2, lambda a: a.repeat(repeats, axis=axis), x)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shift, axis", [
    (1, None), (-7, None), (2, 0), (5, 1), (-1, -1), ((1, 2), (0, 1)), ((1, 1), 1), (3, (0, 1)), (0, 1),
])
def test_roll_like_numpy(tpus2, dtype, shift, axis):
    x = random_input(np.random.default_rng(8), (2, 3, 4), dtype)
    assert_matches(tpus2, lambda a: pnp.roll(a, shift, axis=axis), x)


def test_roll_of_an_empty_axis(tpus2):
    x = np.zeros((2, 0, 3), np.float32)
    assert_matches(tpus2, lambda a: pnp.roll(a, 2, axis=0), x)


# --- pad -----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES + [ml_dtypes.bfloat16])
@pytest.mark.parametrize("mode", ["constant", "edge", "reflect", "symmetric", "wrap"])
@pytest.mark.parametrize("width", [1, (0, 2), ((2, 1), (0, 0)), ((7, 5), (3, 0))])
def test_pad_like_numpy(tpus2, dtype, mode, width):
    x = random_input(np.random.default_rng(9), (2, 3, 4), np.float32).astype(dtype) if dtype == ml_dtypes.bfloat16 \
        else random_input(np.random.default_rng(9), (2, 3, 4), dtype)
    assert_matches(tpus2, lambda a: pnp.pad(a, width, mode=mode), x)


@pytest.mark.parametrize("values", [2.5, (1, -1), ((1, 2), (3, 4))])
def test_pad_constant_values(tpus2, values):
    x = random_input(np.random.default_rng(10), (2, 2, 3), np.float32)
    assert_matches(tpus2, lambda a: pnp.pad(a, ((1, 1), (2, 0)), constant_values=values), x)
    xi = random_input(np.random.default_rng(10), (2, 2, 3), np.int32)
    assert_matches(tpus2, lambda a: pnp.pad(a, 1, constant_values=values), xi)


def test_pad_of_a_scalar_and_of_an_empty_axis(tpus2):
    assert_matches(tpus2, lambda a: pnp.pad(a, 2), np.ones(2, np.float32))
    assert_matches(tpus2, lambda a: pnp.pad(a, 1), np.zeros((2, 0, 2), np.float32))


# --- tensordot, inner, outer, vdot, dot ------------------------------------------------


@pytest.mark.parametrize("sa, sb, axes", [
    ((3, 4), (4, 5), 1), ((2, 3, 4), (3, 4, 5), 2), ((3, 4), (3, 4), 2), ((3,), (4,), 0),
    ((2, 3, 4), (4, 2), ([0, 2], [1, 0])), ((2, 3), (3, 2), (1, 0)), ((2, 3, 4), (4, 3), ((-1, 1), (0, -1))),
])
@pytest.mark.parametrize("dtype", [np.float64, np.int32])
def test_tensordot_like_numpy(tpus2, sa, sb, axes, dtype):
    rng = np.random.default_rng(11)
    a, b = random_input(rng, (2,) + sa, dtype), random_input(rng, (2,) + sb, dtype)
    assert_matches(tpus2, lambda x, y: pnp.tensordot(x, y, axes), a, b, rtol=1e-12)


@pytest.mark.parametrize("sa, sb", [
    ((3,), (3,)), ((2, 3), (3,)), ((3,), (3, 2)), ((2, 3), (3, 4)), ((2, 2, 3), (3,)), ((3,), (2, 3, 2)),
    ((2, 2, 3), (4, 3, 2)), ((2, 3), (2, 3, 2)), ((), (2, 3)),
])
def test_dot_of_any_rank_like_numpy(tpus2, sa, sb):
    rng = np.random.default_rng(12)
    a, b = random_input(rng, (2,) + sa, np.float64), random_input(rng, (2,) + sb, np.float64)
    assert_matches(tpus2, lambda x, y: pnp.dot(x, y), a, b, rtol=1e-12)
    assert_matches(tpus2, lambda x, y: np.dot(x, y), a, b, rtol=1e-12)


@pytest.mark.parametrize("sa, sb", [((3,), (3,)), ((2, 3), (4, 3)), ((2, 2, 3), (3,)), ((), (2, 3))])
def test_inner_like_numpy(tpus2, sa, sb):
    rng = np.random.default_rng(13)
    a, b = random_input(rng, (2,) + sa, np.float64), random_input(rng, (2,) + sb, np.float64)
    assert_matches(tpus2, lambda x, y: pnp.inner(x, y), a, b, rtol=1e-12)


@pytest.mark.parametrize("sa, sb", [((3,), (4,)), ((2, 3), (2,)), ((), (3,))])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.bool_])
def test_outer_and_vdot_like_numpy(tpus2, sa, sb, dtype):
    rng = np.random.default_rng(14)
    a, b = random_input(rng, (2,) + sa, dtype), random_input(rng, (2,) + sb, dtype)
    assert_matches(tpus2, lambda x, y: pnp.outer(x, y), a, b)
    if dtype != np.bool_:
        assert_matches(tpus2, lambda x, y: pnp.vdot(x, x), a, a, rtol=1e-5)


# --- einsum with '...' and broadcasting ---------------------------------------------------


ELLIPSIS = [
    ("...ij,...jk->...ik", [(2, 3, 4), (2, 4, 5)]),
    ("...ij,...jk->...ik", [(5, 1, 3, 4), (2, 4, 5)]),
    ("...ij,...jk", [(2, 3, 4), (4, 5)]),
    ("...qhd,...khd->...hqk", [(2, 3, 2, 4), (2, 5, 2, 4)]),
    ("i...->...", [(3, 2, 4)]),
    ("...", [(2, 3)]),
    ("...i,i->...", [(2, 3, 4), (4,)]),
    ("ij...,jk...->ik...", [(2, 3, 4), (3, 5, 4)]),
    ("ij,j->i", [(2, 3), (1,)]),
    ("ij,ij->ij", [(2, 1), (1, 3)]),
    ("...ii->...i", [(2, 3, 3)]),
]


@pytest.mark.parametrize("spec, shapes", ELLIPSIS, ids=[e[0] for e in ELLIPSIS])
def test_einsum_ellipsis_and_broadcasting_like_numpy(tpus2, spec, shapes):
    rng = np.random.default_rng(15)
    args = [random_input(rng, (2,) + s, np.float64) for s in shapes]
    assert_matches(tpus2, lambda *xs: pnp.einsum(spec, *xs), *args, rtol=1e-12)


def test_einsum_sums_the_dimensions_of_ellipsis_left_out_as_jax():
    jnp = pytest.importorskip("jax.numpy")
    tpus = pw.make_virtual_device_set().add_slice(tpu_devices=2).tpus
    x = random_input(np.random.default_rng(16), (2, 3, 4, 5), np.float32)
    got = np.asarray(pw.pmap(lambda a: pnp.einsum("...i->i", a), devices=tpus)(x))
    for k in range(2):
        np.testing.assert_allclose(got[k], np.asarray(jnp.einsum("...i->i", x[k])), rtol=1e-5)


# --- logaddexp ------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:invalid value encountered in logaddexp")
def test_logaddexp_like_numpy_at_the_edges(tpus2):
    inf, nan = np.inf, np.nan
    a = np.array([0.0, 1.0, -1000.0, 1000.0, inf, -inf, inf, -inf, nan, 3.0, 0.5])
    b = np.array([0.0, 2.0, -1000.0, 999.0, inf, -inf, -inf, 2.0, 1.0, nan, -0.5])
    for dtype in (np.float32, np.float64):
        x = np.stack([a, b]).astype(dtype)
        y = np.stack([b, a]).astype(dtype)
        assert_matches(tpus2, lambda p, q: pnp.logaddexp(p, q), x, y, rtol=1e-6)
    assert_matches(tpus2, lambda p: np.logaddexp(p, 1.0), np.stack([a, b]))
    ints = np.array([[1, 2, 3], [0, -5, 7]], np.int32)
    assert_matches(tpus2, lambda p: pnp.logaddexp(p, p), ints, rtol=1e-12)
    bf = np.stack([a, b]).astype(ml_dtypes.bfloat16)
    got = np.asarray(pw.pmap(lambda p: pnp.logaddexp(p, p), devices=tpus2)(bf))
    assert got.dtype == ml_dtypes.bfloat16


# --- Gradients --------------------------------------------------------------------------


GRADS = [
    ("split", lambda a: sum((t * (k + 1)).sum() for k, t in enumerate(pnp.split(a, [1, 3], axis=1)))),
    ("tile", lambda a: (pnp.tile(a, (2, 3)) ** 2).sum()),
    ("repeat", lambda a: (pnp.repeat(a, [1, 0, 3], axis=0) ** 3).sum()),
    ("roll", lambda a: (pnp.roll(a, (1, -2), (0, 1)) * pnp.arange(12.0).reshape(3, 4)).sum()),
    ("pad-reflect", lambda a: (pnp.pad(a, ((2, 3), (1, 4)), mode="reflect") ** 2).sum()),
    ("pad-constant", lambda a: (pnp.pad(a, 2, constant_values=1.5) ** 2).sum()),
    ("tensordot", lambda a: pnp.tensordot(a, a + 1.0, axes=([0], [0])).sum() ** 2),
    ("einsum-ellipsis", lambda a: pnp.einsum("...j,...j->...", a, pnp.sin(a)).sum()),
    ("logaddexp", lambda a: pnp.logaddexp(a, 2 * a - 1).sum()),
]


@pytest.mark.parametrize("name, f", GRADS, ids=[g[0] for g in GRADS])
def test_gradients_against_finite_differences(tpus2, name, f):
    x = np.random.default_rng(17).standard_normal((3, 4))
    g = np.asarray(pw.pmap(pw.grad(f), devices=tpus2)(np.stack([x, x])))[0]
    fd = np.zeros_like(x)
    eps = 1e-6
    for i in np.ndindex(x.shape):
        d = np.zeros_like(x)
        d[i] = eps
        fd[i] = (f(x + d) - f(x - d)) / (2 * eps)
    np.testing.assert_allclose(g, fd, rtol=1e-5, atol=1e-6)


def test_logaddexp_gradient_at_a_tie_is_one_half_each(tpus2):
    x = np.zeros((2, 3))
    ga, gb = pw.pmap(pw.grad(lambda a, b: pnp.logaddexp(a, b).sum(), argnums=(0, 1)), devices=tpus2)(x, x)
    np.testing.assert_array_equal(np.asarray(ga), 0.5)
    np.testing.assert_array_equal(np.asarray(gb), 0.5)


EDGES = [
    ("roll by an array", lambda a: pnp.roll(a, np.array([1, 2]), (0, 1))),
    ("roll by a tuple, flattened", lambda a: pnp.roll(a, (1, 2))),
    ("tile by an array", lambda a: pnp.tile(a, np.array([2, 1]))),
    ("tensordot axes as an array", lambda a: pnp.tensordot(a, a, np.array([[0], [0]]))),
    ("repeat of a scalar", lambda a: pnp.repeat(a[0, 0], 3, axis=0)),
    ("repeat of nothing", lambda a: pnp.repeat(a[:0, 0], [])),
    ("repeat True times", lambda a: pnp.repeat(a, True, axis=0)),
    ("pad with a traced value", lambda a: pnp.pad(a, 1, constant_values=a[0, 1])),
    ("np.linalg.matmul", lambda a: np.linalg.matmul(a, a.T)),
    ("np.linalg.outer", lambda a: np.linalg.outer(a[0], a[1])),
]


@pytest.mark.parametrize("name, fn", EDGES, ids=[e[0] for e in EDGES])
def test_edges_like_numpy(tpus2, name, fn):
    x = np.stack([np.arange(12.0).reshape(3, 4)] * 2)
    assert_matches(tpus2, fn, x)


REFUSED = [
    (lambda a: pnp.repeat(a, [1, a[0, 0].astype(np.int32), 1], axis=0), TypeError,
     "repeat: repeats must be known when tracing"),
    (lambda a: pnp.diff(a, prepend=a[0]), ValueError,
     "diff: prepend f64[4] must be a scalar or have the shape of a (f64[3,4]) but along axis 1"),
    (lambda a: pnp.pad(a, 1, constant_values=a[0]), TypeError,
     "pad: a traced constant_values must be a scalar, got f64[4]"),
]


@pytest.mark.parametrize("body, exc, message", REFUSED, ids=[e[2][:40] for e in REFUSED])
def test_refused_with_the_parameter_named(tpus2, runtime_ok, body, exc, message):
    with pytest.raises(exc, match=re.escape(message)):
        pw.pmap(body, devices=tpus2)(np.zeros((2, 3, 4)))
    runtime_ok()
