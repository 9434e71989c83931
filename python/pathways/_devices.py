"""Topology configuration, physical devices and virtual device sets.

The runtime simulates islands of accelerators (paper §4.1): each island has
`hosts_per_island` hosts with `devices_per_host` devices connected by ICI, and
islands are connected to each other by DCN. Users do not pick physical devices:
they ask the resource manager for *virtual slices* of an island, and place
compiled functions on the slice's virtual devices (Figure 2).
"""

from __future__ import annotations

import dataclasses
import numbers
import weakref
from typing import Any, Optional, Union

from pathways import _checks, _core

__all__ = [
    "configure",
    "devices",
    "topology",
    "make_virtual_device_set",
    "VirtualDeviceSet",
    "VirtualSlice",
]


def configure(
    islands: Optional[int] = None,
    hosts_per_island: Optional[int] = None,
    devices_per_host: Optional[int] = None,
    device_memory: Optional[Union[int, str]] = None,
    executor_threads: Optional[int] = None,
    intra_op_threads: Optional[int] = None,
    control_latency_us: Optional[float] = None,
    hang_report_seconds: Optional[float] = None,
    hosts: Optional[str] = None,
    ici_latency_us: Optional[float] = None,
    ici_bandwidth_gbps: Optional[float] = None,
    dcn_latency_us: Optional[float] = None,
    dcn_bandwidth_gbps: Optional[float] = None,
    server: Optional[str] = None,
    priority: Optional[int] = None,
    name: Optional[str] = None,
    devices: Optional[int] = None,
    memory: Optional[Union[int, str]] = None,
    wait_timeout: Optional[float] = None,
) -> None:
    """Sets the simulated topology of the runtime before its first use.

    Without `configure`, the runtime reads the environment variable
    `PATHWAYS_TOPOLOGY` when it starts (a spec like
    "islands=2,hosts_per_island=2,devices_per_host=4,device_memory=1GiB"), or
    uses the default: 2 islands x 2 hosts x 4 devices, i.e. 16 "tpu" devices.
    `configure` wins over the environment variable: the topology is then the
    given keywords, and the defaults for those left as None.

    Example:
      >>> pw.configure(islands=4, hosts_per_island=1, devices_per_host=2)

    Args:
      islands: Number of islands (connected to each other by DCN).
      hosts_per_island: Hosts per island.
      devices_per_host: Devices per host (devices of an island share ICI).
        Each count is at least 1, and islands x hosts_per_island x
        devices_per_host is at most 65536 devices.
      device_memory: Memory of each device: an int of bytes, or a string with
        a unit such as "512MiB" or "1GiB" (an integer, then B, KiB, MiB, GiB
        or TiB); from 1 byte to 1TiB.
      executor_threads: Worker threads of the runtime's executor, 0 to 256
        (0: one per core, at most 4).
      intra_op_threads: Executor threads one kernel may split its loop over
        (a large matrix product or fused loop; like XLA:CPU's intra-op
        thread pool), 0 to 256: 0 (the default) all of them, 1 none, so a
        device computes on one thread, as a data-parallel benchmark of
        devices of one core each wants. The shards of a gang run in
        parallel either way.
      control_latency_us: Modeled latency of a control message between the
        client and a host or between hosts (DCN) on the dispatch path, a
        finite number from 0 to 1000000 (1 s); 0 (the default) models none.
        Parallel dispatch pays it once per program, sequential dispatch once
        per node (paper §4.5, Figure 7).
      hang_report_seconds: A gang that has not started this long after its
        submission is reported once, as a `pw.HangWarning` issued by the next
        wait on the runtime (see `pw.diagnose`); a finite number from 0 to
        86400 (one day), 60 by default; 0 turns the watchdog off.
      hosts: Where the hosts run: "in_process" (the default: threads of this
        process); "local_processes" (the runtime starts one host process
        per host on this machine, on loopback, when it starts; they exit
        with this process); "ray" (one host process per node of the running
        Ray cluster, placed with STRICT_SPREAD); or "external" (hosts
        started by hand, Slurm or Kubernetes with `pathways-host
        --client=ADDRESS` register with this client: set PATHWAYS_SECRET,
        and PATHWAYS_CLIENT_ADDRESS to where to listen). See `pw.hosts()`.
      ici_latency_us: The interconnect model (in process only; all four
        keys 0, the default, model nothing: a transfer is done once copied).
        A transfer between slices holds the links it crosses for latency +
        bytes / bandwidth, queueing behind the transfers that hold them, and
        its destination is ready no earlier; it shows in `pw.timeline()`'s
        `transfers()`. `ici_latency_us` is the latency of a transfer inside
        an island (ICI), a finite number from 0 to 1000000 (1 s). Suggested:
        1.
      ici_bandwidth_gbps: ICI bandwidth of one device each way, in Gbit/s:
        every device has one ICI port out and one in, and shard i of a
        transfer holds its source device's port out and its destination
        device's port in. 0 (unlimited) or a finite number from 0.001 to
        1000000. Suggested: 1600 (TPU v5e: 400 GB/s per chip both ways).
      dcn_latency_us: Latency of a transfer across islands (DCN), a finite
        number from 0 to 1000000. Suggested: 20.
      dcn_bandwidth_gbps: DCN bandwidth of one host's NIC each way, in
        Gbit/s, shared by every transfer sending from or receiving at that
        host: two transfers leaving one host at once take turns, so the
        second ends twice as late. 0 (unlimited) or from 0.001 to 1000000.
        Suggested: 200 (TPU v5e: 2 x 100 Gbps NICs per host). The sources
        of the suggestions are in the README ("Choosing the topology").
        With hosts other than "in_process" these keys must stay 0: host
        processes move bytes over real sockets.

      server: Connect to a pathways service (`pathways-server`) as one of
        its tenants instead of starting a runtime of this process's own: its
        connection file, or its address "HOST:PORT" with the secret in
        PATHWAYS_SERVER_SECRET. The topology is then the service's (no other
        topology keyword may be given), and so are the hosts, the islands'
        gang schedulers and their policy, which every tenant shares; each
        tenant's buffers, functions and programs are its own. The
        environment variable PATHWAYS_SERVER does the same.
      priority: A tenant's scheduling priority, an integer from -1000 to
        1000 (default 0): the service admits a higher-priority tenant's
        gangs before a lower one's queued gangs (only with `server`).
      name: A tenant's name in the service's `pw.client_stats()` (default:
        the script's name and this process's id; only with `server`).
      devices: How many devices a tenant holds while connected (default:
        the most the service lets a tenant hold, every device unless it was
        started with --max-tenant-devices). `pw.devices()` lists them, and
        slices go on them only (only with `server`).
      memory: Device memory a tenant holds on each of its devices, an int of
        bytes or a string like "256MiB" (default: the service's
        --tenant-memory, an eighth of a device's unless set). It is the
        tenant's devices' `memory_capacity`: a program beyond it waits for
        memory or raises `pw.ResourceExhaustedError` as on a device of that
        size (only with `server`).
      wait_timeout: Seconds a tenant waits, when it connects, for its
        devices and memory to be free (other tenants hold them), from 0 to
        86400; 60 by default. Then the first use raises
        `pw.ResourceExhaustedError` saying what it waited for and which
        tenants hold it (only with `server`).

    The same limits apply to `PATHWAYS_TOPOLOGY`, with the same errors.

    Raises:
      RuntimeError: If the runtime has already started (any call that touches
        devices starts it).
      TypeError: If a value has the wrong type.
      ValueError: If a value is malformed or out of range (the message names
        the key and its limit).
    """
    # Each value goes to the core on its own, never spliced into a spec.
    topology = {
        "islands": islands, "hosts_per_island": hosts_per_island, "devices_per_host": devices_per_host,
        "device_memory": device_memory, "executor_threads": executor_threads,
        "intra_op_threads": intra_op_threads, "control_latency_us": control_latency_us,
        "hang_report_seconds": hang_report_seconds, "hosts": hosts, "ici_latency_us": ici_latency_us,
        "ici_bandwidth_gbps": ici_bandwidth_gbps, "dcn_latency_us": dcn_latency_us,
        "dcn_bandwidth_gbps": dcn_bandwidth_gbps,
    }
    topology_given = [k for k, v in topology.items() if v is not None]
    if server is not None:
        if topology_given:
            raise ValueError(f"configure: with server=, the topology is the service's: leave "
                             f"{', '.join(sorted(topology_given))} unset")
        from pathways import _service
        _service.configure_tenant(server, priority, name, devices, memory, wait_timeout)
        return
    tenant_given = [k for k, v in (("priority", priority), ("name", name), ("devices", devices), ("memory", memory),
                                   ("wait_timeout", wait_timeout)) if v is not None]
    if tenant_given:
        raise ValueError(f"configure: {', '.join(tenant_given)} are a service's tenant's: give server= too")
    items = []
    for name, value in (
        ("islands", islands),
        ("hosts_per_island", hosts_per_island),
        ("devices_per_host", devices_per_host),
        ("executor_threads", executor_threads),
        ("intra_op_threads", intra_op_threads),
    ):
        if value is not None:
            items.append((name, str(_checks.integer("configure", name, value))))
    if device_memory is not None:
        if not isinstance(device_memory, str):
            if isinstance(device_memory, bool) or not isinstance(device_memory, numbers.Integral):
                raise TypeError(
                    "configure: device_memory must be an int of bytes or a str like '512MiB', "
                    f"got {device_memory!r}"
                )
            device_memory = str(int(device_memory))
        items.append(("device_memory", device_memory))
    for name, value in (
        ("control_latency_us", control_latency_us),
        ("hang_report_seconds", hang_report_seconds),
        ("ici_latency_us", ici_latency_us),
        ("ici_bandwidth_gbps", ici_bandwidth_gbps),
        ("dcn_latency_us", dcn_latency_us),
        ("dcn_bandwidth_gbps", dcn_bandwidth_gbps),
    ):
        if value is not None:
            items.append((name, repr(_checks.real("configure", name, value))))
    if hosts is not None:
        if not isinstance(hosts, str):
            raise TypeError("configure: hosts must be a str ('in_process', 'local_processes', 'ray' or "
                            f"'external'), got {hosts!r}")
        items.append(("hosts", hosts))
    if not items:
        if _core.is_started():
            raise RuntimeError("configure() must be called before the runtime starts")
        return
    _core.configure(items)


