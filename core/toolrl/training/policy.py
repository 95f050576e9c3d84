"""The model a trainer rank optimises, built in one place (the local run, trainer ranks, checkpoint
export and the critic's initialisation all call it)."""

from __future__ import annotations

from typing import Any

from toolrl import model_sources
from toolrl.config import Config, ConfigError
from toolrl.modeling.adapters import apply_adapters, apply_lora


def build_policy(config: Config, path: str, device: str) -> Any:
    """The model a trainer rank optimises: the one place it is built (adapters wrap it here)."""
    model = model_sources.load_model(path, dtype=config.model.dtype, device=device)
    if config.model.freeze_vision:
        from toolrl.training import vision

        if not vision.is_vision_model(model):
            raise ConfigError(f"model.freeze_vision: {config.model.source!r} has no vision tower")
        vision.freeze_vision(model)
    if config.model.freeze_output_head:  # tied input embeddings are the same tensor: frozen with it
        head = model.get_output_embeddings()
        if head is None:
            raise ConfigError(f"model.freeze_output_head: {config.model.source!r} names no output head")
        head.requires_grad_(False)
    if config.model.lora is not None:
        apply_lora(model, config.model.lora)
    if config.model.adapters is not None:  # several policies: one adapter per role, routed per token
        apply_adapters(model, config.model.adapters)
    if config.model.gradient_checkpointing:
        # Non-reentrant: the form FSDP2 and torch.compile support.
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model
