"""Grading with math-verify: equivalent forms, boxed answers, the geo3k reward, and runaway input."""

from __future__ import annotations

import threading
import time

import pytest
from toolrl.plugins import get_plugins
from toolrl.rewards import RewardFunction
from toolrl.rewards import last_boxed as extract_last_boxed
from toolrl_geo3k.grading import is_equivalent, parse_answer
from toolrl_geo3k.reward import Geo3kReward, geo3k_score


@pytest.mark.parametrize(
    ("answer", "truth"),
    [
        ("3", "3"),
        ("\\boxed{3}", "3"),
        ("3.0", "3"),
        ("0.5", "\\frac{1}{2}"),
        ("\\frac{1}{2}", "0.5"),
        ("1/2", "\\frac{1}{2}"),
        ("\\boxed{\\frac{1}{2}}", "0.5"),
        ("$\\frac{40}{3}$", "\\frac{40}{3}"),
        ("2\\sqrt{3}", "2\\sqrt{3}"),
        ("\\sqrt{12}", "2\\sqrt{3}"),
        ("16.5", "\\frac{33}{2}"),
        ("60^\\circ", "60"),
        ("x = 3", "3"),
        (" 7 ", "7"),
    ],
)
def test_equivalent_answers(answer: str, truth: str) -> None:
    assert is_equivalent(answer, truth)


@pytest.mark.parametrize(
    ("answer", "truth"),
    [
        ("4", "3"),
        ("", "3"),
        ("   ", "3"),
        ("abc", "3"),
        ("3.46", "2\\sqrt{3}"),
        ("\\frac{40}{3}", "13.33"),
        ("\\boxed{}", "3"),
        ("3", ""),
    ],
)
def test_different_answers(answer: str, truth: str) -> None:
    assert not is_equivalent(answer, truth)


def test_last_boxed_wins_and_braces_balance() -> None:
    assert extract_last_boxed("first \\boxed{1}, finally \\boxed{\\frac{1}{2}}.") == "\\frac{1}{2}"
    assert extract_last_boxed("\\fbox{7}") == "7"
    assert extract_last_boxed("\\boxed{unclosed") is None
    assert extract_last_boxed("no box") is None


RUNAWAY = [
    "10^{10^{10}}",
    "9^{9^{9^{9}}}",
    "e^{e^{e^{e^{10}}}}",
    "100!!",
    "(x+1)^{10000}",
    "2^{" + "9" * 4000 + "}",
    "1" * 600,
]


@pytest.mark.parametrize("answer", RUNAWAY)
def test_runaway_expressions_are_refused_quickly(answer: str) -> None:
    start = time.perf_counter()
    assert not is_equivalent(answer, "3")
    assert parse_answer(answer) == []
    assert time.perf_counter() - start < 3.0


def test_grading_outside_the_main_thread() -> None:
    """Without math-verify's signal timeouts (threads), results agree and the guard still bounds time."""
    results: dict[str, object] = {}

    def work() -> None:
        start = time.perf_counter()
        results["equal"] = is_equivalent("\\frac{1}{2}", "0.5")
        results["different"] = is_equivalent("4", "3")
        results["runaway"] = [is_equivalent(a, "3") for a in RUNAWAY]
        results["seconds"] = time.perf_counter() - start

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert results["equal"] is True and results["different"] is False
    assert results["runaway"] == [False] * len(RUNAWAY)
    assert results["seconds"] < 15


def test_geo3k_score() -> None:
    assert geo3k_score("so the answer is \\boxed{\\frac{1}{2}}", "0.5") == 1.0
    assert geo3k_score("so the answer is 0.5", "0.5") == 0.0  # use_boxed: no box, no credit
    assert geo3k_score("0.5", "0.5", use_boxed=False) == 1.0
    assert geo3k_score("\\boxed{2} then \\boxed{3}", "3") == 1.0
    good_format = "<think>angles sum to 180</think> The answer is \\boxed{60}."
    assert geo3k_score(good_format, "60", format_score=0.1) == pytest.approx(1.0)
    assert geo3k_score("The answer is \\boxed{60}.", "60", format_score=0.1) == pytest.approx(0.9)
    assert geo3k_score(good_format, "61", format_score=0.1) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="format_score"):
        geo3k_score("x", "1", format_score=2)


def test_reward_function_is_registered() -> None:
    plugins = get_plugins()
    part = plugins.registry.get("reward_functions", "geo3k")
    assert part.plugin == "geo3k" and plugins.info["geo3k"].status == "ok"
    reward = part.load()()
    assert isinstance(reward, RewardFunction) and reward.name == "geo3k"
    assert reward("Therefore \\boxed{2\\sqrt{3}}", "2\\sqrt{3}", full_response="...") == 1.0
    assert reward("Therefore \\boxed{4}", "2\\sqrt{3}") == 0.0
    assert reward("\\boxed{3}", None) == 0.0
    assert Geo3kReward(use_boxed=False)("3", 3) == 1.0
    with pytest.raises(ValueError, match="format_score"):
        Geo3kReward(format_score=-1)
