"""The public surface of `import pathways as pw`."""

import inspect

import numpy as np
import pytest

import pathways as pw
from pathways import _core


def test_version_and_all():
    assert pw.__version__ == "0.1.0"
    for name in pw.__all__:
        assert hasattr(pw, name), name
    for name in [
        "configure",
        "devices",
        "topology",
        "make_virtual_device_set",
        "pmap",
        "psum",
        "program",
        "device_put",
        "block_until_ready",
        "memory_stats",
        "transfer_stats",
        "scheduler_stats",
        "ShardedBuffer",
        "Device",
        "VirtualDevice",
        "PathwaysError",
        "NotFoundError",
        "ResourceExhaustedError",
        "DeletedBufferError",
        "TracerError",
    ]:
        assert name in pw.__all__, name


def test_reexports_are_the_core_types():
    assert pw.ShardedBuffer is _core.ShardedBuffer
    assert pw.Device is _core.Device
    assert pw.VirtualDevice is _core.VirtualDevice
    assert pw.PathwaysError is _core.PathwaysError
    assert pw.NotFoundError is _core.NotFoundError
    assert pw.ResourceExhaustedError is _core.ResourceExhaustedError
    assert pw.DeletedBufferError is _core.DeletedBufferError
    assert issubclass(pw.TracerError, TypeError)
    assert issubclass(pw.NotFoundError, ValueError)
    assert issubclass(pw.ResourceExhaustedError, pw.PathwaysError)


@pytest.mark.parametrize(
    "obj",
    [
        pw.configure,
        pw.make_virtual_device_set,
        pw.VirtualDeviceSet.add_slice,
        pw.pmap,
        pw.psum,
        pw.program,
        pw.device_put,
        pw.block_until_ready,
        pw.PmapFunction.__call__,
        pw.PmapFunction.as_text,
        pw.PmapFunction.compiled,
        pw.Program.__call__,
        pw.Program.trace,
        pw.Program.lower,
        pw.tree_flatten,
        pw.tree_unflatten,
    ],
)
def test_google_style_docstrings(obj):
    doc = inspect.getdoc(obj)
    assert doc, obj
    params = [p for p in inspect.signature(obj).parameters if p not in ("self",)]
    if params:
        assert "Args:" in doc, obj
    assert "Returns:" in doc or obj in (pw.configure,), obj


@pytest.mark.parametrize(
    "cls",
    [
        pw.VirtualSlice,
        pw.VirtualDeviceSet,
        pw.PmapFunction,
        pw.Program,
        pw.Tracer,
        pw.ProgramTracer,
        pw.TracerError,
        pw.PyTreeDef,
    ],
)
def test_classes_documented(cls):
    assert inspect.getdoc(cls)


def test_array_like_leaves(devices_of):
    class ArrayLike:
        def __array__(self, dtype=None, copy=None):
            return np.array([1, 2])  # integers from an array-like become float64

    f = pw.pmap(lambda x: x * 0.5, devices=devices_of(2))
    out = f(ArrayLike())
    assert out.dtype == np.float64
    np.testing.assert_array_equal(np.asarray(out), [0.5, 1.0])


def test_lists_are_pytrees_not_arrays(devices_of):
    # As in JAX: a list argument is a pytree node; its numbers are scalar leaves.
    f = pw.pmap(lambda x: x, devices=devices_of(2))
    with pytest.raises(ValueError, match="got a scalar for argument 0"):
        f([1.0, 2.0])
    out = f([np.array([1.0, 2.0]), np.array([3.0, 4.0])])
    assert isinstance(out, list) and len(out) == 2
    np.testing.assert_array_equal(np.asarray(out[1]), [3.0, 4.0])


def test_pmap_function_repr(devices_of):
    def scale(x):
        return x

    assert repr(pw.pmap(scale, devices=devices_of(2))) == "<pmap of 'scale' on 2 devices>"
    assert repr(pw.program(scale)) == "<pw.program 'scale'>"
