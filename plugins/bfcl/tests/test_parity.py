"""Parity with BFCL: the same model answers scored by toolrl and by `bfcl evaluate` give the same numbers.

The answers are recorded (recorded/*.jsonl, written by make_recorded.py): a dozen entries of every
single-turn category the plugin runs, each with the raw text a prompted model answered it with -- right
answers, wrong values, a wrong function, a missing parameter, an extra call, prose, call lists cut short,
``[]``, fenced answers, positional arguments, prose before a call list -- and seven multi_turn_base entries,
each with the raw text of every step of every user turn (right, calls split over steps, a wrong value, a
turn skipped, an unknown function, a fenced step, a step cut short before the calls).

toolrl's side is `toolrl eval` itself, the scripted engine answering each entry with its recorded text: the
real rollout (BFCL's prompt, the tiny model's tokenizer and chat template, the ``pythonic`` parser, the
``bfcl`` session, BFCL's checker as the plugin calls it, the report in summary.json). BFCL's side is its own
CLI, `bfcl evaluate --partial-eval`, on result files holding the same texts, written where and as BFCL's
generation writes them (``result/MODEL/GROUP/BFCL_v4_CATEGORY_result.json``, one ``{"id", "result"}`` a
line), for ``Qwen/Qwen3-8B``: a prompting model (``is_fc_model`` False) whose checker keeps BFCL's dotted
names (``underscore_to_dot`` False), whose handler (QwenHandler, an OSSHandler) decodes with BFCL's default
``default_decode_ast_prompting`` and strips nothing at evaluation (its ``<think>`` split happens at
inference, before the result file is written; multi-turn steps go through its default
``default_decode_execute_prompting``). ``Qwen/Qwen3-1.7B`` (the same handler) gets the non-live answers
only, so that the same run shows BFCL's table with categories left out; ``Qwen/Qwen3-4B-Instruct-2507``
(the same handler) every answer, multi-turn included.

`bfcl evaluate` needs bfcl-eval's full install (its model table imports every provider SDK), which the
plugin's own venv does not have (``--no-deps``, the README): nox's ``plugin(bfcl)`` session makes a venv of
its own for it and names its Python in TOOLRL_BFCL_FULL_PYTHON. Without it these tests skip.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

RECORDED = Path(__file__).resolve().parent / "recorded"
FULL_PYTHON = os.environ.get("TOOLRL_BFCL_FULL_PYTHON")
needs_bfcl = pytest.mark.skipif(
    not FULL_PYTHON, reason="needs bfcl-eval's full install for `bfcl evaluate`: run nox -s 'plugin(bfcl)', "
                            "which makes it and sets TOOLRL_BFCL_FULL_PYTHON")
# BFCL's model names (QwenHandler, prompting) and their display names in its CSVs.
MODEL, SUBSET_MODEL, ALL_MODEL = "Qwen/Qwen3-8B", "Qwen/Qwen3-1.7B", "Qwen/Qwen3-4B-Instruct-2507"
DISPLAY = {MODEL: "Qwen3-8B (Prompt)", SUBSET_MODEL: "Qwen3-1.7B (Prompt)",
           ALL_MODEL: "Qwen3-4B-Instruct-2507 (Prompt)"}
SINGLE_TURN = ["simple_python", "multiple", "parallel", "parallel_multiple", "irrelevance", "live_simple",
               "live_multiple", "live_parallel", "live_parallel_multiple", "live_irrelevance", "live_relevance"]
NON_LIVE = SINGLE_TURN[:5]
MULTI_TURN = "multi_turn_base"
# toolrl's summary rows and the leaderboard CSV columns BFCL shows them in. non_live_ast is BFCL's
# "Non-Live Overall Acc" (data_non_live.csv): the mean over simple (Python, Java and JavaScript, the two
# that never run here at 0), multiple, parallel and parallel multiple, shown even where a category is
# missing. data_overall.csv's "Non-Live AST Acc" is the same mean shown as N/A whenever one is missing,
# which Java and JavaScript always are here: toolrl reports no such row. BFCL's CSV writes a figure as a
# percentage with two decimals ("12.50%") and a category left out of the evaluation as "N/A"; toolrl's
# report rounds to two decimals too (report.py) and writes None for N/A. Only irrelevance (N/A unless
# both irrelevance categories ran) and relevance (N/A unless live_relevance ran) can be N/A; the others are
# means that count a missing category as 0.
SUMMARY_COLUMNS = {
    "summary/non_live_ast": ("data_non_live.csv", "Non-Live Overall Acc"),
    "summary/live_ast": ("data_overall.csv", "Live Acc"),
    "summary/multi_turn": ("data_overall.csv", "Multi Turn Acc"),
    "summary/irrelevance": ("data_overall.csv", "Irrelevance Detection"),
    "summary/relevance": ("data_overall.csv", "Relevance Detection"),
    "summary/overall": ("data_overall.csv", "Overall Acc"),
}


def recorded(categories: list[str]) -> list[dict[str, str]]:
    return [json.loads(line) for c in categories for line in (RECORDED / f"{c}.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def answers() -> list[dict[str, str]]:
    return recorded(SINGLE_TURN)


@pytest.fixture(scope="module")
def toolrl_eval(answers, tmp_path_factory) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """`toolrl eval` of every recorded answer: its summary.json and results.jsonl rows."""
    from toolrl.cli import cli
    from toolrl_bfcl.environment import BfclOptions, tasks

    text = {a["id"]: a["text"] for a in answers}
    samples = tasks(BfclOptions(test=SINGLE_TURN, ids=list(text)), "test")
    assert sorted(s.ground_truth["id"] for s in samples) == sorted(text)
    # A trajectory's session id is eval<chunk>-s<sample index>-g<group>-<k>: "-s<index>-g" picks its entry.
    script = {f"-s{s.index}-g": [text[s.ground_truth["id"]]] for s in samples}
    tmp = tmp_path_factory.mktemp("toolrl")
    config = tmp / "eval.yaml"
    config.write_text(yaml.safe_dump({
        "model": {"source": "tiny-qwen3"},
        "env": "bfcl", "env_options": {"test": SINGLE_TURN, "ids": list(text)},
        "engine": {"name": "scripted", "options": {"script": script}},
        "rollout": {"max_new_tokens": 1024, "max_response_tokens": 1024},
    }, allow_unicode=True))
    result = CliRunner().invoke(cli, ["eval", str(config), "--output", str(tmp / "out")])
    assert result.exit_code == 0, result.output[-3000:]
    summary = json.loads((tmp / "out" / "summary.json").read_text())
    rows = [json.loads(line) for line in (tmp / "out" / "results.jsonl").read_text().splitlines()]
    assert len(rows) == len(answers)
    for row in rows:  # each entry answered with its own text, none failed by the infrastructure
        assert row["termination"] != "infra_error" and row["error"] is None, row
        assert text[row["ground_truth"]["id"]] in row["response_text"]
    return summary, rows


@pytest.fixture(scope="module")
def toolrl_multi_turn(tmp_path_factory) -> list[dict[str, Any]]:
    """`toolrl eval` of the recorded multi-turn answers, the scripted engine giving each trajectory its
    entry's steps in order (the session's user turns between them): the results.jsonl rows."""
    from toolrl.cli import cli
    from toolrl_bfcl.environment import BfclOptions, tasks

    steps = {a["id"]: [text for turn in a["turns"] for text in turn] for a in recorded([MULTI_TURN])}
    samples = tasks(BfclOptions(test=[MULTI_TURN], ids=list(steps)), "test")
    tmp = tmp_path_factory.mktemp("toolrl-multi-turn")
    config = tmp / "eval.yaml"
    config.write_text(yaml.safe_dump({
        # Qwen2.5's template: it appends at user turns (Qwen3's rewrites earlier turns' thinking).
        "model": {"source": "tiny-qwen3", "tokenizer": "qwen2_5"},
        "env": "bfcl", "env_options": {"test": [MULTI_TURN], "ids": list(steps)},
        "engine": {"name": "scripted", "options": {"script": {
            f"-s{s.index}-g": steps[s.ground_truth["id"]] for s in samples}}},
        "rollout": {"max_turns": 60, "max_new_tokens": 1024, "max_response_tokens": 32768},
    }))
    result = CliRunner().invoke(cli, ["eval", str(config), "--output", str(tmp / "out")])
    assert result.exit_code == 0, result.output[-3000:]
    rows = [json.loads(line) for line in (tmp / "out" / "results.jsonl").read_text().splitlines()]
    assert sorted(r["ground_truth"]["id"] for r in rows) == sorted(steps)
    for row in rows:
        assert row["termination"] == "answered" and row["error"] is None, row
    return rows


def bfcl_group(category: str) -> str:
    return "multi_turn" if category.startswith("multi_turn") else "live" if category.startswith("live_") \
        else "non_live"


@pytest.fixture(scope="module")
def bfcl_evaluate(answers, tmp_path_factory) -> Path:
    """`bfcl evaluate` on the same answers, in BFCL's result layout under a project root of its own:
    MODEL gets every single-turn category, SUBSET_MODEL the non-live ones, ALL_MODEL those and multi-turn.
    Its score directory."""
    root = tmp_path_factory.mktemp("bfcl")
    for model, categories in ((MODEL, SINGLE_TURN), (SUBSET_MODEL, NON_LIVE), (ALL_MODEL, SINGLE_TURN + [MULTI_TURN])):
        for category in categories:
            folder = root / "result" / model.replace("/", "_") / bfcl_group(category)
            folder.mkdir(parents=True, exist_ok=True)
            lines = [{"id": a["id"], "result": a.get("text", a.get("turns"))} for a in recorded([category])]
            (folder / f"BFCL_v4_{category}_result.json").write_text(
                "".join(json.dumps(line) + "\n" for line in lines))
    bfcl = Path(FULL_PYTHON).parent / "bfcl"
    done = subprocess.run([str(bfcl), "evaluate", "--model", ",".join(DISPLAY), "--test-category",
                           ",".join(SINGLE_TURN + [MULTI_TURN]), "--partial-eval"], cwd=root, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "BFCL_PROJECT_ROOT": str(root)})
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    return root / "score"


def bfcl_scores(score_dir: Path, model: str) -> dict[str, dict[str, Any]]:
    """BFCL's score files: per category its header (accuracy, correct_count, total_count) and the ids it
    failed."""
    out = {}
    for path in (score_dir / model.replace("/", "_")).rglob("BFCL_v4_*_score.json"):
        header, *failed = [json.loads(line) for line in path.read_text().splitlines()]
        out[path.name.removeprefix("BFCL_v4_").removesuffix("_score.json")] = {
            **header, "failed": {f["id"] for f in failed}}
    return out


def bfcl_csv(score_dir: Path, name: str, model: str) -> dict[str, str]:
    """The row of ``model`` (by its BFCL display name) in one of BFCL's leaderboard CSVs."""
    with open(score_dir / name, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["Model"] == DISPLAY[model]]
    assert len(rows) == 1, f"{name}: no single row for {DISPLAY[model]}"
    return rows[0]


