"""The JAX-shaped API (issue 12): pmap's in_axes, out_axes and static arguments,
pw.jit, replicated buffers, and the numpy-scalar type rule."""

import gc

import numpy as np
import pytest

import pathways as pw
import pathways.numpy as pnp
from pathways import _core


# --- pmap: in_axes --------------------------------------------------------------


def test_in_axes_none_gives_every_device_the_whole_value(tpus2, runtime_ok):
    w = np.array([1.0, 2.0, 3.0])
    x = np.arange(6.0).reshape(2, 3)
    f = pw.pmap(lambda w, x, s: w * x * s, "i", in_axes=(None, 0, None), devices=tpus2)
    np.testing.assert_array_equal(np.asarray(f(w, x, 2.0)), w * x * 2.0)
    # A scalar and a 0-d array are whole values too; a list is a pytree, each leaf whole.
    g = pw.pmap(lambda a, b: a + b, in_axes=(0, None), devices=tpus2)
    np.testing.assert_array_equal(np.asarray(g(x, 5)), x + 5)
    np.testing.assert_array_equal(np.asarray(g(x, np.array(7.0))), x + 7)
    h = pw.pmap(lambda a, b: a * b[0] + b[1], in_axes=(0, None), devices=tpus2)
    np.testing.assert_array_equal(np.asarray(h(x, [2.0, np.ones(3)])), x * 2 + 1)
    runtime_ok()


def test_in_axes_other_than_zero_maps_that_axis(tpus2):
    x = np.arange(24.0).reshape(3, 2, 4)
    for axis in (1, -2):
        f = pw.pmap(lambda a: a.sum(axis=0), in_axes=axis, devices=tpus2)
        # Device i gets x[:, i, :]; its sum over the first remaining axis.
        np.testing.assert_array_equal(np.asarray(f(x)), np.moveaxis(x, 1, 0).sum(axis=1))
    # A ShardedBuffer (mapped over axis 0) given another axis is read as its value.
    buf = pw.device_put(np.arange(8.0).reshape(2, 4), tpus2)
    f = pw.pmap(lambda a: a * 10, in_axes=1, devices=devices_of_size(tpus2, 4))
    np.testing.assert_array_equal(np.asarray(f(buf)), np.arange(8.0).reshape(2, 4).T * 10)


def devices_of_size(like, n):
    return pw.make_virtual_device_set().add_slice(tpu_devices=n).tpus


def test_in_axes_as_a_pytree_prefix(tpus2):
    params = {"w": np.array([2.0, 3.0]), "b": np.array([10.0, 20.0])}
    batch = (np.array([[1.0, 1.0], [2.0, 2.0]]), np.array([100.0, 200.0]))
    f = pw.pmap(
        lambda p, xy: p["w"] * xy[0] + p["b"] + xy[1],
        in_axes=({"w": None, "b": 0}, (0, 0)),
        devices=tpus2,
    )
    want = np.stack([params["w"] * batch[0][i] + params["b"][i] + batch[1][i] for i in range(2)])
    np.testing.assert_array_equal(np.asarray(f(params, batch)), want)


def test_devices_none_takes_the_size_of_the_first_mapped_axis():
    f = pw.pmap(lambda w, x: w + x, in_axes=(None, 1))
    out = f(np.ones(3), np.arange(9.0).reshape(3, 3))
    assert len(out.devices) == 3
    np.testing.assert_array_equal(np.asarray(out), np.arange(9.0).reshape(3, 3).T + 1)


