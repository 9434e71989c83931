"""pw.pmap and pw.psum: numerics, pytrees, constants, caching and tracing."""

import math

import numpy as np
import pytest

import pathways as pw


def asarray_tree(tree):
    return pw.tree_map(np.asarray, tree)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_elementwise_ops(devices_of, dtype):
    f = pw.pmap(lambda x, y: (x + y, x - y, x * y, x / y, -x, +y), devices=devices_of(2))
    x = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype)
    y = np.array([[2.0, 4.0, 8.0], [0.5, 0.25, 1.0]], dtype)
    outs = f(x, y)
    assert isinstance(outs, tuple) and len(outs) == 6
    expected = (x + y, x - y, x * y, x / y, -x, y)
    for got, want in zip(outs, expected):
        assert isinstance(got, pw.ShardedBuffer)
        assert got.dtype == dtype
        assert got.shape == (2, 3)
        np.testing.assert_array_equal(np.asarray(got), want)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_python_scalars_are_weakly_typed(devices_of, dtype):
    f = pw.pmap(
        lambda x: (2 * x, x * 2.5, 1 - x, x - 1, 3 / x, x / 4, x + True), devices=devices_of(2)
    )
    x = np.array([1.0, 2.0], dtype)
    outs = f(x)
    expected = (2 * x, x * 2.5, 1 - x, x - 1, 3 / x, x / 4, x + 1)
    for got, want in zip(outs, expected):
        assert got.dtype == dtype  # the constant took the traced value's dtype
        np.testing.assert_allclose(np.asarray(got), want.astype(dtype), rtol=1e-6)


def test_numpy_constants(devices_of):
    row = np.array([10.0, 20.0, 30.0])
    ints = np.array([1, 2, 3])

    def fn(x):
        return row * x, x + ints, x * np.float64(0.5), np.float32(2.0) - x

    f = pw.pmap(fn, devices=devices_of(2))
    x = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    a, b, c, d = f(x)
    np.testing.assert_array_equal(np.asarray(a), row * x)
    np.testing.assert_array_equal(np.asarray(b), x + ints)
    np.testing.assert_array_equal(np.asarray(c), x * 0.5)
    np.testing.assert_array_equal(np.asarray(d), 2.0 - x)


def test_integer_numpy_constant_takes_tracer_dtype(devices_of):
    f = pw.pmap(lambda x: x + np.array([1, 2]), devices=devices_of(2))
    out = f(np.zeros((2, 2), np.float32))
    assert out.dtype == np.float32
    np.testing.assert_array_equal(np.asarray(out), [[1.0, 2.0], [1.0, 2.0]])


def test_mixed_dtypes_promote_to_float64(devices_of):
    f = pw.pmap(lambda x, y: x * y, devices=devices_of(2))
    out = f(np.array([1.5, 2.0], np.float32), np.array([2.0, 3.0], np.float64))
    assert out.dtype == np.float64
    np.testing.assert_array_equal(np.asarray(out), [3.0, 6.0])
    g = pw.pmap(lambda x: x * np.array(2.0, np.float64), devices=devices_of(2))
    assert g(np.array([1.0, 2.0], np.float32)).dtype == np.float64  # a 0-d array keeps its dtype


def test_rank0_operand_broadcasts(devices_of):
    # Each shard of a (2,) argument is a scalar; it broadcasts against a row.
    f = pw.pmap(lambda s, v: s * v + s, devices=devices_of(2))
    out = f(np.array([2.0, 3.0]), np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]))
    np.testing.assert_array_equal(np.asarray(out), [[4.0, 6.0, 8.0], [15.0, 18.0, 21.0]])


def test_pytrees_in_and_out(devices_of):
    def fn(pair, params):
        x, y = pair
        return {"sum": x + y, "scaled": [params["w"] * x, params["b"] + y], "none": None}

    f = pw.pmap(fn, devices=devices_of(2))
    x = np.array([1.0, 2.0])
    y = np.array([10.0, 20.0])
    params = {"w": np.array([2.0, 3.0]), "b": np.array([0.5, 0.5])}
    out = f((x, y), params)
    assert isinstance(out, dict) and sorted(out) == ["none", "scaled", "sum"]
    assert out["none"] is None
    assert isinstance(out["scaled"], list) and len(out["scaled"]) == 2
    np.testing.assert_array_equal(np.asarray(out["sum"]), x + y)
    np.testing.assert_array_equal(np.asarray(out["scaled"][0]), params["w"] * x)
    np.testing.assert_array_equal(np.asarray(out["scaled"][1]), params["b"] + y)


