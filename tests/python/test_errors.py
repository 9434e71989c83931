"""Every error case: exception type, message, and a runtime that still works afterwards."""

import re

import numpy as np
import pytest

import pathways as pw
from pathways import _core


@pytest.fixture
def tpus2(devices_of):
    return devices_of(2)


# --- pmap argument validation ---------------------------------------------


def test_wrong_leading_axis(tpus2, runtime_ok):
    def f(x):
        return x * 2.0

    pf = pw.pmap(f, devices=tpus2)
    with pytest.raises(
        ValueError,
        match=re.escape("pmap of 'f' over 2 devices got leading axis of size 3 for argument 0"),
    ):
        pf(np.zeros(3))
    with pytest.raises(
        ValueError,
        match=re.escape("pmap of 'f' over 2 devices got leading axis of size 4 for argument 1"),
    ):
        pw.pmap(_named("f", lambda x, y: x + y), devices=tpus2)(np.zeros(2), np.zeros((4, 2)))
    # Argument numbers count the leaves of the flattened arguments.
    with pytest.raises(
        ValueError,
        match=re.escape("pmap of 'f' over 2 devices got leading axis of size 5 for argument 2"),
    ):
        pw.pmap(_named("f", lambda t, d: t[0]), devices=tpus2)(
            (np.zeros(2), np.zeros(2)), {"k": np.zeros(5)}
        )
    runtime_ok()
    # The same function still works with the right shape.
    np.testing.assert_array_equal(np.asarray(pf(np.array([1.0, 2.0]))), [2.0, 4.0])


def _named(name, fn):
    fn.__name__ = name
    return fn


def test_wrong_leading_axis_on_cached_function(tpus2, runtime_ok):
    def f(x):
        return x + 1.0

    pf = pw.pmap(f, devices=tpus2)
    pf(np.zeros(2))
    with pytest.raises(
        ValueError,
        match=re.escape("pmap of 'f' over 2 devices got leading axis of size 1 for argument 0"),
    ):
        pf(np.zeros(1))
    buf = pw.device_put(np.zeros(4), pw.make_virtual_device_set().add_slice(tpu_devices=4).tpus)
    with pytest.raises(ValueError, match=re.escape("got leading axis of size 4 for argument 0")):
        pf(buf)
    runtime_ok()


def test_scalar_argument(tpus2, runtime_ok):
    def f(x):
        return x

    pf = pw.pmap(f, devices=tpus2)
    with pytest.raises(
        ValueError, match=re.escape("pmap of 'f' over 2 devices got a scalar for argument 0")
    ):
        pf(1.0)
    with pytest.raises(
        ValueError, match=re.escape("pmap of 'f' over 2 devices got a scalar for argument 0")
    ):
        pf(np.float64(1.0))
    with pytest.raises(
        ValueError, match=re.escape("pmap of 'f' over 2 devices got a scalar for argument 1")
    ):
        pw.pmap(_named("f", lambda x, y: x), devices=tpus2)(np.zeros(2), np.array(3.0))
    runtime_ok()


def test_scalar_argument_without_devices(runtime_ok):
    def f(x):
        return x

    with pytest.raises(
        ValueError, match=re.escape("pmap of 'f' (devices=None) got a scalar for argument 0")
    ):
        pw.pmap(f)(2.0)
    with pytest.raises(ValueError, match="needs at least one argument"):
        pw.pmap(lambda: 1.0)()
    runtime_ok()


@pytest.mark.parametrize("dtype", [np.int64, np.uint8, np.uint16])
def test_other_integer_arguments_become_int32(tpus2, runtime_ok, dtype):
    out = pw.pmap(lambda x: x * 2, devices=tpus2)(np.array([3, 200], dtype))
    assert np.asarray(out).dtype == np.int32
    np.testing.assert_array_equal(np.asarray(out), [6, 400])
    with pytest.raises(
        ValueError,
        match=re.escape(f"an argument of dtype {np.dtype(np.int64).name} has values outside the int32 range"),
    ):
        pw.pmap(lambda x: x, devices=tpus2)(np.array([1, 2**40], np.int64))
    runtime_ok()


