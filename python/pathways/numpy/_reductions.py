"""Reductions: `sum`, `mean`, `max`, `min`, `argmax` (the `Tracer` methods), `var`, `std`.
"""

from __future__ import annotations

from typing import Any

import numpy as _np

from pathways import _checks
from pathways.numpy._common import _trace_of, _traced
from pathways.numpy._elementwise import sqrt


def _reduction(name: str, numpy_fn: Any) -> Any:
    def fn(a: Any, axis: Any = None, keepdims: bool = False) -> Any:
        if _traced(name, (a,)):
            return getattr(a, name)(axis=axis, keepdims=keepdims)
        return numpy_fn(a, axis=axis, keepdims=keepdims)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = (
        f"`numpy.{name}(a, axis=None, keepdims=False)` of a traced value (or of a numpy array); "
        "axis may be None, an int or (except argmax) a tuple; negative axes count from the end."
    )
    return fn


sum = _reduction("sum", _np.sum)  # noqa: A001
mean = _reduction("mean", _np.mean)
max = _reduction("max", _np.max)  # noqa: A001
min = _reduction("min", _np.min)  # noqa: A001
argmax = _reduction("argmax", _np.argmax)

def var(a: Any, axis: Any = None, keepdims: bool = False) -> Any:
    """`numpy.var` (ddof=0): the mean squared deviation from the mean over `axis`."""
    if _trace_of("var", (a,)) is None:
        return _np.var(a, axis=axis, keepdims=keepdims)
    axis = _checks.axes("var", "axis", axis)
    centered = a - mean(a, axis=axis, keepdims=True)
    return mean(centered * centered, axis=axis, keepdims=keepdims)


def std(a: Any, axis: Any = None, keepdims: bool = False) -> Any:
    """`numpy.std` (ddof=0): the square root of `var`."""
    if _trace_of("std", (a,)) is None:
        return _np.std(a, axis=axis, keepdims=keepdims)
    axis = _checks.axes("std", "axis", axis)
    return sqrt(var(a, axis=axis, keepdims=keepdims))