def percent(cell: str) -> float | None:
    return None if cell == "N/A" else float(cell.removesuffix("%"))


def verdicts(rows: list[dict[str, Any]]) -> dict[str, bool]:
    return {r["ground_truth"]["id"]: r["reward_parts"]["bfcl.verdict"] == 1.0 for r in rows}


@needs_bfcl
def test_every_answer_gets_bfcls_verdict(answers, toolrl_eval, bfcl_evaluate):
    _, rows = toolrl_eval
    scores = bfcl_scores(bfcl_evaluate, MODEL)
    assert sorted(scores) == sorted(SINGLE_TURN)
    assert sorted(bfcl_scores(bfcl_evaluate, SUBSET_MODEL)) == sorted(NON_LIVE)
    assert sorted(bfcl_scores(bfcl_evaluate, ALL_MODEL)) == sorted(SINGLE_TURN + [MULTI_TURN])
    ours = verdicts(rows)
    theirs = {a["id"]: a["id"] not in scores[bfcl_category(a["id"])]["failed"] for a in answers}
    differ = [f"{a['id']} ({a['kind']}): toolrl {ours[a['id']]:d}, BFCL {theirs[a['id']]:d}: {a['text']!r}"
              for a in answers if ours[a["id"]] != theirs[a["id"]]]
    assert not differ, f"{len(differ)} of {len(answers)} answers scored otherwise:\n" + "\n".join(differ)
    # The recorded answers are a mix, right and wrong, in every category.
    for category in SINGLE_TURN:
        got = [ours[a["id"]] for a in recorded([category])]
        assert any(got) and not all(got), category