@pytest.mark.parametrize("dtype", [np.float16, np.complex128])
def test_unsupported_dtype(tpus2, runtime_ok, dtype):
    def f(x):
        return x

    with pytest.raises(
        TypeError,
        match=re.escape(
            f"pmap of 'f': argument 0 has dtype {np.dtype(dtype).name}; supported dtypes: float32, float64, int32, bool, uint32"
        ),
    ):
        pw.pmap(f, devices=tpus2)(np.zeros(2, dtype))
    runtime_ok()


def test_wrong_arity_is_pythons_own_error(tpus2, runtime_ok):
    def f(x, y):
        return x + y

    pf = pw.pmap(f, devices=tpus2)
    with pytest.raises(
        TypeError, match=re.escape("f() missing 1 required positional argument: 'y'")
    ) as info:
        pf(np.zeros(2))
    assert type(info.value) is TypeError
    with pytest.raises(
        TypeError, match=re.escape("f() takes 2 positional arguments but 3 were given")
    ):
        pf(np.zeros(2), np.zeros(2), np.zeros(2))
    runtime_ok()
    np.testing.assert_array_equal(np.asarray(pf(np.ones(2), np.ones(2))), [2.0, 2.0])


def test_shape_mismatch_in_trace(tpus2, runtime_ok):
    def f(x, y):
        return x + y

    with pytest.raises(ValueError, match=re.escape("add: incompatible shapes f64[3] and f64[2]")):
        pw.pmap(f, devices=tpus2)(np.zeros((2, 3)), np.zeros((2, 2)))
    runtime_ok()


def test_exception_in_user_function_propagates(tpus2, runtime_ok):
    class Boom(Exception):
        pass

    def f(x):
        raise Boom("boom")

    with pytest.raises(Boom, match="boom"):
        pw.pmap(f, devices=tpus2)(np.zeros(2))
    runtime_ok()


def test_bad_output(tpus2, runtime_ok):
    def f(x):
        return x, "text"

    with pytest.raises(
        TypeError, match="output 1 is neither a traced value nor a numeric constant"
    ):
        pw.pmap(f, devices=tpus2)(np.zeros(2))
    runtime_ok()


def test_no_outputs(tpus2, runtime_ok):
    def f(x):
        return None

    with pytest.raises(
        ValueError,
        match=re.escape("pmap of 'f' returns no values (output structure PyTreeSpec(None))"),
    ):
        pw.pmap(f, devices=tpus2)(np.zeros(2))
    runtime_ok()


# --- devices ----------------------------------------------------------------


def test_non_virtual_devices(runtime_ok):
    devs = pw.devices()[:2]
    with pytest.raises(
        TypeError,
        match=re.escape(
            "pmap: devices must be virtual devices from `pw.make_virtual_device_set().add_slice(tpu_devices=n).tpus`"
        ),
    ):
        pw.pmap(lambda x: x, devices=devs)
    with pytest.raises(TypeError, match="pmap: devices must be virtual devices"):
        pw.pmap(lambda x: x, devices=["tpu:0"])
    with pytest.raises(ValueError, match="at least one device"):
        pw.pmap(lambda x: x, devices=[])
    with pytest.raises(TypeError, match="pmap expects a callable"):
        pw.pmap(3)
    runtime_ok()


def test_unknown_device_kind(runtime_ok):
    with pytest.raises(pw.NotFoundError, match="unknown device kind 'gpu'") as info:
        pw.make_virtual_device_set().add_slice(gpu_devices=2)
    assert isinstance(info.value, ValueError)
    runtime_ok()


def test_too_many_devices(runtime_ok):
    with pytest.raises(pw.ResourceExhaustedError, match=r"100.*island 0: 8, island 1: 8") as info:
        pw.make_virtual_device_set().add_slice(tpu_devices=100)
    assert isinstance(info.value, pw.PathwaysError)
    runtime_ok()


