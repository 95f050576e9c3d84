"""Composition per role: each role builds only what it runs, from parts resolved once.

- every part is looked up by name once per process (:func:`resolve_parts`: the engine class and,
  per environment, its parser, rewards, turn limit and tool configs) and handed down;
- the controller (driver): data (:func:`load_samples`: files or the environments' splits), the
  tokenizer (traces), no model, no engine when the work is on Ray;
- a rollout worker: its engine (:func:`build_engine`; it loads its own model from the path) and one
  route per environment: parser, tools, rewards, turn limit (:func:`compose_rollouts`, :func:`build_routes`);
- a trainer rank: its model (:func:`build_policy`, the one place the trained model is built) and
  optimizer.

Without Ray every role runs in one process (:func:`compose_local`): the in-process engine then shares
the trainer's module, so weight updates cost nothing.
"""

from __future__ import annotations

import asyncio
import logging
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
from toolrl.tools.verl_config import ToolsFile

log = logging.getLogger(__name__)


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


def load_samples(config: Config, split: str = "train", envs: dict[str, ConfiguredEnv] | None = None) -> list[Sample]:
    """The samples of ``split``: ``"train"`` (training) or ``"test"`` (the held-out split, evaluation).

    ``data.<split>_files`` when set, else the configured environments' splits. A mixture's training
    samples hold each environment's samples in proportion to its weight (repeated when its share
    exceeds its split); its test split is every environment's test samples. ``envs``: the
    configured environments, when already resolved."""
    from toolrl.data import load_files

    if split not in ("train", "test"):
        raise ConfigError(f"unknown data split {split!r} (use train or test)")
    envs = configured_envs(config) if envs is None else envs
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
    from toolrl.data import origin_of

    origin = origin_of(sample, "a sample")
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


def tool_files(config: Config, env: Environment | None = None) -> list[ToolsFile]:
    """The tool configs of a route, read and checked (every ``class_name`` resolved) without building
    a tool: the explicit ``tools`` section when it is set, else ``env``'s tool entries."""
    from toolrl.tools.verl_config import load_tools_file, parse_tools_config, resolve_tool_class

    files: list[ToolsFile] = []
    if config.tools.config_path:
        files.append(load_tools_file(resolve_path(config, config.tools.config_path)))
    if config.tools.entries:
        files.append(parse_tools_config({"tools": config.tools.entries}, Path(config.base_dir)))
    if not config.tools.explicit and env is not None and env.tools:
        files.append(parse_tools_config({"tools": env.tools}, Path(config.base_dir)))
    for f in files:
        for entry in f.tools:
            resolve_tool_class(entry.class_name)
    return files


async def build_route_tools(files: Sequence[ToolsFile]) -> dict[str, Tool]:
    """The tools of a route's configs, built; names must be unique across the configs."""
    from toolrl.tools.verl_config import build_tools

    made: list[Tool] = []
    tools: dict[str, Tool] = {}
    try:
        for f in files:
            built = await build_tools(f)
            made += built.values()
            for name, tool in built.items():
                if name in tools:
                    raise ConfigError(f"tools: two tools are named {name!r}")
                tools[name] = tool
    except BaseException:
        for tool in made:
            await tool.close()
        raise
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


@dataclass(frozen=True)
class RouteParts:
    """One route's parts, resolved by name; nothing here holds a resource (tools are built per role)."""

    max_turns: int
    parser: Any
    rewards: list[tuple[str, float, Any]]
    tool_files: list[ToolsFile]


@dataclass(frozen=True)
class Parts:
    """Every part a config names, resolved once: the engine class, the configured environments and
    one route per environment (``None``: no environment)."""

    engine_cls: Any
    envs: dict[str, ConfiguredEnv]
    routes: dict[str | None, RouteParts]

    @property
    def parser(self) -> Any:
        """The (first) route's parser: what ``toolrl serve`` parses with."""
        return next(iter(self.routes.values())).parser


