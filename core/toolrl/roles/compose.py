"""Composition per role: each role builds only what it runs.

- the controller (driver): data (:func:`load_samples`: files or the environments' splits), the
  tokenizer (traces), no model, no engine when the work is on Ray;
- a rollout worker: its engine (which loads its own model from the path) and one route per
  environment — parser, tools, rewards, turn limit (:func:`compose_rollouts`, :func:`build_routes`);
- a trainer rank: its model (:func:`build_policy`, the one place the trained model is built) and
  optimizer.

Without Ray every role runs in one process (:func:`compose_local`): the in-process engine then shares
the trainer's module, so weight updates cost nothing.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolrl.config import DEFAULT_MAX_TURNS, DEFAULT_PARSER, Config, ConfigError, resolve_path
from toolrl.environments import Environment, decorate
from toolrl.rollout import RolloutContext, Route, Trajectory, run_group, run_rollouts
from toolrl.schemas import Sample
from toolrl.tools import Tool


def model_path(config: Config) -> str:
    from toolrl.models import resolve_source

    return resolve_source(config.model, config.base_dir)


def seed_everything(seed: int) -> None:
    import torch

    random.seed(seed)
    torch.manual_seed(seed)


@dataclass(frozen=True)
class ConfiguredEnv:
    """An environment as a config uses it: adapted to its options, with its mixture weight and turn limit."""

    env: Environment
    options: Any
    weight: float
    max_turns: int | None


def configured_envs(config: Config) -> dict[str, ConfiguredEnv]:
    """``env``/``envs`` resolved: each name looked up (unknown names list the installed ones) and its
    options validated against the environment's options model."""
    from toolrl.environments import get_environment

    out = {}
    for name, entry in config.env_entries().items():
        where = "env" if config.env is not None else f"envs.{name}"
        env, options = get_environment(name, where).resolve(
            entry.options, "env_options" if config.env is not None else f"envs.{name}.options")
        out[name] = ConfiguredEnv(env, options, entry.weight, entry.max_turns)
    return out


def load_samples(config: Config, split: str = "train") -> list[Sample]:
    """The samples of ``split``: ``"train"`` (training) or ``"test"`` (the held-out split, evaluation).

    ``data.<split>_files`` when set, else the configured environments' splits. A mixture's training
    samples hold each environment's samples in proportion to its weight (repeated when its share
    exceeds its split); its test split is every environment's test samples."""
    from toolrl.data import load_samples as load_files

    if split not in ("train", "test"):
        raise ConfigError(f"unknown data split {split!r} (use train or test)")
    envs = configured_envs(config)
    files = config.data.train_files if split == "train" else config.data.test_files
    if files:
        samples = load_files([resolve_path(config, f) for f in files], f"data.{split}_files")
        for s in samples:
            _check_route(s, envs)
            decorate(s, config.data.system_prompt, config.data.prompt_prefix or [])
        return samples
    if not envs:
        raise ConfigError(f"data.{split}_files: no {split} split configured (set env or data.{split}_files)")
    parts = {}
    for name, c in envs.items():
        parts[name] = c.env.load(split, c.options, config.base_dir)
        system_prompt = config.data.system_prompt or c.env.system_prompt
        prefix = c.env.prompt_prefix if config.data.prompt_prefix is None else config.data.prompt_prefix
        for s in parts[name]:
            decorate(s, system_prompt, prefix, c.env.instructions)
    if len(parts) == 1:
        return next(iter(parts.values()))
    if split == "train":
        return _mix(parts, {n: c.weight for n, c in envs.items()}, config.trainer.seed)
    samples = [s for part in parts.values() for s in part]
    for i, s in enumerate(samples):
        s.index = i  # unique across the environments: trajectory ids and traces use it
    return samples


def _check_route(sample: Sample, envs: dict[str, ConfiguredEnv]) -> None:
    origin = getattr(sample, "origin", "") or "a sample"
    if sample.env is not None and sample.env not in envs:
        raise ConfigError(f"{origin}: extra_info.env: environment {sample.env!r} is not configured "
                          f"(configured: {', '.join(envs) or 'none'})")
    if sample.env is None and len(envs) > 1:
        raise ConfigError(f"{origin}: extra_info.env: a mixture needs each sample's environment "
                          f"(one of {', '.join(envs)})")


def _mix(parts: dict[str, list[Sample]], weights: dict[str, float], seed: int) -> list[Sample]:
    """As many samples as the parts hold together, each environment's share by weight, shuffled."""
    rng = random.Random(seed)
    total, weight_sum = sum(len(p) for p in parts.values()), sum(weights.values())
    mixed: list[Sample] = []
    for name, part in parts.items():
        order = list(part)
        rng.shuffle(order)
        share = max(1, round(total * weights[name] / weight_sum))
        mixed += [order[i % len(order)].model_copy(deep=True) for i in range(share)]
    rng.shuffle(mixed)
    for i, s in enumerate(mixed):
        s.index = i
    return mixed


