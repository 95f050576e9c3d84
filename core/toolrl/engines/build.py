"""The configured engine, built where the rollout process runs: its class looked up by name
(:func:`toolrl.rollout.routes.resolve_parts`), its options from ``engine:``, and the processor a
vision-language model renders prompts with."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Sequence
from typing import Any

from toolrl import model_sources
from toolrl.config import Config, ConfigError
from toolrl.engines import ModelSource
from toolrl.plugins.parts import BuildContext, build_part
from toolrl.schemas import Sample

log = logging.getLogger(__name__)

def engine_processor(config: Config, engine_cls: Any, path: str, samples: Sequence[Sample] = ()) -> Any:
    """The processor the rollout renders with: the model's (None for a text model), unless the engine's
    ``generate`` takes no images. Then a vision-language model reads text only (said once in the log;
    tool results' images are left out), and samples that hold images are a one-line config error."""
    processor = model_sources.load_processor(path)
    if processor is None or "images" in inspect.signature(engine_cls.generate).parameters:
        return processor
    if any(s.images for s in samples):
        raise ConfigError(f"engine.name: the {config.engine.name} engine takes no images, and the prompts of "
                          f"the vision-language model {config.model.source} hold some: use an engine that takes "
                          "them (transformers), or leave them out (an environment's images: false)")
    log.warning("the %s engine takes no images: the vision-language model %s reads the prompts' text only",
                config.engine.name, config.model.source)
    return None


def build_engine(config: Config, path: str, tokenizer: Any, module: Any = None) -> Any:
    """The configured engine on the model in ``path`` (``module``: a live model to share, in process);
    its options (``engine:``, with the model's device and dtype) checked against the engine's
    ``Options``: a bad one is a one-line error naming ``engine.options``."""
    source = ModelSource(path=path, module=module, tokenizer=tokenizer)
    return build_part("rollout_engines", config.engine.name, engine_options(config),
                      BuildContext("engine.name", "engine.options", config, {"source": source},
                                   options_field="engine.options"))


def engine_options(config: Config) -> dict[str, Any]:
    """What the engine is built with: ``engine.options`` with the engine's batch size and the model's
    device and dtype (checked against the engine's ``Options`` by the run check, before any model loads)."""
    return {"max_batch_size": config.engine.max_batch_size,
            "device": model_sources.resolve_device(config.model.device), "dtype": config.model.dtype,
            **config.engine.options}
