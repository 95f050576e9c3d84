"""The reasoning_gym environment: its splits, its difficulty levels (its generators' curricula), its
options' errors and its reward, which is the generator's own score_answer."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner
from reasoning_gym.utils import extract_answer
from toolrl.cli import cli
from toolrl.config import ConfigError
from toolrl.data.sources import load_split
from toolrl.environments import get_environment
from toolrl_reasoning_gym.generators import entry
from toolrl_reasoning_gym.reward import ReasoningGymReward

# Generators whose entries carry the answer their score_answer gives 1.0 (others, such as n_queens,
# score a solution against rules).
GENERATORS = ["chain_sum", "gcd", "lcm", "basic_arithmetic", "spell_backward", "letter_counting", "word_sorting",
              "number_sorting", "base_conversion", "caesar_cipher", "prime_factorization", "count_bits",
              "fraction_simplification", "leg_counting"]


def score(dataset, answer, item) -> float:
    """The generator's score, an answer it cannot parse (its score_answer raises) 0."""
    try:
        return dataset.score_answer(answer, item)
    except (ValueError, TypeError, AttributeError, IndexError, KeyError):
        return 0.0


def split(options: dict, name: str = "train"):
    env, validated = get_environment("reasoning_gym").resolve(options)
    return env, load_split(env, name, validated)


@pytest.mark.parametrize("generator", GENERATORS)
def test_reward_is_the_generators_score_on_its_answer_and_on_wrong_ones(generator):
    _, samples = split({"dataset": generator, "size": 4, "test_size": 2})
    reward = ReasoningGymReward()
    for sample in samples:
        dataset, item = entry(sample.ground_truth)
        assert sample.prompt[-1].content.startswith(item["question"])  # the environment's instruction follows
        right = f"Let me see. <answer>{item['answer']}</answer>"
        assert reward(right, sample.ground_truth) == dataset.score_answer(item["answer"], item) == 1.0
        for wrong in (f"<answer>{item['answer']}0</answer>", "<answer>no idea</answer>", "no tags at all"):
            assert reward(wrong, sample.ground_truth) == score(dataset, extract_answer(wrong), item)
        assert reward("<answer>no idea</answer>", sample.ground_truth) < 1.0


def test_train_and_test_never_share_a_seed():
    options = {"datasets": {"chain_sum": {"weight": 3}, "gcd": {"weight": 1, "config": {"max_value": 50}}},
               "size": 40, "test_size": 12, "seed": 7}
    _, train = split(options, "train")
    _, test = split(options, "test")
    seeds = lambda samples: {(s.ground_truth["dataset"], s.ground_truth["seed"] + s.ground_truth["index"])  # noqa: E731
                             for s in samples}
    assert len(train) == 40 and len(test) == 12 and not seeds(train) & seeds(test)
    assert sum(s.ground_truth["dataset"] == "chain_sum" for s in train) == 30  # by weight
    assert {s.ground_truth["config"]["max_value"] for s in train if s.ground_truth["dataset"] == "gcd"} == {50}
    assert [s.ground_truth for s in split(options, "train")[1]] == [s.ground_truth for s in train]  # reproducible


