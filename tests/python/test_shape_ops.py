"""Shape ops, indexing, gathers, matmul/einsum and the all_to_all / psum_scatter
collectives inside pw.pmap, checked against numpy (random shapes and values,
and property-based cases with hypothesis)."""

import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pathways as pw
import pathways.numpy as pnp

from conftest import get_devices

DTYPES = [np.float32, np.float64, np.int32, np.bool_]




def random_input(rng, shape, dtype):
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if dtype == np.int32:
        return rng.integers(-20, 20, size=shape).astype(np.int32)
    return rng.standard_normal(shape).astype(dtype)


def run_and_compare(devices, fn, *args, ref=None, rtol=1e-6):
    """Runs `fn` under pmap and compares with numpy's `ref` (default `fn`) per device."""
    got = np.asarray(pw.pmap(fn, devices=devices)(*args))
    ref = fn if ref is None else ref
    want = np.stack([np.asarray(ref(*[a[i] for a in args])) for i in range(len(devices))])
    assert got.shape == want.shape, (got.shape, want.shape)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    if got.dtype.kind == "f":
        np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol)
    else:
        np.testing.assert_array_equal(got, want)
    return got


# --- Shapes -----------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", range(4))
def test_reshape_transpose_swapaxes(tpus2, dtype, seed):
    rng = np.random.default_rng(seed)
    shape = tuple(int(d) for d in rng.integers(1, 5, size=rng.integers(1, 5)))
    x = random_input(rng, (2,) + shape, dtype)
    perm = [int(a) for a in rng.permutation(len(shape))]
    run_and_compare(tpus2, lambda a: a.reshape(-1), x)
    run_and_compare(tpus2, lambda a: pnp.reshape(a, (shape[0], -1)), x)
    run_and_compare(tpus2, lambda a: a.transpose(perm), x)
    run_and_compare(tpus2, lambda a: pnp.transpose(a), x)
    run_and_compare(tpus2, lambda a: a.T, x)
    run_and_compare(tpus2, lambda a: pnp.swapaxes(a, 0, -1), x)
    run_and_compare(tpus2, lambda a: pnp.moveaxis(a, 0, -1), x)
    run_and_compare(tpus2, lambda a: a.ravel(), x)


@pytest.mark.parametrize("dtype", DTYPES)
def test_broadcast_expand_squeeze(tpus2, dtype):
    rng = np.random.default_rng(1)
    x = random_input(rng, (2, 3, 1, 4), dtype)
    run_and_compare(tpus2, lambda a: pnp.broadcast_to(a, (2, 3, 5, 4)), x)
    run_and_compare(tpus2, lambda a: pnp.broadcast_to(a[:, 0, :1], (6, 3, 1)), x)
    run_and_compare(tpus2, lambda a: pnp.expand_dims(a, (0, -1)), x)
    run_and_compare(tpus2, lambda a: pnp.squeeze(a), x)
    run_and_compare(tpus2, lambda a: pnp.squeeze(a, 1), x)
    run_and_compare(tpus2, lambda a: a.squeeze(axis=-2), x)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concatenate_and_stack(tpus2, axis):
    rng = np.random.default_rng(2)
    x = random_input(rng, (2, 3, 4), np.float32)
    y = random_input(rng, (2, 3, 4), np.int32)
    run_and_compare(tpus2, lambda a, b: pnp.concatenate([a, b, a], axis=axis), x, y)
    run_and_compare(tpus2, lambda a, b: pnp.stack([a, b], axis=axis), x, y)
    c = rng.standard_normal((3, 4))  # a captured float64 constant promotes the result
    run_and_compare(
        tpus2,
        lambda a: pnp.concatenate([a, c], axis=axis),
        x,
        ref=lambda a: np.concatenate([a, c], axis=axis),
    )


def test_flip(tpus2):
    x = random_input(np.random.default_rng(3), (2, 3, 4, 2), np.float64)
    run_and_compare(tpus2, lambda a: pnp.flip(a), x)
    run_and_compare(tpus2, lambda a: pnp.flip(a, 1), x)
    run_and_compare(tpus2, lambda a: pnp.flip(a, (0, -1)), x)


