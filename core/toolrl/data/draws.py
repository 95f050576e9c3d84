"""Which prompt each training group gets: :class:`Draws` asks the run's curriculum (:mod:`toolrl.curricula`,
``data.curriculum``) once per group and keeps the answer until the group is observed, so a group in flight
when a run stops is generated again on the same prompt; the controller shows it each step's groups as the
step begins (:meth:`Draws.observe`) and keeps its state in every checkpoint (:data:`CURRICULUM`)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from toolrl.config import Config, ConfigError, field_where, one_line
from toolrl.curricula import Curriculum, GroupOutcome, TrainingSet
from toolrl.environments import ConfiguredEnv
from toolrl.plugins.parts import BuildContext, build_part
from toolrl.schemas import Sample
from toolrl.trajectory import Trajectory

# A checkpoint's file holding the curriculum's state and the groups drawn and not yet observed.
CURRICULUM = "curriculum.json"


class Draws:
    """The run's curriculum behind :meth:`prompt` (each group's prompt, asked once) and :meth:`observe`.
    ``shown``: whether the run names a curriculum (``data.curriculum``): only then do the metrics rows and
    checkpoints carry it (the default ``uniform`` changes nothing a run records)."""

    def __init__(self, curriculum: Curriculum, shown: bool = False) -> None:
        self.curriculum = curriculum
        self.shown = shown
        self.chosen: dict[int, int] = {}  # groups drawn and not yet observed -> their sample's position
        self.flat: list[bool] = []  # this step's observed groups: whether their rewards were all equal

    @property
    def samples(self) -> Sequence[Sample]:
        return self.curriculum.data.samples

    def prompt(self, group: int) -> Sample:
        """Group ``group``'s prompt: the curriculum's choice, made the first time the group is asked for."""
        if group not in self.chosen:
            choice = self.curriculum.choose(group)
            if not isinstance(choice, int) or not 0 <= choice < len(self.samples):
                raise ValueError(f"curriculum {self.curriculum.name!r} chose {choice!r} for group {group}: not a "
                                 f"position in the {len(self.samples)} training samples")
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
        own = self.curriculum.metrics()
        return {"curriculum": {**({"zero_variance": sum(flat) / len(flat)} if flat else {}), **own}}

    def save(self, checkpoint: Path) -> None:
        if self.shown:
            state = {"name": self.curriculum.name, "chosen": list(self.chosen.items()),
                     "state": self.curriculum.state_dict()}
            (checkpoint / CURRICULUM).write_text(json.dumps(state))

    def restore(self, checkpoint: Path) -> None:
        """What :meth:`save` wrote into ``checkpoint``; a checkpoint without it (a run that named no
        curriculum), or of another curriculum, starts this one afresh. A damaged file is one line."""
        file = checkpoint / CURRICULUM
        if not self.shown or not file.is_file():
            return
        try:
            saved = json.loads(file.read_text())
            self.chosen = {int(g): int(i) for g, i in saved["chosen"]}
            if saved["name"] == self.curriculum.name:
                self.curriculum.load_state_dict(saved["state"])
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
    return Draws(build_part("curricula", name, options, context), shown=entry is not None)
