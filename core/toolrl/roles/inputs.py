"""What the model will be fed, checked before any model loads: the tokenizer, the processor (a
vision-language model's), the model family's renderer (its tokens in the tokenizer, its template) and
every prompt against the model's context. The controller checks them once (:func:`check_model_inputs`)
and the roles it builds in this process reuse them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from toolrl import model_sources
from toolrl.config import Config
from toolrl.engines.build import engine_processor
from toolrl.rollout.context_check import check_prompt_tokens
from toolrl.rollout.families import config_renderer_factory
from toolrl.schemas import Sample


@dataclass(frozen=True)
class ModelInputs:
    """The tokenizer, the processor (None but for a vision-language model) and the renderer factory
    (:func:`toolrl.rollout.families.config_renderer_factory`) of a run's model, checked."""

    tokenizer: Any
    processor: Any
    renderer_factory: Any


def check_model_inputs(config: Config, engine_cls: type, path: str, prompts: Sequence[Sample]) -> ModelInputs:
    """The model's inputs, each check a one-line error: images need an engine that takes them, the
    family's tokens must be in the tokenizer, and every prompt must fit the model's context."""
    tokenizer = model_sources.load_tokenizer(path)
    processor = engine_processor(config, engine_cls, path, prompts)
    factory = config_renderer_factory(config, tokenizer, processor)
    check_prompt_tokens(prompts, tokenizer, path, processor, "the prompts", config.rollout.images)
    return ModelInputs(tokenizer, processor, factory)
