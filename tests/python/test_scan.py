"""pw.lax.scan, pw.lax.fori_loop and pw.checkpoint: loops without unrolling, and rematerialization.

A scan's body is traced once into one `scan` op of the function IR, so the
IR of a 2-step and a 200-step loop have the same number of lines. Every loop
is checked against the same body unrolled by a Python loop in the same trace
(same kernels: the numbers agree to the last bit or to float tolerance where
the order of a sum differs), against numpy, and its gradients (`pw.grad`,
`pw.vjp`, `pw.jvp`, second derivatives) against finite differences and
against the unrolled loop's. `pw.checkpoint` gives the same numbers and
gradients and keeps fewer values from the forward to the backward pass (the
IR shows the backward recomputing the forward).
"""

import re

import numpy as np
import pytest

import pathways as pw
import pathways.numpy as pnp

from test_grad import check_grads, numeric_grad, pmap_grads


def unrolled_scan(f, init, xs=None, length=None, reverse=False):
    """The semantics of scan, as a Python loop (in a trace: unrolled; on numpy: numpy)."""
    leaves, treedef = pw.tree_flatten(xs)
    n = length if length is not None else leaves[0].shape[0]
    carry, ys = init, [None] * n
    order = range(n - 1, -1, -1) if reverse else range(n)
    for i in order:
        x = pw.tree_unflatten(treedef, [leaf[i] for leaf in leaves])
        carry, ys[i] = f(carry, x)
    if n == 0:
        return carry, None
    y_leaves, y_tree = pw.tree_flatten(ys[0])
    per_step = [pw.tree_flatten(y)[0] for y in ys]
    stacked = [pnp.stack([step[k] for step in per_step]) for k in range(len(y_leaves))]
    return carry, pw.tree_unflatten(y_tree, stacked)


def line_count(text):
    return len(text.strip().splitlines())


def scan_ops(text):
    """The scan ops of an IR text, with their attributes: [(length, carries, xs, reverse)]."""
    return re.findall(r"scan\[length=(\d+),carries=(\d+),xs=(\d+)(,reverse)?\]", text)


# --- Forward ------------------------------------------------------------------------------


def rnn_step(carry, x):
    """A carry of several dtypes (a pytree), xs a pytree, ys a pytree with a None."""
    h, count, flag = carry["h"], carry["count"], carry["flag"]
    h = pnp.tanh(h * x["w"] + x["u"].sum())
    return ({"h": h, "count": count + 1, "flag": ~flag},
            (h * 2.0, None, count.astype(np.float32), flag))


def rnn_args(rng, n, length):
    return (rng.normal(size=(n, 3)).astype(np.float32),
            rng.normal(size=(n, length, 3)).astype(np.float32),
            rng.normal(size=(n, length, 2)).astype(np.float32))


@pytest.mark.parametrize("length", [0, 1, 5])
@pytest.mark.parametrize("reverse", [False, True])
def test_scan_matches_the_unrolled_loop_and_numpy(tpus2, length, reverse):
    rng = np.random.default_rng(length)

    def run(scan_fn):
        def f(h0, w, u):
            init = {"h": h0, "count": np.int32(7), "flag": np.bool_(True)}
            return scan_fn(rnn_step, init, {"w": w, "u": u}, reverse=reverse)
        return f

    args = rnn_args(rng, 2, length)
    scanned = pw.pmap(run(pw.lax.scan), devices=tpus2)(*args)
    unrolled = pw.pmap(run(unrolled_scan), devices=tpus2)(*args)
    (carry, ys), (carry_u, ys_u) = scanned, unrolled
    for k in ("h", "count", "flag"):
        np.testing.assert_array_equal(np.asarray(carry[k]), np.asarray(carry_u[k]))
    assert np.asarray(carry["count"]).tolist() == [7 + length] * 2
    assert np.asarray(carry["flag"]).tolist() == [length % 2 == 0] * 2
    if length == 0:
        assert ys[1] is None
        assert np.asarray(ys[0]).shape == (2, 0, 3) and np.asarray(ys[3]).dtype == np.bool_
    else:
        assert ys[1] is None and ys_u[1] is None
        for a, b in zip((ys[0], ys[2], ys[3]), (ys_u[0], ys_u[2], ys_u[3])):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # numpy (float64 here, float32 on the devices).
    h0, w, u = (a.astype(np.float64) for a in args)
    for d in range(2):
        h = h0[d]
        order = range(length - 1, -1, -1) if reverse else range(length)
        hs = np.zeros((length, 3))
        for i in order:
            h = np.tanh(h * w[d, i] + u[d, i].sum())
            hs[i] = 2 * h
        np.testing.assert_allclose(np.asarray(carry["h"])[d], h, rtol=1e-5, atol=1e-6)
        if length:
            np.testing.assert_allclose(np.asarray(ys[0])[d], hs, rtol=1e-5, atol=1e-6)


