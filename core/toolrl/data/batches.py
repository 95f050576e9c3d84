"""What each training step trains on: the groups, their prompts and seeds, and (asynchronous training)
the groups generating ahead of the trainer. The three schedules: docs/async.md.

Groups are numbered globally from 0; group ``g``'s prompt (the curriculum's choice,
:class:`toolrl.data.draws.Draws`) and seeds are pure functions of ``g`` and the run's seeds, so a resumed run
regenerates any group exactly. Steps take groups in group order; the checkpoint records the first group
not yet consumed. :class:`StepBatches` is the synchronous loop, :class:`OneStepOff` its batches generated
one step ahead, :class:`GroupStream` the stream (with dynamic sampling, up to :data:`MAX_GROUPS_PER_STEP`
batches' worth of groups per step). A group may be finished once generated (:class:`Finishing`:
another model scoring it) while later groups still generate.

The stream's bound: a group trained in step ``s`` (1-based) starts on weights of version
``v >= (s - 1) - k``. Its step is not known when it starts (earlier groups may yet be skipped), but it is
at most the step it would reach if every later group were kept; the stream starts it only when that step
is within ``k`` of the engines' version.
"""

from __future__ import annotations

import asyncio
import functools
import math
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from toolrl.config import Config, ConfigError, one_line
from toolrl.curricula import in_turn
from toolrl.data.draws import Draws
from toolrl.schemas import Sample
from toolrl.seeds import group_seed, step_seed
from toolrl.trajectory import Trajectory, call_prefix, rewards_of

# A checkpoint's file holding the next step's batch, generated ahead (one_step_off).
AHEAD = "ahead.pt"

# Dynamic sampling stops a step after this many batches' worth of groups and trains on what it kept.
MAX_GROUPS_PER_STEP = 4


@runtime_checkable
class RolloutGroup(Protocol):
    """The engines and the agent loop around them: in this process
    (:class:`~toolrl.processes.in_process.Rollouts`), as Ray actors
    (:class:`~toolrl.processes.rollout_workers.RolloutWorkerPool`), or recorded groups standing in for
    them (:class:`~toolrl.processes.replay.Replay`)."""

    @property
    def generating(self) -> RolloutGroup:
        """The group whose engines generate: itself, or the one a stand-in answers for."""
        ...

    async def run(self, samples: Sequence[Sample], n: int, seed: int, id_prefix: str = "") -> list[Trajectory]:
        """``n`` trajectories per sample, what ``run_rollouts`` gives them as one batch."""
        ...

    async def run_group(self, sample: Sample, group: int, n: int, seed: int, id_prefix: str = "") -> list[Trajectory]:
        """Group ``group`` alone (streaming): what a batch gives that group."""
        ...

    async def check_trainable(self) -> str | None:
        """None when training may use the engines, else a one-line reason."""
        ...

    async def ready(self) -> None:
        """Every engine up and holding the weights last sent (a replaced worker gets the trainer's now):
        what a batch that must not start on other weights waits for (``one_step_off``)."""
        ...

    def weight_targets(self, version: int) -> list[Any]:
        """Where weights ``version`` go now (engines, or worker actors that are up); the group
        records ``version`` first, for workers that come up later."""
        ...

    def replace(self, dead: Sequence[Any]) -> None:
        """Replace the targets ``dead`` (found dead by a weight push)."""
        ...

    def take_recoveries(self) -> list[dict[str, Any]]:
        """The replaced workers that came up since the last call, one row each for ``recoveries.jsonl``
        (``index`` and ``worker``: which one, and where its replacement runs)."""
        ...

    async def close(self) -> None:
        ...


def prompt_for_group(samples: Sequence[Sample], group: int, seed: int, shuffle: bool) -> Sample:
    """Group ``group``'s prompt in the data's own order (the ``uniform`` curriculum's): position ``group`` of
    the data, reshuffled every epoch."""
    return samples[in_turn(range(len(samples)), group, seed, shuffle)]


