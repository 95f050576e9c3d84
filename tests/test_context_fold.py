"""The ``fold`` context policy (toolrl.context.Fold): the model calls ``branch`` with a sub-task, the loop
runs it as a segment of its own (prompt: the task and the sub-task) whose turns are trained, and only its
answer comes back to the main line. Every generated token is trained once across the main line and its
branches, each segment's tokens are the template's rendering of its context, and the main line's engine
session (its KV) is kept while a branch runs in its own. Real Qwen2.5 tokenizer and chat template, real
agent loop and tools; the model's turns are scripted from what its context shows (the tiny model cannot
make the calls)."""

from __future__ import annotations

import asyncio
import json
import re

import pytest
from test_context import Page
from toolrl.config import Config, ConfigError, RewardConfig, RolloutConfig
from toolrl.context import BRANCH_SCHEMA, FOLD_HEADER
from toolrl.model_sources import qwen_tokenizer
from toolrl.parsers.hermes import HermesParser
from toolrl.renderers.chat import ChatRenderer
from toolrl.rollout import RolloutContext, Route, run_trajectory_pieces
from toolrl.rollout.routes import build_context_policy
from toolrl.schemas import Sample
from toolrl.testing import ScriptedEngine


def call(name: str, **arguments) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


SAMPLE = Sample(prompt=[{"role": "system", "content": "Read pages 1 to 7, then say the code."},
                        {"role": "user", "content": "What is the code?"}], ground_truth="4417")
TASK = [m.to_template() for m in SAMPLE.prompt]
SUBTASKS = ["Read pages 2 to 4.", "Read pages 5 to 7."]
MAIN = [call("page", n=1), *(f"Branching.\n{call('branch', task=t)}" for t in SUBTASKS), "The code is 4417."]
SUBTASK = re.compile(r"Sub-task: Read pages (\d+) to (\d+)\.")


def branch_answer(first: int, last: int) -> str:
    return f"Pages {first}-{last} read; no code on them."


class FoldingAgent(ScriptedEngine):
    """In a branch (its context ends with a sub-task): the sub-task's pages one per turn, then its answer.
    On the main line: its turn in ``main`` (the script)."""

    def text(self, session_id, prompt_ids):
        context = self.tokenizer.decode(prompt_ids)
        sub = SUBTASK.search(context)
        if sub is None:
            return self.script[context.count("<|im_start|>assistant") - 1]
        first, last = int(sub[1]), int(sub[2])
        nxt = first + len(re.findall(r"row\d+\.0 amount", context))
        return call("page", n=nxt) if nxt <= last else branch_answer(first, last)


@pytest.fixture(scope="module")
def tokenizer():
    return qwen_tokenizer("qwen2_5")


def config(context: dict | None, max_context: int | None = 2048) -> Config:
    return Config.model_validate({"data": {"train_files": ["x.jsonl"]}, "model": {"max_context": max_context},
                                  "rollout": {"context": context}})


def run(tokenizer, context: dict, max_response_tokens: int = 20_000, main: list[str] = MAIN):
    engine = FoldingAgent(tokenizer, main, logprob=-0.25)
    route = Route({"page": Page()}, 40, HermesParser(), [], RewardConfig(), context=build_context_policy(config(context)))
    ctx = RolloutContext(engine=engine, renderer_factory=lambda schemas: ChatRenderer(tokenizer, schemas),
                         config=RolloutConfig(max_response_tokens=max_response_tokens, max_new_tokens=256),
                         routes={None: route})
    pieces = asyncio.run(run_trajectory_pieces(ctx, SAMPLE, 0, "t", seed=0))
    return pieces, engine, ctx.renderer(route)


def page_turn(n: int, text: str | None = None) -> list[dict]:
    result = asyncio.run(Page().execute("i", {"n": n}))[0]
    return [{"role": "assistant", "content": text or call("page", n=n)}, {"role": "tool", "name": "page", "content": result}]


