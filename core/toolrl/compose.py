"""Composition per role: each role builds only what it runs.

- the controller (driver): data (:func:`load_samples`), the tokenizer (traces), no model, no engine
  when the work is on Ray;
- a rollout worker: its engine (which loads its own model from the path), parser, tools, rewards
  (:func:`compose_rollouts`);
- a trainer rank: its model (:func:`build_policy`, the one place the trained model is built) and
  optimizer.

Without Ray every role runs in one process (:func:`compose_local`): the in-process engine then shares
the trainer's module, so weight updates cost nothing.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolrl.config import Config, ConfigError, resolve_path
from toolrl.rollout import RolloutContext, Task, Trajectory, run_rollouts
from toolrl.schemas import Message, Sample
from toolrl.tools import Tool


def model_path(config: Config) -> str:
    from toolrl.models import resolve_source

    return resolve_source(config.model, config.base_dir)


def seed_everything(seed: int) -> None:
    import torch

    random.seed(seed)
    torch.manual_seed(seed)


def load_samples(config: Config, split: str = "train") -> list[Sample]:
    """The samples of ``split``: ``"train"`` (training) or ``"test"`` (the held-out split, evaluation)."""
    from toolrl.data import arithmetic_samples
    from toolrl.data import load_samples as load_files

    if split not in ("train", "test"):
        raise ConfigError(f"unknown data split {split!r} (use train or test)")
    if split == "train" and config.data.trajectories:  # recorded groups, trained on as they are
        from toolrl.recorded import load_groups

        return load_groups(config)
    files = config.data.train_files if split == "train" else config.data.test_files
    if files:
        samples = load_files([resolve_path(config, f) for f in files], f"data.{split}_files")
    elif split == "train" and config.data.synthetic is not None:
        samples = arithmetic_samples(config.data.synthetic)
    else:
        raise ConfigError(f"data.{split}_files: no {split} split configured")
    prefix = [Message.model_validate(m) for m in config.data.prompt_prefix]
    for s in samples:
        head = 1 if s.prompt and s.prompt[0].role == "system" else 0
        s.prompt[head:head] = [m.model_copy() for m in prefix]
        if config.data.system_prompt and not head:
            s.prompt.insert(0, Message(role="system", content=config.data.system_prompt))
    return samples


async def build_tools(config: Config) -> dict[str, Tool]:
    from toolrl.toolconfig import ToolsFile, load_tools_file, parse_tools_config
    from toolrl.toolconfig import build_tools as build

    files: list[ToolsFile] = []
    if config.tools.config_path:
        files.append(load_tools_file(resolve_path(config, config.tools.config_path)))
    if config.tools.entries:
        files.append(parse_tools_config({"tools": config.tools.entries}, Path(config.base_dir)))
    tools: dict[str, Tool] = {}
    for f in files:
        for name, tool in (await build(f)).items():
            if name in tools:
                raise ConfigError(f"tools: two tools are named {name!r}")
            tools[name] = tool
    return tools


def build_tasks(config: Config, tools: dict[str, Tool]) -> dict[str | None, Task]:
    tasks: dict[str | None, Task] = {None: Task(tools, config.rollout.max_turns)}
    for name, task in config.tasks.items():
        selected = tools if task.tools is None else {}
        for tool_name in task.tools or []:
            if tool_name not in tools:
                raise ConfigError(f"tasks.{name}.tools: unknown tool {tool_name!r} (configured: {', '.join(tools)})")
            selected[tool_name] = tools[tool_name]
        tasks[name] = Task(selected, task.max_turns or config.rollout.max_turns)
    return tasks


def build_rewards(config: Config) -> list[tuple[str, float, Any]]:
    from toolrl.plugins import get_plugins
    from toolrl.registry import RegistryError

    out = []
    for i, term in enumerate(config.reward.functions):
        try:
            cls = get_plugins().load_part("reward_functions", term.name)
            out.append((term.name, term.weight, cls(**term.options)))
        except (RegistryError, TypeError, ValueError) as exc:
            raise ConfigError(f"reward.functions.{i}: {exc}") from None
    return out


def check_parts(config: Config) -> tuple[Any, Any]:
    """The engine class and a parser, resolved by name: a typo fails here, before anything loads."""
    from toolrl.plugins import get_plugins
    from toolrl.registry import RegistryError

    plugins = get_plugins()
    try:
        engine_cls = plugins.load_part("rollout_engines", config.engine.name)
        parser = plugins.load_part("tool_parsers", config.rollout.parser)(**config.rollout.parser_options)
    except RegistryError as exc:
        raise ConfigError(f"engine.name / rollout.parser: {exc}") from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"rollout.parser_options: {exc}") from None
    build_rewards(config)
    return engine_cls, parser


def build_policy(config: Config, path: str, device: str) -> Any:
    """The model a trainer rank optimises: the one place it is built (adapters wrap it here)."""
    from toolrl import models

    model = models.load_model(path, dtype=config.model.dtype, device=device)
    if config.model.lora is not None:
        from toolrl import lora

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
    tools: dict[str, Tool]

    async def run(self, samples: Sequence[Sample], n: int, seed: int, id_prefix: str = "") -> list[Trajectory]:
        return await run_rollouts(self.ctx, samples, n, seed=seed, id_prefix=id_prefix)

    async def check_trainable(self) -> str | None:
        return await self.engine.check_trainable()

    async def close(self) -> None:
        for tool in self.tools.values():
            await tool.close()
        await self.engine.close()


async def compose_rollouts(config: Config, path: str, tokenizer: Any,
                           shared_module: Callable[[], Any] | None = None,
                           samples: Sequence[Sample] = ()) -> Rollouts:
    """Engine, parser, tools and rewards. ``shared_module``: called once the tools are up, before the
    engine loads; returns a live model for the engine to share (in-process only), or None: the engine
    loads its own copy from ``path``. ``samples``: checked against the tools before any model loads."""
    from toolrl import models
    from toolrl.chat import ChatRenderer
    from toolrl.data import check_samples_against_tools
    from toolrl.engines import ModelSource

    engine_cls, parser = check_parts(config)
    rewards = build_rewards(config)
    tools = await build_tools(config)
    try:
        tasks = build_tasks(config, tools)
        check_samples_against_tools(samples, tools, "data")
        module = shared_module() if shared_module is not None else None
        engine = engine_cls.create(
            ModelSource(path=path, module=module, tokenizer=tokenizer),
            {"max_batch_size": config.engine.max_batch_size, "device": models.resolve_device(config.model.device),
             "dtype": config.model.dtype, **config.engine.options},
        )
    except BaseException:
        for tool in tools.values():
            await tool.close()
        raise
    ctx = RolloutContext(engine=engine, renderer_factory=lambda schemas: ChatRenderer(tokenizer, schemas),
                         parser=parser, config=config.rollout, tasks=tasks, reward_functions=rewards,
                         reward_config=config.reward)
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
    samples = load_samples(config, split)
    path = model_path(config)
    tokenizer = models.load_tokenizer(path)
    built: list[Any] = []

    def trained_model() -> Any:
        built.append(build_policy(config, path, models.resolve_device(config.model.device)))
        # Under LoRA the engine keeps a plain base model of its own and gets merged weights.
        return None if config.model.lora else built[0]

    rollouts = await compose_rollouts(config, path, tokenizer, shared_module=trained_model, samples=samples)
    return LocalRun(config, path, tokenizer, built[0], rollouts, samples)
