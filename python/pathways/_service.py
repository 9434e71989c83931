"""Connecting to a pathways service as a tenant (pw.configure(server=...)).

A service (`pathways-server`, see pathways.server) owns the hosts, the
resource manager and the islands' gang schedulers; each client process that
connects is a tenant with an identity of its own. A client names the
service by its connection file (JSON with "address" and "secret", written
by the server, readable by its user only) or by its address, with the
secret in the environment variable PATHWAYS_SERVER_SECRET.
"""

from __future__ import annotations

import json
import numbers
import os
import sys
from typing import Optional, Tuple, Union

_SECRET_ENV = "PATHWAYS_SERVER_SECRET"


def default_tenant_name() -> str:
    """This process's name at the service: the script's name and the pid."""
    script = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
    return f"{script or 'python'}:{os.getpid()}"


def resolve(server: str) -> Tuple[str, str]:
    """(address, secret) of the service `server` names (a connection file or an address).

    Raises:
      TypeError: If `server` is not a str.
      ValueError: If the connection file is malformed, or an address comes
        without PATHWAYS_SERVER_SECRET.
    """
    if not isinstance(server, str):
        raise TypeError(f"configure: server must be a str (a connection file or 'HOST:PORT'), got {server!r}")
    if not server:
        raise ValueError("configure: server must not be empty")
    if os.path.isfile(server):
        try:
            with open(server, encoding="utf-8") as f:
                info = json.load(f)
            address, secret = info["address"], info["secret"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ValueError(f"configure: server={server!r} is not a pathways-server connection file "
                             f"(JSON with 'address' and 'secret'): {e}") from None
        if not isinstance(address, str) or not isinstance(secret, str) or not address or not secret:
            raise ValueError(f"configure: the connection file {server!r} has no address or secret")
        return address, secret
    if ":" not in server:
        raise ValueError(f"configure: server={server!r} is neither a connection file that exists nor 'HOST:PORT'")
    secret = os.environ.get(_SECRET_ENV, "")
    if not secret:
        raise ValueError(f"configure: server={server!r} is an address: set {_SECRET_ENV} to the service's "
                         "secret, or pass the connection file the server wrote instead")
    return server, secret


def memory_bytes(where: str, name: str, value: Union[int, str]) -> int:
    """`value` (an int of bytes, or a str like "512MiB") in bytes, from 1 byte to 1TiB."""
    from pathways import _checks, _core

    if isinstance(value, str):
        return _core.parse_bytes(value, f"{where}: {name}")
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{where}: {name} must be an int of bytes or a str like '512MiB', got {value!r}")
    return _core.parse_bytes(str(_checks.integer(where, name, value)), f"{where}: {name}")


def configure_tenant(server: str, priority: Optional[int] = None, name: Optional[str] = None,
                     devices: Optional[int] = None, memory: Optional[Union[int, str]] = None,
                     wait_timeout: Optional[float] = None) -> None:
    """Makes the runtime a tenant of `server` (not connected until first use)."""
    from pathways import _checks, _core

    address, secret = resolve(server)
    prio = 0 if priority is None else _checks.integer("configure", "priority", priority)
    if not -1000 <= prio <= 1000:
        raise ValueError(f"configure: priority must be an integer from -1000 to 1000, got {prio}")
    if name is None:
        name = default_tenant_name()
    elif not isinstance(name, str):
        raise TypeError(f"configure: name must be a str, got {name!r}")
    count = 0
    if devices is not None:
        count = _checks.integer("configure", "devices", devices)
        if count < 1:
            raise ValueError(f"configure: devices must be at least 1, got {count}")
    size = 0 if memory is None else memory_bytes("configure", "memory", memory)
    wait = 60.0
    if wait_timeout is not None:
        wait = _checks.real("configure", "wait_timeout", wait_timeout)
        if not 0 <= wait <= 86400:
            raise ValueError(f"configure: wait_timeout must be from 0 to 86400 seconds (a day), got {wait}")
    _core.configure_service(address, secret, name, prio, count, size, wait)


def configure_from_environment() -> None:
    """PATHWAYS_SERVER (and PATHWAYS_PRIORITY) make this process a tenant, at import."""
    server = os.environ.get("PATHWAYS_SERVER", "")
    if not server:
        return
    priority = os.environ.get("PATHWAYS_PRIORITY", "")
    try:
        prio = int(priority) if priority else None
    except ValueError:
        raise ValueError(f"PATHWAYS_PRIORITY must be an integer, got {priority!r}") from None
    configure_tenant(server, prio)
