"""The methods and operators of `Tracer` that pathways.numpy's functions implement.

pathways._tracer, a layer below pathways.numpy, defines `Tracer` with the
operators it binds itself; this module, which pathways.numpy imports,
installs the rest on the class (`x.reshape(2, 3)` is `pathways.numpy.reshape(x,
(2, 3))`, `x // y` is `pathways.numpy.floor_divide(x, y)`, `x[i]`, `x.at[i]`,
and numpy's protocols: `np.sum(x)` calls `pathways.numpy.sum(x)`).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from pathways._tracer import Tracer
from pathways.numpy import (
    _at,
    _elementwise,
    _indexing,
    _linalg,
    _protocol,
    _rearrange,
    _reductions,
    _shapes,
    _sorting,
)


def _via_numpy(fn: Callable[..., Any], reflected: bool = False) -> Callable[..., Any]:
    """A binary operator of Tracer that is `pathways.numpy.<name>(self, other)`
    (`(other, self)` when reflected)."""
    name = fn.__name__

    def method(self: Tracer, other: Any) -> Any:
        self._check()
        return fn(other, self) if reflected else fn(self, other)

    method.__name__ = f"__r{name}__" if reflected else f"__{name}__"
    operands = "other and self" if reflected else "self and other"
    method.__doc__ = f"`pathways.numpy.{name}` of {operands}."
    return method


def _reduction_via_numpy(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A reduction method of Tracer that is `pathways.numpy.<name>(self, axis, keepdims=)`."""
    name = fn.__name__

    def method(self: Tracer, axis: Any = None, *, keepdims: bool = False) -> Any:
        return fn(self, axis=axis, keepdims=keepdims)

    method.__name__ = name
    method.__doc__ = f"`pathways.numpy.{name}` over `axis` (None: all), keeping them if `keepdims`."
    return method


