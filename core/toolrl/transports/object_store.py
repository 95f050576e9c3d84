"""``object_store`` (the default): each bucket a byte array in Ray's object store, needing nothing but Ray
and working across nodes.

A link is a small Ray actor (:class:`Mailbox`, named by the link's key) that holds, per bucket, the
header and a reference to the bytes. The sender puts a bucket's bytes once (``ray.put``) and waits for
every receiver to take the bucket before the one after next, so two buckets are in flight at most;
each receiver reads the bytes where the object store holds them (no copy on this node) and acknowledges.
The sender owns the bytes and the mailbox: when it dies, its receivers' next call fails. A receiver that
dies leaves a bucket untaken: the sender fails as soon as the mailbox finds it dead (a receiver in a Ray
actor) or within ``Link.timeout_s`` (a receiver elsewhere, or one that stalls). Ray is imported
only when a link opens; a receiver not yet connected (vLLM's worker) joins the cluster the link names.
"""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from toolrl import transports
from toolrl.ray_cluster import init_ray

if TYPE_CHECKING:
    from toolrl.plugins.parts import RunFacts

# How often a sender waiting on its receivers asks whether one of them died (a dead Ray actor answers
# at once; one that stalls is left to the link's timeout).
PROBE_S = 1.0
# The most a new link waits for its mailbox actor's process to start.
START_S = 120.0


