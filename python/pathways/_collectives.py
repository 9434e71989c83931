"""The collectives of pmap'd functions, like `jax.lax`'s: `psum`, `pmean`, `all_gather`, ...

Each binds its primitive to every leaf of a pytree, inside a function traced
by `pw.pmap` with the axis name it is given; `simulated_compute` too.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import numpy as np

from pathways import _checks
from pathways._pytree import tree_flatten, tree_unflatten
from pathways._trace_state import TracerError, _state, _TracerBase
from pathways._tracer import Tracer, _FunctionTrace, bind

__all__ = [
    "psum",
    "pmean",
    "pmax",
    "pmin",
    "axis_index",
    "all_gather",
    "ppermute",
    "all_to_all",
    "psum_scatter",
    "simulated_compute",
]


def _axis_name(axis_name: Any) -> Any:
    """`axis_name` as the one name a pmap binds: JAX's tuple of names holds one here."""
    if isinstance(axis_name, (tuple, list)) and len(axis_name) == 1:
        return axis_name[0]
    return axis_name


def _bound_trace(name: str, axis_name: str) -> "_FunctionTrace":
    """The active trace if it binds `axis_name`; NameError otherwise."""
    trace = _state.function
    if trace is None:
        raise NameError(
            f"unbound axis name: {axis_name!r} ({name} must be called inside a function "
            f"traced by pw.pmap with axis_name={axis_name!r})"
        )
    if trace.axis_name is None or axis_name != trace.axis_name:
        bound = "no axis name" if trace.axis_name is None else repr(trace.axis_name)
        raise NameError(f"unbound axis name: {axis_name!r} ({trace.where()} binds {bound})")
    return trace


def _pcollective(name: str, x: Any, axis_name: str) -> Any:
    return _map_leaves(name, x, axis_name)


def pmean(x: Any, axis_name: str) -> Any:
    """Mean of `x` over the devices of axis `axis_name`, like `jax.lax.pmean`.

    A float leaf keeps its type. An integer leaf (int32, uint32, or a Python
    int or bool) gives float64: like JAX's `psum(x) / n`, the mean is not
    truncated (the sum wraps as psum's does).

    Raises:
      NameError: If `axis_name` is not bound by the enclosing pmap.
      TypeError: For a bool array leaf.
    """
    leaves, treedef = tree_flatten(x)

    def mean(leaf: Any) -> Any:
        if isinstance(leaf, int) and not isinstance(leaf, np.generic):
            leaf = float(leaf)  # a Python int or bool: JAX's psum(x) / n
        dtype = leaf.dtype if isinstance(leaf, Tracer) else np.asarray(leaf).dtype
        if np.issubdtype(dtype, np.integer):
            # The count in the leaf's dtype: uint32 / int32 would promote to int32 (JAX's
            # rule), reading a sum above 2**31 - 1 as negative.
            count = _pcollective("psum", np.ones((), dtype), axis_name)
            return _pcollective("psum", leaf, axis_name) / count
        return _pcollective("pmean", leaf, axis_name)

    return tree_unflatten(treedef, [mean(leaf) for leaf in leaves])


def pmax(x: Any, axis_name: str) -> Any:
    """Elementwise maximum of `x` over the devices of axis `axis_name`, like `jax.lax.pmax`."""
    return _pcollective("pmax", x, axis_name)


def pmin(x: Any, axis_name: str) -> Any:
    """Elementwise minimum of `x` over the devices of axis `axis_name`, like `jax.lax.pmin`."""
    return _pcollective("pmin", x, axis_name)


def axis_index(axis_name: str) -> Tracer:
    """The index of this device along the pmap'd axis `axis_name` (an int32 scalar).

    Raises:
      NameError: If `axis_name` is not bound by the enclosing pmap.
    """
    axis_name = _axis_name(axis_name)
    trace = _bound_trace("axis_index", axis_name)
    return bind(trace, "axis_index", (), axis_name=axis_name)


def _map_leaves(
    name: str, x: Any, axis_name: Any, apply: Optional[Callable[..., Tracer]] = None,
    **params: Any,
) -> Any:
    """Binds collective `name` over axis `axis_name` to every leaf of pytree `x`.

    `apply(trace, leaf, axis_name)`, when given, binds it to one leaf (JAX's
    untiled all_to_all and tiled all_gather and psum_scatter are reshapes
    around the one op we have); `params` are the op's otherwise.
    """
    axis_name = _axis_name(axis_name)
    trace = _bound_trace(name, axis_name)
    leaves, treedef = tree_flatten(x)
    out = []
    for leaf in leaves:
        if isinstance(leaf, Tracer):
            leaf._check()
        elif isinstance(leaf, _TracerBase):
            raise TracerError(
                f"{name} of a traced program value ({leaf.aval}) inside {trace.where()}; pass "
                "program values to pmap'd functions as arguments"
            )
        else:
            leaf = trace.constant(leaf, None)
        if apply is not None:
            out.append(apply(trace, leaf, axis_name))
        else:
            out.append(bind(trace, name, (leaf,), axis_name=axis_name, **params))
    return tree_unflatten(treedef, out)


