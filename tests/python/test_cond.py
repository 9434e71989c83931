"""pw.lax.cond and pw.lax.switch: a traced predicate or index runs every branch
and selects each output leaf; a concrete one calls only its branch. Results
per device against Python's own choice (and jax.lax's clamping), gradients,
loops around them, and the errors JAX gives for mismatched branches.
"""

import re

import numpy as np
import pytest

import pathways as pw
import pathways.numpy as pnp


def per_device(tpus, fn, *args):
    return pw.pmap(fn, devices=tpus)(*args)


def test_cond_picks_per_device(tpus2):
    x = np.array([[1.0, 2.0, 3.0], [-1.0, -2.0, 0.5]])

    def f(v):
        return pw.lax.cond(v.sum() > 0, lambda a: a * 2, lambda a: pnp.sin(a), v)

    got = np.asarray(per_device(tpus2, f, x))
    np.testing.assert_array_equal(got[0], x[0] * 2)
    np.testing.assert_allclose(got[1], np.sin(x[1]), rtol=1e-15)


def test_cond_pytrees_weak_scalars_and_integer_predicates(tpus2):
    x = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    flags = np.array([0, 7], np.int32)

    def f(v, flag):
        return pw.lax.cond(flag, lambda a: {"s": a.sum(), "z": 0.0},
                           lambda a: {"s": 1.0, "z": a.max()}, v)

    out = per_device(tpus2, f, x, flags)
    assert np.asarray(out["s"]).dtype == np.float32 and np.asarray(out["z"]).dtype == np.float32
    np.testing.assert_array_equal(np.asarray(out["s"]), [1.0, 7.0])
    np.testing.assert_array_equal(np.asarray(out["z"]), [2.0, 0.0])


def test_cond_with_no_operands_and_closed_over_values(tpus2):
    x = np.array([[1.0, 2.0], [3.0, 4.0]])

    def f(v):
        return pw.lax.cond(v[0] > 2, lambda: v[1], lambda: -v[1])

    np.testing.assert_array_equal(np.asarray(per_device(tpus2, f, x)), [-2.0, 4.0])


def test_concrete_predicates_call_only_their_branch(tpus2):
    calls = []

    def t(a):
        calls.append("t")
        return a + 1

    def e(a):
        calls.append("e")
        return a - 1

    x = np.array([[1.0], [2.0]])
    got = per_device(tpus2, lambda v: pw.lax.cond(True, t, e, v), x)
    np.testing.assert_array_equal(np.asarray(got), x + 1)
    assert calls == ["t"]
    calls.clear()
    assert pw.lax.cond(np.int32(0), t, e, 5.0) == 4.0 and calls == ["e"]
    assert pw.lax.switch(9, [lambda: "a", lambda: "b"]) == "b"
    assert pw.lax.switch(-3, [lambda: "a", lambda: "b"]) == "a"


def test_switch_clamps_the_index_as_jax(tpus4):
    jax = pytest.importorskip("jax")
    idx = np.array([-1, 0, 1, 5], np.int32)
    x = np.array([[1.0, 2.0]] * 4)
    branches = [lambda a: a + 10, lambda a: a * 3, lambda a: -a]
    got = np.asarray(per_device(tpus4, lambda i, v: pw.lax.switch(i, branches, v), idx, x))
    for k in range(4):
        want = np.asarray(jax.lax.switch(int(idx[k]), branches, x[k]))
        np.testing.assert_allclose(got[k], want)


def test_switch_of_one_branch_and_of_unsigned_indices(tpus2):
    x = np.array([[1.0], [2.0]])
    got = per_device(tpus2, lambda v: pw.lax.switch(v[0].astype(np.int32), [lambda a: a * 5], v), x)
    np.testing.assert_array_equal(np.asarray(got), x * 5)
    u = np.array([0, 4000000000], np.uint32)
    got = per_device(tpus2, lambda i, v: pw.lax.switch(i, [lambda a: a, lambda a: a + 1], v), u, x)
    np.testing.assert_array_equal(np.asarray(got), [[1.0], [3.0]])


def test_gradients_follow_the_selected_branch(tpus2):
    x = np.array([[0.3, -0.2], [-1.0, -0.5]])

    def loss(v):
        return pw.lax.cond(v.sum() > 0, lambda a: (pnp.sin(a) * a).sum(), lambda a: (a ** 3).sum(), v)

    g = np.asarray(per_device(tpus2, pw.grad(loss), x))
    np.testing.assert_allclose(g[0], np.cos(x[0]) * x[0] + np.sin(x[0]), rtol=1e-14)
    np.testing.assert_allclose(g[1], 3 * x[1] ** 2, rtol=1e-14)

    def loss3(v, i):
        return pw.lax.switch(i, [lambda a: a.sum(), lambda a: (a * a).sum(), lambda a: pnp.exp(a).sum()], v)

    i = np.array([2, 1], np.int32)
    g = np.asarray(per_device(tpus2, pw.grad(loss3), x, i))
    np.testing.assert_allclose(g[0], np.exp(x[0]), rtol=1e-14)
    np.testing.assert_allclose(g[1], 2 * x[1], rtol=1e-14)


