"""Type stubs for pathways._core, the C++ extension (csrc/bindings/).

This module is private: users import `pathways`. Status codes from the C++
core become exceptions here: an unsupported dtype -> TypeError, an unbound
axis name -> NameError (InvalidArgument statuses of those kinds); otherwise
InvalidArgument -> ValueError, NotFound ->
NotFoundError (a ValueError), ResourceExhausted -> ResourceExhaustedError,
FailedPrecondition -> RuntimeError, Unimplemented -> NotImplementedError,
anything else -> PathwaysError.
"""

from typing import Any, Callable, Optional, Sequence, Union

import numpy as np

class PathwaysError(RuntimeError): ...
class NotFoundError(ValueError): ...
class ResourceExhaustedError(PathwaysError): ...
class DeletedBufferError(RuntimeError): ...
class DeviceFailedError(PathwaysError):
    # Set when the default runtime raises it: what had failed at that moment.
    failed_devices: list[int]  # device ids
    lost_slices: list[int]     # ids of the live slices with a virtual device on a failed device
class HostLostError(DeviceFailedError): ...

# --- Runtime and topology -------------------------------------------------

def configure(items: Sequence[tuple[str, str]]) -> None:
    """Sets the topology of the default runtime from (key, value) pairs, e.g. [("islands", "2"), ("device_memory", "1GiB")].

    Keys and value syntax as in PATHWAYS_TOPOLOGY; each value is parsed alone.
    Raises ValueError for a bad key or value (checked first), RuntimeError if the runtime already started.
    """

def is_started() -> bool: ...
def parse_bytes(text: str, name: str) -> int:
    """A size like '512MiB' in bytes (ValueError naming `name` if malformed)."""
def hosts() -> list[dict[str, Any]]:
    """Every host: id, island, address, pid, incarnation, alive, status. Starts the runtime."""

def save_shards(host: int, database: str, buffers: Sequence[tuple[ShardedBuffer, str]]) -> None:
    """Has host process `host` write its shards of each (buffer, spec_json) into the checkpoint database
    `database`, once the buffers are done (internal: pathways.checkpointing)."""
def set_shard_writer(writer: Optional[Callable[[str, list[tuple[str, np.ndarray]]], None]]) -> None:
    """This host process's checkpoint writer: writer(database, [(spec_json, data)]), data a read-only uint8 array
    of the shards' bytes (internal: pathways.host)."""
def load_shards(database: str, buffers: Sequence[tuple[str, Any, Sequence[int], Sequence[Any], bool, str]],
                client: Any = None) -> list[ShardedBuffer]:
    """Has the host processes read new buffers, each (name, dtype, shape, devices, replicated, spec_json), from the
    checkpoint in `database`, each host its own shards; returns them pending, ready once read or failed with the
    hosts' error (internal: pathways.checkpointing)."""
def set_shard_reader(reader: Optional[Callable[[str, list[tuple[str, list[int], memoryview]]], None]]) -> None:
    """This host process's checkpoint reader: fills each writable memoryview with this host's shards at those
    positions (internal: pathways.host)."""
def control_messages() -> Optional[list[int]]:
    """Control messages sent to each host process so far (None in process)."""

def topology() -> dict[str, Union[int, float]]:
    """Keys: islands, hosts_per_island, devices_per_host, device_memory, executor_threads, intra_op_threads,
    control_latency_us, hang_report_seconds, ici_latency_us, ici_bandwidth_gbps, dcn_latency_us, dcn_bandwidth_gbps, hosts. Starts the runtime."""

def devices() -> list[Device]: ...
def memory_stats() -> dict[str, int]:
    """{"bytes_in_use": total over all devices, "live_buffers": sharded buffers alive (counted per host)}."""

def transfer_stats() -> dict[str, int]:
    """Keys: ici_bytes, dcn_bytes, host_bytes, ici_transfers, dcn_transfers, host_transfers."""

def wait_for_native_kernels() -> None: ...
def native_kernel_stats() -> dict[str, Any]: ...
def scheduler_stats() -> list[dict[str, int]]:
    """One dict per island: {"island", "enqueued", "in_flight"}."""

def await_quiescence() -> None:
    """Blocks (GIL released, Ctrl-C interrupts) until all dispatched gangs have finished."""

def shutdown() -> None:
    """Shuts the runtime down: cancels work not started, then stops its threads (registered with atexit by pathways)."""

def fail_devices(ids: Sequence[int]) -> None:
    """Marks the devices with these ids failed, for good (pw.testing). NotFoundError for an unknown id."""