def test_the_ir_does_not_grow_with_the_trip_count(tpus2):
    def f(n):
        def fn(h, w):
            def body(c, _):
                return pnp.tanh(c @ w), c.sum()
            return pw.lax.scan(body, h, None, length=n)
        return pw.pmap(fn, devices=tpus2)

    h = np.ones((2, 1, 4), np.float32)
    w = np.full((2, 4, 4), 0.1, np.float32)
    texts = [f(n).as_text(h, w) for n in (2, 200)]
    assert line_count(texts[0]) == line_count(texts[1])
    assert [op[0] for op in scan_ops(texts[1])] == ["200"]
    assert texts[0].count("matmul") == texts[1].count("matmul") == 1
    # The unrolled loop grows with it.
    unrolled = pw.pmap(lambda h, w: unrolled_scan(lambda c, _: (pnp.tanh(c @ w), c.sum()), h,
                                                  None, length=50), devices=tpus2)
    assert unrolled.as_text(h, w).count("matmul") == 50
    out, ys = f(200)(h, w)
    want_out, want_ys = unrolled_scan(lambda c, _: (np.tanh(c @ w[0]), c.sum()), h[0],
                                      None, length=200)
    np.testing.assert_allclose(np.asarray(out)[0], want_out, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(ys)[0], want_ys, rtol=1e-5)


def test_xs_none_with_length_and_a_body_closing_over_traced_values(tpus2):
    def f(w, b):
        def body(c, x):
            assert x is None
            return c * w + b, c
        return pw.lax.scan(body, pnp.zeros_like(w), length=4)

    w = np.array([[0.5, 2.0], [1.0, -1.0]])
    b = np.array([[1.0, 0.0], [2.0, 3.0]])
    text = pw.pmap(f, devices=tpus2).as_text(w, b)
    # w and b are consts of the scan: parameters of its body.
    assert re.search(r"scan\[length=4,carries=1,xs=0\] %\d+, %0, %1 ", text), text
    carry, ys = pw.pmap(f, devices=tpus2)(w, b)
    want_c, want_ys = unrolled_scan(lambda c, _: (c * w + b, c), np.zeros_like(w), length=4)
    np.testing.assert_allclose(np.asarray(carry), want_c)
    np.testing.assert_allclose(np.asarray(ys), np.moveaxis(want_ys, 0, 1))


def test_psum_in_the_body_over_the_pmap_axis(tpus4):
    def f(x, xs):
        def body(c, row):
            s = pw.psum(c * row, "i")
            return c + s / 4.0, pw.axis_index("i") + 0 * s.sum().astype(np.int32)
        return pw.lax.scan(body, x, xs)

    rng = np.random.default_rng(1)
    x = rng.normal(size=(4, 3))
    xs = rng.normal(size=(4, 6, 3))
    carry, idx = pw.pmap(f, devices=tpus4, axis_name="i")(x, xs)
    c = x.copy()
    for i in range(6):
        s = (c * xs[:, i]).sum(axis=0)
        c = c + s / 4.0
    np.testing.assert_allclose(np.asarray(carry), c, rtol=1e-12)
    np.testing.assert_array_equal(np.asarray(idx), np.repeat(np.arange(4)[:, None], 6, axis=1))


def test_nested_scans(tpus2):
    def f(m, xs):
        def outer(c, row):
            def inner(d, e):
                return d * 0.5 + e * c, d
            d, ds = pw.lax.scan(inner, c, row)
            return c + d, ds.sum(axis=0)
        return pw.lax.scan(outer, m, xs)

    rng = np.random.default_rng(2)
    m = rng.normal(size=(2, 3))
    xs = rng.normal(size=(2, 4, 5, 3))
    text = pw.pmap(f, devices=tpus2).as_text(m, xs)
    assert [op[0] for op in scan_ops(text)] == ["4", "5"]  # one body each, nested
    got = pw.pmap(f, devices=tpus2)(m, xs)
    for d in range(2):
        def outer(c, row):
            def inner(dd, e):
                return dd * 0.5 + e * c, dd
            dd, ds = unrolled_scan(inner, c, row)
            return c + dd, ds.sum(axis=0)
        want = unrolled_scan(outer, m[d], xs[d])
        np.testing.assert_allclose(np.asarray(got[0])[d], want[0], rtol=1e-12)
        np.testing.assert_allclose(np.asarray(got[1])[d], want[1], rtol=1e-12)