@pytest.mark.parametrize(("options", "message"), [
    ({"dataset": "chain_sumx"}, "env_options: dataset: reasoning-gym has no generator 'chain_sumx' (did you mean 'chain_sum'?)"),
    ({"dataset": "gcd", "config": {"max_valu": 9}}, "env_options: config: gcd has no option 'max_valu' (did you mean "
                                                    "'max_value'?) (its options: min_numbers, max_numbers, min_value, max_value)"),
    ({"dataset": "gcd", "config": {"seed": 9}}, "env_options: config: gcd: 'seed' is set by the environment's options "
                                                "(size, test_size, seed)"),
    ({"dataset": "chain_sum", "config": {"min_terms": 5, "max_terms": 2}},
     "env_options: config: chain_sum: AssertionError: max_terms must be >= min_terms"),
    ({"datasets": {"lcm": {}, "gdc": {}}}, "env_options: datasets: reasoning-gym has no generator 'gdc' (did you mean 'gcd'?)"),
    ({"dataset": "chain_sum", "levels": 12}, "env_options: levels: chain_sum's curriculum has 1 to 11 levels, not 12"),
    ({"dataset": "chain_sum", "levels": [{"num_term": 1}]},
     "env_options: levels.0: chain_sum's curriculum has no attribute 'num_term' (did you mean 'num_terms'?) (its "
     "attributes: num_terms, num_digits)"),
    ({"dataset": "chain_sum", "levels": [{"num_digits": 10}]},
     "env_options: levels.0.num_digits: level 10, but num_digits has levels 0-9"),
    ({"dataset": "chain_sum", "levels": 2, "config": {"max_terms": 3}},
     "env_options: config: 'max_terms' is set by the levels (drop it from config)"),
    ({"dataset": "acre", "levels": 2}, "env_options: levels: reasoning-gym has no curriculum for acre"),
    ({"datasets": {"chain_sum": {}}, "levels": 2},
     "env_options: levels: the levels of one generator (dataset), not of a mixture"),
])
def test_a_bad_name_or_option_is_one_line(options, message):
    with pytest.raises(ConfigError) as error:
        get_environment("reasoning_gym").resolve(options)
    assert str(error.value) == message


def test_levels_spread_both_splits_over_the_generators_curriculum():
    """``levels`` exposes the curriculum's levels (easiest first) and gives each sample its level; each level's
    questions are generated with the options its curriculum sets, from seeds no other level or split uses."""
    options = {"dataset": "chain_sum", "levels": [{}, {"num_terms": 1}, {"num_terms": 1, "num_digits": 1}],
               "size": 30, "test_size": 6, "config": {"allow_negation": True}}
    env, train = split(options, "train")
    _, test = split(options, "test")
    assert env.levels == ["num_terms=2,num_digits=1", "num_terms=3,num_digits=1", "num_terms=3,num_digits=2"]
    assert [sum(s.level == j for s in train) for j in range(3)] == [10, 10, 10]
    assert [sum(s.level == j for s in test) for j in range(3)] == [2, 2, 2]
    for s in train + test:
        config = s.ground_truth["config"]
        terms, digits = [(2, 1), (3, 1), (3, 2)][s.level]
        assert config == {"allow_negation": True, "min_terms": terms, "max_terms": terms, "min_digits": digits,
                          "max_digits": digits}
        operands = re.findall(r"\d+", entry(s.ground_truth)[1]["question"].rsplit(":", 1)[1])
        assert len(operands) == terms and all(len(o) <= digits for o in operands)
    seeds = lambda samples: {s.ground_truth["seed"] + s.ground_truth["index"] for s in samples}  # noqa: E731
    assert len(seeds(train)) == 30 and len(seeds(test)) == 6 and not seeds(train) & seeds(test)
    assert {s.level for s in test[:3]} != {test[0].level}  # shuffled: a truncated held-out set spans levels
    stepped, _ = get_environment("reasoning_gym").resolve({"dataset": "chain_sum", "levels": 3})
    assert stepped.levels == ["num_terms=2,num_digits=1", "num_terms=3,num_digits=2", "num_terms=4,num_digits=3"]
    assert get_environment("reasoning_gym").resolve({"dataset": "chain_sum"})[0].levels == []


def test_the_calculator_option_offers_the_calculator():
    env, _ = get_environment("reasoning_gym").resolve({"calculator": True})
    assert [t["class_name"] for t in env.tools] == ["calculator"] and env.max_turns == 3
    assert get_environment("reasoning_gym").tools == []


def test_env_show_lists_the_generators():
    result = CliRunner().invoke(cli, ["env", "show", "reasoning_gym", "--json"])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    assert "chain_sum" in shown["description"] and "zebra_puzzles" in shown["description"]
    assert shown["splits"]["train"]["size"] == 512 and shown["splits"]["test"]["size"] == 64
