"""RL algorithms as parts: **advantage estimators** (a step's rewards into (B, R) per-token advantages)
and **policy losses** (a micro-batch's log-probs and advantages into a per-token loss), chosen by
``algorithm.advantage`` and ``algorithm.loss``, each typed by its ``Options`` model. What every loss
shares (the importance weight, KL, aggregation) is :mod:`toolrl.training.step`'s; which pairs combine is
:mod:`.rules`'; ``docs/algorithms.md`` has every formula.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, TypeAlias

from pydantic import BaseModel, ConfigDict, Field

from toolrl.config import ConfigError, field_where
from toolrl.plugins.parts import BuildContext, NoOptions, build_part

if TYPE_CHECKING:
    import torch

    from toolrl.config import AlgorithmConfig, Config
    from toolrl.plugins.parts import RunFacts
    from toolrl.trajectory import Trajectory

__all__ = ["CANDIDATE_IDS", "CANDIDATE_LOGPROBS", "VALUES", "AdvantageEstimator", "AdvantageInputs", "LossInputs",
           "LossOptions", "LossTerms", "NoOptions", "PolicyLoss", "StepField", "build_estimator", "build_loss"]

# Fields a part may read (:attr:`AlgorithmPart.reads`) that no part gives. Token ids at each position
# (B, R, K) at which the trainer's forward also gives the policy's log-probs, read by the loss as the
# (B, R, K) log-probs. The critic's per-token values (B, R), which a run with a critic gives.
CANDIDATE_IDS, CANDIDATE_LOGPROBS = "candidate_ids", "candidate_logprobs"
VALUES = "values"

# A field of the step: a tensor with a row per trajectory (past the first dimension, the step's response
# grid), or a tuple of one value per trajectory for what lies on no grid (each row's turns, its tree).
StepField: TypeAlias = "torch.Tensor | tuple[Any, ...]"


@dataclass(frozen=True)
class AdvantageInputs:
    """One step's batch, every trajectory a row. ``rewards`` (B,) float64; ``groups`` (B,) long (the
    trajectories of one prompt share a group); ``response_mask`` (B, R) float, 1 at trained tokens;
    ``fields``: what the step's parts read beyond these (:attr:`AlgorithmPart.reads`), by name."""

    rewards: torch.Tensor
    groups: torch.Tensor
    response_mask: torch.Tensor
    fields: Mapping[str, StepField] = field(default_factory=dict)


class AlgorithmPart(ABC):
    """What an estimator and a loss share: constructed as ``cls(options, algo)``, ``options`` its
    ``Options`` model's, ``algo`` the run's :class:`toolrl.config.AlgorithmConfig`. ``reads``: the fields
    of the step it reads beyond its inputs' own (``AdvantageInputs.fields``, ``LossInputs.fields``), which
    the run's parts give (:meth:`fields`; :data:`VALUES` the run's critic, :data:`CANDIDATE_LOGPROBS` the
    trainer's forward) and the step carries to each micro-batch's rows. The run reads the declarations: an
    estimator that reads :data:`VALUES` gets a critic, one that reads the turns' states
    (:data:`toolrl.algorithms.turns.TURN_STATES`) has the sessions asked for them."""

    name: ClassVar[str]
    Options: ClassVar[type[BaseModel]] = NoOptions
    reads: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, options: BaseModel, algo: AlgorithmConfig) -> None:
        self.options = options
        self.algo = algo

    @classmethod
    def build(cls, options: BaseModel, context: BuildContext) -> AlgorithmPart:
        """The build contract (:mod:`toolrl.plugins.parts`): built for the run's algorithm section."""
        return cls(options, context.input("algorithm"))

    def fields(self, trajectories: Sequence[Trajectory], width: int) -> dict[str, StepField]:
        """The fields it gives the step (:data:`StepField`), a row per trajectory, a tensor's grid of
        ``width`` columns; none here."""
        return {}

    def check_run(self, facts: RunFacts) -> list[str]:
        """The run check before any weights load (hookspecs): raise ValueError on a setting this part
        cannot run with, return warning lines; none here."""
        return []


