"""The function tracer, by the name it had before it was split up: its names, re-exported.

- pathways._trace_state: the per-thread tracing state, `TracerError`, the base
  of traced values (program tracers share them);
- pathways._primitives: the `Primitive` of every op;
- pathways._tracer: `Tracer` and its operators, the function trace, `bind`;
- pathways._checks: argument conversion (`_to_array`);
- pathways._pmap: `pmap`, `PmapFunction`;
- pathways._collectives: `psum`, `pmean`, `all_gather`, ... and `simulated_compute`.
"""

from __future__ import annotations

from pathways._collectives import (  # noqa: F401
    _bound_trace,
    _map_leaves,
    _pcollective,
    all_gather,
    all_to_all,
    axis_index,
    pmax,
    pmean,
    pmin,
    ppermute,
    psum,
    psum_scatter,
    simulated_compute,
)
from pathways._checks import _ACCEPTED_LEAVES, _to_array  # noqa: F401
from pathways._pmap import (  # noqa: F401
    _check_devices,
    _Compiled,
    _ShardedBuffer,
    _VirtualDevice,
    PmapFunction,
    pmap,
)
from pathways._primitives import PRIMITIVES, Primitive  # noqa: F401
from pathways._trace_state import (  # noqa: F401
    _SHORT_DTYPE,
    _SUPPORTED_DTYPE_NAMES,
    _SUPPORTED_DTYPES,
    TracerError,
    _state,
    _TracerBase,
    _TraceState,
    aval_str,
)
from pathways._tracer import (  # noqa: F401
    Tracer,
    _concrete_error,
    _control_flow_error,
    _escaped,
    _FunctionTrace,
    _ir_name,
    bind,
)

__all__ = [
    "TracerError",
    "Tracer",
    "PmapFunction",
    "pmap",
    "psum",
    "pmean",
    "pmax",
    "pmin",
    "axis_index",
    "all_gather",
    "ppermute",
    "all_to_all",
    "psum_scatter",
    "bind",
]
