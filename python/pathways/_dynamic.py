"""Data-dependent shapes (paper §4.5): `pw.compact`, and the fallback that runs what depends on it.

Parallel dispatch needs every node's resource requirements before any node
runs; a compiled function's are static. A value whose shape depends on data
breaks that: the size of `pw.compact`'s result is the number of kept rows,
known only once the mask is computed, and so are the shapes of everything
computed from it. Such nodes fall back to sequential dispatch, node by node,
and only they:

* While a `@pw.program` is traced, `compact` and every pmap'd call that reads
  a value of data-dependent shape are *deferred*: recorded apart from the
  program (`_ProgramTrace.stage_deferred`), with outputs of unknown shape
  (traced at their bound, for the output structure and dtypes). Nodes that
  depend on no deferred value form the static program as before.
* A call dispatches the static program at once (parallel dispatch: every
  node's host-side work done up front). Then `run_deferred` runs the deferred
  nodes in order, each only when its inputs exist: `compact` waits for its
  mask and reads the counts to the host; a deferred pmap call is traced and
  compiled for the shapes it finds (cached per shape) and dispatched on its
  own. The call returns once the last deferred node is dispatched, as a
  sequential dispatch does.

So the static nodes' work proceeds while the fallback waits, and the cost of
data-dependent shapes is paid only where they are.
"""

from __future__ import annotations

import threading
from typing import Any, Optional, Sequence

import numpy as np

from pathways import _core
from pathways._checks import _to_array
from pathways._jit import device_put
from pathways._pmap import PmapFunction, _check_devices
from pathways._trace_state import TracerError, _state, _TracerBase

__all__ = ["compact"]

_ShardedBuffer = _core.ShardedBuffer


def _gather(x: Any, idx: Any, valid: Any) -> Any:
    from pathways import numpy as pnp

    rows = pnp.take(x, idx, axis=0)
    return pnp.where(valid.reshape(valid.shape + (1,) * (rows.ndim - 1)), rows, 0)


_gathers_lock = threading.Lock()
_gathers: dict = {}  # devices key -> PmapFunction of _gather


def _gather_on(devices: Optional[list]) -> PmapFunction:
    key = None if devices is None else tuple((d.slice, d.index) for d in devices)
    with _gathers_lock:
        fn = _gathers.get(key)
        if fn is None:
            fn = _gathers[key] = PmapFunction(_gather, devices, None)
    return fn


def _check_operands(x_shape: tuple, mask_shape: tuple, mask_dtype: Any) -> None:
    if len(x_shape) < 2:
        raise ValueError(
            f"pw.compact: x must have a leading device axis and a row axis, got shape {x_shape}"
        )
    if np.dtype(mask_dtype) != np.bool_:
        raise TypeError(f"pw.compact: mask must be bool, got {np.dtype(mask_dtype)}")
    if tuple(mask_shape) != tuple(x_shape[:2]):
        raise ValueError(
            f"pw.compact: mask must have shape {tuple(x_shape[:2])} (x's device and row axes), "
            f"got {tuple(mask_shape)}"
        )


def compact_now(x: Any, mask: Any, devices: Optional[list]) -> tuple:
    """Runs a compaction on existing buffers: waits for `mask`, then gathers on the devices."""
    keep = np.asarray(mask)  # waits for the mask: the counts are needed on the host
    x_shape = tuple(x.shape)
    _check_operands(x_shape, keep.shape, keep.dtype)
    counts = keep.sum(axis=1, dtype=np.int32)
    n, k = x_shape[0], int(counts.max()) if x_shape[0] else 0
    idx = np.zeros((n, k), np.int32)
    valid = np.zeros((n, k), bool)
    for i in range(n):
        kept = np.flatnonzero(keep[i])
        idx[i, : kept.size] = kept
        valid[i, : kept.size] = True
    values = _gather_on(devices)(x, idx, valid)
    return values, device_put(counts, values.devices if devices is None else devices)