INDEXES = [
    (1,),
    (-1,),
    (slice(1, None),),
    (slice(None, None, -1),),
    (slice(None, None, 2), 0),
    (slice(3, 0, -2), slice(None), -2),
    (Ellipsis, 1),
    (None, 0, Ellipsis, None),
    (1, None, slice(None, 2)),
    (slice(5, 1),),  # empty
    (np.array([2, 0, 2, 1]),),
    (slice(None), np.array([[1, 0], [-1, 2]])),
    (0, np.array([3, 3]), slice(None, None, -1)),
    ([1, 1],),
]


@pytest.mark.parametrize("index", INDEXES, ids=[str(i) for i in range(len(INDEXES))])
def test_static_indexing(tpus2, index):
    x = random_input(np.random.default_rng(4), (2, 4, 5, 3), np.float32)
    run_and_compare(tpus2, lambda a: a[index], x)


def test_iteration_unpacks_the_leading_axis(tpus2):
    x = random_input(np.random.default_rng(5), (2, 3, 2), np.float32)
    run_and_compare(tpus2, lambda a: pnp.stack([r * (i + 1) for i, r in enumerate(a)]),
                    x, ref=lambda a: np.stack([r * (i + 1) for i, r in enumerate(a)]))


# --- Gathers ----------------------------------------------------------------


@pytest.mark.parametrize("axis", [0, 1, 2, -1, None])
@pytest.mark.parametrize("dtype", DTYPES)
def test_take_with_constant_and_traced_indices(tpus2, axis, dtype):
    rng = np.random.default_rng(6)
    x = random_input(rng, (2, 4, 3, 5), dtype)
    n = x[0].size if axis is None else x.shape[1:][axis]
    idx = rng.integers(0, n, size=(2, 3, 2)).astype(np.int32)
    run_and_compare(tpus2, lambda a, i: pnp.take(a, i, axis=axis), x, idx)
    run_and_compare(tpus2, lambda a: a.take(idx[0], axis=axis), x,
                    ref=lambda a: np.take(a, idx[0], axis=axis))


def test_traced_indices_with_mode_clip_are_clipped(tpus2):
    x = np.arange(2 * 5, dtype=np.float32).reshape(2, 5)
    idx = np.array([[-3, 0, 4, 9], [7, 2, -1, 1]], dtype=np.int32)
    got = np.asarray(pw.pmap(lambda a, i: pnp.take(a, i, mode="clip"), devices=tpus2)(x, idx))
    want = np.stack([np.take(x[d], idx[d], mode="clip") for d in range(2)])
    np.testing.assert_array_equal(got, want)


def test_embedding_lookup_from_a_captured_table(tpus2):
    rng = np.random.default_rng(7)
    table = rng.standard_normal((10, 4)).astype(np.float32)
    tokens = rng.integers(0, 10, size=(2, 6)).astype(np.int32)
    run_and_compare(tpus2, lambda t: pnp.take(table, t, axis=0), tokens, ref=lambda t: table[t])


# --- matmul / dot / einsum ----------------------------------------------------

MATMUL_SHAPES = [
    ((3, 4), (4, 5)),
    ((1, 1), (1, 1)),
    ((2, 3, 4), (4, 2)),
    ((4,), (4, 3)),
    ((3, 4), (4,)),
    ((4,), (4,)),
    ((2, 1, 3, 4), (5, 4, 2)),
    ((3, 0), (0, 2)),
    ((17, 33), (33, 9)),
]


@pytest.mark.parametrize("shapes", MATMUL_SHAPES, ids=[str(s) for s in MATMUL_SHAPES])
@pytest.mark.parametrize("dtype", DTYPES)
def test_matmul_against_numpy(tpus2, shapes, dtype):
    rng = np.random.default_rng(8)
    a = random_input(rng, (2,) + shapes[0], dtype)
    b = random_input(rng, (2,) + shapes[1], dtype)
    rtol = 1e-5 if dtype == np.float32 else 1e-12
    run_and_compare(tpus2, lambda x, y: x @ y, a, b, rtol=rtol)
    run_and_compare(tpus2, lambda x, y: pnp.matmul(x, y), a, b, rtol=rtol)


