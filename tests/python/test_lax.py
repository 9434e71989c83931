"""pw.lax.top_k: values and int32 positions along the last axis, and its gradient.

Results are checked against a numpy reference (a stable argsort of the
negated row: ties go to the lower position) inside `pw.pmap` over 2 devices
and on concrete arrays; the order of NaN and -0.0 against the one XLA's TopK
gives (and against `jax.lax.top_k` itself when jax is installed); gradients
against central finite differences and against the scatter of the values'
cotangent to their positions.
"""

import zlib

import numpy as np
import pytest

import pathways as pw
import pathways.nn as pnn
import pathways.numpy as pnp

try:
    import jax
    import jax.numpy as jnp
except ImportError:  # jax is an optional test dependency (Makefile: .test-deps)
    jax = None


def rng_for(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def reference(x, k):
    """numpy top_k of a NaN-free `x`: each row's positions stably sorted by decreasing value."""
    neg = -x.astype(np.float64) if x.dtype != np.bool_ else -x.astype(np.int64)
    idx = np.argsort(neg, axis=-1, kind="stable")[..., :k].astype(np.int32)
    return np.take_along_axis(x, idx, axis=-1), idx


def random_operand(rng, dtype, shape):
    """Values from a small set, so that rows have ties, in `dtype`."""
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    v = rng.integers(-4, 5, size=shape)
    if np.dtype(dtype).kind == "f":
        v = v + rng.choice([0.0, 0.25, 0.5], size=shape)  # ties still, and fractions
    return v.astype(dtype)


def pmapped_top_k(devices, k):
    return pw.pmap(lambda x: pw.lax.top_k(x, k), devices=devices)


SHAPES = [(7,), (3, 5), (2, 3, 4), (4, 1), (2, 16)]
DTYPES = [np.float32, np.float64, np.int32, np.bool_]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_matches_a_stable_argsort_in_pmap_over_two_devices(tpus2, dtype, shape):
    rng = rng_for("pmap", np.dtype(dtype).name, shape)
    x = random_operand(rng, dtype, (2,) + shape)
    n = shape[-1]
    for k in sorted({0, 1, n // 2, n}):
        values, indices = pmapped_top_k(tpus2, k)(x)
        values, indices = np.asarray(values), np.asarray(indices)
        assert values.dtype == x.dtype and indices.dtype == np.int32
        assert values.shape == indices.shape == (2,) + shape[:-1] + (k,)
        for d in range(2):  # each device its own shard
            want_v, want_i = reference(x[d], k)
            np.testing.assert_array_equal(indices[d], want_i, err_msg=f"k={k} device {d}")
            np.testing.assert_array_equal(values[d], want_v, err_msg=f"k={k} device {d}")


def test_ties_go_to_the_lower_position(tpus2):
    x = np.array([[3, 1, 3, 2, 3, 3, 1], [0, 0, 0, 0, 0, 0, 0]], np.int32)
    values, indices = pmapped_top_k(tpus2, 3)(x)
    np.testing.assert_array_equal(np.asarray(indices), [[0, 2, 4], [0, 1, 2]])
    np.testing.assert_array_equal(np.asarray(values), [[3, 3, 3], [0, 0, 0]])


def test_a_call_records_one_top_k_op(tpus2):
    text = pmapped_top_k(tpus2, 2).as_text(np.zeros((2, 3, 5), np.float32))
    assert text.count("top_k[k=2]") == 1, text
    assert "i32[3,2]" in text, text


# --- NaN, infinities and signed zeros -------------------------------------------------

NEG_NAN32 = np.frombuffer(np.uint32(0xFFC00000).tobytes(), np.float32)[0]  # x86's inf - inf


def test_nan_and_signed_zeros_rank_as_in_xla(tpus2):
    # jax.lax.top_k of this row (XLA's TopK: IEEE totalOrder) gives these positions.
    row = np.array([1.0, np.nan, 3.0, -np.inf, np.inf, 0.0, -0.0, NEG_NAN32, 3.0], np.float32)
    x = np.stack([row, row[::-1]])
    values, indices = (np.asarray(a) for a in pmapped_top_k(tpus2, 9)(x))
    np.testing.assert_array_equal(indices[0], [1, 4, 2, 8, 0, 5, 6, 3, 7])
    np.testing.assert_array_equal(indices[1], 8 - np.array([1, 4, 8, 2, 0, 5, 6, 3, 7]))
    # The values are the elements themselves: the sign of each NaN and zero too.
    np.testing.assert_array_equal(values[0].view(np.uint32), row[indices[0]].view(np.uint32))
    assert np.isnan(values[0][0]) and not np.signbit(values[0][0])
    assert np.isnan(values[0][-1]) and np.signbit(values[0][-1])
    assert np.signbit(values[0][6]) and not np.signbit(values[0][5])


def test_nan_in_float64_on_concrete_arrays():
    values, indices = pw.lax.top_k(np.array([1.0, np.nan, -np.nan, 0.0, -0.0]), 5)
    np.testing.assert_array_equal(indices, [1, 0, 3, 4, 2])
    assert values.dtype == np.float64


@pytest.mark.skipif(jax is None, reason="jax is not installed")
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.bool_], ids=lambda d: np.dtype(d).name)
def test_matches_jax_lax_top_k(tpus2, dtype):
    rng = rng_for("jax", np.dtype(dtype).name)
    x = random_operand(rng, dtype, (2, 3, 40))
    if dtype == np.float32:
        specials = np.array([np.nan, NEG_NAN32, np.inf, -np.inf, 0.0, -0.0], np.float32)
        mask = rng.random(x.shape) < 0.2
        x[mask] = rng.choice(specials, size=int(mask.sum()))
    for k in (0, 1, 5, 40):
        values, indices = (np.asarray(a) for a in pmapped_top_k(tpus2, k)(x))
        want_v, want_i = (np.asarray(a) for a in jax.lax.top_k(jnp.asarray(x), k))
        np.testing.assert_array_equal(indices, want_i, err_msg=f"k={k}")
        assert values.dtype == want_v.dtype
        np.testing.assert_array_equal(values.view(np.uint8), want_v.view(np.uint8), err_msg=f"k={k}")


# --- Concrete arrays ---------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_on_concrete_arrays_as_in_a_trace(dtype):
    x = random_operand(rng_for("concrete", np.dtype(dtype).name), dtype, (3, 6))
    for k in (0, 2, 6):
        values, indices = pw.lax.top_k(x, k)
        assert isinstance(values, np.ndarray) and isinstance(indices, np.ndarray)
        want_v, want_i = reference(x, k)
        np.testing.assert_array_equal(indices, want_i)
        np.testing.assert_array_equal(values, want_v)
        assert values.dtype == x.dtype and indices.dtype == np.int32


def test_concrete_array_likes():
    values, indices = pw.lax.top_k([3.0, 1.0, 2.0], 2)  # Python floats: float64
    np.testing.assert_array_equal(values, [3.0, 2.0])
    assert values.dtype == np.float64
    values, indices = pw.lax.top_k(np.array([5, -1, 7], np.int64), 1)  # numpy's ints: int32
    assert values.dtype == np.int32 and values.tolist() == [7] and indices.tolist() == [2]
    values, indices = pw.lax.top_k(np.zeros((2, 0), np.float32), 0)
    assert values.shape == indices.shape == (2, 0)


def test_constant_operand_inside_a_trace(tpus2):
    c = np.array([2.0, 9.0, 4.0], np.float32)
    f = pw.pmap(lambda x: x + pw.lax.top_k(c, 2)[0], devices=tpus2)
    np.testing.assert_array_equal(np.asarray(f(np.zeros((2, 2), np.float32))), [[9, 4], [9, 4]])


# --- Gradients ---------------------------------------------------------------------------


def numeric_grad(total, x, eps=1e-5):
    """Central finite differences of scalar `total(x)`, Richardson-extrapolated, in float64."""
    x = np.array(x, dtype=np.float64)
    g = np.zeros_like(x)

    def central(idx, h):
        orig = x[idx]
        x[idx] = orig + h
        hi = total(x)
        x[idx] = orig - h
        lo = total(x)
        x[idx] = orig
        return (hi - lo) / (2 * h)

    for idx in np.ndindex(*x.shape):
        g[idx] = (4 * central(idx, eps / 2) - central(idx, eps)) / 3
    return g


def scattered(ct, indices, shape):
    """The values' cotangent `ct` put at their positions of a row of `shape`, zeros elsewhere."""
    g = np.zeros(shape)
    np.put_along_axis(g, indices, ct, axis=-1)
    return g


@pytest.mark.parametrize("shape,k", [((6,), 3), ((3, 5), 2), ((2, 2, 4), 4), ((3, 4), 0)],
                         ids=str)
def test_grad_is_the_cotangent_scattered_to_the_positions(tpus2, shape, k):
    rng = rng_for("grad", shape, k)
    x = rng.standard_normal((2,) + shape)  # distinct values: the positions hold nearby
    w = rng.standard_normal(shape[:-1] + (k,))

    def f(x):
        values, _ = pw.lax.top_k(x, k)
        return (pnp.sin(values) * w).sum()

    got = np.asarray(pw.pmap(pw.grad(f), devices=tpus2)(x))
    assert got.shape == x.shape and got.dtype == np.float64
    for d in range(2):
        want_v, want_i = reference(x[d], k)
        np.testing.assert_allclose(got[d], scattered(np.cos(want_v) * w, want_i, shape),
                                   rtol=1e-12, atol=1e-12)

        def total(xd):
            v, _ = reference(xd, k)
            return float((np.sin(v) * w).sum())

        np.testing.assert_allclose(got[d], numeric_grad(total, x[d]), rtol=1e-6, atol=1e-6)


def test_grad_with_ties_goes_to_the_chosen_positions(tpus2):
    # As jax.grad of lax.top_k: the cotangent goes to the positions returned.
    x = np.array([[1.0, 3.0, 3.0, 2.0], [5.0, 5.0, 5.0, 5.0]], np.float32)
    f = pw.pmap(pw.grad(lambda x: (pw.lax.top_k(x, 2)[0] * np.float32([1.0, 10.0])).sum()),
                devices=tpus2)
    got = np.asarray(f(x))
    np.testing.assert_array_equal(got, [[0, 1, 10, 0], [1, 10, 0, 0]])
    assert got.dtype == np.float32


def test_grad_of_expert_routing(tpus2):
    # A mixture-of-experts gate: the top-2 of softmax(logits), renormalized,
    # weighting each expert's output; finite differences through all of it.
    rng = rng_for("routing")
    logits = rng.standard_normal((2, 3, 6))
    expert_out = rng.standard_normal((3, 6))

    def loss(logits):
        gates, experts = pw.lax.top_k(pnn.softmax(logits, axis=-1), 2)
        gates = gates / gates.sum(axis=-1, keepdims=True)
        # Each row's chosen experts' outputs, by a one-hot product.
        chosen = (pnn.one_hot(experts, 6, dtype=np.float64) * expert_out[:, None, :]).sum(axis=-1)
        return (gates * chosen).sum()

    def total(lg):
        e = np.exp(lg - lg.max(axis=-1, keepdims=True))
        p = e / e.sum(axis=-1, keepdims=True)
        v, i = reference(p, 2)
        v = v / v.sum(axis=-1, keepdims=True)
        return float((v * np.take_along_axis(expert_out, i, axis=-1)).sum())

    got = np.asarray(pw.pmap(pw.grad(loss), devices=tpus2)(logits))
    for d in range(2):
        np.testing.assert_allclose(got[d], numeric_grad(total, logits[d]), rtol=1e-6, atol=1e-8)


def test_grad_on_concrete_arrays():
    x = np.array([0.5, -1.0, 2.0, 1.5])
    g = pw.grad(lambda x: pw.lax.top_k(x, 2)[0].sum())(x)
    np.testing.assert_array_equal(g, [0.0, 0.0, 1.0, 1.0])


# --- Errors ---------------------------------------------------------------------------


@pytest.mark.parametrize("k", [2.0, True, "2", None, np.array([1, 2])], ids=repr)
def test_k_must_be_an_int(tpus2, k):
    with pytest.raises(TypeError, match=r"top_k: k must be an int, got "):
        pw.lax.top_k(np.ones(4), k)
    f = pw.pmap(lambda x: pw.lax.top_k(x, k), devices=tpus2)
    with pytest.raises(TypeError, match=r"top_k: k must be an int, got "):
        f(np.ones((2, 4)))


@pytest.mark.parametrize("k", [5, -1])
def test_k_must_be_in_range(tpus2, runtime_ok, k):
    message = rf"top_k: k must be in \[0, 4\] \(the last dimension of f32\[3,4\]\), got {k}"
    with pytest.raises(ValueError, match=message):
        pmapped_top_k(tpus2, k)(np.ones((2, 3, 4), np.float32))
    with pytest.raises(ValueError, match=message):
        pw.lax.top_k(np.ones((3, 4), np.float32), k)
    runtime_ok()


def test_operand_must_have_a_dimension(tpus2, runtime_ok):
    message = r"top_k: operand must have at least one dimension, got f32\[\]"
    with pytest.raises(ValueError, match=message):
        pmapped_top_k(tpus2, 0)(np.ones(2, np.float32))
    with pytest.raises(ValueError, match=message):
        pw.lax.top_k(np.float32(1.0), 0)
    runtime_ok()


def test_operand_dtype_on_concrete_arrays():
    with pytest.raises(TypeError, match=r"pw.lax.top_k: operand of dtype float16 is not supported"):
        pw.lax.top_k(np.ones(3, np.float16), 1)
    with pytest.raises(TypeError, match=r"pw.lax.top_k: operand 0 has type str"):
        pw.lax.top_k("abc", 1)


def test_inside_a_program_it_belongs_in_a_pmapd_function(tpus2):
    @pw.program
    def prog(v):
        return pw.lax.top_k(v, 1)

    with pytest.raises(pw.TracerError, match=r"pw.lax.top_k of a traced program value"):
        prog(np.ones((2, 3)))

    @pw.program
    def prog2(v):
        pw.lax.top_k(np.ones(3), 1)
        return v

    with pytest.raises(pw.TracerError, match=r"pw.lax.top_k was called in .* outside any pmap'd"):
        prog2(np.ones((2, 3)))
