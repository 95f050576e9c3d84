"""The textarena environment: its splits (self-play or a fixed player to train, a fixed player to
test, seeds apart), a misspelt game as one line, and a held-out evaluation against a fixed player."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from toolrl.cli import cli
from toolrl.config import ConfigError
from toolrl.data.sources import load_split
from toolrl.environments import get_environment


def split(options, name):
    env, validated = get_environment("textarena").resolve(options)
    return load_split(env, name, validated)


def test_splits_seat_the_model_against_itself_or_a_fixed_player_on_seeds_apart():
    options = {"train_size": 6, "test_size": 4, "seed": 10}
    train, test = split(options, "train"), split(options, "test")
    assert [s.ground_truth["seats"] for s in train] == [["model", "model"]] * 6
    assert [s.ground_truth["seats"] for s in test] == [["model", "random"], ["random", "model"]] * 2
    assert [s.ground_truth["seed"] for s in train] == list(range(10, 16))
    assert [s.ground_truth["seed"] for s in test] == list(range(16, 20))
    fixed = split({**options, "train_opponent": "first", "game": "KuhnPoker-v0"}, "train")
    assert fixed[1].ground_truth == {"game": "KuhnPoker-v0", "seed": 11, "seats": ["first", "model"]}


def test_a_misspelt_game_is_one_line():
    with pytest.raises(ConfigError) as error:
        get_environment("textarena").resolve({"game": "TicTacToe-v9"})
    assert str(error.value).startswith("env_options: game: TextArena has no game 'TicTacToe-v9' (did you mean ")


def test_held_out_eval_plays_a_fixed_player(tmp_path):
    """The tiny model's answers are noise: invalid moves, which TextArena's rules turn into losses."""
    config = tmp_path / "eval.yaml"
    config.write_text("model: {source: tiny-qwen3}\nenv: textarena\nenv_options: {train_size: 2, test_size: 4}\n"
                      "rollout: {roles: [player_0, player_1], max_new_tokens: 4, max_response_tokens: 1024}\n")
    out = tmp_path / "eval"
    result = CliRunner().invoke(cli, ["eval", str(config), "--output", str(out)])
    assert result.exit_code == 0, result.output[-3000:]
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and json.loads((out / "summary.json").read_text())["metric"] == "textarena"
    for row in rows:
        assert row["reward_terms"]["textarena"] == -1.0 and not row["success"]


def test_the_report_reads_rows_whose_text_holds_a_line_separator(tmp_path):
    """``toolrl eval`` writes UTF-8 as it is: a model's move may hold U+2028, which str.splitlines() would split."""
    from toolrl_textarena.report import line, tally

    before, after = tmp_path / "before.jsonl", tmp_path / "after.jsonl"
    before.write_text(json.dumps({"reward_terms": {"textarena": -1.0}, "response_text": "[4]\u2028[4]"},
                                 ensure_ascii=False) + "\n", encoding="utf-8")
    after.write_text("".join(json.dumps({"reward_terms": {"textarena": r}}) + "\n" for r in (1.0, 0.0)),
                     encoding="utf-8")
    assert line(tally(before), tally(after), "random") == (
        "held-out win rate vs random: before 0/1 → after 1/2 (draws 0 → 1)")
