"""The demo's last line: the pair's success and each role's metric, counted from two evaluations' rows
(the executor's out of the episodes it acted in)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from toolrl_duo.report import line, tally


def rows(path: Path, episodes: list[tuple[bool, dict[str, float]]]) -> Path:
    path.write_text("".join(json.dumps({"success": s, "role_rewards": r, "reward": float(s)}) + "\n"
                            for s, r in episodes), encoding="utf-8")
    return path


def test_the_line_counts_success_and_each_role_from_the_rows(tmp_path: Path) -> None:
    before = rows(tmp_path / "before.jsonl", [(False, {"planner": 0.0}), (False, {"planner": 1.0, "executor": 0.0}),
                                              (True, {"planner": 1.0, "executor": 1.0}), (False, {"planner": 0.0})])
    after = rows(tmp_path / "after.jsonl", [(True, {"planner": 1.0, "executor": 1.0}),
                                            (False, {"planner": 0.0, "executor": 1.0}),
                                            (True, {"planner": 1.0, "executor": 1.0}), (False, {"planner": 0.0})])
    assert tally(before).roles == {"planner": (4, 2), "executor": (2, 1)}
    expected = "held-out success: before 1/4 → after 2/4 (roles: planner 2/4→2/4, executor 1/2→3/3)"
    assert line(tally(before), tally(after)) == expected
    ran = subprocess.run([sys.executable, "-m", "toolrl_duo.report", str(before), str(after)], capture_output=True,
                         text=True, check=True)
    assert ran.stdout == expected + "\n"
