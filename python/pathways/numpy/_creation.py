"""Array creation: `zeros ones full arange linspace eye` and `tril triu`.

Inside a pmap'd function (a function trace is under way) the creation
functions return traced values, as `jax.numpy`'s do inside `jax.jit`: `zeros`,
`ones` and `full` broadcast one scalar constant (the IR holds no array of
zeros), `arange`, `linspace` and `eye` are constants of the IR. Outside any
trace they are numpy's. Dtypes follow numpy's defaults (float64 for floats),
with integers as int32 (uint32 when asked for).
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as _np

from pathways._trace_state import _SUPPORTED_DTYPE_NAMES, _SUPPORTED_DTYPES, _state
from pathways.numpy._common import _trace_of
from pathways.numpy._elementwise import where
from pathways.numpy._shapes import broadcast_to

__all__ = ["zeros", "ones", "full", "arange", "linspace", "eye", "tril", "triu"]


def _shape(name: str, shape: Any) -> tuple:
    """`shape` (an int or a sequence of ints) as a tuple; errors name the parameter."""
    try:
        dims = (operator.index(shape),) if not isinstance(shape, (tuple, list)) else tuple(
            operator.index(d) for d in shape)
    except TypeError:
        raise TypeError(f"{name}: shape must be an int or a sequence of ints, got {shape!r}") from None
    if any(d < 0 for d in dims):
        raise ValueError(f"{name}: negative dimensions are not allowed, got shape {dims}")
    return dims


def _device_dtype(name: str, dtype: Any) -> _np.dtype:
    """numpy's dtype as the devices hold it: integers but uint32 become int32."""
    dt = _np.dtype(dtype)
    if dt.kind in "iu" and dt != _np.uint32:
        dt = _np.dtype(_np.int32)
    if dt not in _SUPPORTED_DTYPES:
        raise TypeError(f"{name}: dtype {dt} is not supported; supported dtypes: "
                        f"{_SUPPORTED_DTYPE_NAMES}")
    return dt


def _filled(name: str, shape: Any, value: Any, dtype: Any) -> Any:
    dims = _shape(name, shape)
    trace = _state.function
    if trace is None:
        return _np.full(dims, value, dtype=dtype)
    dt = _device_dtype(name, _np.asarray(value).dtype if dtype is None else dtype)
    return broadcast_to(trace.constant(_np.asarray(value, dt), None), dims)


def zeros(shape: Any, dtype: Any = float) -> Any:
    """`numpy.zeros`: zeros of `shape` (float64 unless `dtype` is given)."""
    return _filled("zeros", shape, 0, dtype)


def ones(shape: Any, dtype: Any = float) -> Any:
    """`numpy.ones`: ones of `shape` (float64 unless `dtype` is given)."""
    return _filled("ones", shape, 1, dtype)


def full(shape: Any, fill_value: Any, dtype: Any = None) -> Any:
    """`numpy.full`: `fill_value` (a scalar) everywhere; the dtype is `fill_value`'s unless given."""
    if _np.ndim(fill_value) != 0:
        raise ValueError(f"full: fill_value must be a scalar, got shape {_np.shape(fill_value)}")
    return _filled("full", shape, fill_value, dtype)


def _constant(name: str, array: _np.ndarray) -> Any:
    trace = _state.function
    if trace is None:
        return array
    return trace.constant(_np.asarray(array, _device_dtype(name, array.dtype)), None)


def arange(start: Any, stop: Any = None, step: Any = None, dtype: Any = None) -> Any:
    """`numpy.arange` (static bounds); integer results are int32 in a trace."""
    return _constant("arange", _np.arange(start, stop, step, dtype=dtype))


def linspace(start: Any, stop: Any, num: int = 50, endpoint: bool = True, dtype: Any = None) -> Any:
    """`numpy.linspace` (static bounds)."""
    return _constant("linspace", _np.linspace(start, stop, num, endpoint=endpoint, dtype=dtype))


def eye(N: int, M: Any = None, k: int = 0, dtype: Any = float) -> Any:  # noqa: N803 (numpy's)
    """`numpy.eye`: ones on diagonal `k` of an N x M matrix."""
    return _constant("eye", _np.eye(N, M, k, dtype=dtype))


def _triangle(name: str, m: Any, keep: Any) -> Any:
    trace = _trace_of(name, (m,))
    if trace is None:
        return getattr(_np, name)(m, keep[1])
    if m.ndim < 2:
        raise ValueError(f"{name}: operand must have at least 2 dimensions, got {m.aval}")
    rows, cols = m.shape[-2:]
    mask = keep[0](rows, cols)
    return where(mask, m, trace.constant(_np.zeros((), m.dtype), None))


def tril(m: Any, k: int = 0) -> Any:
    """`numpy.tril`: `m` with the elements above diagonal `k` zeroed (last two axes)."""
    k = operator.index(k)
    return _triangle("tril", m, (lambda r, c: _np.tri(r, c, k, dtype=bool), k))


def triu(m: Any, k: int = 0) -> Any:
    """`numpy.triu`: `m` with the elements below diagonal `k` zeroed (last two axes)."""
    k = operator.index(k)
    return _triangle("triu", m, (lambda r, c: ~_np.tri(r, c, k - 1, dtype=bool), k))