class Device:
    id: int
    kind: str
    island: int
    host: int
    memory_capacity: int
    failed: bool
    def bytes_in_use(self) -> int: ...
    def __eq__(self, other: object) -> bool: ...
    def __hash__(self) -> int: ...
    # repr: "TpuDevice(id=3, island=0, host=0)"

# --- Resource manager -----------------------------------------------------

def add_slice(num_devices: int, kind: str) -> VirtualSlice:
    """Raises ValueError (num_devices < 1 or > 65536, any Python int), NotFoundError (unknown kind), ResourceExhaustedError (no island that large)."""

def remap_slice(slice: VirtualSlice, share: bool = False) -> list[int]:
    """Moves the slice's virtual devices off failed devices onto spare ones (share: or ones other slices use) (ResourceManager::Remap); the indices that moved. ResourceExhaustedError when no island has room."""

def slices_on_failed_devices() -> list[VirtualSlice]:
    """The live slices with a virtual device on a failed device, by id."""

class VirtualSlice:
    id: int
    size: int
    island: int
    virtual_devices: list[VirtualDevice]  # index i maps to devices[i]
    devices: list[Device]                 # physical, as mapped now
    epoch: int                            # remaps so far

class VirtualDevice:
    slice: VirtualSlice
    index: int
    physical: Device
    kind: str
    def __eq__(self, other: object) -> bool: ...
    def __hash__(self) -> int: ...

# --- Compiled functions (function IR) -------------------------------------

def op_registry() -> list[tuple[str, int, str, str]]:
    """The op registry (csrc/function_ir/op_registry.h), in enum order: one (name, arity, op_class, type_rule) tuple per op; arity -1 is variadic."""

class FunctionBuilder:
    """Records one shard's computation; every method checks types and raises ValueError with the op and shapes (TypeError for an operand's dtype, NameError for an unbound axis name)."""
    def __init__(self, name: str, axis_name: str) -> None: ...  # axis_name "" = none
    def parameter(self, dtype: str, shape: Sequence[int]) -> int: ...
    def constant(self, array: np.ndarray) -> int: ...  # float32, float64, int32, uint32, bool or bfloat16, any shape
    def convert(self, x: int, dtype: str) -> int: ...
    def bitcast_convert_type(self, x: int, dtype: str) -> int: ...  # float32/int32/uint32 bits
    # op: add sub mul div pow max min eq ne lt le gt ge and or xor shift_left shift_right_logical
    # shift_right_arithmetic (numpy broadcasting)
    def binary(self, op: str, a: int, b: int) -> int: ...
    # op: neg abs exp log tanh sqrt rsqrt sin cos not
    def unary(self, op: str, x: int) -> int: ...
    def select(self, cond: int, x: int, y: int) -> int: ...  # where(cond, x, y)
    def neg(self, x: int) -> int: ...
    def psum(self, x: int, axis_name: str) -> int: ...
    # op: sum mean max min argmax; axes None = all
    def reduce(self, op: str, x: int, axes: Optional[Sequence[int]], keepdims: bool) -> int: ...
    def pcollective(self, op: str, x: int, axis_name: str) -> int: ...  # pmean pmax pmin
    def axis_index(self, axis_name: str) -> int: ...
    def set_axis_size(self, n: int) -> None: ...
    def all_gather(self, x: int, axis_name: str, axis: int) -> int: ...
    def ppermute(self, x: int, axis_name: str, perm: Sequence[tuple[int, int]]) -> int: ...
    def all_to_all(self, x: int, axis_name: str, split_axis: int, concat_axis: int) -> int: ...
    def psum_scatter(self, x: int, axis_name: str, scatter_dimension: int) -> int: ...
    def simulated_compute(self, x: int, microseconds: float) -> int: ...
    def copy(self, x: int) -> int: ...
    def reshape(self, x: int, shape: Sequence[int]) -> int: ...
    def broadcast_to(self, x: int, shape: Sequence[int]) -> int: ...
    def transpose(self, x: int, perm: Sequence[int]) -> int: ...
    def slice(self, x: int, start: Sequence[int], limit: Sequence[int], step: Sequence[int]) -> int: ...
    def rev(self, x: int, axes: Sequence[int]) -> int: ...
    def pad(self, x: int, lo: Sequence[int], hi: Sequence[int], interior: Sequence[int]) -> int: ...
    def concatenate(self, xs: Sequence[int], axis: int) -> int: ...
    def take(self, x: int, indices: int, axis: int) -> int: ...  # int32 indices, clipped
    # combiner: "set", "add", "mul", "max" or "min"; operand: the result's shape or a scalar
    def scatter(self, combiner: str, operand: int, indices: int, updates: int, axis: int,
                size: int) -> int: ...
    def scatter_add(self, updates: int, indices: int, axis: int, size: int) -> int: ...
    def top_k(self, x: int, k: int) -> int: ...  # int32 positions of the k largest, last axis
    def sort(self, x: int, descending: bool) -> int: ...  # int32 argsort of the last axis
    # combiner: "add", "mul", "max" or "min"
    def cumulative(self, combiner: str, x: int, axis: int, reverse: bool) -> int: ...
    def matmul(self, a: int, b: int) -> int: ...  # rank >= 2, batch dims broadcast
    # A loop over `body` (operands: carries, xs, consts); the final carries' and stacked ys' ids
    def scan(self, body: Function, operands: Sequence[int], num_carries: int, num_xs: int,
             length: int, reverse: bool) -> list[int]: ...
    # A while loop: `body` runs on `operands` (the first `num_carries` carries, the rest
    # consts) while `cond` of them (one bool scalar) is true; the final carries' ids
    def while_loop(self, cond: Function, body: Function, operands: Sequence[int],
                   num_carries: int) -> list[int]: ...
    def get_element(self, tuple: int, index: int) -> int: ...
    def svd(self, x: int, full_matrices: bool) -> list[int]: ...
    def lu(self, x: int) -> list[int]: ...
    def eigh(self, x: int) -> list[int]: ...
    def cholesky(self, x: int) -> int: ...
    def qr(self, x: int, full_matrices: bool) -> list[int]: ...
    def triangular_solve(self, a: int, b: int, lower: bool, unit_diagonal: bool,
                         transpose_a: bool) -> int: ...
    axis_size: int  # 0: not set
    def num_values(self) -> int: ...
    def shape(self, v: int) -> tuple[int, ...]: ...
    def dtype(self, v: int) -> str: ...  # "float32", "float64", "int32", "bool" or "uint32"
    def build(self, outputs: Sequence[int]) -> Function: ...

