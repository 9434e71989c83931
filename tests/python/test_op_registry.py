"""The Python primitives against the C++ op registry (`_core.op_registry()`).

Every per-op table of the front end is checked against the registry, from
which it derives: one `Primitive` per registry op (but the sources) with the
registry's arity and class; a VJP rule for exactly the primitives whose result
can be a float that depends on their operands (by the registry's type rule);
each primitive's emitter records its op (traced, and read back from the IR
text); each `Tracer` operator symbol binds its primitive; and
`FunctionBuilder.binary` / `.unary` take exactly the registry's binary and
unary ops.
"""

import re

import numpy as np
import pytest

import pathways as pw
from pathways import _autodiff, _core, _primitives
from pathways._primitives import PRIMITIVES
from pathways._tracing import _state, bind

ROWS = _core.op_registry()
REGISTRY = {name: (arity, op_class, type_rule) for name, arity, op_class, type_rule in ROWS}

# Type rules whose result is bool whatever the operands (op_registry.h).
BOOL_RESULT_RULES = {"comparison"}
# Type rules whose result is never a float: bool, integers, or int32 positions (op_registry.h).
NO_FLOAT_RESULT_RULES = BOOL_RESULT_RULES | {"bitwise", "shift", "invert", "indices"}
# Type rules whose operands must be bool or integers (examples use bools).
BOOL_OPERAND_RULES = {"bitwise", "invert"}
# Type rules whose operands must be integers.
INT_OPERAND_RULES = {"shift"}
REDUCE_KINDS = ("sum", "mean", "max", "min", "argmax")


def is_binary(name):
    arity, op_class, _ = REGISTRY[name]
    return op_class == "elementwise" and arity == 2


def is_unary(name):
    arity, op_class, type_rule = REGISTRY[name]
    return op_class == "elementwise" and arity == 1 and type_rule != "own"


def test_registry_rows():
    names = [row[0] for row in ROWS]
    assert len(set(names)) == len(names)
    assert {n for n, (_, c, _) in REGISTRY.items() if c == "source"} == {"parameter", "constant"}
    for name, arity, op_class, type_rule in ROWS:
        assert arity >= -1, name
        assert op_class in ("source", "elementwise", "simulated", "reduction", "data_movement",
                            "indexing", "contraction", "collective", "control", "linalg"), name
        assert type_rule in ("arithmetic", "comparison", "bitwise", "shift", "numeric",
                             "floating", "invert", "same", "indices", "own"), name


def test_every_op_has_one_primitive_with_the_registrys_arity_and_class():
    for name, (arity, op_class, type_rule) in REGISTRY.items():
        recording = [p.name for p in PRIMITIVES.values() if p.op == name and p.name == name]
        if op_class == "source":
            # Parameters and constants are added by the tracer, not bound.
            assert not [p for p in PRIMITIVES.values() if p.op == name], name
            continue
        assert recording == [name], name
        p = PRIMITIVES[name]
        assert (p.arity, p.op_class, p.type_rule) == (arity, op_class, type_rule), name
    for p in PRIMITIVES.values():
        assert p.op in REGISTRY, p
        if p.name != p.op:
            # A primitive of its own name records a registry op, and is no registry op itself.
            assert p.name not in REGISTRY, p
            assert (p.arity, p.op_class, p.type_rule) == REGISTRY[p.op], p


def test_python_only_primitives():
    assert {p.name: p.op for p in PRIMITIVES.values() if p.name != p.op} == {
        "stop_gradient": "copy"}
    assert [p.name for p in PRIMITIVES.values() if p.stops_gradient] == ["stop_gradient"]


def test_the_import_time_check_fails_for_a_missing_primitive(monkeypatch):
    _primitives._check_every_op_has_a_primitive()
    monkeypatch.delitem(PRIMITIVES, "sin")
    with pytest.raises(RuntimeError, match=re.escape("no primitive for op(s) sin; define them")):
        _primitives._check_every_op_has_a_primitive()


def test_define_checks_against_the_registry():
    with pytest.raises(RuntimeError, match="'hypot', which is not in the registry"):
        _primitives._define("hypot")
    with pytest.raises(RuntimeError, match="primitive 'add' is defined twice"):
        _primitives._define("add")
    with pytest.raises(RuntimeError, match="records source op 'constant'"):
        _primitives._define("my_constant", op="constant")
    with pytest.raises(RuntimeError, match="'sin' is a registry op"):
        _primitives._define("sin", op="cos")
    with pytest.raises(RuntimeError, match="needs an emitter"):
        _primitives._define("my_reshape", op="reshape")


