"""`pw.vjp` and `pw.jvp`: split forward/backward functions, in programs, in traces, outside."""

import gc
import re

import numpy as np
import pytest

import pathways as pw
from pathways import numpy as pnp


def stage(w, x):
    return pnp.tanh(x @ w) * 2.0


def reference_vjp(fn, primals, ct):
    """Cotangents of `fn` by `pw.grad` of <fn(primals), ct> (per device, as a pmap)."""
    n = len(primals)

    def inner(*args):
        out = fn(*args[:n])
        return (out * args[n]).sum()

    return pw.grad(inner, argnums=tuple(range(n)))


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    return (rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 5, 3)),
            rng.standard_normal((2, 5, 4)))


def test_pmapped_vjp_matches_grad_and_outputs_match_the_call(tpus2, data, runtime_ok):
    w, x, ct = data
    f = pw.pmap(stage, devices=tpus2)
    y, f_vjp = pw.vjp(f, w, x)
    assert isinstance(y, pw.ShardedBuffer)
    dw, dx = f_vjp(ct)
    ref = pw.pmap(reference_vjp(stage, (w, x), ct), devices=tpus2)(w, x, ct)
    np.testing.assert_allclose(np.asarray(y), np.asarray(f(w, x)), rtol=1e-15)
    np.testing.assert_allclose(np.asarray(dw), np.asarray(ref[0]), rtol=1e-13)
    np.testing.assert_allclose(np.asarray(dx), np.asarray(ref[1]), rtol=1e-13)
    # Analytic: d/dw <2 tanh(x w), ct> = x^T (2 ct (1 - tanh^2)).
    t = np.tanh(x @ w)
    g = 2 * ct * (1 - t * t)
    np.testing.assert_allclose(np.asarray(dw), np.swapaxes(x, 1, 2) @ g, rtol=1e-12)
    np.testing.assert_allclose(np.asarray(dx), g @ np.swapaxes(w, 1, 2), rtol=1e-12)
    # The pullback can be called again, with another cotangent.
    dw2, _ = f_vjp(2 * ct)
    np.testing.assert_allclose(np.asarray(dw2), 2 * np.asarray(dw), rtol=1e-13)
    runtime_ok()


def test_in_a_program_forward_and_backward_are_two_nodes_and_nothing_is_recomputed(
        tpus2, data):
    w, x, ct = data
    f = pw.pmap(stage, devices=tpus2)

    @pw.program
    def step(w, x, ct):
        y, f_vjp = pw.vjp(f, w, x)
        return (y, *f_vjp(ct))

    prog = step.trace(w, x, ct)
    assert prog.num_nodes == 2
    text = prog.as_text()
    assert "call @stage_fwd(" in text and "call @stage_bwd(" in text
    # The residual (tanh's output) is an output of the forward function; the
    # backward one reads it and computes no tanh or forward matmul of its own.
    [entry] = [e for k, e in f._cache.items() if k[0] == "vjp"]
    assert entry.forward.function.num_outputs == 2
    bwd = entry.backward.function.as_text()
    assert "tanh" not in bwd
    y, dw, dx = step(w, x, ct)
    ref = pw.pmap(reference_vjp(stage, (w, x), ct), devices=tpus2)(w, x, ct)
    np.testing.assert_allclose(np.asarray(y), np.asarray(f(w, x)), rtol=1e-15)
    np.testing.assert_allclose(np.asarray(dw), np.asarray(ref[0]), rtol=1e-13)
    np.testing.assert_allclose(np.asarray(dx), np.asarray(ref[1]), rtol=1e-13)


