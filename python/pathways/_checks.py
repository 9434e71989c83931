"""Type checks of arguments at the API boundary.

Each raises TypeError naming the function and the parameter; the values'
ranges are checked by the C++ core, which knows the limits, so that every
entry point (for instance `pw.configure` and `PATHWAYS_TOPOLOGY`) gives the
same ValueError. The one range checked here is int64's: an integer beyond it
cannot reach the core at all.

`_to_array` converts a concrete argument leaf (of pmap, jit, device_put, grad
called outside a trace ...) to the array the devices take, or raises.
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Iterable
from typing import Any, Optional

import numpy as np

from pathways import _core
from pathways._trace_state import TracerError, _is_float, _TracerBase

_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1


def _index(value: Any) -> Optional[int]:
    """`value` as an int if it is an integer (numpy integers and 0-d integer arrays
    too; bool is not), else None."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:  # includes TracerError: a traced value has no concrete int
        return None


def integer(where: str, name: str, value: Any) -> int:
    """`value` as an int; TypeError unless it is an integer (bool is not)."""
    i = _index(value)
    if i is None:
        raise TypeError(f"{where}: {name} must be an int, got {value!r}")
    return i


def real(where: str, name: str, value: Any) -> float:
    """`value` as a float (inf when too large for one); TypeError unless it is a real number (bool is not)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{where}: {name} must be a number, got {value!r}")
    try:
        return float(value)
    except OverflowError:  # an int beyond float's range
        return math.inf if value > 0 else -math.inf


def string(where: str, name: str, value: Any) -> str:
    """`value`; TypeError unless it is a str."""
    if not isinstance(value, str):
        raise TypeError(f"{where}: {name} must be a str, got {value!r}")
    return value


def index(where: str, name: str, value: Any) -> int:
    """An int the core takes as int64 (an axis, a dimension, a device index).

    Raises:
      TypeError: Unless `value` is an integer (bool is not), naming `where` and `name`.
      ValueError: For an integer beyond int64, out of range for any array.
    """
    a = integer(where, name, value)
    if not _INT64_MIN <= a <= _INT64_MAX:
        raise ValueError(f"{where}: {name} {a} is out of range")
    return a


def optional_index(where: str, name: str, value: Any) -> Optional[int]:
    """None, or an int as `index` takes it (e.g. argmax's one axis).

    Raises:
      TypeError: For anything else, naming `where` and `name`.
      ValueError: For an integer beyond int64.
    """
    if value is None:
        return None
    if _index(value) is None:
        raise TypeError(f"{where}: {name} must be None or an int, got {value!r}")
    return index(where, name, value)


def _ints(where: str, name: str, value: Any, expected: str) -> tuple:
    if isinstance(value, (tuple, list)):
        if any(_index(a) is None for a in value):
            raise TypeError(f"{where}: {name} must be {expected}, got {value!r}")
        return tuple(index(where, name, a) for a in value)
    if _index(value) is None:
        raise TypeError(f"{where}: {name} must be {expected}, got {value!r}")
    return (index(where, name, value),)


def ints(where: str, name: str, value: Any) -> tuple:
    """An int, or a tuple or list of ints (a shape, a permutation), as a tuple of ints.

    Raises:
      TypeError: For anything else, or a member that is no integer, naming
        `where` and `name`.
      ValueError: For an integer beyond int64.
    """
    return _ints(where, name, value, "an int or a tuple of ints")


def axes(where: str, name: str, value: Any) -> Optional[tuple]:
    """The axes of an op as numpy takes them: None (all), an int, or a tuple or list of ints.

    Returns:
      None for None, else a tuple of ints (one for an int), in the given order.

    Raises:
      As `ints`.
    """
    if value is None:
        return None
    return _ints(where, name, value, "None, an int or a tuple of ints")


def int_pairs(where: str, name: str, value: Any) -> list:
    """A sequence of pairs of ints (e.g. ppermute's (source, destination) pairs), as a list of tuples.

    Raises:
      TypeError: For anything else (None, a flat list of ints, triples, non-integers),
        naming `where` and `name` and the first bad entry.
      ValueError: For an integer beyond int64.
    """
    expected = f"{where}: {name} must be a sequence of pairs of ints"
    if isinstance(value, (str, bytes, dict)) or not hasattr(value, "__iter__"):
        raise TypeError(f"{expected}, got {value!r}")
    pairs = []
    for k, pair in enumerate(value):
        indexable = hasattr(pair, "__getitem__") and not isinstance(pair, (str, bytes, dict))
        if (
            not indexable
            or len(pair) != 2
            or _index(pair[0]) is None
            or _index(pair[1]) is None
        ):
            raise TypeError(f"{expected}, got {value!r} (entry {k} is {pair!r})")
        pairs.append((index(where, name, pair[0]), index(where, name, pair[1])))
    return pairs


def device_ids(where: str, name: str, devices: Any) -> set:
    """`devices` (device ids, `pw.Device`s or virtual devices) as a set of physical device ids.

    TypeError for anything else (a str included), ValueError for an unknown id.
    """
    from pathways import _core  # the runtime starts only when there are ids to check

    if isinstance(devices, (str, bytes)) or not isinstance(devices, Iterable):
        raise TypeError(f"{where}: {name} must be a sequence of device ids or devices, got {devices!r}")
    num_devices = len(_core.devices())
    ids = set()
    for d in devices:
        if isinstance(d, _core.Device):
            d = d.id
        elif isinstance(d, _core.VirtualDevice):
            d = d.physical.id
        elif _index(d) is None:
            raise TypeError(f"{where}: {name} must hold device ids (int) or devices, got {d!r} in {devices!r}")
        if not 0 <= d < num_devices:
            raise ValueError(f"{where}: {name} has unknown device id {d}; the devices are 0..{num_devices - 1}")
        ids.add(int(d))
    return ids


# --- Argument leaves as arrays ---------------------------------------------------

_ShardedBuffer = _core.ShardedBuffer

_ACCEPTED_LEAVES = (
    "accepted: ShardedBuffers, numpy arrays, jax.Arrays, Python and numpy scalars (bool, int, "
    "float), and pytrees of them (tuples, lists, dicts, None, and JAX's registered nodes); pass "
    "other leaves as static arguments, or split them off a JAX pytree first (an equinox "
    "Module's functions: eqx.partition(model, eqx.is_array), then eqx.combine inside)"
)


def _to_array(leaf: Any, where: str = "pmap", i: Optional[int] = None, what: str = "argument") -> Any:
    """A ShardedBuffer or numpy array for a concrete argument leaf.

    numpy arrays of float32, float64, int32, uint32, bool and bfloat16 keep their dtype
    (other dtypes, e.g. float16, are rejected later with the supported ones
    named); other integer arrays (numpy's default int64 included) and Python
    ints become int32, as in JAX; Python floats become float64 and bools bool.

    Args:
      leaf: The argument leaf.
      where, i, what: For messages: the function, the leaf's index and what
        leaves are called ("pmap of 'f'", 2, "argument").

    Raises:
      TypeError: For a leaf that is no array or number (a set, a generator,
        a dataclass, a str ...); it is not iterated.
      ValueError: For integers outside int32's range.
    """
    if type(leaf) is _ShardedBuffer:
        return leaf
    if isinstance(leaf, _ShardedBuffer):
        return leaf
    if isinstance(leaf, _TracerBase):
        raise TracerError(
            f"escaped tracer: a traced value ({leaf.aval}) was used after its trace ended"
        )
    arr = np.asarray(leaf)
    if arr.dtype.kind not in "biufc" and not _is_float(arr.dtype) and not isinstance(leaf, np.ndarray):
        text = repr(leaf)
        text = text if len(text) <= 60 else text[:57] + "..."
        raise TypeError(
            f"{where}: {what} {'' if i is None else f'{i} '}has type {type(leaf).__name__} "
            f"({text}), not an array or number; {_ACCEPTED_LEAVES}"
        )
    if arr.dtype.kind in "iu" and arr.dtype != np.int32 and arr.dtype != np.uint32:
        info = np.iinfo(np.int32)
        if arr.size and (arr.min() < info.min or arr.max() > info.max):
            raise ValueError(
                f"an argument of dtype {arr.dtype} has values outside the int32 range, the "
                "only integer dtype on the devices"
            )
        arr = arr.astype(np.int32)
    return arr
