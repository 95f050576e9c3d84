"""On-policy distillation (OPD): each sampled token's advantage is the teacher's log-prob of it minus
the student's (the engine's, ``Trajectory.logprobs``), discount 0, on trained tokens only::

    A_it = w_T(i) · (log π_T(y_it | ctx) − log π_S(y_it | ctx)) + λ · A_reward(i)

With ``top_k`` the teacher's ``K`` likeliest tokens also feed :class:`TopkForwardKl` (the forward KL
over them, both renormalised) and ``baseline: vopd`` (``V̂_t = w_T · Σ_{v ∈ T_t} π_S(v) · (log π_T(v)
− log π_S(v))``, subtracted detached). The estimator, its options and the top-k losses:
docs/distillation.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from toolrl.algorithms import (
    CANDIDATE_IDS,
    CANDIDATE_LOGPROBS,
    AdvantageEstimator,
    AdvantageInputs,
    LossInputs,
    LossOptions,
    LossTerms,
    PolicyLoss,
)
from toolrl.config import ConfigError
from toolrl.plugins.parts import lookup_part

if TYPE_CHECKING:
    import torch

    from toolrl.config import AlgorithmConfig, TeacherConfig
    from toolrl.plugins.parts import RunFacts
    from toolrl.trajectory import Trajectory

__all__ = ["Opd", "TopkForwardKl", "opd_options", "teacher_index"]

# What the teacher's scores give the step (:meth:`Opd.fields`): the engine's and the teacher's log-probs
# (B, R) and each row's teacher weight (B,); with top_k, the teacher's likeliest ids as CANDIDATE_IDS, its
# log-probs there and each position's teacher weight.
SCORED = ("logprobs", "teacher_logprobs", "teacher_weights")
TOP = (CANDIDATE_IDS, "teacher_top", "teacher_weight")


def teacher_index(env: str | None, teachers: Sequence[TeacherConfig]) -> int | None:
    """The teacher that scores a trajectory of route ``env``: the first whose ``routes`` hold it (or that
    names none); None when no teacher scores that route."""
    return next((k for k, teacher in enumerate(teachers) if teacher.routes is None or env in teacher.routes), None)


def teacher_fields(trajectories: Sequence[Trajectory], width: int,
                   algo: AlgorithmConfig) -> dict[str, torch.Tensor]:
    """:data:`SCORED` over a (B, ``width``) grid: the student's (engine's) and the teacher's log-probs, 0
    past a row and at untrained tokens, and each row's teacher weight (B,), 0 for a route no teacher
    scores. With opd's ``top_k`` K, :data:`TOP` too: the teacher's top-k ids at each trained position
    (B, width, K) long, its log-probs there (B, width, K) and each position's teacher weight (B, width), 0
    at untrained positions and in rows no teacher scores (their ids 0, log-probs uniform). A row its teacher
    should have scored but did not is a ValueError (the controller scores every batch first)."""
    import torch

    rows, k = len(trajectories), opd_options(algo).top_k
    student = torch.zeros((rows, width), dtype=torch.float32)
    teacher = torch.zeros_like(student)
    weight = torch.zeros(rows, dtype=torch.float32)
    ids = torch.zeros((rows, width, k), dtype=torch.long)
    top_lps = torch.zeros((rows, width, k), dtype=torch.float32)
    top_weight = torch.zeros_like(student)
    for i, t in enumerate(trajectories):
        j = teacher_index(t.env, algo.teachers)
        if j is None:
            continue
        n, route = len(t.response_ids), f"algorithm.teacher.{j} scores route {t.env!r}"
        if t.teacher_logprobs is None or len(t.teacher_logprobs) != n:
            raise ValueError(f"trajectory {t.trajectory_id} has no teacher log-probs for its {n} response "
                             f"tokens ({route})")
        mask = torch.tensor(t.response_mask, dtype=torch.float32)
        student[i, :n] = torch.tensor(t.logprobs[:n], dtype=torch.float32) * mask
        teacher[i, :n] = torch.tensor(t.teacher_logprobs, dtype=torch.float32) * mask
        weight[i] = algo.teachers[j].weight
        if not k:
            continue
        if t.teacher_top_ids is None or t.teacher_top_logprobs is None or len(t.teacher_top_ids) != n:
            raise ValueError(f"trajectory {t.trajectory_id} has no teacher top-{k} for its {n} response "
                             f"tokens ({route})")
        tops = zip(t.teacher_top_ids, t.teacher_top_logprobs, t.response_mask, strict=True)
        for c, (top, lp, m) in enumerate(tops):
            if m:
                ids[i, c] = torch.tensor(top)
                top_lps[i, c] = torch.tensor(lp)
                top_weight[i, c] = algo.teachers[j].weight
    scored = dict(zip(SCORED, (student, teacher, weight), strict=True))
    return {**scored, **dict(zip(TOP, (ids, top_lps, top_weight), strict=True))} if k else scored


def vopd_baseline(student_top: torch.Tensor, teacher_top: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """vOPD's baseline over the teacher's top-k (module docstring), (B, R), no gradient:
    ``w_T · Σ_v π_S(v) · (log π_T(v) − log π_S(v))``; 0 where ``weight`` is 0."""
    s = student_top.detach()
    return weight * (s.exp() * (teacher_top - s)).sum(-1)


class OpdOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    reward_weight: float = Field(0.0, ge=0, le=100, description="λ: the task reward's advantage added to the "
                                 "teacher's (0: pure distillation)")
    reward_advantage: str = Field("grpo", description="the outcome estimator the task reward goes through "
                                  "(with its default options)")
    top_k: int = Field(0, ge=0, le=1000, description="the teacher's likeliest tokens kept at each trained position "
                       "(0: only the sampled token's log-prob): what the topk_forward_kl loss and the vopd "
                       "baseline read; a teacher with the student's tokenizer only")
    baseline: Literal["none", "vopd"] = Field("none", description="vopd: the position's negative reverse KL over "
                                              "the teacher's top_k, subtracted as a detached baseline")

    @model_validator(mode="after")
    def _baseline_reads_top_k(self) -> OpdOptions:
        if self.baseline == "vopd" and not self.top_k:
            raise ValueError("baseline vopd: the student's and the teacher's distributions over the teacher's top "
                             "tokens give it, and top_k is 0; set top_k (e.g. 20)")
        return self


def opd_options(algo: AlgorithmConfig) -> OpdOptions:
    """opd's options of the run (its defaults for another estimator: no top-k, no baseline)."""
    return OpdOptions(**algo.advantage_options) if algo.advantage == "opd" else OpdOptions()