def bfcl_category(entry_id: str) -> str:
    return entry_id.rsplit("_", 1)[0]


@needs_bfcl
def test_accuracy_per_category_and_summary_rows_are_bfcls(toolrl_eval, bfcl_evaluate):
    summary, rows = toolrl_eval
    report = summary["reports"]["bfcl"]
    scores = bfcl_scores(bfcl_evaluate, MODEL)
    for category in SINGLE_TURN:
        mine = [r for r in rows if bfcl_category(r["ground_truth"]["id"]) == category]
        assert (sum(verdicts(mine).values()), len(mine)) == (scores[category]["correct_count"],
                                                             scores[category]["total_count"]), category
        assert report[category] == round(100 * scores[category]["accuracy"], 2), category
    for row, (name, column) in SUMMARY_COLUMNS.items():
        assert report[row] == percent(bfcl_csv(bfcl_evaluate, name, MODEL)[column]), row
    assert report["summary/irrelevance"] is not None and report["summary/relevance"] is not None


@needs_bfcl
def test_summary_rows_with_categories_left_out_are_bfcls(toolrl_eval, bfcl_evaluate):
    """The non-live categories only: BFCL's N/A (irrelevance without live_irrelevance, relevance without
    live_relevance) is toolrl's None, and the live mean counts the missing categories as 0, as BFCL's does.
    toolrl's figures from the rows of those entries, through the environment's report (what toolrl eval
    calls); BFCL's from SUBSET_MODEL's row."""
    from toolrl_bfcl.environment import BFCL

    _, rows = toolrl_eval
    report = BFCL.report([r for r in rows if bfcl_category(r["ground_truth"]["id"]) in NON_LIVE])
    assert sorted(bfcl_scores(bfcl_evaluate, SUBSET_MODEL)) == sorted(NON_LIVE)
    assert [c for c in report if not c.startswith("summary/")] == NON_LIVE
    for row, (name, column) in SUMMARY_COLUMNS.items():
        assert report[row] == percent(bfcl_csv(bfcl_evaluate, name, SUBSET_MODEL)[column]), row
    assert report["summary/irrelevance"] is None and report["summary/relevance"] is None
    assert report["summary/live_ast"] == 0.0