def test_fori_loop_with_static_bounds(tpus2):
    def f(x):
        return pw.lax.fori_loop(2, 7, lambda i, v: v * 1.5 + i, x)

    x = np.array([[1.0], [2.0]])
    text = pw.pmap(f, devices=tpus2).as_text(x)
    assert scan_ops(text) == [("5", "2", "0", "")]
    want = x.copy()
    for i in range(2, 7):
        want = want * 1.5 + i
    np.testing.assert_allclose(np.asarray(pw.pmap(f, devices=tpus2)(x)), want)
    # upper <= lower: no iteration.
    g = pw.pmap(lambda x: pw.lax.fori_loop(3, 1, lambda i, v: v + 1.0, x), devices=tpus2)
    np.testing.assert_array_equal(np.asarray(g(x)), x)
    # A pytree value, and the index as an int32 traced value.
    h = pw.pmap(lambda x: pw.lax.fori_loop(0, 4, lambda i, v: (v[0] + i, v[1] * 2.0),
                                           (np.int32(0), x)), devices=tpus2)
    k, y = h(x)
    assert np.asarray(k).dtype == np.int32 and np.asarray(k).tolist() == [6, 6]
    np.testing.assert_array_equal(np.asarray(y), x * 16)


def test_outside_a_trace_it_runs_on_one_device():
    carry, ys = pw.lax.scan(lambda c, x: (c + x, c * x), np.float32(1.0),
                            np.arange(4, dtype=np.float32))
    assert isinstance(carry, np.ndarray) and carry.dtype == np.float32 and carry == 7.0
    np.testing.assert_array_equal(ys, [0.0, 1.0, 4.0, 12.0])  # c * x before each step
    assert pw.lax.fori_loop(0, 10, lambda i, v: v + i, np.int32(0)) == 45


def test_inside_a_program(tpus2):
    step = pw.pmap(lambda x: pw.lax.scan(lambda c, r: (c + r, c), x[0] * 0.0, x), devices=tpus2)

    @pw.program
    def prog(x):
        c, ys = step(x)
        return step(ys)

    x = np.arange(12.0).reshape(2, 3, 2)
    c, ys = prog(x)
    for d in range(2):
        _, ys1 = unrolled_scan(lambda c, r: (c + r, c), x[d, 0] * 0.0, x[d])
        c2, ys2 = unrolled_scan(lambda c, r: (c + r, c), x[d, 0] * 0.0, ys1)
        np.testing.assert_array_equal(np.asarray(c)[d], c2)
        np.testing.assert_array_equal(np.asarray(ys)[d], ys2)

    @pw.program
    def bad(x):
        return pw.lax.scan(lambda c, r: (c + r, c), x, None, length=2)

    with pytest.raises(pw.TracerError, match="pw.lax.scan was called in"):
        bad(x)


# --- Errors --------------------------------------------------------------------------------


def traced_error(tpus, fn, *args):
    return pw.pmap(fn, devices=tpus).as_text(*args)


def test_bad_arguments_raise_clear_errors(tpus2, runtime_ok):
    x = np.zeros((2, 3), np.float32)
    xs = np.zeros((2, 4, 3), np.float32)
    cases = [
        (TypeError, "carry output must have the carry input's type: carry leaf 0 is f32\\[3\\] "
                    "on input but f64\\[3\\] on output",
         lambda x, xs: pw.lax.scan(lambda c, r: (c.astype(np.float64), r), x, xs)),
        (TypeError, "carry leaf 0 is f32\\[3\\] on input but f32\\[\\] on output",
         lambda x, xs: pw.lax.scan(lambda c, r: (c.sum(), r), x, xs)),
        (TypeError, "carry output must have the carry input's structure",
         lambda x, xs: pw.lax.scan(lambda c, r: ((c, c), r), x, xs)),
        (TypeError, "must return a pair \\(carry, y\\), got Tracer",
         lambda x, xs: pw.lax.scan(lambda c, r: c, x, xs)),
        (ValueError, "length is 5, which disagrees with the leading axis sizes of xs "
                     "\\(f32\\[4,3\\]\\)",
         lambda x, xs: pw.lax.scan(lambda c, r: (c, r), x, xs, length=5)),
        (ValueError, "xs leaf 1 \\(f32\\[\\]\\) has no leading axis to scan over",
         lambda x, xs: pw.lax.scan(lambda c, r: (c, r), x, (xs, x.sum()))),
        (ValueError, "different leading axis sizes \\(f32\\[4,3\\], f32\\[3\\]\\)",
         lambda x, xs: pw.lax.scan(lambda c, r: (c, r), x, (xs, x))),
        (ValueError, "no xs to scan over, so length must be given",
         lambda x, xs: pw.lax.scan(lambda c, r: (c, r), x)),
        (ValueError, "length must be >= 0, got -1",
         lambda x, xs: pw.lax.scan(lambda c, r: (c, r), x, length=-1)),
        (TypeError, "length must be a static int, got 2.5",
         lambda x, xs: pw.lax.scan(lambda c, r: (c, r), x, length=2.5)),
        (TypeError, "reverse must be a bool",
         lambda x, xs: pw.lax.scan(lambda c, r: (c, r), x, xs, reverse=1)),
        (ValueError, "unroll must be >= 1",
         lambda x, xs: pw.lax.scan(lambda c, r: (c, r), x, xs, unroll=0)),
        (TypeError, "expects a callable",
         lambda x, xs: pw.lax.scan(3, x, xs)),
        # A traced bound makes a while loop (test_while.py), of integer scalar bounds only.
        (TypeError, "fori_loop: lower must be a scalar integer, got f32\\[3\\]",
         lambda x, xs: pw.lax.fori_loop(x, 3, lambda i, v: v, x)),
        (TypeError, "fori_loop: upper must be a static int, got True",
         lambda x, xs: pw.lax.fori_loop(0, True, lambda i, v: v, x)),
        (ValueError, "fori_loop: upper 4294967296 is outside int32's range",
         lambda x, xs: pw.lax.fori_loop(0, 2**32, lambda i, v: v, x)),
        # An op of the body: the builder's error, naming the op.
        (ValueError, "add: incompatible shapes f32\\[3\\] and f32\\[2\\]",
         lambda x, xs: pw.lax.scan(lambda c, r: (c + r[:2], r), x, xs)),
    ]
    for exc, pattern, fn in cases:
        with pytest.raises(exc, match=pattern):
            traced_error(tpus2, fn, x, xs)
        runtime_ok()


