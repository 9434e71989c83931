"""The pathways service: many client processes share one set of islands.

Usage:
    pathways-server [--topology=SPEC] [--listen=ADDRESS:PORT]
                    [--connection-file=PATH] [--policy=fifo|proportional_share]
                    [--max-tenant-devices=N] [--tenant-memory=SIZE]
                    [--max-tenant-memory=SIZE] [--max-anticipation-ms=MS]
    python -m pathways.server ...

The service starts the hosts of the topology (its `hosts=` key:
"local_processes", the default, or "ray"), owns them with the resource
manager and every island's gang scheduler, and listens for clients on
ADDRESS:PORT (default 127.0.0.1:0: a free port on loopback). When ready it
prints one line

    pathways-server ready address=127.0.0.1:40123 connection_file=PATH pid=4242

and writes the connection file, JSON {"address", "secret", "pid"} readable
by its user only. Clients connect with `pw.configure(server=PATH)` or
`PATHWAYS_SERVER=PATH`; or with the address and the secret in
PATHWAYS_SERVER_SECRET. The secret is fresh each start, unless
PATHWAYS_SERVER_SECRET is set for the server too (clients on other
machines). The service runs until SIGTERM or SIGINT; its tenants then lose
their hosts.

Quotas: each tenant holds devices, and memory on each, while it is
connected: by default every device (at most --max-tenant-devices) with
--tenant-memory on each (default: an eighth of a device's memory); a tenant
may ask for other amounts with `pw.configure(devices=..., memory=...)`, up to
--max-tenant-devices and --max-tenant-memory (default: a device's memory). A
tenant whose request is not free waits for other tenants to leave, in the
order they asked, up to its `wait_timeout`.

Priorities: when a tenant of higher priority than another has no run left,
its islands are held for its next run for twice its usual gap between runs,
at most --max-anticipation-ms (default 5 ms): its closed loop of steps does
not find a lower tenant's run started in every gap.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from typing import List, Optional

DEFAULT_TOPOLOGY = "islands=1,hosts_per_island=2,devices_per_host=4"


def default_connection_file() -> str:
    base = os.environ.get("XDG_RUNTIME_DIR") or os.path.join(os.path.expanduser("~"), ".pathways")
    return os.path.join(base, "pathways-server.json")


def _topology_items(spec: str) -> List[tuple]:
    items = []
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        if "=" not in part:
            raise SystemExit(f"pathways-server: --topology: '{part}' is not KEY=VALUE")
        key, value = part.split("=", 1)
        items.append((key.strip(), value.strip()))
    return items


def write_connection_file(path: str, address: str, secret: str) -> None:
    """Writes {"address", "secret", "pid"} to `path`, readable by its owner only."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, mode=0o700, exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump({"address": address, "secret": secret, "pid": os.getpid()}, f)
    os.replace(tmp, path)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="pathways-server", description=__doc__.split("\n\n")[0])
    parser.add_argument("--topology", default=os.environ.get("PATHWAYS_TOPOLOGY") or DEFAULT_TOPOLOGY,
                        help=f"the cluster, as PATHWAYS_TOPOLOGY (default: {DEFAULT_TOPOLOGY}; hosts=local_processes "
                             "unless it says hosts=ray)")
    parser.add_argument("--listen", default="127.0.0.1:0", help="where clients connect (default 127.0.0.1:0)")
    parser.add_argument("--connection-file", default=None,
                        help=f"where to write the address and secret (default {default_connection_file()})")
    parser.add_argument("--policy", default="fifo", choices=["fifo", "proportional_share"],
                        help="the gang schedulers' policy for every tenant (a tenant may change it)")
    parser.add_argument("--max-tenant-devices", type=int, default=0,
                        help="the most devices a tenant may hold, and what it gets by default (default: every device)")
    parser.add_argument("--tenant-memory", default="0",
                        help="memory a tenant holds on each of its devices unless it asks otherwise, like 256MiB "
                             "(default: an eighth of a device's)")
    parser.add_argument("--max-tenant-memory", default="0",
                        help="the most memory a tenant may hold on a device (default: a device's)")
    parser.add_argument("--max-anticipation-ms", type=float, default=5.0,
                        help="the longest an island is held for a higher-priority tenant's next run, 0 to 1000 "
                             "(default 5; 0: never held)")
    args = parser.parse_args(argv)

    from pathways import _core, _hosts

    def size(flag: str, text: str) -> int:
        if text == "0":
            return 0
        try:
            return _core.parse_bytes(text, flag)
        except ValueError as e:
            raise SystemExit(f"pathways-server: {e}") from None
    tenant_memory = size("--tenant-memory", args.tenant_memory)
    max_tenant_memory = size("--max-tenant-memory", args.max_tenant_memory)

    items = _topology_items(args.topology)
    mode = dict(items).get("hosts", "local_processes")
    if mode in ("in_process", "external", "service"):
        raise SystemExit(f"pathways-server: hosts={mode}: the service's hosts are processes it starts "
                         "(hosts=local_processes or hosts=ray)")
    items = [(k, v) for k, v in items if k != "hosts"] + [("hosts", mode)]
    spec = ",".join(f"{k}={v}" for k, v in items)
    # The number of hosts, as the topology says (the core checks the rest).
    counts = {"islands": 2, "hosts_per_island": 2}
    for k, v in items:
        if k in counts:
            counts[k] = int(v)
    num_hosts = counts["islands"] * counts["hosts_per_island"]
    host_addresses, host_secret = _hosts.launch_for_runtime(num_hosts, mode)
    secret = os.environ.get("PATHWAYS_SERVER_SECRET") or _hosts.make_secret()
    try:
        service = _core._Service(items, host_addresses, host_secret, args.listen, secret, args.policy,
                                 args.max_tenant_devices, tenant_memory, max_tenant_memory,
                                 args.max_anticipation_ms)
    except ValueError as e:
        _hosts._stop_launched()
        raise SystemExit(f"pathways-server: {e}") from None
    path = args.connection_file or default_connection_file()
    write_connection_file(path, service.address, secret)

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    print(f"pathways-server ready address={service.address} connection_file={path} pid={os.getpid()}",
          flush=True)
    print(f"pathways-server: topology {spec}; connect with pw.configure(server={path!r}) "
          f"or PATHWAYS_SERVER={path}", file=sys.stderr, flush=True)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        del service
        try:
            os.unlink(path)
        except OSError:
            pass
        _hosts._stop_launched()
    return 0


if __name__ == "__main__":
    sys.exit(main())
