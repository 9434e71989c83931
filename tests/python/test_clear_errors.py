"""Issue 9, unclear errors: bad input gets an exception of one type, whatever
path it takes, whose message names the function and the parameter; the
runtime stays usable afterwards.
"""

import contextlib
import dataclasses
import re

import numpy as np
import pytest

import pathways as pw
import pathways.numpy as pnp
from pathways import _core

X = np.arange(12, dtype=np.float32).reshape(2, 2, 3)  # two shards of f32[2,3]


def run(fn, x=X, axis_name="i"):
    """`fn` pmap'd over a fresh 2-TPU slice, on `x`."""
    tpus = pw.make_virtual_device_set().add_slice(tpu_devices=2).tpus
    return pw.pmap(fn, devices=tpus, axis_name=axis_name)(x)


@contextlib.contextmanager
def raises(error, message):
    """pytest.raises of exactly `error` (not a subclass) with `message` (a regex) in it."""
    with pytest.raises(error, match=message) as info:
        yield info
    assert type(info.value) is error, repr(info.value)


# --- 1. pmap's own arguments, checked when pmap is called ----------------------


@pytest.mark.parametrize("axis_name", [3, b"i", ("i",), 1.5])
def test_pmap_axis_name_must_be_a_str(tpus2, runtime_ok, axis_name):
    with raises(TypeError, re.escape(f"pmap: axis_name must be a str or None, got {axis_name!r}")):
        pw.pmap(lambda x: x, devices=tpus2, axis_name=axis_name)
    with raises(TypeError, "pmap: axis_name must be a str"):
        pw.PmapFunction(lambda x: x, None, axis_name)
    runtime_ok()


def test_pmap_axis_name_must_not_be_empty(tpus2, runtime_ok):
    with raises(ValueError, re.escape("pmap: axis_name must be a non-empty str (or None), got ''")):
        pw.pmap(lambda x: x, devices=tpus2, axis_name="")
    runtime_ok()


@pytest.mark.parametrize(
    "devices, shown",
    [
        (3, "got 3"),
        ("tpu:0", "got 'tpu:0'"),
        ([None], r"got None \(NoneType\) at index 0"),
        (["tpu:0", "tpu:1"], r"got 'tpu:0' \(str\) at index 0"),
        ("physical", r"got TpuDevice\(id=0, .*\) \(Device\) at index 0"),
    ],
)
def test_pmap_devices_must_be_virtual_devices(runtime_ok, devices, shown):
    if devices == "physical":
        devices = pw.devices()[:2]
    with raises(TypeError, r"pmap: devices must be virtual devices from `pw\.make_virtual_device_set\(\)"
                           r"\.add_slice\(tpu_devices=n\)\.tpus` \(or that VirtualSlice\), " + shown):
        pw.pmap(lambda x: x, devices=devices)
    runtime_ok()


def test_pmap_devices_must_not_be_empty(runtime_ok):
    with raises(ValueError, re.escape("pmap: devices must hold at least one device")):
        pw.pmap(lambda x: x, devices=[])
    runtime_ok()


def test_pmap_takes_a_slice_a_device_or_a_generator_of_devices(runtime_ok):
    vslice = pw.make_virtual_device_set().add_slice(tpu_devices=2)
    for devices in (vslice, (d for d in vslice.tpus)):
        out = pw.pmap(lambda x: x + 1.0, devices=devices)(np.zeros(2))
        np.testing.assert_array_equal(np.asarray(out), [1.0, 1.0])
    assert pw.pmap(lambda x: x, devices=vslice.tpus[0]).devices == [vslice.tpus[0]]
    runtime_ok()


# --- 2. ppermute's permutation -----------------------------------------------------


@pytest.mark.parametrize(
    "perm, entry",
    [
        ([(0, 1, 2)], " (entry 0 is (0, 1, 2))"),
        (None, ""),
        ([0, 1], " (entry 0 is 0)"),
        ([(0.0, 1)], " (entry 0 is (0.0, 1))"),
        ([(0, 1), ("1", 0)], " (entry 1 is ('1', 0))"),
        ([(True, 0)], " (entry 0 is (True, 0))"),
        (3, ""),
        ("01", ""),
        ([{0, 1}], " (entry 0 is {0, 1})"),
    ],
)
def test_ppermute_perm_structure_is_a_type_error(runtime_ok, perm, entry):
    message = f"ppermute: perm must be a sequence of pairs of ints, got {perm!r}{entry}"
    with raises(TypeError, re.escape(message)):
        run(lambda x: pw.ppermute(x, "i", perm))
    runtime_ok()