def test_matmul_promotes_and_takes_constants(tpus2):
    rng = np.random.default_rng(9)
    a = random_input(rng, (2, 3, 4), np.int32)
    w = rng.standard_normal((4, 2)).astype(np.float32)
    run_and_compare(tpus2, lambda x: x @ w, a, ref=lambda x: x @ w, rtol=1e-5)
    run_and_compare(tpus2, lambda x: w.T @ x.T, a, ref=lambda x: w.T @ x.T, rtol=1e-5)
    run_and_compare(tpus2, lambda x: pnp.dot(x, w), a, ref=lambda x: np.dot(x, w), rtol=1e-5)


EINSUMS = [
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("ij,kj", [(3, 4), (5, 4)]),
    ("i,j->ij", [(3,), (4,)]),
    ("ij,ij->", [(3, 4), (3, 4)]),
    ("ijk->kij", [(2, 3, 4)]),
    ("ijk->j", [(2, 3, 4)]),
    ("bhqd,bhkd->bhqk", [(2, 2, 3, 4), (2, 2, 5, 4)]),
    ("ab,bc,cd->ad", [(2, 3), (3, 4), (4, 2)]),
    ("ab,cb->", [(2, 3), (4, 3)]),
]


@pytest.mark.parametrize("spec, shapes", EINSUMS, ids=[e[0] for e in EINSUMS])
def test_einsum_against_numpy(tpus2, spec, shapes):
    rng = np.random.default_rng(10)
    args = [random_input(rng, (2,) + s, np.float64) for s in shapes]
    run_and_compare(tpus2, lambda *xs: pnp.einsum(spec, *xs), *args, rtol=1e-12)


def test_zeros_and_ones_like(tpus2):
    x = random_input(np.random.default_rng(11), (2, 3), np.int32)
    run_and_compare(tpus2, lambda a: pnp.zeros_like(a), x)
    run_and_compare(tpus2, lambda a: pnp.ones_like(a, dtype=np.float32), x)


# --- Elementwise and statistical composites ------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
def test_square_sign_clip_var_std(tpus2, dtype):
    rng = np.random.default_rng(15)
    x = random_input(rng, (2, 3, 4), dtype)
    if dtype != np.int32:
        x[0, 0, 0] = np.nan
        x[1, 1, 1] = 0.0
    run_and_compare(tpus2, lambda a: pnp.square(a), x)
    run_and_compare(tpus2, lambda a: pnp.sign(a), x)
    run_and_compare(tpus2, lambda a: pnp.clip(a, -1, 2), x)
    run_and_compare(tpus2, lambda a: a.clip(None, 0), x)
    run_and_compare(tpus2, lambda a: a.var(axis=1), x, rtol=1e-5)
    run_and_compare(tpus2, lambda a: pnp.std(a, axis=-1, keepdims=True), x, rtol=1e-5)
    run_and_compare(tpus2, lambda a: a.std(), x, rtol=1e-5)


def test_composite_gradients(tpus2):
    x = np.random.default_rng(16).standard_normal((2, 3, 4))
    f = lambda a: (pnp.clip(a, -0.5, 0.7) * 2 + pnp.std(a, axis=1, keepdims=True) * a  # noqa: E731
                   + pnp.square(a) * pnp.sign(a)).sum()
    got = np.asarray(pw.pmap(pw.grad(f), devices=tpus2)(x))

    def ref(a):
        return (np.clip(a, -0.5, 0.7) * 2 + np.std(a, axis=1, keepdims=True) * a
                + np.square(a) * np.sign(a)).sum()

    eps = 1e-6
    want = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        d = np.zeros_like(x)
        d[i] = eps
        want[i] = (ref((x + d)[i[0]]) - ref((x - d)[i[0]])) / (2 * eps)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_sign_of_bool_and_clip_without_bounds_are_errors(tpus2, runtime_ok):
    with pytest.raises(TypeError, match=re.escape("sign: operand must be numeric, got pred[3]")):
        pw.pmap(lambda a: pnp.sign(a > 0), devices=tpus2)(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="clip: at least one of a_min and a_max must be given"):
        pw.pmap(lambda a: pnp.clip(a), devices=tpus2)(np.zeros((2, 3)))
    runtime_ok()


# --- all_to_all and psum_scatter ----------------------------------------------


