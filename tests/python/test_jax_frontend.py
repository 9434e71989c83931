"""JAX as the front end: functions written with jax.numpy and jax.lax, traced by JAX and lowered
into the function IR, give JAX's results (pathways._jax_frontend).

Each case runs through `pw.jit` (one device) and `jax.jit` on the same inputs, random and edge
values (NaN, inf, -0.0, empty shapes); per-device functions with collectives run through
`pw.pmap` and `jax.vmap` with the same axis name (JAX's batching of collectives gives pmap's
answers on one CPU device).
"""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = jax.numpy
lax = jax.lax

import pathways as pw  # noqa: E402
from pathways import _jax_frontend  # noqa: E402

from conftest import assert_runtime_works  # noqa: E402

RNG = np.random.default_rng(0)
EDGES = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-30, -1e30, 2.5, -2.5, 0.5], np.float32)


def _f32(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def assert_same(got, want, rtol=2e-6, atol=1e-6):
    got_leaves, got_tree = jax.tree_util.tree_flatten(got)
    want_leaves, want_tree = jax.tree_util.tree_flatten(want)
    assert got_tree == want_tree
    for g, w in zip(got_leaves, want_leaves):
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape, (g.shape, w.shape)
        assert g.dtype == w.dtype, (g.dtype, w.dtype)
        if w.dtype.kind in "fV":
            np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=rtol,
                                       atol=atol, equal_nan=True)
            # signed zeros as JAX's
            zeros = (w == 0) & (g == 0)
            assert np.array_equal(np.signbit(g[zeros]), np.signbit(w[zeros]))
        else:
            np.testing.assert_array_equal(g, w)


def _through_jax(fn):
    """`fn` with its array arguments made JAX arrays first (jnp.asarray), so that pathways hands
    it to JAX's tracer even where `fn` is all operators, which pathways' own tracer takes."""

    def wrapped(*args):
        def as_jax(x):
            keys = not hasattr(x, "dtype") or jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)
            return x if keys else jnp.asarray(x)

        return fn(*jax.tree_util.tree_map(as_jax, args))

    return wrapped


def check(fn, *args, rtol=2e-6, atol=1e-6):
    jitted = pw.jit(_through_jax(fn))
    assert_same(jitted(*args), jax.jit(fn)(*args), rtol, atol)
    assert jitted._mapped()._front_end == "jax"


UNARY = {
    "sin": jnp.sin, "cos": jnp.cos, "tan": jnp.tan, "tanh": jnp.tanh, "exp": jnp.exp,
    "log": jnp.log, "sqrt": jnp.sqrt, "rsqrt": lax.rsqrt, "abs": jnp.abs, "neg": jnp.negative,
    "sign": jnp.sign, "floor": jnp.floor, "ceil": jnp.ceil, "round": jnp.round,
    "round_away": lambda x: lax.round(x, lax.RoundingMethod.AWAY_FROM_ZERO),
    "is_finite": jnp.isfinite, "log1p": jnp.log1p, "expm1": jnp.expm1, "logistic": jax.nn.sigmoid,
    "erf": jax.scipy.special.erf, "erfc": jax.scipy.special.erfc, "square": jnp.square,
    "integer_pow3": lambda x: x ** 3, "integer_pow_m2": lambda x: lax.integer_pow(x, -2),
    "arcsin": jnp.arcsin, "arccos": jnp.arccos, "arctan": jnp.arctan, "sinh": jnp.sinh,
    "cosh": jnp.cosh, "arcsinh": jnp.arcsinh, "arccosh": jnp.arccosh, "arctanh": jnp.arctanh,
    "exp2": jnp.exp2, "cbrt": jnp.cbrt, "relu": jax.nn.relu, "gelu": jax.nn.gelu,
    "gelu_exact": lambda x: jax.nn.gelu(x, approximate=False), "silu": jax.nn.silu,
    "softplus": jax.nn.softplus, "stop_gradient": lax.stop_gradient,
}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_against_jax(name):
    fn = UNARY[name]
    x = np.concatenate([_f32(20), EDGES])
    tol = {"tan": 1e-5, "exp2": 1e-5, "cbrt": 1e-5, "gelu_exact": 1e-5, "erfc": 1e-5}.get(name, 2e-6)
    check(fn, x, rtol=tol, atol=1e-6)


def test_erf_inv_against_jax():
    x = np.concatenate([np.linspace(-1, 1, 41, dtype=np.float32), np.float32([0.999999, -1e-8, np.nan])])
    check(jax.scipy.special.erfinv, x, rtol=1e-5, atol=1e-6)