def resolve_parts(config: Config) -> Parts:
    """The engine class and every environment, parser, reward and tool config, resolved by name and
    checked: a typo fails here, before anything loads."""
    from toolrl.plugins import get_plugins
    from toolrl.plugins.registry import RegistryError

    try:
        engine_cls = get_plugins().load_part("rollout_engines", config.engine.name)
    except RegistryError as exc:
        raise ConfigError(f"engine.name: {exc}") from None
    envs = configured_envs(config)
    return Parts(engine_cls, envs, resolve_routes(config, envs))


def resolve_routes(config: Config, envs: dict[str, ConfiguredEnv]) -> dict[str | None, RouteParts]:
    """One route's parts per configured environment (``None``: no environment); no engine needed."""
    shared = tool_files(config) if config.tools.explicit else None  # one set of tools for every route
    entries: dict[str | None, ConfiguredEnv | None] = {**envs} or {None: None}
    routes = {}
    for name, c in entries.items():
        env = c.env if c is not None else None
        routes[name] = RouteParts(max_turns(config, c), build_parser(config, env), build_rewards(config, env),
                                  shared if shared is not None else tool_files(config, env))
    return routes


async def build_routes(config: Config, samples: Sequence[Sample] = (), parts: Parts | None = None,
                       ) -> tuple[dict[str | None, Route], list[Tool]]:
    """One route per configured environment (and the ``None`` route for samples naming none, when
    there is at most one environment), every tool built, and ``samples`` checked against their
    route's tools. ``parts``: resolved already (else the routes are resolved here; building routes
    needs no engine). Returns the routes and every tool (to close)."""
    from toolrl.data import check_samples_against_tools

    route_parts = parts.routes if parts is not None else resolve_routes(config, configured_envs(config))
    routes: dict[str | None, Route] = {}
    built: dict[int, dict[str, Tool]] = {}  # by tool-config list: routes sharing the explicit section share its tools
    try:
        for name, route in route_parts.items():
            if id(route.tool_files) not in built:
                built[id(route.tool_files)] = await build_route_tools(route.tool_files)
            tools = built[id(route.tool_files)]
            # Parsers of formats that write every value as text type them from the tools' schemas.
            route.parser.bind_tools([t.tool_schema.model_dump(exclude_none=True) for t in tools.values()])
            routes[name] = Route(tools, route.max_turns, route.parser, route.rewards, config.reward)
        if len(routes) == 1 and None not in routes:
            routes[None] = next(iter(routes.values()))
        for name, r in routes.items():
            mine = [s for s in samples if s.env == name or (s.env is None and name is None)]
            check_samples_against_tools(mine, r.tools, f"environment {name!r}" if name else "data")
    except BaseException:
        for tools in built.values():
            for tool in tools.values():
                await tool.close()
        raise
    return routes, [t for tools in built.values() for t in tools.values()]


def engine_processor(config: Config, engine_cls: Any, path: str, samples: Sequence[Sample] = ()) -> Any:
    """The processor the rollout renders with: the model's (None for a text model), unless the engine's
    ``generate`` takes no images. Then a vision-language model reads text only (said once in the log;
    tool results' images are left out), and samples that hold images are a one-line config error."""
    import inspect

    from toolrl.models import load_processor

    processor = load_processor(path)
    if processor is None or "images" in inspect.signature(engine_cls.generate).parameters:
        return processor
    if any(s.images for s in samples):
        raise ConfigError(f"engine.name: the {config.engine.name} engine takes no images, and the prompts of "
                          f"the vision-language model {config.model.source} hold some: use an engine that takes "
                          "them (transformers), or leave them out (an environment's images: false)")
    log.warning("the %s engine takes no images: the vision-language model %s reads the prompts' text only",
                config.engine.name, config.model.source)
    return None


