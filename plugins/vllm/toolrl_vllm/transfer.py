"""vLLM's weight-transfer engine over toolrl's linked transports (backend ``toolrl``), run by vLLM's
worker process.

vLLM's four calls map onto one sync over the links the trainer ranks opened:

- ``init_weight_transfer_engine``: the transport (its class and options) and the links; the worker
  opens its receiver of each with the transport's own ``open_receiver`` (a ``broadcast`` receiver joins
  the link's gloo group, a ``shared_memory`` one maps the sender's segments), once per set of links.
- ``start_weight_update``: vLLM's layerwise reload starts (each layer is processed into its kernel
  format once all its weights are in, then copied into the running model's tensors).
- ``update_weights``: one stream from every link at once (a thread each); each piece goes straight
  from the transport's buffer into ``model.load_weights``. Rows of a tensor sharded across trainer
  ranks are assembled first, and each tensor is loaded as soon as all its rows are in.
- ``finish_weight_update``: the reload is finalized (tied embeddings repacked, as for a checkpoint).
"""

from __future__ import annotations

import importlib
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch
from toolrl.transports import BucketHeader, Link, TransportError, WeightReceiver
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)
from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload

from toolrl_vllm.worker import reprocess_tied_embeddings


@dataclass
class LinkInitInfo(WeightTransferInitInfo):
    transport: str  # "module:Class" of a toolrl LinkedTransport
    options: dict[str, Any]
    links: list[dict[str, Any]]  # toolrl.transports.Link, dumped
    index: int  # this engine's receiver index on every link


@dataclass
class LinkUpdateInfo(WeightTransferUpdateInfo):
    keys: list[str] = field(default_factory=list)  # the links this update comes over (those opened at init)


class _Assembler:
    """Whole tensors out of row pieces from several links: a tensor is handed to ``load`` once every
    row is in. A piece's bytes are copied out at once: the transport reuses its buffer."""

    def __init__(self, load: Any) -> None:
        self.load = load
        self.partial: dict[str, list[Any]] = {}  # name -> [tensor, rows still missing]
        self.lock = threading.Lock()

    def add(self, header: BucketHeader, data: Any) -> None:
        for piece in header.pieces:
            rows = piece.view(data)
            if not piece.shape or (piece.start == 0 and piece.rows == piece.shape[0]):
                self.load(piece.name, rows.clone())
                continue
            with self.lock:
                entry = self.partial.setdefault(piece.name, [rows.new_empty(piece.shape), piece.shape[0]])
                entry[0].narrow(0, piece.start, piece.rows).copy_(rows)
                entry[1] -= piece.rows
                done = entry[1] == 0
                if done:
                    del self.partial[piece.name]
            if done:
                self.load(piece.name, entry[0])

    def missing(self) -> list[str]:
        return sorted(self.partial)


class LinkTransferEngine(WeightTransferEngine[LinkInitInfo, LinkUpdateInfo]):
    init_info_cls = LinkInitInfo
    update_info_cls = LinkUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.receivers: list[WeightReceiver] = []
        self.keys: list[str] = []
        self.received = 0  # bytes of the last update
        self._assembler: _Assembler | None = None
        self._load_lock = threading.Lock()  # vLLM's loaders are not made for concurrent calls

    def init_transfer_engine(self, init_info: LinkInitInfo) -> None:
        self.shutdown()
        module, _, name = init_info.transport.partition(":")
        cls = getattr(importlib.import_module(module), name)
        transport = cls(cls.Options.model_validate(init_info.options))
        links = [Link.model_validate(link) for link in init_info.links]
        self.receivers = [transport.open_receiver(link, init_info.index) for link in links]
        self.keys = [link.key for link in links]

    def start_weight_update(self) -> None:
        initialize_layerwise_reload(self.model)
        self._assembler = _Assembler(self._load)
        self.received = 0

    def _load(self, name: str, tensor: Any) -> None:
        with self._load_lock:
            self.model.load_weights([(name, tensor)])

    def update_weights(self, update_info: dict[str, Any]) -> None:
        # The base class's synchronize fails where torch has no accelerator (vLLM's CPU worker).
        self.receive_weights(self.parse_update_info(update_info))
        if torch.accelerator.is_available():
            torch.accelerator.synchronize()

    def receive_weights(self, update_info: LinkUpdateInfo) -> None:
        if update_info.keys != self.keys:
            raise TransportError(f"weight update over links {update_info.keys}, but this engine joined {self.keys}")
        assembler = self._assembler
        if assembler is None:
            raise RuntimeError("update_weights before start_weight_update")
        with ThreadPoolExecutor(max(1, len(self.receivers))) as pool:
            futures = [pool.submit(r.receive, assembler.add) for r in self.receivers]
            errors = [f.exception() for f in futures if f.exception() is not None]  # each ends within its timeout
        if errors:
            # vLLM's worker ends the session without finish_weight_update: end the reload here, so
            # every layer holds real tensors again (the old ones where nothing arrived).
            self._end_reload()
            raise errors[0]
        self.received += sum(f.result() for f in futures)

    def finish_weight_update(self) -> None:
        if missing := self._end_reload():
            raise TransportError(f"weight update ended with rows of {len(missing)} tensors missing: {missing[:3]}")

    def _end_reload(self) -> list[str]:
        """Finalize the layerwise reload (once per update); the tensors still missing rows."""
        if self._assembler is None:
            return []
        missing, self._assembler = self._assembler.missing(), None
        finalize_layerwise_reload(self.model, self.model_config)
        reprocess_tied_embeddings(self.model)
        return missing

    def shutdown(self) -> None:
        for receiver in self.receivers:
            receiver.close()
        self.receivers, self.keys = [], []
