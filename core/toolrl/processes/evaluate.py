"""Evaluation on the held-out split: ``toolrl eval`` and validation during training, through the same
processes and rollout loop as training. What is sampled, what succeeds, how ``pass@k`` and ``pass^k``
are estimated, why infrastructure failures are no tries, and what is written: docs/evaluation.md.
"""

from __future__ import annotations

import asyncio
import math
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from toolrl.config import Config, ConfigError, read_json
from toolrl.data import read_rows
from toolrl.data.batches import RolloutGroup
from toolrl.environments import ConfiguredEnv
from toolrl.processes.in_process import Rollouts
from toolrl.processes.resolve import ResolvedRun, resolve_run
from toolrl.processes.start import start_processes
from toolrl.run_dir import RunDir, open_mode, problem_results
from toolrl.schemas import Sample
from toolrl.seeds import step_seed
from toolrl.trajectory import Trajectory, call_prefix


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem with ``c`` successes among ``n`` samples: 1 - C(n-c, k) / C(n, k),
    as a product (no huge binomials)."""
    if not 0 <= c <= n or not 0 < k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 0 < k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


def pass_hat_k(n: int, c: int, k: int) -> float:
    """Unbiased pass^k of one problem with ``c`` successes among ``n`` tries (τ-bench): the chance that
    k tries drawn without replacement all succeed, C(c, k) / C(n, k), as a product."""
    if not 0 <= c <= n or not 0 < k <= n:
        raise ValueError(f"pass^k needs 0 <= c <= n and 0 < k <= n, got n={n} c={c} k={k}")
    return math.prod((c - i) / (n - i) for i in range(k))


def turn_outcomes(traj: Trajectory) -> list[bool]:
    """One entry per model turn that made tool calls: whether every call it made returned ``ok``."""
    turns: dict[int, bool] = {}
    for r in traj.tool_results:
        turns[r.turn] = turns.get(r.turn, True) and r.status == "ok"
    return list(turns.values())


def success(traj: Trajectory, config: Config) -> bool:
    value = traj.reward if config.eval.metric is None else traj.reward_terms.get(config.eval.metric, 0.0)
    return traj.error is None and value >= config.eval.success_threshold


def _sampling(rollouts: RolloutGroup, config: Config) -> RolloutGroup:
    """``rollouts`` sampling at ``eval.temperature``. In process: a view sharing the engine, tools and
    renderers; Ray workers keep their own config (the config requires equal temperatures there)."""
    rollouts = rollouts.generating  # training on recorded groups: the engine they stand in for
    if not isinstance(rollouts, Rollouts) or rollouts.ctx.config.temperature == config.eval.temperature:
        return rollouts
    ctx = replace(rollouts.ctx, config=rollouts.ctx.config.model_copy(update={"temperature": config.eval.temperature}))
    return Rollouts(rollouts.engine, ctx, rollouts.tools)


async def run_problems(rollouts: RolloutGroup, config: Config, samples: Sequence[Sample],
                       advance: Callable[[int], None] = lambda done: None) -> list[tuple[Sample, int, Trajectory]]:
    """``eval.n`` trajectories per problem as ``(problem, k, trajectory)``. Problems go to the rollout
    group in chunks that fill its concurrency (``advance`` is told after each); chunk c is seeded as
    the controller seeds step c (:func:`~toolrl.seeds.step_seed`)."""
    n = config.eval.n
    workers = config.ray.num_rollout_workers if config.ray.address is not None else 1
    size = max(1, config.rollout.max_concurrent_trajectories * workers // n)
    out: list[tuple[Sample, int, Trajectory]] = []
    for c, start in enumerate(range(0, len(samples), size)):
        chunk = samples[start:start + size]
        trajs = await rollouts.run(chunk, n, seed=step_seed(config.rollout.seed, c), id_prefix=call_prefix("eval", c))
        seen: Counter[int] = Counter()
        for t in trajs:
            if t.termination == "forked":  # a closed piece; its trajectory is scored on its last piece
                continue
            out.append((chunk[t.group], seen[t.group], t))
            seen[t.group] += 1
        advance(len(chunk))
    return out


def result_rows(results: Sequence[tuple[Sample, int, Trajectory]], config: Config, tokenizer: Any) -> list[dict[str, Any]]:
    return [{"problem": sample.index, "k": k, "success": success(t, config),
             "tool_calls": [{"name": r.name, "arguments": r.arguments, "status": r.status, "latency_s": r.latency_s}
                            for r in t.tool_results],
             **t.model_dump(mode="json", exclude={"model_text"}),
             "prompt_text": tokenizer.decode(t.prompt_ids, skip_special_tokens=False),
             "response_text": tokenizer.decode(t.response_ids, skip_special_tokens=False)}
            for sample, k, t in results]


def summarize(results: Sequence[tuple[Sample, int, Trajectory]], config: Config, wall_s: float) -> dict[str, Any]:
    """The figures of ``summary.json``; a figure with nothing to average (no tool calls) is None."""
    n = config.eval.n
    scored = [(sample, t) for sample, _, t in results if t.termination != "infra_error"]
    per_problem: dict[int, list[bool]] = {}
    for sample, t in scored:
        per_problem.setdefault(id(sample), []).append(success(t, config))
    complete = [s for s in per_problem.values() if len(s) >= n]  # pass@k, pass^k: unbiased from n tries
    trajs = [t for _, t in scored]
    rewards = [t.reward for t in trajs]
    calls = [r for t in trajs for r in t.tool_results]
    call_turns = [ok for t in trajs for ok in turn_outcomes(t)]
    solved = [t for t in trajs if success(t, config)]
    count = max(len(trajs), 1)
    summary = {
        "num_samples": len({id(sample) for sample, _, _ in results}),
        "n": n,
        "num_trajectories": len(results),
        "temperature": config.eval.temperature,
        "metric": config.eval.metric or "reward",
        "success_threshold": config.eval.success_threshold,
        "reward_mean": statistics.fmean(rewards) if rewards else math.nan,
        "reward_std": statistics.pstdev(rewards) if len(rewards) > 1 else 0.0,
        "pass@1": statistics.fmean(pass_at_k(len(s), sum(s), 1) for s in per_problem.values()) if per_problem else math.nan,
        "k": n,
        "pass@k": statistics.fmean(pass_at_k(len(s), sum(s), n) for s in complete) if complete else math.nan,
        "pass^k": statistics.fmean(pass_hat_k(len(s), sum(s), n) for s in complete) if complete else math.nan,
        "tool_calls_per_trajectory": len(calls) / count,
        "tool_success_rate": sum(r.status == "ok" for r in calls) / len(calls) if calls else math.nan,
        "turn_success_rate": statistics.fmean(call_turns) if call_turns else math.nan,
        "tool_latency_s_mean": statistics.fmean(r.latency_s for r in calls) if calls else math.nan,
        "generation_s_mean": statistics.fmean(t.generation_s for t in trajs) if trajs else math.nan,
        "turns_mean": sum(t.turns for t in trajs) / count,
        "solved_turns_mean": statistics.fmean(t.turns for t in solved) if solved else math.nan,
        "solved_tool_calls_mean": statistics.fmean(len(t.tool_results) for t in solved) if solved else math.nan,
        "response_tokens_mean": sum(len(t.response_ids) for t in trajs) / count,
        "terminations": dict(Counter(t.termination for _, _, t in results)),
        "errors": sum(t.error is not None for t in trajs),
        "infra_failures": len(results) - len(scored),
        "wall_s": wall_s,
    }
    return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in summary.items()}


# -- toolrl eval ----------------------------------------------------------------------------------


async def evaluate_async(config: Config, output: Path, progress: bool | None = None,
                         overwrite: bool = False) -> dict[str, Any]:
    """``toolrl eval``: resolve and check the evaluation, then evaluate into ``output`` (a directory
    holding an earlier evaluation only with ``overwrite``) and return the summary."""
    run = resolve_run(config, "eval")
    run_dir = RunDir.open(output, open_mode(False, overwrite), field="--output", resumable=False)
    try:
        summary = await evaluate(run, run_dir, progress)
    finally:
        run_dir.failures.report()
    run_dir.failures.check()
    return summary


async def evaluate(run: ResolvedRun, run_dir: RunDir, progress: bool | None = None) -> dict[str, Any]:
    """Write ``results.jsonl`` and ``summary.json`` into ``run_dir``, return the summary. ``progress``:
    a progress bar (default: when stderr is a terminal)."""
    config, samples = run.config, run.eval_samples
    # Every engine samples at eval.temperature (Ray workers get this config too).
    sampling = config.model_copy(update={"rollout": config.rollout.model_copy(update={"temperature": config.eval.temperature})})
    console = Console(stderr=True)
    shown = console.is_terminal if progress is None else progress
    bar = Progress(TextColumn("[bold]eval"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console,
                   disable=not shown)
    # Into a log file (stderr not a terminal): a plain line at each tenth of the problems instead.
    lines_every = max(1, len(samples) // 10) if progress is None and not shown else 0
    finished = 0

    def advance(done: int) -> None:
        nonlocal finished
        bar.advance(task, done)
        before, finished = finished, finished + done
        if lines_every and (finished // lines_every > before // lines_every or finished == len(samples)):
            print(f"eval: {finished}/{len(samples)} problems, {time.perf_counter() - t0:.0f} s", file=sys.stderr,
                  flush=True)

    processes = await start_processes(replace(run, config=sampling), train=False)
    try:
        run_dir.start(config)
        with bar:
            task = bar.add_task("eval", total=len(samples))
            t0 = time.perf_counter()
            results = await run_problems(processes.rollouts, config, samples, advance)
            wall_s = time.perf_counter() - t0
    finally:
        await processes.close()
    rows = result_rows(results, config, processes.tokenizer)
    summary = {"model": config.model.source, "engine": config.engine.name, **summarize(results, config, wall_s)}
    if reports := environment_reports(run.parts.envs, rows):
        summary["reports"] = reports
    run_dir.failures.add(t for *_, t in results)
    run_dir.write_results(rows, summary)
    return summary


def environment_reports(envs: dict[str, ConfiguredEnv], rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each environment's own figures (``Environment.report``) from the rows of its samples: with one
    environment, every row."""
    return {name: configured.env.report(rows if len(envs) == 1 else [r for r in rows if r.get("env") == name])
            for name, configured in envs.items() if configured.env.report is not None}


