"""The rollout process and the local run (docs/architecture.md): a rollout worker builds its engine on its
own copy of the model and one route per environment (:func:`build_rollouts`); without Ray everything runs in
one process (:func:`build_local_run`), the engine sharing the trainer's module, so weight updates cost nothing.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from toolrl import model_sources
from toolrl.config import Config
from toolrl.data.sources import load_samples
from toolrl.engines.build import build_engine, engine_processor
from toolrl.gc_policy import after_startup
from toolrl.model_sources import model_path
from toolrl.processes.resolve import RunPlan, run_plan
from toolrl.processes.run_check import ModelInputs, check_model_inputs
from toolrl.renderers.families import config_renderer_factory
from toolrl.rollout import RolloutContext, run_group, run_rollouts
from toolrl.rollout.routes import Parts, build_routes, resolve_parts
from toolrl.schemas import Sample
from toolrl.tools import Tool
from toolrl.training.policy import build_policy
from toolrl.training.weight_sync import prepare_engine
from toolrl.trajectory import Trajectory


def seed_everything(seed: int) -> None:
    import torch

    random.seed(seed)
    torch.manual_seed(seed)


@dataclass
class Rollouts:
    """The rollout process's parts: an engine, the agent loop's context and the tools it owns."""

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

    async def ready(self) -> None:
        """The engine is this process's: up, with every weight push loaded."""

    @property
    def generating(self) -> Rollouts:
        return self

    def weight_targets(self, version: int) -> list[Any]:
        """The engine: the trainer pushes weights into it between two decode steps."""
        return [self.engine]

    def replace(self, dead: Sequence[Any]) -> None:
        if dead:  # the engine lives in this process: no weight push finds it dead
            raise ValueError("Rollouts.replace: an engine in this process cannot be replaced")

    def take_recoveries(self) -> list[dict[str, Any]]:
        """None ever: the engine is this process (its death is the controller's, for --supervise)."""
        return []

    async def close(self) -> None:
        await self.ctx.close()
        for tool in self.tools:
            await tool.close()
        await self.engine.close()


async def build_rollouts(config: Config, path: str, tokenizer: Any,
                           shared_module: Callable[[], Any] | None = None,
                           samples: Sequence[Sample] = (), parts: Parts | None = None,
                           inputs: ModelInputs | None = None, plan: RunPlan | None = None) -> Rollouts:
    """Engine and routes (parser, tools, rewards per environment). ``shared_module``: called once the
    tools are up, before the engine loads; a live model for the engine to share, or None: the engine
    loads its own copy. ``samples``: checked against their route's tools before any model loads;
    ``parts``, ``inputs``, ``plan``: what the caller resolved already (else done here)."""
    parts = parts if parts is not None else resolve_parts(config)
    plan = plan if plan is not None else run_plan(config, engine_cls=parts.engine_cls)
    if inputs is None:
        processor = engine_processor(config, parts.engine_cls, path, samples)
        # The family's checks: before any model loads.
        inputs = ModelInputs(tokenizer, processor, config_renderer_factory(config, tokenizer, processor))
    routes, tools = await build_routes(config, samples, parts)
    try:
        module = shared_module() if shared_module is not None else None
        engine = build_engine(config, path, tokenizer, module)
        if module is None:
            prepare_engine(engine, config, plan.sync)  # under LoRA: the run's adapters, which the syncs then fill
    except BaseException:
        for tool in tools:
            await tool.close()
        raise
    # Sessions are asked for their turns' state keys only when the estimator reads them (gigpo).
    ctx = RolloutContext(engine=engine, renderer_factory=inputs.renderer_factory, config=config.rollout,
                         routes=routes, state_keys=plan.state_keys, roles=tuple(config.roles),
                         adapters=config.model.adapters is not None)
    after_startup()  # what start-up built stays out of the collections during the steps
    return Rollouts(engine, ctx, tools)


@dataclass
class LocalRun:
    """Every process's parts in this one: the trained model (None for a run that does not train) and an engine
    that shares it."""

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


async def build_local_run(config: Config, parts: Parts | None = None, samples: Sequence[Sample] | None = None,
                        path: str | None = None, inputs: ModelInputs | None = None,
                        plan: RunPlan | None = None, train: bool = True) -> LocalRun:
    """Every process's parts in this one; what is not given is resolved here (``samples``: the training
    split). Without ``train`` no policy is built (``model`` is None): the engine loads what it needs
    itself, and one that loads no weights needs only the tokenizer in ``path``."""
    parts = parts if parts is not None else resolve_parts(config)
    if samples is None:
        samples = [] if config.data.trajectories else load_samples(config, envs=parts.envs)
    path = path if path is not None else model_path(config)
    inputs = inputs if inputs is not None else check_model_inputs(config, parts, path, samples)
    tokenizer = inputs.tokenizer
    seed_everything(config.trainer.seed)
    built: list[Any] = []

    def trained_model() -> Any:
        built.append(build_policy(config, path, model_sources.resolve_device(config.model.device)))
        # Under LoRA (model.lora, or model.adapters' policies) the engine keeps a base model of its own
        # and gets the adapters (or merged weights, for an engine that does not load adapters:
        # toolrl.processes.resolve.run_plan). So it does when rollouts overlap training (max_staleness > 0):
        # the trainer's forward, backward and optimizer steps then never touch the weights the engine
        # decodes with; the engine gets each step's weights by push, between two decode steps.
        own = config.model.lora or config.model.adapters or config.trainer.max_staleness > 0
        return None if own else built[0]

    rollouts = await build_rollouts(config, path, tokenizer, shared_module=trained_model if train else None,
                                      samples=samples, parts=parts, inputs=inputs, plan=plan)
    return LocalRun(config, path, tokenizer, built[0] if built else None, rollouts, list(samples))
