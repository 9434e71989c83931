"""Multi-tenancy, dispatch modes and timelines (paper §4.4–4.5, §5.2, Figure 9).

* `Client`: a tenant of the islands. Work submitted inside `with client:` is
  scheduled and accounted as that client's; under the proportional-share
  policy each backlogged client gets device time in proportion to its weight.
* `set_scheduling_policy`: "fifo" or "proportional_share", for every island.
* `dispatch_mode`: overrides parallel/sequential dispatch for calls in scope.
* `timeline`: records what each device ran and when, and the transfers
  between slices (ICI or DCN), and exports it as a Chrome/Perfetto trace.
"""

from __future__ import annotations

import contextlib
import json
import time
from typing import Any, Iterator, Optional, Sequence

from pathways import _checks, _core, checkpointing
from pathways._program import _check_dispatch
from pathways._trace_state import _state

__all__ = [
    "Client",
    "client_stats",
    "dispatch_mode",
    "scheduling_policy",
    "set_scheduling_policy",
    "timeline",
    "Timeline",
    "device_busy_seconds",
]


class Client:
    """A tenant: the unit of proportional share and device-time accounting.

    Several clients (for example one per thread) may submit to the same
    islands at once. Use `with client:` around the calls to attribute; the
    scope is per thread and clients may nest (the innermost wins).

    A client owns the buffers made in its scope (their `owner` label says
    so; `pw.memory_stats()["by_client"]` sums them). `close()` frees them
    all at once, even with work in flight; `suspend()` moves them to host
    memory and frees its devices for others until `resume()`.

    Example:
      >>> a, b = pw.Client("a", weight=1), pw.Client("b", weight=3)
      >>> pw.set_scheduling_policy("proportional_share")
      >>> with a:
      ...     f(x)

    Args:
      name: A name for traces and stats (need not be unique).
      weight: Proportional-share weight, a number > 0 and <= 1e9.

    Raises:
      TypeError: If the weight is not a number.
      ValueError: If the weight is not in (0, 1e9].
    """

    def __init__(self, name: str, weight: float = 1.0):
        self._core = _core.create_client(str(name), _checks.real("Client", "weight", weight))
        self._saved: list = []
        self._suspended_to: Optional[str] = None  # the checkpoint of suspend(path=...)

    @property
    def name(self) -> str:
        return self._core.name

    @property
    def weight(self) -> float:
        return self._core.weight

    @property
    def device_seconds(self) -> float:
        """Device time used so far: each gang's duration times its devices."""
        return self._core.device_seconds

    @property
    def gangs(self) -> int:
        """Gangs (compiled-function runs) completed for this client."""
        return self._core.gangs

    @property
    def bytes_in_use(self) -> int:
        """Device memory held by this client's live buffers (all shards)."""
        return self._core.bytes_in_use

    @property
    def live_buffers(self) -> int:
        """How many of this client's buffers are alive."""
        return self._core.live_buffers

    @property
    def closed(self) -> bool:
        return self._core.closed

    def close(self) -> int:
        """Ends the client and frees what it owned (paper §4.6).

        From now on work in its scope raises RuntimeError. Its gangs that have
        not started are cancelled (their outputs raise `PathwaysError` saying
        so); running ones finish. Every buffer it owns is
        deleted (a suspended client's host copies too), as by
        `ShardedBuffer.delete()`: using one raises
        `DeletedBufferError` saying the client closed. Device memory returns
        once work in flight that reads those buffers is done. Idempotent.

        Returns:
          How many buffers it deleted.
        """
        return _core.close_client(self._core)

    @property
    def suspended(self) -> bool:
        """True from `suspend()` until `resume()` (and while either runs)."""
        return _core.client_suspended(self._core)

    def suspend(self, path: Any = None) -> dict:
        """Moves the client's buffers off its devices, freeing them for others.

        Waits for the client's dispatches under way and for its buffers to be
        computed, then copies every buffer that its handles hold (once,
        however many handles share it) to host memory in this process, or
        with `path` into a checkpoint that the hosts write
        (`pw.checkpointing.save`, one array per buffer), and drops the device
        buffers: `bytes_in_use` goes to 0 once nothing else holds them (work
        of other clients still reading them, a checkpoint being written).
        The handles stay valid: `np.asarray(handle)` reads the host copy
        (RuntimeError for a value in a checkpoint), `delete()` drops it;
        passing a handle to a program, or any other use of its devices,
        raises RuntimeError saying to resume. Until `resume()`, programs and
        `device_put` in its scope raise RuntimeError. A buffer that failed
        (its producer, or a device of it) stays as it is, with its error.

        Args:
          path: None (host memory), or a directory that does not exist yet
            for the checkpoint; it is left there after `resume()`.

        Returns:
          {"buffers": buffers moved, "bytes": their bytes (every shard),
          "failed_buffers": failed ones left as they were, "seconds": time
          taken, "path": the checkpoint's absolute path or None}.

        Raises:
          RuntimeError: If the client is closed, or suspended already.
          TypeError, ValueError, FileExistsError: For a bad `path`, as
            `pw.checkpointing.save`. On any error the client stays as it
            was.
        """
        start = time.perf_counter()
        if path is None:
            summary = _core.suspend_client(self._core)
        else:
            final = checkpointing._path_arg("suspend", path)

            def save(buffers: list) -> None:
                if buffers:
                    checkpointing.save(final, {f"b{i}": b for i, b in enumerate(buffers)}).result()

            summary = _core.suspend_client(self._core, save)
            self._suspended_to = final if summary["buffers"] else None
        summary["seconds"] = time.perf_counter() - start
        summary["path"] = self._suspended_to
        return summary

    def resume(self) -> dict:
        """Brings the buffers of a suspended client back onto devices.

        Each buffer goes back to its devices when they are healthy, usable
        and have room now; else to as many other devices of one island that
        are (its own island first, keeping the devices that can stay, the
        least used first). It never waits for memory that other clients
        hold. Every handle keeps working: the same object, value and
        replication; a program taking a moved buffer copies it to its own
        devices, as for any argument on other devices. The buffers' program
        label becomes "device_put". All or nothing.

        Returns:
          {"buffers", "bytes", "seconds", "moved": one {"buffer", "shape",
          "dtype", "from", "to"} (device ids) per buffer on other devices}.

        Raises:
          ResourceExhaustedError: If a buffer fits nowhere now: the client
            stays suspended, every value kept; resume again later.
          RuntimeError: If the client is closed or not suspended.
        """
        start = time.perf_counter()
        loaded = None
        if self._suspended_to is not None and not self._core.closed and _core.client_suspended(self._core):
            loaded = checkpointing.restore(self._suspended_to)
        summary = _core.resume_client(self._core, loaded)
        self._suspended_to = None
        summary["seconds"] = time.perf_counter() - start
        return summary

    def __enter__(self) -> "Client":
        if self._core.closed:
            raise RuntimeError(f"client {self.name!r} is closed")
        self._saved.append(_state.client)
        _state.client = self._core
        return self

    def __exit__(self, *exc: Any) -> None:
        _state.client = self._saved.pop()

    def __repr__(self) -> str:
        state = ", closed" if self.closed else ", suspended" if self.suspended else ""
        return f"Client({self.name!r}, weight={self.weight:g}{state})"


