"""`pw.jit`: a compiled function on one device, without a device axis (as `jax.jit`).

A jitted function is a `pw.pmap` over one device whose arguments are all
unmapped (in_axes=None) and whose outputs are replicated (out_axes=None): the
function sees its arguments' own shapes, and returns `ShardedBuffer`s of its
outputs' own shapes. Those are replicated buffers (`is_replicated`), which a
later jitted call on the same device takes as they are, with no copy and no
host round trip, so a training loop of jitted steps stays on the device.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Optional, Sequence

import numpy as np

from pathways import _checks, _core
from pathways._checks import _to_array
from pathways._devices import checked_devices, make_virtual_device_set
from pathways._pmap import PmapFunction, check_static, normalize_argnums
from pathways._pytree import tree_flatten, tree_unflatten
from pathways._trace_state import TracerError, _state

__all__ = ["JitFunction", "jit", "device_put"]

_default_device: list = []  # the one device of jitted functions given no device


def _shared_device() -> Any:
    """The device every jitted function without `device` runs on (allocated once)."""
    if not _default_device:
        _default_device.append(make_virtual_device_set().add_slice(tpu_devices=1).tpus[0])
    return _default_device[0]


_identity: list = []


def put_on_shared_device(x: Any) -> Any:
    """`x` (a pytree) whole on the device jitted functions share, as replicated buffers."""
    if not _identity:
        _identity.append(JitFunction(lambda tree: tree, (), (), None))
    return _identity[0](x)


def device_put(x: Any, devices: Optional[Sequence[Any]] = None) -> Any:
    """Copies arrays onto devices, splitting each leading axis over them.

    Like `jax.device_put_sharded` on stacked arrays: shard `i` (`x[i]`) goes
    to `devices[i]`. `x` may be a pytree; every leaf is put. Without
    `devices`, like `jax.device_put(x)`: each leaf whole onto the one device
    that `pw.jit` functions given no device share, as a replicated
    `ShardedBuffer` that they take with no copy.

    Args:
      x: A pytree of numpy arrays (float32, float64, int32, uint32, bool or
        bfloat16; other integer dtypes become int32, as for `pmap` arguments) or array-likes
        (Python floats become float64, ints int32), each with leading axis
        `len(devices)`, or `ShardedBuffer`s (copied).
      devices: Virtual devices (e.g. a slice's `.tpus`), a `VirtualSlice`, or
        physical `Device`s; None: `pw.jit`'s shared device, unsplit.

    Returns:
      The pytree with `ShardedBuffer` leaves.

    Raises:
      ValueError: If a leading axis does not match the number of devices.
      TypeError: For an unsupported dtype or leaf, or `devices` that are no
        devices.
      NotFoundError: For an unknown device.
      ResourceExhaustedError: If the devices cannot hold it even after the
        work in flight is done (until then it waits: back-pressure).
      RuntimeError: Inside `with client:` for a closed client.
    """
    if devices is None:
        return put_on_shared_device(x)
    devices = checked_devices(
        "device_put",
        devices,
        (_core.VirtualDevice, _core.Device),
        "a VirtualSlice or a sequence of devices (virtual ones such as a slice's `.tpus`, "
        "or physical ones from pw.devices())",
    )

    leaves, treedef = tree_flatten(x)
    client = _state.client  # inside `with client:` the buffers are the client's
    return tree_unflatten(treedef, [
        _core.device_put(np.asarray(_to_array(leaf, "device_put", i, "leaf"), order="C"), devices, client)
        for i, leaf in enumerate(leaves)
    ])


def _call_with(fun: Callable[..., Any]) -> Callable[..., Any]:
    """`fun` as the per-device function of the pmap: dynamic args and kwargs, then the statics."""

    def per_device(args: tuple, kwargs: dict, statics: tuple) -> Any:
        positional, named = statics
        full = list(args)
        for i, value in positional:
            full.insert(i, value)
        return fun(*full, **kwargs, **dict(named))

    functools.update_wrapper(per_device, fun)
    return per_device


def _by_signature(fun: Callable[..., Any], argnames: tuple, argnums: tuple) -> tuple:
    """`(positions of argnames, {argnum: its name})` in `fun`'s signature, where it has them.

    Only parameters that can be passed both ways count; a function without an
    inspectable signature (a builtin) gives `((), {})`.
    """
    try:
        params = list(inspect.signature(fun).parameters.values())
    except (TypeError, ValueError):
        return (), {}
    positional = [
        p for p in params
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    positions = tuple(i for i, p in enumerate(positional) if p.name in argnames)
    names = {  # a negative position counts from the end of a call, not of the signature
        i: positional[i].name
        for i in argnums
        if 0 <= i < len(positional)
        and positional[i].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
        and positional[i].name not in argnames
    }
    return positions, names


class JitFunction:
    """A function compiled by `pw.jit`; call it like the function.

    Traced and compiled once per signature: the structure, shapes and dtypes
    of the dynamic arguments, and the values of the static ones.
    """

    def __init__(
        self, fun: Callable[..., Any], static_argnums: Any, static_argnames: Any, device: Any
    ):
        functools.update_wrapper(self, fun)
        self._fun = fun
        self._name = getattr(fun, "__name__", type(fun).__name__)
        self._static_argnums = _checks.ints("jit", "static_argnums", static_argnums)
        if isinstance(static_argnames, str):
            static_argnames = (static_argnames,)
        self._static_argnames = tuple(
            _checks.string("jit", "static_argnames", n) for n in static_argnames
        )
        # As jax.jit, each names the other's arguments through the signature:
        # a static argument is static whether it is passed by position or name.
        self._positions_of_names, self._names_of_positions = _by_signature(
            fun, self._static_argnames, self._static_argnums
        )
        self._static_argnames += tuple(self._names_of_positions.values())
        if device is not None and not isinstance(device, _core.VirtualDevice):
            raise TypeError(
                f"jit: device must be a VirtualDevice (from "
                f"`pw.make_virtual_device_set().add_slice(tpu_devices=1).tpus[0]`) or None, "
                f"got {device!r}"
            )
        self._device = device
        self._pmap: Optional[PmapFunction] = None

    def __repr__(self) -> str:
        return f"<jit of {self._name!r}>"

    def _mapped(self) -> PmapFunction:
        if self._pmap is None:
            device = self._device if self._device is not None else _shared_device()
            self._pmap = PmapFunction(
                _call_with(self._fun), [device], None, in_axes=None, out_axes=None,
                static_broadcasted_argnums=(2,),
            )
        return self._pmap

    def _split(self, args: tuple, kwargs: dict) -> tuple:
        """`(dynamic args, dynamic kwargs, statics)` of a call."""
        where = f"jit of {self._name!r}"
        argnums = tuple(  # those passed by name here are found among the kwargs
            i for i in self._static_argnums
            if i < len(args) or self._names_of_positions.get(i) not in kwargs
        )
        positions = normalize_argnums(argnums, len(args), where, "static_argnums")
        named_here = tuple(i for i in self._positions_of_names if i < len(args))
        if named_here:
            positions = tuple(sorted(set(positions + named_here)))
        positional = tuple((i, args[i]) for i in positions)
        named = tuple(sorted((k, v) for k, v in kwargs.items() if k in self._static_argnames))
        for i, value in positional:
            check_static(where, f"argument {i}", value)
        for k, value in named:
            check_static(where, f"argument {k!r}", value)
        dynamic = tuple(a for i, a in enumerate(args) if i not in positions)
        dyn_kwargs = {k: v for k, v in kwargs.items() if k not in self._static_argnames}
        return dynamic, dyn_kwargs, (positional, named)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Runs the function on its device (inline inside another traced function).

        Returns:
          The outputs as replicated `ShardedBuffer`s (futures) of their own
          shapes.

        Raises:
          TracerError: Inside `@pw.program`, whose values are sharded over
            their leading axis: call a `pw.pmap`'d function there.
          ValueError, TypeError: As `pw.pmap`, and for static arguments that
            are out of range or unhashable.
        """
        if _state.function is not None:  # jit inside a traced function: as JAX, inline
            return self._fun(*args, **kwargs)
        if _state.program is not None:
            raise TracerError(
                f"jit of {self._name!r} was called in {_state.program.where()}: a program's "
                "values are sharded over their leading axis; call a pw.pmap'd function there "
                "(pw.pmap(f, in_axes=None, out_axes=None, devices=...) for one unmapped value)"
            )
        return self._mapped()(*self._split(args, kwargs))

    def as_text(self, *args: Any, **kwargs: Any) -> str:
        """The function IR traced for these arguments (without running it)."""
        return self._mapped().as_text(*self._split(args, kwargs))


def jit(
    fun: Optional[Callable[..., Any]] = None,
    *,
    static_argnums: Any = (),
    static_argnames: Any = (),
    device: Any = None,
) -> Any:
    """Compiles `fun` for one device, as `jax.jit`.

    Example:
      >>> f = pw.jit(lambda x, y: x @ y + 1.0)
      >>> f(np.ones((2, 3)), np.ones((3, 2)))
      array([[4., 4.],
             [4., 4.]])

    Args:
      fun: The function: pytrees of arrays (and Python scalars) in and out.
        Without it, a decorator taking the other arguments.
      static_argnums: Positions of arguments passed as they are, at trace
        time: hashable values, part of the cache key.
      static_argnames: Names of keyword arguments passed the same way.
      device: The `VirtualDevice` to run on; None: one TPU shared by every
        jitted function given none (allocated on first call).

    Returns:
      A `JitFunction`.

    Raises:
      TypeError: If `fun` is not callable or an option has the wrong type.
    """
    if fun is None:
        return lambda f: jit(
            f, static_argnums=static_argnums, static_argnames=static_argnames, device=device
        )
    if not callable(fun):
        raise TypeError(f"jit expects a callable, got {fun!r}")
    return JitFunction(fun, static_argnums, static_argnames, device)
