"""Which prompt each training group gets: :class:`Draws` asks the run's curriculum (:mod:`toolrl.curricula`,
``data.curriculum``) once per group and keeps the answer until the group is observed, so a group in flight
when a run stops is generated again on the same prompt; the controller shows it each step's groups as the
step begins (:meth:`Draws.observe`) and keeps its state in every checkpoint (:data:`CURRICULUM`).

What the curriculum returns is checked as it returns it, naming it and its plugin: a ``state_dict()`` that
is not JSON is one line (before anything loads when its first state is already, else as a checkpoint is
begun, which is then not written); a figure of ``metrics()`` that is not a finite number is left out of
the row with one warning; a resume that starts the curriculum afresh says so."""

from __future__ import annotations

import json
import logging
import math
import numbers
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from toolrl.config import Config, ConfigError, field_where, one_line
from toolrl.curricula import Curriculum, GroupOutcome, TrainingSet
from toolrl.environments import ConfiguredEnv
from toolrl.plugins.parts import BuildContext, build_part, part_plugin
from toolrl.schemas import Sample
from toolrl.trajectory import Trajectory

log = logging.getLogger(__name__)

# A checkpoint's file holding the curriculum's state and the groups drawn and not yet observed.
CURRICULUM = "curriculum.json"
DEEPEST = 100  # nesting a state may have (deeper, or a cycle: not JSON)


def json_problem(value: Any, where: str = "the state", depth: int = 0) -> str | None:
    """Why ``value`` does not go through JSON unchanged (the first thing found), or None: JSON holds
    strings, finite numbers, booleans, None, lists (tuples become lists) and dicts with string keys."""
    if value is None or isinstance(value, str | bool | int):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{where} is {value!r}, not a finite number"
    if depth >= DEEPEST:
        return f"it nests over {DEEPEST} levels deep (a cycle?)"
    if isinstance(value, list | tuple):
        return next((p for i, v in enumerate(value) if (p := json_problem(v, f"{where}[{i}]", depth + 1))), None)
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"{where} has the key {key!r}, not a string (JSON gives it back as {json.dumps(str(key))})"
            if problem := json_problem(item, f"{where}[{key!r}]", depth + 1):
                return problem
        return None
    return f"{where} is a {type(value).__name__} ({repr(value)[:60]})"


def finite_figures(figures: Any, where: str, bad: dict[str, str]) -> dict[str, Any]:
    """``figures`` (a mapping of numbers, nested) with every figure that is no finite number, and every key
    that is no string, left out; what was left out goes into ``bad`` (its path -> why)."""
    if not isinstance(figures, Mapping):
        bad[where] = f"{where} = {repr(figures)[:60]}, not a mapping of figures"
        return {}
    out: dict[str, Any] = {}
    for key, value in figures.items():
        name = f"{where}/{key}"
        if not isinstance(key, str):
            bad[name] = f"{where} has the key {key!r}, not a string"
        elif isinstance(value, Mapping):
            out[key] = finite_figures(value, name, bad)
        elif isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value):
            out[key] = value if isinstance(value, int | float) else float(value)
        else:
            bad[name] = f"{name} = {repr(value)[:60]}, not a finite number"
    return out