def set_scheduling_policy(policy: str) -> None:
    """Sets the gang schedulers' policy on every island.

    Args:
      policy: "fifo" (gangs ordered as submitted) or "proportional_share"
        (start-time fair queueing over clients' weights).

    Raises:
      TypeError: If `policy` is not a str.
      ValueError: For an unknown policy.
    """
    _core.set_scheduling_policy(_checks.string("set_scheduling_policy", "policy", policy))


def scheduling_policy() -> str:
    """The policy in force: "fifo" or "proportional_share"."""
    return _core.scheduling_policy()


def client_stats() -> dict:
    """Per client name: {"device_seconds": float, "gangs": int, "weight": float}.

    Clients with the same name are summed.

    In a tenant of a service (`pw.configure(server=...)`), every tenant's
    clients, as the service accounts them: each entry also has "tenant" (its
    tenant's name), "priority", "queued" (runs waiting for admission now),
    "ended" (its tenant has gone), "freed" (every host has dropped what
    the gone tenant held), "devices" and "memory" (what its tenant holds:
    devices, and bytes on each). A tenant's work outside any `Client` is the
    entry of the tenant's own name.
    """
    report = _core.service_report()
    if report is not None:
        return _service_stats(report)
    stats: dict = {}
    for c in _core.clients():
        entry = stats.setdefault(c.name, {"device_seconds": 0.0, "gangs": 0, "weight": c.weight})
        entry["device_seconds"] += c.device_seconds
        entry["gangs"] += c.gangs
    return stats


