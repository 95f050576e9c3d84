"""The BFCL demo's last line, from two ``toolrl eval`` output directories (their ``summary.json`` reports):

    python -m toolrl_bfcl.headline runs/bfcl-eval/before runs/bfcl-eval/after

prints ``BFCL non-live AST (held out): before X% → after Y% (irrelevance A% → B%)``. The non-live AST
figure is the unweighted mean of the four Python AST categories (simple_python, multiple, parallel,
parallel_multiple): BFCL's non-live AST summary without its Java and JavaScript parts, which the plugin
does not run (BFCL would count them 0).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

AST = ("simple_python", "multiple", "parallel", "parallel_multiple")


def figures(directory: str) -> tuple[float, float]:
    """The non-live AST mean and the irrelevance accuracy of one evaluation, in percent."""
    summary = json.loads(Path(directory, "summary.json").read_text(encoding="utf-8"))
    report = summary.get("reports", {}).get("bfcl")
    if report is None or any(report.get(c) is None for c in (*AST, "irrelevance")):
        raise SystemExit(f"{directory}: not a BFCL evaluation of {', '.join(AST)} and irrelevance")
    return statistics.fmean(report[c] for c in AST), report["irrelevance"]


def main(argv: list[str]) -> None:
    if len(argv) != 2:
        raise SystemExit("usage: python -m toolrl_bfcl.headline BEFORE_DIR AFTER_DIR")
    (ast_a, irr_a), (ast_b, irr_b) = figures(argv[0]), figures(argv[1])
    print(f"BFCL non-live AST (held out): before {ast_a:.1f}% → after {ast_b:.1f}% "
          f"(irrelevance {irr_a:.1f}% → {irr_b:.1f}%)")


if __name__ == "__main__":
    main(sys.argv[1:])
