"""Type checks of arguments at the API boundary.

Each raises TypeError naming the function and the parameter; the values'
ranges are checked by the C++ core, which knows the limits, so that every
entry point (for instance `pw.configure` and `PATHWAYS_TOPOLOGY`) gives the
same ValueError.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from typing import Any


def integer(where: str, name: str, value: Any) -> int:
    """`value` as an int; TypeError unless it is an integer (bool is not)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{where}: {name} must be an int, got {value!r}")
    return int(value)


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
        elif isinstance(d, bool) or not isinstance(d, numbers.Integral):
            raise TypeError(f"{where}: {name} must hold device ids (int) or devices, got {d!r} in {devices!r}")
        if not 0 <= d < num_devices:
            raise ValueError(f"{where}: {name} has unknown device id {d}; the devices are 0..{num_devices - 1}")
        ids.add(int(d))
    return ids
