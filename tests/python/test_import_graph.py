"""python/pathways is an import graph without cycles, in layers.

The graph is read from the source with `ast`: every module under
python/pathways is a node, and every import of a pathways module is an edge,
imports inside functions included (they run too, just later); only imports
under `if TYPE_CHECKING:` are left out. `from pathways import x` is an edge to
the module `pathways.x` when there is one, else to `pathways` (the package's
__init__); `pathways._core`, the compiled extension, is a leaf.

The layers, bottom up; no module imports one of a higher layer (imports within
a layer are allowed, and have no cycles either):

1. runtime: the extension and what needs no tracing (`_core`, `_checks`,
   `_trace_state`, `_pytree`, `tree_util`, `_devices`, `_hosts`,
   `_ray_hosts`, `_diagnose`, `testing`, `host`).
2. core: the primitives and the function trace (`_primitives`: one
   `Primitive` per op; `_tracer`: `Tracer`, the trace, `bind`,
   `stop_gradient`), as JAX's core.
3. transformations: `_autodiff` (the tape, the backward walk, `grad`),
   `_custom_derivatives`, `_control_flow`. They read each primitive's rules
   from its `Primitive`, which a higher layer fills in, and run a function
   called outside any trace through the front end's pmap that `_pmap`
   registers in `_trace_state`.
4. ops: `pathways.numpy` (it installs Tracer's numpy methods and operators
   on the class), `_collectives`, `lax`, `random`, `nn`, `optim`.
5. rules: `_vjp_rules`, the VJP rules, written with pathways.numpy and set on
   the primitives (`Primitive.def_vjp`) when the package imports it.
6. front ends: `_jax_frontend` (JAX's jaxprs lowered with the ops), `_pmap`,
   `_jit`, `_vjp`, `_program`, `_dynamic`, `_tenancy`, `_tracing`.
7. package: `pathways` (`pathways/__init__.py`), the public names.

README.md ("python/pathways in layers") says the same.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

_PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "python" / "pathways"

LAYERS = (
    ("runtime", ("pathways._core", "pathways._checks", "pathways._trace_state", "pathways._pytree",
                 "pathways.tree_util", "pathways._devices", "pathways._hosts", "pathways._ray_hosts",
                 "pathways._diagnose", "pathways.testing", "pathways.host",
                 "pathways._service", "pathways.server", "pathways._checkpoint_io", "pathways.checkpointing")),
    ("core", ("pathways._primitives", "pathways._tracer")),
    ("transformations", ("pathways._autodiff", "pathways._custom_derivatives",
                         "pathways._control_flow")),
    ("ops", ("pathways.numpy", "pathways.numpy.*", "pathways._collectives", "pathways.lax",
             "pathways.random", "pathways.nn", "pathways.optim")),
    ("rules", ("pathways._vjp_rules",)),
    ("front ends", ("pathways._jax_frontend", "pathways._pmap", "pathways._jit", "pathways._vjp",
                    "pathways._program", "pathways._dynamic", "pathways._tenancy",
                    "pathways._tracing", "pathways.elastic")),
    ("package", ("pathways",)),
)


def _modules(package: pathlib.Path) -> dict:
    """Module name -> source file, for every .py under `package` (and the extension, None)."""
    modules: dict = {"pathways._core": None}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _type_checking_only(tree: ast.AST) -> set:
    """The ids of the nodes under `if TYPE_CHECKING:` (or `typing.TYPE_CHECKING`), else-branches not."""
    skipped: set = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.If):
            continue
        test = node.test
        name = test.id if isinstance(test, ast.Name) else test.attr if isinstance(test, ast.Attribute) else None
        if name == "TYPE_CHECKING":
            for stmt in node.body:
                skipped.update(id(n) for n in ast.walk(stmt))
    return skipped


def _imported(node: ast.AST, module: str, is_package: bool, modules: dict) -> list:
    """The pathways modules an Import or ImportFrom node of `module` imports."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name in modules]
    base = node.module or ""
    if node.level:
        package = module.split(".")
        if not is_package:
            package = package[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join(package + ([base] if base else []))
    if base != "pathways" and not base.startswith("pathways."):
        return []
    out = []
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        out.append(sub if sub in modules else base)
    return [m for m in out if m in modules]


def import_graph(package: pathlib.Path = _PACKAGE) -> dict:
    """Module -> {(imported module, line)} of the package under `package`."""
    modules = _modules(package)
    graph: dict = {}
    for module, path in modules.items():
        graph[module] = set()
        if path is None:
            continue
        tree = ast.parse(path.read_text(), str(path))
        skipped = _type_checking_only(tree)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in skipped:
                for target in _imported(node, module, path.name == "__init__.py", modules):
                    if target != module:
                        graph[module].add((target, node.lineno))
    return graph


def strongly_connected_components(graph: dict) -> list:
    """Tarjan's algorithm, iterative: the components of `graph` (node -> successors)."""
    index: dict = {}
    low: dict = {}
    stack: list = []
    on_stack: set = set()
    components: list = []
    for root in graph:
        if root in index:
            continue
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        work = [(root, iter(graph[root]))]
        while work:
            node, successors = work[-1]
            for succ in successors:
                if succ not in index:
                    index[succ] = low[succ] = len(index)
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(graph[succ])))
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        m = stack.pop()
                        on_stack.discard(m)
                        component.append(m)
                        if m == node:
                            break
                    components.append(component)
    return components


