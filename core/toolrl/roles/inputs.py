"""What the model will be fed, checked before any model loads: the tokenizer, the processor (a
vision-language model's), the model family's renderer (its tokens in the tokenizer, its template) and
every prompt against the model's context. The controller checks them once (:func:`check_model_inputs`)
and the roles it builds in this process reuse them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from toolrl import model_sources
from toolrl.config import Config, field_where
from toolrl.engines.build import engine_processor
from toolrl.roles.run_check import check_run, report
from toolrl.rollout.context_check import check_prompt_tokens
from toolrl.rollout.families import config_renderer_factory
from toolrl.rollout.routes import Parts
from toolrl.schemas import Sample


@dataclass(frozen=True)
class ModelInputs:
    """The tokenizer, the processor (None but for a vision-language model) and the renderer factory
    (:func:`toolrl.rollout.families.config_renderer_factory`) of a run's model, checked."""

    tokenizer: Any
    processor: Any
    renderer_factory: Any


def check_model_inputs(config: Config, parts: Parts, path: str, prompts: Sequence[Sample]) -> ModelInputs:
    """The model's inputs, each check a one-line error: images need an engine that takes them, the
    family's tokens must be in the tokenizer, every prompt must fit the model's context (and
    ``model.max_context``), and the run check (:mod:`toolrl.roles.run_check`: the template, every
    part's semantics) passes; its warnings are printed, one line each."""
    tokenizer = model_sources.load_tokenizer(path)
    processor = engine_processor(config, parts.engine_cls, path, prompts)
    factory = config_renderer_factory(config, tokenizer, processor)
    report(check_run(config, parts, path, tokenizer, factory))
    # Each prompt as its route renders it (the template, the tools known before they are built), against
    # the model's context and model.max_context.
    renderers = {name: factory(route.tools.schemas) for name, route in parts.routes.items()}
    cap = config.model.max_context
    check_prompt_tokens(prompts, tokenizer, path, processor, "the prompts", config.rollout.images,
                        cap=(cap, field_where(config, "model.max_context")) if cap is not None else None,
                        renderer_of=lambda sample: renderers.get(sample.env) or next(iter(renderers.values())))
    return ModelInputs(tokenizer, processor, factory)
