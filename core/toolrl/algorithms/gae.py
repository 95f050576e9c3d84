"""Generalised advantage estimation (Schulman et al. 2016) over the trained tokens of each trajectory.

A trajectory's response interleaves the model's tokens (``response_mask`` 1, trained) with tool
output and template tokens (mask 0): those were not actions of the policy, so the recursion skips
them and runs over the trained tokens only, each one's successor being the next *trained* token of
the same trajectory. With ``t_1 < … < t_n`` the trained positions of a row, per-token rewards ``r``
and values ``V`` (the critic's estimate before the token is sampled)::

    δ_k = r_{t_k} + γ · V_{t_{k+1}} − V_{t_k}        (V_{t_{n+1}} = 0: the trajectory ends)
    A_{t_k} = δ_k + γλ · A_{t_{k+1}}                 (A_{t_{n+1}} = 0)
    R_{t_k} = A_{t_k} + V_{t_k}                      (the critic's regression target)

With ``γ = λ = 1``, ``A_t = Σ_{k ≥ t} r_k − V_t``: the return minus the value. Rewards on untrained
positions are not read; the outcome reward sits on the last trained token (:func:`token_rewards`),
optionally with a per-token KL penalty on every trained token.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["gae", "token_rewards", "whiten"]


def token_rewards(outcome: Sequence[float], mask: torch.Tensor, kl: torch.Tensor | None = None,
                  kl_coef: float = 0.0) -> torch.Tensor:
    """Per-token rewards (B, R): each row's outcome reward on its last trained token, minus
    ``kl_coef · kl`` on every trained token (with ``kl`` given); 0 on untrained positions and on a
    row with no trained token."""
    if len(outcome) != mask.shape[0]:
        raise ValueError(f"{len(outcome)} outcome rewards for {mask.shape[0]} rows")
    trained = mask > 0
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    last = torch.where(trained, positions, -1).max(dim=1).values  # -1: nothing trained
    rewards = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    rows = torch.nonzero(last >= 0).flatten()
    values = torch.tensor(list(outcome), dtype=torch.float32, device=mask.device)
    rewards[rows, last[rows]] = values[rows]
    if kl is not None and kl_coef:
        rewards = rewards - kl_coef * kl.float() * trained
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


def whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """``(x − mean) / std`` over the trained tokens of the whole batch (PPO's advantage
    normalisation); 0 on untrained positions. Fewer than two trained tokens: centred only."""
    trained = mask > 0
    count = int(trained.sum())
    if count == 0:
        return torch.zeros_like(x)
    picked = x[trained]
    centred = x - picked.mean()
    if count > 1:
        centred = centred / (picked.std() + eps)
    return torch.where(trained, centred, 0.0)
