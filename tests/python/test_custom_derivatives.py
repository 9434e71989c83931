"""pw.custom_vjp and pw.custom_jvp: functions whose derivatives are given, as JAX's.

The rule is what every transformation uses (grad, value_and_grad, vjp of a
pmap'd function, jvp, inside scan and checkpoint), a second derivative
differentiates the rule, and mistakes in the rules are clear errors.
"""

import re

import numpy as np
import pytest

import pathways as pw
import pathways.numpy as pnp


@pw.custom_vjp
def clip_gradient(x):
    return x


clip_gradient.defvjp(lambda x: (x, None), lambda _, g: (pnp.clip(g, -1.0, 1.0),))


@pw.custom_vjp
def sin_times(x, y):
    return pnp.sin(x) * y


def _sin_times_fwd(x, y):
    return sin_times(x, y), (pnp.cos(x), pnp.sin(x), y)


def _sin_times_bwd(res, g):
    cos_x, sin_x, y = res
    return cos_x * g * y, sin_x * g


sin_times.defvjp(_sin_times_fwd, _sin_times_bwd)


@pw.custom_vjp
def straight_through_round(x):
    return pnp.round(x)


straight_through_round.defvjp(lambda x: (pnp.round(x), None), lambda _, g: (g,))

X = np.array([[0.3, -1.2, 2.5], [1.7, 0.0, -0.4]])


def on_devices(tpus, fn, *args):
    return pw.pmap(fn, devices=tpus)(*args)


def test_values_are_the_functions_and_gradients_the_rules(tpus2):
    np.testing.assert_array_equal(np.asarray(on_devices(tpus2, lambda v: clip_gradient(v * 3), X)), X * 3)
    g = on_devices(tpus2, pw.grad(lambda v: (clip_gradient(v) * 5).sum()), X)
    np.testing.assert_array_equal(np.asarray(g), np.ones_like(X))  # 5 clipped to 1
    g = on_devices(tpus2, pw.grad(lambda v: (straight_through_round(v) * v).sum()), X)
    np.testing.assert_allclose(np.asarray(g), X + np.round(X), rtol=1e-15)  # d round = 1 here


def test_residuals_and_several_arguments(tpus2):
    y = X + 1
    gx, gy = on_devices(tpus2, pw.grad(lambda a, b: sin_times(a, b).sum(), argnums=(0, 1)), X, y)
    np.testing.assert_allclose(np.asarray(gx), np.cos(X) * y, rtol=1e-15)
    np.testing.assert_allclose(np.asarray(gy), np.sin(X), rtol=1e-15)
    v, g = on_devices(tpus2, pw.value_and_grad(lambda a: sin_times(a, 2.0).sum()), X)
    np.testing.assert_allclose(np.asarray(v), (np.sin(X) * 2).sum(axis=1), rtol=1e-14)
    np.testing.assert_allclose(np.asarray(g), np.cos(X) * 2, rtol=1e-15)


def test_matches_jax_custom_vjp():
    jax = pytest.importorskip("jax")
    jnp = jax.numpy

    @jax.custom_vjp
    def f(x, y):
        return jnp.sin(x) * y

    f.defvjp(lambda x, y: (f(x, y), (jnp.cos(x), jnp.sin(x), y)),
             lambda res, g: (res[0] * g * res[2], res[1] * g))
    tpus = pw.make_virtual_device_set().add_slice(tpu_devices=2).tpus
    x = X.astype(np.float32)
    got = np.asarray(on_devices(tpus, pw.grad(lambda a: (sin_times(a, a) ** 2).sum()), x))
    for k in range(2):
        want = jax.grad(lambda a: (f(a, a) ** 2).sum())(x[k])
        np.testing.assert_allclose(got[k], np.asarray(want), rtol=1e-5)


def test_pytree_arguments_none_cotangents_and_nondiff_argnums(tpus2):
    def scaled(scale, params, x):
        return params["w"] * x * scale + params["b"]

    f = pw.custom_vjp(scaled, nondiff_argnums=(0,))
    f.defvjp(
        lambda scale, p, x: (scaled(scale, p, x), (p["w"], x)),
        lambda scale, res, g: ({"w": g * res[1] * scale, "b": None}, res[0] * g * scale),
    )

    def loss(w, b, x):
        return f(3.0, {"w": w, "b": b}, x).sum()

    gw, gb, gx = on_devices(tpus2, pw.grad(loss, argnums=(0, 1, 2)), X, X + 1, X - 1)
    np.testing.assert_allclose(np.asarray(gw), (X - 1) * 3, rtol=1e-15)
    np.testing.assert_array_equal(np.asarray(gb), np.zeros_like(X))  # bwd said None
    np.testing.assert_allclose(np.asarray(gx), X * 3, rtol=1e-15)
    # Keyword arguments are bound to their positions.
    gx = on_devices(tpus2, pw.grad(lambda x: f(3.0, x=x, params={"w": x, "b": x}).sum()), X)
    np.testing.assert_allclose(np.asarray(gx), X * 3 + (X * 3), rtol=1e-15)


