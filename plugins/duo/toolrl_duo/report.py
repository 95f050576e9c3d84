"""The multi-agent demo's last line, from two evaluations of the held-out split (before and after training):

    python -m toolrl_duo.report BEFORE.jsonl AFTER.jsonl
    held-out success: before A/64 → after B/64 (roles: planner P/64→Q/64, executor E/n→F/m)

Each file holds an evaluation's rows, one per episode (``toolrl eval``'s ``results.jsonl``, or the
``eval/step_NNNNN.jsonl`` of a run with ``trainer.eval_every``): ``success`` is the pair's, and each
role's metric is the reward the program gave that role (``role_rewards``: the planner's in every
episode, the executor's in those where it ran, so its count is out of those).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from toolrl_duo.agent import EXECUTOR, PLANNER


@dataclass(frozen=True)
class Tally:
    """An evaluation's figures: episodes and successes, and per role (episodes it acted in, its successes)."""

    episodes: int
    solved: int
    roles: dict[str, tuple[int, int]]


def tally(path: Path) -> Tally:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    roles: dict[str, tuple[int, int]] = {}
    for row in rows:
        for role, reward in row["role_rewards"].items():
            acted, right = roles.get(role, (0, 0))
            roles[role] = (acted + 1, right + (reward >= 1.0))
    return Tally(len(rows), sum(bool(row["success"]) for row in rows), roles)


def line(before: Tally, after: Tally) -> str:
    def role(name: str) -> str:
        (n0, r0), (n1, r1) = before.roles.get(name, (0, 0)), after.roles.get(name, (0, 0))
        return f"{name} {r0}/{n0}→{r1}/{n1}"

    return (f"held-out success: before {before.solved}/{before.episodes} → after {after.solved}/{after.episodes} "
            f"(roles: {role(PLANNER)}, {role(EXECUTOR)})")


if __name__ == "__main__":
    print(line(tally(Path(sys.argv[1])), tally(Path(sys.argv[2]))))
