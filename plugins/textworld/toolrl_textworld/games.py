"""Games: what one is (:class:`GameSpec`, a kind, its knobs and a seed), where it is cached, and their
generation, once, by TextWorld's own generators in a child process (toolrl_textworld.generate).

TextWorld's generators draw from sets of strings, whose order follows Python's hash seed: the same seed
makes the same game only with ``PYTHONHASHSEED=0``, which the child is started with. A game is generated
once per machine and kept under ``~/.cache/toolrl/textworld/`` (``TOOLRL_TEXTWORLD_CACHE`` elsewhere),
named by its spec; a reset reads the file, never generates.

Kinds: ``custom`` (``textworld.generator.make_game``: ``rooms``, ``objects``, ``quest_length``) and
``treasure_hunter`` (TextWorld's Treasure Hunter challenge: ``level`` 1–30, its rooms, doors, containers and
distractors growing with the level; taking a wrong object loses). TextWorld's other challenges replay their
walkthrough on the compiled z-machine game while generating (jericho, a C build): refused, with why.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from toolrl_textworld.upstream import VERSION

# Each kind's knobs: the options that shape its games (a level knob must be one of them).
KNOBS = {"custom": ("rooms", "objects", "quest_length"), "treasure_hunter": ("level",)}
REFUSED = {name: "its generator replays the walkthrough on the compiled z-machine game (jericho, a C build that "
                 "toolrl's install leaves out)" for name in ("simple", "cooking", "coin_collector")}
# Treasure Hunter's quest length by level (its make(): 5 levels of rooms, linear in the level within each).
TREASURE_QUEST = {**{lvl: round(1 + (lvl - 1) * 4 / 9) for lvl in range(1, 11)},
                  **{lvl: round(2 + (lvl - 11) * 8 / 9) for lvl in range(11, 21)},
                  **{lvl: round(3 + (lvl - 21) * 17 / 9) for lvl in range(21, 31)}}


class GameSpec(BaseModel):
    """One game: its kind, its knobs (those of other kinds stay at their defaults) and its seed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["custom", "treasure_hunter"] = "custom"
    rooms: int = Field(2, ge=1, le=20)
    objects: int = Field(2, ge=0, le=30)
    quest_length: int = Field(2, ge=1, le=30)
    level: int = Field(1, ge=1, le=30)
    seed: int = Field(0, ge=0)

    def knobs(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in KNOBS[self.kind]}

    def describe(self) -> str:
        return " ".join([self.kind, *(f"{k}={v}" for k, v in self.knobs().items()), f"seed={self.seed}"])

    def quest(self) -> int:
        """The length of its quest: the fewest commands that win it."""
        return self.quest_length if self.kind == "custom" else TREASURE_QUEST[self.level]

    def path(self) -> Path:
        knobs = "-".join(f"{k}{v}" for k, v in self.knobs().items())
        return cache_dir() / f"{self.kind}-{knobs}-s{self.seed}.json"


def cache_dir() -> Path:
    if os.environ.get("TOOLRL_TEXTWORLD_CACHE"):
        return Path(os.environ["TOOLRL_TEXTWORLD_CACHE"])
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return base / "toolrl" / "textworld" / VERSION


class GenerationError(ValueError):
    """A game TextWorld could not generate: names its spec."""


def ensure(specs: Sequence[GameSpec]) -> list[Path]:
    """Each spec's game file, generating (in one child process) those not cached yet."""
    missing = list(dict.fromkeys(s for s in specs if not s.path().is_file()))
    if missing:
        cache_dir().mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        done = subprocess.run([sys.executable, "-m", "toolrl_textworld.generate"], input=json.dumps(
            [s.model_dump() for s in missing]), capture_output=True, text=True, env=env, check=False)
        for line in done.stdout.splitlines():
            report = json.loads(line)
            if report.get("error"):
                spec = GameSpec.model_construct(**report["spec"])  # as asked, valid or not
                raise GenerationError(f"TextWorld could not generate the game {spec.describe()}: "
                                      f"{report['error']}")
        if done.returncode != 0:
            tail = done.stderr.strip().splitlines()[-1:] or ["no output"]
            raise GenerationError(f"generating {len(missing)} TextWorld games ({missing[0].describe()}, ...) "
                                  f"failed: {tail[0]}")
    return [s.path() for s in specs]


def digest(path: Path) -> str:
    """What makes two game files the same game: their world and quests (not their ids)."""
    data = json.loads(path.read_text())
    return hashlib.sha256(json.dumps([data["world"], data["quests"]], sort_keys=True).encode()).hexdigest()


def make(spec: GameSpec, textworld: Any) -> Any:
    """``spec``'s game by TextWorld's generator (``textworld``: toolrl_textworld.upstream.load())."""
    options = textworld.GameOptions()
    options.seeds = spec.seed
    if spec.kind == "custom":
        options.nb_rooms, options.nb_objects, options.quest_length = spec.rooms, spec.objects, spec.quest_length
        return textworld.textworld.generator.make_game(options)
    _, make_challenge, _ = textworld.challenges["tw-treasure_hunter"]
    return make_challenge({"level": spec.level}, options)