def test_a_body_value_used_after_the_loop_is_an_escaped_tracer(tpus2, runtime_ok):
    leaked = []

    def f(x):
        def body(c, _):
            leaked.append(c * 2.0)
            return c, None
        pw.lax.scan(body, x, None, length=2)
        return x + leaked[0]

    with pytest.raises(pw.TracerError, match="escaped tracer"):
        pw.pmap(f, devices=tpus2).as_text(np.zeros((2, 3)))
    runtime_ok()


# --- Gradients -------------------------------------------------------------------------------


def loss_of_scan(scan_fn, reverse=False):
    def loss(w, h0, xs, u):
        def body(carry, x):
            h, k = carry
            h = pnp.tanh(h * w + x) + u * k.astype(np.float64)
            return (h, k + 1), (h * h).sum()
        (h, k), ys = scan_fn(body, (h0, np.int32(0)), xs, reverse=reverse)
        return (h ** 3).sum() + (0.0 if ys is None else ys.sum() * 0.5)
    return loss


@pytest.mark.parametrize("length", [0, 1, 4])
@pytest.mark.parametrize("reverse", [False, True])
def test_grad_matches_finite_differences_and_the_unrolled_loop(tpus2, length, reverse):
    rng = np.random.default_rng(10 + length)
    args = (rng.normal(size=(2, 3)), rng.normal(size=(2, 3)), rng.normal(size=(2, length, 3)),
            rng.normal(size=(2, 3)) * 0.1)
    got = check_grads(tpus2, loss_of_scan(pw.lax.scan, reverse), args, rtol=1e-6, atol=1e-8)
    want = pmap_grads(tpus2, loss_of_scan(unrolled_scan, reverse), args, range(4))
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-14)


def test_grad_of_pytree_carries_and_float32(tpus2):
    def loss(params, xs):
        def body(c, x):
            a, b = c["a"], c["b"]
            a2 = a * params["w"] + x[0]
            b2 = b + pnp.sin(a2) * params["v"]
            return {"a": a2, "b": b2}, a2.sum()
        c, ys = pw.lax.scan(body, {"a": params["a0"], "b": params["b0"]}, xs)
        return c["b"].sum() + (ys ** 2).sum()

    rng = np.random.default_rng(3)
    params = {k: rng.normal(size=(2, 2)).astype(np.float32) for k in ("w", "v", "a0", "b0")}
    xs = rng.normal(size=(2, 3, 1, 2)).astype(np.float32)
    g = pw.pmap(pw.grad(loss), devices=tpus2)(params, xs)

    def unrolled(params, xs):
        c = {"a": params["a0"], "b": params["b0"]}
        total = 0.0
        for i in range(xs.shape[0]):
            a2 = c["a"] * params["w"] + xs[i][0]
            c = {"a": a2, "b": c["b"] + pnp.sin(a2) * params["v"]}
            total = total + a2.sum() ** 2
        return c["b"].sum() + total

    gu = pw.pmap(pw.grad(unrolled), devices=tpus2)(params, xs)
    for k in params:
        assert np.asarray(g[k]).dtype == np.float32
        np.testing.assert_allclose(np.asarray(g[k]), np.asarray(gu[k]), rtol=1e-5, atol=1e-6)


def test_fori_loop_gradient(tpus2):
    def loss(w, x):
        return pw.lax.fori_loop(0, 5, lambda i, v: pnp.sin(v * w) + i * 0.1, x).sum()

    rng = np.random.default_rng(4)
    check_grads(tpus2, loss, (rng.normal(size=(2, 3)), rng.normal(size=(2, 3))))


