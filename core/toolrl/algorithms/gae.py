"""Generalised advantage estimation (Schulman et al. 2016) over the trained tokens of each trajectory:
tool output and template tokens (``response_mask`` 0) were not the policy's actions, so the recursion
skips them. With ``t_1 < … < t_n`` the trained positions of a row::

    δ_k = r_{t_k} + γ · V_{t_{k+1}} − V_{t_k}        (V_{t_{n+1}} = 0: the trajectory ends)
    A_{t_k} = δ_k + γλ · A_{t_{k+1}}                 (A_{t_{n+1}} = 0)
    R_{t_k} = A_{t_k} + V_{t_k}                      (the critic's regression target)

The outcome reward sits on the last trained token (:func:`token_rewards`); KL stays in the loss, not
the rewards. The estimator and its options: docs/critic.md "GAE over trained tokens".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from pydantic import BaseModel, ConfigDict, Field

from toolrl.algorithms import VALUES, AdvantageEstimator, AdvantageInputs
from toolrl.algorithms.advantages import masked_whiten

if TYPE_CHECKING:
    from toolrl.config import AlgorithmConfig

__all__ = ["Gae", "gae", "token_rewards"]


def token_rewards(outcome: Sequence[float], mask: torch.Tensor) -> torch.Tensor:
    """Per-token rewards (B, R): each row's outcome reward on its last trained token; 0 on untrained
    positions and on a row with no trained token."""
    if len(outcome) != mask.shape[0]:
        raise ValueError(f"{len(outcome)} outcome rewards for {mask.shape[0]} rows")
    trained = mask > 0
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    last = torch.where(trained, positions, -1).max(dim=1).values  # -1: nothing trained
    rewards = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    rows = torch.nonzero(last >= 0).flatten()
    values = torch.tensor(list(outcome), dtype=torch.float32, device=mask.device)
    rewards[rows, last[rows]] = values[rows]
    return rewards


def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0,
        lam: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages and returns (B, R) by the recursion of the module docstring, 0 on untrained
    positions. No gradient flows into ``values`` (they are the critic's old estimates)."""
    if not rewards.shape == values.shape == mask.shape:
        raise ValueError(f"rewards {tuple(rewards.shape)}, values {tuple(values.shape)} and mask "
                         f"{tuple(mask.shape)} must have one shape")
    if not (0.0 <= gamma <= 1.0 and 0.0 <= lam <= 1.0):
        raise ValueError(f"gamma {gamma} and lam {lam} must lie in [0, 1]")
    rewards, values, trained = rewards.float(), values.detach().float(), mask > 0
    advantages = torch.zeros_like(rewards)
    next_value = torch.zeros(rewards.shape[0], device=rewards.device)
    next_adv = torch.zeros_like(next_value)
    # Right to left; an untrained column leaves each row's carried successor as it was.
    for t in range(rewards.shape[1] - 1, -1, -1):
        on = trained[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        adv = delta + gamma * lam * next_adv
        advantages[:, t] = torch.where(on, adv, 0.0)
        next_value = torch.where(on, values[:, t], next_value)
        next_adv = torch.where(on, adv, next_adv)
    returns = torch.where(trained, advantages + values, 0.0)
    return advantages, returns


class GaeOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    gamma: float = Field(1.0, ge=0, le=1, description="discount per trained token")
    lam: float = Field(1.0, ge=0, le=1, description="GAE's λ: 0 one-step TD, 1 Monte-Carlo return minus value")
    whiten: bool = Field(True, description="normalise the advantages over the batch's trained tokens")


class Gae(AdvantageEstimator):
    """GAE with a critic (module docstring), whitened over the batch's trained tokens unless ``whiten`` is
    off (PPO's normalisation, :func:`~toolrl.algorithms.advantages.masked_whiten`); ``value_targets`` gives
    the critic's targets ``R_t`` (before whitening). The trainer asks for the advantages, then the targets
    of the same batch: the recursion runs once, its returns kept for the second call."""

    name = "gae"
    Options = GaeOptions
    outcome = False
    reads = frozenset({VALUES})

    def __init__(self, options: BaseModel, algo: AlgorithmConfig) -> None:
        super().__init__(options, algo)
        self.kept: tuple[AdvantageInputs, torch.Tensor, torch.Tensor] | None = None

    def advantages_and_returns(self, inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """The raw advantages and the returns of ``inputs``, from the last batch's pass when
        ``inputs`` holds the same rewards, mask and values."""
        values = inputs.fields.get(VALUES)
        if values is None:
            raise ValueError("gae reads per-token values: the run needs a critic")
        if self.kept is not None and same_batch(self.kept[0], inputs):
            return self.kept[1], self.kept[2]
        mask = inputs.response_mask
        rewards = token_rewards(inputs.rewards.tolist(), mask)
        advantages, returns = gae(rewards, values.to(mask.device), mask, self.options.gamma, self.options.lam)
        self.kept = (inputs, advantages, returns)
        return advantages, returns

    def __call__(self, inputs: AdvantageInputs) -> torch.Tensor:
        advantages, _ = self.advantages_and_returns(inputs)
        if not self.options.whiten:
            return advantages
        mask = inputs.response_mask
        return torch.where(mask > 0, masked_whiten(advantages, mask), 0.0)

    def value_targets(self, inputs: AdvantageInputs) -> torch.Tensor:
        return self.advantages_and_returns(inputs)[1]


def same_batch(a: AdvantageInputs, b: AdvantageInputs) -> bool:
    """Equal rewards, response masks and values (what GAE reads), compared by content: the trainer
    builds the inputs afresh for each call."""
    pairs = ((a.rewards, b.rewards), (a.response_mask, b.response_mask), (a.fields.get(VALUES), b.fields.get(VALUES)))
    return all(x is y or (x is not None and y is not None and x.shape == y.shape and x.device == y.device
                          and torch.equal(x, y)) for x, y in pairs)
