"""The run directory and everything written in it (:class:`RunDir`, the one place its file names are
spelled) and the figures of a metrics row; problems with its files are one-line ConfigErrors. The open
modes (``new``, ``resume``, ``overwrite``): docs/configuration.md, "The run directory".

A checkpoint is ``checkpoints/step_NNNNNN/``: the ranks' ``torch.distributed.checkpoint`` shards (any world
size loads them), an RNG file per rank, ``controller.pt``, ``meta.json`` and, for ``one_step_off``,
``ahead.pt``. Ranks write into ``.tmp_step_NNNNNN/``, which :func:`finalize` renames once complete, so a
crash never leaves a checkpoint that looks complete (and a failure while writing one removes it:
:func:`toolrl.processes.controller.save_checkpoint`). ``hf/`` holds the model's config and tokenizer,
which export needs besides a checkpoint.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import statistics
import sys
from collections import Counter, defaultdict
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TextIO

from toolrl.config import Config, ConfigError, one_line, read_json, read_text
from toolrl.trajectory import Trajectory, rewards_of

Mode = Literal["new", "resume", "overwrite"]


def open_mode(resume: bool, overwrite: bool) -> Mode:
    """The mode the ``--resume`` and ``--overwrite`` flags ask for."""
    if resume and overwrite:
        raise ConfigError("--resume continues the run in the output directory and --overwrite replaces it: "
                          "pass one of them")
    return "resume" if resume else "overwrite" if overwrite else "new"


class RunDir:
    """One run's directory, the one place its file names are spelled. ``field`` names the directory
    in errors (``trainer.output_dir``, ``--output``); ``resumable``: whether ``--resume`` applies."""

    CONFIG = "config.json"
    METRICS = "metrics.jsonl"
    PLACEMENT = "placement.json"  # where each process runs
    CURVE = "reward_curve.png"
    ROLLOUTS = "rollouts"
    CHECKPOINTS = "checkpoints"
    EVAL = "eval"
    RESULTS = "results.jsonl"
    SUMMARY = "summary.json"
    RECOVERIES = "recoveries.jsonl"  # one row per recovery: what died, when, from what, what was lost
    # What a run writes here: any of it means the directory holds a run, and ``overwrite`` removes
    # exactly these (what loggers or people keep beside them stays).
    OWNED = (CONFIG, METRICS, PLACEMENT, CURVE, ROLLOUTS, CHECKPOINTS, EVAL, RESULTS, SUMMARY, RECOVERIES)

    def __init__(self, path: str | os.PathLike[str], mode: Mode = "new", field: str = "trainer.output_dir",
                 resumable: bool = True) -> None:
        self.path = Path(path)
        self.mode, self.field, self.resumable = mode, field, resumable
        self.failures = FailureTally()  # the trajectories written here that ended in errors

    @classmethod
    def open(cls, path: str | os.PathLike[str], mode: Mode = "new", field: str = "trainer.output_dir",
             resumable: bool = True) -> RunDir:
        """The run directory at ``path``, checked for ``mode``; nothing is written."""
        run_dir = cls(path, mode, field, resumable)
        run_dir.check()
        return run_dir

    # -- paths ------------------------------------------------------------------------------------

    @property
    def metrics(self) -> Path:
        return self.path / self.METRICS

    @property
    def checkpoints(self) -> Path:
        return self.path / self.CHECKPOINTS

    def traces(self, step: int) -> Path:
        """``rollouts/step_NNNNN.jsonl``: every trajectory of step ``step`` (1-based)."""
        return self.path / self.ROLLOUTS / f"step_{step:05d}.jsonl"

    # -- opening and starting ---------------------------------------------------------------------

    def earlier_run(self) -> list[str]:
        """The files of a run already here (``checkpoints/`` counts once it holds more than a
        checkpoint being staged)."""
        found = []
        for name in self.OWNED:
            path = self.path / name
            if name == self.CHECKPOINTS:
                if path.is_dir() and any(not p.name.startswith(".") for p in path.iterdir()):
                    found.append(name)
            elif path.exists() or path.is_symlink():
                found.append(name)
        return found

    def check(self) -> None:
        """What ``mode`` needs, read only: no earlier run in the way (``new``), a checkpoint and a
        readable ``metrics.jsonl`` (``resume``), and a directory that can be written."""
        # The directory, or the nearest existing directory it would be made in.
        existing = next(p for p in (self.path, *self.path.absolute().parents) if p.exists())
        if not existing.is_dir():
            raise ConfigError(f"{self.field}: {existing} exists and is not a directory")
        if not os.access(existing, os.W_OK | os.X_OK):
            raise ConfigError(f"{self.field}: cannot write {existing}: permission denied")
        if self.mode == "resume":
            read_metrics(self.metrics)  # a damaged file fails now, before the model loads
            checkpoint = self.latest_checkpoint()
            read_meta(checkpoint)
            controller_state(checkpoint)
        elif self.mode == "new" and (earlier := self.earlier_run()):
            hint = ("pass --resume to continue it or --overwrite to replace it" if self.resumable
                    else "pass --overwrite to replace it")
            raise ConfigError(f"{self.field}: {self.path} holds an earlier run ({', '.join(earlier)}); {hint}")

    def latest_checkpoint(self) -> Path:
        found = latest(self.checkpoints)
        if found is None:
            raise ConfigError(f"--resume: no checkpoint in {self.checkpoints}")
        return found

    def start(self, config: Config) -> None:
        """The run's first write: checked again (another run may have started here meanwhile),
        ``config.json`` written atomically, then the rest of the earlier run removed (``overwrite``)."""
        self.check()
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            write_atomic(self.path / self.CONFIG, config.model_dump_json(indent=2))
            if self.mode == "overwrite":
                for name in set(self.earlier_run()) - {self.CONFIG}:
                    path = self.path / name
                    if path.is_dir() and not path.is_symlink():
                        shutil.rmtree(path)
                    else:
                        path.unlink()
        except OSError as exc:
            raise ConfigError(f"{self.field}: cannot write {exc.filename or self.path}: {exc.strerror or exc}") from None

    # -- writing ----------------------------------------------------------------------------------

    def append_metrics(self, row: dict[str, Any]) -> None:
        append_line(self.metrics, row)

    def append_recovery(self, row: dict[str, Any]) -> None:
        """A line of ``recoveries.jsonl`` (kept across resumes: the run's history of failures)."""
        append_line(self.path / self.RECOVERIES, row)

    def truncate_metrics(self, keep_steps: int) -> int:
        """After resuming from step k, drop the lines of steps after k (written after that checkpoint);
        how many trained steps were dropped (lines of failed steps are not counted)."""
        if not self.metrics.exists():
            return 0
        rows = _metric_lines(self.metrics)
        kept = [line for line, row in rows if row["step"] <= keep_steps]
        write_atomic(self.metrics, "".join(line + "\n" for line in kept))
        return sum(row["step"] > keep_steps and "failed" not in row for _, row in rows)

    def write_traces(self, step: int, trajs: Sequence[Trajectory], tokenizer: Any,
                     advantages: dict[str, Any] | None = None,
                     trainer_logprobs: dict[str, list[float | None]] | None = None) -> None:
        """``rollouts/step_NNNNN.jsonl``, a row per trajectory with, by trajectory id, the ``advantage`` it was
        trained with (a number, or per token) and ``trainer_logprobs`` (:class:`toolrl.training.step.ProximalLogprobs`),
        each None where it was not trained. Written once the step has trained, so each row is written whole,
        once (the viewer indexes it by byte offset)."""
        rows = []
        self.failures.add(trajs)
        for t in trajs:
            # A segment's context edit only where there is one: a run without a context policy writes the
            # rows it wrote before policies existed.
            row = t.model_dump(mode="json", exclude={"model_text", "policy_versions", "routed_experts"}
                               | (set() if t.edit else {"edit"}))
            row["advantage"] = (advantages or {}).get(t.trajectory_id)
            row["trainer_logprobs"] = (trainer_logprobs or {}).get(t.trajectory_id)
            row["policy_version"] = policy_version(t)
            row["prompt_text"] = tokenizer.decode(t.prompt_ids, skip_special_tokens=False)
            row["response_text"] = tokenizer.decode(t.response_ids, skip_special_tokens=False)
            rows.append(row)
        write_jsonl(self.traces(step), rows)

    def write_placement(self, placement: dict[str, Any]) -> None:
        """``placement.json``: where each process runs."""
        (self.path / self.PLACEMENT).write_text(json.dumps(placement, indent=2, default=str))

    def write_validation(self, step: int, rows: Sequence[dict[str, Any]]) -> None:
        """``eval/step_NNNNN.jsonl``: the validation after step ``step`` (1-based), one row per trajectory."""
        write_jsonl(self.path / self.EVAL / f"step_{step:05d}.jsonl", rows)

    def write_results(self, rows: Sequence[dict[str, Any]], summary: dict[str, Any]) -> None:
        """``toolrl eval``'s ``results.jsonl`` (one row per trajectory) and ``summary.json``."""
        write_jsonl(self.path / self.RESULTS, rows)
        write_atomic(self.path / self.SUMMARY, json.dumps(summary, indent=2))

    def plot_curve(self) -> Path | None:
        """``reward_curve.png`` from ``metrics.jsonl`` (None: no rows)."""
        rows = read_metrics(self.metrics)
        return plot_rewards(rows, self.path / self.CURVE) if rows else None


# -- the trajectories that ended in errors --------------------------------------------------------
# A failed trajectory does not stop ``toolrl rollout``, ``eval`` or ``train``; so that failures are not found
# only in the records, the command ends with a summary on stderr, and exits 1 when every one failed.

FAILURES_SHOWN = 3  # error lines quoted in the summary
FAILURE_WIDTH = 200  # characters of each


class EveryTrajectoryFailed(RuntimeError):
    """Every trajectory of the command ended in an error; the message is the summary's first line."""


class FailureTally:
    """Trajectories seen, those that ended in an error, and the first error lines."""

    def __init__(self) -> None:
        self.total = self.failed = self.infrastructure = 0
        self.first: list[str] = []

    def add(self, trajs: Iterable[Trajectory]) -> None:
        for t in trajs:
            if t.termination == "forked":  # a piece: its trajectory is counted by its last piece
                continue
            self.total += 1
            if t.termination not in ("error", "infra_error"):
                continue
            self.failed += 1
            self.infrastructure += t.termination == "infra_error"
            if len(self.first) < FAILURES_SHOWN:
                self.first.append(f"{t.key} [{t.termination}]: {one_line(t.error or 'no error recorded')[:FAILURE_WIDTH]}")

    def headline(self) -> str:
        infra = f" ({self.infrastructure} of them infrastructure failures: not trained)" if self.infrastructure else ""
        return f"{self.failed} of {self.total} trajectories ended in errors{infra}"

    def report(self, file: TextIO | None = None) -> None:
        """The summary on ``file`` (stderr), when any trajectory failed."""
        if not self.failed:
            return
        lines = [self.headline() + (", first:" if self.first else "")] + [f"  {line}" for line in self.first]
        print("\n".join(lines), file=file or sys.stderr, flush=True)

    def check(self) -> None:
        """Raise :class:`EveryTrajectoryFailed` when there were trajectories and none succeeded."""
        if self.total and self.failed == self.total:
            raise EveryTrajectoryFailed(self.headline())


def write_atomic(path: Path, text: str) -> None:
    """``path`` holds either its old content or all of ``text``, whatever happens meanwhile."""
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def append_line(path: Path, row: dict[str, Any]) -> None:
    """``row`` as one more JSON line of ``path``, on disk before this returns."""
    with path.open("a") as f:
        f.write(json.dumps(row) + "\n")
        f.flush()
        os.fsync(f.fileno())


def write_jsonl(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, "".join(json.dumps(r) + "\n" for r in rows))


# -- an evaluation's results, by problem ------------------------------------------------------------


@dataclass
class ProblemResult:
    """One problem of an evaluation (``results.jsonl``): its samples, their successes and the sum and
    count of their finite rewards."""

    n: int = 0
    successes: int = 0
    reward_sum: float = 0.0
    rewards: int = 0

    @property
    def solved(self) -> bool:
        return self.successes > 0

    @property
    def success_rate(self) -> float:
        return self.successes / self.n if self.n else 0.0

    @property
    def reward(self) -> float | None:
        """The mean of its finite rewards (None: none)."""
        return self.reward_sum / self.rewards if self.rewards else None


def problem_results(samples: Iterable[tuple[Hashable, bool, Any]]) -> dict[Hashable, ProblemResult]:
    """Each problem's :class:`ProblemResult` from ``(problem, success, reward)``, one per results row, in
    the order problems first appear: the one per-problem tally of ``toolrl eval --compare`` and
    ``toolrl view``'s comparison. A reward that is no finite number counts as a sample, not a reward."""
    out: dict[Hashable, ProblemResult] = {}
    for problem, success, reward in samples:
        found = out.setdefault(problem, ProblemResult())
        found.n += 1
        found.successes += success is True
        if isinstance(reward, int | float) and not isinstance(reward, bool) and math.isfinite(reward):
            found.reward_sum += reward
            found.rewards += 1
    return out


# -- a metrics row ----------------------------------------------------------------------------------


def _finite(values: Sequence[float]) -> list[float]:
    return [v for v in values if isinstance(v, int | float) and math.isfinite(v)]


def rollout_metrics(trajs: Sequence[Trajectory], wall_s: float) -> dict[str, Any]:
    """Per-step figures. Non-finite rewards (a broken reward function or tool) are left out of the
    mean and std and counted in ``reward_nonfinite``; the mean is NaN only if no reward is finite."""
    whole = [t for t in trajs if t.termination != "forked"]  # a forked trajectory's last piece
    n = max(len(whole), 1)
    rewards = _finite([t.reward for t in whole])
    calls = [r for t in trajs for r in t.tool_results]
    latency: dict[str, list[float]] = defaultdict(list)
    for r in calls:
        latency[r.name].append(r.latency_s)
    model_tokens = sum(sum(t.response_mask) for t in trajs)
    forks, checks = sum(t.template_forks for t in trajs), sum(t.template_checks for t in trajs)
    by_group: dict[int, set[Hashable]] = defaultdict(set)
    for t in whole:
        by_group[t.group].add(rewards_of(t))
    return {
        "reward_mean": statistics.fmean(rewards) if rewards else math.nan,
        "reward_std": statistics.pstdev(rewards) if len(rewards) > 1 else 0.0,
        "reward_nonfinite": len(whole) - len(rewards),
        "tool_call_count": len(calls),
        "tool_success_count": sum(r.status == "ok" for r in calls),
        "tool_call_rate": len(calls) / n,
        "parse_error_count": sum(len(t.parse_errors) for t in trajs),
        "tool_latency_s": {k: statistics.fmean(f) for k, v in sorted(latency.items()) if (f := _finite(v))},
        "response_length": sum(len(t.response_ids) for t in trajs) / n,
        "model_tokens_mean": model_tokens / n,
        "turns_mean": sum(t.turns for t in trajs) / n,
        "terminations": dict(Counter(t.termination for t in trajs)),
        # Groups of more than one trajectory whose rewards (each role's too) were all equal: zero
        # group-relative advantage.
        "equal_reward_groups": sum(len(r) == 1 for g, r in by_group.items()
                                   if sum(t.group == g for t in whole) > 1),
        # Templates that rewrote history (toolrl.renderers.rewrite): forks per round of tool results.
        "template_forks": forks,
        "template_fork_rate": forks / checks if checks else 0.0,
        "errors": sum(t.error is not None for t in trajs),
        # Trajectories the infrastructure failed (toolrl.schemas.InfrastructureError): never trained.
        "infra_failures": sum(t.termination == "infra_error" for t in trajs),
        # Tools that held the event loop (every trajectory stalls meanwhile) and lifecycle failures.
        "tool_loop_blocked_s": sum(t.loop_blocked_s for t in trajs),
        "tool_lifecycle_errors": sum(len(t.tool_errors) for t in trajs),
        # Prompt tokens the engines did not prefill: kept KV, a group's prompt prefilled once, prefix caches.
        "prefill_tokens_saved": sum(t.prefill_tokens_saved for t in trajs),
        "rollout_s": wall_s,
        "tokens_per_s": model_tokens / wall_s if wall_s > 0 else 0.0,
    }


def step_line(row: dict[str, Any]) -> str:
    """The line printed after a step; it says when every group had equal rewards (GRPO's advantages are
    then all zero, so ``loss 0.0000`` is no mystery)."""
    line = (f"step {row['step']}: reward {row['reward_mean']:.3f}±{row['reward_std']:.3f} "
            f"tool calls {row['tool_call_count']} ok {row['tool_success_count']} "
            f"loss {row.get('loss', 0):.4f} {row['step_s']:.1f}s")
    groups = row.get("groups_generated")
    # A teacher's advantages (distillation: teacher_s) do not come from the rewards.
    if groups and row.get("equal_reward_groups") == groups and "teacher_s" not in row:
        line += f" (all {groups} groups had equal rewards: zero advantage, nothing learned)"
    return line


def staleness_metrics(trajs: Sequence[Trajectory], step: int) -> dict[str, Any]:
    """Staleness of the trajectories trained in ``step`` (1-based): ``(step - 1) - policy_versions[0]``,
    the steps between the weights that sampled a trajectory's first token and those it trains."""
    ages = [step - 1 - t.policy_versions[0] for t in trajs if t.policy_versions]
    if not ages:
        return {}
    hist = Counter(str(a) for a in sorted(ages))
    return {"staleness_mean": statistics.fmean(ages), "staleness_max": max(ages), "staleness_hist": dict(hist)}


def policy_version(t: Trajectory) -> int | list[int] | None:
    """A trace's ``policy_version``: one int, or the list per generation call when weights changed
    mid-trajectory (None: nothing was generated)."""
    if not t.policy_versions:
        return None
    return t.policy_versions[0] if len(set(t.policy_versions)) == 1 else list(t.policy_versions)


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


def reward_figure(rows: Sequence[dict[str, Any]], title: str = "") -> Any:
    """The figure of ``reward_curve.png``: the mean reward by step with a band of ± one standard deviation
    across the step's trajectories, and tool calls per trajectory on a second axis; integer step ticks,
    the legend below the axes (never over the data)."""
    import matplotlib  # lazy: a heavy import only the plot needs (every CLI command imports this module)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    steps = [r["step"] for r in rows]
    mean = [r["reward_mean"] for r in rows]
    std = [r["reward_std"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(steps, mean, marker="o", label="reward (mean over the step's trajectories)")
    ax.fill_between(steps, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)], alpha=0.2,
                    label="reward ± 1 std (across trajectories)")
    ax.set_xlabel("step")
    ax.set_ylabel("reward")
    if len(set(steps)) <= 12:
        ax.set_xticks(sorted(set(steps)))  # each step (a single step too: the locator would subdivide it)
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax2 = ax.twinx()
    ax2.plot(steps, [r.get("tool_call_rate", math.nan) for r in rows], color="tab:orange", linestyle="--",
             marker=".", label="tool calls / trajectory")
    ax2.set_ylabel("tool calls / trajectory")
    ax.set_title(title or "Reward by training step")
    handles = [h for a in (ax, ax2) for h in a.get_legend_handles_labels()[0]]
    fig.legend(handles, [h.get_label() for h in handles], loc="lower center", ncol=2, frameon=False, fontsize=9)
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    return fig


def plot_rewards(rows: Sequence[dict[str, Any]], out: Path) -> Path:
    """``reward_curve.png`` at ``out`` (:func:`reward_figure`, titled with the run directory's name)."""
    import matplotlib.pyplot as plt  # lazy: as in reward_figure

    fig = reward_figure(rows, f"{out.parent.name}: reward by training step")
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


META = "meta.json"


HF_FILES = "hf"


def checkpoint_shapes(checkpoint: Path) -> dict[str, tuple[int, ...]]:
    """The shapes of the model tensors a checkpoint holds (its DCP ``.metadata``, by the model's own
    names), once every shard file the metadata names is there and long enough: a damaged checkpoint is
    one ConfigError, read from its files before any model loads."""
    from torch.distributed.checkpoint import FileSystemReader  # torch: only a resumed run reads shards

    try:
        metadata = FileSystemReader(str(checkpoint)).read_metadata()
    except Exception as exc:  # unpickling a damaged file raises anything
        raise ConfigError(f"--resume: {checkpoint}: the trainer's state cannot be read "
                          f"({type(exc).__name__}: {one_line(str(exc))[:200]})") from None
    ends: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        ends[info.relative_path] = max(ends.get(info.relative_path, 0), info.offset + info.length)
    for name, end in sorted(ends.items()):
        size = (checkpoint / name).stat().st_size if (checkpoint / name).is_file() else None
        if size is None or size < end:
            raise ConfigError(f"--resume: {checkpoint}: the trainer's state cannot be loaded: {name} is "
                              + ("missing" if size is None else f"cut short ({size} of {end} bytes)"))
    return {key.removeprefix("model."): tuple(item.size) for key, item in metadata.state_dict_metadata.items()
            if key.startswith("model.") and hasattr(item, "size")}


def staging_dir(ckpt_dir: Path, step: int) -> Path:
    """An empty directory for the ranks to write step ``step`` into."""
    tmp = ckpt_dir / f".tmp_step_{step:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


def finalize(ckpt_dir: Path, staged: Path, step: int, meta: dict[str, Any], keep: int) -> Path:
    """Add the controller's state to ``staged`` and publish it as ``step_NNNNNN`` (atomic rename)."""
    import torch

    torch.save({"python_rng": random.getstate(), "torch_rng": torch.get_rng_state()}, staged / "controller.pt")
    (staged / META).write_text(json.dumps({"step": step, **meta}, indent=2))
    final = ckpt_dir / f"step_{step:06d}"
    shutil.rmtree(final, ignore_errors=True)
    os.replace(staged, final)
    for old in sorted(ckpt_dir.glob("step_*"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest(ckpt_dir: Path) -> Path | None:
    found = sorted(p for p in ckpt_dir.glob("step_*") if (p / META).is_file())
    return found[-1] if found else None


def read_meta(path: Path) -> dict[str, Any]:
    """A checkpoint's ``meta.json``; a damaged one is a ConfigError naming it."""
    file = path / META
    meta = read_json(file, "--resume")
    if not isinstance(meta, dict) or not isinstance(meta.get("step"), int) or isinstance(meta["step"], bool):
        raise ConfigError(f"--resume: {file}: not a checkpoint's meta (an object with an integer step)")
    return meta


def controller_state(path: Path) -> dict[str, Any]:
    """The controller's RNG states saved with a checkpoint; a damaged file is a ConfigError naming it."""
    import torch

    file = path / "controller.pt"
    try:
        state = torch.load(file, weights_only=False)
        if not isinstance(state, dict) or not {"python_rng", "torch_rng"} <= state.keys():
            raise ValueError("not the controller's RNG states")
    except Exception as exc:  # unpickling garbage raises anything
        raise ConfigError(f"--resume: {file}: cannot be read ({one_line(str(exc))[:200]})") from None
    return state


def restore_controller(path: Path) -> None:
    import torch

    state = controller_state(path)
    random.setstate(state["python_rng"])
    torch.set_rng_state(state["torch_rng"])