def test_vjp_of_a_pmapped_function_and_jvp(tpus2):
    y = X + 1
    out, pull = pw.vjp(pw.pmap(sin_times, devices=tpus2), X, y)
    np.testing.assert_allclose(np.asarray(out), np.sin(X) * y, rtol=1e-15)
    ga, gb = pull(np.full_like(X, 2.0))
    np.testing.assert_allclose(np.asarray(ga), 2 * np.cos(X) * y, rtol=1e-15)
    np.testing.assert_allclose(np.asarray(gb), 2 * np.sin(X), rtol=1e-15)
    _, t = on_devices(tpus2, lambda a: pw.jvp(lambda b: sin_times(b, 2.0), (a,), (pnp.ones_like(a),)), X)
    np.testing.assert_allclose(np.asarray(t), 2 * np.cos(X), rtol=1e-15)


def test_second_derivatives_differentiate_bwd(tpus2):
    # d/dx [cos x * x + sin x] = -sin x * x + 2 cos x, through bwd and the residuals.
    d2 = on_devices(tpus2, pw.grad(lambda a: pw.grad(lambda b: sin_times(b, b).sum())(a).sum()), X)
    np.testing.assert_allclose(np.asarray(d2), -np.sin(X) * X + 2 * np.cos(X), rtol=1e-14)


def test_inside_scan_and_checkpoint(tpus2):
    def step(c, x):
        return clip_gradient(c * x), None

    def loss(c0, xs):
        c, _ = pw.lax.scan(pw.checkpoint(step), c0, xs)
        return (c * 10).sum()

    xs = np.full((2, 3, 3), 0.5)  # per device, 3 steps of 0.5
    g = np.asarray(on_devices(tpus2, pw.grad(loss), X, xs))
    # Each step clips the carry's cotangent to [-1, 1], then scales it by 0.5:
    # 10 -> 1 -> 0.5, 0.5 -> 0.25, 0.25 -> 0.125.
    np.testing.assert_allclose(g, np.full_like(X, 0.125), rtol=1e-15)


def test_not_differentiated_runs_the_function_only(tpus2):
    calls = []

    def fwd(x):
        calls.append("fwd")
        return x, None

    f = pw.custom_vjp(lambda x: x * 2)
    f.defvjp(fwd, lambda _, g: (g,))
    np.testing.assert_array_equal(np.asarray(on_devices(tpus2, f, X)), X * 2)
    assert calls == []
    assert f(3.0) == 6.0  # outside any trace


def test_grad_outside_any_trace():
    g = pw.grad(lambda v: (clip_gradient(v) * 4).sum())(np.array([1.0, 2.0]))
    np.testing.assert_array_equal(g, [1.0, 1.0])


def _rule(fwd, bwd):
    f = pw.custom_vjp(lambda x: x * 2)
    f.defvjp(fwd, bwd)
    return f


ERRORS = [
    (lambda: pw.custom_vjp(lambda x: x), TypeError, "no rules; call defvjp(fwd, bwd) before differentiating it"),
    (lambda: _rule(lambda x: x, lambda r, g: (g,)), TypeError, "fwd must return a pair (output, residuals), got Tracer"),
    (lambda: _rule(lambda x: (x, None), lambda r, g: g), TypeError, "bwd must return a tuple with one cotangent per argument (1), got Tracer"),
    (lambda: _rule(lambda x: (x, None), lambda r, g: (g, g)), TypeError, "bwd must return a tuple with one cotangent per argument (1), got tuple of length 2"),
    (lambda: _rule(lambda x: (x, None), lambda r, g: (g[0],)), ValueError, "bwd's cotangent for argument leaf 0 is f64[], but the argument is f64[3]"),
    (lambda: _rule(lambda x: (x, None), lambda r, g: ([g],)), TypeError, "bwd's cotangent 0 must have the structure of argument 0"),
]