def test_two_stage_pipeline_on_two_slices_matches_the_composed_gradient(devices_of):
    # Stage A on one slice, stage B and the loss on another: forward A,
    # forward B, backward B, backward A, in one program (4 nodes and the
    # transfers between the slices).
    a_devs, b_devs = devices_of(2), devices_of(2)
    rng = np.random.default_rng(1)
    wa = rng.standard_normal((2, 4, 6)).astype(np.float32)
    wb = rng.standard_normal((2, 6, 3)).astype(np.float32)
    x = rng.standard_normal((2, 8, 4)).astype(np.float32)
    target = rng.standard_normal((2, 8, 3)).astype(np.float32)

    def stage_a(w, x):
        return pnp.tanh(x @ w)

    def stage_b(w, h, target):
        d = h @ w - target
        return (d * d).mean()

    a = pw.pmap(stage_a, devices=a_devs)
    b = pw.pmap(stage_b, devices=b_devs)
    ones = pw.pmap(lambda loss: pnp.ones_like(loss), devices=b_devs)

    @pw.program
    def train_step(wa, wb, x, target):
        h, a_vjp = pw.vjp(a, wa, x)
        loss, b_vjp = pw.vjp(b, wb, h, target)
        dwb, dh, _ = b_vjp(ones(loss))
        dwa, _ = a_vjp(dh)
        return loss, dwa, dwb

    assert train_step.trace(wa, wb, x, target).num_nodes == 5
    loss, dwa, dwb = train_step(wa, wb, x, target)

    def composed(wa, wb, x, target):
        return stage_b(wb, stage_a(wa, x), target)

    ref = pw.pmap(pw.value_and_grad(composed, argnums=(0, 1)), devices=a_devs)(wa, wb, x, target)
    np.testing.assert_allclose(np.asarray(loss), np.asarray(ref[0]), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(dwa), np.asarray(ref[1][0]), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(dwb), np.asarray(ref[1][1]), rtol=1e-5, atol=1e-6)


def test_residuals_are_freed_when_the_pullback_is_dropped(tpus2, data):
    w, x, ct = data
    f = pw.pmap(stage, devices=tpus2)
    pw.block_until_ready(pw.vjp(f, w, x)[0])  # compiled and warm
    gc.collect()
    pw._core.await_quiescence()
    before = pw.memory_stats()["live_buffers"]
    y, f_vjp = pw.vjp(f, w, x)
    pw.block_until_ready(y)
    # y, the residual and the primals the backward reads (w and x, put once).
    assert pw.memory_stats()["live_buffers"] == before + 4
    del f_vjp
    gc.collect()
    assert pw.memory_stats()["live_buffers"] == before + 1
    del y
    gc.collect()
    assert pw.memory_stats()["live_buffers"] == before


def test_pytree_outputs_has_aux_and_int_primals(tpus2):
    rng = np.random.default_rng(2)
    params = {"w": rng.standard_normal((2, 3)), "b": rng.standard_normal((2, 3))}
    idx = np.array([[0, 2, 1], [1, 1, 0]], np.int32)

    def fn(p, idx):
        y = p["w"] * p["w"] + p["b"]
        return {"y": y, "s": (y * 3.0, idx * 2)}, (pnp.sin(p["b"]), idx)

    f = pw.pmap(fn, devices=tpus2)
    out, f_vjp, aux = pw.vjp(f, params, idx, has_aux=True)
    np.testing.assert_allclose(np.asarray(aux[0]), np.sin(params["b"]))
    np.testing.assert_array_equal(np.asarray(aux[1]), idx)
    np.testing.assert_array_equal(np.asarray(out["s"][1]), idx * 2)
    ct = {"y": np.ones((2, 3)), "s": (np.full((2, 3), 0.5), np.zeros((2, 3), np.int32))}
    dp, didx = f_vjp(ct)
    # d/dw = 2 w (1 + 3 * 0.5); d/db = 1 + 1.5.
    np.testing.assert_allclose(np.asarray(dp["w"]), 2 * params["w"] * 2.5, rtol=1e-14)
    np.testing.assert_allclose(np.asarray(dp["b"]), np.full((2, 3), 2.5), rtol=1e-14)
    assert np.asarray(didx).dtype == np.int32
    np.testing.assert_array_equal(np.asarray(didx), np.zeros((2, 3), np.int32))


def test_psum_inside_the_pmapped_function_has_pmap_semantics(tpus2):
    x = np.array([[1.0, 2.0], [3.0, -1.0]])
    ct = np.array([[1.0, 0.0], [2.0, 5.0]])
    f = pw.pmap(lambda x: pw.psum(x * x, "i"), devices=tpus2, axis_name="i")
    _, f_vjp = pw.vjp(f, x)
    (dx,) = f_vjp(ct)
    # out_j = sum_i x_i^2 on every device j: d<out, ct>/dx_i = 2 x_i sum_j ct_j.
    np.testing.assert_allclose(np.asarray(dx), 2 * x * ct.sum(0), rtol=1e-15)