def test_grad_through_nested_scans_and_a_psum(tpus2):
    def loss(w, m, xs):
        def outer(c, row):
            def inner(d, e):
                return pnp.tanh(d * w + e), d.sum()
            d, ds = pw.lax.scan(inner, c, row)
            return c * 0.5 + pw.psum(d, "i"), ds
        c, ys = pw.lax.scan(outer, m, xs)
        return (c ** 2).sum() + (ys ** 2).sum()

    rng = np.random.default_rng(5)
    args = (rng.normal(size=(2, 3)), rng.normal(size=(2, 3)), rng.normal(size=(2, 2, 3, 3)) * 0.5)

    def total(w, m, xs):  # numpy, over both devices (the psum couples them)
        c = m.copy()
        out = 0.0
        for i in range(xs.shape[1]):
            d = c.copy()
            ds = np.zeros((2, 3))
            for j in range(xs.shape[2]):
                ds[:, j] = d.sum(axis=1)
                d = np.tanh(d * w + xs[:, i, j])
            c = c * 0.5 + d.sum(axis=0)
            out += (ds ** 2).sum()
        return (c ** 2).sum() + out

    check_grads(tpus2, loss, args, total=total, rtol=1e-6, atol=1e-8)


def test_second_derivatives_through_scan(tpus2):
    def f(w, x):
        def body(c, r):
            return pnp.sin(c * w + r), c
        c, ys = pw.lax.scan(body, x, np.ones((3, 2)) * 0.3)
        return (c * c).sum() + ys.sum()

    def f_unrolled(w, x):
        def body(c, r):
            return pnp.sin(c * w + r), c
        c, ys = unrolled_scan(body, x, np.ones((3, 2)) * 0.3)
        return (c * c).sum() + ys.sum()

    rng = np.random.default_rng(6)
    w, x = rng.normal(size=(2, 2)), rng.normal(size=(2, 2))

    def second(fn):
        return lambda w, x: pw.grad(lambda w, x: pw.grad(fn)(w, x).sum(), argnums=(0, 1))(w, x)

    got = pw.pmap(second(f), devices=tpus2)(w, x)
    want = pw.pmap(second(f_unrolled), devices=tpus2)(w, x)
    for g, u in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(u), rtol=1e-10, atol=1e-12)
    # And against finite differences of the first derivative.
    first = pw.pmap(pw.grad(f), devices=tpus2)

    def total(w, x):
        return float(np.asarray(first(w, x)).sum())

    np.testing.assert_allclose(np.asarray(got[0]), numeric_grad(total, (w, x), 0), rtol=1e-6,
                               atol=1e-8)


def test_jvp_and_pmapped_vjp_through_scan(tpus2):
    def f(w, x):
        return pw.lax.scan(lambda c, r: (pnp.tanh(c * w + r), c * 2.0), x, np.ones((4, 2)))

    def f_unrolled(w, x):
        return unrolled_scan(lambda c, r: (pnp.tanh(c * w + r), c * 2.0), x, np.ones((4, 2)))

    rng = np.random.default_rng(7)
    w, x, tw, tx = (rng.normal(size=(2, 2)) for _ in range(4))
    jvp = pw.pmap(lambda *a: pw.jvp(f, a[:2], a[2:]), devices=tpus2)(w, x, tw, tx)
    jvp_u = pw.pmap(lambda *a: pw.jvp(f_unrolled, a[:2], a[2:]), devices=tpus2)(w, x, tw, tx)
    for a, b in zip(pw.tree_leaves(jvp), pw.tree_leaves(jvp_u)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12, atol=1e-14)
    # pw.vjp of a pmapped function: a forward and a backward function.
    out, pullback = pw.vjp(pw.pmap(f, devices=tpus2), w, x)
    out_u, pullback_u = pw.vjp(pw.pmap(f_unrolled, devices=tpus2), w, x)
    ct = (rng.normal(size=(2, 2)), rng.normal(size=(2, 4, 2)))
    for a, b in zip(pw.tree_leaves((out, pullback(ct))), pw.tree_leaves((out_u, pullback_u(ct)))):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12, atol=1e-14)


def test_only_float_carries_get_cotangents_and_unused_ys_cost_nothing(tpus2):
    def loss(x):
        def body(c, _):
            f, k = c
            return (f * 1.5, k + 1), (f, k)
        (f, k), (fs, ks) = pw.lax.scan(body, (x, np.int32(0)), None, length=3)
        return f.sum()

    text = pw.pmap(pw.grad(loss), devices=tpus2).as_text(np.ones((2, 2)))
    backward = scan_ops(text)[1]
    assert backward == ("3", "1", "0", ",reverse")  # one carried cotangent, no ys' cotangents
    np.testing.assert_allclose(np.asarray(pw.pmap(pw.grad(loss), devices=tpus2)(np.ones((2, 2)))),
                               np.full((2, 2), 1.5 ** 3))


