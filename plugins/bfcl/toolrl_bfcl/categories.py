"""BFCL's test categories as the plugin runs them: which it can run here, why it refuses the others (one
line each, before anything loads), and each category's entries and possible answers, read with BFCL's own
loaders (its language hints and the multi-turn categories' function docs included)."""

from __future__ import annotations

import functools
from typing import Any, Literal

# What each runnable category is scored as (BFCL's eval_runner decides by the same names).
Kind = Literal["ast", "relevance", "irrelevance", "multi_turn"]
KINDS: dict[str, Kind] = {
    "simple_python": "ast", "multiple": "ast", "parallel": "ast", "parallel_multiple": "ast",
    "irrelevance": "irrelevance",
    "live_simple": "ast", "live_multiple": "ast", "live_parallel": "ast", "live_parallel_multiple": "ast",
    "live_irrelevance": "irrelevance", "live_relevance": "relevance",
    "multi_turn_base": "multi_turn", "multi_turn_miss_func": "multi_turn", "multi_turn_miss_param": "multi_turn",
    "multi_turn_long_context": "multi_turn",
}
# Groups of categories a config may name instead (BFCL's own collection names, where it runs here).
GROUPS: dict[str, list[str]] = {
    "non_live": ["simple_python", "multiple", "parallel", "parallel_multiple", "irrelevance"],
    "live": ["live_simple", "live_multiple", "live_parallel", "live_parallel_multiple", "live_irrelevance",
             "live_relevance"],
    "multi_turn": ["multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context"],
}
GROUPS["single_turn"] = GROUPS["non_live"] + GROUPS["live"]
# BFCL categories the plugin does not run, and why (the one line a config naming them gets).
REFUSED: dict[str, str] = {
    "web_search_base": "needs SerpAPI (a key) and live web pages: no network here",
    "web_search_no_snippet": "needs SerpAPI (a key) and live web pages: no network here",
    "web_search": "needs SerpAPI (a key) and live web pages: no network here",
    "memory_vector": "needs its embedding model (all-MiniLM-L6-v2) from the Hugging Face Hub",
    "memory_kv": "an agentic memory category: not run by this plugin yet",
    "memory_rec_sum": "an agentic memory category: not run by this plugin yet",
    "memory": "needs an embedding model (all-MiniLM-L6-v2) from the Hugging Face Hub (memory_vector); the "
              "others are not run yet",
    "format_sensitivity": "not a scoring category (BFCL reports its spread only)",
    "simple_java": "Java answers need a Java call parser; toolrl has none yet",
    "simple_javascript": "JavaScript answers need a JavaScript call parser; toolrl has none yet",
}


def expand(names: list[str]) -> list[str]:
    """Category and group names → categories, in order, each once; ValueError naming the first that is
    unknown or refused."""
    out: list[str] = []
    for name in names:
        if name in REFUSED:
            raise ValueError(f"BFCL category {name!r} cannot run here: {REFUSED[name]}")
        members = GROUPS.get(name, [name] if name in KINDS else None)
        if members is None:
            raise ValueError(f"unknown BFCL category {name!r} (categories: {', '.join(KINDS)}; groups: "
                             f"{', '.join(GROUPS)})")
        out += [m for m in members if m not in out]
    return out


def category_of(entry_id: str) -> str:
    """The category of an entry id (``live_simple_3-2-0`` → ``live_simple``), as BFCL reads it."""
    from toolrl_bfcl.upstream import load

    return load().utils.extract_test_category_from_id(entry_id)


@functools.cache
def entries(category: str) -> tuple[dict[str, Any], ...]:
    """The category's entries in BFCL's order, each with its possible answer under ``"ground_truth"``
    where the category has them (irrelevance and relevance have none)."""
    from toolrl_bfcl.upstream import load

    utils = load().utils
    loaded = utils.load_dataset_entry(category)
    if KINDS[category] in ("ast", "multi_turn"):
        answers = {a["id"]: a["ground_truth"] for a in utils.load_ground_truth_entry(category)}
        loaded = [{**e, "ground_truth": answers[e["id"]]} for e in loaded]
    return tuple(loaded)


@functools.cache
def by_id(category: str) -> dict[str, dict[str, Any]]:
    return {e["id"]: e for e in entries(category)}


def entry(entry_id: str) -> dict[str, Any]:
    """One entry by its id; KeyError naming it if no category holds it."""
    category = category_of(entry_id)
    if category not in KINDS or entry_id not in by_id(category):
        raise KeyError(f"no BFCL entry {entry_id!r}")
    return by_id(category)[entry_id]