class Function:
    name: str
    axis_name: str
    num_params: int
    num_outputs: int
    nesting_depth: int  # how deeply loops nest, 0 without a scan or while
    def as_text(self) -> str: ...

def compile(function: Function, devices: Sequence[VirtualDevice]) -> CompiledFunction:
    """Raises ValueError if the devices span islands or map to one physical device twice."""

class CompiledFunction:
    name: str
    num_shards: int
    virtual_devices: list[VirtualDevice]
    devices: list[Device]  # physical
    scratch_bytes_per_shard: int  # the memory plan's peak for one shard's intermediates
    def param_types(self) -> list[tuple[tuple[int, ...], str]]: ...   # global (shape, dtype)
    def output_types(self) -> list[tuple[tuple[int, ...], str]]: ...

# --- Programs -------------------------------------------------------------

class ProgramBuilder:
    def __init__(self, name: str) -> None: ...
    def add_arg(self, dtype: str, shape: Sequence[int]) -> int: ...
    def add_call(self, fn: CompiledFunction, inputs: Sequence[int]) -> list[int]: ...
    def value_type(self, v: int) -> tuple[tuple[int, ...], str]: ...
    def build(self, outputs: Sequence[int]) -> Program: ...

class Program:
    name: str
    num_nodes: int
    num_args: int
    def as_text(self) -> str: ...
    def lower(self) -> LoweredProgram:
        """Raises ValueError if an output is an argument."""

class LoweredProgram:
    num_compute_steps: int
    num_transfer_steps: int
    def as_text(self) -> str: ...
    def execute(self, args: Sequence[Union[ShardedBuffer, np.ndarray]]) -> list[ShardedBuffer]:
        """Dispatches all nodes and returns the outputs at once (futures).

        numpy arguments must already have the program's dtype and shape (C-contiguous
        copies are made as needed). Raises ValueError (wrong type/shape/count),
        DeletedBufferError, ResourceExhaustedError (device memory).
        """

# --- Sharded buffers ------------------------------------------------------