def test_in_axes_errors(tpus2, runtime_ok):
    x = np.ones((2, 3))
    with pytest.raises(ValueError, match=r"in_axes \(0, None\) has 2 entries for 3 positional"):
        pw.pmap(lambda a, b, c: a, in_axes=(0, None), devices=tpus2)(x, x, x)
    with pytest.raises(ValueError, match="in_axes for argument 0 3 is out of range for a value of rank 2"):
        pw.pmap(lambda a: a, in_axes=3, devices=tpus2)(x)
    with pytest.raises(ValueError, match="got a scalar for argument 1, mapped by in_axes=0"):
        pw.pmap(lambda a, b: a, in_axes=(None, 0), devices=tpus2)(x, 1.0)
    with pytest.raises(ValueError, match="not a prefix"):
        pw.pmap(lambda a: a, in_axes=({"w": 0},), devices=tpus2)((x,))
    with pytest.raises(ValueError, match="needs an argument mapped by in_axes"):
        pw.pmap(lambda a: a, in_axes=None)(x)
    for bad in ("0", 1.0, True, [0, None], {"a": 0}):
        with pytest.raises(TypeError, match="in_axes must be an int, None"):
            pw.pmap(lambda a: a, in_axes=bad, devices=tpus2)
    with pytest.raises(TypeError, match="out_axes must be an int, None"):
        pw.pmap(lambda a: a, out_axes=(0, "x"), devices=tpus2)
    with pytest.raises(TypeError, match="axis_name must be a str or None.*devices=... by keyword"):
        pw.pmap(lambda a: a, tpus2)
    runtime_ok()


# --- pmap: out_axes -------------------------------------------------------------


def test_out_axes_none_is_a_replicated_buffer(tpus2, runtime_ok):
    x = np.arange(6.0).reshape(2, 3)
    f = pw.pmap(lambda a: (a * 2, pw.psum(a, "i")), "i", out_axes=(0, None), devices=tpus2)
    mapped, total = f(x)
    assert not mapped.is_replicated and mapped.shape == (2, 3)
    assert total.is_replicated and total.shape == (3,) and total.size == 3 and total.ndim == 1
    assert total.nbytes == 3 * 8 and len(total) == 3
    np.testing.assert_array_equal(np.asarray(total), x.sum(axis=0))
    assert repr(total) == repr(x.sum(axis=0))
    assert [d.id for d in total.devices] == [d.physical.id for d in tpus2]
    # A 0-d replicated value converts to Python scalars as numpy does.
    s = pw.pmap(lambda a: pw.psum(a.sum(), "i"), "i", out_axes=None, devices=tpus2)(x)
    assert s.shape == () and float(s) == 15.0 and s.item() == 15.0
    with pytest.raises(TypeError, match="len.. of unsized object"):
        len(s)
    runtime_ok()


def test_replicated_buffers_pass_through_without_a_copy(tpus2):
    step = pw.pmap(lambda w, x: w - 0.5 * pw.pmean(x, "i"), "i", in_axes=(None, 0),
                   out_axes=None, devices=tpus2)
    w = np.zeros(3)
    x = np.arange(6.0).reshape(2, 3)
    for _ in range(4):
        w = step(w, x)
        assert w.is_replicated and w.shape == (3,)
    np.testing.assert_allclose(np.asarray(w), -4 * 0.5 * x.mean(axis=0))
    # Where an axis is mapped, a replicated buffer is its value: mapped over its own axis 0.
    w3 = pw.pmap(lambda v: v, in_axes=None, out_axes=None, devices=tpus2)(np.arange(2.0))
    out = pw.pmap(lambda v: v * 10, devices=tpus2)(w3)
    np.testing.assert_array_equal(np.asarray(out), [0.0, 10.0])
    # On other devices, a replicated buffer given with in_axes=None is copied through the host.
    other = devices_of_size(tpus2, 2)
    g = pw.pmap(lambda v: v + 1, in_axes=None, out_axes=None, devices=other)
    np.testing.assert_array_equal(np.asarray(g(w3)), [1.0, 2.0])


def test_replicated_buffers_are_freed_and_deleted_like_others(tpus2):
    gc.collect()
    _core.await_quiescence()
    before = pw.memory_stats()["live_buffers"]
    f = pw.pmap(lambda a: pw.psum(a, "i"), "i", out_axes=None, devices=tpus2)
    r = f(np.ones((2, 4)))
    r.block_until_ready()
    assert pw.memory_stats()["live_buffers"] == before + 1
    r.delete()
    assert r.is_deleted()
    with pytest.raises(pw.DeletedBufferError, match=r"ShardedBuffer f64\[4\] has been deleted"):
        np.asarray(r)
    gc.collect()
    _core.await_quiescence()
    assert pw.memory_stats()["live_buffers"] == before


