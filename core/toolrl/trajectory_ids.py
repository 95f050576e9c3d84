"""Trajectory ids, made and read here only. An id is a root, ``[prefix]s<sample>-g<group>-<k>`` (one
trajectory of a rollout call; the prefix names the call, e.g. ``t3-`` for step 3's), then a tree
line's path (``.1.0``: its continuation at each split; ``.r2``: a leaf made up from the prompt;
toolrl.rollout.tree), then the part of the trajectory it names: ``~<n>`` a closed piece, ``~branch<n>``
a fold branch while it runs, ``#<n>`` a gateway segment while its episode runs; no part: the
trajectory's last piece, whose id is the trajectory's key."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Literal

Part = Literal["", "piece", "branch", "segment"]
_MARKS: dict[str, str] = {"": "", "piece": "~", "branch": "~branch", "segment": "#"}
_ID = re.compile(r"(?P<root>[^.~#]+)(?P<path>(?:\.r?\d+)*)(?:(?P<mark>~branch|~|#)(?P<index>\d+))?")


@dataclass(frozen=True)
class TrajectoryId:
    root: str
    path: tuple[str, ...] = ()  # a tree line's steps: a continuation's number, or r<k> for a made-up leaf
    part: Part = ""
    index: int = 0  # the piece's, branch's or segment's number

    def __str__(self) -> str:
        line = self.root + "".join(f".{s}" for s in self.path)
        return part_id(line, self.part, self.index) if self.part else line

    @classmethod
    def parse(cls, text: str) -> TrajectoryId:
        if (m := _ID.fullmatch(text)) is None:
            raise ValueError(f"not a trajectory id: {text!r}")
        part = next(p for p, mark in _MARKS.items() if mark == (m["mark"] or ""))
        return cls(m["root"], tuple(m["path"].split(".")[1:]), part, int(m["index"] or 0))


def call_prefix(kind: str, number: int) -> str:
    """The ids' prefix of a rollout call: ``t`` a training step's, ``e`` a streamed step's, ``eval`` an evaluation's."""
    return f"{kind}{number}-"


def prefixed(prefix: str, tid: str) -> str:
    return prefix + tid  # a recorded trajectory's id, as the rollout call ``prefix`` names returns it


def root_id(prefix: str, sample: int | None, group: int, k: int) -> str:
    return f"{prefix}s{sample}-g{group}-{k}"  # trajectory k of group ``group`` (sample ``sample``) of the call


def part_id(key: str, part: Part, index: int) -> str:
    return f"{key}{_MARKS[part]}{index}"  # piece, branch or segment ``index`` of the trajectory or tree line ``key``


def line_id(key: str, path: tuple[int | str, ...]) -> str:
    """The key of the tree line at ``path`` in the tree of the line ``key``."""
    return str(replace(TrajectoryId.parse(key), path=tuple(map(str, path))))


def made_up_id(key: str, k: int) -> str:
    return f"{key}.r{k}"  # leaf ``k`` made up from the prompt for the tree line ``key``


def moved(tid: str, key: str) -> str:
    """The id ``tid`` (a part of one line) names in the line ``key`` (a tree line cloned from it)."""
    line = TrajectoryId.parse(key)
    return str(replace(TrajectoryId.parse(tid), root=line.root, path=line.path))
