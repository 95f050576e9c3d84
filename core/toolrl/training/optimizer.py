"""AdamW, built in one place for every trainer (the trainer ranks, the critic, the Tinker service's
clients), and one optimizer step with typed settings for a trainer outside toolrl's loop
(docs/training_api.md)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any

import torch
from pydantic import BaseModel, ConfigDict, Field

from toolrl.training.step import clip_grad_norm

__all__ = ["OptimizerSettings", "adamw", "optimizer_step"]

Beta = Annotated[float, Field(ge=0, lt=1)]


class OptimizerSettings(BaseModel):
    """AdamW's learning rate, betas, epsilon and decoupled weight decay, and the norm the gradients are
    clipped to before a step (0: not clipped; :func:`optimizer_step` reads it, the optimizer does not)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    lr: float = Field(ge=0)
    betas: tuple[Beta, Beta] = (0.9, 0.999)
    eps: float = Field(1e-8, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    grad_clip_norm: float = Field(0.0, ge=0)


def adamw(params: Iterable[torch.Tensor] | Iterable[dict[str, Any]], settings: OptimizerSettings) -> torch.optim.AdamW:
    """AdamW over ``params`` (tensors, or parameter groups with an ``lr`` of their own) with ``settings``."""
    return torch.optim.AdamW(params, lr=settings.lr, betas=settings.betas, eps=settings.eps,
                             weight_decay=settings.weight_decay)


def optimizer_step(optimizer: torch.optim.Optimizer, settings: OptimizerSettings) -> float | None:
    """One step of ``optimizer`` with ``settings`` in every parameter group (each step may bring its own:
    a schedule), the gradients first clipped to ``settings.grad_clip_norm`` over all its parameters
    (when above 0; under FSDP2 the norm is over every shard), then cleared (``None``). Returns the
    gradient norm before clipping, None when not clipped."""
    for group in optimizer.param_groups:
        group.update(lr=settings.lr, betas=settings.betas, eps=settings.eps, weight_decay=settings.weight_decay)
    norm = None
    if settings.grad_clip_norm > 0:
        norm = clip_grad_norm([p for g in optimizer.param_groups for p in g["params"]], settings.grad_clip_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return norm