def test_zero_devices(runtime_ok):
    with pytest.raises(ValueError, match="at least one device"):
        pw.make_virtual_device_set().add_slice(tpu_devices=0)
    runtime_ok()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({}, "exactly one keyword of the form <kind>_devices=n (e.g. tpu_devices=2), got: none"),
        ({"tpu_devices": 2, "gpu_devices": 2}, "got: tpu_devices, gpu_devices"),
        ({"tpus": 2}, "unexpected keyword 'tpus'"),
        ({"tpu_devices": 2.0}, "tpu_devices must be an int, got 2.0"),
    ],
)
def test_add_slice_bad_keywords(runtime_ok, kwargs, message):
    with pytest.raises(TypeError, match=re.escape(message)):
        pw.make_virtual_device_set().add_slice(**kwargs)
    runtime_ok()


def test_devices_spanning_islands(runtime_ok):
    set_ = pw.make_virtual_device_set()
    slices = [set_.add_slice(tpu_devices=2) for _ in range(4)]
    by_island = {}
    for s in slices:
        by_island.setdefault(s.island, s)
    assert len(by_island) == 2, slices  # least-loaded placement uses both islands
    s0, s1 = by_island.values()

    def f(x):
        return x

    pf = pw.pmap(f, devices=[s0.tpus[0], s1.tpus[0]])
    with pytest.raises(ValueError, match=re.escape("pmap of 'f': its devices span islands")):
        pf(np.zeros(2))
    runtime_ok()


def test_duplicate_physical_devices(runtime_ok):
    tpus = pw.make_virtual_device_set().add_slice(tpu_devices=2).tpus

    def f(x):
        return x

    with pytest.raises(ValueError, match="must map to distinct physical devices"):
        pw.pmap(f, devices=[tpus[0], tpus[0]])(np.zeros(2))
    runtime_ok()


def test_device_put_errors(tpus2, runtime_ok):
    with pytest.raises(
        ValueError,
        match=re.escape("device_put over 2 devices needs a leading axis of size 2, got shape (3,)"),
    ):
        pw.device_put(np.zeros(3), tpus2)
    with pytest.raises(
        TypeError, match=re.escape("dtype float16; supported dtypes: float32, float64, int32, bool, uint32")
    ):
        pw.device_put(np.zeros(2, np.float16), tpus2)
    with pytest.raises(ValueError, match="outside the int32 range"):
        pw.device_put({"ok": np.zeros(2), "bad": np.array([0, 2**33])}, tpus2)
    # Something that is not a device of this runtime.
    with pytest.raises(TypeError, match=re.escape("device_put: devices must be a VirtualSlice or a sequence of devices")):
        pw.device_put(np.zeros(2), ["tpu:0", "tpu:1"])
    runtime_ok()


# --- untraceable Python in pmap -----------------------------------------------


def test_if_on_traced_value(tpus2, runtime_ok):
    def f(x):
        if x > 0:
            return x
        return -x

    # The comparison itself traces (to a bool value); branching on it cannot.
    with pytest.raises(
        pw.TracerError, match=re.escape("bool() of a traced value (pred[] in pmap of 'f')")
    ) as info:
        pw.pmap(f, devices=tpus2)(np.array([1.0, -1.0]))
    assert isinstance(info.value, TypeError)
    runtime_ok()


@pytest.mark.parametrize(
    "body, message",
    [
        (
            lambda x: bool(x),
            "bool() of a traced value (f64[] in pmap of 'f'): Python control flow that depends on a traced value is not traceable",
        ),
        (lambda x: 1.0 if x else 0.0, "bool() of a traced value (f64[] in pmap of 'f')"),
        (lambda x: float(x), "float() of a traced value (f64[] in pmap of 'f')"),
        (lambda x: int(x), "int() of a traced value (f64[] in pmap of 'f')"),
        (lambda x: complex(x), "complex() of a traced value"),
        (lambda x: [0, 1][x], "operator.index() of a traced value"),
        (lambda x: np.asarray(x), "np.asarray() of a traced value (f64[] in pmap of 'f')"),
        # numpy functions call their pathways.numpy namesakes (test_clear_errors.py); others:
        (lambda x: np.nanmedian(x), "numpy.nanmedian of a traced value (f64[] in pmap of 'f'): pathways.numpy has no nanmedian"),
        (lambda x: list(x), "iteration over a 0-d traced value (f64[])"),
        (lambda x: 1.0 if x == 1.0 else 0.0, "bool() of a traced value (pred[] in pmap of 'f')"),
        (lambda x: x if x <= 1.0 else -x, "bool() of a traced value (pred[] in pmap of 'f')"),
    ],
)
def test_untraceable_python_in_pmap(tpus2, runtime_ok, body, message):
    pf = pw.pmap(_named("f", body), devices=tpus2)
    with pytest.raises(TypeError, match=re.escape(message)) as info:
        pf(np.array([1.0, 2.0]))
    assert isinstance(info.value, pw.TracerError)
    runtime_ok()