@pytest.mark.parametrize(
    "perm, message",
    [
        ([(0, 2)], "ppermute: perm pair (0, 2) is out of range for 2 shards"),
        ([(-1, 0)], "ppermute: perm pair (-1, 0) is out of range for 2 shards"),
        ([(0, 1), (0, 0)], "ppermute: perm pair (0, 0) repeats a source or destination"),
        ([(0, 1), (1, 1)], "ppermute: perm pair (1, 1) repeats a source or destination"),
        ([(2**70, 0)], f"ppermute: perm {2**70} is out of range"),
    ],
)
def test_ppermute_perm_values_are_value_errors(runtime_ok, perm, message):
    with raises(ValueError, re.escape(message)):
        run(lambda x: pw.ppermute(x, "i", perm))
    runtime_ok()


def test_ppermute_takes_tuples_lists_and_arrays_of_pairs(runtime_ok):
    for perm in [((0, 1), (1, 0)), [[0, 1], [1, 0]], np.array([[0, 1], [1, 0]]), [(np.int64(0), 1)]]:
        out = np.asarray(run(lambda x: pw.ppermute(x, "i", perm)))
        np.testing.assert_array_equal(out[1], X[0])
    runtime_ok()


# --- 3. axes: every op's axis parameters through one check --------------------------

AXIS_OPS = [
    # (op, parameter, fn of a traced f32[2,3] and the bad axis)
    ("sum", "axis", lambda x, a: x.sum(axis=a)),
    ("sum", "axis", lambda x, a: pnp.sum(x, a)),
    ("mean", "axis", lambda x, a: x.mean(axis=(0, a))),
    ("mean", "axis", lambda x, a: pnp.mean(x, axis=a)),
    ("max", "axis", lambda x, a: x.max(a)),
    ("max", "axis", lambda x, a: pnp.max(x, axis=[a])),
    ("min", "axis", lambda x, a: x.min(axis=a, keepdims=True)),
    ("min", "axis", lambda x, a: pnp.min(x, axis=a)),
    ("argmax", "axis", lambda x, a: x.argmax(axis=a)),
    ("argmax", "axis", lambda x, a: pnp.argmax(x, axis=a)),
    ("var", "axis", lambda x, a: pnp.var(x, axis=a)),
    ("std", "axis", lambda x, a: x.std(a)),
    ("all_to_all", "split_axis", lambda x, a: pw.all_to_all(x, "i", a, 1)),
    ("all_to_all", "concat_axis", lambda x, a: pw.all_to_all(x, "i", 0, a)),
    ("all_gather", "axis", lambda x, a: pw.all_gather(x, "i", axis=a)),
    ("psum_scatter", "scatter_dimension", lambda x, a: pw.psum_scatter(x, "i", a)),
    ("squeeze", "axis", lambda x, a: pnp.squeeze(x, a)),
    ("squeeze", "axis", lambda x, a: x.squeeze(axis=a)),
    ("expand_dims", "axis", lambda x, a: pnp.expand_dims(x, a)),
    ("moveaxis", "source", lambda x, a: pnp.moveaxis(x, a, 0)),
    ("moveaxis", "destination", lambda x, a: pnp.moveaxis(x, 0, a)),
    ("swapaxes", "axis1", lambda x, a: x.swapaxes(a, 0)),
    ("transpose", "axes", lambda x, a: x.transpose(a, 0)),
    ("transpose", "axes", lambda x, a: pnp.transpose(x, (0, a))),
    ("concatenate", "axis", lambda x, a: pnp.concatenate([x, x], axis=a)),
    ("stack", "axis", lambda x, a: pnp.stack([x, x], axis=a)),
    ("flip", "axis", lambda x, a: pnp.flip(x, a)),
    ("take", "axis", lambda x, a: pnp.take(x, np.array([0]), axis=a)),
    ("take", "axis", lambda x, a: x.take(np.array([0]), axis=a)),
    ("reshape", "shape", lambda x, a: x.reshape(a, -1)),
    ("broadcast_to", "shape", lambda x, a: pnp.broadcast_to(x, (a, 2, 3))),
    ("softmax", "axis", lambda x, a: pw.nn.softmax(x, axis=a)),
    ("logsumexp", "axis", lambda x, a: pw.nn.logsumexp(x, axis=a)),
    ("layer_norm", "axis", lambda x, a: pw.nn.layer_norm(x, axis=a)),
    ("one_hot", "axis", lambda x, a: pw.nn.one_hot(x.astype(np.int32), 3, axis=a)),
]