class ShardedBuffer:
    shape: tuple[int, ...]
    dtype: np.dtype
    ndim: int
    size: int
    nbytes: int
    devices: list[Device]  # shard i on devices[i]
    def block_until_ready(self) -> ShardedBuffer: ...  # GIL released; raises the producer's error
    def is_ready(self) -> bool: ...
    @property
    def at(self) -> Any: ...  # TypeError: indexed updates run in compiled functions
    def is_deleted(self) -> bool: ...
    def is_suspended(self) -> bool: ...  # its client is suspended: the value is on the host (or in a checkpoint)
    @property
    def is_replicated(self) -> bool: ...  # one value held whole by every device (out_axes=None)
    def delete(self) -> None: ...
    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray: ...
    def __len__(self) -> int: ...
    def __getitem__(self, index: Any) -> Any: ...  # np.asarray(self)[index], on the host
    def __float__(self) -> float: ...  # a one-element buffer, as numpy
    def __int__(self) -> int: ...
    def __bool__(self) -> bool: ...
    def item(self, *index: Any) -> Any: ...  # np.asarray(self).item(*index)
    def __repr__(self) -> str: ...  # numpy's repr of the value, e.g. "array([3., 5.])"

def another_handle(buffer: ShardedBuffer) -> ShardedBuffer:
    """Another handle on the same buffer: delete() of `buffer` leaves the buffer to it."""
def value_view(buffer: ShardedBuffer) -> np.ndarray:
    """In process, the buffer's value where it is (no copy), once ready: a read-only array that holds the buffer."""

def replicated_view(buffer: ShardedBuffer, client: Any = None) -> ShardedBuffer: ...  # shard 0 as the value
def device_put(array: np.ndarray, devices: Sequence[Union[VirtualDevice, Device]]) -> ShardedBuffer:
    """Copies array onto devices, leading axis split over them (array.shape[0] == len(devices)).

    Raises ValueError (shape), TypeError (dtype not float32/float64/int32/bool), NotFoundError.
    """

# Suspend and resume of a client (pw.Client.suspend/resume; csrc/bindings/sharded_buffer.h).
def suspend_client(client: Any, save: Optional[Callable[[list[ShardedBuffer]], None]] = None) -> dict[str, int]:
    """Moves the client's live buffers to host memory (or, with `save`, wherever save(buffers) writes them) and
    frees their devices: {"buffers", "bytes", "failed_buffers"}. RuntimeError if closed or suspended."""

def resume_client(client: Any, loaded: Optional[dict[str, np.ndarray]] = None) -> dict[str, Any]:
    """Puts the suspended values back on devices (other ones where needed), never waiting for memory:
    {"buffers", "bytes", "moved": [{"buffer", "shape", "dtype", "from", "to"}]}. ResourceExhaustedError if one
    fits nowhere (the client stays suspended); RuntimeError if closed or not suspended."""

def client_suspended(client: Any) -> bool: ...

# Host processes (csrc/bindings/host.cc).
has_host_processes: bool
def run_host(args: Sequence[str]) -> int: ...
def _seal_secret(public_key_hex: str, secret: str) -> str: ...

class _HostSessions:
    def __init__(self, addresses: Sequence[str], secret: str, topology: Sequence[tuple[str, str]]) -> None: ...
    def hosts(self) -> list[dict[str, Any]]: ...
    def close(self) -> None: ...

# A pathways service and its tenants (csrc/service/, csrc/client/service_link.h).
def configure_service(address: str, secret: str, name: str, priority: int, devices: int = 0, memory: int = 0,
                      wait_timeout: float = 60.0) -> None:
    """The default runtime will be a tenant of the service at `address`, holding `devices` devices with `memory`
    bytes on each (0: the service's defaults), waiting up to `wait_timeout` s for them (RuntimeError once started)."""

def service_report() -> Optional[dict[str, Any]]:
    """{"policy", "flows": [{tenant, tenant_name, name, weight, priority, device_seconds, gangs, queued, ended,
    freed, freed_after_seconds, devices, memory}]}, or None when this process is not a tenant."""

def tenant_session() -> Optional[int]:
    """This process's tenant id at its service, or None."""

class _Service:
    def __init__(self, topology: Sequence[tuple[str, str]], host_addresses: Sequence[str], host_secret: str,
                 listen: str, secret: str, policy: str, max_tenant_devices: int = 0, tenant_memory: int = 0,
                 max_tenant_memory: int = 0, max_anticipation_ms: float = 5.0) -> None: ...
    address: str
    num_tenants: int
    queued_runs: int
    waiting_reservations: int
    def held_bytes(self, device: int) -> int: ...
    topology: str
    def report(self) -> dict[str, Any]: ...
    def set_policy(self, policy: str) -> None: ...
