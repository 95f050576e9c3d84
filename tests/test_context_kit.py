"""The context-policy conformance kit (toolrl.testing.contexts) over every built-in policy, and its checks
failing on policies that break each rule: real Qwen2.5 tokenizer and chat template, real agent loop, the
model's turns scripted."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from toolrl.model_sources import qwen_tokenizer
from toolrl.testing import ContextConformance
from toolrl.testing.contexts import (
    check_context_build,
    check_context_plans,
    check_context_prompts,
    check_context_results,
    check_context_tokens,
    play_policy,
)


def call(name: str, **arguments) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


class TestNone(ContextConformance):
    policy_name = "none"
    edits = False


class TestWindow(ContextConformance):
    policy_name = "window"
    policy_options = {"keep_turns": 2}


class TestDropToolOutputs(ContextConformance):
    policy_name = "drop_tool_outputs"


class TestSummarise(ContextConformance):
    policy_name = "summarise"


class TestFold(ContextConformance):
    policy_name = "fold"
    max_context = 2048
    # The main line reads page 1 and branches; the branch reads pages 2 and 3 and answers; the main line ends.
    script = (call("page", n=1), f"Branching.\n{call('branch', task='Read pages 2 to 3.')}", call("page", n=2),
              call("page", n=3), "Pages 2-3 read; no code there.", "The code is 4417.")


BROKEN = '''
from pydantic import BaseModel
from toolrl import hookimpl
from toolrl.model_sources import qwen_tokenizer
from toolrl.context import ContextPlan, ContextPolicy, TriggeredOptions, TriggeredPolicy


class DropsTask(TriggeredPolicy):
    """Keeps only the last turn, task dropped."""
    name = "drops_task"
    Options = TriggeredOptions

    def edit(self, view):
        return ContextPlan("drops_task", list(range(len(view.messages) - 2)), messages=view.messages[-2:])


class RemovesTheTask(TriggeredPolicy):
    """A window that says it removed the system prompt (it kept it)."""
    name = "removes_the_task"
    Options = TriggeredOptions

    def edit(self, view):
        return ContextPlan("window", [0], messages=view.messages[:view.task] + view.messages[-2:])


class LooseOptions(BaseModel):
    every: int = 4  # no extra="forbid": any key is taken


class Loose(ContextPolicy):
    name = "loose"
    Options = LooseOptions


class Raises(ContextPolicy):
    """Plans an edit with neither messages nor a request."""
    name = "raises"

    def plan(self, view):
        return ContextPlan("nothing") if view.turn >= 2 else None


@hookimpl
def register_context_policies(register):
    register(Raises, name="raises")
    register(DropsTask, name="drops_task")
    register(RemovesTheTask, name="removes_the_task")
    register(Loose, name="loose")
'''


@pytest.fixture
def broken(tmp_path, monkeypatch, toolrl_reload_plugins):
    from _dists import make_dist

    make_dist(tmp_path, "broken-policies", "broken", "broken_policies", BROKEN)
    monkeypatch.syspath_prepend(str(tmp_path))
    toolrl_reload_plugins()


@pytest.fixture(scope="module")
def tokenizer():
    return qwen_tokenizer("qwen2_5")


def test_a_policy_that_drops_the_task_fails_the_plan_check(broken, tokenizer):
    play = play_policy("drops_task", {"trigger_tokens": 600}, tokenizer)
    with pytest.raises(AssertionError, match=r"drops or changes the task \(the first 2 messages\)"):
        check_context_plans(play)


def test_a_plan_that_says_it_removed_the_task_fails_the_plan_check(broken, tokenizer):
    play = play_policy("removes_the_task", {"trigger_tokens": 600}, tokenizer)
    with pytest.raises(AssertionError, match=r"removed \[0\] names messages outside"):
        check_context_plans(play)


def test_a_policy_whose_options_take_any_key_fails_the_build_check(broken):
    with pytest.raises(AssertionError, match="accepts an unknown option"):
        check_context_build("loose")
    with pytest.raises(AssertionError, match="does not build: rollout.context.name: unknown context policy 'nope'"):
        check_context_build("nope")


@pytest.fixture(scope="module")
def window_play(tokenizer):
    return play_policy("window", {"keep_turns": 2}, tokenizer)


def test_a_segment_that_starts_elsewhere_fails_the_prompt_check(window_play):
    play = copy_play(window_play)
    play.pieces[3].prompt_ids[5] += 1
    with pytest.raises(AssertionError, match=r"1 start elsewhere and 1 of those contexts opened none"):
        check_context_prompts(play)
    with pytest.raises(AssertionError, match=r"generation \d+ \(of 25\) is in no segment right after its prompt"):
        check_context_tokens(play)


def test_a_token_trained_twice_or_not_at_all_fails_the_token_check(window_play):
    play = copy_play(window_play)
    piece = next(p for p in play.pieces if 0 in p.response_mask)
    piece.response_mask[piece.response_mask.index(0)] = 1  # a tool result's token trained
    with pytest.raises(AssertionError, match=r"the masks sum to \d+ trained tokens; the engine generated \d+"):
        check_context_tokens(play)
    play = copy_play(window_play)
    play.pieces[2].response_mask[0] = 0
    with pytest.raises(AssertionError, match=r"generation \d+'s tokens are not all trained"):
        check_context_tokens(play)


def test_tool_results_on_an_earlier_segment_fail_the_results_check(window_play):
    play = copy_play(window_play)
    play.pieces[0].tool_results.append(play.pieces[-1].tool_results.pop())
    with pytest.raises(AssertionError, match=r"segments \[0\] of the main line hold tool results"):
        check_context_results(play)
    play = copy_play(window_play)
    play.pieces[-1].tool_results.pop()
    with pytest.raises(AssertionError, match=r"holds 23 tool results; the tool ran 24 calls"):
        check_context_results(play)


def copy_play(play):
    return replace(play, pieces=[p.model_copy(deep=True) for p in play.pieces])


@pytest.fixture
def tick(tmp_path, monkeypatch, toolrl_reload_plugins):
    """The outside plugin tests/dists/tick (its policy written from the public API alone), found through its
    entry point as an installed distribution is."""
    info = tmp_path / "toolrl_plugin_tick-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toolrl-plugin-tick\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[toolrl]\ntick = toolrl_tick\n")
    monkeypatch.syspath_prepend(str(Path(__file__).parent / "dists" / "tick"))
    monkeypatch.syspath_prepend(str(tmp_path))
    toolrl_reload_plugins()


def test_an_outside_policy_passes_the_kit(tick, tokenizer):
    check_context_build("tick_forget", {"trigger_tokens": 600})
    play = play_policy("tick_forget", {"trigger_tokens": 600}, tokenizer)
    assert sum(d.kind == "edit" for d in play.decisions) >= 2
    for check in (check_context_prompts, check_context_tokens, check_context_plans, check_context_results):
        check(play)


def test_a_policy_that_raises_fails_the_play(broken, tokenizer):
    with pytest.raises(AssertionError, match=r"the play under 'raises' ended in an error: .*context policy 'raises'.*no"):
        play_policy("raises", {}, tokenizer)