def _tiled(where: str, tiled: Any) -> bool:
    if not isinstance(tiled, (bool, np.bool_)):
        raise TypeError(f"{where}: tiled must be a bool, got {tiled!r}")
    return bool(tiled)


def _axis_in(where: str, name: str, axis: int, leaf: Tracer) -> int:
    """`axis` (negative from the end) of `leaf`; ValueError naming it if out of range."""
    ndim = len(leaf.shape)
    if not -ndim <= axis < ndim:
        raise ValueError(f"{where}: {name} {axis} is out of range for {leaf.aval}")
    return axis % ndim


def _devices(trace: _FunctionTrace, where: str) -> int:
    n = trace.builder.axis_size
    if not n:
        raise ValueError(f"{where} in {trace.where()}: the number of devices is not known")
    return n


def all_gather(x: Any, axis_name: str, axis: int = 0, *, tiled: bool = False) -> Any:
    """Every device's `x` stacked along a new axis `axis`, like `jax.lax.all_gather`.

    The new axis has size the number of devices of the pmap; entry `i` is the
    value of device `i`. With `tiled=True` (as JAX's) the values are
    concatenated along the existing axis `axis` instead, which becomes that
    many times longer.

    Raises:
      NameError: If `axis_name` is not bound by the enclosing pmap.
      ValueError: If `axis` is out of range (tiled: also for a scalar).
      TypeError: If `tiled` is not a bool.
    """
    a = _checks.index("all_gather", "axis", axis)
    if not _tiled("all_gather", tiled):
        return _map_leaves("all_gather", x, axis_name, axis=a)

    def tiled_gather(trace: _FunctionTrace, leaf: Tracer, name: str) -> Tracer:
        shape = tuple(leaf.shape)
        ax = _axis_in("all_gather (tiled)", "axis", a, leaf)
        n = _devices(trace, "all_gather")
        stacked = bind(trace, "all_gather", (leaf,), axis_name=name, axis=ax)
        return stacked.reshape(shape[:ax] + (n * shape[ax],) + shape[ax + 1:])

    return _map_leaves("all_gather", x, axis_name, tiled_gather)


def ppermute(x: Any, axis_name: str, perm: Sequence[tuple]) -> Any:
    """Sends `x` from device `source` to device `destination` for each pair of `perm`.

    Like `jax.lax.ppermute`: devices that are no pair's destination receive
    zeros. Each source and destination may appear at most once.

    Raises:
      TypeError: If `perm` is not a sequence of pairs of ints.
      NameError: If `axis_name` is not bound by the enclosing pmap.
      ValueError: For an out-of-range or repeated source or destination.
    """
    return _map_leaves("ppermute", x, axis_name, perm=_checks.int_pairs("ppermute", "perm", perm))


def all_to_all(
    x: Any, axis_name: str, split_axis: int, concat_axis: int, *, tiled: bool = False
) -> Any:
    """Exchanges chunks between the devices, like `jax.lax.all_to_all`.

    Each device splits `x` along `split_axis` into as many equal chunks as
    there are devices and sends chunk `i` to device `i`; each device joins the
    chunks it receives, in device order. As in JAX:

    * `tiled=False` (the default): `x.shape[split_axis]` must be the number
      of devices; the result drops `split_axis` and has a new axis of that
      size at `concat_axis` (a position in the result) holding the chunks.
    * `tiled=True`: the chunks are joined along the existing `concat_axis`:
      the result's `split_axis` is that many times shorter and its
      `concat_axis` that many times longer.

    Raises:
      NameError: If `axis_name` is not bound by the enclosing pmap.
      ValueError: If an axis is out of range, or `split_axis`'s size is not
        the number of devices (tiled: does not divide by it).
      TypeError: If `tiled` is not a bool.
    """
    split = _checks.index("all_to_all", "split_axis", split_axis)
    concat = _checks.index("all_to_all", "concat_axis", concat_axis)
    if _tiled("all_to_all", tiled):
        return _map_leaves("all_to_all", x, axis_name, split_axis=split, concat_axis=concat)

    def untiled(trace: _FunctionTrace, leaf: Tracer, name: str) -> Tracer:
        shape = tuple(leaf.shape)
        s = _axis_in("all_to_all", "split_axis", split, leaf)
        c = _axis_in("all_to_all", "concat_axis", concat, leaf)
        n = _devices(trace, "all_to_all")
        if shape[s] != n:
            raise ValueError(
                f"all_to_all: split_axis {split} of {leaf.aval} has size {shape[s]}, but the "
                f"pmap has {n} devices (untiled, as JAX's default: the sizes must be equal; "
                "tiled=True splits it into that many chunks)"
            )
        if s == c:  # n chunks of one joined where they were: the shape stays
            return bind(trace, "all_to_all", (leaf,), axis_name=name, split_axis=s, concat_axis=c)
        # A new axis of size 1 at the result's concat_axis receives the chunks;
        # the split axis, of size 1 after the exchange, is dropped.
        at = c + 1 if s < c else c
        lifted = leaf.reshape(shape[:at] + (1,) + shape[at:])
        s1 = s if s < c else s + 1
        out = bind(trace, "all_to_all", (lifted,), axis_name=name, split_axis=s1, concat_axis=at)
        return out.reshape(tuple(d for i, d in enumerate(out.shape) if i != s1))

    return _map_leaves("all_to_all", x, axis_name, untiled)


