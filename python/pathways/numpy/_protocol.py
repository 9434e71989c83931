"""numpy's own functions on traced values.

`np.sum(x)` or `np.exp(x)` of a traced value comes here (numpy's
__array_function__ and __array_ufunc__ protocols, NEP 18 and 13) and calls
the namesake of pathways.numpy, as `np.sum` of a JAX array calls its method.
numpy functions pathways.numpy lacks raise TracerError naming them.
"""

from __future__ import annotations

import functools as _functools
import inspect as _inspect
import sys as _sys
from typing import Any

from pathways._trace_state import TracerError
from pathways._tracer import Tracer

# numpy functions that only read the static shape.
_SHAPE_FUNCTIONS = {
    "shape": lambda a: a.shape,
    "ndim": lambda a: a.ndim,
    "size": lambda a, axis=None: a.size if axis is None else a.shape[axis],
}


def _no_numpy(x: Tracer, what: str, why: str) -> TracerError:
    return TracerError(
        f"{what} of a traced value ({x.aval} in {x._trace.where()}): {why}; numpy cannot "
        "compute on traced values, which have no data while the function is traced: use "
        "the operators (+ - * / ...) and pathways.numpy (pw.numpy) functions"
    )


@_functools.lru_cache(maxsize=None)
def _signature(fn: Any) -> _inspect.Signature:
    return _inspect.signature(fn)


def _call_namesake(x: Tracer, what: str, name: str, args: tuple, kwargs: dict,
                   module: str = "pathways.numpy") -> Any:
    """`module`'s `name` on numpy's arguments; TracerError if there is none or it does
    not take them. Keywords given as None (`out=None`, `dtype=None`) are numpy's
    defaults, and dropped."""
    pnp = _sys.modules[module]
    fn = getattr(pnp, name) if name in pnp.__all__ else None
    if fn is None:
        raise _no_numpy(x, what, f"{module} has no {name}")
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    try:
        _signature(fn).bind(*args, **kwargs)
    except TypeError as e:
        raise _no_numpy(
            x, what, f"it calls pathways.numpy.{name}, which does not take these arguments ({e})"
        ) from None
    return fn(*args, **kwargs)


def _numpy_function(x: Tracer, func: Any, args: tuple, kwargs: dict) -> Any:
    """`func(*args, **kwargs)`, a numpy function called with traced value `x` among its arguments."""
    x._check()
    name = func.__name__
    if name in _SHAPE_FUNCTIONS:
        return _SHAPE_FUNCTIONS[name](*args, **kwargs)
    if getattr(func, "__module__", "") == "numpy.linalg":
        # numpy.linalg's own (norm), or its aliases of numpy's (matmul, outer ...).
        where = "pathways.numpy" if name in _sys.modules["pathways.numpy"].__all__ else "pathways.numpy.linalg"
        return _call_namesake(x, f"numpy.linalg.{name}", name, args, kwargs, where)
    return _call_namesake(x, f"numpy.{name}", name, args, kwargs)


def _numpy_ufunc(x: Tracer, ufunc: Any, method: str, inputs: tuple, kwargs: dict) -> Any:
    """`ufunc` (called, or its `method`: reduce, accumulate ...) with traced value `x` among `inputs`.

    numpy's operators on arrays are ufuncs too: `np_array + x` comes here as
    `numpy.add`, and `np_array < x` as `numpy.less`.
    """
    x._check()
    if method != "__call__":
        raise _no_numpy(
            x, f"numpy.{ufunc.__name__}.{method}", "ufunc methods are not supported (for "
            "numpy.add.reduce use pathways.numpy.sum)"
        )
    return _call_namesake(x, f"numpy.{ufunc.__name__}", ufunc.__name__, inputs, kwargs)
