"""On-policy distillation (OPD; Thinking Machines, "On-Policy Distillation", 2025): the student samples its
own trajectories, a teacher scores every token the student sampled (:mod:`toolrl.algorithms.teacher`),
and each sampled token's advantage is the teacher's log-prob of it minus the student's::

    A_it = w_T(i) · (log π_T(y_it | ctx) − log π_S(y_it | ctx)) + λ · A_reward(i)     (trained tokens only)

the negative per-token reverse KL, a single-sample estimate at each position, with discount 0 (no
token is credited with what follows it). ``log π_S`` is the engine's log-prob (the one the token was
sampled with, ``Trajectory.logprobs``); ``w_T(i)`` the weight of the teacher that scored row ``i``
(``algorithm.teacher[].weight``; 0 for a row of a route no teacher scores); ``λ`` is
``advantage_options.reward_weight`` and ``A_reward`` the outcome estimator ``reward_advantage``
(``grpo`` by default) over the task reward: ``λ = 0`` is pure distillation. Tool results and template
tokens (``response_mask`` 0) get 0: they are never scored.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from toolrl.algorithms import AdvantageEstimator, AdvantageInputs
from toolrl.algorithms.teacher import check_teacher, teacher_index
from toolrl.config import ConfigError
from toolrl.plugins.parts import lookup_part

if TYPE_CHECKING:
    import torch

    from toolrl.config import AlgorithmConfig
    from toolrl.trajectory import Trajectory

__all__ = ["Opd", "teacher_fields"]


def teacher_fields(trajectories: Sequence[Trajectory], width: int,
                   algo: AlgorithmConfig) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The student's (engine's) and the teacher's log-probs, (B, ``width``) each, 0 past a row and at
    untrained tokens, and each row's teacher weight (B,): 0 for a route no teacher scores. A row its
    teacher should have scored but did not is a ValueError (the controller scores every batch first)."""
    import torch

    student = torch.zeros((len(trajectories), width), dtype=torch.float32)
    teacher = torch.zeros_like(student)
    weight = torch.zeros(len(trajectories), dtype=torch.float32)
    teachers = algo.teachers
    for i, t in enumerate(trajectories):
        k = teacher_index(t.env, teachers)
        if k is None:
            continue
        if t.teacher_logprobs is None or len(t.teacher_logprobs) != len(t.response_ids):
            raise ValueError(f"trajectory {t.trajectory_id} has no teacher log-probs for its "
                             f"{len(t.response_ids)} response tokens (algorithm.teacher[{k}] scores route {t.env!r})")
        mask = torch.tensor(t.response_mask, dtype=torch.float32)
        n = len(t.response_ids)
        student[i, :n] = torch.tensor(t.logprobs[:n], dtype=torch.float32) * mask
        teacher[i, :n] = torch.tensor(t.teacher_logprobs, dtype=torch.float32) * mask
        weight[i] = teachers[k].weight
    return student, teacher, weight


class OpdOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    reward_weight: float = Field(0.0, ge=0, le=100, description="λ: the task reward's advantage added to the "
                                 "teacher's (0: pure distillation)")
    reward_advantage: str = Field("grpo", description="the outcome estimator the task reward goes through "
                                  "(with its default options)")


class Opd(AdvantageEstimator):
    """The reverse-KL advantage of on-policy distillation, mixed with the task reward's (module
    docstring). Per token (``outcome = False``): a sequence-level loss (``gspo``) is refused with it."""

    name = "opd"
    outcome = False
    needs_teacher = True
    Options = OpdOptions

    def __init__(self, options: OpdOptions, algo: AlgorithmConfig) -> None:
        super().__init__(options, algo)
        self.reward: AdvantageEstimator | None = None
        if options.reward_weight > 0:
            cls = lookup_part("advantage_estimators", options.reward_advantage, "algorithm.advantage_options")
            if not cls.outcome or cls.needs_values or cls.needs_turns or cls.needs_trees or \
                    getattr(cls, "needs_teacher", False):
                raise ValueError(f"reward_advantage={options.reward_advantage}: the task reward goes through an "
                                 "outcome estimator that reads rewards and groups only (grpo, dr_grpo, rloo, ...)")
            self.reward = cls(cls.Options(), algo)

    def check_run(self, run: Any) -> list[str]:
        """Teachers set, each route with trajectories to train scored by one (or a reward to learn from),
        and each teacher's tokenizer able to score the student's conversations
        (:func:`toolrl.algorithms.teacher.check_teacher`), before any model loads."""
        warnings = [] if self.reward is None else self.reward.check_run(run)  # groups of one, greedy groups
        config = run.config
        teachers = config.algorithm.teachers
        if not teachers:
            raise ConfigError(f"{run.where('algorithm.advantage')}: opd distils a teacher into the policy, and "
                              "algorithm.teacher is unset; add algorithm.teacher: {engine: transformers, model: ...}")
        routes: set[str | None] = set(config.env_entries()) or {None}
        for k, teacher in enumerate(teachers):
            unknown = sorted(set(teacher.routes or ()) - routes)
            if unknown:
                raise ConfigError(f"{run.where('algorithm.teacher')}: teacher {k} names route(s) {unknown}, which "
                                  f"the run does not have (its environments: {sorted(r for r in routes if r)})")
        unscored = sorted(str(r) for r in routes if teacher_index(r, teachers) is None)
        if unscored and self.reward is None:
            raise ConfigError(f"{run.where('algorithm.teacher')}: no teacher scores route(s) {unscored} and "
                              "advantage_options.reward_weight is 0: their trajectories would train nothing")
        for k, teacher in enumerate(teachers):
            warnings += check_teacher(run, teacher, f"{run.where('algorithm.teacher')}[{k}]")
        return warnings

    def __call__(self, inputs: AdvantageInputs) -> torch.Tensor:
        if inputs.teacher_logprobs is None or inputs.logprobs is None or inputs.teacher_weights is None:
            raise ValueError("opd needs the teacher's and the student's log-probs (AdvantageInputs.teacher_logprobs)")
        mask = inputs.response_mask
        adv = inputs.teacher_weights[:, None] * (inputs.teacher_logprobs - inputs.logprobs) * mask
        if self.reward is not None:
            adv = adv + self.options.reward_weight * self.reward(inputs) * mask
        return adv.float()