class _Methods:
    """What `install` puts on `Tracer`: the methods of this class body."""

    # numpy functions and ufuncs of a traced value (`np.sum(x)`, `np.exp(x)`, and
    # `np_array * x`, which numpy computes with the ufunc `np.multiply`) call their
    # `pathways.numpy` namesakes, or raise TracerError naming the function.
    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        return _protocol._numpy_ufunc(self, ufunc, method, inputs, kwargs)

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        return _protocol._numpy_function(self, func, args, kwargs)

    __floordiv__ = _via_numpy(_elementwise.floor_divide)
    __rfloordiv__ = _via_numpy(_elementwise.floor_divide, reflected=True)
    __mod__ = _via_numpy(_elementwise.remainder)
    __rmod__ = _via_numpy(_elementwise.remainder, reflected=True)
    __divmod__ = _via_numpy(_elementwise.divmod)
    __rdivmod__ = _via_numpy(_elementwise.divmod, reflected=True)
    prod = _reduction_via_numpy(_reductions.prod)
    any = _reduction_via_numpy(_reductions.any)
    all = _reduction_via_numpy(_reductions.all)
    argmin = _reduction_via_numpy(_reductions.argmin)

    def round(self, decimals: int = 0) -> Any:
        """Rounded to integer values, halves to even, as `pathways.numpy.round`."""
        return _elementwise.round(self, decimals)

    def __matmul__(self, other: Any) -> Any:
        self._check()
        return _linalg.matmul(self, other)

    def __rmatmul__(self, other: Any) -> Any:
        self._check()
        return _linalg.matmul(other, self)

    # --- Shapes (numpy semantics; see pathways.numpy) -------------------------

    def reshape(self, *shape: Any) -> "Tracer":
        """numpy's `reshape`: `x.reshape(2, 3)` or `x.reshape((2, -1))`."""
        return _shapes.reshape(self, shape[0] if len(shape) == 1 else shape)

    def transpose(self, *axes: Any) -> "Tracer":
        """numpy's `transpose`: reversed dims, or `x.transpose(1, 0, 2)`."""
        if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
            axes = tuple(axes[0])
        return _shapes.transpose(self, axes or None)

    def swapaxes(self, axis1: int, axis2: int) -> "Tracer":
        """numpy's `swapaxes`."""
        return _shapes.swapaxes(self, axis1, axis2)

    def squeeze(self, axis: Any = None) -> "Tracer":
        """numpy's `squeeze`."""
        return _shapes.squeeze(self, axis)

    def ravel(self) -> "Tracer":
        """numpy's `ravel`: a 1-d value, row-major."""
        return _shapes.ravel(self)

    flatten = ravel

    def clip(self, a_min: Any = None, a_max: Any = None) -> "Tracer":
        """numpy's `clip`."""
        return _elementwise.clip(self, a_min, a_max)

    def var(self, axis: Any = None, dtype: Any = None, *, keepdims: bool = False) -> "Tracer":
        """numpy's `var` (ddof=0)."""
        return _reductions.var(self, axis, dtype, keepdims=keepdims)

    def std(self, axis: Any = None, dtype: Any = None, *, keepdims: bool = False) -> "Tracer":
        """numpy's `std` (ddof=0)."""
        return _reductions.std(self, axis, dtype, keepdims=keepdims)

    def take(self, indices: Any, axis: Any = None, mode: Optional[str] = None,
             fill_value: Any = None) -> "Tracer":
        """numpy's `take`, with JAX's modes (see `pathways.numpy.take`)."""
        return _indexing.take(self, indices, axis, mode, fill_value)

    def repeat(self, repeats: Any, axis: Any = None) -> "Tracer":
        """numpy's `repeat` (see `pathways.numpy.repeat`)."""
        return _rearrange.repeat(self, repeats, axis)

    def dot(self, b: Any) -> "Tracer":
        """numpy's `dot` (see `pathways.numpy.dot`)."""
        return _linalg.dot(self, b)

    def cumsum(self, axis: Any = None, dtype: Any = None) -> "Tracer":
        """numpy's `cumsum` (see `pathways.numpy.cumsum`)."""
        return _sorting.cumsum(self, axis, dtype)

    def cumprod(self, axis: Any = None, dtype: Any = None) -> "Tracer":
        """numpy's `cumprod` (see `pathways.numpy.cumprod`)."""
        return _sorting.cumprod(self, axis, dtype)

    def sort(self, axis: Any = -1, kind: Optional[str] = None, order: Any = None, *,
             stable: bool = True, descending: bool = False) -> "Tracer":
        """The sorted values, as `jax.Array.sort` (a new value; see `pathways.numpy.sort`)."""
        return _sorting.sort(self, axis, kind, order, stable=stable, descending=descending)

    def argsort(self, axis: Any = -1, kind: Optional[str] = None, order: Any = None, *,
                stable: bool = True, descending: bool = False) -> "Tracer":
        """numpy's `argsort`, int32 (see `pathways.numpy.argsort`)."""
        return _sorting.argsort(self, axis, kind, order, stable=stable, descending=descending)

    @property
    def at(self) -> Any:
        """JAX's indexed updates, out of place: `x.at[idx].set(v)`, `.add(v)`,
        `.subtract(v)`, `.multiply(v)` (`.mul`), `.min(v)`, `.max(v)`, `.get()`. The index
        is any index `x[idx]` takes (ints, slices, None, Ellipsis, integer arrays, int32
        traced values) and constant boolean masks; `v` broadcasts to the shape of
        `x[idx]` and is cast to x's dtype; repeated indices accumulate for add, multiply,
        min and max, and the last update wins for set; out-of-range traced indices are
        dropped (see `pathways.numpy._at`)."""
        self._check()
        return _at._IndexUpdateHelper(self)

    def __getitem__(self, index: Any) -> Any:
        """numpy basic indexing with static indices (ints, slices, None, '...'), plus one
        integer array or int32 traced value (a `take`)."""
        return _at._getitem(self, index)


def install(cls: type) -> None:
    """Puts `_Methods`' methods and operators on `cls` (`Tracer`)."""
    skip = set(vars(type("_Empty", (), {})))
    for name, value in vars(_Methods).items():
        if name not in skip:
            setattr(cls, name, value)


install(Tracer)
