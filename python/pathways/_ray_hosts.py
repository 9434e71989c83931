"""Host processes on a Ray cluster (hosts="ray"): one host per Ray node.

The client asks Ray for a placement group of one bundle per host with the
STRICT_SPREAD strategy (every bundle on a different node) and places a small
actor in each bundle. The actor starts `python -m pathways.host` on its node,
listening on the node's IP address (or $PATHWAYS_RAY_LISTEN_IP, e.g.
127.0.0.1 for a test cluster on one machine), and reports its address. Ray
only places the hosts: the control plane (gRPC) and the data plane (Gloo)
connect the client and the hosts directly, never through Ray.

Each host's stdin pipe is held by its actor, so a host ends with its actor:
when the client (Ray's driver) ends, Ray ends the actors it created, and the
hosts with them. Every node needs pathways installed in the Python Ray runs.

The cluster's secret never goes through Ray: whatever a task gets or returns
is pickled and kept by Ray (its object store, dashboard, spilled objects), so
a task argument would put it there. Instead each host makes a key pair and
prints its public key, which its actor returns; the client seals the secret
to that key (X25519, HKDF-SHA256, AES-256-GCM: pathways' C++ side, OpenSSL)
and sends the sealed bytes back through Ray to the actor, which writes them
on the host's stdin. Only the host process, which never lets its private key
out of memory, can open them. Ray sees a public key and sealed bytes, both
useless to anyone else; someone who could change what Ray carries could also
run code on the nodes, which no key exchange guards against.
"""

from __future__ import annotations

import os
from typing import Any, List

from pathways import _hosts

# The placement group and actors of the runtime's hosts: they must live as
# long as this process.
_kept: List[Any] = []

# How Ray spreads the hosts: STRICT_SPREAD (one per node) unless
# $PATHWAYS_RAY_STRATEGY says otherwise (SPREAD lets a one-node test
# cluster hold them all).
_STRATEGY = os.environ.get("PATHWAYS_RAY_STRATEGY", "STRICT_SPREAD")

# Seconds Ray may take to find one node per host.
_PLACEMENT_TIMEOUT = float(os.environ.get("PATHWAYS_RAY_PLACEMENT_TIMEOUT", "60"))


class _HostActor:
    """Runs one host process on its node (a Ray actor)."""

    def __init__(self) -> None:
        self.hosts: List[_hosts.HostProcess] = []
        self.starting: Any = None

    def begin(self, listen_ip: str | None) -> str:
        """Starts the host; its public sealing key (hex)."""
        import ray

        ip = listen_ip or ray.util.get_node_ip_address()
        self.starting = _hosts.start_sealed_host(listen=f"{ip}:0")
        return self.starting.sealing_key

    def finish(self, sealed_secret: str) -> str:
        """Hands the host its sealed secret; its address."""
        self.hosts = [_hosts.finish_sealed_host(self.starting, sealed_secret)]
        self.starting = None
        return self.hosts[0].address

    def stop(self) -> None:
        if self.starting is not None:  # begun, never finished
            _hosts._stop(self.starting.proc, 5.0)
        _hosts.stop_local_hosts(self.hosts)


def launch(count: int, secret: str) -> List[str]:
    """Starts `count` hosts, one per Ray node; their addresses in host order.

    Connects to the running Ray cluster ($RAY_ADDRESS, else "auto") unless
    Ray is initialized already in this process.

    Raises:
      RuntimeError: If Ray cannot give each host a node of its own in time.
    """
    try:
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
    except ImportError as e:
        raise RuntimeError("hosts='ray' needs Ray: pip install 'pathways[ray]' (or ray)") from e
    if not ray.is_initialized():
        ray.init(address=os.environ.get("RAY_ADDRESS", "auto"), log_to_driver=False)
    group = placement_group([{"CPU": 1}] * count, strategy=_STRATEGY)
    if not group.wait(timeout_seconds=_PLACEMENT_TIMEOUT):
        remove_placement_group(group)
        nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
        raise RuntimeError(
            f"hosts='ray': Ray could not place {count} hosts ({_STRATEGY}: one per node, each with a free CPU) "
            f"within {_PLACEMENT_TIMEOUT:g} s; the cluster has {nodes} live nodes")
    actor_class = ray.remote(num_cpus=1)(_HostActor)
    actors = [
        actor_class.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
            placement_group=group, placement_group_bundle_index=i)).remote()
        for i in range(count)
    ]
    _kept.extend([group] + actors)
    listen_ip = os.environ.get("PATHWAYS_RAY_LISTEN_IP") or None
    from pathways import _core
    keys = ray.get([a.begin.remote(listen_ip) for a in actors], timeout=_PLACEMENT_TIMEOUT + 60)
    sealed = [_core._seal_secret(key, secret) for key in keys]
    return ray.get([a.finish.remote(s) for a, s in zip(actors, sealed)], timeout=60)


_hosts.LAUNCHERS["ray"] = launch