def test_out_axes_other_axis_and_prefix(tpus2):
    x = np.arange(12.0).reshape(2, 2, 3)
    f = pw.pmap(lambda a: {"y": a * 2, "z": a}, out_axes={"y": 1, "z": -1}, devices=tpus2)
    out = f(x)
    assert isinstance(out["y"], np.ndarray)
    np.testing.assert_array_equal(out["y"], np.moveaxis(x * 2, 0, 1))
    np.testing.assert_array_equal(out["z"], np.moveaxis(x, 0, -1))
    with pytest.raises(ValueError, match="out_axes 5 is out of range"):
        pw.pmap(lambda a: a, out_axes=5, devices=tpus2)(x)


# --- pmap: static arguments ---------------------------------------------------------


def test_static_broadcasted_argnums(tpus2, runtime_ok):
    traces = []

    def f(x, power, flip):
        traces.append((power, flip))
        y = x ** power
        return -y if flip else y

    g = pw.pmap(f, static_broadcasted_argnums=(1, -1), devices=tpus2)
    x = np.array([2.0, 3.0])
    np.testing.assert_array_equal(np.asarray(g(x, 2, False)), x**2)
    np.testing.assert_array_equal(np.asarray(g(x, 3, True)), -(x**3))
    np.testing.assert_array_equal(np.asarray(g(x, 2, False)), x**2)
    assert traces == [(2, False), (3, True)]  # one trace per static value
    assert "pow" in g.as_text(x, 3, False) or "mul" in g.as_text(x, 3, False)
    with pytest.raises(TypeError, match="static argument 1 \\(list\\) is not hashable"):
        g(x, [2], False)
    with pytest.raises(ValueError, match="names argument 2, but it was called with 2"):
        pw.pmap(lambda a, b: a, static_broadcasted_argnums=2, devices=tpus2)(x, 1)
    with pytest.raises(TypeError, match="static_broadcasted_argnums"):
        pw.pmap(lambda a: a, static_broadcasted_argnums="1", devices=tpus2)
    # With in_axes as a tuple, the static argument's entry is ignored.
    h = pw.pmap(lambda a, n, b: a * n + b, in_axes=(0, None, None), static_broadcasted_argnums=1,
                devices=tpus2)
    np.testing.assert_array_equal(np.asarray(h(x, 4, 1.0)), x * 4 + 1)
    runtime_ok()


# --- inside programs and vjp ----------------------------------------------------------


def test_in_axes_inside_a_program(tpus2):
    scale = np.array([10.0, 100.0])
    f = pw.pmap(lambda a, s: a * s, in_axes=(0, None), devices=tpus2)

    @pw.program
    def prog(v):
        return f(f(v, scale), scale)

    v = np.ones((2, 2))
    np.testing.assert_array_equal(np.asarray(prog(v)), v * scale * scale)

    @pw.program
    def bad_in(v):
        return pw.pmap(lambda a: a, in_axes=None, devices=tpus2)(v)

    with pytest.raises(ValueError, match="a program value, inside @pw.program"):
        bad_in(v)

    @pw.program
    def bad_out(v):
        return pw.pmap(lambda a: a, out_axes=None, devices=tpus2)(v)

    with pytest.raises(ValueError, match="out_axes None inside @pw.program"):
        bad_out(v)
    # A replicated buffer given to a program is its value.
    r = pw.pmap(lambda a: a, in_axes=None, out_axes=None, devices=tpus2)(np.array([1.0, 2.0]))
    # (device i gets its element, times the whole scale twice)
    np.testing.assert_array_equal(np.asarray(prog(r)), np.array([[1.0], [2.0]]) * scale * scale)


def test_vjp_refuses_a_non_default_mapping(tpus2):
    f = pw.pmap(lambda a, b: a * b, in_axes=(0, None), devices=tpus2)
    with pytest.raises(ValueError, match="in_axes, out_axes or static arguments"):
        pw.vjp(f, np.ones(2), 2.0)


# --- pw.jit ---------------------------------------------------------------------------