def needs_vjp(p):
    """Whether `p`'s result can be a float that depends on its operands, by the registry.

    get_element is never bound (scan's emitter adds them, and the scan's tape
    entry has them as its results), so no tape ever holds one.
    """
    return (p.arity != 0 and p.type_rule not in NO_FLOAT_RESULT_RULES and not p.stops_gradient
            and p.name != "get_element")


def test_vjp_rules_exactly_where_the_result_can_be_a_float():
    needed = {n for n, p in PRIMITIVES.items() if needs_vjp(p)}
    have = {n for n, p in PRIMITIVES.items() if p.vjp is not None}
    assert sorted(needed - have) == [], "primitives without a VJP rule"
    assert sorted(have - needed) == [], "VJP rules of primitives without a float result"
    # Those without: comparisons, bitwise ops and shifts, axis_index, top_k and sort
    # (positions), stop_gradient.
    assert {"eq", "lt", "and", "not", "shift_left", "axis_index", "top_k", "sort",
            "stop_gradient"} <= (set(PRIMITIVES) - have)
    assert dict(_autodiff.VJP_RULES) == {n: PRIMITIVES[n].vjp for n in have}


def test_a_rule_is_set_once():
    with pytest.raises(ValueError, match="primitive 'sin' has a VJP rule already"):
        PRIMITIVES["sin"].def_vjp(lambda ct, ops, out, params, needs: [ct])


# --- Each emitter records its op ------------------------------------------------------

F32 = ("float32", (3,))

# Operands (dtype, per-shard shape) and parameters of one call of each primitive the
# registry's type rule does not type (collectives get axis_name="i" too).
EXAMPLES = {
    "convert": ([F32], {"dtype": "float64"}),
    "bitcast_convert_type": ([("uint32", (3,))], {"dtype": "float32"}),
    "select": ([("bool", (3,)), F32, F32], {}),
    "simulated_compute": ([F32], {"microseconds": 1.0}),
    "reduce": ([("float32", (2, 3))], {"axes": [1], "keepdims": False}),  # with each kind
    "copy": ([F32], {}),
    "stop_gradient": ([F32], {}),
    "reshape": ([("float32", (2, 3))], {"shape": [3, 2]}),
    "broadcast_to": ([F32], {"shape": [2, 3]}),
    "transpose": ([("float32", (2, 3))], {"perm": [1, 0]}),
    "slice": ([("float32", (4,))], {"start": [1], "limit": [3], "step": [1]}),
    "rev": ([F32], {"axes": [0]}),
    "pad": ([F32], {"lo": [1], "hi": [0], "interior": [0]}),
    "concatenate": ([("float32", (2,)), F32], {"axis": 0}),
    "take": ([("float32", (4,)), ("int32", (2,))], {"axis": 0}),
    "scatter": ([("float32", (4,)), ("int32", (2,)), ("float32", (2,))],
                {"combiner": "add", "axis": 0, "size": 4}),
    "top_k": ([("float32", (2, 4))], {"k": 2}),
    "sort": ([("float32", (2, 4))], {"descending": False}),
    "cumulative": ([("float32", (2, 4))], {"combiner": "mul", "axis": 1, "reverse": True}),
    "matmul": ([("float32", (2, 3)), ("float32", (3, 2))], {}),
    "cholesky": ([("float32", (3, 3))], {}),
    "triangular_solve": ([("float32", (3, 3)), ("float32", (3, 2))],
                         {"lower": True, "unit_diagonal": False, "transpose_a": True}),
    "psum": ([F32], {}),
    "pmean": ([F32], {}),
    "pmax": ([F32], {}),
    "pmin": ([F32], {}),
    "axis_index": ([], {}),
    "all_gather": ([F32], {"axis": 0}),
    "ppermute": ([F32], {"perm": [(0, 1), (1, 0)]}),
    "all_to_all": ([("float32", (2, 3))], {"split_axis": 0, "concat_axis": 1}),
    "psum_scatter": ([("float32", (2, 3))], {"scatter_dimension": 0}),
}


def example(p):
    """(operands, params) of a call of primitive `p`."""
    if p.op_class == "elementwise" and p.type_rule != "own":
        dtype = ("bool" if p.type_rule in BOOL_OPERAND_RULES
                 else "int32" if p.type_rule in INT_OPERAND_RULES else "float32")
        return [(dtype, (3,))] * p.arity, {}
    operands, params = EXAMPLES[p.name]
    if p.op_class == "collective":
        params = dict(params, axis_name="i")
    return operands, params


def output_op(text):
    """The op (with its bracketed attributes) that computes the function's output, or None."""
    out = re.search(r"^  return (%\d+)$", text, re.M).group(1)
    m = re.search(rf"^  {out} = (\S+) ", text, re.M)
    return m and m.group(1)