def test_identity_constants_and_outputs_independent_of_the_inputs(tpus2):
    c = np.array([1.0, 2.0, 3.0])
    f = pw.pmap(lambda x, y: (x, x * c, y * 0.0 + 7.0, np.ones(3) * 2.0), devices=tpus2)
    x = np.arange(6.0).reshape(2, 3)
    y = np.ones((2, 3))
    outs, f_vjp = pw.vjp(f, x, y)
    cts = tuple(np.full((2, 3), v) for v in (1.0, 10.0, 100.0, 1000.0))
    dx, dy = f_vjp(cts)
    np.testing.assert_allclose(np.asarray(dx), np.broadcast_to(1.0 + 10.0 * c, (2, 3)))
    np.testing.assert_allclose(np.asarray(dy), np.full((2, 3), 0.0))
    [entry] = [e for k, e in f._cache.items() if k[0] == "vjp"]
    # The closed-over constant is a constant of the backward function, not a
    # residual: the forward function outputs only its four outputs.
    assert entry.forward.function.num_outputs == 4


def test_bad_cotangents_raise_clear_errors_and_leave_the_runtime_usable(tpus2, data, runtime_ok):
    w, x, ct = data
    f = pw.pmap(stage, devices=tpus2)
    _, f_vjp = pw.vjp(f, w, x)
    with pytest.raises(TypeError, match="cotangent has tree structure"):
        f_vjp((ct, ct))
    with pytest.raises(ValueError, match=re.escape(
            "cotangent leaf 0 has shape f64[2,5,3]; it must have the shape of output leaf 0, "
            "f64[2,5,4]")):
        f_vjp(ct[:, :, :3])
    with pytest.raises(TypeError, match="cotangent leaf 0 has dtype float32"):
        f_vjp(ct.astype(np.float32))
    with pytest.raises(TypeError, match="vjp expects a callable"):
        pw.vjp(3, w)
    runtime_ok()
    dw, _ = f_vjp(ct)  # still fine after the errors
    assert np.asarray(dw).shape == (2, 3, 4)


def test_program_misuse_raises_tracer_errors(tpus2, data, runtime_ok):
    w, x, ct = data
    f = pw.pmap(stage, devices=tpus2)
    kept = []

    @pw.program
    def keeps_pullback(w, x):
        y, f_vjp = pw.vjp(f, w, x)
        kept.append(f_vjp)
        return y

    keeps_pullback(w, x)
    with pytest.raises(pw.TracerError, match="after the @pw.program 'keeps_pullback' trace"):
        kept[0](ct)

    @pw.program
    def plain_function(w):
        return pw.vjp(lambda v: v * 2.0, w)[0]

    with pytest.raises(pw.TracerError, match="not pmap'd"):
        plain_function(w)
    runtime_ok()


def test_vjp_inside_a_pmapped_function_and_its_pullback_outside(tpus2):
    escaped = []

    def fn(x):
        y, f_vjp = pw.vjp(lambda z: pnp.sin(z) * z, x)
        escaped.append(f_vjp)
        return f_vjp(pnp.ones_like(y))[0]

    x = np.array([[0.5, 1.0], [2.0, -1.0]])
    out = pw.pmap(fn, devices=tpus2)(x)
    np.testing.assert_allclose(np.asarray(out), np.cos(x) * x + np.sin(x), rtol=1e-14)
    with pytest.raises(pw.TracerError, match="was called outside that trace"):
        escaped[0](np.ones(2))


def test_grad_of_a_function_using_vjp_gives_second_derivatives(tpus2):
    def first(x):
        y, f_vjp = pw.vjp(lambda z: z * z * z, x)
        return f_vjp(pnp.ones_like(y))[0].sum()  # sum 3 x^2

    x = np.array([[1.0, 2.0], [3.0, 4.0]])
    g = pw.pmap(pw.grad(first), devices=tpus2)(x)
    np.testing.assert_allclose(np.asarray(g), 6 * x, rtol=1e-14)


def test_vjp_outside_any_trace_runs_on_one_device():
    out, f_vjp = pw.vjp(lambda a, b: (a * b).sum(), np.arange(3.0), 2.0)
    assert isinstance(out, np.ndarray) and out == 6.0
    da, db = f_vjp(np.float64(1.0))
    np.testing.assert_allclose(da, [2.0, 2.0, 2.0])
    np.testing.assert_allclose(db, 3.0)