def run_evaluation(config: Config, output: Path, progress: bool | None = None, overwrite: bool = False) -> dict[str, Any]:
    return asyncio.run(evaluate_async(config, output, progress, overwrite))


# -- validation during training -------------------------------------------------------------------


async def validate(processes: Any, run: ResolvedRun, run_dir: RunDir, step: int) -> dict[str, float]:
    """The eval split on the current weights: ``val/...`` numbers for the step's metrics row; the
    trajectories go to ``eval/step_NNNNN.jsonl``."""
    config = run.eval_config
    assert config is not None, "resolve_run resolves the eval split of a run with trainer.eval_every"
    t0 = time.perf_counter()
    results = await run_problems(_sampling(processes.rollouts, config), config, run.eval_samples)
    summary = summarize(results, config, time.perf_counter() - t0)
    run_dir.write_validation(step, result_rows(results, config, processes.tokenizer))
    return {f"val/{k}": float(v) for k, v in summary.items() if isinstance(v, int | float) and not isinstance(v, bool)
            and k not in ("n", "k", "temperature", "success_threshold")}


# -- reading and printing summaries ---------------------------------------------------------------


def read_summary(directory: Path) -> dict[str, Any]:
    path = directory / RunDir.SUMMARY
    if not path.exists():
        raise ConfigError(f"{path}: no such file (a `toolrl eval --output` directory has one)")
    summary = read_json(path)
    if not isinstance(summary, dict):
        raise ConfigError(f"{path}: a summary is a JSON object, got {type(summary).__name__}")
    return summary


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in sorted(value.items())) or "-"
    return "-" if value is None else str(value)


