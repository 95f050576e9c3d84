"""The configured model served outside training (``toolrl serve``, in the ``openai`` plugin, through
:mod:`toolrl.plugin_support`): its engine, tokenizer, processor and parser, composed as a rollout worker
composes them, so what is served is what training samples from."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from toolrl import model_sources
from toolrl.config import Config
from toolrl.engines import RolloutEngine
from toolrl.engines.build import build_engine
from toolrl.parsers import ToolParser
from toolrl.rollout.routes import resolve_parts


@dataclass
class ServedModel:
    engine: RolloutEngine
    tokenizer: Any
    processor: Any  # None for a text model
    parser: ToolParser  # the (first) route's: the environment's, or rollout.parser


def build_served_model(config: Config) -> ServedModel:
    """Every part the config names resolved first (a typo is a ConfigError before anything loads), then
    the model's tokenizer and processor and the configured engine on it."""
    parts = resolve_parts(config)
    path = model_sources.model_path(config)
    tokenizer = model_sources.load_tokenizer(path)
    engine = build_engine(config, path, tokenizer)
    return ServedModel(engine, tokenizer, model_sources.load_processor(path), parts.parser)
