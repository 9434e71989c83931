"""Pathways: a single-controller runtime for (simulated) accelerators.

After "Pathways: Asynchronous Distributed Dataflow for ML" (Barham et al.,
MLSys 2022). The API follows JAX:

    import numpy as np
    import pathways as pw

    tpus = pw.make_virtual_device_set().add_slice(tpu_devices=2).tpus
    a = pw.pmap(lambda x: x * 2., devices=tpus)

    @pw.program  # traces the calls into one dataflow program
    def f(v):
        return a(a(v))

    print(f(np.array([1., 2.])))  # array([4., 8.])

Outputs are `ShardedBuffer`s: futures of arrays sharded over the devices, that
convert to numpy with `np.asarray`.
"""

from __future__ import annotations

import atexit
import os
from typing import Any

# Registers bfloat16 with numpy, which _core names when it makes or reads
# bfloat16 arrays (np.dtype("bfloat16")). Imports numpy, whose own BLAS reads
# the environment as the user left it.
import ml_dtypes  # noqa: E402, F401

# The kernels' OpenBLAS (not numpy's) runs on one thread: the executor splits
# products over its own threads (csrc/kernels/matmul.h). Told when the library
# loads, with _core, so that it starts no pool of its own: an idle pool made
# the attention's small products 1.8x slower half the time, although it was
# set to one thread later. The user's value is put back for everyone else.
_user_blas_threads = os.environ.get("OPENBLAS_NUM_THREADS")
os.environ["OPENBLAS_NUM_THREADS"] = "1"
try:
    from pathways import _core  # noqa: E402
finally:
    if _user_blas_threads is None:
        del os.environ["OPENBLAS_NUM_THREADS"]
    else:
        os.environ["OPENBLAS_NUM_THREADS"] = _user_blas_threads
    del _user_blas_threads

from pathways._devices import (
    HostInfo,
    VirtualDeviceSet,
    VirtualSlice,
    configure,
    devices,
    hosts,
    make_virtual_device_set,
    topology,
)
from pathways._program import Program, ProgramTracer, program
from pathways._pytree import (
    PyTreeDef,
    tree_flatten,
    tree_leaves,
    tree_map,
    tree_structure,
    tree_unflatten,
)
from pathways._trace_state import TracerError
from pathways._tracer import Tracer, stop_gradient
from pathways._pmap import PmapFunction, pmap
from pathways._jit import JitFunction, device_put, jit
from pathways._collectives import (
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
from pathways._autodiff import grad, value_and_grad
from pathways import _vjp_rules  # noqa: F401 (sets the primitives' VJP rules)
from pathways._vjp import jvp, vjp
from pathways._dynamic import compact
from pathways._diagnose import Diagnosis, HangWarning, diagnose
from pathways import _ray_hosts  # noqa: F401 (hosts="ray": its launcher, in pathways._hosts.LAUNCHERS)
from pathways import _hosts  # its host processes stop at exit, after the runtime
from pathways import _service

_service.configure_from_environment()  # PATHWAYS_SERVER: a tenant of that service
from pathways import numpy  # pw.numpy: numpy-style functions on traced values
from pathways import nn  # pw.nn: softmax, layer_norm, ... (like jax.nn)
from pathways import lax  # pw.lax: top_k, scan, fori_loop, erf, cumsum, ... (like jax.lax)
from pathways import random  # pw.random: PRNGKey, split, uniform, normal, ... (like jax.random)
from pathways import optim  # pw.optim: optimizers and schedules (like optax)
from pathways._control_flow import checkpoint
from pathways._custom_derivatives import custom_jvp, custom_vjp

remat = checkpoint  # jax.remat's name
from pathways import testing  # pw.testing: fault injection
from pathways import checkpointing  # pw.checkpointing: save and restore, in Orbax's format
from pathways import elastic  # pw.elastic: remapping slices off failed devices, data-parallel replicas
from pathways import tree_util  # pw.tree_util: pytrees (like jax.tree_util)
from pathways._tenancy import (
    Client,
    Timeline,
    client_stats,
    device_busy_seconds,
    dispatch_mode,
    scheduling_policy,
    set_scheduling_policy,
    timeline,
)

__version__ = "0.1.0"

ShardedBuffer = _core.ShardedBuffer
Device = _core.Device
VirtualDevice = _core.VirtualDevice
PathwaysError = _core.PathwaysError
NotFoundError = _core.NotFoundError
ResourceExhaustedError = _core.ResourceExhaustedError
DeletedBufferError = _core.DeletedBufferError
DeviceFailedError = _core.DeviceFailedError
HostLostError = _core.HostLostError
memory_stats = _core.memory_stats
transfer_stats = _core.transfer_stats
scheduler_stats = _core.scheduler_stats
# Native code for fused loops (csrc/codegen): compiled in the background once
# a function has run a few times; these wait for it and count it.
wait_for_native_kernels = _core.wait_for_native_kernels
native_kernel_stats = _core.native_kernel_stats



def _shutdown_at_exit() -> None:
    # The runtime first: it cancels its work that has not started, on the
    # host processes too, and waits for them (bounded); then the host
    # processes it started stop.
    _core.shutdown()
    _hosts._stop_launched()


atexit.register(_shutdown_at_exit)


def block_until_ready(tree: Any) -> Any:
    """Waits until every `ShardedBuffer` in a pytree is computed.

    Releases the GIL while waiting.

    Args:
      tree: A pytree; leaves other than `ShardedBuffer`s are ignored.

    Returns:
      `tree` itself.

    Raises:
      PathwaysError: Or the error of the computation that produced a buffer.
    """
    for leaf in tree_leaves(tree):
        if isinstance(leaf, _core.ShardedBuffer):
            leaf.block_until_ready()
    return tree


__all__ = [
    "__version__",
    # Devices and topology.
    "configure",
    "devices",
    "hosts",
    "HostInfo",
    "topology",
    "make_virtual_device_set",
    "VirtualDeviceSet",
    "VirtualSlice",
    "Device",
    "VirtualDevice",
    # Compiled functions and programs.
    "pmap",
    "jit",
    "JitFunction",
    "psum",
    "pmean",
    "pmax",
    "pmin",
    "axis_index",
    "all_gather",
    "ppermute",
    "all_to_all",
    "psum_scatter",
    "program",
    "compact",
    "simulated_compute",
    "dispatch_mode",
    # Gradients.
    "grad",
    "value_and_grad",
    "stop_gradient",
    "vjp",
    "jvp",
    "checkpoint",
    "remat",
    "custom_vjp",
    "custom_jvp",
    # Multi-tenancy and timelines.
    "Client",
    "client_stats",
    "set_scheduling_policy",
    "scheduling_policy",
    "timeline",
    "Timeline",
    "device_busy_seconds",
    "PmapFunction",
    "Program",
    "Tracer",
    "ProgramTracer",
    # Arrays.
    "ShardedBuffer",
    "device_put",
    "block_until_ready",
    # Pytrees.
    "PyTreeDef",
    "tree_flatten",
    "tree_unflatten",
    "tree_leaves",
    "tree_map",
    "tree_structure",
    "tree_util",
    # Checkpoints.
    "checkpointing",
    "elastic",
    # Statistics.
    "memory_stats",
    "transfer_stats",
    "scheduler_stats",
    # Hang diagnosis.
    "diagnose",
    "Diagnosis",
    "HangWarning",
    # Errors.
    "PathwaysError",
    "NotFoundError",
    "ResourceExhaustedError",
    "DeletedBufferError",
    "DeviceFailedError",
    "HostLostError",
    "TracerError",
]
