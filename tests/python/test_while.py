"""pw.lax.while_loop and pw.lax.fori_loop with traced bounds: loops whose trip count the device decides.

A while loop's cond and body are traced once each into one `while` op of the
function IR (its text has one while op, whatever the trip count). Every loop
is checked against `jax.lax.while_loop` on JAX's CPU backend, device by
device: in a `pw.pmap` each device runs its own trip count. Collectives in a
loop are checked against `jax.vmap` with an axis name (JAX's batched while,
whose psum sums over the batch as a pmap's over devices), with trip counts
that are the same on every device (differing ones are a user error in JAX).
"""

import re
import textwrap

import numpy as np
import pytest

import pathways as pw
import pathways.numpy as pnp

from conftest import run_python


@pytest.fixture(scope="module")
def jax():
    return pytest.importorskip("jax")


def while_ops(text):
    """The while ops of an IR text: [carries] per op."""
    return re.findall(r"while\[carries=(\d+)\]", text)


def per_device(jax_fn, *args):
    """jax_fn applied to each device's slice of `args` (leading axis), results stacked."""
    n = args[0].shape[0]
    outs = [jax_fn(*[a[d] for a in args]) for d in range(n)]
    return pw.tree_map(lambda *leaves: np.stack([np.asarray(x) for x in leaves]), *outs)


def assert_trees_equal(ours, theirs, rtol=0.0):
    ours_leaves, ours_tree = pw.tree_flatten(ours)
    theirs_leaves, theirs_tree = pw.tree_flatten(theirs)
    assert ours_tree == theirs_tree
    for a, b in zip(ours_leaves, theirs_leaves):
        a, b = np.asarray(a), np.asarray(b)
        assert a.dtype == b.dtype, (a.dtype, b.dtype)
        assert a.shape == b.shape, (a.shape, b.shape)
        if rtol:
            np.testing.assert_allclose(a, b, rtol=rtol)
        else:
            np.testing.assert_array_equal(a, b)


# --- Against jax.lax.while_loop --------------------------------------------------------


def newton_sqrt(np_, lax):
    """Newton's iteration for sqrt(a) until it converges, counting steps (capped)."""
    def f(a):
        def cond(c):
            x, k = c
            return (np_.abs(x * x - a) > 1e-5 * a) & (k < 50)

        def body(c):
            x, k = c
            return (x + a / x) * 0.5, k + 1

        return lax.while_loop(cond, body, (a, np.int32(0)))
    return f


def collatz(np_, lax):
    """Collatz steps to reach 1 (an int carry; the count differs wildly per input)."""
    def f(n):
        def body(c):
            v, k = c
            return np_.where(v % 2 == 1, 3 * v + 1, v // 2), k + 1

        return lax.while_loop(lambda c: c[0] != 1, body, (n, np.int32(0)))
    return f


def pytree_carry(np_, lax):
    """A dict carry of float, int and bool leaves and a tuple; the cond reads two of them."""
    def f(x, limit):
        init = {"x": x, "steps": (np.int32(0), np.bool_(False)), "acc": x * 0.0}

        def cond(c):
            return (c["acc"].sum() < limit) & (c["steps"][0] < 20)

        def body(c):
            k, flag = c["steps"]
            return {"x": np_.tanh(c["x"]) + 0.5, "steps": (k + 1, ~flag),
                    "acc": c["acc"] + np_.abs(c["x"])}

        return lax.while_loop(cond, body, init)
    return f


def test_matches_jax_with_per_device_trip_counts(tpus2, jax):
    jnp = jax.numpy
    a = np.array([2.0, 1e4], np.float32)
    out = pw.pmap(newton_sqrt(pnp, pw.lax), devices=tpus2)(a)
    assert_trees_equal(out, per_device(newton_sqrt(jnp, jax.lax), a), rtol=1e-6)
    counts = np.asarray(out[1])
    assert counts[0] != counts[1]  # each device ran its own trip count
    n = np.array([27, 6], np.int32)
    out = pw.pmap(collatz(pnp, pw.lax), devices=tpus2)(n)
    assert_trees_equal(out, per_device(collatz(jnp, jax.lax), n))
    assert list(np.asarray(out[1])) == [111, 8]
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 3)).astype(np.float32)
    limit = np.array([1.0, 7.5], np.float32)
    out = pw.pmap(pytree_carry(pnp, pw.lax), devices=tpus2)(x, limit)
    assert_trees_equal(out, per_device(pytree_carry(jnp, jax.lax), x, limit), rtol=1e-6)
    assert np.asarray(out["steps"][0])[0] < np.asarray(out["steps"][0])[1]