def traced(tpus, fn, operands):
    """The IR text and output dtype of `fn` (on traced operands of these types) under pmap."""
    args = [np.zeros((2,) + shape, dtype) for dtype, shape in operands] or [np.zeros(2)]
    f = pw.pmap(lambda *xs: fn(*xs[:len(operands)]), devices=tpus, axis_name="i")
    return f.as_text(*args), np.dtype(f.compiled(*args).output_types()[0][1])


def test_every_primitive_has_an_example():
    # (The primitives with several results have tests of their own, below.)
    assert sorted(n for n, p in PRIMITIVES.items() if not (
        p.op_class == "elementwise" and p.type_rule != "own") and p.op_class != "control"
        and not p.multiple_results and n not in EXAMPLES) == []
    assert sorted(set(EXAMPLES) - set(PRIMITIVES)) == []


@pytest.mark.parametrize("name", [n for n, p in PRIMITIVES.items()
                                  if n != "reduce" and p.op_class != "control"
                                  and not p.multiple_results]
                         + [f"reduce:{k}" for k in REDUCE_KINDS])
def test_emitter_records_its_op(tpus2, name):
    name, _, kind = name.partition(":")
    p = PRIMITIVES[name]
    operands, params = example(p)
    if kind:
        params = dict(params, kind=kind)
    text, dtype = traced(tpus2, lambda *xs: bind(_state.function, p, xs, **params), operands)
    op = output_op(text)
    assert op is not None, (name, text)
    if kind:
        assert op.startswith(f"{kind}[axes="), (name, text)  # IR text names a reduce by its kind
    else:
        assert op.split("[")[0] == p.op, (name, text)
    # By name too.
    assert output_op(traced(tpus2, lambda *xs: bind(_state.function, name, xs, **params),
                            operands)[0]) == op
    if dtype.kind == "f" and not p.stops_gradient:
        assert p.vjp is not None, f"{name} has a float result and no VJP rule"


def test_the_control_primitives_record_a_scan_and_its_elements(tpus2):
    """scan binds to a list of values (get_element ops of its tuple); get_element's emitter
    takes a tuple apart, which only a builder's scan gives."""
    b = _core.FunctionBuilder("body", "")
    x = b.parameter("float32", [3])
    body = b.build([b.binary("mul", x, x), b.reduce("sum", x, None, False)])
    params = dict(body=body, num_carries=1, num_xs=0, length=2, reverse=False)
    for prim in ("scan", PRIMITIVES["scan"]):
        results = []

        def fn(x):
            results.append(bind(_state.function, prim, (x,), **params))
            return results[-1][1]

        text, dtype = traced(tpus2, fn, [F32])
        assert isinstance(results[0], list) and [r.shape for r in results[0]] == [(3,), (2,)]
        assert output_op(text) == "get_element[1]", text
        assert "scan[length=2,carries=1,xs=0]" in text
        assert dtype == np.float32
    assert PRIMITIVES["scan"].vjp is not None and PRIMITIVES["get_element"].vjp is None
    f = _core.FunctionBuilder("f", "")
    y = f.parameter("float32", [3])
    first, second = PRIMITIVES["scan"].emit(f, y, **params)
    tuple_id = first - 1  # the elements follow their scan
    again = PRIMITIVES["get_element"].emit(f, tuple_id, 1)
    assert f.shape(again) == (2,) and again > second
    with pytest.raises(ValueError, match="is a tuple"):
        f.shape(tuple_id)
    with pytest.raises(ValueError, match="get_element: operand %0 is f32\\[3\\], not a tuple"):
        PRIMITIVES["get_element"].emit(f, y, 0)


