"""Issue 9, unclear errors: bad input gets an exception of one type, whatever
path it takes, whose message names the function and the parameter; the
runtime stays usable afterwards.
"""

import contextlib
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


# --- 7. one exception type per mistake, whichever path finds it -------------------------


def test_float16_is_a_type_error_everywhere(tpus2, runtime_ok):
    supported = "supported dtypes: float32, float64, int32, bool"
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
        (lambda x: x & x, r"'&' on traced values needs bool operands, got f32\[2,3\]"),
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