def _a_cycle(component: list, graph: dict) -> list:
    """A cycle through the component's first module (sorted): a shortest path back to it."""
    members = set(component)
    start = min(component)
    paths = {start: [(start, None)]}
    frontier = [start]
    while frontier:
        nxt = []
        for node in frontier:
            for target, line in sorted(graph[node]):
                if target == start:
                    return paths[node] + [(start, line)]
                if target in members and target not in paths:
                    paths[target] = paths[node] + [(target, line)]
                    nxt.append(target)
        frontier = nxt
    raise AssertionError(f"no cycle through {start} in {sorted(component)}")


def _describe(cycle: list) -> str:
    text = cycle[0][0]
    for module, line in cycle[1:]:
        text += f" -(line {line})-> {module}"
    return text


def _layer_of(module: str) -> int:
    for i, (_, members) in enumerate(LAYERS):
        for member in members:
            if module == member or (member.endswith(".*") and module.startswith(member[:-1])):
                return i
    raise AssertionError(f"{module} is in no layer: add it to LAYERS in {__file__} and to README.md")


@pytest.fixture(scope="module")
def graph() -> dict:
    return import_graph()


def test_the_graph_reader_sees_function_level_imports_and_skips_type_checking_ones(tmp_path):
    package = tmp_path / "pathways"
    (package / "numpy").mkdir(parents=True)
    (package / "__init__.py").write_text("from pathways import a\nfrom . import numpy\n")
    (package / "a.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from pathways import b\nelse:\n    import pathways.c\n"
        "def f():\n    from pathways.numpy import zeros\n")
    (package / "b.py").write_text("from .numpy._x import y\nfrom pathways import _core\n")
    (package / "c.py").write_text("import os\n")
    (package / "numpy" / "__init__.py").write_text("from ._x import y\nfrom .. import b\n")
    (package / "numpy" / "_x.py").write_text("from . import _common\nfrom ._common import z\n")
    g = {m: {t for t, _ in edges} for m, edges in import_graph(package).items()}
    assert g == {
        "pathways": {"pathways.a", "pathways.numpy"},
        "pathways.a": {"pathways.c", "pathways.numpy"},
        "pathways.b": {"pathways.numpy._x", "pathways._core"},
        "pathways.c": set(),
        "pathways.numpy": {"pathways.numpy._x", "pathways.b"},
        "pathways.numpy._x": {"pathways.numpy"},  # no module numpy._common: the package
        "pathways._core": set(),
    }
    sccs = [sorted(c) for c in strongly_connected_components(g) if len(c) > 1]
    assert sccs == [["pathways.b", "pathways.numpy", "pathways.numpy._x"]]


def test_the_package_imports_no_module_in_a_cycle(graph):
    successors = {m: {t for t, _ in edges} for m, edges in graph.items()}
    cycles = [c for c in strongly_connected_components(successors) if len(c) > 1]
    assert not cycles, "import cycles in python/pathways (imports inside functions count):\n" + "\n".join(
        f"{len(c)} modules {sorted(c)}, e.g. {_describe(_a_cycle(c, graph))}" for c in cycles)


def test_no_module_imports_one_of_a_higher_layer(graph):
    upward = []
    for module, edges in sorted(graph.items()):
        for target, line in sorted(edges):
            if _layer_of(target) > _layer_of(module):
                upward.append(f"{module} (layer {LAYERS[_layer_of(module)][0]}) imports {target} "
                              f"(layer {LAYERS[_layer_of(target)][0]}) at line {line}")
    assert not upward, "\n".join(upward)


def test_every_layer_names_existing_modules(graph):
    for name, members in LAYERS:
        for member in members:
            if member.endswith(".*"):
                assert any(m.startswith(member[:-1]) for m in graph), (name, member)
            else:
                assert member in graph, (name, member)