class AdvantageEstimator(AlgorithmPart):
    """An advantage estimator: ``estimator(inputs) -> (B, R)`` float32 advantages. ``outcome``: one
    advantage per trajectory, broadcast over its tokens; ``group_relative``: its baseline is the rest of
    the trajectory's group, so a group of one gets 0."""

    outcome: ClassVar[bool] = True
    group_relative: ClassVar[bool] = False

    def check_run(self, facts: RunFacts) -> list[str]:
        """A group-relative estimator on groups that cannot differ: one trajectory (refused: nothing would
        ever train), or greedy samples (a warning: only tools and environments can make them differ).
        Recorded groups (``data.trajectories``) are as recorded."""
        warnings = super().check_run(facts)
        rollout = facts.config.rollout
        if not self.group_relative or facts.config.data.trajectories:
            return warnings
        if rollout.n < 2:
            raise ConfigError(f"{facts.where('rollout.n')}: {self.name} compares each trajectory with the rest of its "
                              f"group, and a group of {rollout.n} has none: every advantage is 0 and nothing "
                              "trains; set rollout.n to 2 or more, or use reinforce_pp")
        if rollout.temperature == 0:
            warnings.append(f"{facts.where('rollout.temperature')}: greedy sampling gives a group's {rollout.n} "
                            f"trajectories the same tokens unless a tool or the environment answers them apart: "
                            f"{self.name}'s advantages are then 0 and nothing trains")
        return warnings

    @abstractmethod
    def __call__(self, inputs: AdvantageInputs) -> torch.Tensor: ...

    def loss_advantages(self, inputs: LossInputs) -> torch.Tensor:
        """The advantages a micro-batch's loss reads: ``inputs.advantages``, or (an estimator whose baseline
        depends on the weights being trained) less a baseline from the trainer's forward."""
        return inputs.advantages


@dataclass(frozen=True)
class LossInputs:
    """One micro-batch, (B, R) each: ``new_logprobs`` (with gradient), ``prox_logprobs`` (the
    proximal policy's, no gradient: the PPO ratio's denominator), ``behaviour_logprobs`` (the
    engine's, which sampled the tokens), ``advantages`` and ``mask`` (1 at trained tokens); ``fields``:
    what the run's parts read beyond these (:attr:`AlgorithmPart.reads`), the micro-batch's rows, and
    :data:`CANDIDATE_LOGPROBS` from the trainer's forward when a part gives :data:`CANDIDATE_IDS`."""

    new_logprobs: torch.Tensor
    prox_logprobs: torch.Tensor
    behaviour_logprobs: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    fields: Mapping[str, StepField] = field(default_factory=dict)


@dataclass(frozen=True)
class LossTerms:
    """A loss's answer: ``per_token`` loss, (B, R) or (B, 1) for a sequence-level loss (it broadcasts
    over the sequence's tokens); ``clipped`` (bool, same shape) marks where the ratio was clipped,
    for ``clip_frac``."""

    per_token: torch.Tensor
    clipped: torch.Tensor


class LossOptions(BaseModel):
    """What every loss's options hold (a loss's own ``Options`` subclass this): the KL term the
    caller adds per token."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kl_coef: float = Field(0.0, ge=0, description="weight of the k3 KL to a frozen copy of the initial policy")


class PolicyLoss(AlgorithmPart):
    """A policy loss: ``loss(inputs) -> LossTerms``. The caller multiplies by the rollout correction's
    importance weight (:mod:`toolrl.algorithms.correction`), adds the KL term (``kl_coef`` of its
    options) and aggregates (:func:`toolrl.training.step.policy_loss`). ``sequence_level``: its ratio
    is one number per sequence, which needs one advantage per sequence (an outcome estimator). Its
    gradient flows through :data:`CANDIDATE_LOGPROBS` where it ``reads`` them."""

    Options: ClassVar[type[BaseModel]] = LossOptions
    sequence_level: ClassVar[bool] = False

    @property
    def kl_coef(self) -> float:
        """The KL term's weight: 0 for a loss whose options do not extend :class:`LossOptions`."""
        return float(getattr(self.options, "kl_coef", 0.0))

    @abstractmethod
    def __call__(self, inputs: LossInputs) -> LossTerms: ...


def _build(kind: str, field: str, name: str, options: dict[str, Any], algo: AlgorithmConfig,
           config: Config | None) -> Any:
    fields = [f"algorithm.{field}", f"algorithm.{field}_options"]
    where = fields if config is None else [field_where(config, w) for w in fields]
    context = BuildContext(*where, config, {"algorithm": algo}, options_field=fields[1])
    return build_part(kind, name, options, context)


def build_estimator(algo: AlgorithmConfig, config: Config | None = None) -> AdvantageEstimator:
    """``algorithm.advantage`` with its options; a one-line ConfigError naming the field otherwise (and
    the file and line it was written on, given the run's ``config``)."""
    return _build("advantage_estimators", "advantage", algo.advantage, algo.advantage_options, algo, config)


def build_loss(algo: AlgorithmConfig, config: Config | None = None) -> PolicyLoss:
    """``algorithm.loss`` with its options (errors as :func:`build_estimator`)."""
    return _build("policy_losses", "loss", algo.loss, algo.loss_options, algo, config)
