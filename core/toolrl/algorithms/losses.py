"""The built-in policy losses (``docs/algorithms.md``). Notation, per trained token t of sequence i:
``r_it = π_θ / π_prox = exp(new - prox)`` the PPO ratio against the proximal policy, ``A_it`` the
advantage. Each returns the per-token loss before the importance weight, KL and aggregation, which
:func:`toolrl.training.step.policy_loss` applies to every loss alike."""

from __future__ import annotations

from pydantic import Field

from toolrl.algorithms import LossInputs, LossOptions, LossTerms, PolicyLoss

# Tensor methods only, no torch module: a config naming these losses is checked (their options validated)
# before torch loads (toolrl.algorithms.advantages, likewise).


class PpoClipOptions(LossOptions):
    # Below 1: a ratio is never negative, so a lower bound 1 - clip_eps_low <= 0 never clips.
    clip_eps_low: float = Field(0.2, ge=0, lt=1, description="the ratio's lower clip, 1 - clip_eps_low")
    clip_eps_high: float = Field(0.28, ge=0, description="the ratio's upper clip, 1 + clip_eps_high")


class PpoClip(PolicyLoss):
    """PPO's clipped surrogate (Schulman et al. 2017) with DAPO's asymmetric range (Yu et al. 2025)::

        loss_it = -min(r_it · A_it, clip(r_it, 1 - clip_eps_low, 1 + clip_eps_high) · A_it)

    The range is ``algorithm.loss_options.clip_eps_low`` / ``clip_eps_high``. With ``loss_agg`` this is
    TRL's ``grpo`` (seq-mean-token-mean), ``bnpo`` and ``dapo`` (token-mean) and ``dr_grpo``
    (seq-mean-token-sum-norm)."""

    name = "ppo_clip"
    Options = PpoClipOptions

    def __call__(self, inputs: LossInputs) -> LossTerms:
        adv = inputs.advantages
        ratio = (inputs.new_logprobs - inputs.prox_logprobs).exp()
        clipped = ratio.clamp(1 - self.options.clip_eps_low, 1 + self.options.clip_eps_high)
        per_token = (-adv * ratio).maximum(-adv * clipped)
        return LossTerms(per_token, ratio != clipped)


class GspoOptions(LossOptions):
    clip_low: float = Field(3e-4, ge=0, lt=1, description="the sequence ratio's lower clip, 1 - clip_low")
    clip_high: float = Field(4e-4, ge=0, description="the sequence ratio's upper clip, 1 + clip_high")


class Gspo(PolicyLoss):
    """GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization"): one ratio per sequence, the
    geometric mean of its tokens' ratios, clipped at the sequence level::

        s_i = exp( (1 / |y_i|) · sum_t (new_it - prox_it) )       (over trained tokens)
        loss_i = -min(s_i · A_i, clip(s_i, 1 - clip_low, 1 + clip_high) · A_i)

    The range is far narrower than a token ratio's (the paper: 3e-4, 4e-4). ``loss_i`` counts once per
    trained token under ``loss_agg``; ``seq-mean-token-mean`` gives the paper's mean over sequences.
    TRL: ``importance_sampling_level="sequence"``."""

    name = "gspo"
    Options = GspoOptions
    sequence_level = True

    def __call__(self, inputs: LossInputs) -> LossTerms:
        mask = inputs.mask
        log_ratio = ((inputs.new_logprobs - inputs.prox_logprobs) * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
        ratio = log_ratio.exp()[:, None]
        adv = inputs.advantages[:, :1]
        clipped = ratio.clamp(1 - self.options.clip_low, 1 + self.options.clip_high)
        per_seq = (-adv * ratio).maximum(-adv * clipped)
        return LossTerms(per_seq, ratio != clipped)


class CispoOptions(LossOptions):
    max_weight: float = Field(5.0, gt=0, description="the cap on the token's importance weight r_it")
    # 0 bounds nothing (a ratio is never negative): the paper's CISPO; the Tinker API's cispo sets a floor.
    min_weight: float = Field(0.0, ge=0, description="the floor of the token's importance weight r_it")


class Cispo(PolicyLoss):
    """CISPO (MiniMax-M1, 2025): REINFORCE weighted by the clipped ratio with its gradient stopped, so
    that no token's gradient is dropped (PPO's clip zeroes it), only its weight bounded::

        loss_it = -sg(clip(r_it, min_weight, max_weight)) · A_it · new_it

    The paper writes the cap as ``1 + eps_high``; ``max_weight`` is the cap itself, as TRL's
    ``epsilon_high`` for ``loss_type="cispo"``; ``min_weight`` (default 0: none) is a floor."""

    name = "cispo"
    Options = CispoOptions

    def __call__(self, inputs: LossInputs) -> LossTerms:
        ratio = (inputs.new_logprobs - inputs.prox_logprobs).exp()
        low, high = self.options.min_weight, self.options.max_weight
        weight = ratio.clamp(min=low, max=high).detach()
        return LossTerms(-weight * inputs.advantages * inputs.new_logprobs, (ratio > high) | (ratio < low))