def test_zero_iterations_give_the_initial_value(tpus2, jax):
    x = np.array([[5.0, 1.0], [-1.0, 2.0]], np.float32)

    def f(lax):
        return lambda x: lax.while_loop(lambda c: c[0] < 0.0, lambda c: c + 3.0, x)

    out = pw.pmap(f(pw.lax), devices=tpus2)(x)
    assert_trees_equal(out, per_device(f(jax.lax), x))
    np.testing.assert_array_equal(np.asarray(out), [[5.0, 1.0], [2.0, 5.0]])
    # A cond that is a constant False: the loop never runs.
    g = pw.pmap(lambda x: pw.lax.while_loop(lambda c: False, lambda c: c + 1.0, x), devices=tpus2)
    np.testing.assert_array_equal(np.asarray(g(x)), x)


def test_the_ir_has_one_while_op_whatever_the_trip_count(tpus2):
    def f(x, n):
        return pw.lax.while_loop(lambda c: c[1] < n, lambda c: (pnp.sin(c[0]), c[1] + 1),
                                 (x, np.int32(0)))

    fn = pw.pmap(f, devices=tpus2)
    x = np.ones((2, 3), np.float32)
    text = fn.as_text(x, np.array([2, 300], np.int32))
    assert while_ops(text) == ["2"]
    assert text.count("sin") == 1
    value, count = fn(x, np.array([2, 300], np.int32))
    assert list(np.asarray(count)) == [2, 300]
    want = np.ones(3, np.float32)
    for _ in range(300):
        want = np.sin(want)
    np.testing.assert_allclose(np.asarray(value)[1], want, rtol=1e-5)


def test_closures_of_cond_and_body_become_consts(tpus2, jax):
    """Values of the pmap'd function that the cond and the body read (different ones,
    and one both read) are passed to the loop."""
    def make(lax):
        def f(x, w, limit):
            scale = w * 2.0

            def cond(c):
                return (c.sum() < limit) & (scale.sum() > -100.0)

            def body(c):
                return c * scale + w

            return lax.while_loop(cond, body, x)
        return f

    rng = np.random.default_rng(1)
    x = rng.uniform(0.1, 1.0, size=(2, 3)).astype(np.float32)
    w = rng.uniform(0.6, 1.2, size=(2, 3)).astype(np.float32)
    limit = np.array([10.0, 100.0], np.float32)
    fn = pw.pmap(make(pw.lax), devices=tpus2)
    assert len(while_ops(fn.as_text(x, w, limit))) == 1
    assert_trees_equal(fn(x, w, limit), per_device(make(jax.lax), x, w, limit), rtol=1e-6)


def test_a_weak_initial_carry_takes_the_bodys_dtype(tpus2, jax):
    def make(lax):
        return lambda x: lax.while_loop(lambda c: c < 10.0, lambda c: c + x, 0.0)

    x = np.array([3.0, 0.5], np.float32)
    out = pw.pmap(make(pw.lax), devices=tpus2)(x)
    assert np.asarray(out).dtype == np.float32
    assert_trees_equal(out, per_device(make(jax.lax), x))


# --- Nesting --------------------------------------------------------------------------


def scan_of_whiles(np_, lax):
    """A scan whose body runs a while loop with a count of its own per step."""
    def f(xs):
        def step(c, x):
            v, k = lax.while_loop(lambda s: s[0] < x, lambda s: (s[0] * 1.5 + 0.25, s[1] + 1),
                                  (c, np.int32(0)))
            return v - x, k
        return lax.scan(step, np.float32(0.5), xs)
    return f


def while_of_scans(np_, lax):
    """A while loop whose body runs a scan (over rows it closes over), until the
    scans' results add up to a bound."""
    def f(rows, bound):
        def body(c):
            acc, total, k = c
            acc, _ = lax.scan(lambda a, r: (np_.tanh(a + r), None), acc, rows)
            return acc, total + np_.abs(acc).sum() + 0.5, k + 1

        init = (rows[0] * 0.0, np.float32(0.0), np.int32(0))
        return lax.while_loop(lambda c: c[1] < bound, body, init)
    return f


