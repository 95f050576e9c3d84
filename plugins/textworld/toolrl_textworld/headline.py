"""The TextWorld demo's result line, from two ``toolrl eval`` output directories:

    python -m toolrl_textworld.headline runs/textworld-eval/before runs/textworld-eval/after

prints ``TextWorld held-out games won, greedy: before A/N → after B/N`` or, for evaluations that sampled,
``TextWorld held-out games won, sampled at temperature T, K plays a game: before A/N → after B/N`` (N: the
plays; a play is won when its session scored the win, the environment's metric).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def won(directory: str) -> tuple[int, int]:
    """Plays won and plays made in one evaluation (its results.jsonl, one trajectory a play)."""
    rows = [json.loads(line) for line in Path(directory, "results.jsonl").read_text(encoding="utf-8").splitlines()]
    if not rows or any(r.get("env") not in (None, "textworld") for r in rows):
        raise SystemExit(f"{directory}: not an evaluation of the textworld environment")
    return sum(1 for r in rows if r["reward_terms"].get("textworld") == 1.0), len(rows)


def how(directory: str) -> str:
    """How the evaluation played (its summary.json): greedy, or sampled at a temperature, K plays a game."""
    summary = json.loads(Path(directory, "summary.json").read_text(encoding="utf-8"))
    if not summary["temperature"]:
        return "greedy"
    return f"sampled at temperature {summary['temperature']:g}, {summary['n']} plays a game"


def headline(before: str, after: str) -> str:
    if how(before) != how(after):
        raise SystemExit(f"{before} was {how(before)}, {after} {how(after)}: compare evaluations played alike")
    (a, n), (b, m) = won(before), won(after)
    return f"TextWorld held-out games won, {how(before)}: before {a}/{n} → after {b}/{m}"


def main(argv: list[str]) -> None:
    if len(argv) != 2:
        raise SystemExit("usage: python -m toolrl_textworld.headline BEFORE_DIR AFTER_DIR")
    print(headline(*argv))


if __name__ == "__main__":
    main(sys.argv[1:])