def all_to_all_ref(x, split_axis, concat_axis):
    """JAX semantics over the leading (device) axis of x."""
    n = x.shape[0]
    chunks = [np.split(x[s], n, axis=split_axis) for s in range(n)]
    return np.stack(
        [np.concatenate([chunks[s][d] for s in range(n)], axis=concat_axis) for d in range(n)]
    )


@pytest.mark.parametrize("split_axis, concat_axis", [(0, 0), (0, 1), (1, 0), (-1, 1), (2, 2)])
@pytest.mark.parametrize("ndev", [2, 4])
def test_all_to_all_tiled(split_axis, concat_axis, ndev):
    rng = np.random.default_rng(12)
    x = random_input(rng, (ndev, 4, 8, 4), np.float32)
    f = pw.pmap(lambda a: pw.all_to_all(a, "i", split_axis, concat_axis, tiled=True),
                devices=get_devices(ndev), axis_name="i")
    got = np.asarray(f(x))
    np.testing.assert_array_equal(got, all_to_all_ref(x, split_axis, concat_axis))


def untiled_all_to_all_ref(x, split_axis, concat_axis):
    """jax.lax.all_to_all's default (tiled=False): the split axis, of the
    device count, is dropped; a new axis at concat_axis (a position in the
    result) holds what each device sent."""
    n = x.shape[0]
    return np.stack([np.stack([np.take(x[s], d, axis=split_axis) for s in range(n)],
                              axis=concat_axis) for d in range(n)])


@pytest.mark.parametrize("split_axis, concat_axis",
                         [(0, 0), (0, 1), (0, 2), (2, 0), (2, 1), (2, 2), (-1, -1), (0, -3)])
@pytest.mark.parametrize("ndev", [2, 4])
def test_all_to_all_untiled_by_default(split_axis, concat_axis, ndev):
    rng = np.random.default_rng(14)
    x = random_input(rng, (ndev, ndev, 3, ndev), np.float32)
    f = pw.pmap(lambda a: pw.all_to_all(a, "i", split_axis, concat_axis),
                devices=get_devices(ndev), axis_name="i")
    got = np.asarray(f(x))
    want = untiled_all_to_all_ref(x, split_axis, concat_axis)
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("ndev", [2, 4])
def test_tiled_all_gather_and_psum_scatter(axis, ndev):
    rng = np.random.default_rng(15)
    x = random_input(rng, (ndev, 2 * ndev, 3), np.float64)
    f = pw.pmap(lambda a: (pw.all_gather(a, "i", axis=axis, tiled=True),
                           pw.psum_scatter(a, ("i",), scatter_dimension=0, tiled=True)),
                devices=get_devices(ndev), axis_name="i")
    gathered, scattered = (np.asarray(o) for o in f(x))
    np.testing.assert_array_equal(
        gathered, np.broadcast_to(np.concatenate(list(x), axis=axis), gathered.shape))
    assert gathered.shape == (ndev,) + tuple(
        d * ndev if i == axis % 2 else d for i, d in enumerate(x.shape[1:]))
    blocks = x.sum(axis=0).reshape(ndev, 2, 3)
    np.testing.assert_allclose(scattered, blocks, rtol=1e-12)


@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("ndev", [2, 4])
def test_psum_scatter(dim, ndev):
    rng = np.random.default_rng(13)
    shape = [3, 2, 5]
    shape[dim] = ndev
    x = random_input(rng, (ndev,) + tuple(shape), np.float64)
    f = pw.pmap(lambda a: pw.psum_scatter(a, "i", dim), devices=get_devices(ndev), axis_name="i")
    total = x.sum(axis=0)
    want = np.stack([np.take(total, d, axis=dim) for d in range(ndev)])
    np.testing.assert_allclose(np.asarray(f(x)), want, rtol=1e-12)


def test_psum_scatter_of_all_gather_is_n_times_identity(tpus4):
    x = random_input(np.random.default_rng(14), (4, 3), np.int32)
    f = pw.pmap(lambda a: pw.psum_scatter(pw.all_gather(a, "i", axis=1), "i", 1),
                devices=tpus4, axis_name="i")
    np.testing.assert_array_equal(np.asarray(f(x)), 4 * x)


# --- Property-based (hypothesis) ---------------------------------------------

