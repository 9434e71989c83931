"""@pw.program: tracing, static and dynamic arguments, outputs, captured constants."""

import threading

import numpy as np
import pytest

import pathways as pw


def count_calls(text):
    return sum(1 for line in text.splitlines() if " = call @" in line)


@pytest.fixture
def fns(devices_of):
    tpus = devices_of(2)
    double = pw.pmap(lambda x: x * 2.0, devices=tpus)
    inc = pw.pmap(lambda x: x + 1.0, devices=devices_of(2))
    add = pw.pmap(lambda x, y: x + y, devices=tpus)
    return double, inc, add


def test_program_chain(fns):
    double, inc, add = fns

    @pw.program
    def chain(x):
        for _ in range(10):
            x = inc(double(x))
        return x

    x = np.array([0.0, 1.0])
    expected = x.copy()
    for _ in range(10):
        expected = expected * 2.0 + 1.0
    np.testing.assert_array_equal(np.asarray(chain(x)), expected)
    assert chain.trace(x).num_nodes == 20
    assert count_calls(chain.trace(x).as_text()) == 20
    assert chain.lower(x).num_compute_steps == 20


def test_program_is_callable_form_and_wraps(fns):
    double, _, _ = fns

    def g(x):
        """Doubles."""
        return double(x)

    p = pw.program(g)
    assert isinstance(p, pw.Program)
    assert p.__name__ == "g" and p.__doc__ == "Doubles." and p.__wrapped__ is g
    np.testing.assert_array_equal(np.asarray(p(np.array([1.0, 2.0]))), [2.0, 4.0])


def test_program_caches_per_signature(fns):
    double, inc, _ = fns
    traces = []

    @pw.program
    def f(x):
        traces.append(x.shape)
        return inc(double(x))

    for i in range(5):
        np.testing.assert_array_equal(np.asarray(f(np.array([i, 2.0]))), [2.0 * i + 1.0, 5.0])
    assert traces == [(2,)]
    f(np.zeros((2, 3)))
    f(np.zeros((2, 3)))
    assert traces == [(2,), (2, 3)]
    assert f.trace(np.zeros(2)) is f.trace(np.ones(2))
    assert f.lower(np.zeros(2)) is f.lower(np.ones(2))
    assert len(traces) == 2


def test_static_arguments_are_part_of_the_key(fns):
    double, inc, _ = fns
    traces = []

    @pw.program
    def f(x, times, mode="double"):
        traces.append((times, mode))
        for _ in range(times):
            x = double(x) if mode == "double" else inc(x)
        return x

    x = np.array([1.0, 2.0])
    np.testing.assert_array_equal(np.asarray(f(x, 3)), x * 8)
    np.testing.assert_array_equal(np.asarray(f(x, 3)), x * 8)
    np.testing.assert_array_equal(np.asarray(f(x, 2)), x * 4)
    np.testing.assert_array_equal(np.asarray(f(x, 2, mode="inc")), x + 2)
    np.testing.assert_array_equal(np.asarray(f(x, times=2, mode="inc")), x + 2)
    assert traces == [(3, "double"), (2, "double"), (2, "inc"), (2, "inc")]
    assert f.trace(x, 3).num_nodes == 3


def test_static_bool_and_int_are_different_keys(fns):
    double, inc, _ = fns
    traces = []

    @pw.program
    def f(x, flag):
        traces.append(flag)
        return double(x) if flag is True else inc(x)

    x = np.array([1.0, 2.0])
    np.testing.assert_array_equal(np.asarray(f(x, True)), [2.0, 4.0])
    np.testing.assert_array_equal(np.asarray(f(x, 1)), [2.0, 3.0])
    assert traces == [True, 1]