# --- checkpoint ---------------------------------------------------------------------------------


def mlp_step(c, w):
    h = pnp.tanh(c @ w)
    h = pnp.tanh(h @ w.T) * pnp.exp(-h.sum())
    return pnp.sin(h) + c, None


def layers_loss(step):
    def loss(ws, c):
        c, _ = pw.lax.scan(step, c, ws)
        return (c ** 2).sum()
    return loss


def test_checkpoint_gives_the_same_numbers_and_recomputes(tpus2):
    rng = np.random.default_rng(8)
    ws = rng.normal(size=(2, 6, 8, 8)) * 0.3
    c = rng.normal(size=(2, 4, 8))
    plain = pw.pmap(pw.grad(layers_loss(mlp_step), argnums=(0, 1)), devices=tpus2)
    remat = pw.pmap(pw.grad(layers_loss(pw.checkpoint(mlp_step)), argnums=(0, 1)), devices=tpus2)
    for a, b in zip(plain(ws, c), remat(ws, c)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12, atol=1e-14)
    check_grads(tpus2, layers_loss(pw.remat(mlp_step)), (ws[:, :2, :3, :3], c[:, :2, :3]),
                rtol=1e-6, atol=1e-8)
    text_plain, text_remat = plain.as_text(ws, c), remat.as_text(ws, c)
    # The forward scan stacks fewer residuals: its results are the final carry
    # and the stacked inputs of each step (the carry as it enters), where
    # without checkpoint they are every intermediate the backward reads.
    fwd_plain = re.search(r"= scan\[length=6,carries=1,xs=1\] .* : \(([^)]*)\)", text_plain).group(1)
    fwd_remat = re.search(r"= scan\[length=6,carries=1,xs=1\] .* : \(([^)]*)\)", text_remat).group(1)
    assert fwd_remat.count("f64[6,") == 1, fwd_remat
    assert fwd_plain.count("f64[6,") > 3, fwd_plain
    # The backward body recomputes the forward: its matmuls and tanh again.
    bwd_plain = text_plain.split("func @mlp_step_bwd")[1]
    bwd_remat = text_remat.split("func @mlp_step_bwd")[1]
    assert bwd_remat.count("tanh") == 2 and bwd_plain.count("tanh") == 0
    # Fewer bytes live at once: the memory plan's peak per shard.
    big = rng.normal(size=(2, 40, 8, 8)) * 0.3
    bytes_plain = plain.compiled(big, c).scratch_bytes_per_shard
    bytes_remat = remat.compiled(big, c).scratch_bytes_per_shard
    assert bytes_remat < 0.6 * bytes_plain, (bytes_remat, bytes_plain)


def test_checkpoint_of_a_function_with_captured_values(tpus2):
    def loss(w, v, x):
        @pw.checkpoint
        def block(x):  # captures w and v
            return pnp.tanh(x @ w) * v, x.sum()

        y, s = block(x)
        y2, s2 = block(y)
        return (y2 ** 2).sum() + s * s2

    rng = np.random.default_rng(9)
    args = (rng.normal(size=(2, 3, 3)), rng.normal(size=(2, 3)), rng.normal(size=(2, 2, 3)))
    got = check_grads(tpus2, loss, args, rtol=1e-6, atol=1e-8)
    # In pw.vjp's split, the backward function's residuals are the block's inputs.
    _, pullback = pw.vjp(pw.pmap(loss, devices=tpus2), *args)
    g = pullback(np.ones(2))
    for a, b in zip(g, got):
        np.testing.assert_allclose(np.asarray(a), b, rtol=1e-12)
    text = pw.pmap(pw.grad(loss, argnums=(0, 1, 2)), devices=tpus2).as_text(*args)
    assert text.count("tanh") == 4  # twice forward, twice recomputed


def test_checkpoint_without_gradients_is_the_function(tpus2):
    f = pw.pmap(lambda x: pw.checkpoint(lambda y: pnp.sin(y) * 2.0)(x), devices=tpus2)
    g = pw.pmap(lambda x: pnp.sin(x) * 2.0, devices=tpus2)
    x = np.array([0.5, 1.0])
    assert f.as_text(x) == g.as_text(x).replace("@lambda", "@lambda")
    np.testing.assert_array_equal(np.asarray(f(x)), np.asarray(g(x)))
    assert pw.checkpoint(np.cos)(0.0) == 1.0
    assert pw.remat is pw.checkpoint
    with pytest.raises(NotImplementedError, match="policies are not supported"):
        pw.checkpoint(np.cos, policy=lambda *a: True)
    with pytest.raises(TypeError, match="expects a callable"):
        pw.checkpoint(3)


