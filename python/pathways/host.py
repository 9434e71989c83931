"""A pathways host process: serves one host's devices to its client.

Usage:
    python -m pathways.host [--listen=ADDRESS:PORT] [--advertise=IP]
                            [--secret-stdin | --sealed-secret-stdin]
                            [--stay] [--configure-timeout=SECONDS] [--client=ADDRESS]

The host listens on ADDRESS:PORT (default 127.0.0.1:0, a free port on
loopback), prints one line

    pathways-host ready address=127.0.0.1:40123 pid=4242 incarnation=9f3c...

and serves until SIGTERM or SIGINT. Every session must prove it knows the
cluster's secret (a challenge-response: the secret itself never crosses the
network; over TLS unless the host is reached on loopback). With
--secret-stdin the secret is the first line of stdin, and the end of stdin
stops the host (a client starts its hosts this way, so they never outlive
it). With --sealed-secret-stdin (hosts="ray") the host first prints a public
key,

    pathways-host sealing-key=<64 hex digits>

and reads the secret sealed to it (hex) as the first line of stdin, which
only this process can open; stdin's end stops it as well. Otherwise the
secret is the environment variable PATHWAYS_SECRET (hosts started by hand,
by Slurm or by Kubernetes). Unless --stay, the host also stops when the
session of the client that configured it ends, or when no client configures
it within --configure-timeout seconds (default 60).

With --client=ADDRESS the host registers with a client that waits there for
its hosts (`pw.configure(hosts="external")`, PATHWAYS_CLIENT_ADDRESS on the
client): this is how Slurm, Kubernetes or a person start hosts. On a
machine other than the client's, pass --listen=THIS_MACHINES_IP:0; the host's
data plane and Gloo use the same IP address. A wildcard listen
(--listen=0.0.0.0:PORT or [::]:PORT) has no address to give the others: the
host advertises --advertise=IP, or with --client the IP that reaches the
client, and refuses to start with neither.

For tests only, PATHWAYS_HOST_TEST_DELAYS="load_function=SECONDS,put=SECONDS"
makes the host slow at compiling each function and at taking each chunk of
a put, as a loaded or throttled machine is (its heartbeats are still
answered at once).
"""

from __future__ import annotations

import sys
from typing import Optional, Sequence


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs a host process with `argv` (default: the command line); returns its exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if "-h" in args or "--help" in args:
        print(__doc__)
        return 0
    from pathways import _checkpoint_io, _core

    # Checkpoints: this host writes and reads its own shards (pw.checkpointing).
    _core.set_shard_writer(_checkpoint_io.host_write_shards)
    _core.set_shard_reader(_checkpoint_io.host_read_shards)
    try:
        return _core.run_host(args)
    except ValueError as e:
        print(f"pathways-host: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
