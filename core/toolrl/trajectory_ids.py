"""Trajectory ids, made and read here only: a root, ``[prefix]s<sample>-g<group>-<k>`` (trajectory ``k``
of a group of the rollout call the prefix names: ``t3-`` step 3's), then a tree line's path (``.1.0``:
its continuation at each split; ``.r2``: a leaf made up from the prompt), then the part it names:
``~<n>`` a closed piece, ``~branch<n>`` a fold branch, ``#<n>`` a gateway segment, each while it runs;
no part: the trajectory's last piece, whose id is the trajectory's key."""

from __future__ import annotations

import re
from typing import Literal, NamedTuple

Part = Literal["", "piece", "branch", "segment"]
_MARKS: dict[str, str] = {"": "", "piece": "~", "branch": "~branch", "segment": "#"}
_ID = re.compile(r"(?P<root>[^.~#]+)(?P<path>(?:\.r?\d+)*)(?:(?P<mark>~branch|~|#)(?P<index>\d+))?")


class TrajectoryId(NamedTuple):
    root: str
    path: tuple[str, ...] = ()  # a tree line's steps: a continuation's number, or r<k> for a made-up leaf
    part: Part = ""
    index: int = 0  # the piece's, branch's or segment's number

    def __str__(self) -> str:
        line = self.root + "".join(f".{s}" for s in self.path)
        return f"{line}{_MARKS[self.part]}{self.index}" if self.part else line

    @classmethod
    def parse(cls, text: str) -> TrajectoryId:
        if (m := _ID.fullmatch(text)) is None:
            raise ValueError(f"not a trajectory id: {text!r}")
        part = next(p for p, mark in _MARKS.items() if mark == (m["mark"] or ""))
        return cls(m["root"], tuple(m["path"].split(".")[1:]), part, int(m["index"] or 0))


def call_prefix(kind: str, number: int) -> str:
    return f"{kind}{number}-"  # a rollout call's: t<step> a training step's, e<step> a streamed one's, eval<chunk>


def prefixed(prefix: str, tid: str) -> str:
    return prefix + tid  # a recorded trajectory's id, as the rollout call ``prefix`` names returns it


def root_id(prefix: str, sample: int | None, group: int, k: int) -> str:
    return str(TrajectoryId(f"{prefix}s{sample}-g{group}-{k}"))


def part_id(key: str, part: Part, index: int) -> str:
    return str(TrajectoryId(key, (), part, index))  # ``key``: a trajectory's or a tree line's


def line_id(key: str, path: tuple[int | str, ...]) -> str:
    return str(TrajectoryId.parse(key)._replace(path=tuple(map(str, path))))  # the line at ``path`` in key's tree


def made_up_id(key: str, k: int) -> str:
    return line_id(key, (*TrajectoryId.parse(key).path, f"r{k}"))  # leaf k made up from the prompt for line key


def moved(tid: str, key: str) -> str:
    line = TrajectoryId.parse(key)  # ``tid`` (a part of one line) as it is named in the line ``key``, a clone
    return str(TrajectoryId.parse(tid)._replace(root=line.root, path=line.path))