def test_program_pytrees_and_kwargs(fns):
    double, inc, add = fns

    @pw.program
    def f(params, x, *, scale):
        h = add(params["w"], x)
        return {"h": h, "both": (double(h), inc(h)), "scale": scale, "none": None}

    params = {"w": np.array([1.0, 2.0])}
    out = f(params, np.array([10.0, 20.0]), scale=0.5)
    assert sorted(out) == ["both", "h", "none", "scale"]
    assert out["scale"] == 0.5 and out["none"] is None
    np.testing.assert_array_equal(np.asarray(out["h"]), [11.0, 22.0])
    np.testing.assert_array_equal(np.asarray(out["both"][0]), [22.0, 44.0])
    np.testing.assert_array_equal(np.asarray(out["both"][1]), [12.0, 23.0])


def test_returned_input_is_callers_object(fns):
    double, _, _ = fns

    @pw.program
    def f(x, y):
        return x, double(y), y

    x = np.array([1.0, 2.0])
    y = pw.device_put(np.array([3.0, 4.0]), double.devices)
    a, b, c = f(x, y)
    assert a is x and c is y
    np.testing.assert_array_equal(np.asarray(b), [6.0, 8.0])


def test_program_returning_only_inputs_and_constants(fns):
    @pw.program
    def f(x):
        return x, 3, "s"

    x = np.array([1.0, 2.0])
    a, b, c = f(x)
    assert a is x and b == 3 and c == "s"


def test_same_value_returned_twice(fns):
    double, _, _ = fns

    @pw.program
    def f(x):
        y = double(x)
        return y, [y]

    a, (b,) = f(np.array([1.0, 2.0]))
    np.testing.assert_array_equal(np.asarray(a), [2.0, 4.0])
    np.testing.assert_array_equal(np.asarray(b), [2.0, 4.0])


def test_multiple_output_pmap_inside_program(devices_of):
    split = pw.pmap(lambda x: {"pos": x * 1.0, "neg": -x}, devices=devices_of(2))
    join = pw.pmap(lambda p, n: p - n, devices=devices_of(2))

    @pw.program
    def f(x):
        d = split(x)
        return join(d["pos"], d["neg"])

    np.testing.assert_array_equal(np.asarray(f(np.array([1.0, 2.0]))), [2.0, 4.0])
    assert f.trace(np.array([1.0, 2.0])).num_nodes == 2


def test_captured_constants(fns):
    double, _, add = fns
    bias = np.array([100.0, 200.0])
    on_device = pw.device_put(np.array([1.0, 1.0]), double.devices)

    @pw.program
    def f(x):
        return add(add(x, bias), on_device), double(bias)

    for i in range(3):
        a, b = f(np.array([float(i), 0.0]))
        np.testing.assert_array_equal(np.asarray(a), [101.0 + i, 201.0])
        np.testing.assert_array_equal(np.asarray(b), [200.0, 400.0])
    prog = f.trace(np.zeros(2))
    assert prog.num_args == 3  # x, then the two captured constants
    assert prog.num_nodes == 3
    # Captured numpy constants were copied when the program was traced.
    bias[:] = -1.0
    a, b = f(np.array([0.0, 0.0]))
    np.testing.assert_array_equal(np.asarray(a), [101.0, 201.0])
    np.testing.assert_array_equal(np.asarray(b), [200.0, 400.0])


def test_concrete_list_argument_to_pmap_in_program(fns):
    _, _, add = fns

    @pw.program
    def f(x):
        return add(x, np.array([1, 2]).astype(np.float64))

    np.testing.assert_array_equal(np.asarray(f(np.array([1.0, 1.0]))), [2.0, 3.0])


def test_numpy_scalar_is_dynamic(devices_of):
    scale = pw.pmap(lambda x, s: x * s, devices=devices_of(2))
    traces = []

    @pw.program
    def f(x, s):
        traces.append(type(s).__name__)
        return scale(x, s)

    x = np.array([1.0, 2.0])
    s = np.array([3.0, 3.0])
    np.testing.assert_array_equal(np.asarray(f(x, s)), [3.0, 6.0])
    np.testing.assert_array_equal(np.asarray(f(x, s * 2)), [6.0, 12.0])
    assert traces == ["ProgramTracer"]

    @pw.program
    def g(x, c):
        traces.append(c)
        return x

    assert g(x, np.float64(2.0)) is x
    assert g(x, np.float64(3.0)) is x
    assert len(traces) == 2 and isinstance(traces[1], pw.ProgramTracer)