def test_jit_runs_on_one_device_without_a_device_axis(runtime_ok):
    f = pw.jit(lambda x, y: x @ y + 1.0)
    a, b = np.arange(6.0).reshape(2, 3), np.ones((3, 4))
    out = f(a, b)
    assert out.shape == (2, 4) and out.is_replicated and len(out.devices) == 1
    np.testing.assert_array_equal(np.asarray(out), a @ b + 1.0)
    # Scalars, pytrees and keyword arguments.
    g = pw.jit(lambda p, x, scale=1.0: {"y": p["w"] * x * scale, "n": x.sum()})
    out = g({"w": np.float32(2.0)}, np.ones(3, np.float32), scale=3.0)
    np.testing.assert_array_equal(np.asarray(out["y"]), np.full(3, 6.0))
    assert float(out["n"]) == 3.0
    runtime_ok()


def test_jit_training_loop_stays_on_the_device():
    @pw.jit
    def step(w, x, y):
        grad = pw.grad(lambda w: ((x @ w - y) ** 2).mean())(w)
        return w - 0.1 * grad

    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 3))
    w_true = np.array([1.0, -2.0, 0.5])
    y = x @ w_true
    w = np.zeros(3)
    for _ in range(200):
        w = step(w, x, y)
        assert w.is_replicated
    np.testing.assert_allclose(np.asarray(w), w_true, atol=1e-6)
    # Every jitted function given no device shares one: outputs pass between them.
    g = pw.jit(lambda w: w * 2)
    assert g(w).devices == w.devices


def test_jit_static_arguments_and_errors():
    traces = []

    def f(x, n, *, mode):
        traces.append((n, mode))
        return x * n if mode == "mul" else x + n

    g = pw.jit(f, static_argnums=1, static_argnames="mode")
    x = np.array([1.0, 2.0])
    np.testing.assert_array_equal(np.asarray(g(x, 3, mode="mul")), x * 3)
    np.testing.assert_array_equal(np.asarray(g(x, 3, mode="add")), x + 3)
    g(x, 3, mode="mul")
    assert traces == [(3, "mul"), (3, "add")]
    with pytest.raises(TypeError, match="static argument 'mode' \\(list\\) is not hashable"):
        g(x, 3, mode=["mul"])
    with pytest.raises(ValueError, match="names argument 1, but it was called with 1"):
        g(x, mode="mul")
    with pytest.raises(TypeError, match="jit expects a callable"):
        pw.jit(3)
    with pytest.raises(TypeError, match="device must be a VirtualDevice"):
        pw.jit(lambda x: x, device="tpu:0")
    dev = pw.make_virtual_device_set().add_slice(tpu_devices=1).tpus[0]
    h = pw.jit(device=dev)(lambda x: x - 1)
    assert h(x).devices == [dev.physical]


def test_jit_static_arguments_of_equal_value_and_other_types_trace_apart():
    # 2 == 2.0 == True and they hash alike, but the functions traced with
    # them differ: each type is a signature of its own (as in pmap).
    f = pw.jit(lambda a, s: a * len(str(s)), static_argnums=1)
    np.testing.assert_array_equal(np.asarray(f(np.ones(2), 2)), [1.0, 1.0])
    np.testing.assert_array_equal(np.asarray(f(np.ones(2), 2.0)), [3.0, 3.0])
    np.testing.assert_array_equal(np.asarray(f(np.ones(2), True)), [4.0, 4.0])
    g = pw.jit(lambda a, s: a + s, static_argnames="s")
    assert g(np.int32(1), s=2).dtype == np.int32
    out = g(np.int32(1), s=2.5)
    assert out.dtype == np.float64 and float(out) == 3.5
    # Inside a tuple too.
    h = pw.jit(lambda a, s: a + s[1], static_argnums=1)
    assert h(np.int32(1), (0, 2)).dtype == np.int32
    assert h(np.int32(1), (0, 2.0)).dtype == np.float64
    p = pw.pmap(lambda a, s: a * len(str(s)), static_broadcasted_argnums=1)
    np.testing.assert_array_equal(np.asarray(p(np.ones((1, 2)), 0)), [[1.0, 1.0]])
    np.testing.assert_array_equal(np.asarray(p(np.ones((1, 2)), False)), [[5.0, 5.0]])