def parser_spec(config: Config, env: Environment | None) -> tuple[str, dict[str, Any]]:
    """The parser name and options a route uses: ``rollout.parser`` when set, else the
    environment's; options follow the parser (the environment's go with the environment's parser)."""
    name = config.rollout.parser or (env.parser if env is not None else DEFAULT_PARSER)
    options = config.rollout.parser_options
    if options is None:
        options = env.parser_options if env is not None and name == env.parser else {}
    return name, options


def max_turns(config: Config, c: ConfiguredEnv | None) -> int:
    """``envs.NAME.max_turns``, else ``rollout.max_turns``, else the environment's, else the default."""
    if c is not None and c.max_turns is not None:
        return c.max_turns
    return config.rollout.max_turns or (c.env.max_turns if c is not None else None) or DEFAULT_MAX_TURNS


async def configured_tools(config: Config, env: Environment | None = None) -> dict[str, Tool]:
    """The explicit ``tools`` section's tools when it is set, else ``env``'s tool entries."""
    from toolrl.tools.verl_config import ToolsFile, build_tools, load_tools_file, parse_tools_config

    files: list[ToolsFile] = []
    if config.tools.config_path:
        files.append(load_tools_file(resolve_path(config, config.tools.config_path)))
    if config.tools.entries:
        files.append(parse_tools_config({"tools": config.tools.entries}, Path(config.base_dir)))
    if not config.tools.explicit and env is not None and env.tools:
        files.append(parse_tools_config({"tools": env.tools}, Path(config.base_dir)))
    tools: dict[str, Tool] = {}
    for f in files:
        for name, tool in (await build_tools(f)).items():
            if name in tools:
                raise ConfigError(f"tools: two tools are named {name!r}")
            tools[name] = tool
    return tools


def build_rewards(config: Config, env: Environment | None = None) -> list[tuple[str, float, Any]]:
    """``reward.functions`` when set, else ``env``'s rewards."""
    from toolrl.plugins import get_plugins
    from toolrl.plugins.registry import RegistryError

    explicit = config.reward.functions is not None
    terms = config.reward.functions if explicit else (env.rewards if env is not None else [])
    out = []
    for i, term in enumerate(terms or []):
        where = f"reward.functions.{i}" if explicit else f"environment {env.name!r} reward {term.name!r}"  # type: ignore[union-attr]
        try:
            cls = get_plugins().load_part("reward_functions", term.name)
            out.append((term.name, term.weight, cls(**term.options)))
        except (RegistryError, TypeError, ValueError) as exc:
            raise ConfigError(f"{where}: {exc}") from None
    return out


def build_parser(config: Config, env: Environment | None = None) -> Any:
    from toolrl.plugins import get_plugins
    from toolrl.plugins.registry import RegistryError

    name, options = parser_spec(config, env)
    try:
        return get_plugins().load_part("tool_parsers", name)(**options)
    except RegistryError as exc:
        raise ConfigError(f"rollout.parser: {exc}") from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"rollout.parser_options: {exc}") from None


def check_parts(config: Config) -> tuple[Any, Any]:
    """The engine class and the (first) route's parser, resolved by name, with every environment,
    parser and reward checked: a typo fails here, before anything loads."""
    from toolrl.plugins import get_plugins
    from toolrl.plugins.registry import RegistryError

    try:
        engine_cls = get_plugins().load_part("rollout_engines", config.engine.name)
    except RegistryError as exc:
        raise ConfigError(f"engine.name: {exc}") from None
    envs = [c.env for c in configured_envs(config).values()] or [None]
    parsers = [build_parser(config, env) for env in envs]
    for env in envs:
        build_rewards(config, env)
    return engine_cls, parsers[0]


async def build_routes(config: Config, samples: Sequence[Sample] = ()) -> tuple[dict[str | None, Route], list[Tool]]:
    """One route per configured environment (and the ``None`` route for samples naming none, when
    there is at most one environment), every tool built, and ``samples`` checked against their
    route's tools. Returns the routes and every tool (to close)."""
    from toolrl.data import check_samples_against_tools

    envs: dict[str | None, ConfiguredEnv | None] = {**configured_envs(config)} or {None: None}
    routes: dict[str | None, Route] = {}
    built: list[Tool] = []
    shared: dict[str, Tool] | None = None  # the explicit tools section: one set for every route
    try:
        for name, c in envs.items():
            env = c.env if c is not None else None
            if config.tools.explicit:
                shared = shared if shared is not None else await configured_tools(config)
                tools = shared
            else:
                tools = await configured_tools(config, env)
            built += [t for t in tools.values() if t not in built]
            routes[name] = Route(tools, max_turns(config, c), build_parser(config, env), build_rewards(config, env),
                                 config.reward)
        if len(routes) == 1 and None not in routes:
            routes[None] = next(iter(routes.values()))
        for name, route in routes.items():
            mine = [s for s in samples if s.env == name or (s.env is None and name is None)]
            check_samples_against_tools(mine, route.tools, f"environment {name!r}" if name else "data")
    except BaseException:
        for tool in built:
            await tool.close()
        raise
    return routes, built