ROWS = ("model", "engine", "num_samples", "n", "temperature", "metric", "reward_mean", "reward_std", "pass@1",
        "pass@k", "pass^k", "tool_calls_per_trajectory", "tool_success_rate", "turn_success_rate", "tool_latency_s_mean",
        "generation_s_mean", "turns_mean", "solved_turns_mean", "solved_tool_calls_mean", "response_tokens_mean",
        "terminations", "errors", "infra_failures", "wall_s")


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def figures_table(columns: dict[str, dict[str, Any]], keys: Sequence[str], title: str | None = None) -> Any:
    """A rich table: one row per figure of ``keys`` that any column holds, one column per summary
    (``{title: figures}``); two summaries get a ``B − A`` column."""
    table = Table(title=title, show_header=True, header_style="bold")
    table.add_column("")
    for name in columns:
        table.add_column(name, justify="right")
    pair = len(columns) == 2
    if pair:
        table.add_column("B − A", justify="right")
    for key in keys:
        values = [s.get(key) for s in columns.values()]
        if any(key in s for s in columns.values()):
            diff = [_cell(values[1] - values[0]) if all(map(_number, values)) else ""] if pair else []
            table.add_row(key, *map(_cell, values), *diff)
    return table


def solved_problems(directory: Path) -> dict[Any, bool] | None:
    """Each problem of an evaluation's ``results.jsonl``: whether any of its samples succeeded (None:
    no results file)."""
    path = directory / RunDir.RESULTS
    if not path.exists():
        return None

    def samples() -> Iterator[tuple[Any, bool, Any]]:
        for origin, row in read_rows(path):
            if not isinstance(row, dict) or "problem" not in row:
                raise ConfigError(f"{origin}: a results row names its problem")
            yield row["problem"], row.get("success") is True, row.get("reward")

    return {problem: found.solved for problem, found in problem_results(samples()).items()}


