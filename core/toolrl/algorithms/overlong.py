"""DAPO's overlong reward shaping (Yu et al. 2025, "DAPO", soft overlong punishment), beside its
dynamic sampling (``algorithm.skip_zero_variance_groups``). A response of ``L`` tokens (tool output
included, as ``rollout.max_response_tokens`` counts them) under a budget ``L_max`` with a ``buffer``::

    R_length(L) = 0                                   L <= L_max - buffer
                = (L_max - buffer - L) / buffer       L_max - buffer < L <= L_max
                = -1                                  L > L_max
    r' = r + penalty · R_length(L)

so a response that runs into the budget (truncated, its answer likely cut) is told so gradually
instead of by a cliff. The shaped reward feeds the advantage estimator; traces keep the raw reward.
"""

from __future__ import annotations

from collections.abc import Sequence

from toolrl.config import OverlongConfig


def length_penalty(length: int, max_tokens: int, buffer: int) -> float:
    """``R_length`` above, in [-1, 0]."""
    soft = max_tokens - buffer
    if length <= soft:
        return 0.0
    if length <= max_tokens:
        return (soft - length) / buffer
    return -1.0


def shape_rewards(rewards: Sequence[float], lengths: Sequence[int], max_tokens: int,
                  overlong: OverlongConfig | None) -> list[float]:
    """The rewards the estimator sees: ``rewards`` unchanged without ``algorithm.overlong``."""
    if overlong is None:
        return list(rewards)
    return [r + overlong.penalty * length_penalty(n, max_tokens, overlong.buffer)
            for r, n in zip(rewards, lengths, strict=True)]
