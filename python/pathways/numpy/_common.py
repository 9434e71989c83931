"""What the functions of pathways.numpy share: finding the trace of their arguments, operands, axes.
"""

from __future__ import annotations

from typing import Any

import numpy as _np

from pathways import _checks
from pathways._trace_state import TracerError, _TracerBase
from pathways._tracer import Tracer


def _trace_of(name: str, args: tuple, module: str = "pathways.numpy") -> Any:
    """The function trace of the traced values among `args`, or None if there are none.

    Args:
      name, module: The caller, for messages ("pathways.numpy", "sum").

    Raises:
      TracerError: For a traced program value, or a traced value whose trace ended.
    """
    for a in args:
        if isinstance(a, Tracer):
            return a._check()
        if isinstance(a, _TracerBase):
            raise TracerError(
                f"{module}.{name} of a traced program value ({a.aval}); pass program "
                "values to pmap'd functions as arguments and compute inside them"
            )
    return None


def _traced(name: str, args: tuple) -> bool:
    """True if any argument is a traced value of a pmap'd function."""
    return _trace_of(name, args) is not None

def _broadcasts_to(shape: tuple, target: tuple) -> bool:
    """Whether an array of `shape` broadcasts to `target` (numpy's rule, `target` unchanged)."""
    try:
        return _np.broadcast_shapes(tuple(shape), tuple(target)) == tuple(target)
    except ValueError:
        return False


def _operand(trace: Any, x: Any) -> Tracer:
    """`x` as a traced value of `trace` (numpy values become constants)."""
    if isinstance(x, Tracer):
        x._check()
        return x
    return trace.constant(x, None)


def _axis(name: str, param: str, axis: Any, ndim: int, shape: tuple) -> int:
    """Axis `axis` (parameter `param` of op `name`) of a value of rank `ndim`, made non-negative.

    Raises:
      TypeError: Unless it is an integer (see `_checks.index`).
      ValueError: If it is out of range.
    """
    a = _checks.index(name, param, axis)
    if not -ndim <= a < ndim:
        raise ValueError(f"{name}: {param} {a} is out of range for shape {shape} (rank {ndim})")
    return a + ndim if a < 0 else a