@pytest.mark.parametrize("make, exc, message", ERRORS, ids=[e[2][:40] for e in ERRORS])
def test_mistakes_are_clear_errors(tpus2, runtime_ok, make, exc, message):
    f = make()
    with pytest.raises(exc, match=re.escape(message)):
        on_devices(tpus2, pw.grad(lambda v: f(v).sum()), X)
    runtime_ok()


def test_bad_definitions():
    with pytest.raises(TypeError, match="custom_vjp expects a callable, got 3"):
        pw.custom_vjp(3)
    with pytest.raises(TypeError, match="nondiff_argnums must be ints"):
        pw.custom_vjp(lambda x: x, nondiff_argnums=("a",))
    with pytest.raises(TypeError, match="bwd must be callable, got None"):
        pw.custom_vjp(lambda x: x).defvjp(lambda x: (x, None), None)
    with pytest.raises(TypeError, match="jvp must be callable, got 1"):
        pw.custom_jvp(lambda x: x).defjvp(1)


# --- custom_jvp ---------------------------------------------------------------------


@pw.custom_jvp
def log1pexp(x):
    return pnp.log1p(pnp.exp(x))


@log1pexp.defjvp
def _log1pexp_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return log1pexp(x), t * pw.nn.sigmoid(x)


WIDE = np.array([[0.5, 100.0, -3.0], [800.0, 1.0, -40.0]])


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def test_custom_jvp_gives_the_rules_gradient_where_autodiff_gives_nan(tpus2):
    with np.errstate(over="ignore"):
        plain = np.asarray(on_devices(tpus2, pw.grad(lambda v: pnp.log1p(pnp.exp(v)).sum()), WIDE))
        assert np.isnan(plain[1, 0])  # exp(800) / (1 + exp(800)) is inf / inf
        g = np.asarray(on_devices(tpus2, pw.grad(lambda v: log1pexp(v).sum()), WIDE))
        np.testing.assert_allclose(g, sigmoid(WIDE), rtol=1e-15)
        v = np.asarray(on_devices(tpus2, log1pexp, WIDE))
        np.testing.assert_allclose(v[0], np.log1p(np.exp(WIDE[0])), rtol=1e-15)


def test_custom_jvp_through_every_transformation(tpus2):
    s = sigmoid(X)
    _, t = on_devices(tpus2, lambda a: pw.jvp(log1pexp, (a,), (pnp.full_like(a, 3.0),)), X)
    np.testing.assert_allclose(np.asarray(t), 3 * s, rtol=1e-15)
    _, pull = pw.vjp(pw.pmap(log1pexp, devices=tpus2), X)
    np.testing.assert_allclose(np.asarray(pull(np.ones_like(X))[0]), s, rtol=1e-15)
    d2 = on_devices(tpus2, pw.grad(lambda a: pw.grad(lambda b: log1pexp(b).sum())(a).sum()), X)
    np.testing.assert_allclose(np.asarray(d2), s * (1 - s), rtol=1e-14)

    def loss(c0, xs):
        c, _ = pw.lax.scan(lambda c, x: (log1pexp(c * x), None), c0, xs)
        return c.sum()

    xs = np.full((2, 2, 3), 0.5)
    g = np.asarray(on_devices(tpus2, pw.grad(loss), X, xs))
    c1 = np.log1p(np.exp(X * 0.5))
    np.testing.assert_allclose(g, sigmoid(c1 * 0.5) * 0.5 * sigmoid(X * 0.5) * 0.5, rtol=1e-14)


def test_defjvps_and_nondiff_argnums(tpus2):
    f = pw.custom_jvp(lambda a, b: a * pnp.sin(b))
    f.defjvps(lambda ta, ans, a, b: ta * pnp.sin(b), lambda tb, ans, a, b: tb * a * pnp.cos(b))
    ga, gb = on_devices(tpus2, pw.grad(lambda a, b: f(a, b).sum(), argnums=(0, 1)), X, X + 1)
    np.testing.assert_allclose(np.asarray(ga), np.sin(X + 1), rtol=1e-15)
    np.testing.assert_allclose(np.asarray(gb), X * np.cos(X + 1), rtol=1e-15)

    def power(n, x):
        return x ** n

    p = pw.custom_jvp(power, nondiff_argnums=(0,))
    p.defjvp(lambda n, primals, tangents: (power(n, primals[0]), n * primals[0] ** (n - 1) * tangents[0]))
    g = on_devices(tpus2, pw.grad(lambda x: p(3, x).sum()), X)
    np.testing.assert_allclose(np.asarray(g), 3 * X ** 2, rtol=1e-14)


