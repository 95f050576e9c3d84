"""The Ray machinery the trainer group and the rollout group share: where their actors go, awaiting
an actor's result with its death as :class:`ActorDied`, and calling again after a death.

Placement (docs/architecture.md, "Where the processes run"): each group reserves one placement group,
one bundle per actor (``PACK`` for trainer ranks, ``SPREAD`` for rollout workers); actor ``i`` and every
replacement of it run in bundle ``i``, so a replacement comes up where the actor it replaces ran.

``ray`` is imported only inside the functions.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from toolrl.config import ConfigError
from toolrl.transports.rendezvous import node_address

T = TypeVar("T")


class ActorDied(RuntimeError):
    """The actor computing a result died (its process or its node) before giving it; ``actor`` is
    its handle, as the caller gave it. ``unavailable``: Ray could not reach it but has not (yet)
    declared it dead, as when its node stopped answering and is not yet known to be lost."""

    def __init__(self, actor: Any, detail: str, unavailable: bool = False) -> None:
        super().__init__(detail)
        self.actor = actor
        self.unavailable = unavailable


async def result(ref: Any, actor: Any = None) -> Any:
    """The value of ``ref``, a call made on ``actor``. The actor's death raises :class:`ActorDied`;
    an exception raised inside the call comes as Ray gives it (a ``RayTaskError`` that is also an
    instance of the cause's class, the cause under ``.cause``)."""
    from ray.exceptions import ActorUnavailableError, RayActorError

    try:
        return await ref
    except RayActorError as exc:
        lines = str(exc).strip().splitlines()
        raise ActorDied(actor, lines[0] if lines else type(exc).__name__,
                        isinstance(exc, ActorUnavailableError)) from exc


def rendezvous_address() -> tuple[str, int]:
    """This node's address and a free port on it: where rank 0 of a group hosts its process group's
    rendezvous."""
    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    return node_address(), port


def actor_info(rank: int, device: str) -> dict[str, Any]:
    """Where rank ``rank`` runs (pid, host, Ray node: None outside Ray), for errors and records."""
    try:
        import ray

        node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
    except ImportError:
        node = None
    return {"rank": rank, "pid": os.getpid(), "host": socket.gethostname(), "node_id": node, "device": device}


def kill(actors: Sequence[Any]) -> None:
    """End every actor in ``actors`` (already dead ones too) without waiting for their calls."""
    import ray

    for actor in actors:
        with contextlib.suppress(Exception):
            ray.kill(actor, no_restart=True)


async def retry(attempt: Callable[[], Awaitable[T]], attempts: int, died: Callable[[ActorDied], None]) -> T:
    """``attempt()``, again after each :class:`ActorDied` it raises (``died`` is told first, to start a
    replacement), ``attempts`` times in all; the last death is raised."""
    for _ in range(attempts - 1):
        try:
            return await attempt()
        except ActorDied as exc:
            died(exc)
    return await attempt()


@dataclass
class Placement:
    """``count`` actors of ``cpus`` CPUs and ``gpus`` GPUs each, actor ``i`` in bundle ``i`` of
    ``group`` (None when an actor needs no resources: it may run anywhere). ``what``: the setting
    that asked for them, for errors (``trainer.world_size=2``); ``unit``: one of them (``rank``)."""

    what: str
    unit: str
    count: int
    cpus: float
    gpus: float
    group: Any = None
    custom: Sequence[Mapping[str, float]] = ()  # bundle i's own resources, for i < len(custom) (empty: the default)

    @classmethod
    def reserve(cls, what: str, unit: str, count: int, cpus: float, gpus: float,
                strategy: Literal["PACK", "SPREAD"], custom: Sequence[Mapping[str, float]] = ()) -> Placement:
        """Reserve the bundles; raises :class:`ConfigError` now when the alive nodes cannot hold them
        (each bundle, in turn, taken from the first alive node that still has room for it)."""
        import ray
        from ray.util.placement_group import placement_group

        placement = cls(what, unit, count, cpus, gpus, custom=custom)
        bundles = [placement.bundle(i) for i in range(count)]
        free = [dict(node["Resources"]) for node in ray.nodes() if node["Alive"]]
        for bundle in bundles:
            node = next((n for n in free if all(n.get(k, 0.0) >= v for k, v in bundle.items())), None)
            if node is None:
                raise ConfigError(placement.shortfall())
            for k, v in bundle.items():
                node[k] = node.get(k, 0.0) - v
        if any(bundles):
            placement.group = placement_group([dict(b) for b in bundles], strategy=strategy)
        return placement

    def bundle(self, index: int = 0) -> dict[str, float]:
        """Bundle ``index``'s resources (none: the actor may run anywhere)."""
        if index < len(self.custom) and self.custom[index]:  # an empty one: the default
            return {k: float(v) for k, v in self.custom[index].items() if v > 0}
        return {k: v for k, v in (("CPU", self.cpus), ("GPU", self.gpus)) if v > 0}

    def shortfall(self, after: str = "") -> str:
        import ray

        total = ray.cluster_resources()
        if any(self.custom[:self.count]):  # the bundles are not all alike: name each
            asked = ", ".join(f"{self.unit} {i}: {self.bundle(i)}" for i in range(self.count))
            return (f"{self.what} needs {asked}{after}; the alive nodes cannot hold them; the cluster has "
                    f"{ {k: v for k, v in total.items() if not k.startswith(('node:', 'memory', 'object_store'))} }")
        return (f"{self.what} needs {self.count * self.cpus:g} CPUs and {self.count * self.gpus:g} GPUs on nodes "
                f"that fit a {self.unit}{after}; the cluster has {total.get('CPU', 0):g} CPUs and "
                f"{total.get('GPU', 0):g} GPUs")

    def options(self, index: int) -> dict[str, Any]:
        """``ray.remote(...).options`` for actor ``index`` (or a replacement of it): never restarted by
        Ray, the group replaces it."""
        bundle = self.bundle(index)
        options: dict[str, Any] = {"num_cpus": bundle.pop("CPU", 0.0), "num_gpus": bundle.pop("GPU", 0.0),
                                   "max_restarts": 0, **({"resources": bundle} if bundle else {})}
        if self.group is not None:
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                self.group, placement_group_bundle_index=index)
        return options

    async def ready(self, timeout_s: float) -> None:
        """Wait until every bundle is reserved (all actors can start together)."""
        if self.group is None:
            return
        try:
            async with asyncio.timeout(timeout_s):
                await self.group.ready()
        except TimeoutError:
            raise ConfigError(self.shortfall(f" (not placed after {timeout_s:g} s)")) from None

    def remove(self) -> None:
        if self.group is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self.group)
            self.group = None
