"""The built-in advantage estimators (``docs/algorithms.md``). Each gives a (B, R) float32 grid;
the outcome ones broadcast one number per trajectory over its row. ``r_i`` is trajectory ``i``'s
reward, ``G(i)`` its group (the ``n`` samples of one prompt)."""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from toolrl.algorithms import AdvantageEstimator, AdvantageInputs

if TYPE_CHECKING:
    import torch

# Tensor methods only, no torch module: a config naming these estimators is checked (their options
# validated) before torch loads, so a bad field costs a fraction of a second (tests start hundreds).


class GroupOptions(BaseModel):
    """Every estimator that normalises within groups takes these (grpo, gigpo, tree_grpo)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    eps: float = Field(1e-6, gt=0, description="added to a group's std before dividing")
    norm_by_std: bool = Field(True, description="divide by the group's std + eps (false: centre only)")


CENTRED = GroupOptions(norm_by_std=False)


def group_stats(values: Sequence[float], keys: Sequence[Hashable]) -> list[tuple[float, float, int]]:
    """Each value's group's mean, unbiased std and size (equal keys: one group), summed in Python floats
    in batch order (the arithmetic of toolrl's original GRPO, kept so the default run stays bit-identical)."""
    by_key: dict[Hashable, list[float]] = {}
    for x, k in zip(values, keys, strict=True):
        by_key.setdefault(k, []).append(x)
    stats = {}
    for k, xs in by_key.items():
        mean = sum(xs) / len(xs)
        std = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0
        stats[k] = (mean, std, len(xs))
    return [stats[k] for k in keys]


def group_normalised(values: Sequence[float], keys: Sequence[Hashable],
                     options: GroupOptions = CENTRED) -> list[float]:
    """Each value against its group's: ``(x - mean) / (std + eps)``, or ``x - mean`` without
    ``norm_by_std``; 0 in a group of one (no other value to compare it with). The one group
    normalisation of every estimator."""
    return [0.0 if n == 1 else (x - mean) / (std + options.eps) if options.norm_by_std else x - mean
            for x, (mean, std, n) in zip(values, group_stats(values, keys), strict=True)]


def broadcast(per_trajectory: Sequence[float], mask: torch.Tensor) -> torch.Tensor:
    """One advantage per trajectory over its whole row, (B, R) float32."""
    adv = mask.float().new_tensor(list(per_trajectory))
    return adv[:, None].expand(mask.shape).contiguous()


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """``(x - mean) / sqrt(var + eps)`` with the mean and the unbiased variance over the trained tokens
    (``mask`` 1) of the whole batch: TRL's and verl's ``masked_whiten``, the normalisation of PPO's
    advantages and of REINFORCE++'s returns. Untrained positions are whitened with the same numbers,
    not zeroed (an outcome estimator broadcasts over its whole row); one trained token gives 0 there,
    none leaves the values uncentred rather than NaN."""
    count = mask.sum()
    mean = (values * mask).sum() / count.clamp(min=1)
    var = (((values - mean) ** 2) * mask).sum() / (count - 1).clamp(min=1)
    return (values - mean) * (var + eps).rsqrt()


class Grpo(AdvantageEstimator):
    """GRPO (Shao et al. 2024)::

        A_i = (r_i - mean_G(i) r) / (std_G(i) r + eps)      (std unbiased; a group of one: A_i = 0)

    ``norm_by_std: false`` leaves the division out (then equal to ``dr_grpo``)."""

    name = "grpo"
    group_relative = True
    Options = GroupOptions

    def __call__(self, inputs: AdvantageInputs) -> torch.Tensor:
        return broadcast(group_normalised(inputs.rewards.tolist(), inputs.groups.tolist(), self.options),
                         inputs.response_mask)


class DrGrpo(AdvantageEstimator):
    """Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-like training")::

        A_i = r_i - mean_G(i) r                              (a group of one: A_i = 0)

    No division by the group's std (it up-weights prompts that are nearly always right or wrong). The
    paper's other half, a constant length normaliser instead of each response's length, is
    ``algorithm.loss_agg: seq-mean-token-sum-norm`` (or ``token-mean``); :mod:`toolrl.algorithms.rules`
    rejects ``seq-mean-token-mean`` with it."""

    name = "dr_grpo"
    group_relative = True

    def __call__(self, inputs: AdvantageInputs) -> torch.Tensor:
        return broadcast(group_normalised(inputs.rewards.tolist(), inputs.groups.tolist()), inputs.response_mask)


class Rloo(AdvantageEstimator):
    """RLOO (Ahmadian et al. 2024, "Back to basics"): the leave-one-out baseline, the mean of the
    other ``n - 1`` rewards of the group::

        A_i = r_i - (sum_G(i) r - r_i) / (n - 1) = n / (n - 1) · (r_i - mean_G(i) r)   (n = 1: A_i = 0)
    """

    name = "rloo"
    group_relative = True

    def __call__(self, inputs: AdvantageInputs) -> torch.Tensor:
        rewards = inputs.rewards.tolist()
        loo = [0.0 if n == 1 else r - (mean * n - r) / (n - 1)
               for r, (mean, _, n) in zip(rewards, group_stats(rewards, inputs.groups.tolist()), strict=True)]
        return broadcast(loo, inputs.response_mask)


class WhitenOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    eps: float = Field(1e-8, gt=0, description="added to the batch variance before the square root")


class ReinforcePP(AdvantageEstimator):
    """REINFORCE++ (Hu 2025): the return of each token (the outcome reward, γ = 1) normalised over
    every trained token of the batch, no per-prompt baseline::

        A_it = (r_i - μ) / sqrt(σ² + eps)     μ, σ²: mean and unbiased variance of r_i over the batch's
                                              trained tokens (a long response weighs more)

    The paper folds a per-token KL penalty into the return; toolrl keeps KL in the loss
    (``loss_options.kl_coef``, k3), as for every estimator."""

    name = "reinforce_pp"
    Options = WhitenOptions

    def __call__(self, inputs: AdvantageInputs) -> torch.Tensor:
        mask = inputs.response_mask
        returns = inputs.rewards.double()[:, None].expand(mask.shape)
        return masked_whiten(returns, mask.double(), self.options.eps).float()


class ReinforcePPBaseline(AdvantageEstimator):
    """REINFORCE++ with a group baseline (Hu 2025, verl's ``reinforce_plus_plus_baseline``): each
    reward less its group's mean, then normalised over the batch's trained tokens::

        A_it = (a_i - μ) / sqrt(σ² + eps)     a_i = r_i - mean_G(i) r;  μ, σ² of a_i over trained tokens
    """

    name = "reinforce_pp_baseline"
    group_relative = True
    Options = WhitenOptions

    def __call__(self, inputs: AdvantageInputs) -> torch.Tensor:
        mask = inputs.response_mask
        centred = mask.double().new_tensor(group_normalised(inputs.rewards.tolist(), inputs.groups.tolist()))
        return masked_whiten(centred[:, None].expand(mask.shape), mask.double(), self.options.eps).float()
