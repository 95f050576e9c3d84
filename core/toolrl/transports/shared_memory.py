"""``shared_memory``: sender and receivers on one node; the sender packs each bucket straight into one of
two POSIX shared-memory segments (files under ``/dev/shm`` mapped with ``torch.from_file``), the
receivers map the same segments and load from them, and the link's store carries the headers and the
receivers' "done" marks. The sender packs the next bucket into the other segment while receivers read
one, and reuses a segment only when every receiver is done with it.

CPU tensors only: CUDA tensors are packed through host memory (CUDA IPC is not built here). A peer that
dies or stalls fails the waits on the store within ``Link.timeout_s``. A segment's name holds its
sender's pid: a sender killed outright leaves its segments behind, and the next sender opened in the
same directory removes them (:func:`remove_orphans`).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from toolrl import transports
from toolrl.transports.rendezvous import host_store, join_store

if TYPE_CHECKING:
    from toolrl.plugins.parts import RunFacts


class SharedMemoryOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    directory: str = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()  # a tmpfs


SEGMENT_PREFIX = "toolrl-weights-p"  # + "<sender pid>-<link key>-<n>"


def remove_orphans(directory: str) -> list[str]:
    """Remove the segments in ``directory`` whose sender process is gone (killed before it could close
    its link); returns their paths. A segment of a live process, or of another user's, stays."""
    removed = []
    for path in Path(directory).glob(f"{SEGMENT_PREFIX}*"):
        pid = path.name.removeprefix(SEGMENT_PREFIX).split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            try:
                path.unlink()
            except OSError:  # removed meanwhile, or not ours to remove
                continue
            removed.append(str(path))
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _map(path: str, nbytes: int) -> Any:
    import torch

    return torch.from_file(path, shared=True, size=nbytes, dtype=torch.uint8)


class SharedMemorySender(transports.WeightSender):
    def __init__(self, key: str, sender: int, receivers: int, timeout_s: float, directory: str) -> None:
        self.store, self.link = host_store(key, sender, receivers, timeout_s)
        remove_orphans(directory)
        self.prefix = str(Path(directory) / f"{SEGMENT_PREFIX}{os.getpid()}-{key}")
        self.segments: list[tuple[str, Any] | None] = [None, None]  # (path, mapped tensor) per slot
        self.made = 0  # segments made so far: each gets a new path
        self.rounds = 0

    def _segment(self, slot: int, nbytes: int) -> tuple[str, Any]:
        held = self.segments[slot]
        if held is None or held[1].numel() < nbytes:
            if held is not None:
                os.unlink(held[0])  # receivers map the new path
            path = f"{self.prefix}-{self.made}"
            self.made += 1
            held = self.segments[slot] = (path, _map(path, max(nbytes, 1)))
        return held

    def _wait_done(self, round_: int, seq: int) -> None:
        keys = [f"{round_}/d{seq}/{i}" for i in range(self.link.receivers)]
        try:
            self.store.wait(keys, timedelta(seconds=self.link.timeout_s))
        except RuntimeError as exc:
            raise self.link.error(f"a receiver did not take bucket {seq} within {self.link.timeout_s:g} s: "
                                  f"{exc}") from None

    def send(self, buckets: Iterable[transports.Bucket]) -> int:
        round_, self.rounds, sent, end = self.rounds, self.rounds + 1, 0, 0
        for seq, bucket in enumerate(buckets):
            if seq >= 2:  # this segment's bucket of two sends ago must be read by all
                self._wait_done(round_, seq - 2)
            path, data = self._segment(seq % 2, bucket.header.nbytes)
            bucket.fill(data[:bucket.header.nbytes])
            self.store.set(f"{round_}/b{seq}", json.dumps({"segment": path, "header": bucket.header.model_dump()}))
            sent, end = sent + bucket.header.nbytes, seq + 1
        self.store.set(f"{round_}/b{end}", "")
        for done in range(max(0, end - 2), end):
            self._wait_done(round_, done)
        return sent

    def close(self) -> None:
        for held in self.segments:
            if held is not None and os.path.exists(held[0]):
                os.unlink(held[0])
        self.segments = [None, None]
        self.store = None


class SharedMemoryReceiver(transports.WeightReceiver):
    def __init__(self, link: transports.Link, index: int) -> None:
        self.link, self.index = link, index
        self.store: Any = None
        self.maps: dict[str, Any] = {}
        self.rounds = 0

    def receive(self, load: transports.Load) -> int:
        if self.store is None:
            self.store = join_store(self.link)
        round_, self.rounds, received, seq = self.rounds, self.rounds + 1, 0, 0
        while True:
            try:
                raw = self.store.get(f"{round_}/b{seq}")
            except RuntimeError as exc:
                raise self.link.error(f"no bucket {seq} from the sender: {exc}") from None
            if not raw:
                return received
            record = json.loads(raw)
            header = transports.BucketHeader.model_validate(record["header"])
            segment = record["segment"]
            if segment not in self.maps:
                self.maps = {p: m for p, m in self.maps.items() if os.path.exists(p)}  # replaced segments
                self.maps[segment] = _map(segment, os.path.getsize(segment))
            load(header, self.maps[segment][:header.nbytes])
            self.store.set(f"{round_}/d{seq}/{self.index}", "1")
            received += header.nbytes
            seq += 1

    def close(self) -> None:
        self.maps = {}
        self.store = None


class SharedMemoryTransport(transports.LinkedTransport):
    name = "shared_memory"
    Options = SharedMemoryOptions

    def check_run(self, facts: RunFacts) -> list[str]:
        if not Path(self.options.directory).is_dir():
            raise ValueError(f"directory={self.options.directory!r} is not a directory (shared memory segments are "
                             "files in a tmpfs such as /dev/shm)")
        transports.writable_directory(self.options.directory, "directory")
        return super().check_run(facts)

    def open_sender(self, key: str, sender: int, receivers: int, timeout_s: float) -> SharedMemorySender:
        return SharedMemorySender(key, sender, receivers, timeout_s, self.options.directory)

    def open_receiver(self, link: transports.Link, index: int) -> SharedMemoryReceiver:
        return SharedMemoryReceiver(link, index)