def devices() -> list:
    """Returns all physical devices of the runtime, ordered by id.

    In a tenant of a service (`pw.configure(server=...)`), the devices the
    service granted it (`devices=`), with its memory on each as their
    `memory_capacity`. Starts the runtime if needed.

    Returns:
      A list of `pathways.Device` (with `id`, `kind`, `island`, `host`,
      `memory_capacity`).
    """
    return _core.devices()


def topology() -> dict:
    """Returns the topology the runtime runs with.

    Starts the runtime if needed.

    Returns:
      A dict with keys `islands`, `hosts_per_island`, `devices_per_host`,
      `device_memory` (bytes), `executor_threads`, `intra_op_threads`,
      `control_latency_us`, `hang_report_seconds`, `ici_latency_us`, `ici_bandwidth_gbps`,
      `dcn_latency_us`, `dcn_bandwidth_gbps` (0: not modeled) and `hosts`
      ("in_process" or "local_processes").
    """
    return _core.topology()


@dataclasses.dataclass(frozen=True)
class HostInfo:
    """One host of the runtime (see `pw.hosts()`)."""

    id: int
    island: int
    pid: int
    address: Optional[str]  # "127.0.0.1:PORT" for a host process; None in process
    alive: bool
    incarnation: Optional[str] = None  # changes each time a host process starts
    status: Optional[str] = None  # why the host was lost, once it is


