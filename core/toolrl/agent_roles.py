"""An agent's roles (``Config.roles``: ``rollout.roles``, or ``model.adapters``' names, a policy each; one
per trajectory piece, ``Trajectory.role``), decided in one place: the role a row starts with, the adapter a
turn samples with, which roles train, whether the engine serves adapters, the run check of roles named,
each role's reward, baseline and figures.
"""

from __future__ import annotations

import difflib
import math
import statistics
from collections import defaultdict
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from toolrl.config import AdapterConfig, Config, ConfigError, field_where

if TYPE_CHECKING:
    from toolrl.agents import AgentOptions
    from toolrl.algorithms import AdvantageEstimator
    from toolrl.engines import RolloutEngine
    from toolrl.plugins.parts import RunFacts
    from toolrl.schemas import Sample
    from toolrl.sessions import SessionKind
    from toolrl.trajectory import Trajectory


def first_role(sample: Sample, roles: Sequence[str]) -> str | None:
    """The role acting first on ``sample`` (the first turn in toolrl's loop, the model an agent program is
    given): the one its row names (``extra_info.role``), else the run's first; None in a run with none."""
    named = sample.extra_info.get("role")
    return ((named if isinstance(named, str) else None) or roles[0]) if roles else None


def adapter_keyword(role: str | None, adapters: bool) -> dict[str, str | None]:
    """``generate``'s keyword for a turn of ``role``: its adapter under ``model.adapters`` (``adapters``),
    none otherwise (an engine without adapters takes no such keyword)."""
    return {"adapter": role} if adapters else {}


def trained_roles(adapters: Mapping[str, AdapterConfig]) -> tuple[str, ...]:
    """The roles whose adapter trains (``model.adapters`` without the frozen ones), in its order."""
    return tuple(role for role, adapter in adapters.items() if not adapter.frozen)


def frozen_roles(config: Config) -> tuple[str, ...]:
    """The roles whose policy is a frozen adapter (``model.adapters``): they act, their pieces never train."""
    return tuple(role for role, adapter in (config.model.adapters or {}).items() if adapter.frozen)


def trains(traj: Trajectory, frozen: Sequence[str]) -> bool:
    """Whether ``traj``'s role trains: it is not among ``frozen`` (:func:`frozen_roles`)."""
    return traj.role not in frozen


# -- each role's reward and baseline ----------------------------------------------------------------
# In a run with roles (Trajectory.role set on every piece), a group's baseline is each role's own: a
# piece's reward is its role's (:func:`role_reward`), its group is its group and role, and an outcome
# estimator sees each episode once per role it acted in. Every group estimator then normalises each role's
# rewards over the group's episodes separately; a run with no roles gets exactly the rewards, groups and
# keys it always had.


def role_reward(traj: Trajectory) -> float:
    """A piece's reward as its role earned it: the role's own (``role_rewards``), else the episode's."""
    return traj.reward if traj.role is None else traj.role_rewards.get(traj.role, traj.reward)


def role_groups(trajectories: Sequence[Trajectory]) -> list[int]:
    """Each row's group: its ``group`` in a run with no roles, else one number per (group, role), numbered
    as they first appear, so a group's roles are normalised apart."""
    if all(t.role is None for t in trajectories):
        return [t.group for t in trajectories]
    ids: dict[tuple[int, str | None], int] = {}
    return [ids.setdefault((t.group, t.role), len(ids)) for t in trajectories]


def episode_keys(trajectories: Sequence[Trajectory]) -> list[Hashable]:
    """What an outcome estimator counts once: a trajectory (its pieces share ``trajectory_key``; a
    trajectory of one piece has none, its row stands for it), and in a run with roles each role of it."""
    keys: list[Hashable] = [t.trajectory_key or i for i, t in enumerate(trajectories)]
    if all(t.role is None for t in trajectories):
        return keys
    return [(key, t.role) for key, t in zip(keys, trajectories, strict=True)]


def role_metrics(trajs: Sequence[Trajectory], success_threshold: float | None = None) -> dict[str, float]:
    """Each role's figures for a step's row (none in a run with no roles), over the episodes it acted in,
    once each: ``role/NAME/reward`` (:func:`role_reward`; the finite ones' mean) and ``role/NAME/success``
    (the share of them, without an error, whose reward is at least ``success_threshold``,
    ``eval.success_threshold``; None: not reported)."""
    ends = {t.key: t for t in trajs if t.termination != "forked"}  # each episode's last piece
    rewards: dict[str, dict[str, float]] = defaultdict(dict)  # role -> episode -> its reward
    for t in trajs:
        if t.role is not None:
            rewards[t.role][t.key] = role_reward(t)
    out: dict[str, float] = {}
    for role in sorted(rewards):
        finite = [r for r in rewards[role].values() if math.isfinite(r)]
        out[f"role/{role}/reward"] = statistics.fmean(finite) if finite else math.nan
        if success_threshold is not None:
            won = sum(r >= success_threshold and (key not in ends or ends[key].error is None)
                      for key, r in rewards[role].items())
            out[f"role/{role}/success"] = won / len(rewards[role])
    return out


