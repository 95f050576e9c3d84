"""``disk``: each bucket a safetensors file under a directory the sender and the receivers both see (a
shared filesystem, for engines the trainer cannot reach otherwise). A file appears whole (written
under a temporary name, then renamed); the stream ends with an ``end`` file. Receivers poll for the
next file; one that does not appear within ``Link.timeout_s`` fails the transfer. The files of a send
are removed when the next send starts (every receiver is done by then: the controller waits for all)
and when the link closes.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from toolrl import transports

if TYPE_CHECKING:
    from toolrl.plugins.parts import RunFacts

POLL_S = 0.005


class DiskOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str = Field(min_length=1)  # a directory every trainer rank and engine sees


class DiskSender(transports.WeightSender):
    def __init__(self, key: str, sender: int, receivers: int, timeout_s: float, path: str) -> None:
        self.directory = Path(path) / key
        self.directory.mkdir(parents=True, exist_ok=True)
        self.link = transports.Link(key=key, sender=sender, receivers=receivers, address=str(self.directory),
                                    timeout_s=timeout_s)
        self.rounds = 0

    def send(self, buckets: Iterable[transports.Bucket]) -> int:
        import torch
        from safetensors.torch import save_file

        if self.rounds:
            shutil.rmtree(self.directory / str(self.rounds - 1), ignore_errors=True)
        out = self.directory / str(self.rounds)
        out.mkdir(exist_ok=True)
        self.rounds += 1
        sent, count = 0, 0
        for seq, bucket in enumerate(buckets):
            data = torch.empty(bucket.header.nbytes, dtype=torch.uint8)
            bucket.fill(data)
            tmp = out / f".{seq}.tmp"
            save_file({"bytes": data}, str(tmp), metadata={"header": bucket.header.model_dump_json()})
            os.replace(tmp, out / f"{seq}.safetensors")
            sent, count = sent + bucket.header.nbytes, seq + 1
        (out / f"{count}.end").touch()
        return sent

    def close(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


class DiskReceiver(transports.WeightReceiver):
    def __init__(self, link: transports.Link) -> None:
        self.link = link
        self.rounds = 0

    def _next(self, directory: Path, seq: int) -> Path | None:
        """Bucket ``seq``'s file, or None at the end of the stream; waits for it within the timeout."""
        deadline = time.monotonic() + self.link.timeout_s
        while True:
            if (path := directory / f"{seq}.safetensors").exists():
                return path
            if (directory / f"{seq}.end").exists():
                return None
            if time.monotonic() > deadline:
                raise self.link.error(f"no bucket {seq} in {directory} within {self.link.timeout_s:g} s")
            time.sleep(POLL_S)

    def receive(self, load: transports.Load) -> int:
        from safetensors import safe_open

        directory = Path(self.link.address) / str(self.rounds)
        self.rounds += 1
        received, seq = 0, 0
        while (path := self._next(directory, seq)) is not None:
            with safe_open(str(path), framework="pt") as f:
                header = transports.BucketHeader.model_validate_json(f.metadata()["header"])
                load(header, f.get_tensor("bytes"))
            received, seq = received + header.nbytes, seq + 1
        return received


class DiskTransport(transports.LinkedTransport):
    name = "disk"
    Options = DiskOptions

    def check_run(self, facts: RunFacts) -> list[str]:
        transports.writable_directory(self.options.path, "path")
        return super().check_run(facts)

    def open_sender(self, key: str, sender: int, receivers: int, timeout_s: float) -> DiskSender:
        return DiskSender(key, sender, receivers, timeout_s, self.options.path)

    def open_receiver(self, link: transports.Link, index: int) -> DiskReceiver:
        return DiskReceiver(link)