def hosts() -> list:
    """Lists every host of the runtime: `id`, `island`, `pid`, `address`, `alive`.

    In process (the default) every host is this process (`address` None). With
    `hosts="local_processes"` each host is a process of its own, reached at
    `address`; a host whose process died or stopped answering is not `alive`
    and its `status` says why. Starts the runtime if needed.
    """
    return [HostInfo(**h) for h in _core.hosts()]


_live_slices: "weakref.WeakValueDictionary[int, VirtualSlice]" = weakref.WeakValueDictionary()


def live_slices() -> list:
    """The `VirtualSlice`s made by `add_slice` that are still referenced, by id."""
    return [s for _, s in sorted(_live_slices.items())]


class VirtualSlice:
    """A slice of virtual devices on one island, assigned by the resource manager.

    Virtual device `i` maps to physical device `physical_devices[i]`; several
    slices may share physical devices (the resource manager multiplexes them).
    The mapping changes only when `pw.elastic.remap` moves the slice off
    failed devices (`epoch` counts the remaps).
    Functions placed with `pw.pmap(fn, devices=slice.tpus)` run on the slice.

    Attributes:
      id: The slice's id, unique in the runtime.
      kind: The device kind, e.g. "tpu".
      island: The island all the slice's devices are on.
      size: The number of devices.
      devices: The virtual devices (`pathways.VirtualDevice`), in order.
      physical_devices: The physical devices they map to, in order.
    """

    __slots__ = ("_slice", "kind", "devices", "__weakref__")

    def __init__(self, core_slice: Any, kind: str):
        self._slice = core_slice
        self.kind = kind
        self.devices = list(core_slice.virtual_devices)
        _live_slices[core_slice.id] = self

    @property
    def id(self) -> int:
        return self._slice.id

    @property
    def island(self) -> int:
        return self._slice.island

    @property
    def size(self) -> int:
        return self._slice.size

    @property
    def physical_devices(self) -> list:
        return list(self._slice.devices)

    @property
    def epoch(self) -> int:
        """How many times the slice was remapped (`pw.elastic.remap`)."""
        return self._slice.epoch

    @property
    def tpus(self) -> list:
        """The virtual TPU devices of the slice (for slices of kind "tpu")."""
        if self.kind != "tpu":
            raise AttributeError(f"slice {self.id} has {self.kind} devices, not tpus; use .devices")
        return list(self.devices)

    def __len__(self) -> int:
        return len(self.devices)

    def __iter__(self):
        return iter(self.devices)

    def __repr__(self) -> str:
        ids = ", ".join(str(d.id) for d in self._slice.devices)
        return (
            f"VirtualSlice(id={self.id}, kind={self.kind!r}, island={self.island}, "
            f"size={self.size}, physical_devices=[{ids}])"
        )