_shapes = st.lists(st.integers(1, 4), min_size=1, max_size=4).map(tuple)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shape=_shapes, data=st.data())
def test_property_slicing_matches_numpy(tpus2, shape, data):
    index = tuple(
        data.draw(
            st.one_of(
                st.integers(-d, d - 1),
                st.builds(slice, st.none() | st.integers(-d - 1, d + 1),
                          st.none() | st.integers(-d - 1, d + 1),
                          st.none() | st.integers(-3, 3).filter(lambda s: s != 0)),
            )
        )
        for d in shape
    )
    x = np.arange(2 * int(np.prod(shape)), dtype=np.float32).reshape((2,) + shape)
    run_and_compare(tpus2, lambda a: a[index], x)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shape=_shapes, data=st.data())
def test_property_transpose_reshape_roundtrip(tpus2, shape, data):
    perm = data.draw(st.permutations(range(len(shape))))
    inverse = list(np.argsort(perm))
    x = np.arange(2 * int(np.prod(shape)), dtype=np.int32).reshape((2,) + shape)
    got = run_and_compare(tpus2, lambda a: a.transpose(perm).reshape(-1), x)
    back = np.asarray(
        pw.pmap(lambda a: a.reshape([shape[p] for p in perm]).transpose(inverse),
                devices=tpus2)(got)
    )
    np.testing.assert_array_equal(back, x)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(m=st.integers(1, 9), k=st.integers(0, 9), n=st.integers(1, 9),
       batch=st.lists(st.integers(1, 3), max_size=2).map(tuple))
def test_property_matmul_matches_numpy(tpus2, m, k, n, batch):
    rng = np.random.default_rng(m * 100 + k * 10 + n)
    a = random_input(rng, (2,) + batch + (m, k), np.float64)
    b = random_input(rng, (2, k, n), np.float64)
    run_and_compare(tpus2, lambda x, y: x @ y, a, b, rtol=1e-12)


# --- Trace-time errors ---------------------------------------------------------