@needs_bfcl
def test_multi_turn_answers_get_bfcls_verdict_and_figures(toolrl_eval, toolrl_multi_turn, bfcl_evaluate):
    """multi_turn_base: each entry's verdict is BFCL's on the same steps (BFCL's result format for
    multi-turn: ``"result": [[step, ...], ...]``, one list per user turn); the category's accuracy and every
    summary row over all the answers (toolrl's through the environment's report, as toolrl eval computes
    them) are ALL_MODEL's."""
    from toolrl_bfcl.environment import BFCL

    answers = recorded([MULTI_TURN])
    scores = bfcl_scores(bfcl_evaluate, ALL_MODEL)[MULTI_TURN]
    ours = verdicts(toolrl_multi_turn)
    theirs = {a["id"]: a["id"] not in scores["failed"] for a in answers}
    differ = [f"{a['id']} ({a['kind']}): toolrl {ours[a['id']]:d}, BFCL {theirs[a['id']]:d}: {a['turns']!r}"
              for a in answers if ours[a["id"]] != theirs[a["id"]]]
    assert not differ, f"{len(differ)} of {len(answers)} answers scored otherwise:\n" + "\n".join(differ)
    assert any(ours.values()) and not all(ours.values())
    report = BFCL.report(toolrl_eval[1] + toolrl_multi_turn)
    assert report[MULTI_TURN] == round(100 * scores["accuracy"], 2)
    for row, (name, column) in SUMMARY_COLUMNS.items():
        assert report[row] == percent(bfcl_csv(bfcl_evaluate, name, ALL_MODEL)[column]), row
