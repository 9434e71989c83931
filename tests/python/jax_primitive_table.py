"""Prints the README's table of JAX primitives, measured: for each primitive with a lowering
(pathways._jax_frontend.RULES), the function-IR ops its lowering recorded and the tests that
lowered it, found by running the front end's tests with every rule and every op emitter watched.

Usage (from tests/python): ../../.venv/bin/python jax_primitive_table.py [--write-readme] [pytest args]
With --write-readme the table replaces the one under "### JAX primitives and their lowering" in
README.md. `test_jax_frontend.py::test_readme_primitive_table_lists_every_rule` checks that the
README's table names exactly the primitives that have a rule.
"""

from __future__ import annotations

import collections
import pathlib
import sys

import pytest

ops_of: dict = collections.defaultdict(set)
tests_of: dict = collections.defaultdict(set)
_stack: list = []
_test: list = [""]


class _Recorder:
    def pytest_configure(self, config):
        from pathways import _jax_frontend, _primitives

        for name, rule in list(_jax_frontend.RULES.items()):
            def watched(ctx, *args, _rule=rule, _name=name, **params):
                _stack.append(_name)
                tests_of[_name].add(_test[0])
                try:
                    return _rule(ctx, *args, **params)
                finally:
                    _stack.pop()

            _jax_frontend.RULES[name] = watched
        for prim in _primitives.PRIMITIVES.values():
            def emit(*args, _emit=prim.emit, _op=prim.op, **params):
                if _stack:
                    ops_of[_stack[-1]].add(_op)
                return _emit(*args, **params)

            prim.emit = emit

    def pytest_runtest_setup(self, item):
        _test[0] = f"{item.path.name}::{item.originalname}"


README = pathlib.Path(__file__).resolve().parents[2] / "README.md"
SECTION = "### JAX primitives and their lowering"


def table() -> list:
    from pathways import _jax_frontend

    rows = ["| JAX primitive | IR ops | tested in |", "|---|---|---|"]
    for name in sorted(_jax_frontend.RULES):
        ops = ", ".join(f"`{o}`" for o in sorted(ops_of.get(name, ()))) or "inline or identity"
        tests = sorted(tests_of.get(name, ()))
        shown = ", ".join(f"`{t.split('::')[1]}`" for t in tests[:2]) + (
            f" (+{len(tests) - 2})" if len(tests) > 2 else "")
        rows.append(f"| `{name}` | {ops} | {shown or 'NOT TESTED'} |")
    return rows


def write_readme(rows: list) -> None:
    head, rest = README.read_text().split(SECTION, 1)
    section, tail = rest.split("\n### ", 1)
    lines = section.split("\n")
    first = next(i for i, line in enumerate(lines) if line.startswith("|"))
    last = max(i for i, line in enumerate(lines) if line.startswith("|"))
    lines[first:last + 1] = rows
    README.write_text(head + SECTION + "\n".join(lines) + "\n### " + tail)


def main(argv: list) -> int:
    write = "--write-readme" in argv
    args = [a for a in argv if a != "--write-readme"] or ["test_jax_frontend.py", "test_jax_models.py"]
    code = pytest.main(["-q", "-p", "no:cacheprovider", *args], plugins=[_Recorder()])
    rows = table()
    print("\n".join(rows))
    if write:
        write_readme(rows)
    return int(code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
