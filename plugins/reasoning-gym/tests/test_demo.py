"""The reasoning-gym demo: its report line, the instruction the model reads, its config."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from toolrl.cli import cli
from toolrl.data.sources import load_split
from toolrl.environments import get_environment
from toolrl_reasoning_gym.environment import INSTRUCTIONS
from toolrl_reasoning_gym.report import line, main, question

OPTIONS = {"dataset": "chain_sum", "size": 64, "test_size": 6, "seed": 3,
           "config": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}}


def split(name: str):
    env, validated = get_environment("reasoning_gym").resolve(OPTIONS)
    return load_split(env, name, validated)


def row(sample, score: float) -> dict:
    return {"ground_truth": sample.ground_truth, "reward_terms": {"reasoning_gym": score}}


def test_the_instruction_shows_the_tags_with_no_answer_in_them():
    # With "e.g. <answer>42</answer>" SmolLM2-135M-Instruct answered 42 to all 64 held-out chain_sum problems
    # (docs/benchmarks.md): a small model copies an example's value.
    assert "<answer></answer>" in INSTRUCTIONS and not re.search(r"\d", INSTRUCTIONS)


def test_the_line_counts_full_scores_and_the_problems_training_never_asked(tmp_path, capsys):
    test, train = split("test"), split("train")
    before = [row(s, 1.0 if k == 0 else 0.0) for k, s in enumerate(test)]
    before[1]["response_text"] = "<answer>3</answer>\u2028"  # written as UTF-8: str.splitlines() would split it
    after = [row(s, 1.0 if k < 4 else 0.5) for k, s in enumerate(test)]  # a part score is not solved
    questions = [question(r) for r in after]
    trained = [row(s, 0.0) for s in train if question(row(s, 0.0)) not in questions[1:]]
    # The first held-out problem's question was also asked in training (another seed, the same text):
    trained.append({"ground_truth": {**test[0].ground_truth}, "reward_terms": {}})
    unseen = sum(q not in {question(r) for r in trained} for q in questions)
    assert unseen == len(test) - 1
    expected = (f"held-out success: before 1/6 → after 4/6 (on the {unseen} problems no "
                                            f"training batch held: 0/{unseen} → 3/{unseen})")
    assert line(before, after, trained) == expected
    # From the files a run writes: the evaluations' rows and the rollouts' step files.
    for name, rows in (("before.jsonl", before), ("after.jsonl", after)):
        (tmp_path / name).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    (tmp_path / "rollouts").mkdir()
    (tmp_path / "rollouts" / "step_00001.jsonl").write_text("".join(json.dumps(r) + "\n" for r in trained))
    main([str(tmp_path / "before.jsonl"), str(tmp_path / "after.jsonl"), str(tmp_path / "rollouts")])
    assert capsys.readouterr().out == expected + "\n"


def test_two_evaluations_of_different_problems_are_refused():
    test = split("test")
    with pytest.raises(ValueError, match="different problems"):
        line([row(s, 1.0) for s in test], [row(s, 1.0) for s in test[1:]], [])


def test_the_demo_config_passes_the_runs_checks(tmp_path):
    # examples/reasoning_gym.yaml with the tiny model in place of SmolLM2 (whose weights need the demo's set-up).
    demo = Path(__file__).resolve().parents[3] / "examples" / "reasoning_gym.yaml"
    result = CliRunner().invoke(cli, ["train", str(demo), "model.source=tiny-qwen3",
                                      f"trainer.output_dir={tmp_path / 'run'}", "--check"])
    assert result.exit_code == 0, result.output[-3000:]
    assert "check passed: 512 samples" in result.output.lower()
