"""A run resolved before anything is written: :func:`resolve_run` checks the placement, looks every part up
by name, reads the data and finds the model's directory, each problem a one-line error. The controller and
evaluation take the :class:`ResolvedRun`, so nothing is resolved twice; its :class:`RunPlan` travels to the
processes, in this process or as Ray actors.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from toolrl.agent_roles import check_engine_serves, trained_roles
from toolrl.algorithms.rules import check_algorithm, with_critic
from toolrl.algorithms.turns import TURN_STATES
from toolrl.config import Config, ConfigError, field_where
from toolrl.data import check_data_files
from toolrl.data.recorded import load_groups
from toolrl.data.sources import load_samples
from toolrl.environments import ConfiguredEnv, is_term
from toolrl.loggers import logger_names
from toolrl.model_sources import check_model_dir, model_path, vocab_size
from toolrl.plugins.parts import lookup_part
from toolrl.rollout.routes import Parts, build_rewards, resolve_parts
from toolrl.schemas import Sample
from toolrl.training.weight_sync import SyncPlan
from toolrl.transports import build_transport

# train: `toolrl train`; rollout: `toolrl rollout` (the training batches, not trained); eval: `toolrl eval`.
Purpose = Literal["train", "rollout", "eval"]


@dataclass(frozen=True)
class RunPlan:
    """What the run check decides once and the processes act on, carried to them (a trainer rank or a rollout
    worker may be a Ray actor: plain, picklable values). ``sync``: what a weight sync sends (the trainer
    ranks send it; an engine that loads its own model takes the run's adapters first); ``state_keys``:
    whether sessions are asked for their turns' state keys (the advantage estimator reads them, ``reads``: gigpo)."""

    sync: SyncPlan = SyncPlan()
    state_keys: bool = False


def run_plan(config: Config, purpose: Purpose = "train", engine_cls: Any = None, estimator: Any = None) -> RunPlan:
    """The run's :class:`RunPlan`. A weight sync sends adapters alone when the engine takes them (else
    merged weights), a delta with ``trainer.weight_sync: delta`` (an engine that keeps what it is not sent,
    else a ConfigError), and under ``model.adapters`` the trained adapters that changed. ``engine_cls`` and
    ``estimator``: as resolved (looked up by name when not given)."""
    if engine_cls is None:
        engine_cls = lookup_part("rollout_engines", config.engine.name, field_where(config, "engine.name"))
    if estimator is None:
        estimator = lookup_part("advantage_estimators", config.algorithm.advantage, "algorithm.advantage")
    delta = purpose == "train" and config.trainer.weight_sync == "delta"
    if delta and not engine_cls.partial_weight_updates:
        raise ConfigError(f"{field_where(config, 'trainer.weight_sync')}: delta needs an engine that keeps the "
                          "weights it is not sent; "
                          f"the {config.engine.name} engine loads whole updates: use full")
    check_engine_serves(config, engine_cls)
    adapters = config.model.adapters
    if adapters is not None and purpose == "train":
        sync = SyncPlan(adapters=True, delta=True, policies=trained_roles(adapters))
    else:
        sync = SyncPlan(adapters=(config.model.lora is not None or adapters is not None) and engine_cls.loads_adapters,
                        delta=delta)
    return RunPlan(sync, state_keys=TURN_STATES in estimator.reads)


@dataclass(frozen=True)
class ResolvedRun:
    """Everything a run needs that can be checked before a model loads.

    ``config``: what the run records in ``config.json``; ``plan``: what the processes act on, decided
    here; ``samples``: what its steps draw from (the training split, or recorded groups; none for
    ``eval``); ``eval_config`` and ``eval_samples``: the config with ``eval.metric`` resolved and the
    held-out problems, when the run evaluates (``eval``, or ``trainer.eval_every``); ``loggers``: the
    metric loggers' names (``train``)."""

    purpose: Purpose
    config: Config
    parts: Parts
    model_dir: str
    plan: RunPlan
    samples: list[Sample] = field(default_factory=list)
    eval_config: Config | None = None
    eval_samples: list[Sample] = field(default_factory=list)
    loggers: list[str] = field(default_factory=list)

    @property
    def prompts(self) -> list[Sample]:
        """Every prompt the run's rollouts will run, checked against their route's tools before the
        model loads (recorded groups run none)."""
        recorded = self.purpose == "train" and bool(self.config.data.trajectories)
        return ([] if recorded else self.samples) + self.eval_samples


def check_placement(config: Config) -> None:
    """Where the processes can run: Ray, when a run names it, must be installed; several trainer ranks need
    Ray; CPU offload needs GPU ranks."""
    if config.ray.address is not None and importlib.util.find_spec("ray") is None:
        raise ConfigError(f"{field_where(config, 'ray.address')}: Ray is not installed: pip install 'toolrl[ray]'")
    if config.trainer.world_size > 1 and config.ray.address is None:
        raise ConfigError(f"trainer.world_size={config.trainer.world_size} needs Ray: set ray.address "
                          "(local, auto or host:port)")
    on_gpu = config.ray.num_gpus_per_trainer > 0 if config.ray.address is not None else config.model.device != "cpu"
    if config.trainer.cpu_offload and not on_gpu:
        raise ConfigError("trainer.cpu_offload: offloading needs trainer ranks on GPUs "
                          "(ray.num_gpus_per_trainer or model.device)")


def with_metric(config: Config, envs: dict[str, ConfiguredEnv]) -> Config:
    """``config`` with ``eval.metric`` filled from the environments' metric when unset (one metric
    for all of them), and checked: it must name a reward term a trajectory can have."""
    found = [c.env for c in envs.values()]
    metric = config.eval.metric
    if metric is None and len({e.metric for e in found}) == 1 and found[0].metric is not None:
        metric = found[0].metric
    functions = config.reward.functions if config.reward.functions is not None else [r for e in found for r in e.rewards]
    # A session's score is a term of its own, named after its kind (session.name, else each environment's);
    # a kind that serves the environments' own sessions elsewhere scores under theirs (EnvironmentSession.serves).
    kind = config.session.name
    named = [kind] if kind else []
    serves = kind is None or lookup_part("environment_sessions", kind, field_where(config, "session.name")).serves
    own = [e.session for e in found if e.session] if serves else []
    sessions = list(dict.fromkeys(named + own))
    terms = list(dict.fromkeys(f.name for f in functions)) + sessions + ["tools", "steps"]
    if metric is not None and not is_term(metric, terms, sessions):
        source = "eval.metric" if config.eval.metric is not None else f"eval.metric (environment {found[0].name!r})"
        raise ConfigError(f"{source}: no reward term {metric!r} (terms: {', '.join(terms)})")
    return config.model_copy(update={"eval": config.eval.model_copy(update={"metric": metric})})


def resolve_run(config: Config, purpose: Purpose = "train") -> ResolvedRun:
    """``config`` resolved and checked for ``purpose``, in the order a user would fix things: where
    the processes run, the files it names (data, model: found in a second, before parts import torch), the
    parts, the loggers, the data's rows, the held-out split."""
    check_placement(config)
    # What the run reads: recorded groups, or the training split (none for eval); the held-out split.
    recorded_groups = purpose == "train" and bool(config.data.trajectories)
    training_split = not recorded_groups and purpose != "eval"
    held_out = purpose == "eval" or (purpose == "train" and bool(config.trainer.eval_every))
    check_data_files(config, [field for field, read in (("trajectories", recorded_groups), ("train_files", training_split),
                                                        ("test_files", held_out)) if read])
    model_dir = model_path(config)
    training: dict[str, object] = {}
    estimator = None
    if purpose == "train":
        check_model_dir(model_dir, "training", config)
        config = with_critic(config)
        estimator, loss = check_algorithm(config, has_critic=config.critic is not None)
        training = {"algorithm.advantage_options": estimator, "algorithm.loss_options": loss}
    parts = resolve_parts(config)
    loggers = logger_names(config) if purpose == "train" else []
    if purpose == "train":
        # A bad trainer.weight_transport is one line before anything loads.
        training["trainer.weight_transport_options"] = build_transport(config.trainer, config)
        parts = replace(parts, training=training)
    # So is trainer.weight_sync: delta with an engine that cannot take one.
    plan = run_plan(config, purpose, parts.engine_cls, estimator)
    samples: list[Sample] = []
    if recorded_groups:
        # Trained as recorded instead of generated, scored by one environment's rewards (or the explicit
        # reward.functions); a mixture's rows carry no route, so there only reward.functions score them.
        envs = list(parts.envs.values())
        samples = load_groups(config, build_rewards(config, envs[0].env if len(envs) == 1 else None),
                              vocab_size(model_dir))
    elif training_split:
        samples = load_samples(config, "train", parts.envs)
    eval_config, eval_samples = None, []
    if held_out:
        eval_config = with_metric(config, parts.envs)
        # The first eval.num_samples problems in file order: every run sees the same ones.
        eval_samples = load_samples(config, "test", parts.envs)[: config.eval.num_samples]
    recorded = eval_config if purpose == "eval" and eval_config is not None else config
    if purpose == "train" and config.trainer.sequence_parallel > 1:  # torch loads only for it
        from toolrl.training.sequence_parallel import check_sequence_parallel

        check_sequence_parallel(config, model_dir)
    return ResolvedRun(purpose, recorded, parts, model_dir, plan, samples, eval_config, eval_samples, loggers)
