"""The collectives of pmap'd functions, like `jax.lax`'s: `psum`, `pmean`, `all_gather`, ...

Each binds its primitive to every leaf of a pytree, inside a function traced
by `pw.pmap` with the axis name it is given; `simulated_compute` too.
"""

from __future__ import annotations

from typing import Any, Sequence

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
    trace = _bound_trace("axis_index", axis_name)
    return bind(trace, "axis_index", (), axis_name=axis_name)


def _map_leaves(name: str, x: Any, axis_name: str, **params: Any) -> Any:
    """Binds collective `name` over axis `axis_name` to every leaf of pytree `x`."""
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
        out.append(bind(trace, name, (leaf,), axis_name=axis_name, **params))
    return tree_unflatten(treedef, out)


def all_gather(x: Any, axis_name: str, axis: int = 0) -> Any:
    """Every device's `x` stacked along a new axis `axis`, like `jax.lax.all_gather`.

    The new axis has size the number of devices of the pmap; entry `i` is the
    value of device `i`.

    Raises:
      NameError: If `axis_name` is not bound by the enclosing pmap.
      ValueError: If `axis` is out of range.
    """
    a = _checks.index("all_gather", "axis", axis)
    return _map_leaves("all_gather", x, axis_name, axis=a)


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


def all_to_all(x: Any, axis_name: str, split_axis: int, concat_axis: int) -> Any:
    """Exchanges chunks between the devices, like `jax.lax.all_to_all`.

    Each device splits `x` along `split_axis` into as many equal chunks as
    there are devices and sends chunk `i` to device `i`; each device joins the
    chunks it receives along `concat_axis`, in device order. The result's
    `split_axis` is that many times shorter and its `concat_axis` that many
    times longer.

    Raises:
      NameError: If `axis_name` is not bound by the enclosing pmap.
      ValueError: If an axis is out of range or `split_axis` does not divide
        by the number of devices.
    """
    return _map_leaves(
        "all_to_all",
        x,
        axis_name,
        split_axis=_checks.index("all_to_all", "split_axis", split_axis),
        concat_axis=_checks.index("all_to_all", "concat_axis", concat_axis),
    )


def psum_scatter(x: Any, axis_name: str, scatter_dimension: int = 0) -> Any:
    """Sums `x` over the devices and leaves each device one slice, like `jax.lax.psum_scatter`.

    `x.shape[scatter_dimension]` must equal the number of devices; device `i`
    gets the sum over devices of `x` indexed `i` along that dimension (which
    the result drops). It is the transpose of `all_gather`.

    Raises:
      NameError: If `axis_name` is not bound by the enclosing pmap.
      ValueError: If the dimension is out of range or its size is not the
        number of devices.
    """
    return _map_leaves(
        "psum_scatter",
        x,
        axis_name,
        scatter_dimension=_checks.index("psum_scatter", "scatter_dimension", scatter_dimension),
    )


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
