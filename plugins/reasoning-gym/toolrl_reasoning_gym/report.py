"""The reasoning-gym demo's last line, from two evaluations of the held-out split (before and after
training) and the run's training batches:

    python -m toolrl_reasoning_gym.report BEFORE.jsonl AFTER.jsonl ROLLOUTS_DIR
    held-out success: before A/64 → after B/64 (on the N problems no training batch held: a/N → b/N)

Each evaluation file holds one row per held-out problem (``toolrl eval``'s ``results.jsonl``, or the
``eval/step_NNNNN.jsonl`` of a run with ``trainer.eval_every``); a problem is solved at the generator's
full score (1.0). The splits never share a seed, but a small generator config repeats its questions
(two one-digit terms give 200), so the same question can be in both: the parenthesis counts only the
held-out problems whose question text no row of ``ROLLOUTS_DIR/step_*.jsonl`` was asked.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from pathlib import Path

from toolrl_reasoning_gym.generators import entry


def rows(path: Path) -> list[dict]:
    # Split on newlines only: str.splitlines() also splits on U+2028, which a row's UTF-8 text may hold.
    return [json.loads(line) for line in path.read_text(encoding="utf-8").split("\n") if line.strip()]


def question(row: dict) -> str:
    """The question a row was asked, regenerated from the entry its ground truth names."""
    return entry(row["ground_truth"])[1]["question"]


def solved(evaluation: Iterable[dict]) -> dict[str, bool]:
    """Each held-out row's key (its generator, config, seed and index) and whether it got full score."""
    return {json.dumps(r["ground_truth"], sort_keys=True): r["reward_terms"].get("reasoning_gym", 0.0) >= 1.0
            for r in evaluation}


def line(before: list[dict], after: list[dict], trained: Iterable[dict]) -> str:
    """The report's line (module docstring). ``before`` and ``after`` must hold the same problems."""
    b, a = solved(before), solved(after)
    if b.keys() != a.keys():
        raise ValueError(f"the two evaluations hold different problems ({len(b)} and {len(a)} rows, "
                         f"{len(b.keys() & a.keys())} in both)")
    asked = {question(r) for r in trained}
    texts = {json.dumps(r["ground_truth"], sort_keys=True): question(r) for r in after}
    unseen = [k for k in a if texts[k] not in asked]
    return (f"held-out success: before {sum(b.values())}/{len(b)} → after {sum(a.values())}/{len(a)} "
            f"(on the {len(unseen)} problems no training batch held: {sum(b[k] for k in unseen)}/{len(unseen)} → "
            f"{sum(a[k] for k in unseen)}/{len(unseen)})")


def main(argv: list[str]) -> None:
    before, after, rollouts = (Path(p) for p in argv)
    trained = [r for f in sorted(rollouts.glob("step_*.jsonl")) for r in rows(f)]
    print(line(rows(before), rows(after), trained))


if __name__ == "__main__":
    main(sys.argv[1:])