def test_dict_argument_order_does_not_matter(devices_of):
    traces = []

    def fn(d):
        traces.append(1)
        return d["a"] - d["b"]

    f = pw.pmap(fn, devices=devices_of(2))
    a = np.array([5.0, 6.0])
    b = np.array([1.0, 1.0])
    np.testing.assert_array_equal(np.asarray(f({"a": a, "b": b})), [4.0, 5.0])
    np.testing.assert_array_equal(np.asarray(f({"b": b, "a": a})), [4.0, 5.0])
    assert len(traces) == 1


def test_single_output_is_not_wrapped(devices_of):
    f = pw.pmap(lambda x: x + 1.0, devices=devices_of(2))
    out = f(np.array([1.0, 2.0]))
    assert isinstance(out, pw.ShardedBuffer)
    assert repr(out) == repr(np.array([2.0, 3.0]))


def test_identity_and_constant_outputs(devices_of):
    f = pw.pmap(lambda x: (x, 3.0, np.array([1.0, 2.0], np.float32)), devices=devices_of(2))
    same, three, vec = f(np.array([[7.0], [8.0]]))
    np.testing.assert_array_equal(np.asarray(same), [[7.0], [8.0]])
    # Constant outputs are per shard, stacked over the devices.
    assert three.shape == (2,)
    np.testing.assert_array_equal(np.asarray(three), [3.0, 3.0])
    assert vec.dtype == np.float32 and vec.shape == (2, 2)
    np.testing.assert_array_equal(np.asarray(vec), [[1.0, 2.0], [1.0, 2.0]])


def test_outputs_feed_back_as_inputs(devices_of):
    f = pw.pmap(lambda x: x * 2.0, devices=devices_of(4))
    x = np.arange(4.0)
    for _ in range(5):
        x = f(x)
    np.testing.assert_array_equal(np.asarray(x), np.arange(4.0) * 32)


def test_sharded_buffer_on_other_slice_is_moved(devices_of):
    f = pw.pmap(lambda x: x + 1.0, devices=devices_of(2))
    g = pw.pmap(lambda x: x * 10.0, devices=devices_of(2))
    x = pw.device_put(np.array([1.0, 2.0]), devices_of(2))
    np.testing.assert_array_equal(np.asarray(g(f(x))), [20.0, 30.0])


def test_cache_one_trace_per_signature(devices_of):
    traces = []

    def fn(x):
        traces.append(x.aval)
        return x * 3.0

    f = pw.pmap(fn, devices=devices_of(2))
    for i in range(5):
        np.testing.assert_array_equal(np.asarray(f(np.array([i, 1.0]))), [3.0 * i, 3.0])
    assert traces == ["f64[]"]
    f(np.zeros((2, 3), np.float32))
    f(np.zeros((2, 3), np.float32))
    f(pw.device_put(np.zeros((2, 3), np.float32), devices_of(2)))
    assert traces == ["f64[]", "f32[3]"]
    assert f.compiled(np.zeros((2, 3), np.float32)) is f.compiled(np.ones((2, 3), np.float32))


def test_tracer_attributes(devices_of):
    seen = {}

    def fn(x, y):
        seen.update(shape=x.shape, dtype=x.dtype, ndim=x.ndim, size=x.size, aval=x.aval, len=len(x))
        seen["y"] = (y.shape, y.aval, y.ndim, y.size)
        seen["repr"] = repr(x)
        return x

    f = pw.pmap(fn, devices=devices_of(2))
    f(np.zeros((2, 3, 4), np.float32), np.zeros(2))
    assert seen["shape"] == (3, 4)
    assert seen["dtype"] == np.dtype(np.float32)
    assert seen["ndim"] == 2 and seen["size"] == 12 and seen["len"] == 3
    assert seen["aval"] == "f32[3,4]"
    assert seen["y"] == ((), "f64[]", 0, 1)
    assert "f32[3,4]" in seen["repr"]


def test_numpy_array_on_the_left_dispatches_to_tracer(devices_of):
    w = np.array([1.0, 2.0, 3.0])
    f = pw.pmap(lambda x: (w * x, w + x, w - x, w / x), devices=devices_of(2))
    x = np.array([[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]])
    outs = asarray_tree(f(x))
    np.testing.assert_array_equal(outs[0], w * x)
    np.testing.assert_array_equal(outs[1], w + x)
    np.testing.assert_array_equal(outs[2], w - x)
    np.testing.assert_array_equal(outs[3], w / x)


