"""Topology configuration, physical devices and virtual device sets.

The runtime simulates islands of accelerators (paper §4.1): each island has
`hosts_per_island` hosts with `devices_per_host` devices connected by ICI, and
islands are connected to each other by DCN. Users do not pick physical devices:
they ask the resource manager for *virtual slices* of an island, and place
compiled functions on the slice's virtual devices (Figure 2).
"""

from __future__ import annotations

from typing import Any, Optional, Union

from pathways import _core

__all__ = [
    "configure",
    "devices",
    "topology",
    "make_virtual_device_set",
    "VirtualDeviceSet",
    "VirtualSlice",
]


def _int_at_least(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"configure: {name} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"configure: {name} must be at least {minimum}, got {value}")
    return value


def configure(
    islands: Optional[int] = None,
    hosts_per_island: Optional[int] = None,
    devices_per_host: Optional[int] = None,
    device_memory: Optional[Union[int, str]] = None,
    executor_threads: Optional[int] = None,
    control_latency_us: Optional[float] = None,
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
      device_memory: Memory of each device: an int of bytes, or a string with
        a unit such as "512MiB" or "1GiB".
      executor_threads: Worker threads of the runtime's executor (0: one per
        core, at most 4).
      control_latency_us: Modeled latency of a control message between the
        client and a host or between hosts (DCN) on the dispatch path; 0 (the
        default) models none. Parallel dispatch pays it once per program,
        sequential dispatch once per node (paper §4.5, Figure 7).

    Raises:
      RuntimeError: If the runtime has already started (any call that touches
        devices starts it).
      TypeError: If a value has the wrong type.
      ValueError: If a value is out of range or the spec is malformed.
    """
    parts = []
    for name, value in (
        ("islands", islands),
        ("hosts_per_island", hosts_per_island),
        ("devices_per_host", devices_per_host),
    ):
        if value is not None:
            parts.append(f"{name}={_int_at_least(name, value, 1)}")
    if device_memory is not None:
        if isinstance(device_memory, str):
            parts.append(f"device_memory={device_memory.strip()}")
        else:
            parts.append(f"device_memory={_int_at_least('device_memory', device_memory, 1)}B")
    if executor_threads is not None:
        parts.append(f"executor_threads={_int_at_least('executor_threads', executor_threads, 0)}")
    if control_latency_us is not None:
        if isinstance(control_latency_us, bool) or not isinstance(control_latency_us, (int, float)):
            raise TypeError(f"configure: control_latency_us must be a number, got {control_latency_us!r}")
        if control_latency_us < 0:
            raise ValueError(f"configure: control_latency_us must be >= 0, got {control_latency_us}")
        parts.append(f"control_latency_us={float(control_latency_us)}")
    if not parts:
        if _core.is_started():
            raise RuntimeError("configure() must be called before the runtime starts")
        return
    _core.configure(",".join(parts))


def devices() -> list:
    """Returns all physical devices of the runtime, ordered by id.

    Starts the runtime if needed.

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
      `device_memory` (bytes) and `executor_threads`.
    """
    return _core.topology()


class VirtualSlice:
    """A slice of virtual devices on one island, assigned by the resource manager.

    Virtual device `i` maps to physical device `physical_devices[i]`; several
    slices may share physical devices (the resource manager multiplexes them).
    Functions placed with `pw.pmap(fn, devices=slice.tpus)` run on the slice.

    Attributes:
      id: The slice's id, unique in the runtime.
      kind: The device kind, e.g. "tpu".
      island: The island all the slice's devices are on.
      size: The number of devices.
      devices: The virtual devices (`pathways.VirtualDevice`), in order.
      physical_devices: The physical devices they map to, in order.
    """

    __slots__ = ("_slice", "kind", "devices")

    def __init__(self, core_slice: Any, kind: str):
        self._slice = core_slice
        self.kind = kind
        self.devices = list(core_slice.virtual_devices)

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
          ValueError: If `n` < 1.
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


def as_device_list(devices: Any) -> list:
    """Normalizes a `VirtualSlice` or a sequence of devices to a list."""
    if isinstance(devices, VirtualSlice):
        return list(devices.devices)
    return list(devices)
