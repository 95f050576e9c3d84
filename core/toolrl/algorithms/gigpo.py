"""GiGPO (Feng et al. 2025, arXiv 2505.10978): turn-level credit without a critic, each token of turn
``t`` of trajectory ``i`` gets ``A = A_E(i) + ω · A_S(i, t)``: ``A_E`` GRPO's over the episode group,
``A_S`` the turn's discounted return ``R_it = Σ_{k ≥ t} γ^(k - t) · r_ik`` against its step group's (the
group's turns from the same anchor state, :mod:`toolrl.rollout.turns`), each over ``F`` (the unbiased
std plus ``eps``, or 1; a group of one gives 0: :func:`toolrl.algorithms.advantages.group_normalised`).
Positions outside every turn get 0. The turn rewards ``r_ik``: :mod:`toolrl.algorithms.turns`. The
estimator, its options and the anchor state: docs/algorithms.md, "gigpo".
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate
from typing import TYPE_CHECKING, Any

from pydantic import Field, model_validator

from toolrl.algorithms import AdvantageEstimator, AdvantageInputs, StepField
from toolrl.algorithms.advantages import GroupOptions, group_normalised
from toolrl.algorithms.turns import TURN_IDS, TURN_STATES, TURN_STEP_REWARDS, TURNS, turn_fields, turn_rewards
from toolrl.config import ConfigError

if TYPE_CHECKING:
    import torch

    from toolrl.plugins.parts import RunFacts
    from toolrl.trajectory import Trajectory

# Tensor methods only, no torch module, as in toolrl.algorithms.advantages: a config naming gigpo is
# checked before torch loads.

__all__ = ["Gigpo"]


class GigpoOptions(GroupOptions):
    gamma: float = Field(0.95, gt=0, le=1, description="discount per turn of the step-level return")
    step_weight: float = Field(1.0, ge=0, description="ω: the step-level advantage's weight")

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        if isinstance(data, dict) and "norm" in data:
            raise ValueError("norm was renamed norm_by_std, as grpo and tree_grpo name it (std: true, mean: false)")
        return data


def discounted_returns(rewards: Sequence[float], gamma: float) -> list[float]:
    """``R_t = r_t + γ · R_{t+1}`` from the last turn back (``R_T = r_T``)."""
    return list(accumulate(reversed(rewards), lambda later, r: r + gamma * later))[::-1]


class Gigpo(AdvantageEstimator):
    """GiGPO (Feng et al. 2025): GRPO's episode advantage plus each turn's against the turns of its
    group that start from the same state (module docstring)::

        A_ip = A_E(i) + ω · A_S(i, t)     t: the turn position p belongs to (A_ip = 0 outside every turn)
    """

    name = "gigpo"
    Options = GigpoOptions
    outcome = False
    reads = TURNS
    group_relative = True

    def check_run(self, facts: RunFacts) -> list[str]:
        """The group checks, then refused before anything loads with an agent program (``rollout.agent``):
        the gateway records no turns (a route's own agent is refused at the first step, naming the trajectory)."""
        warnings = super().check_run(facts)
        if facts.config.rollout.agent is not None:
            raise ConfigError(f"{facts.where('rollout.agent')}: gigpo credits each model turn, and an agent program's "
                              "episodes record no turns; use an outcome estimator (grpo, rloo, ...)")
        return warnings

    def fields(self, trajectories: Sequence[Trajectory], width: int) -> dict[str, StepField]:
        return turn_fields(trajectories, width)

    def __call__(self, inputs: AdvantageInputs) -> torch.Tensor:
        if not inputs.fields.keys() >= TURNS:
            raise ValueError(f"gigpo reads each row's turns ({', '.join(sorted(TURNS))}): none given")
        turn_ids, states, steps = (inputs.fields[k] for k in (TURN_IDS, TURN_STATES, TURN_STEP_REWARDS))
        options = self.options
        groups, rewards = inputs.groups.tolist(), inputs.rewards.tolist()
        earned = [turn_rewards(row, r) for row, r in zip(steps, rewards, strict=True)]
        episode = group_normalised(rewards, groups, options)
        returns = [R for row in earned for R in discounted_returns(row, options.gamma)]
        anchors = [(g, s) for g, row in zip(groups, states, strict=True) for s in row]
        step = group_normalised(returns, anchors, options)
        *offsets, total = accumulate((len(row) for row in states), initial=0)  # each row's first turn; all turns
        rows = [i for i, row in enumerate(states) for _ in row]
        per_turn = [episode[i] + options.step_weight * a for i, a in zip(rows, step, strict=True)] + [0.0]
        # One gather: position (i, p) of turn j reads per_turn[offsets[i] + j]; outside turns the 0 at the end.
        inside = turn_ids >= 0
        index = (turn_ids.new_tensor(offsets)[:, None] + turn_ids).where(inside, total)
        return inputs.response_mask.new_tensor(per_turn, dtype=inputs.rewards.dtype)[index].float()
