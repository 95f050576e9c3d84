"""Scoring a finished trajectory, in one place: what the rollout loop, recorded trajectories and
every other path that gives a trajectory its reward call.

A trajectory's reward is the sum of its terms::

    Σ weight · reward_function  +  tool_reward_weight · Σ calc_reward  +  step_reward_weight · Σ step rewards
      (+ an environment session's terms, each under its own name)

Every value a part gives is read by :func:`named_parts`, the one mechanism for rewards made of named
parts: a number is itself; a mapping with ``"reward"`` is that reward, its other keys reported parts
(``Trajectory.reward_parts``, not summed); a mapping without ``"reward"`` is the sum of its parts, each
part its own term (``NAME.part``). :func:`coerce_reward` is the one rule for what a number is.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

from toolrl.config import RewardConfig
from toolrl.schemas import InfrastructureError, Sample
from toolrl.trajectory import Trajectory

# (name, weight, callable): one configured reward function.
RewardFunctions = Sequence[tuple[str, float, Any]]


class RewardValueError(TypeError):
    """A reward that is not a finite number (or a mapping of them)."""


def coerce_reward(value: Any, what: str) -> float:
    """A reward as a finite float: None is 0.0, numbers (Python, numpy, 0-d tensors) convert; strings,
    NaN and infinities are errors."""
    if value is None:
        return 0.0
    if isinstance(value, (str, bytes)) or not (isinstance(value, numbers.Real) or hasattr(value, "__float__")):
        raise RewardValueError(f"{what} must be a number, got {type(value).__name__} {value!r:.80}")
    try:
        number = float(value)
    except (TypeError, ValueError) as exc:
        raise RewardValueError(f"{what} must be a number, got {type(value).__name__}: {exc}") from None
    if not math.isfinite(number):
        raise RewardValueError(f"{what} must be finite, got {number}")
    return number


def named_parts(value: Any, what: str) -> tuple[float, dict[str, float], bool]:
    """``value`` as (reward, parts, summed): a number has no parts; a mapping with ``"reward"`` gives
    that reward and reports its other keys (summed False); a mapping without it is the sum of its parts
    (summed True)."""
    if not isinstance(value, Mapping):
        return coerce_reward(value, what), {}, False
    parts = {str(k): coerce_reward(v, f"{what} part {k!r}") for k, v in value.items() if k != "reward"}
    if "reward" in value:
        return coerce_reward(value["reward"], f"{what}['reward']"), parts, False
    return sum(parts.values()), parts, True


def named_terms(name: str, value: Any, what: str, traj: Trajectory, weight: float = 1.0) -> dict[str, float]:
    """One scorer's reward terms (a reward function's, a session's): ``name`` for a number or a mapping
    with ``"reward"`` (its other parts reported in ``traj.reward_parts``), ``name.part`` for each part
    of a mapping without it; each term times ``weight``."""
    reward, parts, summed = named_parts(value, what)
    if summed:
        return {f"{name}.{part}": weight * v for part, v in parts.items()}
    traj.reward_parts.update({f"{name}.{part}": v for part, v in parts.items()})
    return {name: weight * reward}


def start_rewards(functions: RewardFunctions, traj: Trajectory, sample: Sample) -> list[Any]:
    """Each reward function called on the finished trajectory: its value, the exception it raised, or,
    from an async reward function, the awaitable that gives its value. Sync functions run here, on the
    caller's thread: they are CPU work (no gain from a thread under the GIL), and math-verify's timeout
    needs the main thread, so they have no time limit of toolrl's; a reward that waits (a judge model, a
    service) is async, so it never holds the loop, and :func:`settle` gives it a deadline."""
    info = {"full_response": "".join(traj.model_text), "model_text": list(traj.model_text), "sample": sample,
            "tool_results": traj.tool_results, "parse_errors": len(traj.parse_errors),
            "data_source": sample.data_source,
            "response_ids": [t for t, m in zip(traj.response_ids, traj.response_mask) if m]}
    values: list[Any] = []
    for _, _, fn in functions:
        try:
            values.append(fn(traj.final_response, sample.ground_truth, **info))
        except Exception as exc:
            values.append(exc)
    return values


async def settle(values: Sequence[Any], seconds: float) -> list[Any]:
    """``values`` with every awaitable awaited, concurrently; one that raises gives its exception, one
    still waiting after ``seconds`` (``reward.timeout_s``) is cancelled and gives a TimeoutError."""
    async def within(value: Any) -> Any:
        if not inspect.isawaitable(value):
            return value
        try:
            async with asyncio.timeout(seconds):  # not wait_for, which can drop a cancellation on 3.11
                return await value
        except TimeoutError:
            raise TimeoutError(f"no value within {seconds:g} s (reward.timeout_s)") from None

    return list(await asyncio.gather(*(within(v) for v in values), return_exceptions=True))


async def score(functions: RewardFunctions, weights: RewardConfig, traj: Trajectory, sample: Sample,
                step_rewards: Sequence[float], extra: Mapping[str, float] | None = None) -> None:
    """Score a finished trajectory; async reward functions are awaited concurrently with the other
    trajectories (the loop keeps generating for them meanwhile)."""
    values = await settle(start_rewards(functions, traj, sample), weights.timeout_s)
    combine(functions, weights, traj, values, step_rewards, extra)


def combine(functions: RewardFunctions, weights: RewardConfig, traj: Trajectory, values: Sequence[Any],
            step_rewards: Sequence[float], extra: Mapping[str, float] | None = None) -> None:
    """Set ``traj``'s reward and terms from the reward functions' settled ``values`` (:func:`start_rewards`,
    :func:`settle`), its tools' rewards (``traj.tool_rewards``), its step rewards and ``extra`` terms
    (an environment session's score, already weighted). A failing reward function scores 0 and says
    why in ``reward_errors``."""
    terms: dict[str, float] = {}
    for (name, weight, _), value in zip(functions, values):
        failure = value if isinstance(value, BaseException) else None
        if failure is None:
            try:
                terms.update(named_terms(name, value, "reward", traj, weight))
            except RewardValueError as exc:
                failure = exc
        if failure is not None:  # scores 0, and the trace's reward_errors says this 0 is no score
            terms[name] = 0.0
            traj.reward_errors[name] = f"{type(failure).__name__}: {failure}"
            traj.error = traj.error or f"reward {name}: {traj.reward_errors[name]}"
            if isinstance(failure, InfrastructureError):  # e.g. a judge's endpoint gone: no score, not trained
                traj.termination = "infra_error"
    if traj.tool_rewards:
        terms["tools"] = weights.tool_reward_weight * sum(traj.tool_rewards.values())
    if step_rewards:
        terms["steps"] = weights.step_reward_weight * sum(step_rewards)
    terms.update(extra or {})
    traj.reward_terms = terms
    traj.reward = sum(terms.values())
    if not math.isfinite(traj.reward):  # finite terms can still overflow once weighted and summed
        traj.error = traj.error or f"reward is not finite: {terms}"
        traj.reward = 0.0
