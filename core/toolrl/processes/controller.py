"""The controller: the step loop, top to bottom, over three processes (docs/architecture.md).

Each step: a batch of scored trajectories from the rollout group (:mod:`toolrl.data.batches`), one update
by the trainer group, the new weights to the engines (weight version = steps trained), metrics and
traces, and every ``save_every`` steps a checkpoint. Weights reach the engines only after the whole
update, so an intermediate state is never sampled from. :func:`toolrl.processes.prepare.prepare_training`
checks the whole run before ``output_dir`` is first written; a step that fails gets a ``"failed"`` line in
``metrics.jsonl``.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from toolrl.agent_roles import frozen_roles, role_metrics, role_tokens, trains
from toolrl.config import Config, ConfigError
from toolrl.data.batches import (
    AHEAD,
    GroupStream,
    OneStepOff,
    StepBatch,
    StepBatches,
    batch_for_step,
    open_batches,
)
from toolrl.data.draws import Draws
from toolrl.loggers import open_loggers
from toolrl.processes.evaluate import validate
from toolrl.processes.prepare import Prepared, prepare_training
from toolrl.processes.resolve import resolve_run
from toolrl.processes.start import Processes, start_processes
from toolrl.run_dir import (
    RunDir,
    finalize,
    latest,
    open_mode,
    rollout_metrics,
    staging_dir,
    staleness_metrics,
    step_line,
)
from toolrl.seeds import step_seed
from toolrl.trajectory import Trajectory, call_prefix

# -- checkpoints ----------------------------------------------------------------------------------


async def save_checkpoint(processes: Processes, run_dir: RunDir, step: int, data_position: int,
                          ahead: StepBatch | None = None, draws: Draws | None = None) -> Path:
    """Every rank writes its shards into a staging directory; then the controller publishes it, whole or
    not at all: what fails on the way leaves no staging directory, and the last checkpoint as it was.
    ``data_position``: the groups consumed so far (trained or skipped); later ones start again, except
    ``ahead``: the next step's batch, generated already (``one_step_off``), kept whole; ``draws``: the
    curriculum's state and the prompts of the groups drawn ahead (checked before anything is written)."""
    try:
        curriculum = draws.state() if draws is not None else None
    except ConfigError as exc:
        last = latest(run_dir.checkpoints)
        raise ConfigError(f"{exc}; the checkpoint of step {step} is not written (" + (
            f"--resume continues from {last.name}" if last else "none was written before") + ")") from None
    staged = staging_dir(run_dir.checkpoints, step)
    try:
        await processes.training.save(str(staged), step)
        if ahead is not None:
            ahead.save(staged / AHEAD)
        if draws is not None:
            draws.save(staged, curriculum)
        meta = {"world_size": processes.training.world_size, "data_position": data_position}
        return finalize(run_dir.checkpoints, staged, step, meta, keep=processes.config.trainer.keep_checkpoints)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise


def record_recoveries(processes: Processes, run_dir: RunDir, step: int) -> list[dict[str, Any]]:
    """The recoveries since the last call (trainer ranks, rollout workers), written to
    ``recoveries.jsonl`` (``step``: the step in progress), with ``placement.json`` kept current; their
    rows, for the metrics."""
    rows = processes.training.take_recoveries() + processes.rollouts.take_recoveries()
    for row in rows:
        run_dir.append_recovery({"step": step, **row})
        if row.get("ranks"):  # a re-formed trainer group runs elsewhere now
            processes.placement["trainer"] = row["ranks"]
        elif row.get("worker"):  # so does a replaced rollout worker
            processes.placement["rollout_workers"][row["index"]] = row["worker"]
    if rows:
        run_dir.write_placement(processes.placement)
    return rows