def assert_segment(renderer, piece, context: list[dict], after: list[dict]) -> None:
    """The segment's prompt is the template's rendering of its context, and prompt + response the
    rendering of the context and what followed it (up to the newline the template writes after the
    closing turn)."""
    assert piece.prompt_ids == renderer.conversation_ids(context)
    whole = renderer._render(context + after, False, renderer.tool_schemas)
    ids = piece.prompt_ids + piece.response_ids
    assert whole[:len(ids)] == ids and len(whole) - len(ids) <= 1


def assert_trained_once(engine, pieces) -> None:
    """The masks' sums are the tokens generated, each segment's trained tokens are exactly the ones its
    generations produced (ids and logprobs), and the pieces are numbered in order under one key."""
    assert sum(sum(p.response_mask) for p in pieces) == sum(len(ids) for c in engine.calls for ids in c.generated)
    assert sorted(t for p in pieces for t, m in zip(p.response_ids, p.response_mask) if m) == \
        sorted(t for c in engine.calls for ids in c.generated for t in ids)
    assert all(len(p.response_ids) == len(p.response_mask) == len(p.logprobs) for p in pieces)
    assert all(lp == -0.25 for p in pieces for lp, m in zip(p.logprobs, p.response_mask) if m)
    assert [p.piece for p in pieces] == list(range(len(pieces))) and {p.key for p in pieces} == {"t"}


def test_fold_is_built_through_build_part_with_one_line_errors():
    policy = build_context_policy(config({"name": "fold", "max_branch_turns": 3}, max_context=None))
    assert policy.name == "fold" and policy.options.max_branch_turns == 3 and policy.tool_schemas() == [BRANCH_SCHEMA]
    with pytest.raises(ConfigError, match=r"^rollout.context.max_branch_turn: unknown key \(did you mean 'max_branch_turns'"):
        build_context_policy(config({"name": "fold", "max_branch_turn": 3}))
    with pytest.raises(ConfigError, match=r"^rollout.context.max_result_tokens: "):
        build_context_policy(config({"name": "fold", "max_result_tokens": 0}))


def test_branches_run_as_trained_segments_and_return_one_short_result(tokenizer):
    pieces, engine, renderer = run(tokenizer, {"name": "fold"})
    *branches, main = pieces
    assert len(branches) == 2 and main.termination == "answered" and main.final_response.startswith("The code is 4417.")
    assert_trained_once(engine, pieces)
    assert '"name": "branch"' in renderer.decode(main.prompt_ids)  # the model is offered the branch tool
    results = [branch_answer(2, 4), branch_answer(5, 7)]
    # The main line: page 1, two branch calls answered by one short result each, the answer; no branch page.
    after = page_turn(1)
    for text, result in zip(MAIN[1:3], results):
        after += [{"role": "assistant", "content": text}, {"role": "tool", "name": "branch", "content": result}]
    after.append({"role": "assistant", "content": MAIN[-1]})
    assert_segment(renderer, main, TASK, after)
    assert main.edit is None and main.turns == 4 and "row3.0" not in renderer.decode(main.response_ids)
    assert [r.response.text for r in main.tool_results if r.name == "branch"] == results
    # Each branch: the task and its sub-task, its pages, its answer; trained, with its edit.
    for branch, task, (first, last), result in zip(branches, SUBTASKS, [(2, 4), (5, 7)], results):
        context = [*TASK, {"role": "user", "content": FOLD_HEADER + task}]
        turns = [m for n in range(first, last + 1) for m in page_turn(n)]
        assert_segment(renderer, branch, context, turns + [{"role": "assistant", "content": result}])
        assert branch.termination == "forked" and branch.turns == 4 and branch.final_response == result
        assert [r.arguments["n"] for r in branch.tool_results] == list(range(first, last + 1))
        edit = branch.edit
        assert (edit.policy, edit.action, edit.task, edit.result, edit.removed) == ("fold", "fold", task, result, [])
        assert edit.tokens_after == len(branch.prompt_ids) < edit.tokens_before
    assert [b.edit.turn for b in branches] == [2, 3]  # the main line's turn that called each