ERRORS = [
    (lambda a: a.reshape(5, 7), ValueError, "reshape: cannot reshape array of shape (3, 4) into shape (5, 7)"),
    (lambda a: a.reshape(-1, -1), ValueError, "reshape: invalid shape (-1, -1)"),
    (lambda a: pnp.broadcast_to(a, (4, 3)), ValueError, "broadcast_to: cannot broadcast f32[3,4] to shape (4, 3)"),
    (lambda a: a.transpose(0, 0), ValueError, "transpose: axes (0, 0) are not a permutation of the 2 dimensions of f32[3,4]"),
    (lambda a: pnp.concatenate([a, a.T]), ValueError, "concatenate: f32[3,4] and f32[4,3] do not match off axis 0"),
    (lambda a: pnp.concatenate([a, a], axis=2), ValueError, "concatenate: axis 2 is out of range for f32[3,4]"),
    (lambda a: pnp.stack([a, a[0]]), ValueError, "stack: all input arrays must have the same shape, got f32[3,4], f32[4]"),
    (lambda a: pnp.squeeze(a, 0), ValueError, "squeeze: cannot select an axis to squeeze out which has size not equal to one (axis 0 of f32[3,4])"),
    (lambda a: a[3], IndexError, "index 3 is out of bounds for axis 0 with size 3"),
    (lambda a: a[0, 0, 0], IndexError, "too many indices for traced value f32[3,4]: 3 indices for 2 dimensions"),
    (lambda a: a[a > 0], IndexError, "indexing f32[3,4] with a boolean mask: the result's shape would depend on the data"),
    (lambda a: a["x"], IndexError, "only integers, slices, None, '...' and integer arrays are valid indices"),
    (lambda a: pnp.take(a, np.array([0.5])), TypeError, "take: indices must be integers, got dtype float64"),
    (lambda a: pnp.take(a, np.array([12])), IndexError, "take: index 12 is out of bounds for axis with size 12"),
    (lambda a: pnp.take(a, a, axis=0), TypeError, "take: indices must be int32, got f32[3,4]"),
    (lambda a: a @ a, ValueError, "matmul: incompatible shapes f32[3,4] and f32[3,4] (contracting dimension 4 != 3)"),
    (lambda a: a[0, 0] @ a, ValueError, "matmul: operands must not be scalars, got f32[] and f32[3,4]"),
    (lambda a: pnp.einsum("ij,jk", a, a), ValueError, "einsum: dimension 'j' has size 4 in one operand and 3 in another"),
    (lambda a: pnp.einsum("ijk", a), ValueError, "einsum: subscripts 'ijk' do not match operand f32[3,4]"),
    (lambda a: pnp.einsum("..i", a), ValueError, "einsum: invalid subscripts '..i' in '..i'"),
    (lambda a: pnp.einsum("...ijk", a), ValueError, "einsum: subscripts '...ijk' do not match operand f32[3,4]"),
    (lambda a: pnp.einsum("ij,jk", a, a[:2]), ValueError, "einsum: dimension 'j' has size 4 in one operand and 2 in another"),
    (lambda a: pnp.split(a, 2), ValueError, "split: array split does not result in an equal division (3 along axis 0 into 2 sections)"),
    (lambda a: pnp.split(a, 0), ValueError, "split: number of sections must be larger than 0, got 0"),
    (lambda a: pnp.split(a, 1.5), TypeError, "split: indices_or_sections must be an int, got 1.5"),
    (lambda a: pnp.split(a, [1, a]), TypeError, "split: indices_or_sections"),
    (lambda a: pnp.tile(a, (2, -1)), ValueError, "tile: reps must not be negative, got (2, -1)"),
    (lambda a: pnp.repeat(a, [1, 2], axis=1), ValueError, "repeat: repeats has 2 entries for an axis of length 4 (axis 1 of f32[3,4])"),
    (lambda a: pnp.repeat(a, -1), ValueError, "repeat: repeats may not contain negative values, got -1"),
    (lambda a: pnp.repeat(a, a.astype(np.int32)), TypeError, "repeat: repeats must be known when tracing"),
    (lambda a: pnp.roll(a, (1, 2), axis=(0, 1, 1)), ValueError, "roll: shift (1, 2) and axis (0, 1, 1) have lengths that do not broadcast"),
    (lambda a: pnp.roll(a, 1, axis=2), ValueError, "roll: axis 2 is out of range for shape (3, 4) (rank 2)"),
    (lambda a: pnp.pad(a, -1), ValueError, "pad: pad_width must not be negative, got -1"),
    (lambda a: pnp.pad(a, 1.5), TypeError, "pad: pad_width must be integers, got 1.5"),
    (lambda a: pnp.pad(a, ((1, 2), (1, 2), (1, 2))), ValueError, "pad: pad_width must be a scalar, a (before, after) pair, or one pair per axis (2 axes), got ((1, 2), (1, 2), (1, 2))"),
    (lambda a: pnp.pad(a, 1, constant_values="x"), TypeError, "pad: constant_values must be numbers, got 'x'"),
    (lambda a: pnp.pad(a, 1, mode="median"), ValueError, "pad: mode must be one of 'constant', 'edge', 'reflect', 'symmetric', 'wrap', got 'median'"),
    (lambda a: pnp.pad(a, 1, mode="edge", constant_values=3), ValueError, "pad: mode 'edge' takes no argument constant_values"),
    (lambda a: pnp.pad(a[:0], 1, mode="wrap"), ValueError, "pad: can't extend empty axis 0 of f32[0,4] using mode 'wrap'"),
    (lambda a: pnp.tensordot(a, a, axes=1), ValueError, "tensordot: shape mismatch for sum: axis 1 of f32[3,4] has size 4, axis 0 of f32[3,4] has 3"),
    (lambda a: pnp.tensordot(a, a, axes=3), ValueError, "tensordot: axes 3 must be between 0 and the lesser rank of f32[3,4] and f32[3,4]"),
    (lambda a: pnp.tensordot(a, a, axes=([0, 1], [0])), ValueError, "tensordot: axes ([0, 1], [0]) pair 2 axes of a with 1 of b"),
    (lambda a: pnp.dot(a[None], a), ValueError, "dot: shape mismatch for sum: axis 2 of f32[1,3,4] has size 4, axis 0 of f32[3,4] has 3"),
    (lambda a: pnp.vdot(a, a[0]), ValueError, "vdot: operands of 12 and 4 elements (f32[3,4], f32[4])"),
    (lambda a: pw.all_to_all(a, "i", 0, 1, tiled=True), ValueError, "all_to_all: split axis 0 of f32[3,4] does not divide into 2 shards"),
    (lambda a: pw.all_to_all(a, "i", 1, 0), ValueError, "all_to_all: split_axis 1 of f32[3,4] has size 4, but the pmap has 2 devices"),
    (lambda a: pw.all_to_all(a, "i", 0, 1, tiled=1), TypeError, "all_to_all: tiled must be a bool, got 1"),
    (lambda a: pw.all_gather(a[0, 0], "i", tiled=True), ValueError, "all_gather (tiled): axis 0 is out of range for f32[]"),
    (lambda a: pw.psum_scatter(a, "i", 0, tiled=True), ValueError, "psum_scatter (tiled): scatter_dimension 0 of f32[3,4] has size 3, which does not divide"),
    (lambda a: pw.all_to_all(a, "i", 2, 1, tiled=True), ValueError, "all_to_all: axis 2 is out of range for f32[3,4]"),
    (lambda a: pw.all_to_all(a, "i", 2, 1), ValueError, "all_to_all: split_axis 2 is out of range for f32[3,4]"),
    (lambda a: pw.all_to_all(a[:2], "i", 0, -3), ValueError, "all_to_all: concat_axis -3 is out of range for f32[2,4]"),
    (lambda a: pw.all_to_all(a, "j", 1, 0), NameError, "unbound axis name: 'j'"),
    (lambda a: pw.psum_scatter(a, "i", 0), ValueError, "psum_scatter: dimension 0 of f32[3,4] must equal the number of shards, 2"),
    (lambda a: pw.psum_scatter(a, "j"), NameError, "unbound axis name: 'j'"),
]