@pytest.mark.parametrize("bad", [1.0, "0", None], ids=["float", "str", "None"])
@pytest.mark.parametrize("op, param, fn", AXIS_OPS, ids=[f"{o}-{p}-{i}" for i, (o, p, _) in enumerate(AXIS_OPS)])
def test_axis_of_wrong_type_names_op_and_parameter(runtime_ok, op, param, fn, bad):
    # None means "all axes" where an op takes it; elsewhere it is a wrong type too.
    try:
        run(lambda x: fn(x, bad))
    except TypeError as e:
        assert type(e) is TypeError, repr(e)
        assert re.match(rf"{op}: {param} must be (None, |None or )?an int( or a tuple of ints)?, got ", str(e)), e
        assert repr(bad) in str(e), e
    else:
        assert bad is None, f"{op} took {param}={bad!r}"
    runtime_ok()


def test_axes_beyond_int64_are_out_of_range(runtime_ok):
    with raises(ValueError, re.escape(f"sum: axis {2**70} is out of range")):
        run(lambda x: x.sum(axis=2**70))
    with raises(ValueError, re.escape(f"all_gather: axis {-(2**64)} is out of range")):
        run(lambda x: pw.all_gather(x, "i", axis=-(2**64)))
    runtime_ok()


def test_axes_take_numpy_integers(runtime_ok):
    out = run(lambda x: x.sum(axis=np.int64(1)) + pnp.squeeze(pnp.expand_dims(x, np.int32(0)), 0).sum(axis=(np.int8(-1),)))
    np.testing.assert_array_equal(np.asarray(out), 2 * X.sum(axis=2))
    runtime_ok()


# --- 4. device_put's devices --------------------------------------------------------


@pytest.mark.parametrize(
    "devices, shown",
    [(3, "got 3"), ("tpu:0", "got 'tpu:0'"), ([None, None], "got None (NoneType) at index 0")],
)
def test_device_put_devices_must_be_devices(runtime_ok, devices, shown):
    with raises(TypeError, re.escape(
        "device_put: devices must be a VirtualSlice or a sequence of devices (virtual ones such as a "
        "slice's `.tpus`, or physical ones from pw.devices()), " + shown
    )):
        pw.device_put(np.zeros(2), devices)
    runtime_ok()


def test_device_put_without_devices_is_jaxs_one_device_put(runtime_ok):
    # As jax.device_put(x): whole, onto the device pw.jit functions share;
    # they take the replicated buffers with no copy.
    tree = pw.device_put({"w": np.arange(6.0, dtype=np.float32).reshape(2, 3), "s": 2.0})
    assert tree["w"].is_replicated and tree["w"].shape == (2, 3)
    assert tree["w"].dtype == np.float32
    np.testing.assert_array_equal(np.asarray(tree["w"]), np.arange(6.0).reshape(2, 3))
    out = pw.jit(lambda t: t["w"] * t["s"])(tree)
    assert out.devices == tree["w"].devices
    np.testing.assert_array_equal(np.asarray(out), 2 * np.arange(6.0).reshape(2, 3))
    with raises(TypeError, "argument 0 has type set"):
        pw.device_put({1, 2})
    runtime_ok()


def test_device_put_takes_slices_and_physical_devices(runtime_ok):
    vslice = pw.make_virtual_device_set().add_slice(tpu_devices=2)
    for devices in (vslice, vslice.tpus, pw.devices()[:2]):
        np.testing.assert_array_equal(np.asarray(pw.device_put(np.ones(2), devices)), [1.0, 1.0])
    runtime_ok()


# --- 5. arguments that are no arrays ---------------------------------------------------


@dataclasses.dataclass
class Params:
    w: np.ndarray


def _generator():
    yield np.zeros(2)