def build_policy(config: Config, path: str, device: str) -> Any:
    """The model a trainer rank optimises: the one place it is built (adapters wrap it here)."""
    from toolrl import models

    model = models.load_model(path, dtype=config.model.dtype, device=device)
    if config.model.lora is not None:
        from toolrl.training import lora

        lora.apply_lora(model, config.model.lora)
    if config.model.gradient_checkpointing:
        # Non-reentrant: the form FSDP2 and torch.compile support.
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


@dataclass
class Rollouts:
    """The rollout role: an engine, the agent loop's context and the tools it owns."""

    engine: Any
    ctx: RolloutContext
    tools: list[Tool]
    _limit: asyncio.Semaphore | None = field(default=None, repr=False)  # shared by all groups in flight

    async def run(self, samples: Sequence[Sample], n: int, seed: int, id_prefix: str = "") -> list[Trajectory]:
        return await run_rollouts(self.ctx, samples, n, seed=seed, id_prefix=id_prefix)

    async def run_group(self, sample: Sample, group: int, n: int, seed: int, id_prefix: str = "") -> list[Trajectory]:
        """One group (streaming): its trajectories share the max_concurrent_trajectories bound with
        every other group in flight."""
        if self._limit is None:
            self._limit = asyncio.Semaphore(self.ctx.config.max_concurrent_trajectories)
        return await run_group(self.ctx, sample, group, n, seed, id_prefix, self._limit)

    async def check_trainable(self) -> str | None:
        return await self.engine.check_trainable()

    @property
    def generating(self) -> Rollouts:
        return self

    def weight_targets(self, version: int) -> list[Any]:
        """The engine: the trainer pushes weights into it between two decode steps."""
        return [self.engine]

    def replace(self, dead: Sequence[Any]) -> None:
        if dead:  # the engine lives in this process: no weight push finds it dead
            raise ValueError("Rollouts.replace: an engine in this process cannot be replaced")

    async def close(self) -> None:
        for tool in self.tools:
            await tool.close()
        await self.engine.close()


async def compose_rollouts(config: Config, path: str, tokenizer: Any,
                           shared_module: Callable[[], Any] | None = None,
                           samples: Sequence[Sample] = ()) -> Rollouts:
    """Engine and routes (parser, tools, rewards per environment). ``shared_module``: called once the
    tools are up, before the engine loads; returns a live model for the engine to share (in-process
    only), or None: the engine loads its own copy from ``path``. ``samples``: checked against their
    route's tools before any model loads."""
    from toolrl import models
    from toolrl.engines import ModelSource
    from toolrl.rollout.chat import ChatRenderer

    engine_cls, _ = check_parts(config)
    routes, tools = await build_routes(config, samples)
    try:
        module = shared_module() if shared_module is not None else None
        engine = engine_cls.create(
            ModelSource(path=path, module=module, tokenizer=tokenizer),
            {"max_batch_size": config.engine.max_batch_size, "device": models.resolve_device(config.model.device),
             "dtype": config.model.dtype, **config.engine.options},
        )
    except BaseException:
        for tool in tools:
            await tool.close()
        raise
    ctx = RolloutContext(engine=engine, renderer_factory=lambda schemas: ChatRenderer(tokenizer, schemas),
                         config=config.rollout, routes=routes)
    return Rollouts(engine, ctx, tools)


@dataclass
class LocalRun:
    """Every role in this process: the trained model and an engine that shares it."""

    config: Config
    path: str
    tokenizer: Any
    model: Any
    rollouts: Rollouts
    samples: list[Sample]

    @property
    def ctx(self) -> RolloutContext:
        return self.rollouts.ctx

    @property
    def engine(self) -> Any:
        return self.rollouts.engine


async def compose_local(config: Config, split: str = "train") -> LocalRun:
    """``split``: the samples checked against the tools (those that will run)."""
    from toolrl import models

    seed_everything(config.trainer.seed)
    check_parts(config)
    # Recorded groups (data.trajectories) are trained as recorded: no prompt runs against the tools.
    samples = [] if split == "train" and config.data.trajectories else load_samples(config, split)
    path = model_path(config)
    tokenizer = models.load_tokenizer(path)
    built: list[Any] = []

    def trained_model() -> Any:
        built.append(build_policy(config, path, models.resolve_device(config.model.device)))
        # Under LoRA the engine keeps a plain base model of its own and gets merged weights. So it
        # does when rollouts overlap training (max_staleness > 0): the trainer's forward, backward
        # and optimizer steps then never touch the weights the engine decodes with; the engine gets
        # each step's weights by push, between two decode steps.
        return None if config.model.lora or config.trainer.max_staleness > 0 else built[0]

    rollouts = await compose_rollouts(config, path, tokenizer, shared_module=trained_model, samples=samples)
    return LocalRun(config, path, tokenizer, built[0], rollouts, samples)