def _service_stats(report: dict) -> dict:
    stats: dict = {}
    for f in report["flows"]:
        entry = stats.setdefault(f["name"], {
            "device_seconds": 0.0, "gangs": 0, "weight": f["weight"], "tenant": f["tenant_name"],
            "priority": f["priority"], "queued": 0, "ended": f["ended"], "freed": f["freed"],
            "devices": f["devices"], "memory": f["memory"]})
        entry["device_seconds"] += f["device_seconds"]
        entry["gangs"] += f["gangs"]
        entry["queued"] += f["queued"]
        entry["ended"] = entry["ended"] and f["ended"]
        entry["freed"] = entry["freed"] and f["freed"]
    return stats


@contextlib.contextmanager
def dispatch_mode(mode: str) -> Iterator[None]:
    """Runs the programs called in this scope (this thread) with `mode`.

    Args:
      mode: "parallel" or "sequential" (see `pw.program`).

    Raises:
      ValueError: For an unknown mode.
    """
    _check_dispatch(mode)
    saved = _state.dispatch
    _state.dispatch = mode
    try:
        yield
    finally:
        _state.dispatch = saved


def device_busy_seconds() -> list:
    """The runtime's own account of each device's busy time since start, by device id."""
    return _core.device_busy_seconds()


class Timeline:
    """What each device ran and when, recorded by `pw.timeline()`.

    Events are per gang; each covers every device of the gang. Transfers
    between slices are listed apart (`transfers()`).
    """

    def __init__(self) -> None:
        self._raw: list = []
        self._raw_transfers: list = []
        self._lists: dict = {}
        self._origin_ns = _core.now_ns()
        self.wall_seconds = 0.0

    def _devices_of(self, list_id: int) -> list:
        devices = self._lists.get(list_id)
        if devices is None:
            devices = self._lists[list_id] = _core.device_list(list_id)
        return devices

    def events(self) -> list:
        """One dict per gang and device: device, island, host, start_us, end_us, client, program, node, gang.

        Times are microseconds since the timeline started. `gang` numbers the
        gang: the events of one gang share it. With host processes a gang
        spanning hosts has each host's own start and end (its part there);
        group by `gang` to count gangs.
        """
        info = {d.id: d for d in _core.devices()}
        out = []
        for list_id, start, end, client, program, node, gang in self._raw:
            for dev in self._devices_of(list_id):
                d = info[dev]
                out.append(
                    {
                        "device": dev,
                        "island": d.island,
                        "host": d.host,
                        "start_us": (start - self._origin_ns) / 1e3,
                        "end_us": (end - self._origin_ns) / 1e3,
                        "client": client,
                        "program": program,
                        "node": node,
                        "gang": gang,
                    }
                )
        return out

    def transfers(self) -> list:
        """One dict per transfer between slices, in the order they finished.

        Keys: link ("ici" inside an island, "dcn" across islands), bytes (all
        shards), src_devices and dst_devices (device ids, shard i from the
        one to the other), src_hosts and dst_hosts (sorted host ids), and
        start_us, end_us: microseconds since the timeline started. In
        process, without an interconnect model (see `pw.configure`'s
        ici_*/dcn_* keys), a transfer lasts as long as its copy; with one,
        from when it took its links until its destination was ready, which is
        at least latency + bytes / bandwidth. Transfers between host
        processes (hosts="local_processes") are not recorded.
        """
        info = {d.id: d for d in _core.devices()}
        out = []
        for src_id, dst_id, start, end, link, nbytes in self._raw_transfers:
            src, dst = self._devices_of(src_id), self._devices_of(dst_id)
            out.append(
                {
                    "link": link,
                    "bytes": nbytes,
                    "src_devices": list(src),
                    "dst_devices": list(dst),
                    "src_hosts": sorted({info[d].host for d in src}),
                    "dst_hosts": sorted({info[d].host for d in dst}),
                    "start_us": (start - self._origin_ns) / 1e3,
                    "end_us": (end - self._origin_ns) / 1e3,
                }
            )
        return out

    def device_busy_seconds(self) -> dict:
        """{device id: busy seconds} over the recorded gangs."""
        busy: dict = {}
        for list_id, start, end, *_ in self._raw:
            for dev in self._devices_of(list_id):
                busy[dev] = busy.get(dev, 0.0) + (end - start) * 1e-9
        return busy

    def export_chrome_trace(self, path: str, devices: Optional[Sequence[Any]] = None) -> None:
        """Writes the timeline as Chrome/Perfetto trace-event JSON.

        One track (thread) per device, grouped in one process per host, named
        "island I / host H". Transfers between slices are async slices
        ("transfer" category, named "ici 4096 B" or "dcn 4096 B") in the
        process of their first destination host. Open it in
        https://ui.perfetto.dev or chrome://tracing.

        Args:
          path: File to write.
          devices: The devices to include, as device ids, `pw.Device`s or
            virtual devices (their physical devices); default: every device
            that ran something.

        Raises:
          TypeError: If `devices` is not a sequence of those (a str is not).
          ValueError: If `devices` names a device id the runtime does not have.
        """
        info = {d.id: d for d in _core.devices()}
        wanted = None if devices is None else _checks.device_ids("export_chrome_trace", "devices", devices)
        trace: list = []
        tracks: set = set()
        for ev in self.events():
            dev = ev["device"]
            if wanted is not None and dev not in wanted:
                continue
            host = info[dev].host
            tracks.add((host, dev))
            trace.append(
                {
                    "name": ev["node"],
                    "cat": ev["client"],
                    "ph": "X",
                    "ts": round(ev["start_us"], 3),
                    "dur": round(ev["end_us"] - ev["start_us"], 3),
                    "pid": host,
                    "tid": dev,
                    "args": {"program": ev["program"], "client": ev["client"]},
                }
            )
        hosts = {h for h, _ in tracks}
        for k, tr in enumerate(self.transfers()):
            if wanted is not None and not wanted.intersection(tr["src_devices"] + tr["dst_devices"]):
                continue
            host = tr["dst_hosts"][0]
            hosts.add(host)
            common = {"name": f'{tr["link"]} {tr["bytes"]} B', "cat": "transfer", "id": k, "pid": host,
                      "tid": tr["dst_devices"][0]}
            args = {"link": tr["link"], "bytes": tr["bytes"], "src_devices": tr["src_devices"],
                    "dst_devices": tr["dst_devices"]}
            trace.append({**common, "ph": "b", "ts": round(tr["start_us"], 3), "args": args})
            trace.append({**common, "ph": "e", "ts": round(tr["end_us"], 3)})
        meta = []
        for host in sorted(hosts):
            island = next(d.island for d in info.values() if d.host == host)
            meta.append(
                {"name": "process_name", "ph": "M", "ts": 0, "pid": host, "tid": 0,
                 "args": {"name": f"island {island} / host {host}"}}
            )
            meta.append(
                {"name": "process_sort_index", "ph": "M", "ts": 0, "pid": host, "tid": 0,
                 "args": {"sort_index": host}}
            )
        for host, dev in sorted(tracks):
            meta.append(
                {"name": "thread_name", "ph": "M", "ts": 0, "pid": host, "tid": dev,
                 "args": {"name": f"device {dev}"}}
            )
        with open(path, "w") as f:
            json.dump({"traceEvents": meta + trace, "displayTimeUnit": "ms"}, f)


@contextlib.contextmanager
def timeline() -> Iterator[Timeline]:
    """Records what every device runs in this scope (all threads and clients).

    Recording costs one event per gang and per transfer between slices. On
    exit, waits for the gangs dispatched before the exit to finish (not for
    work other threads keep submitting), so every gang of the scope is in
    the timeline; a transfer is in it once its destination is ready (wait
    for a program's outputs inside the scope to be sure of its last
    transfers). A gang that started before the scope has a negative
    `start_us`.

    Scopes may nest, and several threads may record at once: each timeline
    gets every gang that finished while it was open, so an outer scope also
    has the gangs of the scopes inside it.

    Yields:
      A `Timeline`, filled when the scope exits.
    """
    tl = Timeline()
    session = _core.timeline_start()
    try:
        yield tl
    finally:
        try:
            _core.await_submitted()  # interruptible (Ctrl-C)
        finally:
            tl._raw, tl._raw_transfers = _core.timeline_stop(session)
            tl.wall_seconds = (_core.now_ns() - tl._origin_ns) * 1e-9