def test_second_derivatives_through_checkpoint(tpus2):
    def f(w, x):
        return pw.checkpoint(lambda a, b: pnp.sin(a * b).sum() * a.sum())(w, x)

    def second(fn):
        return lambda w, x: pw.grad(lambda w, x: pw.grad(fn)(w, x).sum())(w, x)

    rng = np.random.default_rng(11)
    w, x = rng.normal(size=(2, 3)), rng.normal(size=(2, 3))
    got = pw.pmap(second(f), devices=tpus2)(w, x)
    want = pw.pmap(second(lambda w, x: pnp.sin(w * x).sum() * w.sum()), devices=tpus2)(w, x)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-12)


def test_the_function_ir_goes_over_the_wire(tpus2):
    """Host processes receive the scan's body: the compiled function's IR round trips."""
    f = pw.pmap(pw.grad(layers_loss(pw.checkpoint(mlp_step))), devices=tpus2)
    rng = np.random.default_rng(12)
    ws, c = rng.normal(size=(2, 3, 4, 4)), rng.normal(size=(2, 2, 4))
    fn = f.get_compiled(*f._prepare((ws, c))).function
    assert fn.nesting_depth == 1
    np.testing.assert_allclose(np.asarray(f(ws, c)),
                               np.asarray(pw.pmap(pw.grad(layers_loss(mlp_step)),
                                                  devices=tpus2)(ws, c)), rtol=1e-12)


def test_a_gang_over_two_hosts_runs_the_collectives_of_a_loop_body(devices_of):
    """8 devices span two hosts (with --hosts=local_processes, two processes, each running
    its shards of every iteration and meeting the other in each psum)."""
    tpus8 = devices_of(8)

    def loss(w, x, xs):
        def body(c, r):
            c = pnp.tanh(c * w + pw.psum(c * r, "i") * 0.1)
            return c, pw.pmax(c, "i")
        c, ys = pw.lax.scan(body, x, xs)
        return (c ** 2).sum() + ys.sum()

    def loss_unrolled(w, x, xs):
        def body(c, r):
            c = pnp.tanh(c * w + pw.psum(c * r, "i") * 0.1)
            return c, pw.pmax(c, "i")
        c, ys = unrolled_scan(body, x, xs)
        return (c ** 2).sum() + ys.sum()

    rng = np.random.default_rng(13)
    args = (rng.normal(size=(8, 3)), rng.normal(size=(8, 3)), rng.normal(size=(8, 5, 3)))
    got = pmap_grads(tpus8, loss, args, (0, 1, 2))
    want = pmap_grads(tpus8, loss_unrolled, args, (0, 1, 2))
    for g, u in zip(got, want):
        np.testing.assert_allclose(g, u, rtol=1e-10, atol=1e-12)
    value = pw.pmap(loss, devices=tpus8, axis_name="i")(*args)
    np.testing.assert_allclose(np.asarray(value),
                               np.asarray(pw.pmap(loss_unrolled, devices=tpus8, axis_name="i")(*args)),
                               rtol=1e-12)


def test_grad_inside_a_body_differentiated_again_and_values_of_the_function_as_ys(tpus2):
    """A body that takes a gradient (a tape of its own), reads an int and a float of the
    enclosing function and returns one of them as its y; then pw.grad of the whole loop."""
    def inner_step(c, w, k):
        return c - 0.1 * pw.grad(lambda c: (pnp.sin(c * w) * k).sum())(c)

    def loss(w, k, xs):
        c, ys = pw.lax.scan(lambda c, x: (inner_step(c, w, k) + x, w), xs[0], xs)
        return (c ** 2).sum() + ys.sum()

    def loss_unrolled(w, k, xs):
        c, ys = unrolled_scan(lambda c, x: (inner_step(c, w, k) + x, w), xs[0], xs)
        return (c ** 2).sum() + ys.sum()

    rng = np.random.default_rng(15)
    w, xs = rng.normal(size=(2, 3)), rng.normal(size=(2, 4, 3))
    k = np.array([2, 3], np.int32)
    got = pw.pmap(pw.grad(loss, argnums=(0, 2)), devices=tpus2)(w, k, xs)
    want = pw.pmap(pw.grad(loss_unrolled, argnums=(0, 2)), devices=tpus2)(w, k, xs)
    for g, u in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(u), rtol=1e-12, atol=1e-14)


def test_vjp_in_a_trace_of_a_loop(tpus2):
    def f(x):
        y, pullback = pw.vjp(
            lambda x: pw.lax.scan(lambda c, _: (c * x, c), x, None, length=3)[0], x)
        return pullback(pnp.ones_like(y))[0]

    x = np.array([[1.0, 2.0], [3.0, -4.0]])
    np.testing.assert_allclose(np.asarray(pw.pmap(f, devices=tpus2)(x)), 4 * x ** 3)