def compact(x: Any, mask: Any, devices: Optional[Sequence[Any]] = None) -> tuple:
    """The rows of each shard of `x` where `mask` holds: a result whose size depends on data.

    Shard `i` of the result holds the rows `j` of `x[i]` with `mask[i, j]`, in
    order, then zeros up to `k`, the largest number of rows any shard kept;
    `counts[i]` is how many rows shard `i` kept. Since `k` is known only once
    `mask` is computed, inside `@pw.program` this node, and every pmap'd call
    that reads its result (or anything computed from it), falls back to
    sequential dispatch (paper §4.5): each runs when its inputs exist, after
    the rest of the program has been dispatched in parallel.

    Example:
      >>> @pw.program
      ... def step(x, threshold):
      ...     y = f(x)                                     # dispatched in parallel
      ...     kept, counts = pw.compact(y, above(y, threshold), devices=tpus)
      ...     return h(kept), counts       # compact and h: once the mask exists

    Args:
      x: A sharded array `[devices, rows, ...]`: a program value, a
        `ShardedBuffer`, or an array.
      mask: A bool array `[devices, rows]`, of the same kinds.
      devices: The virtual devices the gather runs on (`len(devices)` must be
        x's leading axis); None: a slice of that many devices, allocated on
        first use, as `pw.pmap(..., devices=None)`.

    Returns:
      `(values [devices, k, ...], counts [devices] int32)`: program values of
      data-dependent shape in a program, `ShardedBuffer`s outside.

    Raises:
      TypeError: For a mask that is not bool, or devices that are no virtual
        devices.
      ValueError: For shapes that do not match, or a wrong number of devices.
      TracerError: Inside a pmap'd function (the size of a compiled
        function's values must be static).
    """
    if _state.function is not None:
        raise TracerError(
            f"pw.compact was called inside {_state.function.where()}: a compiled function's "
            "values have static shapes; call it in @pw.program (or outside) on the function's "
            "outputs"
        )
    devs = None if devices is None else _check_devices(devices)
    program = _state.program
    if program is not None:
        x, mask = program.check_leaves([x, mask], "pw.compact", "operand")
        for v in (x, mask):
            if getattr(v, "shape", ()) is None:
                raise TracerError(
                    f"pw.compact of a value of data-dependent shape ({v.aval}) is not supported "
                    "yet: compact once, then compute on its result"
                )
        _check_operands(tuple(x.shape), tuple(mask.shape), mask.dtype)
        if devs is not None and len(devs) != x.shape[0]:
            raise ValueError(
                f"pw.compact: {len(devs)} devices for x of leading axis {x.shape[0]}"
            )
        out_types = [(tuple(x.shape), x.dtype), ((x.shape[0],), np.dtype(np.int32))]
        return tuple(program.stage_deferred(("compact", devs), [x, mask], out_types))
    for name, v in (("x", x), ("mask", mask)):
        if isinstance(v, _TracerBase):
            raise TracerError(f"pw.compact: {name} is a traced value used after its trace ended")
    if not isinstance(x, _ShardedBuffer):
        x = _to_array(x, "pw.compact", 0, "operand")
    if devs is not None and len(devs) != tuple(x.shape)[0]:
        raise ValueError(f"pw.compact: {len(devs)} devices for x of leading axis {x.shape[0]}")
    return compact_now(x, mask, devs)


def run_deferred(deferred: Sequence[tuple], resolve: Any) -> dict:
    """Runs the deferred nodes of a program call, in order (the fallback).

    Args:
      deferred: `(op, input refs, output value ids)` per node, as traced.
      resolve: Maps an input ref to its buffer or array (static program
        outputs, arguments, constants); refs to deferred outputs are looked up
        in the values computed here.

    Returns:
      The deferred nodes' outputs by value id.
    """
    env: dict = {}
    for op, refs, out_ids in deferred:
        inputs = [env[r[1]] if r[0] == "deferred" else resolve(r) for r in refs]
        if op[0] == "compact":
            outs = compact_now(inputs[0], inputs[1], op[1])
        else:
            _, fn, treedef = op
            from pathways._pytree import tree_flatten, tree_unflatten

            outs = tree_flatten(fn(*tree_unflatten(treedef, inputs)))[0]
        env.update(zip(out_ids, outs))
    return env