def test_svd_lu_eigh_and_qr_bind_to_their_elements(tpus2):
    """svd, lu, eigh and qr record one op each, whose tuple get_element ops take apart, and
    bind to its elements (u, s, vt; lu, pivots, permutation; w, v; q, r)."""
    for full, shapes in ((False, [(4, 3), (3,), (3, 3)]), (True, [(4, 4), (3,), (3, 3)])):
        results = []

        def fn(x):
            results.append(bind(_state.function, "svd", (x,), full_matrices=full))
            return results[-1][1]

        text, dtype = traced(tpus2, fn, [("float64", (4, 3))])
        assert [r.shape for r in results[0]] == shapes
        assert output_op(text) == "get_element[1]", text
        assert re.search(r"= svd(\[full_matrices\])? %\d+ : \(f64\[", text), text
        assert ("svd[full_matrices]" in text) == full
        assert dtype == np.float64
    assert PRIMITIVES["svd"].vjp is not None and PRIMITIVES["svd"].multiple_results
    results = []

    def lu(x):
        results.append(bind(_state.function, "lu", (x,)))
        return results[-1][0]

    text, dtype = traced(tpus2, lu, [("float32", (3, 3))])
    assert [(r.shape, r.dtype) for r in results[0]] == [
        ((3, 3), np.float32), ((3,), np.int32), ((3,), np.int32)]
    assert output_op(text) == "get_element[0]" and re.search(r"= lu %\d+ : \(f32\[3,3\], i32\[3\], "
                                                             r"i32\[3\]\)", text), text
    assert PRIMITIVES["lu"].vjp is not None and PRIMITIVES["lu"].multiple_results
    results = []

    def eigh(x):
        results.append(bind(_state.function, "eigh", (x,)))
        return results[-1][1]

    text, dtype = traced(tpus2, eigh, [("float64", (3, 3))])
    assert [r.shape for r in results[0]] == [(3,), (3, 3)]
    assert output_op(text) == "get_element[1]" and "= eigh %" in text, text
    assert PRIMITIVES["eigh"].vjp is not None and PRIMITIVES["eigh"].multiple_results
    results = []

    def qr(x):
        results.append(bind(_state.function, "qr", (x,), full_matrices=True))
        return results[-1][0]

    text, dtype = traced(tpus2, qr, [("float64", (4, 3))])
    assert [r.shape for r in results[0]] == [(4, 4), (4, 3)]
    assert output_op(text) == "get_element[0]" and "= qr[full_matrices] %" in text, text
    assert PRIMITIVES["qr"].vjp is not None and PRIMITIVES["qr"].multiple_results
    f = _core.FunctionBuilder("f", "")
    with pytest.raises(ValueError, match="svd: operand must be float32 or float64, got i32"):
        PRIMITIVES["svd"].emit(f, f.parameter("int32", [3, 3]), full_matrices=False)


def test_arity_is_checked_by_bind(tpus2):
    def f(x):
        trace = _state.function
        with pytest.raises(TypeError, match="primitive 'add' takes 2 operands, got 1"):
            bind(trace, "add", (x,))
        with pytest.raises(TypeError, match="primitive 'concatenate' takes one or more "
                                            "operands, got 0"):
            bind(trace, "concatenate", (), axis=0)
        return x

    pw.pmap(f, devices=tpus2).as_text(np.zeros((2, 3)))


@pytest.mark.parametrize("name", [n for n, p in PRIMITIVES.items() if p.symbol])
def test_tracer_operator_symbols_bind_their_primitive(tpus2, name):
    p = PRIMITIVES[name]
    operands, _ = example(p)
    if p.arity == 2:
        fn = lambda x, y: eval(f"x {p.symbol} y")  # noqa: E731
    else:
        fn = lambda x: eval(f"{p.symbol}x")  # noqa: E731
    assert output_op(traced(tpus2, fn, operands)[0]) == p.op


# --- FunctionBuilder.binary / .unary take the registry's binary / unary ops -----------


def builder_with_operands():
    b = _core.FunctionBuilder("f", "")
    return b, {"float32": b.parameter("float32", [3]), "bool": b.parameter("bool", [3]),
               "int32": b.parameter("int32", [3])}


@pytest.mark.parametrize("name", list(REGISTRY) + ["atan2"])
def test_builder_binary_and_unary_take_the_registrys_ops(name):
    b, values = builder_with_operands()
    type_rule = REGISTRY[name][2] if name in REGISTRY else "own"
    x = values["bool" if type_rule in BOOL_OPERAND_RULES
               else "int32" if type_rule in INT_OPERAND_RULES else "float32"]
    if name in REGISTRY and is_binary(name):
        assert b.binary(name, x, x) > x
    else:
        with pytest.raises(ValueError, match=re.escape(f"unknown binary op '{name}'; known: ")):
            b.binary(name, x, x)
    if name in REGISTRY and is_unary(name):
        assert b.unary(name, x) > x
    else:
        with pytest.raises(ValueError, match=re.escape(f"unknown unary op '{name}'; known: ")):
            b.unary(name, x)


def test_builder_lists_the_registrys_binary_and_unary_ops():
    b, values = builder_with_operands()
    for method, is_kind in (("binary", is_binary), ("unary", is_unary)):
        args = (values["float32"],) * (2 if method == "binary" else 1)
        with pytest.raises(ValueError) as e:
            getattr(b, method)("nope", *args)
        known = str(e.value).split("; known: ")[1].split(", ")
        assert known == [n for n in REGISTRY if is_kind(n)], method