class Opd(AdvantageEstimator):
    """The reverse-KL advantage of on-policy distillation, mixed with the task reward's (module
    docstring). Per token (``outcome = False``): a sequence-level loss (``gspo``) is refused with it."""

    name = "opd"
    outcome = False
    reads = frozenset({*SCORED, *TOP, CANDIDATE_LOGPROBS})
    Options = OpdOptions

    def __init__(self, options: OpdOptions, algo: AlgorithmConfig) -> None:
        super().__init__(options, algo)
        self.reward: AdvantageEstimator | None = None
        if options.reward_weight > 0:
            cls = lookup_part("advantage_estimators", options.reward_advantage, "algorithm.advantage_options")
            if not cls.outcome or cls.reads:
                raise ValueError(f"reward_advantage={options.reward_advantage}: the task reward goes through an "
                                 "outcome estimator that reads rewards and groups only (grpo, dr_grpo, rloo, ...)")
            self.reward = cls(cls.Options(), algo)

    def check_run(self, facts: RunFacts) -> list[str]:
        """Teachers set, each route with trajectories to train scored by one (or a reward to learn from),
        before any model loads (each teacher's own checks: :func:`toolrl.rollout.teacher.check_teachers`); a
        warning under full fine-tuning (its output head drifts: docs/distillation.md)."""
        warnings = [] if self.reward is None else self.reward.check_run(facts)  # groups of one, greedy groups
        config = facts.config
        teachers = config.algorithm.teachers
        if not teachers:
            written = facts.where("algorithm.teacher") != "algorithm.teacher"  # teacher: [] (the file's or an override)
            raise ConfigError(f"{facts.where('algorithm.teacher' if written else 'algorithm.advantage')}: opd distils a "
                              "teacher into the policy, and algorithm.teacher "
                              f"{'is an empty list' if written else 'is unset'}; add algorithm.teacher: "
                              "{engine: transformers, model: ...}")
        routes: set[str | None] = set(config.env_entries()) or {None}
        for k, teacher in enumerate(teachers):
            unknown = sorted(set(teacher.routes or ()) - routes)
            if unknown:
                raise ConfigError(f"{facts.where('algorithm.teacher')}: teacher {k} names route(s) {unknown}, which "
                                  f"the run does not have (its environments: {sorted(r for r in routes if r)})")
        unscored = sorted(str(r) for r in routes if teacher_index(r, teachers) is None)
        if unscored and self.reward is None:
            raise ConfigError(f"{facts.where('algorithm.teacher')}: no teacher scores route(s) {unscored} and "
                              "advantage_options.reward_weight is 0: their trajectories would train nothing")
        if config.model.lora is None and config.model.adapters is None and not config.model.freeze_output_head:
            warnings.append(f"{facts.where('model.lora')}: opd with full fine-tuning trains the output head, whose rows of "
                            "the tokens the student does not sample get small gradients of one sign (opd's advantages "
                            "are mostly negative) that AdamW scales to steps of about optim.lr: measured on a small model, "
                            "the student then drifts away from its teacher within tens of steps (docs/distillation.md); "
                            "model.lora trains no output head, and model.freeze_output_head: true keeps it as loaded")
        if self.options.top_k and config.trainer.sequence_parallel > 1:
            raise ConfigError(f"{facts.where('algorithm.advantage_options')}: top_k with trainer.sequence_parallel="
                              f"{config.trainer.sequence_parallel}: the split rows' LM head gives no top-k log-probs")
        return warnings

    def fields(self, trajectories: Sequence[Trajectory], width: int) -> dict[str, torch.Tensor]:
        return teacher_fields(trajectories, width, self.algo)

    def __call__(self, inputs: AdvantageInputs) -> torch.Tensor:
        if not set(SCORED) <= inputs.fields.keys():
            raise ValueError("opd needs the teacher's and the student's log-probs (AdvantageInputs.fields)")
        student, teacher, weights = (inputs.fields[k] for k in SCORED)
        mask = inputs.response_mask
        adv = weights[:, None] * (teacher - student) * mask
        if self.reward is not None:
            adv = adv + self.options.reward_weight * self.reward(inputs) * mask
        return adv.float()

    def loss_advantages(self, inputs: LossInputs) -> torch.Tensor:
        """vOPD's baseline (``baseline: vopd``) off the advantages, from the trainer's forward."""
        if self.options.baseline != "vopd" or not {CANDIDATE_LOGPROBS, *TOP} <= inputs.fields.keys():
            return inputs.advantages
        return inputs.advantages - vopd_baseline(*(inputs.fields[k] for k in (CANDIDATE_LOGPROBS, *TOP[1:])))


