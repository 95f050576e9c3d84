"""Tree-GRPO (Ji et al. 2025, arXiv 2509.21240, its tree-based advantage estimation): GRPO over tree
rollouts (``rollout.tree``), each leaf's outcome reward compared within its tree (``Trajectory.tree_id``)
and within its group, ``A_i = A_intra(i) + A_inter(i)``, each ``(r_i - mean r) / F`` over its set, one
number broadcast over the leaf's tokens (:func:`toolrl.algorithms.advantages.group_normalised`: a set of
one gives 0). Where the step-level signal comes from, and what is refused without ``rollout.tree``:
docs/algorithms.md, "tree_grpo".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from toolrl.algorithms import AdvantageEstimator, AdvantageInputs, StepField
from toolrl.algorithms.advantages import GroupOptions, broadcast, group_normalised
from toolrl.config import ConfigError

if TYPE_CHECKING:
    import torch

    from toolrl.plugins.parts import RunFacts
    from toolrl.trajectory import Trajectory

# Tensor methods only, no torch module, as in toolrl.algorithms.advantages: a config naming tree_grpo
# is checked before torch loads.

__all__ = ["TREES", "TreeGrpo"]

TREES = "trees"  # the field tree_grpo reads and gives: each row's Trajectory.tree_id (None: a flat rollout's)


class TreeGrpo(AdvantageEstimator):
    """Tree-GRPO (Ji et al. 2025): each leaf's reward against its tree's and its group's (module docstring)::

        A_i = (r_i - mean_T(i) r) / F_T(i) + (r_i - mean_G(i) r) / F_G(i)
    """

    name = "tree_grpo"
    Options = GroupOptions
    reads = frozenset({TREES})
    group_relative = True

    def check_run(self, facts: RunFacts) -> list[str]:
        """The group checks, then refused before anything loads on a flat rollout: without trees it would
        be GRPO doubled."""
        warnings = super().check_run(facts)
        if facts.config.rollout.tree is None:
            raise ConfigError(f"{facts.where('algorithm.advantage')}: tree_grpo compares the leaves of each tree, and "
                              "rollout.tree is unset (a flat rollout has none); set rollout.tree or use grpo")
        return warnings

    def fields(self, trajectories: Sequence[Trajectory], width: int) -> dict[str, StepField]:
        return {TREES: tuple(t.tree_id for t in trajectories)}

    def __call__(self, inputs: AdvantageInputs) -> torch.Tensor:
        trees = inputs.fields.get(TREES)
        if trees is None or any(t is None for t in trees):
            raise ValueError("tree_grpo reads each row's tree (trees): a row of a flat rollout has none; "
                             "set rollout.tree")
        rewards, groups = inputs.rewards.tolist(), inputs.groups.tolist()
        intra = group_normalised(rewards, list(zip(groups, trees, strict=True)), self.options)
        inter = group_normalised(rewards, groups, self.options)
        return broadcast([a + b for a, b in zip(intra, inter, strict=True)], inputs.response_mask)