def test_cond_inside_a_loop_body(tpus2):
    # The Collatz step, 20 times, per device: a traced predicate in a scan body.
    start = np.array([27, 6], np.int32)

    def f(n):
        return pw.lax.fori_loop(0, 20, lambda _, m: pw.lax.cond(m % 2 == 0, lambda: m // 2,
                                                                 lambda: 3 * m + 1), n)

    def collatz(m):
        for _ in range(20):
            m = m // 2 if m % 2 == 0 else 3 * m + 1
        return m

    got = np.asarray(per_device(tpus2, f, start))
    np.testing.assert_array_equal(got, [collatz(27), collatz(6)])


ERRORS = [
    (lambda v: pw.lax.cond(v > 0, lambda: v, lambda: v), TypeError, "pw.lax.cond: pred must be a scalar bool or integer, got pred[2]"),
    (lambda v: pw.lax.cond(v[0], lambda: v, lambda: v), TypeError, "pw.lax.cond: pred must be a scalar bool or integer, got f64[]"),
    (lambda v: pw.lax.cond(v[0] > 0, lambda: (v, v), lambda: [v, v]), TypeError, "pw.lax.cond: the branches must return the same structure"),
    (lambda v: pw.lax.cond(v[0] > 0, lambda: v, lambda: v[0]), TypeError, "output leaf 0 is f64[2] in branch 0 and f64[] in branch 1"),
    (lambda v: pw.lax.cond(v[0] > 0, lambda: v, lambda: v.astype(np.float32)), TypeError, "output leaf 0 is f64[2] in branch 0 and f32[2] in branch 1"),
    (lambda v: pw.lax.cond(v[0] > 0, lambda: v, 3), TypeError, "pw.lax.cond: false_fun must be callable, got 3"),
    (lambda v: pw.lax.cond(1.5, lambda: v, lambda: v), TypeError, "pw.lax.cond: pred must be a scalar bool or integer, got 1.5"),
    (lambda v: pw.lax.switch(v[0], [lambda: v]), TypeError, "pw.lax.switch: index must be a scalar integer, got f64[]"),
    (lambda v: pw.lax.switch(0, []), ValueError, "pw.lax.switch: branches must not be empty"),
    (lambda v: pw.lax.switch(0, lambda: v), TypeError, "pw.lax.switch: branches must be a sequence of callables"),
    (lambda v: pw.lax.switch(v.astype(np.int32)[0], [lambda: v, None]), TypeError, "pw.lax.switch: branch 1 must be callable, got None"),
]


@pytest.mark.parametrize("body, exc, message", ERRORS, ids=[e[2][:50] for e in ERRORS])
def test_errors_name_the_problem(tpus2, runtime_ok, body, exc, message):
    with pytest.raises(exc, match=re.escape(message)):
        per_device(tpus2, body, np.ones((2, 2)))
    runtime_ok()


WEAK_TYPES = [
    (lambda v: pw.lax.cond(v[0] > 0, lambda: v[0].astype(np.int32), lambda: 1.5), False),
    (lambda v: pw.lax.cond(v[0] > 0, lambda: 1.0, lambda: 2), False),
    (lambda v: pw.lax.cond(v[0] > 0, lambda: v[0], lambda: 2), np.float64),
    (lambda v: pw.lax.cond(v[0] > 0, lambda: v[0].astype(np.int32), lambda: 2), np.int32),
    (lambda v: pw.lax.cond(v[0] > 0, lambda: v[0].astype(np.float32), lambda: True), np.float32),
    (lambda v: pw.lax.switch(v[0].astype(np.int32), [lambda: 1, lambda: 2, lambda: 3]), np.int32),
]


@pytest.mark.parametrize("body, dtype", WEAK_TYPES)
def test_weak_outputs_take_the_other_branchs_type_or_are_refused_as_jax(tpus2, runtime_ok, body, dtype):
    x = np.array([[1.0, 2.0], [-1.0, 3.0]])
    if dtype is False:
        with pytest.raises(TypeError, match="the branches must return the same types"):
            per_device(tpus2, body, x)
        runtime_ok()
    else:
        assert np.asarray(per_device(tpus2, body, x)).dtype == dtype