def test_nested_programs_inline(fns):
    double, inc, _ = fns

    @pw.program
    def inner(x):
        return inc(double(x))

    @pw.program
    def outer(x):
        return inner(inner(x))

    x = np.array([1.0, 2.0])
    np.testing.assert_array_equal(np.asarray(outer(x)), (x * 2 + 1) * 2 + 1)
    assert outer.trace(x).num_nodes == 4


def test_program_method(fns):
    double, _, _ = fns

    class Model:
        @pw.program
        def apply(self, x):
            return double(x)

    m = Model()
    np.testing.assert_array_equal(np.asarray(m.apply(np.array([1.0, 2.0]))), [2.0, 4.0])


def test_program_tracer_attributes(fns):
    double, _, _ = fns
    seen = {}

    @pw.program
    def f(x):
        seen.update(shape=x.shape, dtype=x.dtype, ndim=x.ndim, size=x.size, aval=x.aval)
        y = double(x)
        seen["y"] = (y.shape, y.dtype)
        return y

    f(np.zeros((2, 5), np.float32))
    assert seen["shape"] == (2, 5) and seen["dtype"] == np.float32
    assert seen["ndim"] == 2 and seen["size"] == 10 and seen["aval"] == "f32[2,5]"
    assert seen["y"] == ((2, 5), np.dtype(np.float32))


def test_program_with_psum_pmaps(devices_of):
    tpus = devices_of(4)
    center = pw.pmap(lambda x: x - pw.psum(x, "i") / 4.0, devices=tpus, axis_name="i")
    norm = pw.pmap(lambda x: pw.psum(x * x, "i"), devices=tpus, axis_name="i")

    @pw.program
    def f(x):
        c = center(x)
        return c, norm(c)

    x = np.array([1.0, 2.0, 3.0, 6.0])
    c, n = f(x)
    np.testing.assert_array_equal(np.asarray(c), x - 3.0)
    np.testing.assert_array_equal(np.asarray(n), np.full(4, ((x - 3.0) ** 2).sum()))


def test_program_on_sharded_buffers_from_another_slice(fns, devices_of):
    double, inc, _ = fns
    x = pw.device_put(np.array([1.0, 2.0]), devices_of(2))

    @pw.program
    def f(x):
        return inc(double(x))

    np.testing.assert_array_equal(np.asarray(f(x)), [3.0, 5.0])
    np.testing.assert_array_equal(np.asarray(f(f(x))), [7.0, 11.0])


def test_another_thread_calls_the_program_while_its_first_trace_waits_for_it(devices_of):
    # The first trace starts a thread that calls the same program with the
    # same signature, and waits for it (issue 25). Waiting for the trace
    # under way would deadlock the two; the other thread traces it too, and
    # both calls give the right values.
    double = pw.pmap(lambda x: x * 2.0, devices=devices_of(2))
    started, other = [], {}

    def call_from_another_thread():
        try:
            other["out"] = np.asarray(prog(np.array([3.0, 4.0])))
        except Exception as e:  # noqa: BLE001 - checked below
            other["error"] = e

    @pw.program
    def prog(x):
        if not started:
            started.append(1)
            th = threading.Thread(target=call_from_another_thread, daemon=True)
            th.start()
            th.join(30)
            other["finished during the trace"] = not th.is_alive()
        return double(x)

    np.testing.assert_array_equal(np.asarray(prog(np.array([1.0, 2.0]))), [2.0, 4.0])
    assert other.get("finished during the trace"), other
    assert "error" not in other, other
    np.testing.assert_array_equal(other["out"], [6.0, 8.0])
    np.testing.assert_array_equal(np.asarray(prog(np.array([5.0, 6.0]))), [10.0, 12.0])
