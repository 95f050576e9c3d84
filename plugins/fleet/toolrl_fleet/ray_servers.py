"""Environment servers the ``fleet`` session kind starts as Ray actors, spread over the cluster's nodes
that have room (``ray_servers``; each actor asks for ``ray_num_cpus``): each actor runs one ``toolrl env
serve`` process on its node, reachable at that node's address. An actor lost with its node is started
again by Ray on a node with room (``max_restarts=-1``), so its server comes back at a new address,
which the fleet reads from the actor when it asks the server again."""

from __future__ import annotations

import asyncio
from typing import Any

from toolrl_fleet.launch import LocalServer

ASK_S = 2.0  # how long the fleet waits for an actor's address (one being restarted answers later)


class ServerActor:
    """One node's environment server (the class Ray runs as an actor)."""

    def __init__(self, served: str, options: dict[str, Any], capacity: int) -> None:
        import ray

        host = ray.util.get_node_ip_address()
        self.server = LocalServer(served, options, capacity, host=host)
        self.server.spawn()

    def url(self) -> str:
        return self.server.url


def start_actors(count: int, served: str, options: dict[str, Any], capacity: int, num_cpus: float) -> list[Any]:
    """``count`` server actors, spread over the nodes (Ray's SPREAD strategy), each restarted without
    limit. Needs this process connected to Ray (the run's ``ray.address``)."""
    import ray

    if not ray.is_initialized():
        raise ValueError("ray_servers: this process is not connected to a Ray cluster (ray.address)")
    actor = ray.remote(max_restarts=-1, num_cpus=num_cpus, scheduling_strategy="SPREAD")(ServerActor)
    return [actor.remote(served, options, capacity) for _ in range(count)]


async def address(actor: Any) -> str | None:
    """The actor's server's base URL now; None while it does not answer (its node lost, Ray starting it
    again elsewhere)."""
    try:
        async with asyncio.timeout(ASK_S):
            return await actor.url.remote()
    except Exception:
        return None


def stop_actors(actors: list[Any]) -> None:
    """Kill the actors; each one's server exits with it (its stdin closes)."""
    import ray

    for actor in actors:
        ray.kill(actor, no_restart=True)