def test_nests_with_scan(tpus2, jax):
    jnp = jax.numpy
    rng = np.random.default_rng(2)
    xs = rng.uniform(1.0, 40.0, size=(2, 6)).astype(np.float32)
    fn = pw.pmap(scan_of_whiles(pnp, pw.lax), devices=tpus2)
    assert_trees_equal(fn(xs), per_device(scan_of_whiles(jnp, jax.lax), xs), rtol=1e-6)
    assert re.search(r"scan\[length=6.*\n(.*\n)*.*while\[carries=2\]", fn.as_text(xs))
    rows = rng.normal(size=(2, 4, 3)).astype(np.float32)
    bound = np.array([5.0, 30.0], np.float32)
    fn = pw.pmap(while_of_scans(pnp, pw.lax), devices=tpus2)
    out = fn(rows, bound)
    assert_trees_equal(out, per_device(while_of_scans(jnp, jax.lax), rows, bound), rtol=1e-5)
    assert np.asarray(out[2])[0] < np.asarray(out[2])[1]
    # A while in a while: the inner count depends on the outer carry.
    def nested(lax):
        def f(x):
            def outer_body(c):
                v, k = c
                w = lax.while_loop(lambda u: u < v + 3.0, lambda u: u + 1.0, v * 0.5)
                return w, k + 1
            return lax.while_loop(lambda c: c[1] < 4, outer_body, (x, np.int32(0)))
        return f
    x = np.array([0.25, 7.0], np.float32)
    fn = pw.pmap(nested(pw.lax), devices=tpus2)
    assert len(while_ops(fn.as_text(x))) == 2
    assert_trees_equal(fn(x), per_device(nested(jax.lax), x))


# --- Collectives (uniform trip counts) --------------------------------------------------


def test_collectives_in_cond_and_body(tpus4, jax):
    """A psum in the body and a pmax in the cond: every device runs the same count."""
    def make(lax, psum, pmax):
        def f(x):
            def cond(c):
                v, k = c
                return pmax(v.sum(), "i") < 50.0

            def body(c):
                v, k = c
                return v + psum(v, "i") * 0.25, k + 1

            return lax.while_loop(cond, body, (x, np.int32(0)))
        return f

    rng = np.random.default_rng(3)
    x = rng.uniform(0.1, 1.0, size=(4, 2)).astype(np.float32)
    ours = pw.pmap(make(pw.lax, pw.psum, pw.pmax), axis_name="i", devices=tpus4)(x)
    theirs = jax.vmap(make(jax.lax, jax.lax.psum, jax.lax.pmax), axis_name="i")(x)
    assert_trees_equal(ours, theirs, rtol=1e-6)
    counts = np.asarray(ours[1])
    assert counts.min() == counts.max() > 1


def test_a_collective_in_fori_loop_with_traced_bounds(tpus2, jax):
    def make(lax, psum):
        def f(x, n):
            return lax.fori_loop(0, n, lambda i, v: v * 0.5 + psum(v, "i") * 0.1, x)
        return f

    x = np.array([[1.0, 2.0], [3.0, -1.0]], np.float32)
    n = np.array([5, 5], np.int32)
    ours = pw.pmap(make(pw.lax, pw.psum), axis_name="i", devices=tpus2)(x, n)
    theirs = jax.vmap(make(jax.lax, jax.lax.psum), axis_name="i")(x, n)
    assert_trees_equal(ours, theirs, rtol=1e-6)


