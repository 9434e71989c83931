"""Fault injection, for tests and research on failure handling (paper §4.6).

    import pathways as pw
    pw.testing.fail_device(tpus[0])   # a virtual device, a pw.Device or an id
    pw.testing.fail_host(1)           # every device of host 1

A failed device stays failed for the life of the runtime. Work placed on it
fails with `pw.DeviceFailedError` naming the device: gangs that have not
started fail when their turn comes, without running; gangs in their
simulated time fail at once; transfers from or to it fail; and the error
flows through the futures to every dependent, which fails without running.
Buffers on a failed device raise `pw.DeviceFailedError` when read. The other
devices keep working. Use a subprocess (or a fresh runtime) per experiment.
"""

from __future__ import annotations

from typing import Any

from pathways import _checks, _core

__all__ = ["fail_device", "fail_host", "failed_devices"]


def fail_device(*devices: Any) -> None:
    """Marks devices failed (see the module docstring).

    Args:
      *devices: Device ids, `pw.Device`s or virtual devices.

    Raises:
      TypeError: For something that is not a device.
      ValueError: For an unknown device id.
    """
    _core.fail_devices(sorted(_checks.device_ids("fail_device", "devices", devices)))


def fail_host(host: int) -> None:
    """Marks every device of host `host` (its id, as `pw.Device.host`) failed.

    Raises:
      TypeError: If `host` is not an int.
      ValueError: For an unknown host id.
    """
    host = _checks.integer("fail_host", "host", host)
    ids = [d.id for d in _core.devices() if d.host == host]
    if not ids:
        hosts = sorted({d.host for d in _core.devices()})
        raise ValueError(f"fail_host: unknown host {host}; the hosts are {hosts[0]}..{hosts[-1]}")
    _core.fail_devices(ids)


def failed_devices() -> list:
    """The ids of the devices that have failed."""
    return [d.id for d in _core.devices() if d.failed]
