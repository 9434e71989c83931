"""pw.grad, pw.value_and_grad and pw.stop_gradient: reverse-mode gradients.

Every primitive with a gradient is differentiated with `pw.grad` inside
`pw.pmap` over random shapes (numpy broadcasting included) and checked against
central finite differences in float64, and against closed forms where they
are simple. Collectives run on 2 and 4 devices; their reference is the finite
difference, computed in numpy, of the sum over devices of every device's
output (the semantics of `jax.pmap`). Cases are seeded, so that failures
reproduce.
"""

import re
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import pathways as pw
import pathways.numpy as pnp
from pathways._primitives import PRIMITIVES
from pathways._tracing import bind

from conftest import get_devices, random_axes


@pytest.fixture(params=[2, 4], ids=lambda n: f"{n}dev")
def tpus(request, tpus2, tpus4):
    return tpus2 if request.param == 2 else tpus4


def rng_for(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def random_shapes(rng, count, max_rank=3):
    """Per-shard shapes of `count` operands that broadcast together."""
    rank = int(rng.integers(0, max_rank + 1))
    out = [int(d) for d in rng.integers(1, 4, size=rank)]
    shapes = []
    for _ in range(count):
        r = int(rng.integers(0, rank + 1))
        shapes.append(tuple(d if rng.random() < 0.6 else 1 for d in out[rank - r:]))
    return shapes


def random_shape(rng, min_rank=0, max_rank=3):
    rank = int(rng.integers(min_rank, max_rank + 1))
    return tuple(int(d) for d in rng.integers(1, 4, size=rank))


def stacked(rng, n, shape, positive=False, away_from_zero=False):
    v = rng.standard_normal((n,) + tuple(shape))
    if positive:
        v = np.abs(v) + 0.2
    elif away_from_zero:
        v = np.sign(v) * (np.abs(v) + 0.2)
    return v


def numeric_grad(total, args, argnum, eps=1e-5):
    """Finite differences of scalar `total(*args)` w.r.t. `args[argnum]`, in float64.

    Central differences at steps `eps` and `eps / 2`, Richardson-extrapolated:
    the error is O(eps**4) (plain central differences at 1e-6 were off by
    1.3e-5 relative on cos(exp(exp(exp(x/2)/2)/2)), whose higher derivatives
    are large).
    """
    args = list(args)
    x = args[argnum] = np.array(args[argnum], dtype=np.float64)
    g = np.zeros_like(x)

    def central(idx, h):
        orig = x[idx]
        x[idx] = orig + h
        hi = total(*args)
        x[idx] = orig - h
        lo = total(*args)
        x[idx] = orig
        return (hi - lo) / (2 * h)

    for idx in np.ndindex(*x.shape):
        g[idx] = (4 * central(idx, eps / 2) - central(idx, eps)) / 3
    return g


def sum_over_devices(f):
    """numpy total of a collective-free per-device `f`: the sum of every device's output."""

    def total(*args):
        n = args[0].shape[0]
        return sum(float(f(*[a[d] for a in args])) for d in range(n))

    return total


def pmap_grads(devices, f, args, argnums, axis_name="i"):
    """`pw.grad(f, argnums)` inside `pw.pmap`, as a tuple of numpy arrays (one per argnum)."""
    g = pw.pmap(pw.grad(f, argnums=tuple(argnums)), devices=devices, axis_name=axis_name)
    return tuple(np.asarray(x) for x in g(*args))


def check_grads(devices, f, args, argnums=None, total=None, rtol=1e-6, atol=1e-6):
    """pw.grad of `f` in pmap against finite differences of `total` (default: per device)."""
    argnums = tuple(range(len(args))) if argnums is None else tuple(argnums)
    total = sum_over_devices(f) if total is None else total
    got = pmap_grads(devices, f, args, argnums)
    for a, g in zip(argnums, got):
        assert g.shape == args[a].shape, (a, g.shape, args[a].shape)
        assert g.dtype == args[a].dtype, (a, g.dtype, args[a].dtype)
        want = numeric_grad(total, args, a)
        np.testing.assert_allclose(g, want, rtol=rtol, atol=atol, err_msg=f"argument {a}")
    return got


# --- Elementwise unary ---------------------------------------------------------

# name: (function, closed-form derivative, domain)
UNARY = {
    "neg": (lambda x: -x, lambda x: -np.ones_like(x), None),
    "abs": (abs, np.sign, "away_from_zero"),
    "pnp.abs": (pnp.abs, np.sign, "away_from_zero"),
    "exp": (pnp.exp, np.exp, None),
    "log": (pnp.log, lambda x: 1 / x, "positive"),
    "tanh": (pnp.tanh, lambda x: 1 - np.tanh(x) ** 2, None),
    "sqrt": (pnp.sqrt, lambda x: 0.5 / np.sqrt(x), "positive"),
    "rsqrt": (pnp.rsqrt, lambda x: -0.5 * x**-1.5, "positive"),
    "sin": (pnp.sin, np.cos, None),
    "cos": (pnp.cos, lambda x: -np.sin(x), None),
    "square": (lambda x: x * x, lambda x: 2 * x, None),
    "reciprocal": (lambda x: 1.0 / x, lambda x: -1 / x**2, "away_from_zero"),
    "cube": (lambda x: x**3, lambda x: 3 * x**2, None),
}


@pytest.mark.parametrize("name", list(UNARY))
@pytest.mark.parametrize("seed", range(3))
def test_unary(tpus2, name, seed):
    fn, deriv, domain = UNARY[name]
    rng = rng_for("unary", name, seed)
    shape = random_shape(rng)
    x = stacked(rng, 2, shape, positive=domain == "positive",
                away_from_zero=domain == "away_from_zero")
    w = rng.standard_normal(shape)
    (g,) = check_grads(tpus2, lambda x: (fn(x) * w).sum(), [x])
    np.testing.assert_allclose(g, deriv(x) * w, rtol=1e-12, atol=1e-12)


def test_simulated_compute_is_an_identity(tpus2):
    x = np.array([[1.0, 2.0], [3.0, -4.0]])
    (g,) = pmap_grads(tpus2, lambda x: pw.simulated_compute(x * x, 1.0).sum(), [x], (0,))
    np.testing.assert_array_equal(g, 2 * x)


@pytest.mark.parametrize("name", ["exp", "tanh", "sin", "cube", "sqrt"])
def test_unary_float32_keeps_dtype(tpus2, name):
    fn, deriv, _ = UNARY[name]
    x = np.array([[0.5, 1.5, 2.0], [0.25, 1.0, 3.0]], np.float32)
    g = np.asarray(pw.pmap(pw.grad(lambda x: fn(x).sum()), devices=tpus2)(x))
    assert g.dtype == np.float32
    np.testing.assert_allclose(g, deriv(x.astype(np.float64)), rtol=1e-5)


# --- Elementwise binary (with broadcasting) -------------------------------------

BINARY = {
    "add": (lambda a, b: a + b, {}),
    "sub": (lambda a, b: a - b, {}),
    "mul": (lambda a, b: a * b, {}),
    "div": (lambda a, b: a / b, {"b": "away_from_zero"}),
    "pow": (lambda a, b: a**b, {"a": "positive"}),
    "maximum": (pnp.maximum, {}),
    "minimum": (pnp.minimum, {}),
}


@pytest.mark.parametrize("name", list(BINARY))
@pytest.mark.parametrize("seed", range(4))
def test_binary_broadcasting(tpus2, name, seed):
    fn, domains = BINARY[name]
    rng = rng_for("binary", name, seed)
    sa, sb = random_shapes(rng, 2)
    a = stacked(rng, 2, sa, positive=domains.get("a") == "positive")
    b = stacked(rng, 2, sb, away_from_zero=domains.get("b") == "away_from_zero")
    w = rng.standard_normal(np.broadcast_shapes(sa, sb))
    check_grads(tpus2, lambda a, b: (fn(a, b) * w).sum(), [a, b])


@pytest.mark.parametrize("name", list(BINARY))
def test_binary_against_constants(tpus2, name):
    """One operand a constant (numpy array or Python scalar) of another shape."""
    fn, domains = BINARY[name]
    rng = rng_for("binary-const", name)
    x = stacked(rng, 2, (3, 1), positive=True)
    c = np.abs(rng.standard_normal((4,))) + 0.5
    check_grads(tpus2, lambda x: (fn(x, c) ** 2).sum() + fn(x, 1.5).sum(), [x])
    if name != "pow":
        check_grads(tpus2, lambda x: (fn(c, x) ** 2).sum() + fn(2.5, x).sum(), [x])


def test_binary_closed_forms(tpus2):
    a = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    b = np.array([[2.0, 0.5, 1.0], [3.0, 2.0, 0.25]])
    ga, gb = pmap_grads(tpus2, lambda a, b: (a * b + a / b).sum(), [a, b], (0, 1))
    np.testing.assert_allclose(ga, b + 1 / b)
    np.testing.assert_allclose(gb, a - a / b**2)
    ga, gb = pmap_grads(tpus2, lambda a, b: (a**b).sum(), [a, b], (0, 1))
    np.testing.assert_allclose(ga, b * a ** (b - 1))
    np.testing.assert_allclose(gb, np.log(a) * a**b)


def test_broadcast_scalar_operand_sums_cotangent(tpus2):
    """A per-shard scalar broadcast against a vector gets the summed cotangent."""
    s = np.array([2.0, 3.0])
    v = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    gs, gv = pmap_grads(tpus2, lambda s, v: (s * v).sum(), [s, v], (0, 1))
    np.testing.assert_allclose(gs, v.sum(axis=1))
    np.testing.assert_allclose(gv, np.broadcast_to(s[:, None], v.shape))


def test_pow_special_points(tpus2):
    # Negative base with a constant exponent: 3 x**2.
    x = np.array([[-2.0, -0.5], [1.0, -3.0]])
    (g,) = pmap_grads(tpus2, lambda x: (x**3.0).sum(), [x], (0,))
    np.testing.assert_allclose(g, 3 * x**2)
    # 0 ** 0: the base gets 0 (not NaN), as in JAX.
    z = np.zeros((2, 2))
    ga, gb = pmap_grads(tpus2, lambda a, b: (a**b).sum(), [z, z.copy()], (0, 1))
    np.testing.assert_array_equal(ga, 0.0)
    # The exponent's gradient is 0 where the base is not positive.
    np.testing.assert_array_equal(gb, 0.0)
    a = np.array([[-2.0, 0.0], [2.0, 4.0]])
    b = np.array([[2.0, 3.0], [0.5, 2.0]])
    _, gb = pmap_grads(tpus2, lambda a, b: (a**b).sum(), [a, b], (0, 1))
    np.testing.assert_allclose(gb, np.where(a > 0, np.log(np.where(a > 0, a, 1)) * a**b, 0.0))


def test_pow_with_constant_exponent_emits_no_log(tpus2):
    """Only operands that depend on the inputs get cotangents: no dead backward ops."""
    f = pw.pmap(pw.grad(lambda x: (x**2.0).sum()), devices=tpus2)
    text = f.as_text(np.ones((2, 3)))
    assert " log " not in text, text
    f = pw.pmap(pw.grad(lambda x: (2.0**x).sum()), devices=tpus2)
    assert " log " in f.as_text(np.ones((2, 3)))


@pytest.mark.parametrize("fn, weight_a", [(pnp.maximum, 0.5), (pnp.minimum, 0.5)])
def test_max_min_ties_split_half(tpus2, fn, weight_a):
    a = np.array([[1.0, 2.0, 3.0], [0.0, 5.0, -1.0]])
    b = np.array([[1.0, 1.0, 4.0], [0.0, 6.0, -2.0]])
    ga, gb = pmap_grads(tpus2, lambda a, b: fn(a, b).sum(), [a, b], (0, 1))
    a_wins = (a > b) if fn is pnp.maximum else (a < b)
    b_wins = (b > a) if fn is pnp.maximum else (b < a)
    np.testing.assert_array_equal(ga, a_wins + weight_a * (a == b))
    np.testing.assert_array_equal(gb, b_wins + (1 - weight_a) * (a == b))
    # The same value on both sides: the halves add up to 1.
    (g,) = pmap_grads(tpus2, lambda x: fn(x, x).sum(), [a], (0,))
    np.testing.assert_array_equal(g, np.ones_like(a))


def test_where(tpus2):
    rng = rng_for("where")
    for _ in range(4):
        sc, sx, sy = random_shapes(rng, 3)
        c = rng.random((2,) + sc) < 0.5
        x = stacked(rng, 2, sx)
        y = stacked(rng, 2, sy)
        w = rng.standard_normal(np.broadcast_shapes(sc, sx, sy))
        f = lambda c, x, y: (pnp.where(c, x * x, pnp.sin(y)) * w).sum()  # noqa: E731
        check_grads(tpus2, f, [c, x, y], argnums=(1, 2))
    # With a scalar branch: the other branch gets the cotangent where chosen.
    x = np.array([[-1.0, 2.0], [3.0, -4.0]])
    (g,) = pmap_grads(tpus2, lambda x: pnp.where(x > 0, x * 3.0, 0.0).sum(), [x], (0,))
    np.testing.assert_array_equal(g, np.where(x > 0, 3.0, 0.0))


def test_convert(tpus2):
    # float64 -> float32 -> float64: the cotangent comes back through both casts.
    x = np.array([[1.0, 2.0], [3.0, 4.0]])
    w = np.array([0.5, 3.0], np.float32)
    (g,) = pmap_grads(tpus2, lambda x: (x.astype(np.float32) * w).sum(), [x], (0,))
    assert g.dtype == np.float64
    np.testing.assert_array_equal(g, np.broadcast_to(w.astype(np.float64), x.shape))
    # float32 inputs mixed with float64 constants: float32 gradients.
    x32 = x.astype(np.float32)
    (g,) = pmap_grads(tpus2, lambda x: (x * np.float64(2.0) + x * x).sum(), [x32], (0,))
    assert g.dtype == np.float32
    np.testing.assert_allclose(g, 2.0 + 2 * x32)
    # Through int32 or bool there is no gradient (as JAX): only the float path counts.
    def f(x):
        return x.astype(np.int32).astype(np.float64).sum() + (x > 2).sum() + (x * 3.0).sum()

    (g,) = pmap_grads(tpus2, f, [x], (0,))
    np.testing.assert_array_equal(g, np.full_like(x, 3.0))


# --- Reductions -------------------------------------------------------------------




@pytest.mark.parametrize("kind", ["sum", "mean", "max", "min"])
@pytest.mark.parametrize("seed", range(6))
def test_reduction(tpus2, kind, seed):
    rng = rng_for("reduce", kind, seed)
    shape = random_shape(rng)
    axis = random_axes(rng, len(shape))
    keepdims = bool(rng.random() < 0.5)
    x = stacked(rng, 2, shape)
    out_shape = np.sum(np.zeros(shape), axis=axis, keepdims=keepdims).shape
    w = rng.standard_normal(out_shape)

    def f(x):
        r = getattr(pnp, kind)(pnp.sin(x), axis=axis, keepdims=keepdims)
        return (r * w).sum()

    check_grads(tpus2, f, [x])


def test_reduction_methods_and_closed_forms(tpus2):
    x = np.array([[[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], [[0.0, -1.0, 2.0], [3.0, 1.0, 1.0]]])
    (g,) = pmap_grads(tpus2, lambda x: x.sum(axis=1).max(), [x], (0,))
    np.testing.assert_array_equal(g, np.broadcast_to([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]], x.shape))
    (g,) = pmap_grads(tpus2, lambda x: x.mean(), [x], (0,))
    np.testing.assert_allclose(g, np.full_like(x, 1 / 6))
    (g,) = pmap_grads(tpus2, lambda x: (x.mean(axis=0, keepdims=True) ** 2).sum(), [x], (0,))
    np.testing.assert_allclose(g, np.broadcast_to(x.mean(axis=1, keepdims=True), x.shape))


def test_max_min_ties_share_equally(tpus2):
    """Ties of a max/min reduction split the cotangent equally, as JAX."""
    x = np.array([[1.0, 3.0, 3.0, 2.0], [5.0, 5.0, 5.0, -1.0]])
    (g,) = pmap_grads(tpus2, lambda x: x.max(), [x], (0,))
    np.testing.assert_allclose(g, [[0, 0.5, 0.5, 0], [1 / 3, 1 / 3, 1 / 3, 0]])
    y = np.array([[[2.0, 2.0], [1.0, 4.0]], [[0.0, 0.0], [0.0, 7.0]]])
    (g,) = pmap_grads(tpus2, lambda x: (x.min(axis=-1) * np.array([1.0, 10.0])).sum(), [y], (0,))
    np.testing.assert_allclose(g, [[[0.5, 0.5], [10.0, 0.0]], [[0.5, 0.5], [10.0, 0.0]]])


# --- Shapes, indexing, data movement, matmul ----------------------------------------


def traced_op(prim, *operands, **params):
    """Binds primitive `prim` directly (for primitives without a public function)."""
    return bind(operands[0]._trace, prim, operands, **params)


def test_reshape(tpus2):
    rng = rng_for("reshape")
    x = stacked(rng, 2, (2, 3, 2))
    w = rng.standard_normal((3, 4))
    check_grads(tpus2, lambda x: (pnp.sin(x).reshape(3, 4) * w).sum(), [x])
    check_grads(tpus2, lambda x: (pnp.reshape(x * x, (-1,)) * w.ravel()).sum(), [x])
    check_grads(tpus2, lambda x: (x.ravel()[None, :] * x.reshape(12, 1)).sum(), [x])
    # expand_dims / squeeze go through reshape too.
    v = stacked(rng, 2, (3, 1))
    check_grads(tpus2, lambda v: (pnp.expand_dims(pnp.squeeze(v), 0) ** 3 * w[:1, :3]).sum(), [v])


def test_broadcast_to(tpus2):
    rng = rng_for("broadcast_to")
    for _ in range(4):
        # Leading dims added, and size-1 dims stretched.
        shape = random_shape(rng, max_rank=2)
        lead = random_shape(rng, max_rank=2)
        x = stacked(rng, 2, tuple(d if rng.random() < 0.5 else 1 for d in shape))
        target = lead + shape
        w = rng.standard_normal(target)
        check_grads(tpus2, lambda x: (pnp.broadcast_to(pnp.exp(x), target) * w).sum(), [x])
    (g,) = pmap_grads(tpus2, lambda x: pnp.broadcast_to(x, (4, 3)).sum(), [np.ones((2, 3))], (0,))
    np.testing.assert_array_equal(g, np.full((2, 3), 4.0))


@pytest.mark.parametrize("seed", range(4))
def test_transpose(tpus2, seed):
    rng = rng_for("transpose", seed)
    shape = random_shape(rng, min_rank=1)
    perm = tuple(int(p) for p in rng.permutation(len(shape)))
    x = stacked(rng, 2, shape)
    w = rng.standard_normal(tuple(shape[p] for p in perm))
    check_grads(tpus2, lambda x: (pnp.transpose(x * x, perm) * w).sum(), [x])
    w2 = rng.standard_normal(shape[::-1])
    check_grads(tpus2, lambda x: (pnp.sin(x).T * w2).sum(), [x])
    if len(shape) >= 2:
        w3 = rng.standard_normal(np.swapaxes(np.zeros(shape), 0, -1).shape)
        check_grads(tpus2, lambda x: (pnp.swapaxes(x, 0, -1) ** 3 * w3).sum(), [x])


def slice_np(x, start, limit, step):
    return x[tuple(slice(a, b, c) for a, b, c in zip(start, limit, step))]


def pad_np(x, lo, hi, interior):
    shape = [l + d + max(d - 1, 0) * i + h for d, l, h, i in zip(x.shape, lo, hi, interior)]
    out = np.zeros(shape, x.dtype)
    out[tuple(slice(l, l + (d - 1) * (i + 1) + 1 if d else l, i + 1)
              for d, l, i in zip(x.shape, lo, interior))] = x
    return out


@pytest.mark.parametrize("seed", range(5))
def test_slice_and_pad(tpus2, seed):
    rng = rng_for("slice-pad", seed)
    shape = tuple(int(d) for d in rng.integers(1, 6, size=int(rng.integers(1, 4))))
    start = [int(rng.integers(0, d + 1)) for d in shape]
    limit = [int(rng.integers(s, d + 1)) for s, d in zip(start, shape)]
    step = [int(rng.integers(1, 4)) for _ in shape]
    x = stacked(rng, 2, shape)
    out_shape = slice_np(np.zeros(shape), start, limit, step).shape
    w = rng.standard_normal(out_shape)

    def f(x):
        if isinstance(x, np.ndarray):
            return (slice_np(np.sin(x), start, limit, step) * w).sum()
        return (traced_op("slice", pnp.sin(x), start=start, limit=limit, step=step) * w).sum()

    check_grads(tpus2, f, [x])
    lo = [int(rng.integers(0, 3)) for _ in shape]
    hi = [int(rng.integers(0, 3)) for _ in shape]
    interior = [int(rng.integers(0, 3)) for _ in shape]
    wp = rng.standard_normal(pad_np(np.zeros(shape), lo, hi, interior).shape)

    def g(x):
        if isinstance(x, np.ndarray):
            return (pad_np(x * x, lo, hi, interior) * wp).sum()
        return (traced_op("pad", x * x, lo=lo, hi=hi, interior=interior) * wp).sum()

    check_grads(tpus2, g, [x])


def test_indexing(tpus2):
    rng = rng_for("indexing")
    x = stacked(rng, 2, (4, 5))
    w = rng.standard_normal((2, 2))
    check_grads(tpus2, lambda x: (x[1:3, ::2][:, 1:] * w).sum() + x[0, -1] * x[3, 0], [x])
    check_grads(tpus2, lambda x: (x[::-1, 4:0:-2] ** 2).sum() + (x[..., None][2] * 3.0).sum(), [x])
    (g,) = pmap_grads(tpus2, lambda x: x[1:3, ::2].sum(), [x], (0,))
    want = np.zeros((4, 5))
    want[1:3, ::2] = 1.0
    np.testing.assert_array_equal(g, np.broadcast_to(want, x.shape))


def test_rev(tpus2):
    rng = rng_for("rev")
    x = stacked(rng, 2, (3, 2, 4))
    w = rng.standard_normal((3, 2, 4))
    for axis in (None, 0, -1, (0, 2)):
        check_grads(tpus2, lambda x: (pnp.flip(pnp.exp(x), axis) * w).sum(), [x])


def test_concatenate_and_stack(tpus2):
    rng = rng_for("concatenate")
    a = stacked(rng, 2, (2, 3))
    b = stacked(rng, 2, (4, 3))
    c = stacked(rng, 2, (2, 1)).astype(np.float32)
    w = rng.standard_normal((6, 3))
    check_grads(tpus2, lambda a, b: (pnp.concatenate([a * a, pnp.sin(b)]) * w).sum(), [a, b])
    wc = rng.standard_normal((2, 7))
    f = lambda a, c: (pnp.concatenate([a, 2.0 * c, a ** 3], axis=-1) * wc).sum()  # noqa: E731
    ga, gc = pmap_grads(tpus2, f, [a, c], (0, 1))
    np.testing.assert_allclose(ga, wc[:, :3] + 3 * a**2 * wc[:, 4:], rtol=1e-12)
    assert gc.dtype == np.float32
    np.testing.assert_allclose(gc, np.broadcast_to(2.0 * wc[:, 3:4], c.shape), rtol=1e-6)
    # A constant among the operands gets no cotangent; stack goes through concatenate.
    ws = rng.standard_normal((3, 2, 3))
    check_grads(tpus2, lambda a: (pnp.stack([a, np.ones((2, 3)), a * a]) * ws).sum(), [a])


def test_take(tpus2):
    rng = rng_for("take")
    x = stacked(rng, 2, (4, 3))
    idx = np.array([[3, 0, 3, 1], [2, 2, 2, 0]], np.int32)  # Repeats accumulate.
    w = rng.standard_normal((4, 3))
    for axis in (0, -2):
        check_grads(tpus2, lambda x, i: (pnp.take(pnp.sin(x), i, axis=axis) * w).sum(),
                    [x, idx], argnums=(0,))
    w1 = rng.standard_normal((4, 2, 2))
    i2 = np.array([[[0, 2], [1, 1]], [[2, 2], [0, 0]]], np.int32)
    check_grads(tpus2, lambda x, i: (x.take(i, axis=1) * w1).sum(), [x, i2], argnums=(0,))
    # Constant indices through indexing, and clipped traced indices (take's mode="clip").
    check_grads(tpus2, lambda x: (x[np.array([0, 0, 3])] ** 2).sum(), [x])
    (g,) = pmap_grads(tpus2, lambda x, i: pnp.take(x, i, axis=0, mode="clip").sum(),
                      [x, np.array([[7, -3], [1, 1]], np.int32)], (0,))
    want = np.zeros((2, 4, 3))
    want[0, 3] = want[0, 0] = 1.0
    want[1, 1] = 2.0
    np.testing.assert_array_equal(g, want)


def test_scatter_add_into_zeros(tpus2):
    # The transpose of take: a scatter with combiner add into a zero scalar.
    rng = rng_for("scatter_add")
    u = stacked(rng, 2, (2, 3, 2))
    idx = np.array([1, 4, 1], np.int32)
    w = rng.standard_normal((2, 5, 2))

    def f(u):
        if isinstance(u, np.ndarray):
            out = np.zeros((2, 5, 2))
            np.add.at(out, (slice(None), idx), u * u)
            return (out * w).sum()
        i = u._trace.constant(idx, None)
        zero = u._trace.constant(np.zeros((), u.dtype), None)
        return (traced_op("scatter", zero, i, u * u, combiner="add", axis=1, size=5) * w).sum()

    check_grads(tpus2, f, [u])


def test_matmul(tpus2):
    rng = rng_for("matmul")
    cases = [((3, 4), (4, 2)), ((2, 3, 4), (4, 5)), ((2, 1, 3, 4), (3, 4, 2)), ((4,), (4, 3)),
             ((2, 3), (3,)), ((1, 2, 3), (2, 3, 1))]
    for sa, sb in cases:
        a = stacked(rng, 2, sa)
        b = stacked(rng, 2, sb)
        w = rng.standard_normal(np.matmul(np.zeros(sa), np.zeros(sb)).shape)
        check_grads(tpus2, lambda a, b: (pnp.tanh(a @ b) * w).sum(), [a, b])
    # Closed form: d/dA sum(A @ B) = 1 B^T summed, d/dB = A^T 1.
    a = rng.standard_normal((2, 3, 4))
    b = rng.standard_normal((2, 4, 2)).astype(np.float32)
    ga, gb = pmap_grads(tpus2, lambda a, b: (a @ b).sum(), [a, b], (0, 1))
    np.testing.assert_allclose(ga, np.broadcast_to(b.sum(axis=-1)[:, None, :], a.shape), rtol=1e-6)
    assert gb.dtype == np.float32
    np.testing.assert_allclose(gb, np.broadcast_to(a.sum(axis=1)[:, :, None], b.shape), rtol=1e-6)
    # einsum and dot are built from matmul, transpose and reshape.
    x = stacked(rng, 2, (2, 3, 4))
    y = stacked(rng, 2, (4, 3))
    check_grads(tpus2, lambda x, y: (pnp.einsum("bij,jk->bik", x, y) ** 2).sum(), [x, y])
    check_grads(tpus2, lambda x, y: pnp.einsum("bij,ji->b", x, y).sum(), [x, y])


def test_second_derivatives_through_data_movement(tpus2):
    """Hessian-vector products of a function using every data-movement op, against
    finite differences of the (already checked) gradient."""
    rng = rng_for("hvp")
    x = rng.standard_normal((2, 3, 4))
    v = rng.standard_normal((2, 3, 4))
    m = rng.standard_normal((4, 3))
    idx = np.array([2, 0, 2], np.int32)

    def f(x):
        y = pnp.tanh(x @ m)  # [3, 3]
        z = pnp.concatenate([y.T, x[:, ::-2] ** 2], axis=1)  # [3, 5]
        p = traced_op("pad", z, lo=[1, 0], hi=[0, 2], interior=[1, 0])  # [6, 7]
        q = pnp.take(p.reshape(7, 6), idx, axis=0)  # [3, 6]
        return (pnp.sin(q) * pnp.flip(q, 1)).sum() + (pnp.broadcast_to(x[0], (2, 4)) ** 3).sum()

    grad_fn = pw.pmap(pw.grad(f), devices=tpus2)
    hvp = pw.pmap(lambda x, v: pw.grad(lambda x: (pw.grad(f)(x) * v).sum())(x),
                  devices=tpus2)
    eps = 1e-5
    want = (np.asarray(grad_fn(x + eps * v)) - np.asarray(grad_fn(x - eps * v))) / (2 * eps)
    np.testing.assert_allclose(np.asarray(hvp(x, v)), want, rtol=1e-6, atol=1e-7)


# --- Collectives (2 and 4 devices) ---------------------------------------------------


def test_psum(tpus):
    n = len(tpus)
    rng = rng_for("psum", n)
    x = stacked(rng, n, (2, 3))

    def total(x):
        s = (x**2).sum(axis=0)
        return sum((s * np.sin(x[d])).sum() for d in range(n))

    (g,) = check_grads(tpus, lambda x: (pw.psum(x * x, "i") * pnp.sin(x)).sum(), [x], total=total)
    # Closed form for a plain psum: every device's output counts n times.
    (g,) = pmap_grads(tpus, lambda x: pw.psum(x, "i").sum(), [x], (0,))
    np.testing.assert_array_equal(g, np.full_like(x, n))


def test_pmean(tpus):
    n = len(tpus)
    rng = rng_for("pmean", n)
    x = stacked(rng, n, (3,))

    def total(x):
        m = np.tanh(x).mean(axis=0)
        return sum((m * x[d] ** 2).sum() for d in range(n))

    check_grads(tpus, lambda x: (pw.pmean(pnp.tanh(x), "i") * x * x).sum(), [x], total=total)
    (g,) = pmap_grads(tpus, lambda x: pw.pmean(x, "i").sum(), [x], (0,))
    np.testing.assert_array_equal(g, np.ones_like(x))


@pytest.mark.parametrize("name", ["pmax", "pmin"])
def test_pmax_pmin(tpus, name):
    n = len(tpus)
    rng = rng_for(name, n)
    x = stacked(rng, n, (2, 2))
    reduce = np.max if name == "pmax" else np.min
    collective = getattr(pw, name)

    def total(x):
        m = reduce(x, axis=0)
        return sum((m * np.cos(x[d])).sum() for d in range(n))

    check_grads(tpus, lambda x: (collective(x, "i") * pnp.cos(x)).sum(), [x], total=total)
    # Ties: the devices holding the extremum share the summed cotangent.
    t = np.zeros((n, 2))
    t[:, 1] = np.arange(n)
    t[0, 0] = t[n - 1, 0] = 5.0 if name == "pmax" else -5.0
    (g,) = pmap_grads(tpus, lambda x: collective(x, "i").sum(), [t], (0,))
    want = np.zeros((n, 2))
    want[0, 0] = want[n - 1, 0] = n / 2
    want[n - 1 if name == "pmax" else 0, 1] = n
    np.testing.assert_allclose(g, want)


@pytest.mark.parametrize("pattern", ["ring", "partial"])
def test_ppermute(tpus, pattern):
    n = len(tpus)
    if pattern == "ring":
        perm = [(i, (i + 1) % n) for i in range(n)]
    else:
        # Some devices receive zeros, and some send nowhere.
        perm = [(0, 1)] if n == 2 else [(0, 3), (3, 1), (2, 0)]
    rng = rng_for("ppermute", n, pattern)
    x = stacked(rng, n, (3,))
    source = {d: s for s, d in perm}

    def total(x):
        out = 0.0
        for d in range(n):
            y = x[source[d]] if d in source else np.zeros_like(x[d])
            out += (y * np.exp(x[d]) + y**2 * (d + 1)).sum()
        return out

    def f(x):
        y = pw.ppermute(x, "i", perm)
        return (y * pnp.exp(x) + y * y * (pw.axis_index("i") + 1).astype(np.float64)).sum()

    check_grads(tpus, f, [x], total=total)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_all_gather(tpus, axis):
    n = len(tpus)
    rng = rng_for("all_gather", n, axis)
    x = stacked(rng, n, (2, 3))
    c = rng.standard_normal(np.stack([np.zeros((2, 3))] * n, axis=axis).shape)

    def total(x):
        gathered = np.stack([np.sin(x[d]) for d in range(n)], axis=axis)
        return sum((d + 1) * (gathered * c).sum() + (gathered**2 * x[d].sum()).sum()
                   for d in range(n))

    def f(x):
        g = pw.all_gather(pnp.sin(x), "i", axis=axis)
        k = (pw.axis_index("i") + 1).astype(np.float64)
        return k * (g * c).sum() + (g * g * x.sum()).sum()

    check_grads(tpus, f, [x], total=total)


@pytest.mark.parametrize("dim", [0, 1])
def test_psum_scatter(tpus, dim):
    n = len(tpus)
    rng = rng_for("psum_scatter", n, dim)
    shape = (n, 3) if dim == 0 else (2, n)
    x = stacked(rng, n, shape)
    w = rng.standard_normal((n,) + np.take(np.zeros(shape), 0, axis=dim).shape)

    def total(x):
        s = (x**2).sum(axis=0)
        return sum((np.take(s, d, axis=dim) ** 2 * w[d] * x[d].sum()).sum() for d in range(n))

    def f(x):
        out = pw.psum_scatter(x * x, "i", scatter_dimension=dim)
        wd = pnp.take(w, pw.axis_index("i").reshape(1), axis=0)[0]
        return (out * out * wd * x.sum()).sum()

    check_grads(tpus, f, [x], total=total)
    # all_gather and psum_scatter are each other's transpose.
    (g,) = pmap_grads(tpus, lambda x: pw.all_gather(pw.psum_scatter(x, "i", dim), "i", dim).sum(),
                      [x], (0,))
    np.testing.assert_array_equal(g, np.full_like(x, n))


def all_to_all_np(x, split_axis, concat_axis):
    """Device i gets chunk i of every device's split, joined in device order."""
    n = x.shape[0]
    chunks = [np.split(x[d], n, axis=split_axis) for d in range(n)]
    return np.stack([np.concatenate([chunks[d][i] for d in range(n)], axis=concat_axis)
                     for i in range(n)])


@pytest.mark.parametrize("split_axis, concat_axis", [(0, 0), (0, 1), (1, 0), (-1, -2)])
def test_all_to_all(tpus, split_axis, concat_axis):
    n = len(tpus)
    rng = rng_for("all_to_all", n, split_axis, concat_axis)
    x = stacked(rng, n, (n, 2 * n))
    w = rng.standard_normal(all_to_all_np(np.zeros((n, n, 2 * n)), split_axis, concat_axis).shape)

    def total(x):
        y = all_to_all_np(np.sin(x), split_axis, concat_axis)
        return (y * y * w).sum() + sum((y[d] * x[d].sum()).sum() for d in range(n))

    def f(x):
        y = pw.all_to_all(pnp.sin(x), "i", split_axis, concat_axis, tiled=True)
        wd = pnp.take(w, pw.axis_index("i").reshape(1), axis=0)[0]
        return (y * y * wd).sum() + (y * x.sum()).sum()

    check_grads(tpus, f, [x], total=total)


def untiled_all_to_all_np(x, split_axis, concat_axis):
    """jax.lax.all_to_all's default: device i stacks every device's index i of the split axis."""
    n = x.shape[0]
    return np.stack([np.stack([np.take(x[d], i, axis=split_axis) for d in range(n)],
                              axis=concat_axis) for i in range(n)])


@pytest.mark.parametrize("split_axis, concat_axis", [(0, 0), (0, 1), (1, 0), (-1, 0)])
def test_untiled_all_to_all(tpus, split_axis, concat_axis):
    n = len(tpus)
    rng = rng_for("untiled_all_to_all", n, split_axis, concat_axis)
    x = stacked(rng, n, (n, n))
    w = rng.standard_normal(x.shape)

    def total(x):
        y = untiled_all_to_all_np(np.sin(x), split_axis, concat_axis)
        return (y * y * w).sum()

    def f(x):
        y = pw.all_to_all(pnp.sin(x), "i", split_axis, concat_axis)
        wd = pnp.take(w, pw.axis_index("i").reshape(1), axis=0)[0]
        return (y * y * wd).sum()

    check_grads(tpus, f, [x], total=total)


def test_collective_of_constant_and_traced_mix(tpus):
    """A psum of an input-independent value passes no cotangent anywhere."""
    n = len(tpus)
    x = np.arange(n * 2, dtype=np.float64).reshape(n, 2)
    (g,) = pmap_grads(
        tpus, lambda x: (pw.psum(pw.axis_index("i").astype(np.float64), "i") * x).sum(), [x], (0,)
    )
    np.testing.assert_array_equal(g, np.full_like(x, n * (n - 1) / 2))


def test_data_parallel_step_matches_full_batch(tpus):
    """pmean of per-shard gradients of an MSE equals the full-batch gradient."""
    n = len(tpus)
    rng = rng_for("data-parallel", n)
    per_shard, features = 3, 4
    x = rng.standard_normal((n, per_shard, features))
    y = rng.standard_normal((n, per_shard))
    w = rng.standard_normal(features)
    b = 0.3

    def loss(params, x, y):
        pred = x @ params["w"] + params["b"]
        return ((pred - y) ** 2).mean()

    def step(params, x, y):
        return pw.pmean(pw.grad(loss)(params, x, y), "i")

    params = {"w": np.broadcast_to(w, (n, features)).copy(), "b": np.full(n, b)}
    grads = pw.pmap(step, devices=tpus, axis_name="i")(params, x, y)
    gw, gb = np.asarray(grads["w"]), np.asarray(grads["b"])
    # Full batch on one device, in numpy.
    X, Y = x.reshape(-1, features), y.reshape(-1)
    r = X @ w + b - Y
    want_w = 2 * X.T @ r / len(Y)
    want_b = 2 * r.mean()
    for d in range(n):
        np.testing.assert_allclose(gw[d], want_w, rtol=1e-12)
        np.testing.assert_allclose(gb[d], want_b, rtol=1e-12)
    # The same through pw.grad on one device, outside any trace.
    full = pw.grad(loss)({"w": w, "b": b}, X, Y)
    np.testing.assert_allclose(full["w"], want_w, rtol=1e-12)
    np.testing.assert_allclose(full["b"], want_b, rtol=1e-12)


# --- API: argnums, pytrees, has_aux, value_and_grad ---------------------------------


def test_argnums(tpus2):
    x = np.array([[1.0, 2.0], [3.0, 4.0]])
    y = np.array([[5.0, 6.0], [7.0, 8.0]])
    z = np.array([[0.5, 0.25], [2.0, 4.0]])
    f = lambda x, y, z: (x * y * z).sum()  # noqa: E731
    g = np.asarray(pw.pmap(pw.grad(f), devices=tpus2)(x, y, z))
    np.testing.assert_array_equal(g, y * z)
    g = np.asarray(pw.pmap(pw.grad(f, argnums=2), devices=tpus2)(x, y, z))
    np.testing.assert_array_equal(g, x * y)
    g = np.asarray(pw.pmap(pw.grad(f, argnums=-2), devices=tpus2)(x, y, z))
    np.testing.assert_array_equal(g, x * z)
    gz, gx = pw.pmap(pw.grad(f, argnums=(2, 0)), devices=tpus2)(x, y, z)
    np.testing.assert_array_equal(np.asarray(gz), x * y)
    np.testing.assert_array_equal(np.asarray(gx), y * z)
    (gy,) = pw.pmap(pw.grad(f, argnums=(1,)), devices=tpus2)(x, y, z)
    np.testing.assert_array_equal(np.asarray(gy), x * z)


def test_pytree_arguments(tpus2):
    params = {
        "dense": [np.array([[1.0, 2.0], [3.0, 4.0]]), np.array([0.5, -0.5])],
        "scale": (np.array([[2.0], [3.0]], np.float32),),
        "unused": np.array([1.0, 1.0]),
        "none": None,
    }

    def f(p, x):
        w, b = p["dense"]
        (s,) = p["scale"]
        return ((w * x + b) * s).sum()

    x = np.array([[1.0, -1.0], [2.0, 0.0]])
    g = pw.pmap(pw.grad(f), devices=tpus2)(params, x)
    assert set(g) == {"dense", "scale", "unused", "none"}
    assert isinstance(g["dense"], list) and isinstance(g["scale"], tuple) and g["none"] is None
    w, b = params["dense"]
    (s,) = params["scale"]
    np.testing.assert_array_equal(np.asarray(g["dense"][0]), x * s)
    np.testing.assert_array_equal(np.asarray(g["dense"][1]), 2 * s[:, 0])
    gs = np.asarray(g["scale"][0])
    assert gs.dtype == np.float32
    np.testing.assert_allclose(gs[:, 0], (w * x + b[:, None]).sum(axis=1))
    np.testing.assert_array_equal(np.asarray(g["unused"]), [0.0, 0.0])


def test_has_aux_and_value_and_grad(tpus2):
    x = np.array([[1.0, 2.0], [3.0, 4.0]])

    def f(x):
        y = x * x
        return y.sum(), {"y": y, "n": x.max()}

    g, aux = pw.pmap(pw.grad(f, has_aux=True), devices=tpus2)(x)
    np.testing.assert_array_equal(np.asarray(g), 2 * x)
    np.testing.assert_array_equal(np.asarray(aux["y"]), x * x)
    np.testing.assert_array_equal(np.asarray(aux["n"]), x.max(axis=1))
    (v, aux), g = pw.pmap(pw.value_and_grad(f, has_aux=True), devices=tpus2)(x)
    np.testing.assert_array_equal(np.asarray(v), (x * x).sum(axis=1))
    np.testing.assert_array_equal(np.asarray(g), 2 * x)
    np.testing.assert_array_equal(np.asarray(aux["y"]), x * x)
    v, (ga, gb) = pw.pmap(pw.value_and_grad(lambda a, b: (a * b).sum(), argnums=(0, 1)),
                          devices=tpus2)(x, x + 1.0)
    np.testing.assert_array_equal(np.asarray(v), (x * (x + 1)).sum(axis=1))
    np.testing.assert_array_equal(np.asarray(ga), x + 1)
    np.testing.assert_array_equal(np.asarray(gb), x)


def test_gradient_of_input_independent_output_is_zero(tpus2):
    x = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    for f in (lambda x: 3.0, lambda x: pw.stop_gradient(x).sum(), lambda x: (x > 1).sum() * 1.0):
        g = np.asarray(pw.pmap(pw.grad(f), devices=tpus2)(x))
        assert g.dtype == np.float32 and g.shape == x.shape
        np.testing.assert_array_equal(g, 0.0)
    # The output is the input itself (a scalar).
    s = np.array([2.0, 3.0])
    np.testing.assert_array_equal(np.asarray(pw.pmap(pw.grad(lambda x: x), devices=tpus2)(s)), 1.0)


def test_numpy_and_python_float_arguments_inside_pmap(tpus2):
    """Concrete differentiated arguments become constants whose gradient is traced."""
    x = np.array([[1.0, 2.0], [3.0, 4.0]])

    def f(x):
        gc = pw.grad(lambda c, x: (c * x).sum())(np.array([2.0, 5.0]), x)
        gs = pw.grad(lambda s, x: s * s * x.sum())(1.5, x)
        return gc, gs

    gc, gs = pw.pmap(f, devices=tpus2)(x)
    np.testing.assert_array_equal(np.asarray(gc), x)
    np.testing.assert_array_equal(np.asarray(gs), 3.0 * x.sum(axis=1))
    assert np.asarray(gs).dtype == np.float64


# --- Nested grad, aliasing, stop_gradient -------------------------------------------

# name: (f, f', f'')
SECOND = {
    "sin": (pnp.sin, np.cos, lambda x: -np.sin(x)),
    "exp": (pnp.exp, np.exp, np.exp),
    "tanh": (pnp.tanh, lambda x: 1 - np.tanh(x) ** 2,
             lambda x: -2 * np.tanh(x) * (1 - np.tanh(x) ** 2)),
    "log": (pnp.log, lambda x: 1 / x, lambda x: -1 / x**2),
    "sqrt": (pnp.sqrt, lambda x: 0.5 / np.sqrt(x), lambda x: -0.25 * x**-1.5),
    "rsqrt": (pnp.rsqrt, lambda x: -0.5 * x**-1.5, lambda x: 0.75 * x**-2.5),
    "cube": (lambda x: x**3, lambda x: 3 * x**2, lambda x: 6 * x),
    "recip": (lambda x: 1 / x, lambda x: -1 / x**2, lambda x: 2 / x**3),
    "x_sin_x": (lambda x: x * pnp.sin(x), lambda x: np.sin(x) + x * np.cos(x),
                lambda x: 2 * np.cos(x) - x * np.sin(x)),
    "pow_x_x": (lambda x: x**x, lambda x: x**x * (np.log(x) + 1),
                lambda x: x**x * (np.log(x) + 1) ** 2 + x ** (x - 1)),
}


@pytest.mark.parametrize("name", list(SECOND))
def test_second_derivative(tpus2, name):
    f, d1, d2 = SECOND[name]
    x = np.array([0.7, 1.9])
    g1 = pw.pmap(pw.grad(f), devices=tpus2)
    g2 = pw.pmap(pw.grad(pw.grad(f)), devices=tpus2)
    np.testing.assert_allclose(np.asarray(g1(x)), d1(x), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(g2(x)), d2(x), rtol=1e-12)


def test_third_derivative_and_hessian_diagonal(tpus2):
    x = np.array([0.4, 1.3])
    g3 = pw.pmap(pw.grad(pw.grad(pw.grad(lambda x: pnp.sin(x) * x * x))), devices=tpus2)
    want = 6 * np.cos(x) - 6 * x * np.sin(x) - x**2 * np.cos(x)  # (x^2 sin x)
    np.testing.assert_allclose(np.asarray(g3(x)), want, rtol=1e-12)
    # A vector function: grad of (sum of the gradient's entries) is the Hessian's row sums.
    v = np.array([[0.5, 1.0, 1.5], [2.0, -1.0, 0.25]])

    def h(x):
        inner = pw.grad(lambda x: (pnp.exp(x) * x.sum()).sum())
        return inner(x).sum()

    g = np.asarray(pw.pmap(pw.grad(h), devices=tpus2)(v))
    # f = S * sum(e^x): H = diag(S e^x) + e^x 1^T + 1 e^x^T; row sums of H.
    e, s = np.exp(v), v.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(g, s * e + e * v.shape[1] + e.sum(axis=1, keepdims=True), rtol=1e-12)


def test_nested_grad_with_collectives(tpus):
    n = len(tpus)
    x = np.linspace(0.5, 1.5, n)

    # Each device: S**3 with S = psum(x); the total n S**3 gives the inner
    # gradient 3 n S**2 on every device, whose total 3 n**2 S**2 gives 6 n**2 S.
    def inner(x):
        return pw.psum(x, "i") ** 3

    g2 = pw.pmap(pw.grad(lambda x: pw.grad(inner)(x)), devices=tpus, axis_name="i")
    s = x.sum()
    np.testing.assert_allclose(np.asarray(g2(x)), np.full(n, 6 * n**2 * s), rtol=1e-12)


def test_same_value_as_two_arguments(tpus2):
    x = np.array([[1.0, 2.0], [3.0, 4.0]])
    f = lambda a, b: (a * b * b).sum()  # noqa: E731
    ga, gb = pw.pmap(lambda x: pw.grad(f, argnums=(0, 1))(x, x), devices=tpus2)(x)
    np.testing.assert_array_equal(np.asarray(ga), x * x)
    np.testing.assert_array_equal(np.asarray(gb), 2 * x * x)
    # Only the first is differentiated: the second is a constant.
    g = pw.pmap(lambda x: pw.grad(f)(x, x), devices=tpus2)(x)
    np.testing.assert_array_equal(np.asarray(g), x * x)
    # The same leaf twice in one pytree.
    g = pw.pmap(lambda x: pw.grad(lambda p: (p[0] * p[1]).sum())([x, x]), devices=tpus2)(x)
    np.testing.assert_array_equal(np.asarray(g[0]), x)
    np.testing.assert_array_equal(np.asarray(g[1]), x)


def test_closed_over_value_is_not_the_input(tpus2):
    """d/dx [d/dy (x * y) at y = x] = d/dx x = 1 (no perturbation confusion)."""
    x = np.array([0.5, 2.0])
    g = pw.pmap(pw.grad(lambda x: pw.grad(lambda y: x * y)(x)), devices=tpus2)(x)
    np.testing.assert_array_equal(np.asarray(g), [1.0, 1.0])
    g = pw.pmap(lambda x: pw.grad(lambda y: x * y * y)(x), devices=tpus2)(x)
    np.testing.assert_array_equal(np.asarray(g), 2 * x * x)


def test_stop_gradient(tpus2):
    x = np.array([[1.0, 2.0], [3.0, 4.0]])
    g = pw.pmap(pw.grad(lambda x: (pw.stop_gradient(x) * x).sum()), devices=tpus2)(x)
    np.testing.assert_array_equal(np.asarray(g), x)
    # Pytrees; int and bool leaves pass through.
    def f(x):
        t = pw.stop_gradient({"a": x * x, "b": [x > 0, 3]})
        assert t["b"][1] == 3
        return (t["a"] * x).sum() + t["b"][0].sum()

    fn = pw.pmap(pw.grad(f), devices=tpus2)
    np.testing.assert_array_equal(np.asarray(fn(x)), x * x)
    # In a second derivative, the stopped factor stays a constant.
    g2 = pw.pmap(pw.grad(pw.grad(lambda x: pw.stop_gradient(x * x) * x * x)), devices=tpus2)
    s = np.array([1.5, -2.0])
    np.testing.assert_array_equal(np.asarray(g2(s)), 2 * s * s)
    # Outside a trace it returns its argument.
    tree = {"a": np.ones(2), "b": 3.0}
    assert pw.stop_gradient(tree) is tree


# --- Outside a trace ---------------------------------------------------------------


def test_grad_outside_a_trace():
    g = pw.grad(lambda x: (x**3).sum())(np.array([1.0, 2.0, 3.0]))
    assert isinstance(g, np.ndarray) and g.dtype == np.float64
    np.testing.assert_array_equal(g, [3.0, 12.0, 27.0])
    # Python floats are float64; a scalar gradient is a 0-d array.
    g = pw.grad(lambda x, y: x * y * y, argnums=(0, 1))(3.0, 2.0)
    assert all(isinstance(v, np.ndarray) and v.shape == () and v.dtype == np.float64 for v in g)
    assert (float(g[0]), float(g[1])) == (4.0, 12.0)
    # float32 stays float32.
    g = pw.grad(lambda x: (x * x).sum())(np.array([1.0, -2.0], np.float32))
    assert g.dtype == np.float32
    np.testing.assert_array_equal(g, [2.0, -4.0])
    v, g = pw.value_and_grad(lambda p: p["a"] * pnp.exp(p["b"]))({"a": 2.0, "b": 0.0})
    assert float(v) == 2.0 and float(g["a"]) == 1.0 and float(g["b"]) == 2.0
    (g, aux) = pw.grad(lambda x: ((x * x).sum(), x + 1.0), has_aux=True)(np.array([1.0, 2.0]))
    np.testing.assert_array_equal(g, [2.0, 4.0])
    np.testing.assert_array_equal(aux, [2.0, 3.0])
    # Keyword arguments pass through undifferentiated.
    g = pw.grad(lambda x, scale: (x * x).sum() * scale)(np.array([1.0, 2.0]), scale=3.0)
    np.testing.assert_array_equal(g, [6.0, 12.0])
    # Nested, outside: second derivative of x**4 at 2 is 48.
    assert float(pw.grad(pw.grad(lambda x: x**4))(2.0)) == 48.0


def test_grad_outside_a_trace_reuses_its_compiled_function():
    traces = []

    def f(x):
        traces.append(x.shape)
        return (x * x).sum()

    gf = pw.grad(f)
    np.testing.assert_array_equal(gf(np.array([1.0, 2.0])), [2.0, 4.0])
    np.testing.assert_array_equal(gf(np.array([3.0, 4.0])), [6.0, 8.0])
    assert traces == [(2,)]  # Traced once for both calls.
    np.testing.assert_array_equal(gf(np.array([1.0, 2.0, 3.0])), [2.0, 4.0, 6.0])
    assert traces == [(2,), (3,)]
    assert gf.__name__ == "f" and gf.__wrapped__ is f


def test_grad_in_a_program_through_pmap(tpus2):
    step = pw.pmap(pw.grad(lambda x: (pnp.sin(x) * x).sum()), devices=tpus2)

    @pw.program
    def p(x):
        return step(step(x))

    x = np.array([[0.5, 1.0], [1.5, 2.0]])
    d = lambda v: np.sin(v) + v * np.cos(v)  # noqa: E731
    np.testing.assert_allclose(np.asarray(p(x)), d(d(x)), rtol=1e-12)


# --- Errors --------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.int32, np.bool_])
def test_int_and_bool_inputs_are_errors(tpus2, runtime_ok, dtype):
    x = np.ones((2, 3), dtype)
    name = np.dtype(dtype).name
    msg = (f"grad requires real-valued inputs (float32, float64 or bfloat16), got {name} for "
           "argument 0")
    with pytest.raises(TypeError, match=re.escape(msg)):
        pw.pmap(pw.grad(lambda x: x.sum() * 1.0), devices=tpus2)(x)
    with pytest.raises(TypeError, match=re.escape(msg.replace("argument 0", "argument 1"))):
        pw.pmap(lambda a, x: pw.grad(lambda a, x: a.sum(), argnums=(0, 1))(a, x),
                devices=tpus2)(np.ones((2, 3)), x)
    with pytest.raises(TypeError, match=re.escape(msg)):
        pw.grad(lambda x: x.sum() * 1.0)(x[0])
    runtime_ok()


def test_python_int_input_is_an_error(tpus2, runtime_ok):
    with pytest.raises(TypeError, match=re.escape(
            "grad requires real-valued inputs (float32, float64 or bfloat16), got int for argument 0")):
        pw.grad(lambda x: x * 1.0)(3)
    with pytest.raises(TypeError, match=re.escape("got int for argument 0")):
        pw.pmap(lambda x: pw.grad(lambda a, x: (a * x).sum())(2, x), devices=tpus2)(np.ones(2))
    runtime_ok()


@pytest.mark.parametrize(
    "fn, message",
    [
        (lambda x: x * 2.0,
         "Gradient only defined for scalar-output functions. Output had shape f64[3] "
         "(grad of 'f' in pmap of 'outer')"),
        (lambda x: x.sum() > 0,
         "grad requires real-valued outputs (float32, float64 or bfloat16), got pred[] "
         "(grad of 'f' in pmap of 'outer')"),
        (lambda x: x.argmax(),
         "grad requires real-valued outputs (float32, float64 or bfloat16), got i32[]"),
        (lambda x: "loss", "grad of 'f': the function must return a float scalar, got 'loss'"),
    ],
)
def test_output_errors(tpus2, runtime_ok, fn, message):
    def outer(x):
        f = fn
        f.__name__ = "f"
        return pw.grad(f)(x)

    with pytest.raises(TypeError, match=re.escape(message)):
        pw.pmap(outer, devices=tpus2)(np.ones((2, 3)))
    runtime_ok()


def test_has_aux_needs_a_pair(tpus2, runtime_ok):
    def f(x):
        return x.sum()

    with pytest.raises(TypeError, match=re.escape(
            "grad of 'f' with has_aux=True: the function must return a pair (output, auxiliary "
            "data), got Tracer")):
        pw.pmap(pw.grad(f, has_aux=True), devices=tpus2)(np.ones((2, 3)))
    runtime_ok()


def test_argnums_errors(tpus2, runtime_ok):
    def f(x):
        return x.sum()

    with pytest.raises(TypeError, match=re.escape(
            "grad of 'f': differentiating with respect to argnums=1 requires at least 2 "
            "positional arguments, got 1")):
        pw.pmap(pw.grad(f, argnums=1), devices=tpus2)(np.ones((2, 3)))
    with pytest.raises(ValueError, match=re.escape("grad of 'f': argnums repeats argument 0")):
        pw.grad(f, argnums=(0, -1))(np.ones(3))
    with pytest.raises(TypeError, match="grad expects a callable"):
        pw.grad(3)
    with pytest.raises(TypeError, match="value_and_grad expects a callable"):
        pw.value_and_grad(None)
    runtime_ok()


def test_grad_in_program_outside_pmap_is_an_error(runtime_ok):
    def loss(x):
        return x.sum()

    @pw.program
    def p(x):
        return pw.grad(loss)(x)

    with pytest.raises(pw.TracerError, match=re.escape(
            "grad of 'loss' was called in @pw.program 'p' outside any pmap'd function: grad "
            "must be called inside a pmap'd function")):
        p(np.ones((2, 3)))
    runtime_ok()


def test_escaped_tracer_as_grad_argument(tpus2, runtime_ok):
    leaked = []
    pw.pmap(lambda x: leaked.append(x) or x, devices=tpus2)(np.ones(2))
    with pytest.raises(pw.TracerError, match="escaped tracer"):
        pw.pmap(lambda x: pw.grad(lambda a: a * x)(leaked[0]), devices=tpus2)(np.ones(2))
    runtime_ok()


def test_error_inside_differentiated_function_leaves_no_tape(tpus2, runtime_ok):
    def f(x):
        def bad(y):
            raise RuntimeError("boom")

        try:
            pw.grad(bad)(x)
        except RuntimeError:
            pass
        # A tape left behind would record this; the result must still be right.
        return pw.grad(lambda y: (y * y).sum())(x)

    np.testing.assert_array_equal(np.asarray(pw.pmap(f, devices=tpus2)(np.array([[1.0], [2.0]]))),
                                  [[2.0], [4.0]])
    runtime_ok()


def test_program_values_in_grad(runtime_ok):
    tpus = get_devices(2)

    @pw.program
    def returns_program_value(v):
        return pw.pmap(lambda x: pw.grad(lambda y: v)(x), devices=tpus)(v)

    with pytest.raises(pw.TracerError, match=re.escape(
            "grad of '<lambda>' in pmap of '<lambda>': the function returned a traced program "
            "value (f64[2])")):
        returns_program_value(np.ones(2))

    @pw.program
    def differentiates_program_value(v):
        return pw.pmap(lambda x: pw.grad(lambda y: y.sum())(v), devices=tpus)(v)

    with pytest.raises(pw.TracerError, match=re.escape(
            "grad in pmap of '<lambda>' got a traced program value (f64[2]) for argument 0")):
        differentiates_program_value(np.ones(2))
    runtime_ok()


def test_primitive_without_rule(tpus2, runtime_ok, monkeypatch):
    monkeypatch.setattr(PRIMITIVES["sin"], "vjp", None)

    def f(x):
        return pnp.sin(x).sum()

    with pytest.raises(NotImplementedError, match=re.escape(
            "pw.grad of 'f' in pmap of 'f': differentiation of primitive 'sin' is not "
            "implemented")):
        pw.pmap(pw.grad(f), devices=tpus2)(np.ones((2, 3)))
    # Off the path from the inputs to the output, the missing rule does not matter.
    g = pw.pmap(pw.grad(lambda x: (x * pnp.sin(np.ones(3))).sum() + (pnp.sin(x) > 2).sum()),
                devices=tpus2)(np.ones((2, 3)))
    np.testing.assert_allclose(np.asarray(g), np.full((2, 3), np.sin(1.0)))
    runtime_ok()


# --- Property-based (hypothesis) ------------------------------------------------

# Smooth elementwise maps over all reals (pnp functions or Tracer operators).
_SMOOTH = {
    "sin": pnp.sin,
    "cos": pnp.cos,
    "tanh": pnp.tanh,
    "exp_half": lambda x: pnp.exp(x * 0.5),
    "square": lambda x: x * x,
    "softplus": lambda x: pnp.log(1.0 + pnp.exp(x)),
    "gelu": pw.nn.gelu,
}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    chain=st.lists(st.sampled_from(sorted(_SMOOTH)), min_size=1, max_size=4),
    shape=st.lists(st.integers(1, 3), max_size=2).map(tuple),
    reduce_first=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_property_random_compositions_match_finite_differences(tpus2, chain, shape, reduce_first, seed):
    """A random chain of smooth maps, a random weighting and a sum or a softmax-weighted sum."""
    # Within [-2, 2]: three exp_half in a row then overflow float64 nowhere
    # (from x = 4 they reach exp(4.8e8)).
    x = np.clip(np.random.default_rng(seed).standard_normal((2,) + shape), -2.0, 2.0)
    w = np.random.default_rng(seed + 1).standard_normal(shape)
    # Chains that blow up (square, then exp_half three times, reaches
    # exp(2.6e8) from x = 2) leave the finite differences nothing to measure
    # (inf - inf, or a softmax of values 1e8 apart): only chains whose values
    # stay moderate are a test of the gradients.
    v = x
    for name in chain:
        with np.errstate(over="ignore", invalid="ignore"):
            v = _NUMPY_MAPS[name](v)
    assume(bool(np.all(np.isfinite(v))) and float(np.abs(v).max()) < 30.0)

    def f(v):
        for name in chain:
            v = _SMOOTH[name](v)
        if reduce_first or not shape:
            return (v * w).sum()
        return (pw.nn.softmax(v, axis=-1) * w).sum()

    check_grads(tpus2, f, [x], rtol=1e-5, atol=1e-6, total=sum_over_devices(
        lambda v: _numpy_chain(chain, v, w, reduce_first or not shape)))


_NUMPY_MAPS = {
    "sin": np.sin,
    "cos": np.cos,
    "tanh": np.tanh,
    "exp_half": lambda x: np.exp(x * 0.5),
    "square": lambda x: x * x,
    "softplus": lambda x: np.logaddexp(0.0, x),
    "gelu": lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3))),
}


def _numpy_chain(chain, v, w, plain_sum):
    for name in chain:
        v = _NUMPY_MAPS[name](v)
    if plain_sum:
        return (v * w).sum()
    e = np.exp(v - v.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True) * w).sum()