def test_as_text_and_compiled(devices_of):
    tpus = devices_of(2)
    f = pw.pmap(lambda x: x * 2.0 + 1.0, devices=tpus, axis_name="i")
    text = f.as_text(np.zeros((2, 3)))
    assert isinstance(text, str) and text
    assert "mul" in text and "add" in text, text
    cf = f.compiled(np.zeros((2, 3)))
    assert cf.num_shards == 2
    assert list(cf.virtual_devices) == list(tpus)
    assert [d.id for d in cf.devices] == [v.physical.id for v in tpus]
    assert cf.param_types() == [((2, 3), "float64")]
    assert cf.output_types() == [((2, 3), "float64")]


def test_wraps_function(devices_of):
    def scale(x):
        """Scales x."""
        return x * 2.0

    f = pw.pmap(scale, devices=devices_of(2), axis_name="i")
    assert isinstance(f, pw.PmapFunction)
    assert f.__name__ == "scale" and f.__doc__ == "Scales x."
    assert f.__wrapped__ is scale
    assert f.axis_name == "i"
    assert len(f.devices) == 2


def test_pmap_on_slice_wrapper(devices_of):
    vslice = pw.make_virtual_device_set().add_slice(tpu_devices=2)
    f = pw.pmap(lambda x: x + 1.0, devices=vslice)
    np.testing.assert_array_equal(np.asarray(f(np.array([1.0, 2.0]))), [2.0, 3.0])


def test_devices_none_allocates_per_size():
    f = pw.pmap(lambda x: x * x)
    np.testing.assert_array_equal(np.asarray(f(np.array([1.0, 2.0, 3.0]))), [1.0, 4.0, 9.0])
    np.testing.assert_array_equal(np.asarray(f(np.array([[2.0], [3.0]]))), [[4.0], [9.0]])
    cf3 = f.compiled(np.zeros(3))
    assert cf3.num_shards == 3
    assert f.compiled(np.zeros((3, 2))).virtual_devices == cf3.virtual_devices  # cached slice
    assert f.compiled(np.zeros(2)).num_shards == 2


# --- psum -----------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 4, 8])
def test_psum(devices_of, n):
    f = pw.pmap(lambda x: pw.psum(x, "i"), devices=devices_of(n), axis_name="i")
    x = np.arange(float(n * 3)).reshape(n, 3)
    out = np.asarray(f(x))
    np.testing.assert_array_equal(out, np.broadcast_to(x.sum(axis=0), (n, 3)))


@pytest.mark.parametrize("n", [2, 4, 8])
def test_psum_normalize(devices_of, n):
    f = pw.pmap(lambda x: x / pw.psum(x, "batch"), devices=devices_of(n), axis_name="batch")
    x = np.arange(1.0, n + 1.0, dtype=np.float32)
    out = np.asarray(f(x))
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, x / x.sum(), rtol=1e-6)
    np.testing.assert_allclose(out.sum(), 1.0, rtol=1e-6)


def test_psum_pytree_and_constants(devices_of):
    def fn(x, y):
        s = pw.psum({"x": x, "y": y, "c": 1.0}, "i")
        return s["x"] + s["y"], s["c"]

    f = pw.pmap(fn, devices=devices_of(4), axis_name="i")
    x = np.arange(4.0)
    y = np.ones(4)
    total, count = f(x, y)
    np.testing.assert_array_equal(np.asarray(total), np.full(4, x.sum() + 4.0))
    np.testing.assert_array_equal(np.asarray(count), np.full(4, 4.0))


def test_psum_twice(devices_of):
    f = pw.pmap(lambda x: pw.psum(pw.psum(x, "i") * x, "i"), devices=devices_of(4), axis_name="i")
    x = np.array([1.0, 2.0, 3.0, 4.0])
    np.testing.assert_array_equal(np.asarray(f(x)), np.full(4, 10.0 * x.sum()))


def test_large_psum_numerics(devices_of):
    f = pw.pmap(lambda x: pw.psum(x * x, "i") - x, devices=devices_of(8), axis_name="i")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 1000))
    np.testing.assert_allclose(np.asarray(f(x)), (x * x).sum(axis=0) - x, rtol=1e-12)
    assert math.isfinite(float(np.asarray(f(x)).sum()))
