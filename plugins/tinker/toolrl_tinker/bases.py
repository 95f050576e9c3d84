"""The base models the service holds: per name, its directory, the trainer's copy (every training
run's adapter: :mod:`toolrl_tinker.trainer`), the turns on it (:class:`toolrl_tinker.steps.Turns`),
the sampler's copy (every saved weight set's: :mod:`toolrl_tinker.sampler`) and its requests in progress,
whose freed memory is given back once none is (:class:`toolrl_tinker.idle.Idle`)."""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass, field

from toolrl.model_sources import load_tokenizer

from toolrl_tinker.hub_names import ALIASES, base_spec, model_dir
from toolrl_tinker.idle import Idle
from toolrl_tinker.limits import Limits
from toolrl_tinker.requests import UserError
from toolrl_tinker.sampler import Sampler
from toolrl_tinker.steps import Turns
from toolrl_tinker.trainer import Ranks, Trainer


@dataclass
class Base:
    name: str
    path: str
    trainer: Trainer
    sampler: Sampler
    turns: Turns = field(default_factory=Turns)
    idle: Idle = field(default_factory=Idle)

    @classmethod
    def load(cls, name: str, limits: Limits | None = None, source: str | None = None,
             ranks: Ranks | None = None) -> Base:
        """Base ``name`` (a toolrl built-in, its Hub alias, a directory or a Hub id; or any name, offering
        ``source``'s weights) loaded twice: the trainer's where ``ranks`` say, the sampler's here (as ``limits``
        say: its engine, adapters resident and kept, largest rank)."""
        path = model_dir(source or ALIASES.get(name, name))
        return cls(name, path, Trainer(path, ranks), Sampler(path, load_tokenizer(path), limits or Limits()))

    def memory(self) -> dict[str, dict[str, int]]:
        """Tensor bytes by copy and part: the trainer's (per rank: the base's shard, the runs' adapters, gradients,
        AdamW state and those moved to host memory) and the sampler's (a vLLM sampler's are its processes')."""
        return {"trainer": self.trainer.memory(), "sampler": self.sampler.memory()}


class Bases(dict[str, Base]):
    """The loaded bases by every name a client may use; names of one source share its copies and turns."""

    def __init__(self, specs: list[str]) -> None:
        """``specs``: each a name clients use, or ``NAME=SOURCE`` (:func:`toolrl_tinker.hub_names.base_spec`)."""
        super().__init__()
        self.sources = dict(base_spec(b) for b in specs)
        self.names = list(self.sources)

    def named(self, name: str) -> Base:
        if name not in self:
            raise UserError(f"unknown base model {name!r}: this server holds {', '.join(self.names)}")
        return self[name]

    def distinct(self) -> dict[str, list[str]]:
        """Each source's first name, and every name it is offered under."""
        names: dict[str, list[str]] = {}
        first: dict[str, str] = {}
        for name, source in self.sources.items():
            names.setdefault(first.setdefault(source, name), []).append(name)
        return names

    async def load(self, limits: Limits, ranks: Ranks | None) -> None:
        """Each source loaded once (its trainer where ``ranks`` say), under each of its names."""
        for first, names in self.distinct().items():
            base = await asyncio.to_thread(Base.load, first, limits, self.sources[first], ranks)
            for name in names:
                self[name] = dataclasses.replace(base, name=name)

    async def close(self) -> None:
        """The trainers ended (a group's ranks on Ray) and the samplers' engines shut down (vLLM's processes
        end with them)."""
        for first in self.distinct():
            if first in self:
                await asyncio.to_thread(self[first].trainer.close)
                await self[first].sampler.engine.close()
