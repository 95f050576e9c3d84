"""The training loop: compose parts from the registry, roll out, score, update, record.

``output_dir`` receives ``metrics.jsonl`` (one line per step), ``rollouts/step_NNNNN.jsonl`` (every
trajectory: token ids, response_mask, logprobs, decoded text, reward, tool calls), ``checkpoints/``
(written atomically; ``--resume`` restores model, optimizer, step and RNG) and ``reward_curve.png``.
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolrl import lora
from toolrl.config import Config, ConfigError, resolve_path
from toolrl.rollout import RolloutContext, Task, Trajectory, run_rollouts
from toolrl.rundir import (
    _prepare_output,
    _truncate_metrics,
    append_metrics,
    plot_curve,
    rollout_metrics,
    write_traces,
)
from toolrl.schemas import Message, Sample
from toolrl.tools import Tool

# -- composition ----------------------------------------------------------------------------------


def model_path(config: Config) -> str:
    from toolrl.models import resolve_source

    return resolve_source(config.model, config.base_dir)


def load_samples(config: Config) -> list[Sample]:
    from toolrl.data import arithmetic_samples
    from toolrl.data import load_samples as load_files

    samples = load_files([resolve_path(config, f) for f in config.data.train_files]) if config.data.train_files \
        else arithmetic_samples(config.data.synthetic)  # type: ignore[arg-type]
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


@dataclass
class Run:
    config: Config
    tokenizer: Any
    model: Any
    engine: Any
    ctx: RolloutContext
    samples: list[Sample]
    tools: dict[str, Tool]
    model_dir: str


async def compose(config: Config) -> Run:
    import torch

    from toolrl import models
    from toolrl.chat import ChatRenderer
    from toolrl.data import check_samples_against_tools
    from toolrl.engines import ModelSource
    from toolrl.plugins import get_plugins
    from toolrl.registry import RegistryError

    random.seed(config.trainer.seed)
    torch.manual_seed(config.trainer.seed)
    plugins = get_plugins()
    try:
        engine_cls = plugins.load_part("rollout_engines", config.engine.name)
        parser = plugins.load_part("tool_parsers", config.rollout.parser)(**config.rollout.parser_options)
    except RegistryError as exc:
        raise ConfigError(f"engine.name / rollout.parser: {exc}") from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"rollout.parser_options: {exc}") from None
    rewards = build_rewards(config)
    samples = load_samples(config)
    tools = await build_tools(config)
    check_samples_against_tools(samples, tools, "data")
    tasks = build_tasks(config, tools)
    path = model_path(config)
    tokenizer = models.load_tokenizer(path)
    device = models.resolve_device(config.model.device)
    model = models.load_model(path, dtype=config.model.dtype, device=device)
    if config.model.lora is not None:
        lora.apply_lora(model, config.model.lora)
    if config.model.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    engine = engine_cls.create(
        # Under LoRA the engine keeps its own base model and gets merged weights (lora.engine_state_dict).
        ModelSource(path=path, module=None if config.model.lora else model, tokenizer=tokenizer),
        {"max_batch_size": config.engine.max_batch_size, "device": device, "dtype": config.model.dtype,
         **config.engine.options},
    )
    ctx = RolloutContext(engine=engine, renderer_factory=lambda schemas: ChatRenderer(tokenizer, schemas),
                         parser=parser, config=config.rollout, tasks=tasks, reward_functions=rewards,
                         reward_config=config.reward)
    return Run(config, tokenizer, model, engine, ctx, samples, tools, path)


def batch_for_step(samples: Sequence[Sample], step: int, batch_size: int, seed: int, shuffle: bool) -> list[Sample]:
    """The prompts of a step: a pure function of the step, so resuming replays the same data."""
    out = []
    for k in range(step * batch_size, (step + 1) * batch_size):
        epoch, pos = divmod(k, len(samples))
        order = list(range(len(samples)))
        if shuffle:
            random.Random(seed * 1_000_003 + epoch).shuffle(order)
        out.append(samples[order[pos]])
    return out


# -- checkpoints ----------------------------------------------------------------------------------


def save_checkpoint(ckpt_dir: Path, step: int, model: Any, optimizer: Any, keep: int = 2) -> Path:
    """Write to a temporary directory, then rename: a crash never leaves a half checkpoint."""
    import torch

    ckpt_dir.mkdir(parents=True, exist_ok=True)
    final = ckpt_dir / f"step_{step:06d}"
    tmp = ckpt_dir / f".tmp_step_{step:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    torch.save({k: v.detach().cpu() for k, v in lora.checkpoint_state_dict(model).items()}, tmp / "model.pt")
    torch.save({"optimizer": optimizer.state_dict(), "step": step, "python_rng": random.getstate(),
                "torch_rng": torch.get_rng_state()}, tmp / "trainer.pt")
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    for old in sorted(ckpt_dir.glob("step_*"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(ckpt_dir: Path) -> Path | None:
    found = sorted(ckpt_dir.glob("step_*"))
    return found[-1] if found else None


def load_checkpoint(path: Path, model: Any, optimizer: Any) -> int:
    import torch

    lora.load_checkpoint_state_dict(model, torch.load(path / "model.pt", map_location=next(model.parameters()).device))
    state = torch.load(path / "trainer.pt", weights_only=False)
    optimizer.load_state_dict(state["optimizer"])
    random.setstate(state["python_rng"])
    torch.set_rng_state(state["torch_rng"])
    return int(state["step"])


# -- the loops ------------------------------------------------------------------------------------


def _progress(enabled: bool, total: int, start: int) -> Any:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("reward {task.fields[reward]:.3f}  tools/traj {task.fields[tools]:.2f}  "
                                   "{task.fields[tps]:.0f} tok/s"), TimeElapsedColumn(), disable=not enabled)
    task = progress.add_task("steps", total=total, completed=start, reward=0.0, tools=0.0, tps=0.0)
    return progress, task


async def _rollout_pool(config: Config) -> Any:
    """Rollout workers on Ray, up and running, when ``ray.address`` is set; None: rollouts run here."""
    if config.ray.address is None:
        return None
    from toolrl.distributed import RolloutWorkerPool

    pool = RolloutWorkerPool(config, config.ray.num_rollout_workers, config.ray.address,
                             num_cpus_per_worker=config.ray.num_cpus_per_worker,
                             num_gpus_per_worker=config.ray.num_gpus_per_worker)
    try:
        await pool.start()
    except BaseException:
        pool.close()
        raise
    return pool


async def _rollouts(run: Run, pool: Any, prompts: list[Sample], seed: int, id_prefix: str) -> list[Trajectory]:
    if pool is None:
        return await run_rollouts(run.ctx, prompts, run.config.rollout.n, seed=seed, id_prefix=id_prefix)
    return await pool.run(prompts, run.config.rollout.n, seed=seed, id_prefix=id_prefix)


async def _close(run: Run, pool: Any = None) -> None:
    if pool is not None:
        pool.close()
    for tool in run.tools.values():
        await tool.close()
    await run.engine.close()


async def train_async(config: Config, resume: bool = False) -> Path:
    import torch

    from toolrl.grpo import grpo_step

    out = _prepare_output(config, resume)
    run = await compose(config)
    model = run.model
    optimizer = torch.optim.AdamW(lora.trainable_parameters(model), lr=config.optim.lr, betas=config.optim.betas,
                                  weight_decay=config.optim.weight_decay)
    ref_model = None
    if config.algorithm.kl_coef > 0:
        import copy

        ref_model = copy.deepcopy(model).eval().requires_grad_(False)
    start = 0
    ckpt = latest_checkpoint(out / "checkpoints") if resume else None
    if resume and ckpt is None:
        raise ConfigError(f"--resume: no checkpoint in {out / 'checkpoints'}")
    if ckpt is not None:
        start = load_checkpoint(ckpt, model, optimizer)
        run.engine.update_weights(lora.engine_state_dict(model))  # engines that do not share the module
        _truncate_metrics(out / "metrics.jsonl", start)
    pad_id = run.tokenizer.pad_token_id if run.tokenizer.pad_token_id is not None else 0
    progress, bar = _progress(config.trainer.progress, config.trainer.total_steps, start)
    pool = None
    try:
        pool = await _rollout_pool(config)
        if pool is not None:
            await pool.broadcast(lora.engine_state_dict(model))  # the workers start from the trainer's weights
        with progress:
            for step in range(start, config.trainer.total_steps):
                t0 = time.perf_counter()
                prompts = batch_for_step(run.samples, step, config.data.batch_size, config.trainer.seed,
                                         config.data.shuffle)
                model.eval()
                trajs = await _rollouts(run, pool, prompts, seed=config.rollout.seed + 7_777 * step,
                                        id_prefix=f"t{step + 1}-")
                rollout_s = time.perf_counter() - t0
                t1 = time.perf_counter()
                train = await asyncio.to_thread(
                    grpo_step, model, optimizer, trajs, config.algorithm, config.optim, pad_id=pad_id,
                    temperature=config.rollout.temperature, max_response_tokens=config.rollout.max_response_tokens,
                    ref_model=ref_model)
                weights = lora.engine_state_dict(model)  # LoRA merged in, under the base model's names
                run.engine.update_weights(weights)
                if pool is not None:
                    await pool.broadcast(weights)
                row = {"step": step + 1, **rollout_metrics(trajs, rollout_s), **train,
                       "train_s": time.perf_counter() - t1, "step_s": time.perf_counter() - t0}
                write_traces(out / "rollouts" / f"step_{step + 1:05d}.jsonl", trajs, run.tokenizer)
                append_metrics(out / "metrics.jsonl", row)
                if (step + 1) % config.trainer.save_every == 0 or step + 1 == config.trainer.total_steps:
                    save_checkpoint(out / "checkpoints", step + 1, model, optimizer)
                progress.update(bar, advance=1, reward=row["reward_mean"], tools=row["tool_call_rate"],
                                tps=row["tokens_per_s"])
                progress.console.print(
                    f"step {step + 1}: reward {row['reward_mean']:.3f}±{row['reward_std']:.3f} "
                    f"tool calls {row['tool_call_count']} ok {row['tool_success_count']} "
                    f"loss {row.get('loss', 0):.4f} {row['step_s']:.1f}s", highlight=False)
    finally:
        await _close(run, pool)
    if config.trainer.plot:
        plot_curve(out)
    return out


async def evaluate_async(config: Config) -> Path:
    out = _prepare_output(config, resume=False)
    run = await compose(config)
    run.model.eval()
    progress, bar = _progress(config.trainer.progress, config.trainer.total_steps, 0)
    pool = None
    try:
        pool = await _rollout_pool(config)
        with progress:
            for step in range(config.trainer.total_steps):
                t0 = time.perf_counter()
                prompts = batch_for_step(run.samples, step, config.data.batch_size, config.trainer.seed,
                                         config.data.shuffle)
                trajs = await _rollouts(run, pool, prompts, seed=config.rollout.seed + 7_777 * step,
                                        id_prefix=f"e{step + 1}-")
                row = {"step": step + 1, **rollout_metrics(trajs, time.perf_counter() - t0)}
                write_traces(out / "rollouts" / f"step_{step + 1:05d}.jsonl", trajs, run.tokenizer)
                append_metrics(out / "metrics.jsonl", row)
                progress.update(bar, advance=1, reward=row["reward_mean"], tools=row["tool_call_rate"],
                                tps=row["tokens_per_s"])
    finally:
        await _close(run, pool)
    if config.trainer.plot:
        plot_curve(out)
    return out


def run_training(config: Config, resume: bool = False) -> Path:
    return asyncio.run(train_async(config, resume))


def run_evaluation(config: Config) -> Path:
    return asyncio.run(evaluate_async(config))