class Mailbox:
    """One link's buckets as Ray actor state: ``(round, seq) -> (header JSON, [bytes' ref])``, ``None``
    ending a round; a bucket is dropped once every receiver took it. Receivers that run in a Ray actor
    (rollout workers) leave its handle (:meth:`join`), so a sender waiting on them learns of a death
    within :data:`PROBE_S`, not at the timeout."""

    def __init__(self, receivers: int) -> None:
        self.receivers = receivers
        self.items: dict[tuple[int, int], Any] = {}
        self.taken: dict[tuple[int, int], int] = {}
        self.peers: list[Any] = []
        self.changed = asyncio.Condition()

    def join(self, peer: list[Any]) -> None:
        self.peers += peer

    async def put(self, round_: int, seq: int, item: Any) -> None:
        async with self.changed:
            self.items[(round_, seq)] = item
            self.changed.notify_all()

    async def get(self, round_: int, seq: int, timeout_s: float) -> tuple[bool, Any]:
        """(whether it came within ``timeout_s``, the item)."""
        try:
            async with asyncio.timeout(timeout_s), self.changed:
                await self.changed.wait_for(lambda: (round_, seq) in self.items)
                return True, self.items[(round_, seq)]
        except TimeoutError:
            return False, None

    async def take(self, round_: int, seq: int) -> None:
        async with self.changed:
            self.taken[(round_, seq)] = self.taken.get((round_, seq), 0) + 1
            if self.taken[(round_, seq)] == self.receivers:
                self.items.pop((round_, seq), None)
            self.changed.notify_all()

    async def all_took(self, round_: int, seq: int, timeout_s: float) -> bool:
        """Whether every receiver took bucket ``seq`` within ``timeout_s`` (False as soon as one is dead)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            try:
                async with asyncio.timeout(max(0.0, min(PROBE_S, deadline - loop.time()))), self.changed:
                    await self.changed.wait_for(lambda: self.taken.get((round_, seq), 0) >= self.receivers)
                    self.taken.pop((round_, seq), None)
                    return True
            except TimeoutError:
                if loop.time() >= deadline or await self._a_peer_died():
                    return False

    async def _a_peer_died(self) -> bool:
        from ray.exceptions import RayActorError

        for peer in self.peers:
            try:
                async with asyncio.timeout(PROBE_S):
                    await peer.__ray_ready__.remote()
            except RayActorError:
                return True
            except TimeoutError:
                continue  # stalled, not dead: the link's timeout decides
        return False


class ObjectStoreSender(transports.WeightSender):
    def __init__(self, key: str, sender: int, receivers: int, timeout_s: float) -> None:
        import ray

        if not ray.is_initialized():  # a process of the cluster that is not connected yet
            init_ray("auto", 0, log_to_driver=False)
        context = ray.get_runtime_context()
        name = f"toolrl-weights-{key}"
        self.mailbox = ray.remote(num_cpus=0)(Mailbox).options(name=name, max_concurrency=1000).remote(receivers)
        self.link = transports.Link(key=key, sender=sender, receivers=receivers, timeout_s=timeout_s,
                                    address=f"{context.gcs_address}|{context.namespace}|{name}")
        self.rounds = 0
        # Up before the link is handed out, so that a send's timeout runs from the transfer, not from the
        # mailbox process's start (seconds on a loaded machine: a send to a dead receiver once took 10.6 s
        # against its 1 s).
        try:
            ray.get(self.mailbox.__ray_ready__.remote(), timeout=START_S)
        except ray.exceptions.GetTimeoutError:
            raise self.link.error(f"its mailbox actor did not start within {START_S:g} s") from None

    def _wait_taken(self, round_: int, seq: int) -> None:
        import ray

        if not ray.get(self.mailbox.all_took.remote(round_, seq, self.link.timeout_s)):
            raise self.link.error(f"a receiver did not take bucket {seq} within {self.link.timeout_s:g} s")

    def send(self, buckets: Iterable[transports.Bucket]) -> int:
        from ray.exceptions import RayError

        try:
            return self._send(buckets)
        except RayError as exc:  # the mailbox gone (the link closed meanwhile)
            raise self.link.error(str(exc).splitlines()[0]) from None

    def _send(self, buckets: Iterable[transports.Bucket]) -> int:
        import numpy as np
        import ray
        import torch

        round_, self.rounds, sent, end = self.rounds, self.rounds + 1, 0, 0
        for seq, bucket in enumerate(buckets):
            if seq >= 2:  # at most two buckets in the object store at once
                self._wait_taken(round_, seq - 2)
            data = np.empty(bucket.header.nbytes, dtype=np.uint8)
            bucket.fill(torch.from_numpy(data))
            # The reference inside a list: the mailbox keeps it (and the bytes alive), never fetches them.
            ray.get(self.mailbox.put.remote(round_, seq, (bucket.header.model_dump_json(), [ray.put(data)])))
            del data
            sent, end = sent + bucket.header.nbytes, seq + 1
        ray.get(self.mailbox.put.remote(round_, end, None))
        for done in range(max(0, end - 2), end + 1):
            self._wait_taken(round_, done)
        return sent

    def close(self) -> None:
        import ray

        if ray.is_initialized():
            ray.kill(self.mailbox, no_restart=True)


class ObjectStoreReceiver(transports.WeightReceiver):
    def __init__(self, link: transports.Link) -> None:
        self.link = link
        self.mailbox: Any = None
        self.rounds = 0

    def _join(self) -> Any:
        import ray

        address, namespace, name = self.link.address.split("|")
        if not ray.is_initialized():
            init_ray(address, 0, namespace=namespace, log_to_driver=False)
        mailbox = ray.get_actor(name, namespace=namespace)
        context = ray.get_runtime_context()
        ray.get(mailbox.join.remote([context.current_actor] if context.get_actor_id() else []))
        return mailbox

    def receive(self, load: transports.Load) -> int:
        import ray
        import torch
        from ray.exceptions import RayError

        round_, self.rounds, received, seq = self.rounds, self.rounds + 1, 0, 0
        try:
            if self.mailbox is None:
                self.mailbox = self._join()
            while True:
                came, item = ray.get(self.mailbox.get.remote(round_, seq, self.link.timeout_s))
                if not came:
                    raise self.link.error(f"no bucket {seq} from the sender within {self.link.timeout_s:g} s")
                if item is None:
                    ray.get(self.mailbox.take.remote(round_, seq))
                    return received
                header = transports.BucketHeader.model_validate_json(item[0])
                data = ray.get(item[1][0], timeout=self.link.timeout_s)  # read-only, where the store holds it
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", UserWarning)  # not writable: load only reads it
                    load(header, torch.from_numpy(data))
                del data
                ray.get(self.mailbox.take.remote(round_, seq))
                received, seq = received + header.nbytes, seq + 1
        except (RayError, ValueError) as exc:  # the sender (and its mailbox) gone; ValueError: no such actor
            raise self.link.error(f"the sender is gone: {str(exc).splitlines()[0]}") from None


class ObjectStoreTransport(transports.LinkedTransport):
    """Buckets through Ray's object store: needs nothing but Ray, and works across nodes."""

    name = "object_store"

    def check_run(self, facts: RunFacts) -> list[str]:
        """Nothing to probe, and nothing to say in a single-process run: it is the default there too."""
        return []

    def open_sender(self, key: str, sender: int, receivers: int, timeout_s: float) -> ObjectStoreSender:
        return ObjectStoreSender(key, sender, receivers, timeout_s)

    def open_receiver(self, link: transports.Link, index: int) -> ObjectStoreReceiver:
        return ObjectStoreReceiver(link)