def test_custom_jvp_matches_jax():
    jax = pytest.importorskip("jax")
    jnp = jax.numpy

    @jax.custom_jvp
    def f(x):
        return jnp.log1p(jnp.exp(x))

    f.defjvp(lambda p, t: (f(p[0]), t[0] * jax.nn.sigmoid(p[0])))
    tpus = pw.make_virtual_device_set().add_slice(tpu_devices=2).tpus
    x = X.astype(np.float32)
    got = np.asarray(on_devices(tpus, pw.grad(lambda a: (log1pexp(a) * a).sum()), x))
    for k in range(2):
        want = jax.grad(lambda a: (f(a) * a).sum())(x[k])
        np.testing.assert_allclose(got[k], np.asarray(want), rtol=1e-5)


def _jvp_rule(rule):
    f = pw.custom_jvp(lambda x: x * 2)
    f.defjvp(rule)
    return f


JVP_ERRORS = [
    (lambda: pw.custom_jvp(lambda x: x), TypeError, "no rules; call defjvp(jvp) before differentiating it"),
    (lambda: _jvp_rule(lambda p, t: t[0]), TypeError, "the JVP rule must return a pair (output, tangent), got Tracer"),
    (lambda: _jvp_rule(lambda p, t: (p[0] * 2, [t[0]])), TypeError, "the JVP rule's tangent must have the output's structure"),
    (lambda: _jvp_rule(lambda p, t: (p[0] * 2, t[0][0])), ValueError, "the JVP rule's tangent for output leaf 0 is f64[], but the output is f64[3]"),
]


@pytest.mark.parametrize("make, exc, message", JVP_ERRORS, ids=[e[2][:40] for e in JVP_ERRORS])
def test_custom_jvp_mistakes_are_clear_errors(tpus2, runtime_ok, make, exc, message):
    test_mistakes_are_clear_errors(tpus2, runtime_ok, make, exc, message)


# --- A custom function called inside its own rule (JAX's idiom) --------------------------


@pw.custom_jvp
def softplus(x):
    return pnp.log1p(pnp.exp(x))


@softplus.defjvp
def _softplus_jvp(primals, tangents):
    ans = softplus(primals[0])
    return ans, tangents[0] * (1 - pnp.exp(-ans))


@pw.custom_vjp
def softplus_vjp(x):
    return pnp.log1p(pnp.exp(x))


softplus_vjp.defvjp(lambda x: (softplus_vjp(x), softplus_vjp(x)),
                    lambda ans, g: (g * (1 - pnp.exp(-ans)),))

BIG = np.array([[1.0, 100.0, 1000.0], [-2.0, 50.0, 700.0]], np.float32)


@pytest.mark.parametrize("f", [softplus, softplus_vjp], ids=["custom_jvp", "custom_vjp"])
def test_a_call_inside_the_rule_is_differentiated_by_the_rule_too(tpus2, f):
    # Plain autodiff of log1p(exp(x)) is NaN at large x; through the rules the
    # second derivative is sigmoid'(x), 0 there, as JAX gives.
    def d2(a):
        return pw.grad(lambda v: pw.grad(lambda u: f(u).sum())(v).sum())(a)

    got = np.asarray(on_devices(tpus2, d2, BIG))
    with np.errstate(over="ignore"):
        s = 1 / (1 + np.exp(-BIG.astype(np.float64)))
    np.testing.assert_allclose(got, s * (1 - s), rtol=1e-5, atol=1e-7)
    assert not np.isnan(got).any()
    _, t = on_devices(tpus2, lambda a: pw.jvp(pw.grad(lambda u: f(u).sum()), (a,), (pnp.ones_like(a),)), BIG)
    np.testing.assert_allclose(np.asarray(t), s * (1 - s), rtol=1e-5, atol=1e-7)


def test_defaults_are_bound_however_the_call_is_written(tpus2):
    @pw.custom_vjp
    def f(x, y=2.0):
        return x * y

    f.defvjp(lambda x, y=2.0: (x * y, y), lambda y, g: (g * y, None))
    for loss in (lambda v: f(v).sum(), lambda v: f(v, 2.0).sum(), lambda v: f(v, y=2.0).sum()):
        np.testing.assert_array_equal(np.asarray(on_devices(tpus2, pw.grad(loss), X)), np.full_like(X, 2.0))
