"""Type checks of arguments at the API boundary.

Each raises TypeError naming the function and the parameter; the values'
ranges are checked by the C++ core, which knows the limits, so that every
entry point (for instance `pw.configure` and `PATHWAYS_TOPOLOGY`) gives the
same ValueError.
"""

from __future__ import annotations

import math
import numbers
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
