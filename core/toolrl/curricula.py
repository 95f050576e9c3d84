"""The curriculum part kind (``data.curriculum``; its contract: ``register_curricula`` in hookspecs.py):
which prompt each training group gets, from what the policy solves. The controller alone asks it; its
state is in every checkpoint, so a resumed run draws what an uninterrupted one would (docs/curricula.md).
Built-ins: ``uniform`` (the data's own order), ``pass_rate`` (pools by each prompt's rolling pass rate)
and ``env_difficulty`` (an environment's levels, moved by the pass rate at the level).
"""

from __future__ import annotations

import functools
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from toolrl.plugins.parts import NoOptions
from toolrl.schemas import Sample
from toolrl.seeds import draw_seed, epoch_seed


@functools.lru_cache(maxsize=32)
def epoch_order(n: int, seed: int, epoch: int, shuffle: bool) -> tuple[int, ...]:
    """``0..n-1`` in epoch ``epoch``'s order: shuffled by :func:`toolrl.seeds.epoch_seed` (or as they are)."""
    order = list(range(n))
    if shuffle:
        random.Random(epoch_seed(seed, epoch)).shuffle(order)
    return tuple(order)


def in_turn(items: Sequence[int], turn: int, seed: int, shuffle: bool) -> int:
    """Draw ``turn`` (0-based) of ``items`` taken in turn, reshuffled every pass over them."""
    epoch, pos = divmod(turn, len(items))
    return items[epoch_order(len(items), seed, epoch, shuffle)[pos]]


@dataclass(frozen=True)
class TrainingSet:
    """What a curriculum draws from: the run's training ``samples`` (a group's prompt is one of them, by
    position), ``seed`` and ``shuffle`` (``trainer.seed``, ``data.shuffle``: the data's own order) and each
    route's difficulty ``levels``: its environment's level names, easiest first, which each of its samples'
    ``level`` indexes (a route not here exposes none)."""

    samples: Sequence[Sample]
    seed: int = 0
    shuffle: bool = True
    levels: Mapping[str | None, Sequence[str]] = field(default_factory=dict)

    def uniform(self, group: int) -> int:
        """Group ``group``'s prompt in the data's own order: its position in the data, reshuffled every epoch
        (a mixture's share of each environment holds in every stretch of groups)."""
        return in_turn(range(len(self.samples)), group, self.seed, self.shuffle)

    def rng(self, group: int) -> random.Random:
        """Random draws of group ``group``'s own (:func:`toolrl.seeds.draw_seed`): the same in a resumed run."""
        return random.Random(draw_seed(self.seed, group))

    @functools.cached_property
    def routes(self) -> dict[str | None, list[int]]:
        """Each route's samples (positions, in data order); a route is the environment a sample names."""
        out: dict[str | None, list[int]] = {}
        for i, sample in enumerate(self.samples):
            out.setdefault(sample.env, []).append(i)
        return out


@dataclass(frozen=True)
class GroupOutcome:
    """A finished group as a curriculum sees it: its number (``group``), its prompt (``sample``, a position
    in the training samples), one reward per trajectory, the oldest policy version that sampled any of its
    tokens (``version``: trainer steps applied) and the step that trains it (``step``, 1-based; for a group
    dynamic sampling skips, the step that skipped it)."""

    group: int
    sample: int
    rewards: tuple[float, ...]
    version: int
    step: int

    @property
    def staleness(self) -> int:
        """Policy versions between the weights that sampled it and those its step trains: 0 on-policy."""
        return max(self.step - 1 - self.version, 0)

    def pass_rate(self, reward: float) -> float:
        """The share of its trajectories rewarded ``reward`` or more."""
        return sum(r >= reward for r in self.rewards) / len(self.rewards)