ACCEPTED = re.escape(
    "not an array or number; accepted: ShardedBuffers, numpy arrays, jax.Arrays, Python and numpy "
    "scalars (bool, int, float), and pytrees of them (tuples, lists, dicts, None, and JAX's "
    "registered nodes)"
)
NOT_ARRAYS = [
    (Params(np.zeros(2)), "Params"),
    ({1.0, 2.0}, "set"),
    (frozenset([1.0]), "frozenset"),
    (object(), "object"),
    ("ab", "str"),
    (b"ab", "bytes"),
]


@pytest.mark.parametrize("devices", [True, False], ids=["devices", "no-devices"])
@pytest.mark.parametrize("arg, type_name", NOT_ARRAYS, ids=[t for _, t in NOT_ARRAYS])
def test_pmap_argument_that_is_no_array(tpus2, runtime_ok, arg, type_name, devices):
    def f(x, y):
        return x

    pf = pw.pmap(f, devices=tpus2 if devices else None)
    with raises(TypeError, rf"pmap of 'f': argument 1 has type {type_name} \(.*\), " + ACCEPTED):
        pf(np.zeros(2), arg)
    # Argument numbers count the leaves of the flattened arguments.
    with raises(TypeError, rf"pmap of 'f': argument 2 has type {type_name} "):
        pf(np.zeros(2), {"a": np.zeros(2), "b": arg})
    runtime_ok()


def test_generator_argument_is_not_consumed(tpus2, runtime_ok):
    gen = _generator()
    with raises(TypeError, r"pmap of '<lambda>': argument 0 has type generator \(<generator object "):
        pw.pmap(lambda x: x, devices=tpus2)(gen)
    with raises(TypeError, r"device_put: leaf 0 has type generator "):
        pw.device_put(gen, tpus2)
    np.testing.assert_array_equal(next(gen), np.zeros(2))  # still unconsumed
    runtime_ok()


@pytest.mark.parametrize("arg, type_name", NOT_ARRAYS, ids=[t for _, t in NOT_ARRAYS])
def test_device_put_leaf_that_is_no_array(tpus2, runtime_ok, arg, type_name):
    with raises(TypeError, rf"device_put: leaf 1 has type {type_name} \(.*\), " + ACCEPTED):
        pw.device_put([np.zeros(2), arg], tpus2)
    runtime_ok()


def test_program_passing_no_array_to_pmap(tpus2, runtime_ok):
    pa = pw.pmap(lambda x, y: x, devices=tpus2)

    @pw.program
    def f(v):
        return pa(v, Params(np.zeros(2)))

    with raises(TypeError, r"pmap of '<lambda>': argument 1 has type Params "):
        f(np.zeros(2))
    runtime_ok()


def test_long_reprs_are_cut(tpus2, runtime_ok):
    with raises(TypeError, r"argument 0 has type set \(\{0, 1, 2, .{40,50}\.\.\.\), not an array"):
        pw.pmap(lambda x: x, devices=tpus2)(set(range(1000)))
    runtime_ok()


# --- 6. numpy's functions on traced values -----------------------------------------------

NUMPY_CALLS = [
    # (numpy's call, pathways.numpy's): both on a traced f32[2,3].
    (lambda x: np.sum(x), lambda x: pnp.sum(x)),
    (lambda x: np.sum(x, axis=0, keepdims=True), lambda x: pnp.sum(x, 0, keepdims=True)),
    (lambda x: np.mean(x, 1), lambda x: pnp.mean(x, 1)),
    (lambda x: np.max(x, axis=-1), lambda x: pnp.max(x, -1)),
    (lambda x: np.min(x), lambda x: pnp.min(x)),
    (lambda x: np.argmax(x, axis=1), lambda x: pnp.argmax(x, 1)),
    (lambda x: np.var(x, axis=0), lambda x: pnp.var(x, 0)),
    (lambda x: np.exp(x / 10), lambda x: pnp.exp(x / 10)),
    (lambda x: np.sin(x), lambda x: pnp.sin(x)),
    (lambda x: np.abs(-x), lambda x: pnp.abs(-x)),
    (lambda x: np.maximum(x, 3.0), lambda x: pnp.maximum(x, 3.0)),
    (lambda x: np.where(x > 3, x, 0.0), lambda x: pnp.where(x > 3, x, 0.0)),
    (lambda x: np.concatenate([x, x], axis=1), lambda x: pnp.concatenate([x, x], 1)),
    (lambda x: np.reshape(x, (3, 2)), lambda x: pnp.reshape(x, (3, 2))),
    (lambda x: np.transpose(x), lambda x: x.T),
    (lambda x: np.clip(x, 1, 4), lambda x: pnp.clip(x, 1, 4)),
    (lambda x: np.zeros_like(x), lambda x: pnp.zeros_like(x)),
    (lambda x: np.einsum("ij->ji", x), lambda x: pnp.einsum("ij->ji", x)),
    (lambda x: np.ones((3, 2), np.float32) @ x, lambda x: pnp.matmul(np.ones((3, 2), np.float32), x)),
    (lambda x: np.float32(np.shape(x)[1]) * x, lambda x: 3.0 * x),
    # numpy's operators on numpy values are ufuncs: the order of operands stays.
    (lambda x: np.full(3, 2.0, np.float32) - x, lambda x: 2.0 - x),
    (lambda x: (np.arange(3.0) < x).astype(np.float32), lambda x: (x > np.arange(3.0)).astype(np.float32)),
    (lambda x: (np.array([True, False, True]) & (x > 2)).astype(np.float32),
     lambda x: ((x > 2) & np.array([True, False, True])).astype(np.float32)),
]