@pytest.mark.parametrize(
    "body, message",
    [
        (lambda x: x & x, "and: operands must be bool or integers, got f64[] and f64[]"),
        (lambda x: (x > 0) | x, "or: operands must be bool or integers, got pred[] and f64[]"),
        (lambda x: ~x, "not: operand must be bool or an integer, got f64[]"),
        (lambda x: x << 1, "shift_left: operands must be integers, got f64[] and f64[]"),
        (lambda x: x.astype(np.int32) >> 1.5,
         "shift_right_arithmetic: operands must be integers, got i32[] and f32[]"),
    ],
)
def test_bitwise_ops_need_bool_or_integers(tpus2, runtime_ok, body, message):
    pf = pw.pmap(_named("f", body), devices=tpus2)
    with pytest.raises(TypeError, match=re.escape(message)):
        pf(np.array([1.0, 2.0]))
    runtime_ok()


def test_len_and_getitem(tpus2, runtime_ok):
    lens = []

    def f(x, s):
        lens.append(len(x))
        with pytest.raises(TypeError, match="len"):
            len(s)
        return x[0]

    x = np.arange(6.0).reshape(2, 3)
    np.testing.assert_array_equal(pw.pmap(f, devices=tpus2)(x, np.zeros(2)), x[:, 0])
    assert lens == [3]
    runtime_ok()


def test_escaped_tracer(tpus2, runtime_ok):
    leaked = []

    def f(x):
        leaked.append(x)
        return x * 2.0

    pw.pmap(f, devices=tpus2)(np.zeros(2))
    (tracer,) = leaked

    def g(y):
        return y + tracer

    with pytest.raises(
        pw.TracerError, match=re.escape("escaped tracer: a traced value (f64[]) of pmap of 'f'")
    ):
        pw.pmap(g, devices=tpus2)(np.zeros(2))
    with pytest.raises(pw.TracerError, match="escaped tracer"):
        tracer * 2.0
    with pytest.raises(pw.TracerError, match="escaped tracer"):
        -tracer  # noqa: B018
    runtime_ok()


def test_nested_pmap(tpus2, devices_of, runtime_ok):
    inner = pw.pmap(lambda x: x + 1.0, devices=devices_of(2))

    def f(x):
        return inner(x)

    with pytest.raises(TypeError, match=re.escape("nested pmap is not supported")):
        pw.pmap(f, devices=tpus2)(np.zeros(2))
    runtime_ok()
    np.testing.assert_array_equal(np.asarray(inner(np.zeros(2))), [1.0, 1.0])


# --- psum ---------------------------------------------------------------------


def test_psum_unbound_axis_name(tpus2, runtime_ok):
    def f(x):
        return pw.psum(x, "j")

    with pytest.raises(
        NameError, match=re.escape("unbound axis name: 'j' (pmap of 'f' binds 'i')")
    ):
        pw.pmap(f, devices=tpus2, axis_name="i")(np.zeros(2))
    with pytest.raises(
        NameError, match=re.escape("unbound axis name: 'j' (pmap of 'f' binds no axis name)")
    ):
        pw.pmap(f, devices=tpus2)(np.zeros(2))
    runtime_ok()


def test_psum_outside_pmap(runtime_ok):
    with pytest.raises(
        NameError,
        match=re.escape(
            "unbound axis name: 'i' (psum must be called inside a function traced by pw.pmap with axis_name='i')"
        ),
    ):
        pw.psum(np.ones(3), "i")
    runtime_ok()