def role_tokens(trained: Sequence[Trajectory]) -> dict[str, float]:
    """``role/NAME/trained_tokens``: the tokens each role sampled among the step's ``trained`` pieces."""
    tokens: dict[str, int] = defaultdict(int)
    for t in trained:
        if t.role is not None:
            tokens[t.role] += sum(t.response_mask)
    return {f"role/{role}/trained_tokens": float(n) for role, n in sorted(tokens.items())}


def check_engine_serves(config: Config, engine_cls: type[RolloutEngine]) -> None:
    """Several policies (``model.adapters``) need an engine that serves LoRA adapters
    (``RolloutEngine.loads_adapters``: the transformers and vLLM engines): one line otherwise."""
    if config.model.adapters is not None and not engine_cls.loads_adapters:
        raise ConfigError(f"{field_where(config, 'model.adapters')}: several policies need an engine that serves "
                          f"LoRA adapters (transformers, vllm); the {config.engine.name} engine serves none")


def check_roles(facts: RunFacts, routes: Iterable[tuple[SessionKind | None, AgentOptions | None]],
                estimator: AdvantageEstimator | None) -> None:
    """Every role the run's parts give turns to is one of the run's: each route's (``routes``: its session
    kind and agent options) session kind's ``roles`` and its agent program's ``rollout.agent.model``, when
    set. Roles in one policy (``rollout.roles``) are there for each role's own baseline within its
    group, which only a group-relative ``estimator`` has."""
    config = facts.config
    roles = config.roles
    for kind, options in routes:
        missing = [r for r in kind.cls.roles if r not in roles] if kind is not None else []
        if kind is not None and missing:
            raise ConfigError(f"{kind.where}: session {kind.name!r} gives turns to {', '.join(map(repr, missing))}, "
                              f"which is not among {_among(roles, missing[0])}")
        if roles and options is not None and "model" in options.model_fields_set and options.model not in roles:
            raise ConfigError(f"{facts.where('rollout.agent.model')}: the agent program asks for model "
                              f"{options.model!r}, which is not among {_among(roles, options.model)}: in a run "
                              "with roles the models served are its roles")
    if config.rollout.roles and estimator is not None and not estimator.group_relative:
        raise ConfigError(f"{facts.where('rollout.roles')}: each role is normalised against its own baseline "
                          f"within its group, and algorithm.advantage {estimator.name} has no group baseline (one "
                          "shared by every role instead): use a group-relative estimator (grpo, dr_grpo, rloo, "
                          "reinforce_pp_baseline, gigpo, tree_grpo) or remove rollout.roles")


def check_row_role(config: Config, where: str, role: object, named: bool, piece: bool = False) -> None:
    """A data row's role (``where``: its field as errors name it) is one of the run's when the row names
    one (``named``) or is a recorded ``piece`` under ``model.adapters``, which trains its role's adapter."""
    adapters = piece and config.model.adapters is not None
    if (named or adapters) and role not in config.roles:
        trained = ": each row trains its role's adapter" if adapters else ""
        raise ConfigError(f"{where}: {role!r} is not among {_among(config.roles, role)}{trained}")


def check_every_role_acts(config: Config, routes: Iterable[tuple[SessionKind | None, Any]],
                          samples: Sequence[Sample]) -> None:
    """Every role the run trains acts in some episode, else nothing trains it: in toolrl's own loop an
    episode starts with :func:`first_role`, and only a session kind gives turns to others (its ``roles``;
    ``routes``: each route's session kind and agent program). An agent program may ask for any role, as may
    a session kind that gives turns without declaring to whom; recorded rows (``data.trajectories``) name
    their own. A frozen adapter's role trains nothing anyway: it may sit out a route that never calls on it."""
    roles = config.roles
    if len(roles) < 2 or config.data.trajectories:
        return
    acting = {first_role(sample, roles) for sample in samples}
    for kind, agent in routes:
        if agent is not None or (kind is not None and kind.cls.gives_turns() and not kind.cls.roles):
            return
        acting.update(kind.cls.roles if kind is not None else ())
    never = [role for role in roles if role not in acting and role not in frozen_roles(config)]
    if never:
        field = "rollout.roles" if config.rollout.roles else f"model.adapters.{never[0]}"
        them = "it" if len(never) == 1 else "them"
        raise ConfigError(f"{field_where(config, field)}: {', '.join(map(repr, never))} can never act, so the run "
                          f"cannot train {them}: each episode starts with its data row's extra_info.role, else "
                          f"{roles[0]!r}, and no session kind (its roles) or agent program (rollout.agent) of the "
                          f"run gives turns to {them}")


def _among(roles: Sequence[str], name: object = None) -> str:
    """The run's roles as the refusals of a role name them (with the closest to ``name``, when one is)."""
    if not roles:
        return "the run's roles: it has none (set rollout.roles)"
    close = difflib.get_close_matches(name, roles, n=1) if isinstance(name, str) else []
    return f"the run's roles ({', '.join(roles)}{f'; did you mean {close[0]!r}?' if close else ''})"
