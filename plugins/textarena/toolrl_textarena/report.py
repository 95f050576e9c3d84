"""The self-play demo's last line, from two evaluations of the held-out split (games against a fixed
player, before and after training):

    python -m toolrl_textarena.report BEFORE.jsonl AFTER.jsonl random
    held-out win rate vs random: before A/64 → after B/64 (draws C → D)

Each file holds an evaluation's rows, one per game (``toolrl eval``'s ``results.jsonl``, or the
``eval/step_NNNNN.jsonl`` of a run with ``trainer.eval_every``); a game is won when the model's seat
got the game's winning reward (the ``textarena`` term, 1), drawn at 0.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def tally(path: Path) -> tuple[int, int, int]:
    """Games, wins and draws of one evaluation."""
    # Split on newlines only: str.splitlines() also splits on U+2028, which a row's UTF-8 text may hold.
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").split("\n") if line.strip()]
    rewards = [row["reward_terms"].get("textarena", 0.0) for row in rows]
    return len(rows), sum(r >= 1.0 for r in rewards), sum(r == 0.0 for r in rewards)


def line(before: tuple[int, int, int], after: tuple[int, int, int], opponent: str) -> str:
    return (f"held-out win rate vs {opponent}: before {before[1]}/{before[0]} → after {after[1]}/{after[0]} "
            f"(draws {before[2]} → {after[2]})")


if __name__ == "__main__":
    print(line(tally(Path(sys.argv[1])), tally(Path(sys.argv[2])), sys.argv[3]))