class Curriculum:
    """The base of every curriculum; itself ``uniform``: every group gets the data's own order's prompt
    and nothing it observes changes that.

    ``Options`` (a pydantic model) types ``data.curriculum``'s keys besides ``name``; ``build(options,
    context)`` makes the run's one curriculum from the :class:`TrainingSet` (``context.inputs["data"]``).
    A subclass overrides :meth:`choose` and :meth:`observe`, and keeps what they learn in
    :meth:`state_dict`. ``ValueError`` from the constructor is the run's one-line error about
    ``data.curriculum``, before any model loads."""

    name: ClassVar[str] = "uniform"
    Options: ClassVar[type[BaseModel]] = NoOptions

    def __init__(self, options: BaseModel, data: TrainingSet) -> None:
        self.options = options
        self.data = data

    @classmethod
    def build(cls, options: BaseModel, context: Any) -> Curriculum:
        return cls(options, context.input("data"))

    def choose(self, group: int) -> int:
        """Group ``group``'s prompt: a position in ``data.samples``. Asked once per group, in group order;
        every group of an earlier step was observed first, and under asynchronous training groups the
        steps ahead are still generating (docs/curricula.md)."""
        return self.data.uniform(group)

    def observe(self, outcome: GroupOutcome) -> None:
        """A finished group (in group order, each group once, as the step that takes it begins). A group
        whose every trajectory failed on infrastructure is never shown."""

    def metrics(self) -> dict[str, Any]:
        """This step's figures (numbers, nested dicts of them, string keys), put under ``curriculum`` in the
        metrics row; asked once per step, after the step's groups were observed. What is no finite number is
        left out of the row, with a warning (:mod:`toolrl.data.draws`)."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps to go on exactly where this run stands: JSON (numbers, strings, lists,
        dicts with string keys); anything else is a one-line error naming the curriculum and its plugin."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Go on from ``state`` (what :meth:`state_dict` gave, read back from JSON)."""


# -- the pass-rate built-ins ----------------------------------------------------------------------


class PassOptions(BaseModel):
    """What a built-in's pass rate is: the share of a group's trajectories rewarded ``pass_reward`` or more,
    over a prompt's (or a level's) last ``window`` groups, each weighted ``stale_weight ** staleness``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    pass_reward: float = Field(1.0, description="a trajectory passes at this reward or more")
    window: int = Field(4, ge=1, le=1000, description="the newest groups a rolling pass rate is the mean of")
    stale_weight: float = Field(0.5, ge=0, le=1, description="a group sampled k policy versions before the "
                                "weights its step trains counts stale_weight ** k (docs/curricula.md)")


def ordered(low: str, high: str) -> Any:
    """An options model's validator: its bound ``low`` below its bound ``high`` (a ValueError naming both)."""
    def check(options: PassOptions) -> PassOptions:
        if getattr(options, low) >= getattr(options, high):
            raise ValueError(f"{low} ({getattr(options, low):g}) must be below {high} ({getattr(options, high):g})")
        return options
    return model_validator(mode="after")(check)


def add(record: list[list[float]], outcome: GroupOutcome, options: PassOptions) -> None:
    """``outcome``'s pass rate and weight appended to ``record``, which keeps the newest ``window``."""
    record.append([outcome.pass_rate(options.pass_reward), options.stale_weight ** outcome.staleness])
    del record[:-options.window]


def rolling(record: Sequence[Sequence[float]]) -> float | None:
    """A record's weighted pass rate; None before any group (or when every weight is 0)."""
    weight = sum(w for _, w in record)
    return sum(r * w for r, w in record) / weight if weight else None


POOLS = ("easy", "normal", "hard")


