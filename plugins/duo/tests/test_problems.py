"""The ``duo`` environment: seeded, disjoint splits of word problems whose answer is the value of the
expression they carry, each operation in each of its phrasings; bad options are one line."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner
from toolrl.cli import cli
from toolrl.config import ConfigError
from toolrl.data.sources import load_split
from toolrl_calculator.evaluate import evaluate
from toolrl_duo.problems import DUO, TEMPLATES, held_out


def split(options: dict, name: str):
    env, validated = DUO.resolve(options)
    return load_split(env, name, validated)


def problem_of(sample) -> tuple[str, int, int, int]:
    """(operator, phrasing, a, b) of a sample, read back from its text and expression."""
    a, op, b = sample.extra_info["expression"].split()
    phrasing = next(i for i, t in enumerate(TEMPLATES[op]) if t.format(a=a, b=b) == sample.prompt[0].content)
    return op, phrasing, int(a), int(b)


def test_splits_are_seeded_disjoint_and_answered_by_their_expression() -> None:
    options = {"train_size": 300, "test_size": 64}
    train, test = split(options, "train"), split(options, "test")
    assert len(train) == 300 and len(test) == len({problem_of(s) for s in test}) == 64
    assert {problem_of(s) for s in train}.isdisjoint({problem_of(s) for s in test})
    assert all(held_out(*problem_of(s)) for s in test) and not any(held_out(*problem_of(s)) for s in train)
    for s in train + test:
        op, phrasing, a, b = problem_of(s)
        assert str(evaluate(s.extra_info["expression"])) == s.ground_truth and int(s.ground_truth) >= 0
        assert 10 <= a <= 99 and 10 <= b <= 99 and (op != "-" or a > b)
        assert re.fullmatch(rf"\D*{a}\D+{b}\D*", s.prompt[0].content), s.prompt[0].content  # its numbers, in order
    # Every operation in every phrasing, in both splits.
    assert {problem_of(s)[:2] for s in train} == {problem_of(s)[:2] for s in test} == \
        {(op, i) for op, phrasings in TEMPLATES.items() for i in range(len(phrasings))}
    assert [s.prompt for s in split(options, "train")] == [s.prompt for s in train]
    assert [s.prompt for s in split({**options, "seed": 1}, "train")] != [s.prompt for s in train]
    assert {problem_of(s)[0] for s in split({"operators": ["*"], "train_size": 50}, "train")} == {"*"}


def test_bad_options_are_refused_and_the_environment_shows() -> None:
    with pytest.raises(ConfigError, match="operators"):
        DUO.resolve({"operators": ["/"]})
    with pytest.raises(ConfigError, match="test_size"):
        DUO.resolve({"test_size": 0})
    shown = CliRunner().invoke(cli, ["env", "show", "duo"])
    assert shown.exit_code == 0 and "  parser: tags\n" in shown.output, shown.output