def batch_for_step(samples: Sequence[Sample], step: int, batch_size: int, seed: int, shuffle: bool) -> list[Sample]:
    """The prompts of a synchronous step (0-based): groups ``step*batch_size`` onwards."""
    return [prompt_for_group(samples, g, seed, shuffle) for g in range(step * batch_size, (step + 1) * batch_size)]


@dataclass
class StepBatch:
    """One step's data. ``trajectories``: the trained groups' (in group order); ``generated``: also the
    skipped groups'; ``end``: the first group after it; ``offset``: what a trajectory's ``group`` adds to be
    the group's number (the synchronous loop numbers a step's groups from 0, the stream from the start)."""

    groups: list[int] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)
    trajectories: list[Trajectory] = field(default_factory=list)
    generated: list[Trajectory] = field(default_factory=list)
    end: int = 0
    began: float = math.inf
    ended: float = 0.0
    finish_s: float = 0.0  # the time its groups spent in :class:`Finishing`
    finished: float = 0.0  # when the last of its groups was finished (perf_counter)
    offset: int = 0

    @property
    def rollout_s(self) -> float:
        """Wall time from its first group's start to its last group's end (other steps' groups may
        have generated meanwhile)."""
        return max(self.ended - self.began, 0.0)

    def metrics(self) -> dict[str, Any]:
        return {"groups": self.groups, "skipped_groups": self.skipped,
                "groups_generated": len(self.groups) + len(self.skipped), "groups_skipped": len(self.skipped)}

    def finish_metrics(self, asked: float, name: str) -> dict[str, float]:
        """``{name}_s``: the time its groups spent finishing; ``{name}_wait_s``: what of it the step still
        waited for, from the later of its last group's end and ``asked`` (when the step asked for it)."""
        return {f"{name}_s": self.finish_s, f"{name}_wait_s": max(self.finished - max(self.ended, asked), 0.0)}

    def by_group(self) -> dict[int, list[Trajectory]]:
        """Each of its groups, trained or skipped, with its trainable trajectories (:func:`trainable`)."""
        out: dict[int, list[Trajectory]] = {g: [] for g in range(self.end - len(self.groups) - len(self.skipped), self.end)}
        for t in trainable(self.generated):
            out[t.group + self.offset].append(t)
        return out

    def add(self, group: Group) -> None:
        """A generated group's times."""
        self.began, self.ended = min(self.began, group.began), max(self.ended, group.ended)
        self.finish_s += group.finish_s
        self.finished = max(self.finished, group.finished)

    def save(self, file: Path) -> None:
        """Into a checkpoint: a batch generated ahead of its step (:class:`OneStepOff`), every
        trajectory generated (those its infrastructure failures leave out are left out again on
        :meth:`load`), every float as it is."""
        import torch

        torch.save({"groups": self.groups, "skipped": self.skipped, "end": self.end, "rollout_s": self.rollout_s,
                    "trajectories": [t.model_dump() for t in self.generated]}, file)

    @classmethod
    def load(cls, file: Path) -> StepBatch:
        """What :meth:`save` wrote; a damaged file is a ConfigError naming it."""
        import torch

        try:
            state = torch.load(file, weights_only=False)
            trajs = [Trajectory.model_validate(t) for t in state["trajectories"]]
            groups, skipped, end = list(state["groups"]), list(state.get("skipped", [])), int(state["end"])
            # A batch generated ahead is the synchronous loop's: its groups numbered from 0.
            return cls(groups, skipped, trainable(trajs), trajs, end, 0.0, float(state["rollout_s"]),
                       offset=end - len(groups) - len(skipped))
        except Exception as exc:  # unpickling garbage raises anything
            raise ConfigError(f"--resume: {file}: not a batch generated ahead ({one_line(str(exc))[:200]})") from None