@pytest.mark.parametrize("body, exc, message", ERRORS, ids=[e[2][:40] for e in ERRORS])
def test_shape_errors_at_trace_time(tpus2, runtime_ok, body, exc, message):
    x = np.zeros((2, 3, 4), np.float32)
    with pytest.raises(exc, match=re.escape(message)):
        pw.pmap(body, devices=tpus2, axis_name="i")(x)
    runtime_ok()


def test_collectives_outside_pmap_name_the_problem():
    with pytest.raises(NameError, match=re.escape("unbound axis name: 'i' (all_to_all must be called inside a function traced by pw.pmap")):
        pw.all_to_all(np.zeros(4), "i", 0, 0)
    with pytest.raises(NameError, match=re.escape("unbound axis name: 'i' (psum_scatter must be called inside")):
        pw.psum_scatter(np.zeros(4), "i")


@pytest.mark.parametrize("source, destination", [
    (0, 2), ([0, 1], [2, 3]), ((0, 3), (3, 0)), ([-1, 0], [0, -1]), ([1, 2, 3], [0, 1, 2]),
    ([0, 2], [1, 0]),
])
def test_moveaxis_of_several_axes(source, destination):
    x = np.arange(120.0).reshape(2, 3, 4, 5)
    f = pw.pmap(lambda v: pnp.moveaxis(v, source, destination), devices=get_devices(2))
    got = np.asarray(f(np.stack([x, x])))[0]
    np.testing.assert_array_equal(got, np.moveaxis(x, source, destination))


def test_moveaxis_errors(runtime_ok):
    x = np.zeros((2, 2, 3, 4))
    for source, destination, message in [
        ([0, 0], [1, 2], "moveaxis: repeated axis in source [0, 0]"),
        ([0], [1, 2], "moveaxis: source [0] and destination [1, 2] must have the same number"),
        (3, 0, "moveaxis: source 3 is out of range"),
    ]:
        with pytest.raises(ValueError, match=re.escape(message)):
            pw.pmap(lambda v: pnp.moveaxis(v, source, destination), devices=get_devices(2))(x)
    runtime_ok()


def test_concatenate_with_axis_none_flattens():
    a, b = np.arange(24.0).reshape(2, 3, 4), np.arange(10.0).reshape(2, 5)
    f = pw.pmap(lambda u, v: pnp.concatenate([u, v, np.zeros((0, 2))], axis=None),
                devices=get_devices(2))
    got = np.asarray(f(a, b))
    np.testing.assert_array_equal(got[1], np.concatenate([a[1], b[1], np.zeros((0, 2))], axis=None))