def test_jit_static_arguments_by_position_or_name():
    # As jax.jit: static_argnames covers the argument passed by position, and
    # static_argnums the argument passed by name, through the signature.
    traces = []

    def f(x, mode, scale=1.0):
        traces.append(mode)
        return x * 2 * scale if mode == "double" else x * scale

    by_name = pw.jit(f, static_argnames="mode")
    np.testing.assert_array_equal(np.asarray(by_name(np.ones(2), "double")), [2.0, 2.0])
    np.testing.assert_array_equal(np.asarray(by_name(np.ones(2), mode="same")), [1.0, 1.0])
    by_num = pw.jit(f, static_argnums=1)
    np.testing.assert_array_equal(np.asarray(by_num(np.ones(2), mode="double")), [2.0, 2.0])
    np.testing.assert_array_equal(np.asarray(by_num(np.ones(2), "same", 3.0)), [3.0, 3.0])
    assert traces == ["double", "same", "double", "same"]
    # A traced scale is still traced: a new value does not trace again.
    by_num(np.ones(2), "same", 4.0)
    assert len(traces) == 4


def test_jit_inside_traces():
    inner = pw.jit(lambda x: x * 3)
    # Inside a pmap'd function, as in JAX, a jitted function is inlined.
    out = pw.pmap(lambda x: inner(x) + 1)(np.ones((2, 2)))
    np.testing.assert_array_equal(np.asarray(out), np.full((2, 2), 4.0))

    @pw.program
    def prog(v):
        return inner(v)

    with pytest.raises(pw.TracerError, match="jit of '<lambda>' was called in @pw.program"):
        prog(np.ones((1, 2)))


# --- numpy scalars are weakly typed --------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
def test_numpy_scalars_take_the_traced_values_dtype(dtype):
    def f(x):
        d = x.shape[-1]  # a Python int; np.sqrt of it is an np.float64
        return [
            x * np.float64(2), x / np.sqrt(d), x + np.int64(3), pnp.maximum(x, np.float64(0.5)),
            pnp.where(x > 0, x, np.float64(0)), x * np.float32(2), x * np.bool_(True),
        ]

    x = np.arange(1, 9, dtype=dtype).reshape(2, 4)
    outs = pw.pmap(f)(x)
    want_float = np.dtype(dtype) if np.dtype(dtype).kind == "f" else None
    for got, want in zip(outs, [x * 2, x / 2, x + 3, np.maximum(x, 0.5), x, x * 2, x]):
        if want_float is not None:
            assert got.dtype == want_float
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)
    if want_float is None:  # an int32 value with a float scalar: as with a Python float
        assert outs[0].dtype == np.float64 and outs[2].dtype == np.int32


def test_numpy_arrays_keep_their_dtype():
    out = pw.pmap(lambda x: (x * np.array(2.0), x * np.array([2.0, 2.0])))(np.ones((2, 2), np.float32))
    assert [o.dtype for o in out] == [np.float64, np.float64]


def test_python_scalar_arguments_are_weakly_typed():
    @pw.jit
    def step(w, lr):
        g = pw.grad(lambda w: (w * w).sum())(w)
        return w - (lr * 0.5) * g, lr * 2, pnp.maximum(w, lr), lr.astype(np.float64) + w

    w = np.ones(3, np.float32)
    new_w, doubled, biggest, cast = step(w, 0.1)
    assert new_w.dtype == np.float32 and biggest.dtype == np.float32
    np.testing.assert_allclose(np.asarray(new_w), np.full(3, 0.9), rtol=1e-6)
    # On its own a weak value keeps its argument's dtype; a cast makes it strong.
    assert doubled.dtype == np.float64 and float(doubled) == 0.2
    assert cast.dtype == np.float64
    # An int argument with a float32 value, and a numpy scalar argument (strong, as JAX).
    assert step(w, 1)[0].dtype == np.float32
    assert step(w, np.float64(0.1))[0].dtype == np.float64
    # The same as with pmap's in_axes=None.
    f = pw.pmap(lambda x, s: x * s, in_axes=(0, None))
    assert f(np.ones((2, 2), np.float32), 3.0).dtype == np.float32
    # The parameter keeps the argument's dtype; the cast is in the IR.
    text = step.as_text(w, 0.1)
    assert "%1: f64[]" in text and "convert %" in text