def trainable(trajs: Sequence[Trajectory]) -> list[Trajectory]:
    """What of ``trajs`` (one group or several, told apart by ``Trajectory.group``) may be trained:
    trajectories that ended with ``infra_error`` are left out (every piece of a forked one),
    and so is every trajectory of a group they leave with fewer than two: it has no baseline left. A
    group that lost none is kept whatever its size (``rollout.n: 1``)."""
    failed = {t.key for t in trajs if t.termination == "infra_error"}
    if not failed:
        return list(trajs)
    lost = {t.group for t in trajs if t.key in failed}
    left = Counter(group for group, _ in {(t.group, t.key) for t in trajs if t.key not in failed})
    return [t for t in trajs if t.key not in failed and (t.group not in lost or left[t.group] >= 2)]


def zero_variance(trajs: Sequence[Trajectory]) -> bool:
    """All rewards equal (each role's too): GRPO's advantages are all zero, the group teaches nothing."""
    return len({rewards_of(t) for t in trajs}) <= 1


@dataclass
class Group:
    """One generated group: its trajectories, when it started and ended generating, and the time it
    spent finishing (:class:`Finishing`) and when that was done."""

    trajectories: list[Trajectory]
    began: float
    ended: float
    finish_s: float = 0.0
    finished: float = 0.0


async def generated_group(generating: Awaitable[list[Trajectory]]) -> Group:
    """The group ``generating`` gives, with when it started and ended generating."""
    began = time.perf_counter()
    return Group(await generating, began, time.perf_counter())


# What each generated group's trajectories go through, in place, before a step trains them.
Finish = Callable[[list[Trajectory]], Awaitable[None]]


class Finishing:
    """``finish`` run on each group as it is generated, one group at a time, while the groups still
    running go on generating. What a group trains on is finished (:func:`trainable`; a group dynamic
    sampling skips, ``skip``, is not)."""

    def __init__(self, finish: Finish) -> None:
        self.finish = finish
        self.turn = asyncio.Lock()

    async def group(self, generating: Awaitable[list[Trajectory]], skip: bool = False) -> Group:
        group = await generated_group(generating)
        kept = trainable(group.trajectories)
        if kept and not (skip and zero_variance(kept)):
            async with self.turn:
                t0 = time.perf_counter()
                await self.finish(kept)
                group.finish_s = time.perf_counter() - t0
        group.finished = time.perf_counter()
        return group

    async def groups(self, generating: Sequence[Awaitable[list[Trajectory]]]) -> list[Group]:
        """Groups generating at once, each finished as it ends; on a failure the others are cancelled and
        the trajectories of those that finished go with the error (``exc.trajectories``, for its record)."""
        tasks = [asyncio.ensure_future(self.group(g)) for g in generating]
        try:
            return list(await asyncio.gather(*tasks))
        except Exception as exc:
            for task in tasks:
                task.cancel()
            exc.trajectories = [t for task in tasks if task.done() and not task.cancelled()  # type: ignore[attr-defined]
                                and task.exception() is None for t in task.result().trajectories]
            raise


class StepBatches:
    """The synchronous loop's data: one rollout call per step, started by :meth:`next` (with ``finishing``:
    one per group, each finished as it ends)."""

    def __init__(self, rollouts: RolloutGroup, draws: Draws, config: Config, position: int,
                 finishing: Finishing | None = None) -> None:
        self.rollouts, self.draws, self.config = rollouts, draws, config
        self.position = position
        self.finishing = finishing

    async def next(self, step: int) -> StepBatch:
        cfg, size = self.config, self.config.data.batch_size
        first = self.position
        assert first == step * size, "the synchronous loop's steps are aligned with the data"
        prompts = [self.draws.prompt(g) for g in range(first, first + size)]
        seed, prefix = step_seed(cfg.rollout.seed, step), call_prefix("t", step + 1)
        if self.finishing is None:
            generating = self.rollouts.run(prompts, cfg.rollout.n, seed=seed, id_prefix=prefix)
            done = [await generated_group(generating)]
        else:
            done = await self.finishing.groups([self.rollouts.run_group(p, g, cfg.rollout.n, seed, prefix)
                                              for g, p in enumerate(prompts)])
        self.position = first + size
        trajs = [t for group in done for t in group.trajectories]
        kept = trainable(trajs)
        # A group its infrastructure failures dropped whole counts as skipped.
        skipped = [first + g for g in sorted({t.group for t in trajs} - {t.group for t in kept})]
        groups = [g for g in range(first, self.position) if g not in skipped]
        batch = StepBatch(groups, skipped, kept, trajs, self.position, offset=first)
        for group in done:
            batch.add(group)
        return batch

    def set_version(self, version: int) -> None:
        """Nothing runs between steps."""

    async def settle(self) -> StepBatch | None:
        """Nothing generates while the trainer trains."""
        return None

    async def close(self) -> None:
        """Nothing is in flight between steps."""