def recovery_metrics(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A step's figures of the recoveries since the last row: how many, the seconds they took, the
    trained steps they lost."""
    return {"recoveries": len(rows), "recovery_s": sum(r["recovery_s"] for r in rows),
            "steps_lost": sum(r["steps_lost"] for r in rows)}


def success_bar(config: Config) -> float | None:
    """The reward at which a role succeeds (its ``role/NAME/success``): ``eval.success_threshold`` when
    success is the reward (``eval.metric`` None); a term decides it otherwise, which no role has alone."""
    return config.eval.success_threshold if config.eval.metric is None else None


def record_failure(run_dir: RunDir, step: int, exc: BaseException, trajs: Sequence[Trajectory], tokenizer: Any,
                   wall_s: float) -> None:
    """A step that failed half-way still leaves its record: the trajectories that finished, and a
    metrics line saying what failed."""
    row: dict[str, Any] = {"step": step, "failed": f"{type(exc).__name__}: {exc}".strip()}
    trajs = trajs or getattr(exc, "trajectories", [])  # a rollout group that failed part-way
    if trajs:
        run_dir.write_traces(step, trajs, tokenizer)
        row.update(rollout_metrics(trajs, wall_s))
    run_dir.append_metrics(row)


# -- the loops ------------------------------------------------------------------------------------

def _progress(enabled: bool, total: int, start: int) -> Any:
    progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("reward {task.fields[reward]:.3f}  tools/traj {task.fields[tools]:.2f}  "
                                   "{task.fields[tps]:.0f} tok/s"), TimeElapsedColumn(), disable=not enabled)
    task = progress.add_task("steps", total=total, completed=start, reward=0.0, tools=0.0, tps=0.0)
    return progress, task


async def train_async(config: Config, resume: bool = False, overwrite: bool = False) -> Path:
    """``toolrl train``: the run prepared for its first step (:func:`toolrl.processes.prepare.prepare_training`:
    checked whole, processes up, weights in place, ``trainer.output_dir`` first written), then trained
    (continuing the run there with ``resume``, replacing it with ``overwrite``)."""
    prepared = await prepare_training(config, resume, overwrite)
    run_dir = prepared.run_dir
    try:
        await train(prepared)
    finally:  # the trajectories that ended in errors, also when the run stops on an error of its own
        run_dir.failures.report()
    run_dir.failures.check()
    return run_dir.path


async def train(prepared: Prepared) -> None:
    """The step loop, from ``prepared.start`` to ``trainer.total_steps``."""
    run, run_dir, processes, draws = prepared.run, prepared.run_dir, prepared.processes, prepared.draws
    config = run.config
    start, ahead, recovered = prepared.start, prepared.ahead, prepared.recovered
    batches: StepBatches | OneStepOff | GroupStream | None = None
    try:
        # Distillation: the teachers score each group as it is generated (toolrl.data.batches.Finishing).
        batches = open_batches(processes.rollouts, draws, config, prepared.position, version=start,
                               ahead=ahead, finish=None if prepared.teachers is None else prepared.teachers.score)
        progress, bar = _progress(config.trainer.progress, config.trainer.total_steps, start)
        with progress, open_loggers(config, run_dir.path, start) as loggers:
            for step in range(start, config.trainer.total_steps):
                t0 = time.perf_counter()
                batch = StepBatch()
                try:
                    # Synchronous: generates the step's groups now. Streaming: waits for the next
                    # groups in order (most generated while earlier steps trained).
                    batch = await batches.next(step)
                    # The curriculum sees the step's groups before any later group is drawn (docs/curricula.md).
                    draws.observe(batch.by_group(), step + 1)
                    wait_s = time.perf_counter() - t0
                    t1 = time.perf_counter()
                    # A step whose groups were all skipped (dynamic sampling's cap) trains nothing.
                    trained = await processes.training.step(batch.trajectories, step + 1) if batch.trajectories else {}
                    # Each trained trajectory's advantage, for its trace (not a metric).
                    advantages = dict(zip((t.trajectory_id for t in batch.trajectories), trained.pop("advantages", []),
                                          strict=False))
                    trainer_lp = trained.pop("trainer_logprobs", {})
                    settling = time.perf_counter()
                    ahead = await batches.settle()  # one_step_off: the next batch is whole before the weights change
                    settled = time.perf_counter() - settling  # waiting for rollouts, not training
                    wait_s += settled
                    sync = await processes.sync_weights(step + 1)
                    batches.set_version(step + 1)  # groups waiting for these weights start now
                    row = {"step": step + 1, **rollout_metrics(batch.generated, batch.rollout_s),
                           "rollout_wait_s": wait_s, **batch.metrics(),
                           **staleness_metrics(batch.trajectories, step + 1), **draws.metrics(), **trained, **sync,
                           **(batch.finish_metrics(t0, "teacher") if prepared.teachers is not None else {}),
                           "train_s": time.perf_counter() - t1 - settled, "step_s": time.perf_counter() - t0,
                           **recovery_metrics(recovered + record_recoveries(processes, run_dir, step + 1))}
                    recovered = []
                    row |= {**role_metrics(batch.generated, success_bar(config)), **role_tokens(
                        [t for t in batch.trajectories if trains(t, frozen_roles(config))])}
                    if config.trainer.eval_every and (step + 1) % config.trainer.eval_every == 0:
                        row.update(await validate(processes, run, run_dir, step + 1))
                    run_dir.write_traces(step + 1, batch.generated, processes.tokenizer, advantages, trainer_lp)
                    loggers.log(row, step + 1)
                    if (step + 1) % config.trainer.save_every == 0 or step + 1 == config.trainer.total_steps:
                        await save_checkpoint(processes, run_dir, step + 1, batch.end, ahead, draws)
                        recovered = record_recoveries(processes, run_dir, step + 1)  # in the next row
                except Exception as exc:
                    record_recoveries(processes, run_dir, step + 1)
                    record_failure(run_dir, step + 1, exc, batch.generated, processes.tokenizer, time.perf_counter() - t0)
                    raise
                progress.update(bar, advance=1, reward=row["reward_mean"], tools=row["tool_call_rate"],
                                tps=row["tokens_per_s"])
                progress.console.print(step_line(row), highlight=False, soft_wrap=True)  # a log file gets whole lines
    finally:
        if batches is not None:
            await batches.close()  # groups still in flight: a resumed run generates them again
        await processes.close()
        if prepared.teachers is not None:
            await prepared.teachers.close()
    if config.trainer.plot:
        run_dir.plot_curve()


async def rollout_async(config: Config, overwrite: bool = False) -> Path:
    """``toolrl rollout``: the training steps' batches generated and scored, nothing trained; the same
    records as training in ``trainer.output_dir`` (an earlier run there is replaced only with ``overwrite``)."""
    run = resolve_run(config, "rollout")
    run_dir = RunDir.open(config.trainer.output_dir, open_mode(False, overwrite), resumable=False)
    processes = await start_processes(run, train=False)
    progress, bar = _progress(config.trainer.progress, config.trainer.total_steps, 0)
    try:
        run_dir.start(config)
        with progress:
            for step in range(config.trainer.total_steps):
                t0 = time.perf_counter()
                prompts = batch_for_step(run.samples, step, config.data.batch_size, config.trainer.seed,
                                         config.data.shuffle)
                trajs = await processes.rollouts.run(prompts, config.rollout.n, seed=step_seed(config.rollout.seed, step),
                                                 id_prefix=call_prefix("e", step + 1))
                row = {"step": step + 1, **rollout_metrics(trajs, time.perf_counter() - t0),
                       **role_metrics(trajs, success_bar(config))}
                run_dir.write_traces(step + 1, trajs, processes.tokenizer)
                run_dir.append_metrics(row)
                progress.update(bar, advance=1, reward=row["reward_mean"], tools=row["tool_call_rate"],
                                tps=row["tokens_per_s"])
    finally:
        await processes.close()
        run_dir.failures.report()
    if config.trainer.plot:
        run_dir.plot_curve()
    run_dir.failures.check()
    return run_dir.path


def run_training(config: Config, resume: bool = False, overwrite: bool = False) -> Path:
    return asyncio.run(train_async(config, resume, overwrite))


def run_rollout(config: Config, overwrite: bool = False) -> Path:
    return asyncio.run(rollout_async(config, overwrite))