# --- programs -------------------------------------------------------------------


@pytest.mark.parametrize(
    "body, what",
    [
        (lambda x: x + 1.0, "'+' on a traced program value (f64[2])"),
        (lambda x: 1.0 - x, "'-' on a traced program value"),
        (lambda x: x * x, "'*' on a traced program value"),
        (lambda x: x / 2, "'/' on a traced program value"),
        (lambda x: -x, "'unary -' on a traced program value"),
        (lambda x: x > 0, "'>' on a traced program value"),
        (lambda x: x == 0, "'==' on a traced program value"),
        (lambda x: x**2, "'**' on a traced program value"),
        (lambda x: np.ones(2) * x, "numpy function 'multiply' on a traced program value"),
        (lambda x: np.sin(x), "numpy function 'sin' on a traced program value"),
        (lambda x: np.sum(x), "numpy function 'sum' on a traced program value"),
        (lambda x: np.asarray(x), "np.asarray() on a traced program value"),
        (lambda x: float(x), "float() on a traced program value"),
        (lambda x: int(x), "int() on a traced program value"),
        (lambda x: x[0], "indexing on a traced program value"),
        (lambda x: list(x), "iteration on a traced program value"),
        (
            lambda x: 1 if x else 0,
            "bool() of a traced program value (f64[2]): Python control flow on a traced value is not traceable",
        ),
    ],
)
def test_untraceable_python_in_program(runtime_ok, body, what):
    f = pw.program(_named("f", body))
    with pytest.raises(
        pw.TracerError, match=re.escape(f"untraceable Python in @pw.program 'f': {what}")
    ) as info:
        f(np.array([1.0, 2.0]))
    assert isinstance(info.value, TypeError)
    runtime_ok()


def test_program_arithmetic_message_says_what_to_do(runtime_ok):
    @pw.program
    def f(x):
        return x + 1.0

    with pytest.raises(
        pw.TracerError,
        match="Inside a program only calls of pw.pmap functions are traced; move this computation into a pmap'd function",
    ):
        f(np.array([1.0, 2.0]))
    runtime_ok()


def test_program_unsupported_dtype(runtime_ok):
    @pw.program
    def f(x, y):
        return y

    with pytest.raises(
        TypeError,
        match=re.escape(
            "@pw.program 'f': argument 1 has dtype int64; supported dtypes: float32, float64, int32, bool, uint32"
        ),
    ):
        f(np.zeros(2), np.zeros(2, np.int64))
    runtime_ok()


def test_program_unhashable_static_argument(runtime_ok):
    @pw.program
    def f(x, opts):
        return x

    with pytest.raises(TypeError, match="static argument 1 \\(set\\) is not hashable"):
        f(np.zeros(2), {1, 2})
    runtime_ok()


def test_pmap_errors_inside_program(tpus2, runtime_ok):
    def a(x):
        return x * 2.0

    pa = pw.pmap(a, devices=tpus2)

    @pw.program
    def wrong_axis(v):
        return pa(v)

    with pytest.raises(
        ValueError,
        match=re.escape("pmap of 'a' over 2 devices got leading axis of size 3 for argument 0"),
    ):
        wrong_axis(np.zeros(3))

    @pw.program
    def scalar(v):
        return pa(v)

    with pytest.raises(
        ValueError, match=re.escape("pmap of 'a' over 2 devices got a scalar for argument 0")
    ):
        scalar(np.float64(1.0))

    @pw.program
    def bad_dtype(v):
        return pa(np.zeros(2, np.float16))

    with pytest.raises(
        TypeError,
        match=re.escape(
            "pmap of 'a': argument 0 has dtype float16; supported dtypes: float32, float64, int32, bool, uint32"
        ),
    ):
        bad_dtype(np.zeros(2))

    @pw.program
    def arity(v):
        return pa(v, v)

    with pytest.raises(
        TypeError, match=re.escape("a() takes 1 positional argument but 2 were given")
    ):
        arity(np.zeros(2))
    runtime_ok()


