"""The Tinker API's losses that toolrl had none of, as toolrl policy losses (registered under these
names, so ``algorithm.loss`` of ``toolrl train`` takes them too). The service runs every Tinker loss
through toolrl's public step (:mod:`toolrl.training.token_step`) with the proximal and behaviour
log-probs both the datum's sampling ``logprobs``, so ``r = exp(new - sampling)`` and no correction
weight: ``ppo`` is ``ppo_clip`` and ``cispo`` is ``cispo`` with the request's thresholds
(:func:`toolrl_tinker.requests.loss_spec`)."""

from __future__ import annotations

from pydantic import Field
from toolrl.algorithms import LossInputs, LossOptions, LossTerms, PolicyLoss


def _none_clipped(inputs: LossInputs) -> object:
    """A loss without a clip: no token clipped (for ``clip_frac``)."""
    return inputs.mask.new_zeros(inputs.mask.shape).bool()


class ImportanceSampling(PolicyLoss):
    """REINFORCE with an unclipped importance ratio: ``loss_it = -r_it · A_it``."""

    name = "importance_sampling"

    def __call__(self, inputs: LossInputs) -> LossTerms:
        ratio = (inputs.new_logprobs - inputs.prox_logprobs).exp()
        return LossTerms(-ratio * inputs.advantages, _none_clipped(inputs))


class CrossEntropy(PolicyLoss):
    """Supervised learning: ``loss_it = -A_it · new_it`` with the advantage the token's weight."""

    name = "cross_entropy"

    def __call__(self, inputs: LossInputs) -> LossTerms:
        return LossTerms(-inputs.advantages * inputs.new_logprobs, _none_clipped(inputs))


class DroOptions(LossOptions):
    beta: float = Field(0.05, ge=0, description="weight of the quadratic penalty on new - prox")


class Dro(PolicyLoss):
    """Direct reward optimisation's off-policy loss (Richemond et al. 2024), per token:
    ``loss_it = -(A_it · new_it - beta / 2 · (new_it - prox_it)^2)``."""

    name = "dro"
    Options = DroOptions

    def __call__(self, inputs: LossInputs) -> LossTerms:
        delta = inputs.new_logprobs - inputs.prox_logprobs
        per_token = -(inputs.advantages * inputs.new_logprobs - 0.5 * self.options.beta * delta.square())
        return LossTerms(per_token, _none_clipped(inputs))
