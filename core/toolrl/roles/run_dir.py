"""The run directory: ``config.json``, ``metrics.jsonl`` (one line per step), ``rollouts/step_NNNNN.jsonl``
(every trajectory) and ``reward_curve.png``. Problems with the directory or its files are
:class:`ConfigError` (one line naming the file and line), not tracebacks."""

from __future__ import annotations

import json
import math
import os
import statistics
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from toolrl.config import Config, ConfigError, read_text
from toolrl.rollout import Trajectory


def _prepare_output(config: Config, resume: bool) -> Path:
    out = Path(config.trainer.output_dir)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"trainer.output_dir: {out} exists and is not a directory")
    if resume:
        read_metrics(out / "metrics.jsonl")  # a damaged file fails now, before the model loads
    try:
        if not resume and (out / "metrics.jsonl").exists():
            (out / "metrics.jsonl").unlink()
        (out / "rollouts").mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(config.model_dump_json(indent=2))
    except OSError as exc:
        raise ConfigError(f"trainer.output_dir: cannot write {exc.filename or out}: {exc.strerror or exc}") from None
    return out


def _finite(values: Sequence[float]) -> list[float]:
    return [v for v in values if isinstance(v, int | float) and math.isfinite(v)]


def rollout_metrics(trajs: Sequence[Trajectory], wall_s: float) -> dict[str, Any]:
    """Per-step figures. Non-finite rewards (a broken reward function or tool) are left out of the
    mean and std and counted in ``reward_nonfinite``; the mean is NaN only if no reward is finite."""
    n = max(len(trajs), 1)
    rewards = _finite([t.reward for t in trajs])
    calls = [r for t in trajs for r in t.tool_results]
    latency: dict[str, list[float]] = defaultdict(list)
    for r in calls:
        latency[r.name].append(r.latency_s)
    model_tokens = sum(sum(t.response_mask) for t in trajs)
    terminations: dict[str, int] = defaultdict(int)
    for t in trajs:
        terminations[t.termination] += 1
    return {
        "reward_mean": statistics.fmean(rewards) if rewards else math.nan,
        "reward_std": statistics.pstdev(rewards) if len(rewards) > 1 else 0.0,
        "reward_nonfinite": len(trajs) - len(rewards),
        "tool_call_count": len(calls),
        "tool_success_count": sum(r.status == "ok" for r in calls),
        "tool_call_rate": len(calls) / n,
        "parse_error_count": sum(len(t.parse_errors) for t in trajs),
        "tool_latency_s": {k: statistics.fmean(f) for k, v in sorted(latency.items()) if (f := _finite(v))},
        "response_length": sum(len(t.response_ids) for t in trajs) / n,
        "model_tokens_mean": model_tokens / n,
        "turns_mean": sum(t.turns for t in trajs) / n,
        "terminations": dict(terminations),
        "errors": sum(t.error is not None for t in trajs),
        # Tools that held the event loop (every trajectory stalls meanwhile) and lifecycle failures.
        "tool_loop_blocked_s": sum(t.loop_blocked_s for t in trajs),
        "tool_lifecycle_errors": sum(len(t.tool_errors) for t in trajs),
        "rollout_s": wall_s,
        "tokens_per_s": model_tokens / wall_s if wall_s > 0 else 0.0,
    }


def staleness_metrics(trajs: Sequence[Trajectory], step: int) -> dict[str, Any]:
    """Staleness of the trajectories trained in ``step`` (1-based): ``(step - 1) - policy_versions[0]``,
    the steps between the weights that sampled a trajectory's first token and those it trains."""
    ages = [step - 1 - t.policy_versions[0] for t in trajs if t.policy_versions]
    if not ages:
        return {}
    hist: dict[str, int] = defaultdict(int)
    for a in sorted(ages):
        hist[str(a)] += 1
    return {"staleness_mean": statistics.fmean(ages), "staleness_max": max(ages), "staleness_hist": dict(hist)}


def policy_version(t: Trajectory) -> int | list[int] | None:
    """A trace's ``policy_version``: one int, or the list per generation call when weights changed
    mid-trajectory (None: nothing was generated)."""
    if not t.policy_versions:
        return None
    return t.policy_versions[0] if len(set(t.policy_versions)) == 1 else list(t.policy_versions)


def write_traces(path: Path, trajs: Sequence[Trajectory], tokenizer: Any) -> None:
    tmp = path.with_suffix(".tmp")
    with tmp.open("w") as f:
        for t in trajs:
            row = t.model_dump(mode="json", exclude={"model_text", "policy_versions"})
            row["policy_version"] = policy_version(t)
            row["prompt_text"] = tokenizer.decode(t.prompt_ids, skip_special_tokens=False)
            row["response_text"] = tokenizer.decode(t.response_ids, skip_special_tokens=False)
            f.write(json.dumps(row) + "\n")
    os.replace(tmp, path)


def append_metrics(path: Path, row: dict[str, Any]) -> None:
    with path.open("a") as f:
        f.write(json.dumps(row) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _metric_lines(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """``(line, row)`` for each row of ``metrics.jsonl``. A last line cut short (a crash mid-append)
    is dropped: its step was never checkpointed and runs again. Any other bad line is an error."""
    if not path.exists():
        return []
    lines = [(n, ln) for n, ln in enumerate(read_text(path).split("\n"), 1) if ln.strip()]
    out = []
    for k, (n, line) in enumerate(lines):
        try:
            row = json.loads(line)
        except (json.JSONDecodeError, RecursionError):
            row = None
        if not isinstance(row, dict) or not isinstance(row.get("step"), int):
            if k == len(lines) - 1:
                break
            raise ConfigError(f"{path}:{n}: not a metrics row (a JSON object with an integer step); "
                              "delete the line to resume")
        out.append((line, row))
    return out


def read_metrics(path: Path) -> list[dict[str, Any]]:
    return [row for _, row in _metric_lines(path)]


def _truncate_metrics(path: Path, keep_steps: int) -> None:
    """After resuming from step k, drop metric lines of steps ≥ k written after that checkpoint."""
    if not path.exists():
        return
    path.write_text("".join(line + "\n" for line, row in _metric_lines(path) if row["step"] <= keep_steps))


def plot_curve(out_dir: Path) -> Path | None:
    rows = read_metrics(out_dir / "metrics.jsonl")
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in rows]
    mean = [r["reward_mean"] for r in rows]
    std = [r["reward_std"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, mean, marker="o", label="reward (mean)")
    ax.fill_between(steps, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)], alpha=0.2)
    ax.set_xlabel("step")
    ax.set_ylabel("reward")
    ax2 = ax.twinx()
    ax2.plot(steps, [r["tool_call_rate"] for r in rows], color="tab:orange", linestyle="--",
             label="tool calls / trajectory")
    ax2.set_ylabel("tool calls / trajectory")
    fig.legend(loc="upper left")
    fig.tight_layout()
    out = out_dir / "reward_curve.png"
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
