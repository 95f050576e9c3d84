"""The ``arithmetic`` environment: disjoint splits by construction, the difficulty setting, the two
call formats, and its listing (attributed to this plugin; absent when the plugin is disabled)."""

from __future__ import annotations

import pytest
from toolrl.config import ConfigError, load_config
from toolrl.data.sources import load_samples, load_split
from toolrl.plugins import get_plugins
from toolrl.testing.environments import listed_environments
from toolrl_calculator.environment import ARITHMETIC, TAG_ROUTES, held_out


def split(options: dict, name: str) -> list:
    env, validated = ARITHMETIC.resolve(options)
    return load_split(env, name, validated)


def problem(sample) -> tuple[int, str, int]:
    a, op, b = sample.prompt[0].content.removeprefix("What is ").removesuffix("?").split()
    return int(a), op, int(b)


@pytest.mark.parametrize("digits", [1, 2, 3])
def test_train_and_test_are_disjoint_and_answers_are_right(digits: int) -> None:
    options = {"digits": digits, "train_size": 400, "test_size": 100}
    train, test = split(options, "train"), split(options, "test")
    train_problems, test_problems = {problem(s) for s in train}, [problem(s) for s in test]
    assert train_problems.isdisjoint(test_problems)
    assert all(held_out(*p) for p in test_problems) and not any(held_out(*p) for p in train_problems)
    assert len(set(test_problems)) == len(test_problems)  # distinct held-out problems
    low, high = (2, 9) if digits == 1 else (10 ** (digits - 1), 10 ** digits - 1)
    for s in train + test:
        a, op, b = problem(s)
        assert low <= a <= high and low <= b <= high
        assert int(s.ground_truth) == {"+": a + b, "-": a - b, "*": a * b}[op]
    assert len(train) == 400 and s.data_source == "toolrl/arithmetic"
    # 1 digit: 192 problems, about one in 8 held out; the test split has every one of them.
    assert len(test) == (100 if digits > 1 else sum(held_out(a, o, b) for o in "+-*" for a in range(2, 10)
                                                     for b in range(2, 10)))


def test_splits_are_reproducible_and_seeded() -> None:
    assert [s.prompt for s in split({}, "train")] == [s.prompt for s in split({}, "train")]
    assert [s.prompt for s in split({"seed": 1}, "train")] != [s.prompt for s in split({}, "train")]
    assert {problem(s)[1] for s in split({"operators": ["*"]}, "test")} == {"*"}


def test_formats_configure_parser_and_prompts() -> None:
    hermes = load_samples(load_config(None, data={"env": "arithmetic"}))[0]
    assert [m.role for m in hermes.prompt] == ["user"]
    assert hermes.prompt[0].content.endswith("Use the calculator tool, then give the final answer as: The answer is N.")
    env, _ = ARITHMETIC.resolve({"format": "tags"})
    assert env.parser == "tags" and env.parser_options == TAG_ROUTES
    parser = get_plugins().load_part("tool_parsers", "tags")(**env.parser_options)
    assert parser.parse("<calculator>12 * 34</calculator>").calls[0].arguments == {"expression": "12 * 34"}
    tags = load_samples(load_config(None, data={"env": "arithmetic", "env_options": {"format": "tags"}}))[0]
    assert [m.role for m in tags.prompt] == ["system", "user", "assistant", "user"]
    assert "<calculator>12 * 34</calculator>" in tags.prompt[2].content
    assert tags.prompt[3].content.endswith("Use the calculator, then reply with: The answer is N.")
    custom = load_samples(load_config(None, data={"env": "arithmetic", "env_options": {"instructions": "Go."}}))[0]
    assert custom.prompt[0].content.endswith("? Go.")


def test_bad_options_are_one_config_error() -> None:
    with pytest.raises(ConfigError, match="env_options.digits: Input should be less than or equal to 9"):
        load_samples(load_config(None, data={"env": "arithmetic", "env_options": {"digits": 12}}))
    with pytest.raises(ConfigError, match="env_options.operators.0: Input should be"):
        load_samples(load_config(None, data={"env": "arithmetic", "env_options": {"operators": ["/"]}}))


def test_listed_by_this_plugin_and_absent_without_it() -> None:
    [row] = [r for r in listed_environments() if r["name"] == "arithmetic"]
    assert row["plugin"] == "calculator" and row["tools"] == ["calculator"] and row["rewards"] == {"gsm8k": 1.0}
    assert row["splits"] == {"train": {"source": "generated", "size": 512}, "test": {"source": "generated", "size": 128}}
    assert "arithmetic" not in {r["name"] for r in listed_environments(TOOLRL_DISABLE_PLUGINS="calculator")}
