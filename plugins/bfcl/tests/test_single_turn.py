"""The single-turn kinds through `toolrl eval` with the scripted engine (the real rollout: BFCL's prompt, the
tiny model's tokenizer and chat template, the parser, the ``bfcl`` session, BFCL's checker): an AST entry
right, wrong and in prose; irrelevance and relevance; the ``native`` format; the shaped reward. Then what is
refused in one line before anything loads, model answers that try to run code, and listing the plugin
without importing bfcl-eval."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from toolrl.cli import cli
from toolrl.testing import listing_imports


def evaluate(tmp_path: Path, answers: dict[str, str], **options: Any) -> dict[str, dict[str, Any]]:
    """`toolrl eval` of the test split holding the entries of ``answers``, each answered with its text:
    the results.jsonl row of each entry id."""
    from toolrl_bfcl.categories import category_of
    from toolrl_bfcl.environment import BfclOptions, tasks

    test = list(dict.fromkeys(category_of(i) for i in answers))
    samples = tasks(BfclOptions(test=test, ids=list(answers)), "test")
    config = tmp_path / "eval.yaml"
    config.write_text(yaml.safe_dump({
        "model": {"source": "tiny-qwen3"},
        "env": "bfcl", "env_options": {"test": test, "ids": list(answers), **options},
        # A trajectory's session id is eval<chunk>-s<sample index>-g<group>-<k>.
        "engine": {"name": "scripted", "options": {"script": {
            f"-s{s.index}-g": [answers[s.ground_truth["id"]]] for s in samples}}},
        "rollout": {"max_new_tokens": 256, "max_response_tokens": 256},
    }))
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["eval", str(config), "--output", str(out)])
    assert result.exit_code == 0, result.output[-3000:]
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    for row in rows:
        assert row["termination"] != "infra_error" and row["error"] is None, row
    return {r["ground_truth"]["id"]: r for r in rows}


def verdict(row: dict[str, Any]) -> float:
    return row["reward_parts"]["bfcl.verdict"]


def test_each_kind_gets_bfcls_verdict(tmp_path):
    rows = evaluate(tmp_path, {
        "simple_python_1": "[math.factorial(number=5)]",  # ast, right (a dotted name, as BFCL prompts it)
        "simple_python_0": "[calculate_triangle_area(base=11, height=5)]",  # ast, a wrong value
        "simple_python_2": "The hypotenuse is sqrt(4**2 + 5**2), about 6.4.",  # ast, prose
        "irrelevance_0": "None of these functions computes a triangle's area: it is 10 * 5 / 2 = 25.",
        "irrelevance_1": "[math.sum(numbers=[1, 2, 3])]",  # irrelevance, a call
        "live_relevance_0-0-0": "[generate_image(prompt='a masked woman with peacock feathers')]",
    })
    assert {i: verdict(r) for i, r in rows.items()} == {
        "simple_python_1": 1.0, "simple_python_0": 0.0, "simple_python_2": 0.0,
        "irrelevance_0": 1.0, "irrelevance_1": 0.0, "live_relevance_0-0-0": 1.0}
    for row in rows.values():  # the reward is the verdict
        assert row["reward"] == row["reward_terms"]["bfcl"] == verdict(row)
    # The prompt is BFCL's prompting system prompt, holding the entry's functions with their dotted names.
    assert '"name": "math.factorial"' in rows["simple_python_1"]["prompt_text"]


def test_native_format_uses_openai_safe_names(tmp_path):
    """``format: native``: the tools through the chat template (dots as underscores, as BFCL's function-calling
    path names them), hermes calls; BFCL's checker maps the name back."""
    call = {"name": "math_factorial", "arguments": {"number": 5}}
    rows = evaluate(tmp_path, {"simple_python_1": f"<tool_call>\n{json.dumps(call)}\n</tool_call>"}, format="native")
    row = rows["simple_python_1"]
    assert verdict(row) == 1.0 and row["tool_calls"][0]["name"] == "math_factorial"
    assert '"name": "math_factorial"' in row["prompt_text"] and "math.factorial" not in row["prompt_text"]