class Draws:
    """The run's curriculum behind :meth:`prompt` (each group's prompt, asked once) and :meth:`observe`.
    ``shown``: whether the run names a curriculum (``data.curriculum``): only then do the metrics rows and
    checkpoints carry it (the default ``uniform`` changes nothing a run records)."""

    def __init__(self, curriculum: Curriculum, shown: bool = False) -> None:
        self.curriculum = curriculum
        self.shown = shown
        self.chosen: dict[int, int] = {}  # groups drawn and not yet observed -> their sample's position
        self.flat: list[bool] = []  # this step's observed groups: whether their rewards were all equal
        self.warned: set[str] = set()  # the figures of metrics() already warned about

    @property
    def label(self) -> str:
        """The curriculum as messages name it: ``curriculum 'x' (plugin 'p')``."""
        plugin = part_plugin("curricula", self.curriculum.name)
        return f"curriculum {self.curriculum.name!r}" + (f" (plugin {plugin!r})" if plugin else "")

    @property
    def samples(self) -> Sequence[Sample]:
        return self.curriculum.data.samples

    def prompt(self, group: int) -> Sample:
        """Group ``group``'s prompt: the curriculum's choice, made the first time the group is asked for."""
        if group not in self.chosen:
            choice = self.curriculum.choose(group)
            if not isinstance(choice, int) or isinstance(choice, bool) or not 0 <= choice < len(self.samples):
                raise ConfigError(f"{self.label}: choose({group}) returned {choice!r}, not a position in the "
                                  f"{len(self.samples)} training samples")
            self.chosen[group] = choice
        return self.samples[self.chosen[group]]

    def observe(self, groups: Mapping[int, Sequence[Trajectory]], step: int) -> None:
        """A step's groups (each with its trainable trajectories) shown to the curriculum in group order;
        ``step``: the step (1-based) that trains them."""
        for group in sorted(groups):
            # A group this run did not draw (a batch generated ahead by a run that named no curriculum) was
            # drawn in the data's order.
            sample = self.chosen.pop(group, None)
            sample = self.curriculum.data.uniform(group) if sample is None else sample
            rewards = tuple({t.key: t.reward for t in groups[group]}.values())  # a forked trajectory once
            if not rewards:  # its infrastructure failures left nothing to learn from
                continue
            versions = [v for t in groups[group] for v in t.policy_versions]
            self.flat.append(len(set(rewards)) == 1)
            self.curriculum.observe(GroupOutcome(group, sample, rewards, min(versions, default=step - 1), step))

    def metrics(self) -> dict[str, Any]:
        """The step's ``curriculum`` figures (a named curriculum's only): the share of its groups whose rewards
        were all equal (``zero_variance``: what teaches nothing) and the curriculum's own."""
        if not self.shown:
            return {}
        flat, self.flat = self.flat, []
        bad: dict[str, str] = {}
        own = finite_figures(self.curriculum.metrics(), "curriculum", bad)
        for name, why in bad.items():  # once a run per figure: the run goes on without it
            if name not in self.warned:
                log.warning("%s: metrics(): %s: left out of the metrics row (said once)", self.label, why)
                self.warned.add(name)
        return {"curriculum": {**({"zero_variance": sum(flat) / len(flat)} if flat else {}), **own}}

    def state(self) -> str | None:
        """What a checkpoint keeps (:data:`CURRICULUM`'s text; None for a run that names no curriculum), the
        curriculum's ``state_dict()`` checked: one that is not JSON is a ConfigError naming it and its plugin."""
        if not self.shown:
            return None
        state = self.curriculum.state_dict()
        if problem := json_problem(state):
            raise ConfigError(f"{self.label}: state_dict() returned something that is not JSON: {problem}")
        return json.dumps({"name": self.curriculum.name, "chosen": list(self.chosen.items()), "state": state})

    def save(self, checkpoint: Path, state: str | None = None) -> None:
        """:meth:`state` (or ``state``, taken already) written into ``checkpoint``."""
        state = state or self.state()
        if state is not None:
            (checkpoint / CURRICULUM).write_text(state)

    def restore(self, checkpoint: Path) -> None:
        """What :meth:`save` wrote into ``checkpoint``. A checkpoint without it (a run that named no
        curriculum), or of another curriculum, starts this one afresh, and one warning says so; a damaged
        file is one line."""
        file = checkpoint / CURRICULUM
        if not file.is_file():
            if self.shown:
                log.warning("--resume: %s starts afresh: %s holds no %s (the run named no curriculum until then)",
                            self.label, checkpoint, CURRICULUM)
            return
        try:
            saved = json.loads(file.read_text())
            if not self.shown:
                log.warning("--resume: %s holds curriculum %r's state, and data.curriculum is unset now: the data's "
                            "own order from here", file, saved["name"])
                return
            self.chosen = {int(g): int(i) for g, i in saved["chosen"]}
            if saved["name"] == self.curriculum.name:
                self.curriculum.load_state_dict(saved["state"])
            else:
                log.warning("--resume: %s starts afresh: %s holds curriculum %r's state (the groups drawn ahead keep "
                            "their prompts)", self.label, file, saved["name"])
        except Exception as exc:  # a subclass's load_state_dict may raise anything on a damaged state
            raise ConfigError(f"--resume: {file}: not the curriculum's state ({one_line(str(exc))[:200]})") from None


def open_draws(config: Config, samples: Sequence[Sample], envs: Mapping[str, ConfiguredEnv] | None = None) -> Draws:
    """The run's draws over its training ``samples``: ``data.curriculum`` built (``uniform`` when unset) with
    each environment's levels (``envs``: the configured environments); a bad name or option is one line."""
    entry = config.data.curriculum
    name, options = (entry.name, entry.options) if entry is not None else (Curriculum.name, {})
    levels = {n: c.env.levels for n, c in (envs or {}).items() if c.env.levels}
    data = TrainingSet(samples, config.trainer.seed, config.data.shuffle, levels)
    context = BuildContext(field_where(config, "data.curriculum.name"), field_where(config, "data.curriculum"),
                           config, {"data": data}, options_field="data.curriculum")
    draws = Draws(build_part("curricula", name, options, context), shown=entry is not None)
    draws.state()  # a state_dict() that is not JSON from the start: one line before anything loads
    return draws
