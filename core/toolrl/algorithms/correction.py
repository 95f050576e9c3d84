"""Rollout correction (``algorithm.correction``): the importance weight each trained token's loss is
multiplied by, for having been sampled by the engine (the behaviour policy, ``behav``) rather than by
the weights the step starts from (the proximal policy, ``prox``), from the token's ratio
``ρ_t = exp(prox_t - behav_t)`` or its sequence's ``ρ_seq = exp(mean_t(prox_t - behav_t))``. Each
``mode``'s weight and when to use it: docs/algorithms.md, "Rollout correction". A weight of 0 leaves
the token's loss out; the aggregation's normalisers still count it (they are the mini-batch's, fixed
before the weights are known). The weight carries no gradient.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from toolrl.config import AlgorithmConfig


@dataclass(frozen=True)
class Correction:
    """A micro-batch's correction, (B, R) each: ``weight`` (None: no weight, ``w = 1``), the token
    ratios ``ratio`` and ``dropped`` (True where a mask or the veto set the weight to 0)."""

    weight: torch.Tensor | None
    ratio: torch.Tensor
    dropped: torch.Tensor


def correction(prox_lp: torch.Tensor, behav_lp: torch.Tensor, mask: torch.Tensor, algo: AlgorithmConfig) -> Correction:
    """The weights ``algo.correction`` gives; ``prox_lp`` without gradient."""
    cfg = algo.correction
    log_ratio = prox_lp.detach() - behav_lp
    ratio = torch.exp(log_ratio)
    if cfg.level == "sequence":
        seq = (log_ratio * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1.0)
        level = torch.exp(seq).expand(ratio.shape)
    else:
        level = ratio
    if cfg.mode == "mask":
        keep = (level >= cfg.lo) & (level <= cfg.hi)
        weight: torch.Tensor | None = torch.where(keep, level, 0.0)
        dropped = ~keep
    else:
        weight = None if algo.tis_cap is None else level.clamp(max=algo.tis_cap)
        dropped = torch.zeros_like(mask, dtype=torch.bool)
    if cfg.veto is not None:
        vetoed = ((ratio < cfg.veto) & mask.bool()).any(-1, keepdim=True).expand(ratio.shape)
        weight = torch.where(vetoed, 0.0, torch.ones_like(ratio) if weight is None else weight)
        dropped = dropped | vetoed
    return Correction(weight, ratio, dropped)
