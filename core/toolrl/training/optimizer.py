"""AdamW, built in one place for every trainer (the trainer ranks, the critic, the Tinker service's
clients); the gradients clipped and the optimizer stepped, one way for all of them (:func:`clipped_step`);
and one optimizer step with typed settings for a trainer outside toolrl's loop (docs/training_api.md).

``grad_clip`` means the same everywhere: the largest global gradient norm, 0 for no clipping."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any

import torch
from pydantic import BaseModel, ConfigDict, Field

__all__ = ["OptimizerSettings", "adamw", "clipped_step", "optimizer_step"]

Beta = Annotated[float, Field(ge=0, lt=1)]


class OptimizerSettings(BaseModel):
    """AdamW's learning rate, betas, epsilon and decoupled weight decay, and the global norm the gradients
    are clipped to before a step (``grad_clip``; 0: not clipped; :func:`optimizer_step` reads it, the
    optimizer does not)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    lr: float = Field(ge=0)
    betas: tuple[Beta, Beta] = (0.9, 0.999)
    eps: float = Field(1e-8, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    grad_clip: float = Field(0.0, ge=0)


def adamw(params: Iterable[torch.Tensor] | Iterable[dict[str, Any]], settings: OptimizerSettings) -> torch.optim.AdamW:
    """AdamW over ``params`` (tensors, or parameter groups with an ``lr`` of their own) with ``settings``."""
    return torch.optim.AdamW(params, lr=settings.lr, betas=settings.betas, eps=settings.eps,
                             weight_decay=settings.weight_decay)


def clipped_step(optimizer: torch.optim.Optimizer, parameters: Iterable[torch.Tensor], grad_clip: float) -> float:
    """One step of ``optimizer``, the gradients of ``parameters`` first clipped to a global norm of
    ``grad_clip`` (0: not clipped). Returns their global norm before clipping (under FSDP2, over every
    shard), measured when not clipped too: a step's metrics report it either way."""
    params = list(parameters)
    # clip_grad_norm_ in two halves, so that the norm is measured without clipping as well.
    norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
    if grad_clip > 0:
        torch.nn.utils.clip_grads_with_norm_(params, grad_clip, norm)
    total = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
    optimizer.step()
    return total


def optimizer_step(optimizer: torch.optim.Optimizer, settings: OptimizerSettings) -> float:
    """One step of ``optimizer`` with ``settings`` in every parameter group (each step may bring its own:
    a schedule), the gradients first clipped to ``settings.grad_clip`` over all its parameters
    (:func:`clipped_step`), then cleared (``None``). Returns the gradient norm before clipping."""
    for group in optimizer.param_groups:
        group.update(lr=settings.lr, betas=settings.betas, eps=settings.eps, weight_decay=settings.weight_decay)
    norm = clipped_step(optimizer, [p for g in optimizer.param_groups for p in g["params"]], settings.grad_clip)
    optimizer.zero_grad(set_to_none=True)
    return norm