class OneStepOff:
    """The synchronous loop's batches, each generated one step ahead: :meth:`next` hands over step
    ``s``'s batch and starts step ``s+1``'s on the engines' weights (those step ``s`` starts from);
    :meth:`settle` waits for it to be whole before the weights change. ``ahead``: step ``position``'s
    batch, generated before a restart (from the checkpoint)."""

    def __init__(self, rollouts: RolloutGroup, draws: Draws, config: Config, position: int,
                 ahead: StepBatch | None = None, finishing: Finishing | None = None) -> None:
        self.rollouts, self.total_steps = rollouts, config.trainer.total_steps
        self.steps = StepBatches(rollouts, draws, config, position, finishing)
        self.pending: asyncio.Future[StepBatch] | None = None
        if ahead is not None:
            self.steps.position = ahead.end
            self.pending = asyncio.get_running_loop().create_future()
            self.pending.set_result(ahead)

    async def next(self, step: int) -> StepBatch:
        if self.pending is None:  # the run's first step: nothing was generated ahead of it
            self.pending = asyncio.ensure_future(self.steps.next(step))
        batch = await self.pending
        self.pending = None
        if step + 1 < self.total_steps:
            # A worker replaced since the last batch gets the weights now, while the trainer waits:
            # once the step trains, the trainer's weights are no longer the ones the batch is for.
            await self.rollouts.ready()
            self.pending = asyncio.ensure_future(self.steps.next(step + 1))
        return batch

    def set_version(self, version: int) -> None:
        """The next batch starts in :meth:`next`, on whatever weights the engines then have."""

    async def settle(self) -> StepBatch | None:
        """The batch generating ahead, once whole (None: the last step has none, or it failed: the
        next step, which needs it, fails then)."""
        if self.pending is None:
            return None
        await asyncio.wait([self.pending])
        return None if self.pending.cancelled() or self.pending.exception() is not None else self.pending.result()

    async def close(self) -> None:
        if self.pending is not None and not self.pending.done():
            self.pending.cancel()
            await asyncio.gather(self.pending, return_exceptions=True)
        await self.steps.close()


