"""Tick's own advantage estimator and policy loss, written against the public API only
(``toolrl.algorithms``), as an outside author would."""

from pydantic import BaseModel, ConfigDict, Field
from toolrl.algorithms import AdvantageEstimator, AdvantageInputs, LossInputs, LossTerms, PolicyLoss


class TickBaseline(AdvantageEstimator):
    """``A_i = r_i - b``: the reward above a fixed baseline ``b`` (no group statistics)."""

    name = "tick_baseline"

    class Options(BaseModel):
        model_config = ConfigDict(extra="forbid", frozen=True)
        baseline: float = Field(0.5, description="the reward every trajectory is measured against")

    def __call__(self, inputs: AdvantageInputs):
        advantages = (inputs.rewards - self.options.baseline).float()
        return advantages[:, None] * inputs.response_mask


class TickPolicyGradient(PolicyLoss):
    """The unclipped importance-weighted policy gradient: ``-r_it · A_it``."""

    name = "tick_pg"

    def __call__(self, inputs: LossInputs) -> LossTerms:
        ratio = (inputs.new_logprobs - inputs.prox_logprobs).exp()
        return LossTerms(-inputs.advantages * ratio, ratio != ratio)
