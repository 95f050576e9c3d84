"""GiGPO (Feng et al. 2025, "Group-in-Group Policy Optimization for LLM Agent Training", arXiv
2505.10978): turn-level credit without a critic. Two levels of groups:

- the episode level, GRPO's: each trajectory's reward against its group's (the ``n`` samples of a
  prompt), ``A_E(i) = (r_i - mean_G(i) r) / F``;
- the step level: within a group, the turns of its trajectories that start from the same state (an
  *anchor state*: :mod:`toolrl.rollout.turns` keys it) form a step group, and each turn's discounted
  return is compared with its step group's, ``A_S(i, t) = (R_it - mean_S(i,t) R) / F``, where
  ``R_it = Σ_{k ≥ t} γ^(k - t) · r_ik`` over the trajectory's turn rewards ``r_ik``
  (:mod:`toolrl.algorithms.turns`: its step rewards, the outcome on its last turn).

Each token of turn ``t`` gets ``A = A_E(i) + ω · A_S(i, t)``; positions outside every turn get 0.
``F`` is the group's unbiased std plus ``eps`` (``norm: std``) or 1 (``norm: mean``, the paper's
variant without std); a group of one gets 0, at either level. On single-turn trajectories every
step group is the episode group, so ``A = (1 + ω) · A_grpo``.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from toolrl.algorithms import AdvantageEstimator, AdvantageInputs
from toolrl.algorithms.advantages import GroupStats

if TYPE_CHECKING:
    import torch

# Tensor methods only, no torch module, as in toolrl.algorithms.advantages: a config naming gigpo is
# checked before torch loads.

__all__ = ["Gigpo", "GigpoOptions", "discounted_returns"]


class GigpoOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    gamma: float = Field(0.95, gt=0, le=1, description="discount per turn of the step-level return")
    step_weight: float = Field(1.0, ge=0, description="ω: the step-level advantage's weight")
    norm: Literal["std", "mean"] = Field("std", description="divide by the group's std + eps (std) or by 1 (mean)")
    eps: float = Field(1e-6, gt=0, description="added to a group's std before dividing")


def discounted_returns(rewards: Sequence[float], gamma: float) -> list[float]:
    """``R_t = r_t + γ · R_{t+1}`` from the last turn back (``R_T = r_T``)."""
    out, carried = [0.0] * len(rewards), 0.0
    for t in range(len(rewards) - 1, -1, -1):
        carried = rewards[t] + gamma * carried
        out[t] = carried
    return out


def normalised(values: Sequence[float], keys: Sequence[Hashable], options: GigpoOptions) -> list[float]:
    """Each value against its key's group: ``(x - mean) / F`` (module docstring), 0 in a group of one."""
    index: dict[Hashable, int] = {}
    groups = [index.setdefault(k, len(index)) for k in keys]
    stats = GroupStats(values, groups).stats
    out = []
    for x, g in zip(values, groups, strict=True):
        mean, std, size = stats[g]
        scale = std + options.eps if options.norm == "std" else 1.0
        out.append(0.0 if size == 1 else (x - mean) / scale)
    return out


class Gigpo(AdvantageEstimator):
    """GiGPO (Feng et al. 2025): GRPO's episode advantage plus each turn's against the turns of its
    group that start from the same state (module docstring)::

        A_ip = A_E(i) + ω · A_S(i, t)     t: the turn position p belongs to (A_ip = 0 outside every turn)
    """

    name = "gigpo"
    Options = GigpoOptions
    outcome = False
    needs_turns = True

    def check_run(self, run: Any) -> list[str]:
        """Refused before anything loads with an agent program (``rollout.agent``): the gateway records
        no turns (a route's own agent is refused at the first step, naming the trajectory)."""
        if run.config.rollout.agent is not None:
            raise ValueError("gigpo credits each model turn, and an agent program's episodes (rollout.agent) "
                             "record no turns; use an outcome estimator (grpo, rloo, ...)")
        return []

    def __call__(self, inputs: AdvantageInputs) -> torch.Tensor:
        turn_ids, states, earned = inputs.turn_ids, inputs.turn_states, inputs.turn_rewards
        if turn_ids is None or states is None or earned is None:
            raise ValueError("gigpo reads each row's turns (turn_ids, turn_states, turn_rewards): none given")
        options = self.options
        groups = inputs.groups.tolist()
        episode = normalised(inputs.rewards.tolist(), groups, options)
        returns = [R for row in earned for R in discounted_returns(row, options.gamma)]
        anchors = [(g, s) for g, row in zip(groups, states, strict=True) for s in row]
        step = normalised(returns, anchors, options)
        offsets, total = [], 0
        for row in states:
            offsets.append(total)
            total += len(row)
        rows = [i for i, row in enumerate(states) for _ in row]
        per_turn = [episode[i] + options.step_weight * a for i, a in zip(rows, step, strict=True)] + [0.0]
        # One gather: position (i, p) of turn j reads per_turn[offsets[i] + j]; outside turns the 0 at the end.
        inside = turn_ids >= 0
        index = (turn_ids.new_tensor(offsets)[:, None] + turn_ids).where(inside, total)
        return inputs.response_mask.new_tensor(per_turn, dtype=inputs.rewards.dtype)[index].float()
