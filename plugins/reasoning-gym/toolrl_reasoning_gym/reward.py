"""The ``reasoning_gym`` reward: the generator's own ``score_answer`` on the answer the model gave
(the last ``<answer>…</answer>``, reasoning-gym's own extraction), its value unchanged. A few generators'
``score_answer`` raise on an answer they cannot parse (prime_factorization on words): that answer is
wrong, 0.0, not a failure of the trajectory."""

from __future__ import annotations

from typing import Any

from toolrl_reasoning_gym.generators import entry, extract_answer


class ReasoningGymReward:
    """Reward function ``reasoning_gym`` (a :class:`toolrl.rewards.RewardFunction`): the score the
    sample's generator gives the answer (no answer tags: ``None``, which every generator scores)."""

    name = "reasoning_gym"

    def __call__(self, response: str, ground_truth: Any, **info: Any) -> float:
        if not isinstance(ground_truth, dict):
            raise ValueError("reasoning_gym reward: the sample's ground truth names no generated task "
                             "(a reasoning_gym environment's sample has one)")
        dataset, item = entry(ground_truth)
        try:
            return float(dataset.score_answer(extract_answer(response), item))
        except (ValueError, TypeError, AttributeError, IndexError, KeyError):  # an answer it cannot parse
            return 0.0