class VirtualDeviceSet:
    """A set of virtual slices requested by one client (paper §3, Figure 2).

    Create with `pw.make_virtual_device_set()`, then call `add_slice` once per
    slice.

    Attributes:
      slices: The `VirtualSlice`s added so far, in order.
    """

    def __init__(self) -> None:
        self.slices: list[VirtualSlice] = []

    def add_slice(self, **kwargs: int) -> VirtualSlice:
        """Asks the resource manager for a slice of `n` devices of one kind.

        Example:
          >>> slice = pw.make_virtual_device_set().add_slice(tpu_devices=2)
          >>> f = pw.pmap(lambda x: x * 2., devices=slice.tpus)

        Args:
          **kwargs: Exactly one keyword `<kind>_devices=n`, e.g.
            `tpu_devices=2`.

        Returns:
          The `VirtualSlice`, all on one island.

        Raises:
          TypeError: Unless exactly one keyword of the form `<kind>_devices`
            with an int value is given.
          ValueError: If `n` < 1 or `n` > 65536 (more devices than any
            topology has).
          NotFoundError: If no device has that kind.
          ResourceExhaustedError: If no island has `n` devices.
        """
        if len(kwargs) != 1:
            got = ", ".join(kwargs) if kwargs else "none"
            raise TypeError(
                "add_slice() takes exactly one keyword of the form <kind>_devices=n "
                f"(e.g. tpu_devices=2), got: {got}"
            )
        ((key, n),) = kwargs.items()
        if not key.endswith("_devices") or key == "_devices":
            raise TypeError(
                f"add_slice() got an unexpected keyword {key!r}; expected <kind>_devices=n "
                "(e.g. tpu_devices=2)"
            )
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError(f"add_slice(): {key} must be an int, got {n!r}")
        kind = key[: -len("_devices")]
        vslice = VirtualSlice(_core.add_slice(n, kind), kind)
        self.slices.append(vslice)
        return vslice

    def __len__(self) -> int:
        return len(self.slices)

    def __repr__(self) -> str:
        return f"VirtualDeviceSet(slices={self.slices!r})"


def make_virtual_device_set() -> VirtualDeviceSet:
    """Creates an empty set of virtual devices.

    Returns:
      A `VirtualDeviceSet`; add slices with `add_slice(tpu_devices=n)`.
    """
    return VirtualDeviceSet()


def checked_devices(where: str, value: Any, kinds: tuple, expected: str) -> list:
    """`value` as a list of devices: a `VirtualSlice`'s, one device of `kinds`, or an iterable of them.

    Args:
      where: The function, for the message.
      value: The `devices` argument.
      kinds: The device classes accepted.
      expected: What is accepted, in words, for the message.

    Raises:
      TypeError: For anything else (None, a str, a device of another kind),
        naming `where` and `devices`.
    """
    if isinstance(value, VirtualSlice):
        return value.devices
    if isinstance(value, kinds):
        return [value]
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise TypeError(f"{where}: devices must be {expected}, got {value!r}")
    out = list(value)
    for k, d in enumerate(out):
        if not isinstance(d, kinds):
            raise TypeError(
                f"{where}: devices must be {expected}, got {d!r} ({type(d).__name__}) at index {k}"
            )
    return out
