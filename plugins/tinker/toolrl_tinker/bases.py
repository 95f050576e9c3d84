"""The base models the service holds: per name, its directory, the trainer's copy (every training
run's adapter: :mod:`toolrl_tinker.trainer`) and the sampler's (every saved weight set's:
:mod:`toolrl_tinker.sampler`)."""

from __future__ import annotations

from dataclasses import dataclass

from toolrl.config import ModelConfig
from toolrl.model_sources import load_tokenizer, resolve_source

from toolrl_tinker.hub_names import ALIASES
from toolrl_tinker.sampler import Sampler
from toolrl_tinker.trainer import Ranks, Trainer


@dataclass
class Base:
    name: str
    path: str
    trainer: Trainer
    sampler: Sampler

    @classmethod
    def load(cls, name: str, keep: int = 4, source: str | None = None, ranks: Ranks | None = None,
             sampler: str = "transformers", slots: int = 32, max_rank: int = 64) -> Base:
        """Base ``name`` (a toolrl built-in, its Hub alias, a directory or a Hub id; or any name, offering
        ``source``'s weights) loaded twice: the trainer's where ``ranks`` say, the sampler's here (engine
        ``sampler``, ``slots`` adapters resident, ranks up to ``max_rank``), keeping ``keep`` weight sets per run."""
        path = resolve_source(ModelConfig(source=source or ALIASES.get(name, name)))
        return cls(name, path, Trainer(path, ranks), Sampler(path, load_tokenizer(path), keep, sampler, slots=slots,
                                                               max_rank=max_rank))