@pytest.mark.parametrize("numpy_call, pathways_call", NUMPY_CALLS)
def test_numpy_functions_on_traced_values_call_pathways_numpy(runtime_ok, numpy_call, pathways_call):
    np.testing.assert_allclose(np.asarray(run(numpy_call)), np.asarray(run(pathways_call)), rtol=1e-6)
    runtime_ok()


@pytest.mark.parametrize(
    "fn, message",
    [
        (lambda x: np.nanmedian(x), r"numpy\.nanmedian of a traced value \(f32\[2,3\] in pmap of "
                                    r"'<lambda>'\): pathways\.numpy has no nanmedian; .* pathways\.numpy "
                                    r"\(pw\.numpy\) functions"),
        (lambda x: np.linalg.eigvals(x), r"numpy\.linalg\.eigvals of a traced value .*pathways\.numpy\.linalg "
                                         r"has no eigvals"),
        (lambda x: np.nanprod(x), r"numpy\.nanprod of a traced value .*pathways\.numpy has no nanprod"),
        (lambda x: np.cbrt(x), r"numpy\.cbrt of a traced value .*pathways\.numpy has no cbrt"),
        (lambda x: np.sum(x, out=np.zeros(3)), r"numpy\.sum of a traced value .*: it calls pathways\.numpy"
                                               r"\.sum, which does not take these arguments \(.*'out'\)"),
        (lambda x: np.mean(x, where=x > 0), r"numpy\.mean .*pathways\.numpy\.mean, which does not take "
                                            r"these arguments \(.*'where'\)"),
        (lambda x: np.add.reduce(x), r"numpy\.add\.reduce of a traced value .*pathways\.numpy\.sum"),
        (lambda x: np.add(x, 1.0, out=np.zeros(3)), r"numpy\.add of a traced value .*'out'"),
        (lambda x: np.asarray(x), r"np\.asarray\(\) of a traced value .*pathways\.numpy functions"),
    ],
)
def test_numpy_functions_pathways_numpy_lacks_raise_tracer_error(runtime_ok, fn, message):
    with raises(pw.TracerError, message):
        run(fn)
    runtime_ok()


def test_numpy_functions_of_escaped_tracers(runtime_ok):
    leaked = []
    run(lambda x: leaked.append(x) or x)
    with raises(pw.TracerError, "escaped tracer"):
        np.sum(leaked[0])
    with raises(pw.TracerError, "escaped tracer"):
        np.exp(leaked[0])
    runtime_ok()


# --- 7. one exception type per mistake, whichever path finds it -------------------------


def test_float16_is_a_type_error_everywhere(tpus2, runtime_ok):
    supported = "supported dtypes: float32, float64, int32, bool, uint32"
    half = np.zeros(2, np.float16)
    with raises(TypeError, "argument 0 has dtype float16; " + supported):
        pw.pmap(lambda x: x, devices=tpus2)(half)
    with raises(TypeError, "device_put: the array has dtype float16; " + supported):
        pw.device_put(half, tpus2)
    with raises(TypeError, "argument 0 has dtype float16; " + supported):
        pw.program(lambda x: x)(half)
    with raises(TypeError, "to float16: " + supported):
        run(lambda x: x.astype(np.float16))
    # The core's builders say the same through the same type.
    b = _core.FunctionBuilder("g", "i")
    with raises(TypeError, "dtype float16 is not supported; " + supported):
        b.parameter("float16", [2])
    x = b.parameter("float32", [2])
    with raises(TypeError, "dtype float16 is not supported; " + supported):
        b.convert(x, "float16")
    with raises(TypeError, "dtype float16 is not supported; " + supported):
        _core.ProgramBuilder("p").add_arg("float16", [2])
    runtime_ok()