class TopkForwardKl(PolicyLoss):
    """The forward KL from the teacher's top-k distribution to the student's at each trained position,
    both renormalised over the teacher's top-k (module docstring), times the row's teacher weight. It
    reads no advantage and no ratio: the positions are the student's samples (the importance weight and
    KL term apply as to every loss). Needs ``advantage: opd`` with ``top_k`` (checked before any model
    loads); rows no teacher scores get 0."""

    name = "topk_forward_kl"
    Options = LossOptions
    reads = frozenset({*TOP, CANDIDATE_LOGPROBS})

    def check_run(self, facts: RunFacts) -> list[str]:
        algo = facts.config.algorithm
        if algo.advantage != "opd" or not opd_options(algo).top_k:
            raise ConfigError(f"{facts.where('algorithm.loss')}: topk_forward_kl distils the teacher's top-k "
                              "distribution, which only algorithm.advantage: opd with advantage_options.top_k gives")
        if opd_options(algo).reward_weight > 0:
            raise ConfigError(f"{facts.where('algorithm.loss')}: topk_forward_kl reads no advantage, so "
                              "advantage_options.reward_weight would be ignored; set it to 0 or use ppo_clip")
        return []

    def __call__(self, inputs: LossInputs) -> LossTerms:
        if not {CANDIDATE_LOGPROBS, *TOP} <= inputs.fields.keys():
            raise ValueError("topk_forward_kl needs the teacher's top-k and the student's log-probs there")
        student_top, teacher_top, teacher_weight = (inputs.fields[k] for k in (CANDIDATE_LOGPROBS, *TOP[1:]))
        teacher = teacher_top.log_softmax(-1)
        per_token = teacher_weight * (teacher.exp() * (teacher - student_top.log_softmax(-1))).sum(-1)
        return LossTerms(per_token, per_token.detach().new_zeros(per_token.shape).bool())