def test_shaped_reward_keeps_the_verdict_apart(tmp_path):
    rows = evaluate(tmp_path, {"simple_python_1": "[math.factorial(number=5)]",
                               "simple_python_0": "[calculate_triangle_area(base=11, height=5)]"}, reward="shaped")
    right, wrong = rows["simple_python_1"], rows["simple_python_0"]
    assert verdict(right) == 1.0 and right["reward"] == 1.0
    assert verdict(wrong) == 0.0 and 0.0 < wrong["reward"] < 1.0
    assert wrong["reward_parts"]["bfcl.name"] == 1.0 and wrong["reward_parts"]["bfcl.values"] < 1.0
    assert wrong["reward_parts"]["bfcl.format"] == 1.0
    assert wrong["reward"] == pytest.approx(sum(wrong["reward_parts"][f"bfcl.{p}"] for p in ("format", "name",
                                                                                               "params", "values")) / 4)
    # An attempt BFCL cannot decode earns half the format part, prose none of it.
    (tmp_path / "formats").mkdir()
    rows = evaluate(tmp_path / "formats", {"simple_python_1": "[math.factorial(number=math.pi)]",
                                           "simple_python_0": "The area is 27.5."}, reward="shaped")
    assert rows["simple_python_1"]["reward_parts"]["bfcl.format"] == 0.5
    assert rows["simple_python_0"]["reward_parts"]["bfcl.format"] == 0.0 and rows["simple_python_0"]["reward"] == 0.0


def test_a_call_that_tries_to_run_code_is_a_wrong_call_and_runs_nothing(tmp_path):
    """Nothing in an answer is evaluated (BFCL's own decoder ``eval``s arithmetic in arguments: here a call
    inside one would run)."""
    marker = tmp_path / "MARKER"
    touch = f"__import__('os').system('touch {marker}')"
    payloads = [
        f"[{touch}]",
        f"[math.factorial(number={touch})]",
        f"[math.factorial(number=1 + {touch})]",
        "[math.factorial(number=().__class__.__base__.__subclasses__())]",
        f"[math.factorial(number=open('{marker}', 'w').write('x'))]",
        f"[math.factorial(number=(lambda: {touch})())]",
        "[math.factorial(number=open('/etc/passwd').read())]",
        f"[os.system(command='touch {marker}')]",
        f"[math.factorial(number=5)]\n{touch}",
    ]
    rows = evaluate(tmp_path, {f"simple_python_{i + 3}": p for i, p in enumerate(payloads)})
    assert {i: verdict(r) for i, r in rows.items()} == {f"simple_python_{i + 3}": 0.0 for i in range(len(payloads))}
    assert not marker.exists()


def config_error(tmp_path: Path, options: dict[str, Any]) -> str:
    """`toolrl eval` of a bfcl config with ``options``: its one error line (exit 2), nothing written."""
    config = tmp_path / "eval.yaml"
    config.write_text(yaml.safe_dump({"model": {"source": "tiny-qwen3"}, "env": "bfcl", "env_options": options}))
    result = CliRunner().invoke(cli, ["eval", str(config), "--output", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output[-3000:]
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.output, result.output
    assert not (tmp_path / "out").exists()
    return lines[0]


@pytest.mark.parametrize(("options", "says"), [
    ({"test": ["simple_pyton"]}, ["unknown BFCL category 'simple_pyton'", "simple_python"]),
    ({"test": ["web_search"]}, ["web_search", "network"]),
    ({"test": ["memory"]}, ["memory", "embedding model", "all-MiniLM-L6-v2"]),
    ({"test": ["simple_java"]}, ["simple_java", "Java"]),
    ({"test": ["simple_python"], "ids": ["simple_python_4000"]}, ["no BFCL entry 'simple_python_4000'"]),
], ids=["unknown", "web_search", "memory", "java", "no-such-id"])
def test_bad_options_are_one_line_before_anything_loads(tmp_path, options, says):
    line = config_error(tmp_path, options)
    for words in says:
        assert words in line, line


def test_listing_plugins_does_not_import_bfcl_eval():
    printed, modules = listing_imports("bfcl_eval", "toolrl_bfcl")
    assert "bfcl" in printed.split()  # listed
    assert modules == ["toolrl_bfcl"]  # the entry point's module only


def test_live_and_non_live_share_no_entry():
    """The default splits (train on live, test on non-live) share no entry id; six user questions are
    asked in both, two of them of the same task (the same functions): README.md says which."""
    from toolrl_bfcl import categories

    def questions(group: str) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for category in categories.GROUPS[group]:
            for entry in categories.entries(category):
                for message in (m for turn in entry["question"] for m in turn if m["role"] == "user"):
                    out.setdefault(message["content"].strip(), []).append(entry["id"])
        return out

    live, non_live = questions("live"), questions("non_live")
    assert not {i for ids in live.values() for i in ids} & {i for ids in non_live.values() for i in ids}
    assert sorted((non_live[q][0], live[q][0]) for q in set(live) & set(non_live)) == [
        ("irrelevance_0", "live_irrelevance_835-326-0"), ("irrelevance_233", "live_irrelevance_838-328-0"),
        ("irrelevance_69", "live_irrelevance_300-74-0"), ("irrelevance_78", "live_irrelevance_486-140-0"),
        ("multiple_26", "live_multiple_190-84-0"), ("simple_python_14", "live_irrelevance_793-302-0")]
