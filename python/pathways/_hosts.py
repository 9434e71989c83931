"""Host processes started by this client on this machine (hosts="local_processes").

Each host is `python -m pathways.host --secret-stdin`: the client writes the
cluster's secret on the host's stdin and keeps the pipe open, so a host ends
when its client does, however the client ends (even SIGKILL). Hosts run in a
session of their own, so a Ctrl-C in the client's terminal reaches only the
client. Each binds port 0 and reports its address on its first line of
output.
"""

from __future__ import annotations

import dataclasses
import os
import re
import secrets
import select
import subprocess
import sys
import tempfile
import time
from typing import IO, List, Optional

_READY = re.compile(rb"^pathways-host ready address=(\S+) pid=(\d+) incarnation=([0-9a-f]+)\s*$")
_SEALING_KEY = re.compile(rb"^pathways-host sealing-key=([0-9a-f]{64})\s*$")


def make_secret() -> str:
    """A fresh secret for a cluster: 256 random bits, hex."""
    return secrets.token_hex(32)


@dataclasses.dataclass
class HostProcess:
    """One host process this client started."""

    index: int
    address: str
    pid: int
    incarnation: str
    process: subprocess.Popen
    log: IO[bytes]  # the host's stderr

    def alive(self) -> bool:
        return self.process.poll() is None

    def stderr_text(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")


def start_local_hosts(count: int, secret: str, timeout: float = 60.0,
                      listen: str = "127.0.0.1:0") -> List[HostProcess]:
    """Starts `count` host processes and waits until each reports its address.

    Raises:
      RuntimeError: If a host exits or stays silent for `timeout` seconds;
        every host started is stopped then, and the message holds the
        host's error output.
    """
    started = []
    try:
        for i in range(count):
            log = tempfile.TemporaryFile()
            proc = subprocess.Popen(
                [sys.executable, "-m", "pathways.host", "--secret-stdin", f"--listen={listen}"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                start_new_session=True)
            assert proc.stdin is not None
            proc.stdin.write(secret.encode() + b"\n")
            proc.stdin.flush()
            started.append((proc, log))
        deadline = time.monotonic() + timeout
        return [_await_ready(i, proc, log, deadline) for i, (proc, log) in enumerate(started)]
    except BaseException:
        for proc, log in started:
            _stop(proc, 1.0)
        raise


def _read_line(index: int, proc: subprocess.Popen, log: IO[bytes], deadline: float, what: str) -> bytes:
    """The host's next line of output (one byte at a time: nothing after it is consumed)."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    line = b""
    while not line.endswith(b"\n"):
        remaining = deadline - time.monotonic()
        ready, _, _ = select.select([fd], [], [], max(remaining, 0.0))
        chunk = os.read(fd, 1) if ready else b""
        if not chunk:
            why = "exited" if ready or proc.poll() is not None else f"did not report its {what} in time"
            _stop(proc, 1.0)
            log.seek(0)
            raise RuntimeError(f"host process {index} (pid {proc.pid}) {why}; its output: "
                               f"{(line + log.read()).decode(errors='replace').strip() or '(none)'}")
        line += chunk
    return line[:-1]


def _await_ready(index: int, proc: subprocess.Popen, log: IO[bytes], deadline: float) -> HostProcess:
    line = _read_line(index, proc, log, deadline, "address")
    m = _READY.match(line)
    if m is None:
        _stop(proc, 1.0)
        raise RuntimeError(f"host process {index} (pid {proc.pid}) said {line!r}, not its address")
    return HostProcess(index, m.group(1).decode(), int(m.group(2)), m.group(3).decode(), proc, log)


@dataclasses.dataclass
class SealedStart:
    """A host process started without its secret: it waits for the secret
    sealed to `sealing_key` (hex), which only it can open (hosts="ray")."""

    proc: subprocess.Popen
    log: IO[bytes]
    sealing_key: str
    deadline: float


def start_sealed_host(timeout: float = 60.0, listen: str = "127.0.0.1:0") -> SealedStart:
    """Starts one host process that takes its secret sealed to its own key
    (`python -m pathways.host --sealed-secret-stdin`); returns once it has
    printed that key. Finish with `finish_sealed_host`.

    Raises:
      RuntimeError: If the host exits or stays silent for `timeout` seconds.
    """
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(
        [sys.executable, "-m", "pathways.host", "--sealed-secret-stdin", f"--listen={listen}"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, start_new_session=True)
    deadline = time.monotonic() + timeout
    line = _read_line(0, proc, log, deadline, "sealing key")
    m = _SEALING_KEY.match(line)
    if m is None:
        _stop(proc, 1.0)
        raise RuntimeError(f"host process (pid {proc.pid}) said {line!r}, not its sealing key")
    return SealedStart(proc, log, m.group(1).decode(), deadline)


def finish_sealed_host(start: SealedStart, sealed_secret: str) -> HostProcess:
    """Gives the host of `start` its sealed secret (hex) and waits until it
    reports its address; its stdin stays open (the host ends when it closes).

    Raises:
      RuntimeError: If the host exits (a secret sealed to another key, say)
        or stays silent until the start's deadline.
    """
    assert start.proc.stdin is not None
    try:
        start.proc.stdin.write(sealed_secret.encode() + b"\n")
        start.proc.stdin.flush()
    except OSError:
        pass  # it exited: _await_ready reports why
    return _await_ready(0, start.proc, start.log, start.deadline)


def _stop(proc: subprocess.Popen, timeout: float) -> Optional[int]:
    """Closes the host's stdin (it stops), then kills it if it has not after `timeout` s."""
    try:
        if proc.stdin is not None:
            proc.stdin.close()
    except OSError:
        pass
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def stop_local_hosts(hosts: List[HostProcess], timeout: float = 5.0) -> List[Optional[int]]:
    """Stops every host (closing their pipes at once, then waiting); their exit codes."""
    for h in hosts:
        try:
            if h.process.stdin is not None:
                h.process.stdin.close()
        except OSError:
            pass
    codes = [_stop(h.process, timeout) for h in hosts]
    for h in hosts:
        if h.process.stdout is not None:
            h.process.stdout.close()
    return codes


def connect(hosts: List[HostProcess], secret: str, islands: int, hosts_per_island: int,
            devices_per_host: int):
    """Opens the client's sessions with `hosts` (host i serves host i of the topology)."""
    from pathways import _core

    topology = [("islands", str(islands)), ("hosts_per_island", str(hosts_per_island)),
                ("devices_per_host", str(devices_per_host))]
    return _core._HostSessions([h.address for h in hosts], secret, topology)


# The hosts the runtime started (hosts="local_processes"): their pipes stay
# open as long as this process lives, which keeps them running.
_launched: List[HostProcess] = []


# How the runtime's hosts were started (launch_for_runtime): (mode, secret),
# for a host that replaces a lost one (launch_replacement).
_runtime_launch: Optional[tuple] = None


# Launchers of hosts elsewhere than on this machine, by mode: `launch(count, secret)`
# gives the hosts' addresses. pathways._ray_hosts, which builds on this module,
# adds "ray" (one host per Ray node) at its import.
LAUNCHERS: dict = {}


def launch_for_runtime(count: int, mode: str = "local_processes"):
    """The runtime's host launcher: starts `count` hosts; (addresses, secret).

    `mode` is "local_processes" (this machine) or one of `LAUNCHERS` ("ray": one per Ray node).
    """
    global _runtime_launch
    secret = make_secret()
    launch = LAUNCHERS.get(mode)
    if launch is not None:
        addresses = launch(count, secret)
        _runtime_launch = (mode, secret)
        return addresses, secret
    if mode != "local_processes":
        raise ValueError(f"hosts={mode!r} is not started by the client")
    hosts = start_local_hosts(count, secret)
    _launched.extend(hosts)  # stopped at exit, after the runtime (pathways/__init__.py)
    _runtime_launch = (mode, secret)
    return [h.address for h in hosts], secret


def launch_replacement() -> tuple:
    """One host process started as the runtime's hosts were (same mode and
    secret), to take a lost host's place: (its address, a stop function).

    Raises:
      RuntimeError: When the runtime did not start its hosts (hosts="external",
        or a service's), or the host did not start.
    """
    if _runtime_launch is None:
        raise RuntimeError("the runtime did not start its host processes (hosts='external', or a service's "
                           "tenant): start the new host with the cluster's secret and pass its address")
    mode, secret = _runtime_launch
    launch = LAUNCHERS.get(mode)
    if launch is not None:
        return launch(1, secret)[0], (lambda: None)
    host = start_local_hosts(1, secret)[0]
    _launched.append(host)
    return host.address, (lambda: stop_local_hosts([host], timeout=2.0))


def launched() -> List[HostProcess]:
    """The host processes the runtime started."""
    return list(_launched)


def _stop_launched() -> None:
    stop_local_hosts(_launched, timeout=2.0)