def test_across_host_processes_as_in_process():
    """A gang spanning two host processes runs a while loop with a psum in its body
    and per-device trip counts (the hosts agree on each iteration; the devices that
    are done take part with their final carries), and one whose cond takes a pmax,
    exactly as the gang in one process does."""
    code = textwrap.dedent("""
        import numpy as np
        t = pw.make_virtual_device_set().add_slice(tpu_devices=8).tpus  # spans 2 hosts
        def f(x):
            def body(c):
                v, k = c
                return v + pw.psum(v, "i") % 7, k + 1
            a = pw.lax.while_loop(lambda c: c[1] < pw.axis_index("i") + 1, body,
                                  (x, np.int32(0)))
            b = pw.lax.while_loop(lambda c: pw.pmax(c, "i") < 1000, lambda c: c * 2 + 1, x)
            return a, b
        out = pw.pmap(f, axis_name="i", devices=t)(np.arange(8, dtype=np.int32))
        print(repr(pw.tree_map(lambda o: np.asarray(o).tolist(), out)))
    """)
    in_process = run_python("import pathways as pw\n" + code)
    processes = run_python("import pathways as pw\npw.configure(hosts='local_processes')\n" + code)
    assert processes == in_process
    (values, counts), doubled = eval(in_process)
    assert counts == list(range(1, 9))
    assert max(doubled) >= 1000 > max((d - 1) // 2 for d in doubled)


# --- fori_loop with traced bounds -------------------------------------------------------


def test_fori_loop_with_traced_bounds_is_a_while_loop(tpus2, jax):
    def make(lax):
        def f(x, lo, hi):
            return lax.fori_loop(lo, hi, lambda i, v: v * 1.5 + i.astype(np.float32), x)
        return f

    x = np.array([[1.0], [2.0]], np.float32)
    lo = np.array([2, 0], np.int32)
    hi = np.array([7, -3], np.int32)  # the second runs no iteration
    fn = pw.pmap(make(pw.lax), devices=tpus2)
    assert len(while_ops(fn.as_text(x, lo, hi))) == 1
    assert_trees_equal(fn(x, lo, hi), per_device(jax.jit(make(jax.lax)), x, lo, hi), rtol=1e-6)
    # One traced bound and one static: i has the traced bound's dtype (JAX's too
    # when the static one has it; a Python int takes it here, where JAX refuses).
    def count_up(lax, lower):
        return lambda n: lax.fori_loop(lower, n, lambda i, v: v + i, np.uint32(0))
    n = np.array([4, 10], np.uint32)
    out = pw.pmap(count_up(pw.lax, np.uint32(1)), devices=tpus2)(n)
    assert_trees_equal(out, per_device(jax.jit(count_up(jax.lax, np.uint32(1))), n))
    assert list(np.asarray(out)) == [6, 45]
    assert_trees_equal(pw.pmap(count_up(pw.lax, 1), devices=tpus2)(n), out)


def test_traced_bounds_of_two_dtypes_are_refused_as_in_jax(tpus2, jax):
    def f(lax):
        return lambda a, b: lax.fori_loop(a, b, lambda i, v: v + 1, np.int32(0))
    a = np.array([0, 1], np.int32)
    b = np.array([3, 4], np.uint32)
    message = "lower and upper arguments to fori_loop must have equal types, got int32 and uint32"
    with pytest.raises(TypeError, match=message):
        jax.jit(f(jax.lax))(a[0], b[0])
    with pytest.raises(TypeError, match=message):
        pw.pmap(f(pw.lax), devices=tpus2).as_text(a, b)


# --- Outside pmap --------------------------------------------------------------------


def test_on_numpy_arrays_it_runs_on_one_device(jax):
    out = pw.lax.while_loop(lambda c: c[1] < 5, lambda c: (c[0] * 3.0, c[1] + 1),
                            (np.float32(2.0), np.int32(0)))
    assert isinstance(out[0], np.ndarray) and isinstance(out[1], np.ndarray)
    theirs = jax.lax.while_loop(lambda c: c[1] < 5, lambda c: (c[0] * 3.0, c[1] + 1),
                                (np.float32(2.0), np.int32(0)))
    assert_trees_equal(out, theirs)
    assert float(out[0]) == 486.0
    f = pw.jit(lambda x: pw.lax.while_loop(lambda c: c < 100.0, lambda c: c * c + 1.0, x))
    want = np.float32(1.5)
    while want < 100.0:
        want = want * want + np.float32(1.0)
    assert want == np.float32(134.69140625)
    np.testing.assert_array_equal(np.asarray(f(np.float32(1.5))), want)


def test_an_empty_carry_is_returned_as_it_is():
    assert pw.lax.while_loop(lambda c: True, lambda c: c, ()) == ()


# --- Gradients ---------------------------------------------------------------------------


def test_reverse_mode_differentiation_raises_as_in_jax(tpus2, runtime_ok):
    x = np.array([[1.0, 2.0], [0.5, 0.25]], np.float32)
    message = ("Reverse-mode differentiation does not work for lax.while_loop or "
               "lax.fori_loop with dynamic start/stop values.*Try using lax.scan")

    def loss(x):
        return pw.lax.while_loop(lambda c: c.sum() < 10.0, lambda c: c * 2.0, x).sum()

    with pytest.raises(ValueError, match=message):
        pw.pmap(pw.grad(loss), devices=tpus2)(x)
    runtime_ok()
    # pw.jvp transposes the pullback (JAX's forward mode goes through the loop).
    with pytest.raises(ValueError, match=message):
        pw.pmap(lambda x: pw.jvp(loss, (x,), (x,)), devices=tpus2)(x)
    runtime_ok()

    def fori_loss(x, n):
        return pw.lax.fori_loop(0, n, lambda i, v: v * v, x).sum()

    with pytest.raises(ValueError, match=message):
        pw.pmap(pw.grad(fori_loss), devices=tpus2)(x, np.array([2, 3], np.int32))
    runtime_ok()

    # Through a scan whose body has a while loop.
    def scan_loss(x):
        def step(c, _):
            return pw.lax.while_loop(lambda v: v.sum() < 5.0, lambda v: v * 1.5, c), None
        return pw.lax.scan(step, x, None, length=2)[0].sum()

    with pytest.raises(ValueError, match=message):
        pw.pmap(pw.grad(scan_loss), devices=tpus2)(x)
    runtime_ok()


def test_a_gradient_that_does_not_flow_through_the_loop_works(tpus2):
    """The trip count may depend on a differentiated value; only the carries' values
    would need the loop's gradient."""
    def loss(x):
        _, k = pw.lax.while_loop(lambda c: c[0] < 10.0, lambda c: (c[0] * 2.0, c[1] + 1),
                                 (x.sum(), np.int32(0)))
        return (x * x).sum() * k.astype(np.float32)

    x = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    g = np.asarray(pw.pmap(pw.grad(loss), devices=tpus2)(x))
    # Steps: 3 -> 6 -> 12 (2 steps); 7 -> 14 (1 step).
    np.testing.assert_array_equal(g, [[2 * 1.0 * 2, 2 * 2.0 * 2], [2 * 3.0, 2 * 4.0]])


# --- Errors --------------------------------------------------------------------------------


def test_bad_loops_raise_clear_errors(tpus2, runtime_ok):
    x = np.zeros((2, 3), np.float32)
    cases = [
        (TypeError, "while_loop cond of '<lambda>' in pmap of '<lambda>' must return a "
                    "boolean scalar, but got i32\\[\\]",
         lambda x: pw.lax.while_loop(lambda c: c.sum().astype(np.int32), lambda c: c, x)),
        (TypeError, "must return a boolean scalar, but got pred\\[3\\]",
         lambda x: pw.lax.while_loop(lambda c: c > 0, lambda c: c, x)),
        (TypeError, "must return a boolean scalar, but got tuple",
         lambda x: pw.lax.while_loop(lambda c: (c.sum() > 0,), lambda c: c, x)),
        (TypeError, "carry leaf 0 is f32\\[3\\] on input but f64\\[3\\] on output",
         lambda x: pw.lax.while_loop(lambda c: c.sum() > 0, lambda c: c.astype(np.float64), x)),
        (TypeError, "carry leaf 0 is f32\\[3\\] on input but f32\\[\\] on output",
         lambda x: pw.lax.while_loop(lambda c: c.sum() > 0, lambda c: c.sum(), x)),
        (TypeError, "body_fun's output must have the structure of its input",
         lambda x: pw.lax.while_loop(lambda c: c[0].sum() > 0, lambda c: c[0], (x, x))),
        (TypeError, "cond_fun must be callable",
         lambda x: pw.lax.while_loop(3, lambda c: c, x)),
        (TypeError, "body_fun must be callable",
         lambda x: pw.lax.while_loop(lambda c: True, None, x)),
        (TypeError, "fori_loop: upper must be a scalar integer, got f32\\[\\]",
         lambda x: pw.lax.fori_loop(0, x.sum(), lambda i, v: v, x)),
        # An op of the body: the builder's error, naming the op.
        (ValueError, "add: incompatible shapes f32\\[3\\] and f32\\[2\\]",
         lambda x: pw.lax.while_loop(lambda c: c.sum() > 0, lambda c: c + c[:2], x)),
    ]
    for exc, pattern, fn in cases:
        with pytest.raises(exc, match=pattern):
            pw.pmap(fn, devices=tpus2).as_text(x)
        runtime_ok()