def test_python_scalar_carries_are_weakly_typed(tpus2):
    """As in JAX: a carry that starts as a Python scalar takes the body's dtype."""
    def f(xs):
        (total, count, scaled), _ = pw.lax.scan(
            lambda c, x: ((c[0] + x.sum(), c[1] + 1, c[2] * 2), None), (0.0, 0, 1.5), xs)
        as_int, _ = pw.lax.scan(lambda c, x: (c + x.sum(), None), 0, xs)
        return total, count, scaled, as_int, pw.lax.fori_loop(0, 3, lambda i, v: v + x_sum(xs), 0.0)

    def x_sum(xs):
        return xs.sum()

    xs = np.arange(12, dtype=np.float32).reshape(2, 2, 3)
    total, count, scaled, as_int, looped = pw.pmap(f, devices=tpus2)(xs)
    assert np.asarray(total).dtype == np.float32  # 0.0 met float32 values
    assert np.asarray(count).dtype == np.int32
    assert np.asarray(scaled).dtype == np.float64  # nothing but Python scalars: float64
    assert np.asarray(as_int).dtype == np.float32  # 0 met float32 values
    assert np.asarray(looped).dtype == np.float32
    np.testing.assert_array_equal(np.asarray(total), xs.reshape(2, -1).sum(axis=1))
    np.testing.assert_array_equal(np.asarray(count), [2, 2])
    np.testing.assert_array_equal(np.asarray(scaled), [6.0, 6.0])
    np.testing.assert_array_equal(np.asarray(looped), 3 * xs.reshape(2, -1).sum(axis=1))
    # A numpy scalar is strongly typed: its dtype must stay.
    with pytest.raises(TypeError, match="carry leaf 0 is f64\\[\\] on input but f32\\[\\] on output"):
        pw.pmap(lambda xs: pw.lax.scan(lambda c, x: (x.sum(), None), np.float64(0), xs),
                devices=tpus2).as_text(xs)


def test_matches_jax(tpus2):
    """Values and gradients of jax.lax.scan / fori_loop / checkpoint (float32, both sides)."""
    import jax
    import jax.numpy as jnp

    def make(np_, lax, remat):
        def step(c, x):
            h, k = c
            h = np_.tanh(h * x[0] + x[1]) * 0.9 + 0.1 * h
            return (h, k + 1), h.sum()

        def loss(h0, xs):
            (h, k), ys = lax.scan(remat(step), (h0, 0), xs, reverse=True)
            h = lax.fori_loop(1, 4, lambda i, v: v * 0.5 + 1.0, h)
            return (h ** 2).sum() + (ys ** 2).sum() + k.astype(np.float32)
        return loss

    rng = np.random.default_rng(16)
    h0 = rng.normal(size=(2, 3)).astype(np.float32)
    xs = rng.normal(size=(2, 5, 2, 3)).astype(np.float32)
    for remat in (lambda f: f, "checkpoint"):
        ours = make(pnp, pw.lax, pw.checkpoint if remat == "checkpoint" else remat)
        theirs = make(jnp, jax.lax, jax.checkpoint if remat == "checkpoint" else remat)
        value, grads = pw.pmap(pw.value_and_grad(ours, argnums=(0, 1)), devices=tpus2)(h0, xs)
        for d in range(2):
            want_value, want_grads = jax.value_and_grad(theirs, argnums=(0, 1))(h0[d], xs[d])
            assert np.asarray(value).dtype == np.float32
            np.testing.assert_allclose(np.asarray(value)[d], want_value, rtol=1e-5)
            for g, w in zip(grads, want_grads):
                np.testing.assert_allclose(np.asarray(g)[d], np.asarray(w), rtol=1e-4, atol=1e-5)


def test_in_a_jitted_function():
    f = pw.jit(lambda xs: pw.lax.scan(lambda c, x: (c + x, c * x), np.float32(1), xs))
    carry, ys = f(np.arange(4, dtype=np.float32))
    assert float(np.asarray(carry)) == 7.0
    np.testing.assert_array_equal(np.asarray(ys), [0.0, 1.0, 4.0, 12.0])


def test_a_heavy_loop_with_a_psum_split_over_executor_threads(tpus4):
    """Enough work per device that the gang's shards run in parts on several threads
    (the loop closes its stage: its body's psum needs the whole gang)."""
    def step(c, w):
        h = pnp.tanh(c @ w)
        return h + pw.psum(h, "i") * 0.01, h.sum()

    rng = np.random.default_rng(17)
    c = rng.normal(size=(4, 64, 64)) * 0.1
    ws = rng.normal(size=(4, 6, 64, 64)) * 0.1
    got = pw.pmap(lambda c, ws: pw.lax.scan(step, c, ws), devices=tpus4, axis_name="i")(c, ws)
    want = pw.pmap(lambda c, ws: unrolled_scan(step, c, ws), devices=tpus4, axis_name="i")(c, ws)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