def test_escaped_program_tracer(tpus2, runtime_ok):
    pa = pw.pmap(lambda x: x * 2.0, devices=tpus2)
    leaked = []

    @pw.program
    def f(v):
        leaked.append(v)
        return pa(v)

    f(np.zeros(2))
    (tracer,) = leaked
    with pytest.raises(pw.TracerError, match="escaped tracer"):
        pa(tracer)

    @pw.program
    def g(v):
        return pa(tracer)

    with pytest.raises(
        pw.TracerError,
        match=re.escape("escaped tracer: a traced program value (f64[2]) of @pw.program 'f'"),
    ):
        g(np.zeros(2))

    @pw.program
    def h(v):
        return tracer

    with pytest.raises(pw.TracerError, match="escaped tracer"):
        h(np.zeros(2))
    runtime_ok()


def test_pmap_closing_over_program_value(tpus2, runtime_ok):
    @pw.program
    def f(v):
        return pw.pmap(lambda x: v + x, devices=tpus2)(v)

    with pytest.raises(pw.TracerError, match="untraceable Python in @pw.program 'f'"):
        f(np.zeros(2))

    @pw.program
    def g(v):
        return pw.pmap(lambda x: x * 1.0 + v, devices=tpus2)(v)

    with pytest.raises(
        pw.TracerError, match="pass program values to pmap'd functions as arguments"
    ):
        g(np.zeros(2))
    runtime_ok()


def test_tracing_state_restored_after_errors(tpus2, runtime_ok):
    from pathways import _tracing

    pa = pw.pmap(lambda x: x * 2.0, devices=tpus2)

    @pw.program
    def f(v):
        pa(v)
        raise KeyError("inside program")

    with pytest.raises(KeyError, match="inside program"):
        f(np.zeros(2))
    assert _tracing._state.program is None and _tracing._state.function is None
    # Plain calls run op by op again (not staged into a dead trace).
    np.testing.assert_array_equal(np.asarray(pa(np.ones(2))), [2.0, 2.0])
    runtime_ok()


# --- configuration --------------------------------------------------------------


def test_configure_after_start(runtime_ok):
    pw.devices()  # make sure the runtime started
    assert _core.is_started()
    with pytest.raises(RuntimeError, match="already started"):
        pw.configure(islands=4)
    with pytest.raises(RuntimeError, match="before the runtime starts"):
        pw.configure()
    runtime_ok()


@pytest.mark.parametrize(
    "kwargs, exc, message",
    [
        ({"islands": "2"}, TypeError, "islands must be an int, got '2'"),
        ({"islands": True}, TypeError, "islands must be an int"),
        ({"devices_per_host": 0}, ValueError, "devices_per_host must be at least 1, got 0"),
        ({"device_memory": -1}, ValueError, "device_memory must be at least 1"),
        ({"executor_threads": -1}, ValueError, "executor_threads must be at least 0"),
    ],
)
def test_configure_bad_values(runtime_ok, kwargs, exc, message):
    with pytest.raises(exc, match=re.escape(message)):
        pw.configure(**kwargs)
    runtime_ok()


@pytest.mark.parametrize(
    "fn, error, message",
    [
        # Intermediates count against device memory (1 GiB here): 4 GiB per
        # shard is refused at placement, not allocated on the host.
        (lambda x: pw.numpy.broadcast_to(x, (1 << 16, 1 << 14)).sum(), pw.ResourceExhaustedError,
         "needs 4294967360 bytes of device memory per device for its intermediate values"),
        # Sizes whose element count overflows int64 are refused by the builder.
        (lambda x: pw.numpy.broadcast_to(x, (2**62, 4)).sum(), ValueError,
         "broadcast_to: f32[4611686018427387904,4] is too large"),
        (lambda x: pw.numpy.zeros_like(x).reshape(2**62, 4), ValueError, "cannot reshape"),
    ],
)
def test_huge_shapes_are_errors(tpus2, runtime_ok, fn, error, message):
    with pytest.raises(error, match=re.escape(message)):
        pw.pmap(fn, devices=tpus2)(np.zeros(2, np.float32))
    runtime_ok()
