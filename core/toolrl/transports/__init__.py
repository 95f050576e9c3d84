"""Weight transports (``register_weight_transports``, ``trainer.weight_transport``): how a weight sync's
bytes travel from the trainer ranks to the engines (docs/weights.md). Every transport is a
:class:`LinkedTransport`: each trainer rank opens one link to all the engines' receivers and sends the
shards it owns, so there is no single sender and no full gather.

A :class:`Bucket` is a header (which rows of which weights, where) and a ``fill`` that packs its bytes into
the ``uint8`` buffer the transport hands it, so shared buffers are packed in place; a receiver's ``load``
callback gets views valid only during the call. Within ``Link.timeout_s`` of a peer dying, ``send`` and
``receive`` raise :class:`TransportError`: a transfer never hangs.
"""

from __future__ import annotations

import os
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from toolrl.config import field_where
from toolrl.plugins.parts import BuildContext, NoOptions, build_part

if TYPE_CHECKING:
    from toolrl.plugins.parts import RunFacts

# Pieces start on 64-byte boundaries of a bucket: a view of any dtype can start there.
ALIGN = 64


class TransportError(RuntimeError):
    """A transfer that cannot finish: a peer died, stalled past the link's timeout, or sent garbage."""


class RowPiece(BaseModel):
    """Rows ``start .. start + rows`` (along dim 0) of weight ``name`` (whole: ``shape``), at byte
    ``offset`` of its bucket. A 0-d tensor is one piece with ``rows`` 1."""

    model_config = ConfigDict(frozen=True)

    name: str
    shape: tuple[int, ...]
    dtype: str  # torch dtype name without "torch.", e.g. "float32"
    start: int = 0
    rows: int
    offset: int
    nbytes: int

    def view(self, data: Any) -> Any:
        """This piece's tensor, a view into the bucket's bytes ``data``."""
        import torch

        rows = (self.rows, *self.shape[1:]) if self.shape else ()
        return data[self.offset:self.offset + self.nbytes].view(getattr(torch, self.dtype)).view(rows)


class BucketHeader(BaseModel):
    pieces: list[RowPiece]
    nbytes: int = Field(ge=0)


@dataclass
class Bucket:
    header: BucketHeader
    fill: Callable[[Any], None]  # packs the pieces into a flat uint8 tensor of header.nbytes


Load = Callable[[BucketHeader, Any], None]


class Link(BaseModel):
    """One sender's link to its receivers, the same on every side: ``key`` names it (a new key: a new
    link), ``address`` is where receivers find the sender (host:port, or a directory)."""

    model_config = ConfigDict(frozen=True)

    key: str
    sender: int  # the trainer rank
    receivers: int = Field(gt=0)
    address: str
    timeout_s: float = Field(gt=0)

    def error(self, what: str) -> TransportError:
        """The :class:`TransportError` that says ``what`` went wrong on this link (named by its key)."""
        return TransportError(f"weight link {self.key}: {what}")


class WeightSender(ABC):
    link: Link

    @abstractmethod
    def send(self, buckets: Iterable[Bucket]) -> int:
        """Every bucket to every receiver; returns the bytes sent. Raises TransportError."""

    def close(self) -> None:
        """Release what the link holds (connections, shared buffers, files)."""


class WeightReceiver(ABC):
    @abstractmethod
    def receive(self, load: Load) -> int:
        """One stream of buckets (one ``send``), each handed to ``load``; returns the bytes received."""

    def close(self) -> None:
        """Release what the link holds."""


TransportOptions = NoOptions  # public (docs/plugins.md): what a transport's Options extends


class WeightTransport:
    """The kind's base (``register_weight_transports``): a part with ``Options`` and ``build``."""

    name: ClassVar[str] = ""
    Options: ClassVar[type[BaseModel]] = TransportOptions

    def __init__(self, options: BaseModel | None = None) -> None:
        self.options = options if options is not None else self.Options()

    @classmethod
    def build(cls, options: BaseModel, context: Any) -> WeightTransport:
        return cls(options)

    def check_run(self, facts: RunFacts) -> list[str]:
        """The run check (:class:`toolrl.plugins.parts.RunFacts`, before any model loads): a subclass
        probes what its options name (a directory writable, a device there) and then calls this, which
        says in one warning line when the run is single-process: weights never travel there."""
        if facts.in_process:
            return [f"{facts.where('trainer.weight_transport')}: {self.name} is unused: every process is this "
                    "one (no ray.address), so weights never travel"]
        return []


class LinkedTransport(WeightTransport, ABC):
    """A transport whose bytes travel over links, one per trainer rank (every built-in one, the object
    store's included): what the trainer group and the rollout workers use, whichever it is."""

    @abstractmethod
    def open_sender(self, key: str, sender: int, receivers: int, timeout_s: float) -> WeightSender:
        """The sending end of a new link; its ``link`` is what receivers need to join."""

    @abstractmethod
    def open_receiver(self, link: Link, index: int) -> WeightReceiver:
        """Receiver ``index`` (0-based, of ``link.receivers``) of ``link``."""


def writable_directory(path: str, what: str) -> None:
    """A ValueError unless ``path`` is a directory this process can write a file in (probed with one), or
    one it can create (its nearest existing parent writable)."""
    found = Path(path)
    if found.exists():
        if not found.is_dir():
            raise ValueError(f"{what}={path!r} is a file, not a directory")
        try:
            tempfile.TemporaryFile(dir=found).close()
        except OSError as exc:
            raise ValueError(f"{what}={path!r}: cannot write there ({exc.strerror})") from None
        return
    parent = next(p for p in found.absolute().parents if p.exists())
    if not (parent.is_dir() and os.access(parent, os.W_OK | os.X_OK)):
        raise ValueError(f"{what}={path!r} does not exist and cannot be made ({parent} is not a writable directory)")


def build_transport(trainer: Any, config: Any = None) -> WeightTransport:
    """The transport ``trainer`` (a :class:`toolrl.config.TrainerConfig`) names; ConfigError otherwise,
    naming the file and line of the setting when given the run's ``config``."""
    fields = ["trainer.weight_transport", "trainer.weight_transport_options"]
    where = fields if config is None else [field_where(config, w) for w in fields]
    return build_part("weight_transports", trainer.weight_transport, trainer.weight_transport_options,
                      BuildContext(*where, config, options_field=fields[1]))