def test_the_main_line_keeps_its_engine_session_while_a_branch_runs_in_its_own(tokenizer):
    pieces, engine, _ = run(tokenizer, {"name": "fold"})
    sessions = [c.session_id for c in engine.calls]
    assert sessions[:2] == ["t", "t"] and sessions[-1] == "t"
    branch_sessions = [s for s in dict.fromkeys(sessions) if s != "t"]
    assert len(branch_sessions) == 2 and engine.ended == [*branch_sessions, "t"]  # each ended once it returned
    # After a branch the main line's prompt extends the one before its call: its kept KV is a prefix.
    main = [c.prompt_ids for c in engine.calls if c.session_id == "t"]
    assert all(b[:len(a)] == a for a, b in zip(main, main[1:]))


def test_a_branch_out_of_turns_returns_an_error_result_and_the_main_line_goes_on(tokenizer):
    pieces, engine, renderer = run(tokenizer, {"name": "fold", "max_branch_turns": 2})
    *branches, main = pieces
    assert main.termination == "answered" and len(branches) == 2
    assert_trained_once(engine, pieces)
    error = "Error: the branch ended without an answer (max_turns)"
    assert [r.response.text for r in main.tool_results if r.name == "branch"] == [error, error]
    assert all(r.status == "error" for r in main.tool_results if r.name == "branch")
    assert all(b.turns == 2 and b.response_mask[-1] == 1 and b.edit.result == error for b in branches)


def test_a_branch_call_without_a_task_is_an_error_naming_the_field(tokenizer):
    pieces, engine, _ = run(tokenizer, {"name": "fold"}, main=[MAIN[0], call("branch", goal="pages 2 to 4"), *MAIN[2:]])
    assert len(pieces) == 2  # the second call's branch only
    (bad,) = [r for r in pieces[-1].tool_results if r.arguments == {"goal": "pages 2 to 4"}]
    assert bad.status == "invalid_arguments" and bad.response.text.startswith("Error: field 'task':")
    assert_trained_once(engine, pieces)


def test_branches_count_against_the_trajectory_s_response_budget(tokenizer):
    """A branch's tokens are the trajectory's: a branch stops where the main line and the branches
    before it left no room, and tells the main line so."""
    whole, _, _ = run(tokenizer, {"name": "fold"})
    budget = sum(len(p.response_ids) for p in whole) - 150
    pieces, engine, _ = run(tokenizer, {"name": "fold"}, max_response_tokens=budget)
    assert sum(len(p.response_ids) for p in pieces) < budget
    assert [r.response.text for r in pieces[-1].tool_results if r.name == "branch"][-1] == \
        "Error: the branch ended without an answer (max_response_tokens)"
    assert_trained_once(engine, pieces)


def test_trace_rows_hold_each_branch_as_a_segment_with_its_fold_edit(tokenizer, tmp_path):
    """The run's traces: a row per segment, the branches' rows carrying their edit (action fold, the
    sub-task, the result), the main line's none; every row under the trajectory's key."""
    from toolrl.run_dir import RunDir

    pieces, _, _ = run(tokenizer, {"name": "fold"})
    run_dir = RunDir(tmp_path)
    run_dir.write_traces(1, pieces, tokenizer)
    rows = [json.loads(line) for line in run_dir.traces(1).read_text().splitlines()]
    assert [(r["trajectory_key"], r["piece"], r["termination"]) for r in rows] == \
        [("t", 0, "forked"), ("t", 1, "forked"), ("t", 2, "answered")]
    assert [(r["edit"]["action"], r["edit"]["task"]) for r in rows[:2]] == [("fold", t) for t in SUBTASKS]
    assert rows[0]["edit"]["result"] == branch_answer(2, 4) and "edit" not in rows[2]
    assert FOLD_HEADER + SUBTASKS[1] in rows[1]["prompt_text"] and "row3.0" not in rows[2]["response_text"]