def build_engine(config: Config, engine_cls: Any, path: str, tokenizer: Any, module: Any = None) -> Any:
    """The configured engine on the model in ``path`` (``module``: a live model to share, in process).
    An engine that rejects its options with a pydantic error names ``engine.options``."""
    from pydantic import ValidationError

    from toolrl import models
    from toolrl.config import format_errors
    from toolrl.engines import ModelSource

    try:
        return engine_cls.create(
            ModelSource(path=path, module=module, tokenizer=tokenizer),
            {"max_batch_size": config.engine.max_batch_size, "device": models.resolve_device(config.model.device),
             "dtype": config.model.dtype, **config.engine.options},
        )
    except ValidationError as exc:
        raise ConfigError(f"engine.options: {format_errors(exc)}") from None


def build_policy(config: Config, path: str, device: str) -> Any:
    """The model a trainer rank optimises: the one place it is built (adapters wrap it here)."""
    from toolrl import models

    model = models.load_model(path, dtype=config.model.dtype, device=device)
    if config.model.freeze_vision:
        from toolrl.config import ConfigError
        from toolrl.training import vision

        if not vision.is_vision_model(model):
            raise ConfigError(f"model.freeze_vision: {config.model.source!r} has no vision tower")
        vision.freeze_vision(model)
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
                           samples: Sequence[Sample] = (), parts: Parts | None = None,
                           processor: Any = ...) -> Rollouts:
    """Engine and routes (parser, tools, rewards per environment). ``shared_module``: called once the
    tools are up, before the engine loads; returns a live model for the engine to share (in-process
    only), or None: the engine loads its own copy from ``path``. ``samples``: checked against their
    route's tools before any model loads. ``parts``: resolved already (else resolved here);
    ``processor``: :func:`engine_processor`'s, if the caller has it already."""
    from toolrl.rollout.families import renderer_factory

    parts = parts if parts is not None else resolve_parts(config)
    if processor is ...:
        processor = engine_processor(config, parts.engine_cls, path, samples)
    routes, tools = await build_routes(config, samples, parts)
    try:
        module = shared_module() if shared_module is not None else None
        engine = build_engine(config, parts.engine_cls, path, tokenizer, module)
    except BaseException:
        for tool in tools:
            await tool.close()
        raise
    factory = renderer_factory(tokenizer, config.model.chat_format, config.rollout.template_rewrite, processor)
    ctx = RolloutContext(engine=engine, renderer_factory=factory, config=config.rollout, routes=routes)
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


async def compose_local(config: Config, parts: Parts | None = None, samples: Sequence[Sample] | None = None,
                        path: str | None = None) -> LocalRun:
    """Every role in this process. What is not given is resolved here: ``parts``; ``samples``, the
    prompts checked against the tools (default: the training split; recorded groups run none);
    ``path``, the model's directory."""
    from toolrl import models
    from toolrl.data import check_prompt_tokens

    parts = parts if parts is not None else resolve_parts(config)
    if samples is None:
        samples = [] if config.data.trajectories else load_samples(config, envs=parts.envs)
    path = path if path is not None else model_path(config)
    seed_everything(config.trainer.seed)
    tokenizer = models.load_tokenizer(path)
    processor = engine_processor(config, parts.engine_cls, path, samples)
    check_prompt_tokens(samples, tokenizer, path, processor, "the prompts", config.rollout.images)
    built: list[Any] = []

    def trained_model() -> Any:
        built.append(build_policy(config, path, models.resolve_device(config.model.device)))
        # Under LoRA the engine keeps a plain base model of its own and gets merged weights. So it
        # does when rollouts overlap training (max_staleness > 0): the trainer's forward, backward
        # and optimizer steps then never touch the weights the engine decodes with; the engine gets
        # each step's weights by push, between two decode steps.
        return None if config.model.lora or config.trainer.max_staleness > 0 else built[0]

    rollouts = await compose_rollouts(config, path, tokenizer, shared_module=trained_model, samples=samples,
                                      parts=parts)
    return LocalRun(config, path, tokenizer, built[0], rollouts, list(samples))