@pytest.mark.parametrize(
    "fn, message",
    [
        (lambda x: -(x > 0), "neg: negative of a bool is not supported"),
        (lambda x: (x > 0) - (x > 1), "sub: boolean subtract is not supported"),
        (lambda x: pw.pmean(x > 0, "i"), r"pmean: operand must be numeric, got pred\[2,3\]"),
        (lambda x: pnp.sign(x > 0), r"sign: operand must be numeric, got pred\[2,3\]"),
        (lambda x: pnp.take(x, x, axis=0), r"take: indices must be int32, got f32\[2,3\]"),
        (lambda x: x & x, r"and: operands must be bool or integers, got f32\[2,3\] and f32\[2,3\]"),
    ],
)
def test_wrong_operand_dtype_is_a_type_error(runtime_ok, fn, message):
    # Whether Python (sign, take, &) or the core (neg, sub, pmean) finds it, as numpy's TypeError.
    with raises(TypeError, message):
        run(fn)
    runtime_ok()


def test_unbound_axis_name_is_a_name_error_in_python(runtime_ok):
    with raises(NameError, r"unbound axis name: 'j' \(pmap of '<lambda>' binds 'i'\)"):
        run(lambda x: pw.psum(x, "j"))
    with raises(NameError, r"unbound axis name: 'j' \(pmap of '<lambda>' binds no axis name\)"):
        run(lambda x: pw.pmean(x, "j"), axis_name=None)
    runtime_ok()


@pytest.mark.parametrize(
    "core_call",
    [
        lambda b, x: b.psum(x, "j"),
        lambda b, x: b.pcollective("pmean", x, "j"),
        lambda b, x: b.axis_index("j"),
        lambda b, x: b.all_gather(x, "j", 0),
        lambda b, x: b.ppermute(x, "j", [(0, 1)]),
        lambda b, x: b.all_to_all(x, "j", 0, 0),
        lambda b, x: b.psum_scatter(x, "j", 0),
    ],
)
def test_unbound_axis_name_is_a_name_error_in_the_core(runtime_ok, core_call):
    b = _core.FunctionBuilder("g", "i")
    b.set_axis_size(2)
    x = b.parameter("float32", [2, 2])
    with raises(NameError, r": unbound axis name 'j' \(bound: 'i'\)"):
        core_call(b, x)
    runtime_ok()


def test_a_built_function_builder_raises_instead_of_reading_freed_values(runtime_ok):
    # Build hands the builder's values to the function; reading them through
    # the builder afterwards crashed the process.
    b = _core.FunctionBuilder("f", "")
    x = b.parameter("float32", [2])
    b.build([x])
    for call in (lambda: b.shape(x), lambda: b.dtype(x), lambda: b.parameter("float32", [2]),
                 lambda: b.unary("neg", x), lambda: b.build([x])):
        with pytest.raises(RuntimeError, match="already built"):
            call()
    runtime_ok()


def test_a_captured_device_array_names_the_fix(tpus2, runtime_ok):
    # JAX would capture the array as a constant; here that would read it back
    # at every trace, so the error says to pass it (found by a JAX user's probe:
    # it was Python's "unsupported operand type(s)").
    b = pw.device_put(np.ones((2, 3)), tpus2)
    for body in (lambda x: x + b, lambda x: b * x, lambda x: pw.numpy.maximum(x, b)):
        with raises(TypeError, re.escape(
            "pmap of '<lambda>' uses a ShardedBuffer it did not get as an argument: device "
            "arrays are not captured as constants"
        )):
            pw.pmap(body, devices=tpus2)(np.ones((2, 3)))
    np.testing.assert_array_equal(
        np.asarray(pw.pmap(lambda x, c: x + c, devices=tpus2)(np.ones((2, 3)), b)), 2.0)
    runtime_ok()