def test_jvp_in_trace_pmapped_in_a_program_and_outside(tpus2):
    x = np.array([[0.5, 1.0], [2.0, -1.0]])
    t = np.array([[1.0, 2.0], [0.5, -3.0]])
    expected = (np.cos(x) * x + np.sin(x)) * t

    def fn(z):
        return pnp.sin(z) * z

    # Inside a pmap'd function.
    inside = pw.pmap(lambda x, t: pw.jvp(fn, (x,), (t,)), devices=tpus2)(x, t)
    np.testing.assert_allclose(np.asarray(inside[0]), np.sin(x) * x, rtol=1e-15)
    np.testing.assert_allclose(np.asarray(inside[1]), expected, rtol=1e-14)
    # A pmap'd function: one node in a program.
    f = pw.pmap(fn, devices=tpus2)

    @pw.program
    def prog(x, t):
        return pw.jvp(f, (x,), (t,))

    assert prog.trace(x, t).num_nodes == 1
    np.testing.assert_allclose(np.asarray(prog(x, t)[1]), expected, rtol=1e-14)
    np.testing.assert_allclose(np.asarray(pw.jvp(f, (x,), (t,))[1]), expected, rtol=1e-14)
    # Outside any trace.
    y, dy = pw.jvp(lambda a, b: pnp.sin(a) * b, (1.0, 2.0), (1.0, 0.0))
    np.testing.assert_allclose(dy, 2.0 * np.cos(1.0), rtol=1e-15)
    with pytest.raises(ValueError, match="tangent leaf 0 has shape"):
        pw.jvp(f, (x,), (t[:, :1],))
    with pytest.raises(TypeError, match="tangents must be a tuple or list"):
        pw.jvp(f, (x,), t)


def test_matches_jax_vjp(jax64):
    jax = jax64
    jnp = jax.numpy
    rng = np.random.default_rng(3)
    w = rng.standard_normal((4, 3))
    x = rng.standard_normal((5, 4))
    ct = rng.standard_normal((5, 3))

    def ours(w, x):
        h = pnp.maximum(x @ w, 0.0)
        return pnp.exp(-h) * h + pw.nn.softmax(h, axis=-1)

    def theirs(w, x):
        h = jnp.maximum(x @ w, 0.0)
        return jnp.exp(-h) * h + jax.nn.softmax(h, axis=-1)

    y, f_vjp = pw.vjp(ours, w, x)
    jy, j_vjp = jax.vjp(theirs, w, x)
    np.testing.assert_allclose(y, np.asarray(jy), rtol=1e-13)
    for a, b in zip(f_vjp(ct), j_vjp(ct)):
        np.testing.assert_allclose(a, np.asarray(b), rtol=1e-12, atol=1e-14)


def test_has_aux_needs_a_pair_and_errors_leave_the_cache_usable(tpus2, runtime_ok):
    f = pw.pmap(lambda x: x * 2.0, devices=tpus2)
    with pytest.raises(TypeError, match="has_aux=True: the function must return a pair"):
        pw.vjp(f, np.ones((2, 3)), has_aux=True)
    with pytest.raises(TypeError, match="has_aux=True: the function must return a pair"):
        pw.pmap(lambda x: pw.vjp(lambda z: z, x, has_aux=True)[0], devices=tpus2)(np.ones((2, 3)))
    with pytest.raises(ValueError, match="leading axis of size 3"):
        pw.vjp(f, np.ones((3, 3)))
    y, f_vjp = pw.vjp(f, np.ones((2, 3)))  # the failed traces left nothing behind
    np.testing.assert_array_equal(np.asarray(f_vjp(np.ones((2, 3)))[0]), np.full((2, 3), 2.0))
    runtime_ok()


def test_a_cotangent_from_another_program_is_an_escaped_tracer(tpus2, data):
    w, x, ct = data
    f = pw.pmap(stage, devices=tpus2)
    other = []

    @pw.program
    def first(ct):
        other.append(ct)
        return ct

    first(ct)

    @pw.program
    def second(w, x):
        _, f_vjp = pw.vjp(f, w, x)
        return f_vjp(other[0])

    with pytest.raises(pw.TracerError, match="escaped tracer"):
        second(w, x)
