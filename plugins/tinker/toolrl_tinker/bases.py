"""The base models the service holds: per name, its directory, the trainer's copy (every training
run's adapter: :mod:`toolrl_tinker.trainer`) and the sampler's (every saved weight set's:
:mod:`toolrl_tinker.sampler`)."""

from __future__ import annotations

from dataclasses import dataclass

from toolrl.config import ModelConfig
from toolrl.model_sources import load_tokenizer, resolve_source

from toolrl_tinker.hub_names import ALIASES
from toolrl_tinker.sampler import Sampler
from toolrl_tinker.trainer import Trainer


@dataclass
class Base:
    name: str
    path: str
    trainer: Trainer
    sampler: Sampler

    @classmethod
    def load(cls, name: str, keep: int = 4, source: str | None = None) -> Base:
        """Base ``name`` (a toolrl built-in, its Hub alias, a directory or a Hub id; or any name, offering
        ``source``'s weights) loaded twice; the sampler keeps ``keep`` weight sets per run."""
        path = resolve_source(ModelConfig(source=source or ALIASES.get(name, name)))
        return cls(name, path, Trainer(path), Sampler(path, load_tokenizer(path), keep))