class GroupStream:
    """Groups generating continuously within the staleness bound, handed to steps in group order."""

    def __init__(self, rollouts: RolloutGroup, draws: Draws, config: Config, position: int, version: int,
                 finishing: Finishing | None = None) -> None:
        self.rollouts, self.draws, self.config = rollouts, draws, config
        self.finishing = finishing
        self.size = config.data.batch_size
        self.max_staleness = config.trainer.max_staleness
        self.skip = config.algorithm.skip_zero_variance_groups
        self.version = version  # the engines' weight version
        self.started = self.consumed = position  # next group to start / to assign to a step
        self.filling_step = version + 1  # the step (1-based) the next assigned group goes to
        self.filling = StepBatch(end=position)
        self.running: dict[int, asyncio.Task[Group]] = {}
        self.finished: dict[int, Group] = {}
        self.ready: deque[StepBatch] = deque()
        self.error: BaseException | None = None
        self.changed = asyncio.Event()
        self._admit()

    async def next(self, step: int) -> StepBatch:
        """Step ``step``'s (0-based) batch, once its groups have finished."""
        while not self.ready:
            if self.error is not None:
                raise self.error
            self.changed.clear()
            await self.changed.wait()
        return self.ready.popleft()

    def set_version(self, version: int) -> None:
        """The engines now sample with ``version``: more groups may start."""
        self.version = version
        self._admit()

    async def settle(self) -> StepBatch | None:
        """Groups in flight go on while the weights change under them."""
        return None

    async def close(self) -> None:
        """Cancel the groups in flight (a resumed run regenerates them: same prompts, same seeds)."""
        tasks = list(self.running.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _limit(self) -> int:
        """The first group that may not start yet. The filling step still takes at least ``need``
        groups and every later step at least a batch, so group ``g`` lands in a step no later than
        if all of those were kept; the staleness bound (and the run's last step) allow ``slack`` steps
        after the filling one."""
        slack = min(self.version + self.max_staleness + 1, self.config.trainer.total_steps) - self.filling_step
        if slack < 0:
            return self.consumed
        taken = len(self.filling.groups) + len(self.filling.skipped)
        need = min(self.size - len(self.filling.groups), MAX_GROUPS_PER_STEP * self.size - taken)
        return self.consumed + need + slack * self.size

    def _admit(self) -> None:
        cfg = self.config
        while self.started < self._limit():
            g = self.started
            sample = self.draws.prompt(g)
            generating = self.rollouts.run_group(sample, g, cfg.rollout.n, group_seed(cfg.rollout.seed, g, self.size), "")
            task = asyncio.ensure_future(generated_group(generating) if self.finishing is None
                                         else self.finishing.group(generating, self.skip))
            task.add_done_callback(functools.partial(self._finished, g))
            self.running[g] = task
            self.started += 1

    def _finished(self, group: int, task: asyncio.Task[Group]) -> None:
        self.running.pop(group, None)
        if task.cancelled():
            return
        if (exc := task.exception()) is not None:
            self.error = self.error or exc
        else:
            self.finished[group] = task.result()
            self._assign()
            self._admit()
        self.changed.set()

    def _assign(self) -> None:
        """Finished groups, in group order, to the filling step; a full step is ready to train."""
        while self.consumed in self.finished:
            g, done = self.consumed, self.finished.pop(self.consumed)
            generated, batch = done.trajectories, self.filling
            trajs = trainable(generated)
            if not trajs or (self.skip and zero_variance(trajs)):
                batch.skipped.append(g)
            else:
                batch.groups.append(g)
                batch.trajectories += trajs
            batch.generated += generated
            batch.add(done)
            self.consumed = batch.end = g + 1
            if len(batch.groups) == self.size or len(batch.groups) + len(batch.skipped) >= MAX_GROUPS_PER_STEP * self.size:
                self.ready.append(batch)
                self.filling = StepBatch(end=self.consumed)
                self.filling_step += 1


def open_batches(rollouts: RolloutGroup, draws: Draws, config: Config, position: int,
                 version: int, ahead: StepBatch | None = None,
                 finish: Finish | None = None) -> StepBatches | OneStepOff | GroupStream:
    """The synchronous loop where it applies (no overlap, no dynamic sampling, aligned data), one step
    off it where asked (``ahead``: a batch already generated for the next step), else the stream;
    ``finish``: what each group goes through as it is generated (:class:`Finishing`)."""
    finishing = None if finish is None else Finishing(finish)
    if config.trainer.async_schedule == "one_step_off":
        return OneStepOff(rollouts, draws, config, position, ahead, finishing)
    if config.trainer.max_staleness == 0 and not config.algorithm.skip_zero_variance_groups \
            and position == version * config.data.batch_size:
        return StepBatches(rollouts, draws, config, position, finishing)
    return GroupStream(rollouts, draws, config, position, version, finishing)