# --- einsum's contraction order (opt_einsum) ------------------------------------------


def test_einsum_contracts_in_the_cheapest_order():
    rng = np.random.default_rng(0)
    a, b, c = rng.normal(size=(1, 64, 2)), rng.normal(size=(1, 2, 64)), rng.normal(size=(1, 64, 3))
    f = pw.pmap(lambda a, b, c: pnp.einsum("ij,jk,kl->il", a, b, c))
    np.testing.assert_allclose(np.asarray(f(a, b, c))[0], a[0] @ b[0] @ c[0], rtol=1e-12)
    # Left to right would make a 64x64 intermediate; b @ c first makes a 2x3 one.
    text = f.as_text(a, b, c)
    assert "64,64]" not in text and "f64[1,2,3]" in text
    for spec, shapes in [
        ("ij,jk,kl,lm->im", [(2, 3), (3, 4), (4, 5), (5, 6)]),
        ("abc,cd,db->a", [(2, 3, 4), (4, 5), (5, 3)]),
        ("i,j,k->kji", [(2,), (3,), (4,)]),
        ("ii,i,ij->j", [(3, 3), (3,), (3, 2)]),
    ]:
        xs = [rng.normal(size=(1,) + s) for s in shapes]
        got = pw.pmap(lambda *x: pnp.einsum(spec, *x))(*xs)
        np.testing.assert_allclose(np.asarray(got)[0], np.einsum(spec, *[x[0] for x in xs]),
                                   rtol=1e-12)


def test_zero_dimensional_program_arguments_keep_their_shape():
    f = pw.pmap(lambda x: x * 3.0)

    @pw.program
    def p(s, v):  # s, a dynamic 0-d argument, is passed to the program though unused
        return f(v)

    for s in (np.float64(3), np.array(4.0), pw.jit(lambda: pnp.zeros(()) + 5.0)()):
        np.testing.assert_array_equal(np.asarray(p(s, np.ones((1, 2)))), np.full((1, 2), 3.0))


def test_keyword_arguments_are_mapped_over_axis_0(tpus2):
    # As jax.pmap: keyword arguments are mapped over their leading axis, whatever
    # in_axes says of the positional ones (they once were a TypeError).
    x, y, s = np.arange(6.0).reshape(2, 3), np.ones((2, 3)), np.array([2.0, 3.0])
    f = pw.pmap(lambda a, b, *, scale=1.0: a * scale + b, devices=tpus2)
    np.testing.assert_array_equal(np.asarray(f(x, b=y)), x + y)
    np.testing.assert_array_equal(np.asarray(f(x, y, scale=s)), x * s[:, None] + y)
    g = pw.pmap(lambda a, w, *, scale: a * scale + w.sum(), in_axes=(0, None), devices=tpus2)
    np.testing.assert_array_equal(np.asarray(g(x, np.ones(4), scale=s)), x * s[:, None] + 4)
    h = pw.pmap(lambda a, k, *, z: a + k + z, static_broadcasted_argnums=1, devices=tpus2)
    np.testing.assert_array_equal(np.asarray(h(x, 5, z=y)), x + 6)
    n = pw.pmap(lambda a, z=0.0: a - z)  # devices=None: the slice of the plain calls
    np.testing.assert_array_equal(np.asarray(n(x, z=y)), x - 1)
    assert n(x, z=y).devices == n(x).devices

    @pw.program
    def prog(a, b):
        return f(a, b=b)

    np.testing.assert_array_equal(np.asarray(prog(x, y)), x + y)
    with pytest.raises(ValueError, match=r"in_axes \(0, None\) has 2 entries but the call has 3 "
                                         r"positional arguments"):
        g(x, np.ones(4), 3, scale=s)
    with pytest.raises(TypeError, match="unexpected keyword argument 'c'"):
        f(x, y, c=y)
