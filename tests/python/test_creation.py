"""Array creation in pathways.numpy (zeros ones full arange linspace eye tril triu) and buffer scalars."""

import re

import numpy as np
import pytest

import pathways as pw
import pathways.numpy as pnp


def run(fn, *args, n=2):
    """fn per device on a fresh 1-device-axis pmap over n devices; returns shard 0 as numpy."""
    args = args or (np.zeros(n),)
    return np.asarray(pw.pmap(fn)(*args))[0]


@pytest.mark.parametrize("make, expected", [
    (lambda x: pnp.zeros((2, 3)), np.zeros((2, 3))),
    (lambda x: pnp.zeros(4, np.float32), np.zeros(4, np.float32)),
    (lambda x: pnp.ones((3,), dtype=np.int32), np.ones(3, np.int32)),
    (lambda x: pnp.ones(()), np.ones(())),
    (lambda x: pnp.full((2, 2), 1.5), np.full((2, 2), 1.5)),
    (lambda x: pnp.full((2,), 7), np.full(2, 7, np.int32)),
    (lambda x: pnp.full((2,), True), np.full(2, True)),
    (lambda x: pnp.full((0, 3), 2.0), np.zeros((0, 3))),
    (lambda x: pnp.arange(5), np.arange(5, dtype=np.int32)),
    (lambda x: pnp.arange(1.0, 2.0, 0.25), np.arange(1.0, 2.0, 0.25)),
    (lambda x: pnp.arange(6, 0, -2, dtype=np.float32), np.arange(6, 0, -2, dtype=np.float32)),
    (lambda x: pnp.linspace(0.0, 1.0, 5), np.linspace(0.0, 1.0, 5)),
    (lambda x: pnp.linspace(0, 1, 4, endpoint=False, dtype=np.float32),
     np.linspace(0, 1, 4, endpoint=False, dtype=np.float32)),
    (lambda x: pnp.eye(3), np.eye(3)),
    (lambda x: pnp.eye(2, 4, k=1, dtype=np.int32), np.eye(2, 4, k=1, dtype=np.int32)),
], ids=lambda v: "" if callable(v) else str(getattr(v, "shape", "")))
def test_creation_in_a_trace_matches_numpy(make, expected):
    got = run(lambda x: make(x) + 0 if np.asarray(expected).dtype != np.bool_ else make(x))
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)


def test_zeros_and_full_are_one_broadcast_constant():
    f = pw.pmap(lambda x: x + pnp.zeros((64, 64)), devices=pw.make_virtual_device_set().add_slice(
        tpu_devices=1).tpus)
    text = f.as_text(np.zeros((1, 64, 64)))
    assert "const f64[] 0" in text and "broadcast_to" in text  # not 4096 zeros in the IR


@pytest.mark.parametrize("k", [-2, -1, 0, 1, 3])
@pytest.mark.parametrize("shape", [(3, 3), (2, 4), (4, 2), (2, 3, 5)])
def test_tril_and_triu_match_numpy(shape, k):
    x = np.random.default_rng(0).standard_normal((2,) + shape)
    np.testing.assert_array_equal(run(lambda v: pnp.tril(v, k), x), np.tril(x[0], k))
    np.testing.assert_array_equal(run(lambda v: pnp.triu(v, k), x), np.triu(x[0], k))
    np.testing.assert_array_equal(run(lambda v: np.tril(v, k), x), np.tril(x[0], k))  # numpy's own
    g = run(pw.grad(lambda v: (pnp.tril(v, k) * v).sum()), x)
    np.testing.assert_array_equal(g, 2 * np.tril(x[0], k))


def test_outside_a_trace_they_are_numpys():
    assert pnp.zeros(3).dtype == np.float64 and isinstance(pnp.zeros(3), np.ndarray)
    np.testing.assert_array_equal(pnp.arange(4), np.arange(4))
    np.testing.assert_array_equal(pnp.tril(np.ones((3, 3))), np.tril(np.ones((3, 3))))


def test_bad_arguments_name_the_parameter(runtime_ok):
    with pytest.raises(ValueError, match="negative dimensions"):
        run(lambda x: pnp.zeros((2, -1)))
    with pytest.raises(TypeError, match="shape must be an int or a sequence of ints"):
        run(lambda x: pnp.ones(2.5))
    with pytest.raises(TypeError, match="dtype complex128 is not supported"):
        run(lambda x: pnp.zeros(2, np.complex128))
    with pytest.raises(ValueError, match="fill_value must be a scalar"):
        run(lambda x: pnp.full(2, [1.0, 2.0]))
    with pytest.raises(ValueError, match=re.escape("tril: operand must have at least 2 dimensions")):
        run(lambda x: pnp.tril(x))
    runtime_ok()


def test_buffer_item_float_and_int(tpus2):
    b = pw.device_put(np.array([2.5, -1.0]), tpus2)
    assert b.item(1) == -1.0 and isinstance(b.item(0), float)
    one = pw.device_put(np.array([3], np.int32), tpus2[:1])
    assert one.item() == 3 and int(one) == 3 and float(one) == 3.0
    with pytest.raises(ValueError, match="size 1"):
        b.item()
    with pytest.raises(TypeError, match=re.escape("float() of a ShardedBuffer of shape (2,)")):
        float(b)
    assert bool(pw.device_put(np.array([True]), tpus2[:1])) is True


def test_full_like_and_empty_like():
    x = np.arange(6, dtype=np.float32).reshape(1, 2, 3)
    f = pw.pmap(lambda v: (pnp.full_like(v, 2.5), pnp.full_like(v, 7, dtype=np.int32),
                           pnp.full_like(v, v.max()), pnp.empty_like(v), pnp.full_like(v, True)))
    a, b, c, d, e = (np.asarray(o)[0] for o in f(x))
    np.testing.assert_array_equal(a, np.full_like(x[0], 2.5))
    assert a.dtype == np.float32 and b.dtype == np.int32 and e.dtype == np.float32
    np.testing.assert_array_equal(b, np.full((2, 3), 7))
    np.testing.assert_array_equal(c, np.full((2, 3), 5.0))  # a traced fill value, as JAX
    np.testing.assert_array_equal(d, np.zeros((2, 3)))
    np.testing.assert_array_equal(e, np.ones((2, 3)))
    # Outside a trace, numpy's.
    np.testing.assert_array_equal(pnp.full_like(x, 3), np.full_like(x, 3))
    with pytest.raises(ValueError, match="fill_value must be a scalar"):
        pw.pmap(lambda v: pnp.full_like(v, v))(x)
