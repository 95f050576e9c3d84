"""The TextWorld demo's last line, from two ``toolrl eval`` output directories:

    python -m toolrl_textworld.headline runs/textworld-eval/before runs/textworld-eval/after

prints ``TextWorld held-out games won: before A/N → after B/N`` (greedy; a game is won when its session
scored the win, the environment's metric).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def won(directory: str) -> tuple[int, int]:
    """Games won and games played in one evaluation (its results.jsonl, one trajectory a game)."""
    rows = [json.loads(line) for line in Path(directory, "results.jsonl").read_text(encoding="utf-8").splitlines()]
    if not rows or any(r.get("env") not in (None, "textworld") for r in rows):
        raise SystemExit(f"{directory}: not an evaluation of the textworld environment")
    return sum(1 for r in rows if r["reward_terms"].get("textworld") == 1.0), len(rows)


def main(argv: list[str]) -> None:
    if len(argv) != 2:
        raise SystemExit("usage: python -m toolrl_textworld.headline BEFORE_DIR AFTER_DIR")
    (a, n), (b, m) = won(argv[0]), won(argv[1])
    print(f"TextWorld held-out games won: before {a}/{n} → after {b}/{m}")


if __name__ == "__main__":
    main(sys.argv[1:])
