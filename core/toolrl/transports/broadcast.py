"""``broadcast``: each link is a ``torch.distributed`` process group of its own, the sender (rank 0) and
its receivers; buckets travel as broadcasts from the sender (gloo for CPU tensors, NCCL for CUDA ones:
the same code).

Per bucket three broadcasts: sizes, the header (JSON), the bytes. The bytes go asynchronously: the
sender packs the next bucket into its second buffer while one travels, and a receiver loads the last
bucket while the next one arrives (a group runs its collectives in the order they were issued, so the
next header arriving means the bytes before it are in). A group's collectives fail on a dead peer or
after ``Link.timeout_s``.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from toolrl import transports
from toolrl.transports.rendezvous import host_store, join_store

if TYPE_CHECKING:
    from toolrl.plugins.parts import RunFacts


class BroadcastOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # Where buffers live: "cpu" (gloo) or "cuda" / "cuda:N" (NCCL).
    device: str = Field("cpu", pattern=r"^(cpu|cuda(:\d+)?)$")


class _Group:
    """One link's process group and its two byte buffers."""

    def __init__(self, store: Any, link: transports.Link, rank: int, device: str) -> None:
        import torch
        import torch.distributed as dist

        self.link, self.device = link, torch.device(device)
        prefixed = dist.PrefixStore(f"{link.key}/", store)
        timeout = timedelta(seconds=link.timeout_s)
        try:
            if self.device.type == "cuda":
                self.pg = dist.ProcessGroupNCCL(prefixed, rank, link.receivers + 1)
            else:
                # A device bound to the link's host: gloo's default one looks the hostname up (seconds).
                options = dist.ProcessGroupGloo._Options()
                options._timeout = timeout
                options._devices = [dist.ProcessGroupGloo.create_device(hostname=link.address.rpartition(":")[0])]
                self.pg = dist.ProcessGroupGloo(prefixed, rank, link.receivers + 1, options)
        except RuntimeError as exc:
            raise link.error(f"the group did not form: {exc}") from None
        self.buffers: list[Any] = [None, None]

    def buffer(self, slot: int, nbytes: int) -> Any:
        import torch

        if self.buffers[slot] is None or self.buffers[slot].numel() < nbytes:
            self.buffers[slot] = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        return self.buffers[slot][:nbytes]

    def broadcast(self, tensor: Any) -> Any:
        import torch.distributed as dist

        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        return self.pg.broadcast([tensor], opts)

    def wait(self, work: Any) -> None:
        try:
            work.wait(timedelta(seconds=self.link.timeout_s))
        except RuntimeError as exc:  # gloo: a peer closed the connection, or the timeout passed
            raise self.link.error(f"transfer failed: {exc}") from None

    def sizes(self, header: bytes | None, nbytes: int) -> tuple[int, int]:
        """Broadcast (header length, bucket bytes); receivers pass None and learn them."""
        import torch

        sizes = torch.tensor([len(header) if header is not None else 0, nbytes], dtype=torch.int64, device=self.device)
        self.wait(self.broadcast(sizes))
        return int(sizes[0]), int(sizes[1])

    def header(self, header: bytes | None, length: int) -> bytes:
        import torch

        if header is not None:
            data = torch.frombuffer(bytearray(header), dtype=torch.uint8).to(self.device)
        else:
            data = torch.empty(length, dtype=torch.uint8, device=self.device)
        self.wait(self.broadcast(data))
        return bytes(data.cpu().numpy())


class BroadcastSender(transports.WeightSender):
    def __init__(self, key: str, sender: int, receivers: int, timeout_s: float, device: str) -> None:
        self.store, self.link = host_store(key, sender, receivers, timeout_s)
        self.device = device
        self.group: _Group | None = None

    def send(self, buckets: Iterable[transports.Bucket]) -> int:
        if self.group is None:
            self.group = _Group(self.store, self.link, 0, self.device)
        group, sent, slot = self.group, 0, 0
        works: list[Any] = [None, None]
        for bucket in buckets:
            if works[slot] is not None:  # the bucket this buffer held two sends ago is out
                group.wait(works[slot])
            data = group.buffer(slot, bucket.header.nbytes)
            bucket.fill(data)
            header = bucket.header.model_dump_json().encode()
            group.header(header, group.sizes(header, bucket.header.nbytes)[0])
            works[slot] = group.broadcast(data)
            sent += bucket.header.nbytes
            slot ^= 1
        group.sizes(None, 0)  # the end of the stream: an empty header
        for work in works:
            if work is not None:
                group.wait(work)
        return sent

    def close(self) -> None:
        self.group = None
        self.store = None


class BroadcastReceiver(transports.WeightReceiver):
    def __init__(self, link: transports.Link, index: int, device: str) -> None:
        self.link, self.index, self.device = link, index, device
        self.group: _Group | None = None

    def receive(self, load: transports.Load) -> int:
        if self.group is None:
            self.group = _Group(join_store(self.link), self.link, self.index + 1, self.device)
        group, received, slot = self.group, 0, 0
        pending: tuple[transports.BucketHeader, Any, Any] | None = None
        while True:
            length, nbytes = group.sizes(None, 0)
            if length:
                header = transports.BucketHeader.model_validate_json(group.header(None, length))
                if header.nbytes != nbytes:
                    raise self.link.error(f"header says {header.nbytes} bytes, sizes {nbytes}")
                data = group.buffer(slot, nbytes)
                arriving = (header, data, group.broadcast(data))
            if pending is not None:  # loaded while the next bucket travels
                group.wait(pending[2])
                load(pending[0], pending[1])
            if not length:
                return received
            pending, received, slot = arriving, received + nbytes, slot ^ 1

    def close(self) -> None:
        self.group = None


class BroadcastTransport(transports.LinkedTransport):
    name = "broadcast"
    Options = BroadcastOptions

    def check_run(self, facts: RunFacts) -> list[str]:
        """NCCL buffers need a GPU where the trainer ranks run: this process's, or Ray's for them."""
        if self.options.device.startswith("cuda"):
            if facts.in_process:
                import torch

                if not torch.cuda.is_available():
                    raise ValueError(f"device={self.options.device}: no CUDA device is visible to this process")
            elif facts.config.ray.num_gpus_per_trainer <= 0:
                raise ValueError(f"device={self.options.device}: the trainer ranks get no GPU "
                                 "(ray.num_gpus_per_trainer is 0)")
        return super().check_run(facts)

    def open_sender(self, key: str, sender: int, receivers: int, timeout_s: float) -> BroadcastSender:
        return BroadcastSender(key, sender, receivers, timeout_s, self.options.device)

    def open_receiver(self, link: transports.Link, index: int) -> BroadcastReceiver:
        return BroadcastReceiver(link, index, self.options.device)