def psum_scatter(
    x: Any, axis_name: str, scatter_dimension: int = 0, *, tiled: bool = False
) -> Any:
    """Sums `x` over the devices and leaves each device one slice, like `jax.lax.psum_scatter`.

    `x.shape[scatter_dimension]` must equal the number of devices; device `i`
    gets the sum over devices of `x` indexed `i` along that dimension (which
    the result drops). It is the transpose of `all_gather`. With
    `tiled=True` (as JAX's) the dimension must divide by the number of
    devices, and device `i` gets the sum of its `i`-th block (the dimension
    stays, that many times shorter).

    Raises:
      NameError: If `axis_name` is not bound by the enclosing pmap.
      ValueError: If the dimension is out of range or its size is not the
        number of devices (tiled: does not divide by it).
      TypeError: If `tiled` is not a bool.
    """
    d = _checks.index("psum_scatter", "scatter_dimension", scatter_dimension)
    if not _tiled("psum_scatter", tiled):
        return _map_leaves("psum_scatter", x, axis_name, scatter_dimension=d)

    def tiled_scatter(trace: _FunctionTrace, leaf: Tracer, name: str) -> Tracer:
        shape = tuple(leaf.shape)
        ax = _axis_in("psum_scatter (tiled)", "scatter_dimension", d, leaf)
        n = _devices(trace, "psum_scatter")
        if shape[ax] % n:
            raise ValueError(
                f"psum_scatter (tiled): scatter_dimension {d} of {leaf.aval} has size "
                f"{shape[ax]}, which does not divide by the pmap's {n} devices"
            )
        blocks = leaf.reshape(shape[:ax] + (n, shape[ax] // n) + shape[ax + 1:])
        return bind(trace, "psum_scatter", (blocks,), axis_name=name, scatter_dimension=ax)

    return _map_leaves("psum_scatter", x, axis_name, tiled_scatter)


def psum(x: Any, axis_name: str) -> Any:
    """Sums `x` over all devices of the pmap'd axis `axis_name`, like `jax.lax.psum`.

    Args:
      x: A pytree of traced values (or numeric constants, which count once per
        device).
      axis_name: The `axis_name` given to the enclosing `pw.pmap`.

    Returns:
      A pytree like `x` whose leaves hold, on every device, the sum of that
      leaf over all devices.

    Raises:
      NameError: If `axis_name` is not bound by the enclosing pmap, or there is
        no enclosing pmap.
    """
    return _map_leaves("psum", x, axis_name)


def simulated_compute(x: Any, microseconds: float) -> Any:
    """A simulated kernel: keeps the devices busy without using a CPU core.

    Inside a pmap'd function, returns `x` unchanged and makes every run of the
    function hold its devices for at least `microseconds` from its start, as
    if a TPU were running a kernel of that duration: a gang lasts
    max(its real kernels, the total simulated time). Other gangs cannot use
    the devices meanwhile, and no host CPU is used while they wait. Use it for
    scheduling and dispatch experiments with many devices on a small machine.

    Args:
      x: A traced value (or pytree of them) of the enclosing pmap'd function.
      microseconds: Simulated device time: a finite number from 0 to
        3.6e9 (one hour). The durations of one function add up, and their
        total is limited to one hour too.

    Returns:
      `x`, unchanged.

    Raises:
      TracerError: Outside a function traced by `pw.pmap`.
      TypeError: If `microseconds` is not a number.
      ValueError: For a negative, NaN, infinite or too long duration, or a
        function whose total simulated time exceeds one hour.
    """
    microseconds = _checks.real("simulated_compute", "microseconds", microseconds)
    trace = _state.function
    if trace is None:
        raise TracerError(
            "simulated_compute must be called inside a function traced by pw.pmap"
        )
    leaves, treedef = tree_flatten(x)
    out = []
    for leaf in leaves:
        if not isinstance(leaf, Tracer):
            raise TracerError(
                f"simulated_compute in {trace.where()} needs traced values, got {type(leaf).__name__}"
            )
        leaf._check()
        out.append(bind(trace, "simulated_compute", (leaf,), microseconds=microseconds))
    return tree_unflatten(treedef, out)