class Shares(BaseModel):
    """How often each pool is drawn from (they sum to 1)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    easy: float = Field(0.0, ge=0, le=1)
    normal: float = Field(1.0, ge=0, le=1)
    hard: float = Field(0.0, ge=0, le=1)

    @model_validator(mode="after")
    def _whole(self) -> Shares:
        total = self.easy + self.normal + self.hard
        if abs(total - 1) > 1e-9:
            raise ValueError(f"easy + normal + hard is {total:g}: the shares must sum to 1")
        return self


class PassRate(Curriculum):
    """Three pools of prompts by their rolling pass rate: easy (at or above ``easy_at``), hard (at or below
    ``hard_at``) and normal; a prompt never drawn is normal. Each group takes a pool by ``shares`` (a pool
    holding none of the route's prompts gives its share to the others) and in it the data order's prompt
    when that is in the pool, else one at random; with probability ``revisit`` it takes instead the hard
    prompt drawn longest ago, so a prompt the policy has come to solve can leave the hard pool. The route
    (an environment of a mixture) is the data order's, so a mixture's shares hold."""

    name = "pass_rate"

    class Options(PassOptions):
        shares: Shares = Field(default_factory=Shares)
        easy_at: float = Field(1.0, ge=0, le=1, description="a rolling pass rate at or above it: easy")
        hard_at: float = Field(0.0, ge=0, le=1, description="a rolling pass rate at or below it: hard")
        revisit: float = Field(0.1, ge=0, le=1, description="the probability that a group re-measures the hard "
                               "prompt drawn longest ago")

        _ordered = ordered("hard_at", "easy_at")

    options: Options

    def __init__(self, options: Options, data: TrainingSet) -> None:
        super().__init__(options, data)
        self.records: dict[int, list[list[float]]] = {}  # each drawn prompt's newest groups: [pass rate, weight]
        self.last: dict[int, int] = {}  # the last group that drew each prompt
        self.pending: dict[int, tuple[str, bool]] = {}  # each group drawn, not yet observed: its pool, avoided
        self.seen: list[tuple[str, bool]] = []  # this step's observed groups' (pool, avoided)
        self._pools: dict[str | None, dict[str, list[int]]] = {}  # each route's pools, until the next observation

    def pool(self, sample: int) -> str:
        rate = rolling(self.records.get(sample, []))
        if rate is None:
            return "normal"
        return "easy" if rate >= self.options.easy_at else "hard" if rate <= self.options.hard_at else "normal"

    def pools(self, route: str | None) -> dict[str, list[int]]:
        if route not in self._pools:
            pools: dict[str, list[int]] = {p: [] for p in POOLS}
            for i in self.data.routes[route]:
                pools[self.pool(i)].append(i)
            self._pools[route] = pools
        return self._pools[route]

    def choose(self, group: int) -> int:
        uniform, rng = self.data.uniform(group), self.data.rng(group)
        pools = self.pools(self.data.samples[uniform].env)
        if rng.random() < self.options.revisit and pools["hard"]:
            how, choice = "revisit", min(pools["hard"], key=lambda i: (self.last.get(i, -1), i))
        else:
            shares = [getattr(self.options.shares, p) if pools[p] else 0.0 for p in POOLS]
            how = rng.choices(POOLS, shares)[0] if sum(shares) else self.pool(uniform)
            members = pools[how]
            choice = uniform if uniform in members else members[rng.randrange(len(members))]
        wasted = ("easy", "hard")
        self.pending[group] = (how, self.pool(uniform) in wasted and self.pool(choice) not in wasted)
        self.last[choice] = group
        return choice

    def observe(self, outcome: GroupOutcome) -> None:
        add(self.records.setdefault(outcome.sample, []), outcome, self.options)
        self._pools.clear()
        self.seen.append(self.pending.pop(outcome.group, ("normal", False)))

    def metrics(self) -> dict[str, Any]:
        sizes = Counter(self.pool(i) for i in range(len(self.data.samples)))
        out: dict[str, Any] = {"pool": {**{p: sizes[p] for p in POOLS}, "unseen": len(self.data.samples) - len(self.records)}}
        if self.seen:
            drawn = Counter(how for how, _ in self.seen)
            out["drawn"] = {how: drawn[how] / len(self.seen) for how in (*POOLS, "revisit")}
            out["avoided"] = sum(avoided for _, avoided in self.seen) / len(self.seen)
        self.seen = []
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"records": [[i, r] for i, r in self.records.items()], "last": list(self.last.items()),
                "pending": [[g, how, avoided] for g, (how, avoided) in self.pending.items()]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.records = {int(i): [list(map(float, x)) for x in r] for i, r in state["records"]}
        self.last = {int(i): int(g) for i, g in state["last"]}
        self.pending = {int(g): (str(how), bool(avoided)) for g, how, avoided in state["pending"]}
        self._pools.clear()


class EnvDifficulty(Curriculum):
    """Each route at one of its environment's difficulty levels (``Environment.levels``; every sample's
    ``level``), from ``start``: its groups take that level's prompts in turn, reshuffled every pass. Once
    the level has ``window`` groups since the route came to it, a rolling pass rate at or above ``up``
    moves the route a level up, at or below ``down`` a level down. The route (an environment of a mixture)
    is the data order's, so a mixture's shares hold; every route must expose levels."""

    name = "env_difficulty"

    class Options(PassOptions):
        window: int = Field(8, ge=1, le=1000, description="the groups at a level a move is decided on")
        up: float = Field(0.75, ge=0, le=1, description="a pass rate at or above it moves the route a level up")
        down: float = Field(0.25, ge=0, le=1, description="a pass rate at or below it moves the route a level down")
        start: int = Field(0, ge=0, description="the level every route starts at (0: the easiest)")

        _ordered = ordered("down", "up")

    options: Options

    def __init__(self, options: Options, data: TrainingSet) -> None:
        super().__init__(options, data)
        self.members = {route: self._levels(route, positions) for route, positions in data.routes.items()}
        self.level = {route: options.start for route in self.members}
        self.records: dict[tuple[str | None, int], list[list[float]]] = {}  # a level's groups since the route came
        self.turns: dict[tuple[str | None, int], int] = {}  # groups drawn at each level

    def _levels(self, route: str | None, positions: Sequence[int]) -> list[list[int]]:
        """The route's samples by level; a route, sample or level that does not fit is a ValueError."""
        names = self.data.levels.get(route) or []
        where = f"environment {route!r}" if route is not None else "data.train_files"
        if not names:
            raise ValueError(f"env_difficulty: {where} exposes no difficulty levels (an environment's levels; "
                             "toolrl env show NAME lists them)")
        if self.options.start >= len(names):
            raise ValueError(f"start: level {self.options.start}, but {where} has {len(names)} levels (0-{len(names) - 1})")
        by_level: list[list[int]] = [[] for _ in names]
        for i in positions:
            level = self.data.samples[i].level
            if level is None or not 0 <= level < len(names):
                raise ValueError(f"env_difficulty: training sample {i} of {where} is at level {level!r}, not one of "
                                 f"its {len(names)} levels")
            by_level[level].append(i)
        if empty := [name for name, members in zip(names, by_level, strict=True) if not members]:
            raise ValueError(f"env_difficulty: {where} has no training samples at level {empty[0]!r}")
        return by_level

    def choose(self, group: int) -> int:
        route = self.data.samples[self.data.uniform(group)].env
        key = (route, self.level[route])
        turn = self.turns.get(key, 0)
        self.turns[key] = turn + 1
        return in_turn(self.members[route][key[1]], turn, self.data.seed, self.data.shuffle)

    def observe(self, outcome: GroupOutcome) -> None:
        sample = self.data.samples[outcome.sample]
        route, level = sample.env, sample.level or 0
        record = self.records.setdefault((route, level), [])
        add(record, outcome, self.options)
        rate = rolling(record)
        if level != self.level[route] or len(record) < self.options.window or rate is None:
            return
        move = 1 if rate >= self.options.up else -1 if rate <= self.options.down else 0
        if 0 <= level + move < len(self.members[route]) and move:
            self.level[route] = level + move
            self.records[(route, level + move)] = []

    def metrics(self) -> dict[str, Any]:
        """Each route's level, and its rolling pass rate at each level with groups since the route came to it."""
        rates: dict[str, dict[str, float]] = {}
        for (route, level), record in sorted(self.records.items(), key=lambda item: (str(item[0][0]), item[0][1])):
            if (rate := rolling(record)) is not None:
                rates.setdefault(str(route), {})[str(level)] = rate
        return {"level": {str(route): level for route, level in self.level.items()}, "pass_rate": rates}

    def state_dict(self) -> dict[str, Any]:
        return {"level": [[route, level] for route, level in self.level.items()],
                "records": [[route, level, r] for (route, level), r in self.records.items()],
                "turns": [[route, level, n] for (route, level), n in self.turns.items()]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.level = {route: int(level) for route, level in state["level"]}
        self.records = {(route, int(level)): [list(map(float, x)) for x in r] for route, level, r in state["records"]}
        self.turns = {(route, int(level)): int(n) for route, level, n in state["turns"]}