def problem_differences(a: dict[Any, bool], b: dict[Any, bool]) -> str:
    """One line: how many problems each evaluation solved, and which only one of them did."""
    both = [p for p in a if p in b]

    def listed(problems: list[Any]) -> str:
        shown = ", ".join(map(str, problems[:20])) + (", ..." if len(problems) > 20 else "")
        return f"{len(problems)}" + (f" ({shown})" if problems else "")

    only_a = [p for p in both if a[p] and not b[p]]
    only_b = [p for p in both if b[p] and not a[p]]
    return (f"problems in both: {len(both)}; solved by A {sum(a[p] for p in both)}, by B {sum(b[p] for p in both)}; "
            f"only by A: {listed(only_a)}; only by B: {listed(only_b)}")


def print_comparison(a: Path, b: Path, file: Any = None) -> None:
    """``toolrl eval A --compare B``: the two summaries labelled A and B with their difference, then the
    problems only one of them solved (when both hold ``results.jsonl``)."""
    print_table({f"A: {a}": read_summary(a), f"B: {b}": read_summary(b)}, file)
    solved = solved_problems(a), solved_problems(b)
    if solved[0] is not None and solved[1] is not None:
        print(problem_differences(*solved), file=file or sys.stdout)


def print_table(columns: dict[str, dict[str, Any]], file: Any = None) -> None:
    file = file or sys.stdout
    # Piped or captured output is not cut to 80 columns (directory names as headers are long).
    console = Console(file=file, width=None if file.isatty() else 1000)
    console.print(figures_table(columns, ROWS))
    # Each environment's own figures (Environment.report), in a table of their own.
    for env in dict.fromkeys(e for s in columns.values() for e in s.get("reports", {})):
        reports = {name: s.get("reports", {}).get(env, {}) for name, s in columns.items()}
        console.print(figures_table(reports, list(dict.fromkeys(k for r in reports.values() for k in r)),
                                    title=f"{env}: its own figures"))