BINARY = {
    "add": jnp.add, "sub": jnp.subtract, "mul": jnp.multiply, "div": jnp.divide,
    "max": jnp.maximum, "min": jnp.minimum, "pow": jnp.power, "atan2": jnp.arctan2,
    "rem": lax.rem, "eq": jnp.equal, "ne": jnp.not_equal, "lt": jnp.less, "ge": jnp.greater_equal,
    "nextafter": jnp.nextafter, "where": lambda a, b: jnp.where(a > b, a, b), "clamp": lambda a, b: lax.clamp(-1.0, a, 1.0) + b,
}


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_against_jax(name):
    a = np.concatenate([_f32(20), EDGES])
    b = np.concatenate([_f32(20), EDGES[::-1]])
    check(BINARY[name], a, b, rtol=1e-5)


def test_integer_ops_against_jax():
    a = np.array([7, -7, 0, 2**31 - 1, -2**31, 5, -1, 3], np.int32)
    b = np.array([2, 2, 3, -1, -1, 0, 0, -4], np.int32)
    check(lambda a, b: (lax.div(a, b), lax.rem(a, b)), a, b)
    check(lambda a, b: (a // jnp.where(b == 0, 1, b), a % jnp.where(b == 0, 1, b)), a, b)
    check(lambda a, b: (a & b, a | b, a ^ b, ~a, a << (b & 7), a >> (b & 7), ~(a > b)), a, b)
    check(lambda a: (jnp.abs(a), jnp.sign(a), -a, a.astype(jnp.float32)), a)
    u = np.array([0, 1, 2**32 - 1, 12345, 7], np.uint32)
    check(lambda u: (lax.shift_right_logical(u, jnp.uint32(3)), u * jnp.uint32(3), u + u,
                     lax.div(u, jnp.uint32(3)), u.astype(jnp.int32)), u)


def test_conversions_against_jax():
    x = np.concatenate([_f32(10) * 1e3, EDGES[3:]])
    check(lambda x: (x.astype(jnp.int32), x.astype(jnp.bool_), x.astype(jnp.bfloat16),
                     (x > 0).astype(jnp.float32), lax.bitcast_convert_type(x, jnp.int32),
                     lax.bitcast_convert_type(x, jnp.uint32)), x)


def test_shapes_against_jax():
    x = _f32(2, 3, 4)
    check(lambda x: (x.reshape(4, 6), x.T, jnp.transpose(x, (1, 0, 2)), x[:, 1:3, ::2],
                     x[::-1], jnp.expand_dims(x, 1), x[:, :1].squeeze(1),
                     jnp.broadcast_to(x[:, :1], (2, 3, 4)), jnp.concatenate([x, x], axis=1),
                     jnp.stack([x, x], 2), jnp.tile(x, (1, 2, 1)), jnp.flip(x, (0, 2)),
                     jnp.zeros_like(x), jnp.ones((2, 0)), jnp.arange(5.0), jnp.eye(3)), x)
    check(lambda x: (jnp.pad(x, ((1, 2), (0, 1), (2, 0)), constant_values=3.0),
                     lax.pad(x, 1.5, ((1, -1, 1), (-1, 2, 0), (0, 0, 2)))), x)
    check(lambda x: jnp.split(x, [1, 3], axis=2), x)
    one_device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    check(lambda x: (lax.reduce_precision(x, 8, 7), lax.reduce_precision(x, 8, 23),
                     lax.optimization_barrier(x), jax.device_put(x) * 2,
                     lax.with_sharding_constraint(x, one_device)), x)
    check(lambda x: jnp.unstack(x, axis=1), x)


def test_reductions_against_jax():
    x = np.concatenate([_f32(3, 4), EDGES[:4].reshape(1, 4)])
    check(lambda x: (x.sum(), x.sum(0), x.max(1), x.min(), jnp.prod(x[:, :2], 1), x.mean(0),
                     jnp.argmax(x, 0), jnp.argmin(x, 1), jnp.any(x > 1, 1), jnp.all(x > -3),
                     jax.nn.logsumexp(x[1:], 1), jnp.var(x[1:], 0)), x)
    e = np.zeros((0, 3), np.float32)
    check(lambda e: (e.sum(0), jnp.max(e, 0, initial=-2.0), jnp.prod(e, 0), jnp.any(e > 0, 0),
                     jnp.all(e > 0, 0)), e)


def test_cumulative_against_jax():
    x = _f32(4, 5)
    check(lambda x: (jnp.cumsum(x, 1), jnp.cumprod(x, 0), lax.cummax(x, 1), lax.cummin(x, 0, reverse=True),
                     lax.cumlogsumexp(x, 1), lax.cumlogsumexp(x, 0, reverse=True)), x, rtol=1e-5)
    check(lambda x: lax.cumlogsumexp(x), np.float32([-1000, 0, -1000, 3, -np.inf]))


def test_dot_general_against_jax():
    a, b = _f32(2, 3, 4), _f32(2, 4, 5)
    check(lambda a, b: (a @ b, jnp.einsum("bij,bjk->bik", a, b), jnp.einsum("bij,bjk->kib", a, b),
                       jnp.dot(a[0], b[0]), jnp.tensordot(a, b, ((0, 2), (0, 1))),
                       jnp.einsum("bij,bij->", a, a), jnp.outer(a[0, 0], b[0, 0])), a, b, rtol=1e-5,
          atol=1e-5)
    i = np.arange(12, dtype=np.int32).reshape(3, 4)
    check(lambda i: (i @ i.T, jnp.dot(i, i.T, preferred_element_type=jnp.float32)), i)
    check(lambda a: a[:, :0] @ jnp.ones((0, 3), jnp.float32), a[0])


def test_indexing_against_jax():
    x = _f32(5, 6)
    idx = np.array([4, 0, -1, 2], np.int32)
    check(lambda x, i: (x[i], x[:, i], x[i, i], x[1:4, 2], x[-1], x[i, 1:3]), x, idx)
    check(lambda x, i: (x.at[i].add(1.0), x.at[i, 2].set(-1.0), x.at[:, i].mul(2.0),
                        x.at[i].max(0.5), x.at[i].min(0.0), x.at[2].get()), x, idx)
    check(lambda x, i: (x.at[i + 10].get(mode="fill", fill_value=-7.0), x.at[i + 10].add(1.0, mode="drop"),
                        x.at[i + 10].get(mode="clip")), x, idx)
    u = jnp.asarray(idx[:3])  # unique indices: set, mul, min, max and sub have one answer
    check(lambda x, i: (x.at[i].set(-2.0), x.at[i].multiply(3.0), x.at[i].min(-0.5),
                        x.at[i, 1].max(0.5), x.at[i].subtract(1.0)), x, np.asarray(u))
    check(lambda x, i: jnp.take_along_axis(x, jnp.argsort(x, axis=1), axis=1), x, idx)
    check(lambda x, s: (lax.dynamic_slice(x, (s, s + 1), (2, 3)), lax.dynamic_update_slice(x, jnp.ones((2, 2)), (s, 5)),
                        lax.dynamic_slice_in_dim(x, s * 9, 2, 0)), x, np.int32(3))
    # batched gather (operand_batching_dims) and scatter: vmap of indexing
    check(lambda x, i: jax.vmap(lambda r, k: r[k])(x[:4], i), x, idx)
    check(lambda x, i: jax.vmap(lambda r, k: r.at[k].add(5.0))(x[:4], i), x, idx)
    # one-hot gathers as flax.linen.Embed does
    tok = np.array([[1, 3], [0, 5]], np.int32)
    check(lambda x, t: jnp.take(x, t, axis=0), x, tok)


def test_sort_and_top_k_against_jax():
    x = np.concatenate([_f32(3, 7), np.float32([[np.nan, 1, -0.0, 0.0, np.inf, -np.inf, 1]])])
    check(lambda x: (jnp.sort(x, 1), jnp.sort(x, 0), jnp.argsort(x, 1), lax.top_k(x[:, :5], 3)), x)
    k = np.array([3, 1, 3, 2, 1], np.int32)
    v = np.arange(5, dtype=np.float32)
    check(lambda k, v: lax.sort((k, v), num_keys=1), k, v)
    check(lambda k, v: lax.sort((k, -v, v), num_keys=2), k, v)


def test_random_bits_against_jax():
    key = jax.random.PRNGKey(42)
    check(lambda k: (jax.random.bits(k, (7,)), jax.random.split(k, 3), jax.random.fold_in(k, 5),
                     jax.random.uniform(k, (2, 3)), jax.random.normal(k, (4,)),
                     jax.random.randint(k, (5,), 0, 10), jax.random.bernoulli(k, 0.3, (6,)),
                     jax.random.permutation(k, 6), jax.random.categorical(k, jnp.zeros((2, 4)))), key,
          rtol=1e-5)
    new_style = jax.random.key(7)
    check(lambda k: jax.random.key_data(jax.random.split(k, 2)), new_style)
    check(lambda k: jax.random.normal(jax.random.clone(k), (3,)), new_style)
    check(lambda s: jax.random.key_data(jax.random.PRNGKey(s)), np.int32(123))
    check(lambda k: jax.random.truncated_normal(k, -1.0, 2.0, (5,)), key, rtol=1e-5)


def test_control_flow_against_jax():
    x = _f32(4)
    check(lambda x: lax.scan(lambda c, v: (c * 0.5 + v, c + v), jnp.zeros(()), x), x)
    check(lambda x: lax.scan(lambda c, v: (c + v, c), x[:2], x.reshape(2, 2), reverse=True), x)
    check(lambda x: lax.fori_loop(0, 5, lambda i, c: c * 2 + i, x), x)
    check(lambda x: lax.cond(x.sum() > 0, jnp.sin, jnp.cos, x), x)
    check(lambda x: lax.cond(x.sum() < 0, jnp.sin, jnp.cos, x), x)
    check(lambda x: lax.switch(2, [jnp.sin, jnp.cos, jnp.tanh], x), x)
    check(lambda x, i: lax.switch(i, [jnp.sin, jnp.cos, jnp.tanh], x), x, np.int32(7))
    check(lambda x: jax.checkpoint(lambda y: jnp.sin(y) * y)(x), x)
    check(lambda x: lax.map(jnp.cumsum, x.reshape(2, 2)), x)


def test_autodiff_inside_against_jax():
    x = _f32(3, 4)

    def loss(w, x):
        return jnp.mean(jax.nn.gelu(x @ w) ** 2) + jnp.sum(jax.nn.log_softmax(x, -1))

    w = _f32(4, 2)
    check(jax.grad(loss), w, x, rtol=1e-5, atol=1e-6)
    check(jax.value_and_grad(loss, argnums=(0, 1)), w, x, rtol=1e-5, atol=1e-6)
    check(lambda w: jax.jvp(lambda v: loss(v, x), (w,), (jnp.ones_like(w),)), w, rtol=1e-5)
    check(lambda w: jax.vjp(lambda v: jnp.tanh(v) * 2, w)[1](jnp.ones_like(w)), w)
    check(lambda x: jax.vmap(lambda r: jnp.dot(r, r))(x), x)
    check(jax.grad(lambda w: jnp.sum(jax.checkpoint(lambda v: jnp.sin(v) @ v.T)(w))), x, rtol=1e-5)
    check(jax.grad(lambda x: lax.scan(lambda c, v: (c * v, c), 1.0, x)[0]), x[0], rtol=1e-5)
    check(jax.grad(lambda x: jnp.sum(jnp.sort(x, 1)[:, :2] * jnp.max(x, 1, keepdims=True))), x, rtol=1e-5)


@jax.custom_vjp
def _clip_gradient(x):
    return x


_clip_gradient.defvjp(lambda x: (x, None), lambda _, g: (jnp.clip(g, -0.1, 0.1),))


@jax.custom_jvp
def _safe_log(x):
    return jnp.log(x)


_safe_log.defjvp(lambda p, t: (_safe_log(p[0]), t[0] / jnp.maximum(p[0], 1e-3)))


def test_custom_derivatives_against_jax():
    x = np.abs(_f32(5)) + 0.01
    check(lambda x: (_clip_gradient(x), _safe_log(x)), x)
    check(jax.grad(lambda x: jnp.sum(_clip_gradient(x) * 3.0)), x)
    check(jax.grad(lambda x: jnp.sum(_safe_log(x))), x)


def test_bfloat16_against_jax():
    x = _f32(4, 8).astype(jnp.bfloat16)
    check(lambda x: (x * 2 + 1, jnp.tanh(x), x @ x.T, x.sum(1), x.astype(jnp.float32)), x, rtol=1e-2, atol=1e-2)


def test_float64_with_x64(jax64):
    x = RNG.standard_normal(6)
    check(lambda x: (jnp.sin(x) * 2, x.sum(), jax.scipy.special.erfinv(jnp.tanh(x))), x, rtol=1e-12, atol=1e-14)


def test_float64_arguments_without_x64_are_float32_as_in_jax():
    x = RNG.standard_normal(6)
    out = pw.jit(lambda x: jnp.sin(x))(x)
    assert out.dtype == np.float32
    np.testing.assert_allclose(np.asarray(out), np.sin(x).astype(np.float32), rtol=1e-6)


# --- pmap: collectives against jax.vmap with the same axis name ------------------------------


def check_pmap(fn, devices, *args, rtol=2e-6, atol=1e-6):
    mapped = pw.pmap(_through_jax(fn), axis_name="i", devices=devices)
    assert_same(mapped(*args), jax.vmap(fn, axis_name="i")(*args), rtol, atol)
    assert mapped._front_end == "jax"


def test_collectives_against_jax(tpus4):
    x = _f32(4, 8)
    check_pmap(lambda x: (lax.psum(x, "i"), lax.pmean(x, "i"), lax.pmax(x, "i"), lax.pmin(x, "i"),
                          lax.axis_index("i"), lax.psum(1, "i")), tpus4, x)
    check_pmap(lambda x: (lax.all_gather(x, "i"), lax.all_gather(x, "i", axis=1),
                          lax.all_gather(x, "i", tiled=True)), tpus4, x)
    check_pmap(lambda x: (lax.psum_scatter(x, "i", tiled=True),
                          lax.psum_scatter(x.reshape(4, 2), "i"),
                          lax.psum_scatter(x.reshape(2, 4), "i", scatter_dimension=1, tiled=True)), tpus4, x)
    check_pmap(lambda x: (lax.all_to_all(x.reshape(4, 2), "i", 0, 0),
                          lax.all_to_all(x.reshape(4, 2), "i", 0, 1),
                          lax.all_to_all(x.reshape(2, 4), "i", 1, 0, tiled=True),
                          lax.all_to_all(x, "i", 0, 0, tiled=True)), tpus4, x)
    check_pmap(lambda x: lax.ppermute(x, "i", [(0, 1), (1, 2), (2, 3), (3, 0)]), tpus4, x)
    check_pmap(lambda x: lax.pbroadcast(x, "i", 2), tpus4, x)
    check_pmap(lambda x: jax.grad(lambda v: jnp.sum(lax.pmean(v, "i") ** 2))(x), tpus4, x)


def test_figure2_with_jax_numpy(tpus2, devices_of):
    # The paper's Figure 2 with jnp in the pmaps.
    a = pw.pmap(lambda x: jnp.multiply(x, 2.0), devices=devices_of(2))
    b = pw.pmap(lambda x: jnp.add(x, 1.0), devices=devices_of(2))
    c = pw.pmap(lambda x: jnp.divide(x, 2.0), devices=devices_of(2))

    @pw.program
    def f(v):
        x = a(v)
        y = b(x)
        z = a(c(x))
        return (y, z)

    v = np.array([1.0, 2.0], np.float32)
    y, z = f(v)
    np.testing.assert_allclose(np.asarray(y), v * 2 + 1)
    np.testing.assert_allclose(np.asarray(z), v * 2)
    assert a._front_end == b._front_end == c._front_end == "jax"

    g = pw.pmap(lambda x: jnp.tanh(x) * lax.psum(x, "i"), axis_name="i", devices=tpus2)
    np.testing.assert_allclose(np.asarray(g(v)), np.tanh(v) * v.sum(), rtol=1e-6)


def test_results_go_back_to_jax(tpus2):
    f = pw.pmap(lambda x: jnp.cos(x), devices=tpus2)
    out = f(np.ones((2, 3), np.float32))
    back = jnp.asarray(out)
    assert isinstance(back, jax.Array)
    np.testing.assert_allclose(np.asarray(back), np.cos(np.ones((2, 3))), rtol=1e-6)
    # and a ShardedBuffer is an argument as any other
    np.testing.assert_allclose(np.asarray(f(out)), np.cos(np.cos(np.ones((2, 3)))), rtol=1e-6)
    # jax.Arrays are arguments
    np.testing.assert_allclose(np.asarray(f(jnp.zeros((2, 3)))), np.ones((2, 3)))


# --- Which front end, and errors ---------------------------------------------------------------


def test_pathways_numpy_functions_keep_their_front_end(tpus2):
    from pathways import numpy as pnp

    f = pw.pmap(lambda x: pnp.sin(x) + pw.psum(x, "i"), axis_name="i", devices=tpus2)
    x = np.arange(4, dtype=np.float64).reshape(2, 2)
    out = f(x)
    assert out.dtype == np.float64  # pathways' tracer keeps float64 (JAX's without x64 would not)
    np.testing.assert_allclose(np.asarray(out), np.sin(x) + x.sum(0))
    assert f._front_end == "pathways"
    g = pw.pmap(lambda x: jnp.sin(x), devices=tpus2)
    g(x)
    assert g._front_end == "jax"


def test_mixed_front_ends_is_a_clear_error(tpus2):
    from pathways import numpy as pnp

    f = pw.pmap(lambda x: pnp.sin(jnp.cos(x)), devices=tpus2)
    with pytest.raises(_jax_frontend.MixedFrontEndsError, match=r"mixes two front ends.*pathways"):
        f(np.ones((2, 3), np.float32))
    g = pw.pmap(lambda x: jnp.cos(pw.psum(x, "i")), axis_name="i", devices=tpus2)
    with pytest.raises(TypeError, match=r"mixes two front ends"):
        g(np.ones((2, 3), np.float32))
    assert_runtime_works()


def test_unsupported_primitive_names_it_and_the_line():
    def uses_fft(x):
        return jnp.fft.fft(x).real

    with pytest.raises(NotImplementedError, match=r"JAX primitive 'fft'.*test_jax_frontend.py:\d+"):
        pw.jit(uses_fft)(np.ones(4, np.float32))
    with pytest.raises(NotImplementedError, match=r"JAX primitive 'lgamma'.*test_jax_frontend.py:\d+"):
        pw.jit(lambda x: jnp.sin(x) + jax.scipy.special.gammaln(x))(np.ones(4, np.float32))
    assert_runtime_works()


def test_unsupported_dtype_names_it():
    # The same error type as pathways' own tracer gives for a dtype the devices do not have.
    with pytest.raises(TypeError, match=r"complex64"):
        pw.jit(lambda x: jnp.abs(jnp.sin(x).astype(jnp.complex64)))(np.ones(4, np.float32))
    with pytest.raises(TypeError, match=r"int8.*test_jax_frontend.py"):
        pw.jit(lambda x: (jnp.cos(x).astype(jnp.int8) + 1).astype(jnp.float32))(np.ones(4, np.float32))
    with pytest.raises(TypeError, match=r"complex64"):
        pw.jit(lambda x: jnp.abs(x.astype(jnp.complex64)))(np.ones(4, np.float32))
    assert_runtime_works()


def test_jax_errors_stay_jax_errors():
    with pytest.raises(TypeError, match=r"dot_general requires contracting dimensions"):
        pw.jit(lambda x: jnp.dot(x, x))(np.ones((2, 3), np.float32))
    with pytest.raises(NameError, match=r"unbound axis name: j"):
        pw.pmap(lambda x: lax.psum(x, "j"), axis_name="i")(np.ones((2, 3), np.float32))
    assert_runtime_works()


def test_jax_function_is_cached_per_signature():
    calls = []

    def f(x):
        calls.append(1)
        return jnp.sin(x)

    jf = pw.jit(f)
    x = np.ones(3, np.float32)
    jf(x)
    n = len(calls)
    jf(x + 1)
    assert len(calls) == n  # no retrace
    jf(np.ones(4, np.float32))
    assert len(calls) == n + 1  # a new signature traces once, by JAX directly


def test_primitive_table_has_no_gaps_for_reference_models():
    """Every primitive the reference functions use has a rule (a new JAX shows its new ones here)."""
    import jax.extend as jex  # noqa: F401

    def lm_like(params, tokens, key):
        emb = params["emb"][tokens]
        h = jax.nn.gelu(emb @ params["w"]) * jax.random.bernoulli(key, 0.9, emb.shape)
        logits = h @ params["emb"].T
        return jnp.mean(-jnp.take_along_axis(jax.nn.log_softmax(logits), tokens[..., None], -1))

    params = {"emb": jnp.ones((11, 8)), "w": jnp.ones((8, 8))}
    closed = jax.make_jaxpr(jax.value_and_grad(lm_like))(params, jnp.zeros((2, 5), jnp.int32),
                                                         jax.random.PRNGKey(0))
    seen = set()

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            seen.add(eqn.primitive.name)
            for p in eqn.params.values():
                for sub in (p if isinstance(p, (tuple, list)) else (p,)):
                    inner = getattr(sub, "jaxpr", None)
                    if inner is not None:
                        walk(getattr(inner, "jaxpr", inner) if not hasattr(inner, "eqns") else inner)

    walk(closed.jaxpr)
    missing = sorted(seen - set(_jax_frontend.RULES))
    assert not missing, f"JAX primitives without a lowering: {missing}"


# --- Convolutions and windows ------------------------------------------------------------------


@pytest.mark.parametrize("strides,padding,lhs_dil,rhs_dil,groups", [
    ((1, 1), "SAME", (1, 1), (1, 1), 1),
    ((2, 1), "VALID", (1, 1), (1, 1), 1),
    ((1, 2), ((2, 1), (0, 3)), (1, 1), (2, 1), 1),
    ((1, 1), ((1, 1), (1, 1)), (2, 2), (1, 1), 1),
    ((1, 1), "SAME", (1, 1), (1, 1), 2),
    ((2, 2), ((-1, 2), (1, -1)), (1, 1), (1, 2), 1),
])
def test_conv_against_jax(strides, padding, lhs_dil, rhs_dil, groups):
    x = _f32(2, 4, 7, 6)  # NCHW
    w = _f32(6, 4 // groups, 3, 2)  # OIHW

    def conv(x, w):
        return lax.conv_general_dilated(x, w, strides, padding, lhs_dil, rhs_dil,
                                        feature_group_count=groups)

    check(conv, x, w, rtol=1e-5, atol=1e-5)
    check(jax.grad(lambda x, w: jnp.sum(jnp.tanh(conv(x, w))), argnums=(0, 1)), x, w, rtol=1e-4, atol=1e-5)


def test_conv_nhwc_and_1d_against_jax():
    x = _f32(2, 9, 9, 3)
    w = _f32(3, 3, 3, 5)
    dn = ("NHWC", "HWIO", "NHWC")
    check(lambda x, w: lax.conv_general_dilated(x, w, (2, 2), "SAME", dimension_numbers=dn), x, w,
          rtol=1e-5, atol=1e-5)
    check(lambda x, w: jax.grad(lambda v: jnp.sum(lax.conv_general_dilated(v, w, (1, 1), "VALID",
                                                                            dimension_numbers=dn) ** 2))(x),
          x, w, rtol=1e-4, atol=1e-4)
    x1, w1 = _f32(3, 2, 11), _f32(4, 2, 3)
    check(lambda x, w: lax.conv(x, w, (2,), "SAME"), x1, w1, rtol=1e-5, atol=1e-5)


def test_pooling_against_jax():
    x = np.concatenate([_f32(2, 6, 6, 3), np.full((1, 6, 6, 3), 1.0, np.float32)])  # ties
    max_pool = lambda x: lax.reduce_window(x, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")  # noqa: E731
    sum_pool = lambda x: lax.reduce_window(x, 0.0, lax.add, (1, 3, 3, 1), (1, 2, 2, 1), "SAME")  # noqa: E731
    min_pool = lambda x: lax.reduce_window(x, jnp.inf, lax.min, (1, 3, 2, 1), (1, 1, 2, 1),  # noqa: E731
                                           ((0, 0), (1, 1), (0, 1), (0, 0)))
    check(lambda x: (max_pool(x), sum_pool(x), min_pool(x)), x, rtol=1e-5)
    check(jax.grad(lambda x: jnp.sum(max_pool(x) ** 2)), x, rtol=1e-5)
    check(jax.grad(lambda x: jnp.sum(jnp.sin(sum_pool(x)))), x, rtol=1e-5)
    check(jax.grad(lambda x: jnp.sum(min_pool(x) * 3.0)), x, rtol=1e-5)
    check(jax.grad(lambda x: jnp.sum(lax.reduce_window(x, -jnp.inf, lax.max, (1, 3, 3, 1), (1, 2, 2, 1),
                                                       "SAME"))), x)


def test_readme_primitive_table_lists_every_rule():
    """The README's table (printed by jax_primitive_table.py) has one row per primitive with a rule."""
    import pathlib
    import re

    readme = (pathlib.Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("### JAX primitives and their lowering", 1)[1].split("\n### ", 1)[0]
    rows = re.findall(r"^\| `([^`]+)` \|", section, re.M)
    assert sorted(rows) == sorted(_jax_frontend.RULES)
    assert "NOT TESTED" not in section


def test_linalg_against_jax():
    a = _f32(3, 4, 4)
    spd = np.einsum("bij,bkj->bik", a, a) + 4 * np.eye(4, dtype=np.float32)
    b = _f32(3, 4, 2)
    tol = dict(rtol=2e-4, atol=2e-5)
    check(lambda a, b: (jnp.linalg.solve(a, b), jnp.linalg.inv(a), jnp.linalg.det(a),
                        jnp.linalg.slogdet(a)), a, b, **tol)
    check(lambda s: (jnp.linalg.cholesky(s), jnp.linalg.eigvalsh(s), jnp.linalg.svd(s, compute_uv=False),
                     jnp.linalg.eigh(s, UPLO="U")[0]), spd, **tol)
    check(lambda a, b: (jax.scipy.linalg.solve_triangular(a, b, lower=True),
                        jax.scipy.linalg.solve_triangular(a, b, lower=False, trans=1, unit_diagonal=True),
                        lax.linalg.triangular_solve(a, jnp.swapaxes(b, 1, 2), left_side=False, lower=True)),
          a, b, **tol)

    # Decompositions whose vectors have a free sign: compared by what they reconstruct.
    def rebuilt(a, s):
        q, r = jnp.linalg.qr(a)
        u, sv, vt = jnp.linalg.svd(a, full_matrices=False)
        w, v = jnp.linalg.eigh(s)
        return (q @ r, jnp.abs(jnp.diagonal(r, axis1=1, axis2=2)), (u * sv[:, None, :]) @ vt,
                (v * w[:, None, :]) @ jnp.swapaxes(v, 1, 2))

    check(rebuilt, a, spd, **tol)
    check(jax.grad(lambda a, b: jnp.sum(jnp.linalg.solve(a, b) ** 2)), a, b, rtol=1e-3, atol=1e-4)


def test_pw_vjp_and_jvp_of_a_pmapped_jax_function(tpus2):
    def fn(x):
        return jnp.sin(x) * jnp.sum(x ** 2)

    f = pw.pmap(fn, devices=tpus2)
    x = _f32(2, 3)
    ct = _f32(2, 3)
    out, pullback = pw.vjp(f, x)
    assert_same(out, jax.vmap(fn)(x))
    assert_same(pullback(ct), jax.vmap(lambda v, c: jax.vjp(fn, v)[1](c))(x, ct), rtol=1e-5)
    y, t = pw.jvp(f, (x,), (ct,))
    wy, wt = jax.vmap(lambda v, c: jax.jvp(fn, (v,), (c,)))(x, ct)
    assert_same((y, t), (wy, wt), rtol=1e-5)


def test_python_scalar_arguments_are_weakly_typed_as_in_jax(jax64):
    x = _f32(3)
    got = pw.jit(lambda x, lr: jnp.sin(x) * lr)(x, 0.5)
    want = jax.jit(lambda x, lr: jnp.sin(x) * lr)(x, 0.5)
    assert got.dtype == want.dtype == np.float32
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6)


def test_while_loop_against_jax(tpus4):
    x = np.abs(_f32(4)) + 0.5

    def halve_until_small(x):
        return lax.while_loop(lambda c: jnp.max(c[0]) > 0.01, lambda c: (c[0] / 2, c[1] + 1),
                              (x, jnp.int32(0)))

    check(halve_until_small, x)
    check(lambda x: lax.while_loop(lambda v: jnp.sum(v) < 0, jnp.sin, x), x)  # zero iterations
    check(lambda n, x: lax.fori_loop(0, n, lambda i, c: c * 2 + i, x), np.int32(5), x)  # traced bound
    k = np.array([1.0, 2.0, 3.0], np.float32)
    check(lambda x: lax.while_loop(lambda c: c[0] < 10.0, lambda c: (c[0] + jnp.sum(k * c[1]), c[1] * 0.5),
                                   (x[0], x[1:])), x)  # a captured constant in the body
    # Per device, a data-dependent trip count; a collective in the cond keeps the counts equal.
    check_pmap(lambda v: lax.while_loop(lambda c: lax.psum(c[0], "i") < 100.0,
                                        lambda c: (c[0] * 2 + 1, c[1] + 1), (v, 0)), tpus4, x)
    check_pmap(halve_until_small, tpus4, x)


# Gradients: JAX differentiates before pathways sees the jaxpr, so these check the lowering of
# the transposed and linearized primitives each derivative is made of.
GRADIENT_FREE = {"sign", "floor", "ceil", "round", "round_away", "is_finite", "stop_gradient"}


@pytest.mark.parametrize("name", sorted(set(UNARY) - GRADIENT_FREE))
def test_unary_gradient_against_jax(name):
    fn = UNARY[name]
    x = np.concatenate([_f32(12), np.float32([0.5, -0.5, 2.0])])
    if name in ("log", "sqrt", "rsqrt", "log1p", "arccosh", "cbrt"):
        x = np.abs(x) + 1.5
    if name in ("arcsin", "arccos", "arctanh"):
        x = np.tanh(x) * 0.9
    check(jax.grad(lambda v: jnp.sum(fn(v) * jnp.arange(v.size))), x, rtol=2e-5, atol=1e-5)


@pytest.mark.parametrize("name", sorted(set(BINARY) - {"eq", "ne", "lt", "ge", "rem", "nextafter"}))
def test_binary_gradient_against_jax(name):
    fn = BINARY[name]
    a = np.abs(_f32(10)) + 0.5
    b = _f32(10)
    check(jax.grad(lambda a, b: jnp.sum(fn(a, b) * jnp.arange(a.size)), argnums=(0, 1)), a, b,
          rtol=2e-5, atol=1e-5)


def test_structural_ops_on_key_arrays_against_jax():
    key = jax.random.key(3)

    def f(k, i):
        keys = jax.random.split(k, (2, 3))
        picked = keys[1, i]  # dynamic index: gather or dynamic_slice on keys
        swapped = keys.T[2]  # transpose, then a slice
        chosen = jnp.where(i > 0, keys[0, 0], keys[1, 2])  # select_n on keys
        many = jnp.broadcast_to(keys[0, 1], (2,))  # broadcast_in_dim on keys
        row = lax.dynamic_slice(keys, (1, i), (1, 1))
        return [jax.random.key_data(x) for x in (picked, swapped, chosen, many, row, keys.reshape(6))]

    check(f, key, np.int32(2))
    check(f, key, np.int32(0))
