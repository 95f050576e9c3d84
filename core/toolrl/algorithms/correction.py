"""Rollout correction (``algorithm.correction``, ``docs/algorithms.md``): the importance weight each
trained token's loss is multiplied by, for having been sampled by the engine (the behaviour policy,
``behav``) rather than by the weights the step starts from (the proximal policy, ``prox``). Per trained
token ``ρ_t = π_prox / π_behav = exp(prox_t - behav_t)``; per sequence the geometric mean of its
tokens' ratios ``ρ_seq = exp(mean_t(prox_t - behav_t))``, broadcast over its tokens. ``ρ`` is the
token's or the sequence's, by ``level``:

- ``truncate`` (default): ``w = min(ρ, tis_cap)``; no weight (``w = 1``) without ``algorithm.tis_cap``,
  as before rollout correction had options (token level: truncated IS, TIS).
- ``mask``: ``w = ρ`` where ``lo <= ρ <= hi``, else 0 (masked IS; at sequence level the whole sequence
  is kept or dropped: TRL's default since 2026).
- ``veto``: a sequence with a token ratio below ``veto`` gets ``w = 0`` on every token (a token the
  trainer finds far less likely than the engine did marks a sequence the engine got wrong).

A weight of 0 leaves the token's loss out; the aggregation's normalisers still count it (they are
the mini-batch's, fixed before the weights are known). The weight carries no gradient.
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
    """The weights of the module docstring; ``prox_lp`` without gradient."""
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
