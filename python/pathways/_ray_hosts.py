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

    def start(self, secret: str, listen_ip: str | None) -> str:
        import ray

        ip = listen_ip or ray.util.get_node_ip_address()
        self.hosts = _hosts.start_local_hosts(1, secret, listen=f"{ip}:0")
        return self.hosts[0].address

    def stop(self) -> None:
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
    return ray.get([a.start.remote(secret, listen_ip) for a in actors], timeout=_PLACEMENT_TIMEOUT + 60)


_hosts.LAUNCHERS["ray"] = launch
