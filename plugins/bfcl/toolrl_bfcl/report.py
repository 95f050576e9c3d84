"""BFCL's figures from an evaluation's rows (``Environment.report``; ``toolrl eval`` prints them): accuracy
per category, then the leaderboard's summary rows, composed as BFCL's ``generate_leaderboard_csv``
composes them and computed by its own helpers (unweighted means of non-live and multi-turn, the
live mean weighted by entries, overall weighted 10/10/10/30/40 over non-live, live, irrelevance,
multi-turn and agentic). A category left out of the evaluation counts 0 and shows ``None``, as BFCL's
table shows N/A; the agentic categories (web search, memory) never run here, so ``overall`` is BFCL's
overall with them at 0. Accuracies are percentages.

A row counts by its session's verdict (``reward_parts["bfcl.verdict"]``, or the ``bfcl`` term where the
reward is the verdict); a trajectory the infrastructure failed counts as wrong, since BFCL has no such
case and its denominators are the entries.
"""

from __future__ import annotations

from typing import Any

from toolrl_bfcl import categories, upstream


def verdict(row: dict[str, Any]) -> bool:
    parts = row.get("reward_parts") or {}
    value = parts.get("bfcl.verdict", (row.get("reward_terms") or {}).get("bfcl", 0.0))
    return row.get("termination") != "infra_error" and value >= 1.0


def category_scores(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``{category: {"accuracy", "total_count", "correct_count"}}``, BFCL's score-file figures."""
    counts: dict[str, list[int]] = {}
    for row in rows:
        category = categories.category_of((row.get("ground_truth") or {})["id"])
        total = counts.setdefault(category, [0, 0])
        total[0] += verdict(row)
        total[1] += 1
    return {c: {"accuracy": right / n, "total_count": n, "correct_count": right} for c, (right, n) in counts.items()}


def summary_rows(scores: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The leaderboard's summary rows (BFCL's helpers, BFCL's composition)."""
    helper = upstream.load().leaderboard

    def score(category: str) -> dict[str, Any]:
        if category in scores:
            return {**scores[category], "display_accuracy": scores[category]["accuracy"]}
        if category in categories.KINDS:
            return {"accuracy": 0, "total_count": len(categories.entries(category)), "display_accuracy": "N/A"}
        return {"accuracy": 0, "total_count": 0, "display_accuracy": "N/A"}  # never runs here

    unweighted, weighted = helper.calculate_unweighted_accuracy, helper.calculate_weighted_accuracy
    simple = unweighted([score("simple_python"), score("simple_java"), score("simple_javascript")])
    non_live_parts = [simple, score("multiple"), score("parallel"), score("parallel_multiple")]
    non_live = unweighted(non_live_parts, display_na_if_category_missing=False)
    live_parts = [score("live_simple"), score("live_multiple"), score("live_parallel"),
                  score("live_parallel_multiple")]
    live = weighted(live_parts, display_na_if_category_missing=False)
    multi_turn = unweighted([score(c) for c in categories.GROUPS["multi_turn"]], display_na_if_category_missing=False)
    agentic = unweighted([unweighted([score("web_search_base"), score("web_search_no_snippet")]),
                          unweighted([score("memory_kv"), score("memory_vector"), score("memory_rec_sum")])],
                         display_na_if_category_missing=False)
    irrelevance = unweighted([score("irrelevance"), score("live_irrelevance")])
    overall = helper.calculate_percentage_weighted_accuracy(
        [non_live, live, irrelevance, multi_turn, agentic], [10, 10, 10, 30, 40],
        display_na_if_category_missing=False)
    return {"non_live_ast": non_live, "live_ast": live, "multi_turn": multi_turn, "irrelevance": irrelevance,
            "relevance": score("live_relevance"), "overall": overall}


def _percent(figure: dict[str, Any]) -> float | None:
    shown = figure["display_accuracy"]
    return None if shown == "N/A" else round(100 * float(shown), 2)


def leaderboard(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    """Accuracy per evaluated category, then the summary rows (``summary/NAME``), in percent."""
    scores = category_scores(rows)
    out: dict[str, float | None] = {c: round(100 * s["accuracy"], 2) for c, s in sorted(
        scores.items(), key=lambda item: list(categories.KINDS).index(item[0]))}
    out.update({f"summary/{name}": _percent(figure) for name, figure in summary_rows(scores).items()})
    return out
