"""The conformance kit for context policies: a registered policy built from ``rollout.context`` as a run
builds it, then one trajectory played through the real agent loop with fixed model turns instead of a
model (docs/plugins.md, "Context policies", says what each check holds).

A :class:`PolicyPlay` records what the policy was shown and what it answered (every view, plan and
branch, the conversation each edit made), every generation the engine was asked for, and the
trajectory's segments. Each ``check_context_*`` function raises an ``AssertionError`` saying what is
wrong; :class:`ContextConformance` runs them as pytest tests.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from toolrl.config import Config, ConfigError, RewardConfig, RolloutConfig
from toolrl.context import Branch, ContextPlan, ContextPolicy, ContextView
from toolrl.model_sources import qwen_tokenizer
from toolrl.plugins.parts import BuildContext, build_part
from toolrl.renderers.chat import ChatRenderer
from toolrl.rollout import RolloutContext, Route, run_trajectory_pieces
from toolrl.rollout.routes import build_context_policy
from toolrl.schemas import Sample, ToolCall
from toolrl.testing.scripted_engine import ScriptedEngine
from toolrl.tools import Tool
from toolrl.trajectory import Trajectory

LOGPROB = -0.25
TASK = Sample(prompt=[{"role": "system", "content": "Read the pages one by one, then say the code."},
                      {"role": "user", "content": "What is the code?"}], ground_truth="4417")
REPLY = "The code is 4417; pages 1 to 3 are read and the rest remain."
ANSWER = "The code is 4417."


def page_call(n: int) -> str:
    """A model turn reading page ``n``, in the hermes syntax."""
    return f"Reading page {n}.\n<tool_call>\n" + json.dumps({"name": "page", "arguments": {"n": n}}) + "\n</tool_call>"


DEFAULT_SCRIPT = (*(page_call(n) for n in range(1, 25)), ANSWER)


class Pages(Tool):
    """Page ``n`` of a ledger: about 120 tokens of rows; page 1 holds the code. Counts its calls."""

    schema = {"type": "function", "function": {
        "name": "page", "description": "Read a page of the ledger.",
        "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}}}
    calls = 0  # execute counts on the instance, from this

    async def execute(self, instance_id: str, arguments: dict[str, Any], **kwargs: Any) -> tuple[str, float, dict]:
        self.calls += 1
        n = arguments["n"]
        head = "The code is 4417. " if n == 1 else ""
        return head + " ".join(f"row{n}.{i} amount {7 * i + n}" for i in range(24)), 0.0, {}


@dataclass
class Decision:
    """One answer of the policy: what it was shown, and the conversation the model reads next (None: the
    trajectory may end before it reads one, as a reply asked for still has to come)."""

    view: ContextView
    kind: str  # "keep", "edit", "ask", "then", "branch"
    conversation: list[dict[str, Any]] | None
    plan: ContextPlan | None = None
    branch: Branch | None = None
    at: int = 0  # the generations asked for before it


@dataclass
class PolicyPlay:
    """One trajectory played under a policy (:func:`play_policy`): its segments (``pieces``), every answer
    of the policy (``decisions``), every generation with its prompt, the renderer, the calls the tool ran
    and the model's first prompt."""

    policy: ContextPolicy
    pieces: list[Trajectory]
    decisions: list[Decision]
    generations: list[tuple[list[int], list[int]]]  # (prompt, generated) per engine call, in order
    renderer: Any
    tool_calls: int

    @property
    def first_prompt(self) -> list[int]:
        """The prompt of the model's first generation (the task, rendered)."""
        return self.generations[0][0] if self.generations else []


class _PolicyModel(ScriptedEngine):
    """The script's turns in the order the loop asks for them (a branch's among them), and ``reply`` to a
    request the policy made (the generation after it asked)."""

    def __init__(self, tokenizer: Any, script: Sequence[str], reply: str) -> None:
        super().__init__(tokenizer, list(script), logprob=LOGPROB)
        self.reply, self.asked, self.next = reply, False, 0

    def text(self, session_id: str | None, prompt_ids: list[int]) -> str:
        if self.asked:
            self.asked = False
            return self.reply
        texts = self.script_of(session_id)
        self.next += 1
        return texts[min(self.next - 1, len(texts) - 1)]


def _copy(view: ContextView) -> ContextView:
    """The view as the policy was shown it (the loop goes on changing its messages)."""
    return ContextView([dict(m) for m in view.messages], view.task, view.tokens, view.turn)


def _recorded(policy: ContextPolicy, model: _PolicyModel, decisions: list[Decision]) -> None:
    """Record every answer of ``policy`` (its ``plan`` and ``branch``, on the instance)."""
    plan, branch = policy.plan, policy.branch

    def recording_plan(view: ContextView) -> ContextPlan | None:
        shown = _copy(view)
        answer = plan(view)
        at = len(model.calls)
        if answer is None:
            decisions.append(Decision(shown, "keep", shown.messages, at=at))
        elif answer.ask is not None and answer.then is not None:
            then = answer.then
            model.asked = True
            decisions.append(Decision(shown, "ask", [*shown.messages, {"role": "user", "content": answer.ask}],
                                      answer, at=at))

            def recording_then(reply: str) -> list[dict[str, Any]]:
                made = then(reply)
                decisions.append(Decision(shown, "then", [dict(m) for m in made], answer, at=len(model.calls)))
                return made

            answer.then = recording_then
        else:
            made = None if answer.messages is None else [dict(m) for m in answer.messages]
            decisions.append(Decision(shown, "edit", made, answer, at=at))
        return answer

    def recording_branch(view: ContextView, call: ToolCall) -> Branch | None:
        opened = branch(view, call)
        if opened is not None:
            decisions.append(Decision(_copy(view), "branch", [dict(m) for m in opened.messages], branch=opened,
                                      at=len(model.calls)))
        return opened

    policy.plan = recording_plan  # type: ignore[method-assign]
    policy.branch = recording_branch  # type: ignore[method-assign]


def built_policy(name: str, options: Mapping[str, Any] | None = None, max_context: int | None = None) -> ContextPolicy:
    """The registered policy ``name`` built as a run builds ``rollout.context: {name, ...options}`` with
    ``model.max_context`` (a bad option is the run's one-line :class:`~toolrl.config.ConfigError`)."""
    config = Config.model_validate({"data": {"train_files": ["x.jsonl"]}, "model": {"max_context": max_context},
                                    "rollout": {"context": {"name": name, **(options or {})}}})
    return build_context_policy(config)


def play_policy(name: str, options: Mapping[str, Any] | None, tokenizer: Any, *, max_context: int | None = 1024,
                script: Sequence[str] = DEFAULT_SCRIPT, reply: str = REPLY, max_turns: int = 40,
                max_new_tokens: int = 256) -> PolicyPlay:
    """One trajectory of the kit's task under the policy (module docstring), with ``tokenizer``'s chat
    template and the hermes parser; the model's turns are ``script``'s, and ``reply`` answers a request."""
    policy = built_policy(name, options, max_context)
    model = _PolicyModel(tokenizer, script, reply)
    decisions: list[Decision] = []
    _recorded(policy, model, decisions)
    pages = Pages()
    parser = build_part("tool_parsers", "hermes", {}, BuildContext("rollout.parser"))
    route = Route({"page": pages}, max_turns, parser, [], RewardConfig(), context=policy)
    ctx = RolloutContext(engine=model, renderer_factory=lambda schemas: ChatRenderer(tokenizer, schemas),
                         config=RolloutConfig(max_response_tokens=50_000, max_new_tokens=max_new_tokens,
                                              template_rewrite="refuse"),
                         routes={None: route})
    pieces = asyncio.run(run_trajectory_pieces(ctx, TASK, 0, "t", seed=0))
    errors = [p.error for p in pieces if p.error]
    if errors:  # the policy raised, or made an edit the loop refuses: every check would fail on it
        raise AssertionError(f"the play under {name!r} ended in an error: {errors[0]}")
    generations = [(call.prompt_ids, ids) for call in model.calls for ids in call.generated]
    return PolicyPlay(policy, pieces, decisions, generations, ctx.renderer(route), pages.calls)


def _tokens(piece: Trajectory) -> list[int]:
    return piece.prompt_ids + piece.response_ids


def check_context_build(name: str, options: Mapping[str, Any] | None = None, max_context: int | None = 1024) -> None:
    """``name`` builds through ``rollout.context`` into a :class:`~toolrl.context.ContextPolicy`, and an
    unknown option is one config error naming ``rollout.context.<key>``."""
    try:
        policy = built_policy(name, options, max_context)
    except ConfigError as exc:
        raise AssertionError(f"context policy {name!r} with options {dict(options or {})} does not build: {exc}") from None
    assert isinstance(policy, ContextPolicy), f"{name!r} builds a {type(policy).__name__}, not a ContextPolicy"
    key = "not_an_option_of_this_policy"
    try:
        built_policy(name, {**(options or {}), key: 1}, max_context)
    except ConfigError as exc:
        assert f"rollout.context.{key}" in str(exc) and "\n" not in str(exc), \
            f"an unknown option should be one line naming rollout.context.{key}, got: {exc}"
    else:
        raise AssertionError(f"{name!r} accepts an unknown option {key!r}: give it an Options model "
                             "(pydantic, extra='forbid')")


def check_context_prompts(play: PolicyPlay) -> None:
    """After each answer of the policy the model's next prompt is the template's rendering of the
    conversation it decided; the segments' prompts are the first prompt and each edit's and branch's."""
    render = play.renderer.conversation_ids
    for decision in play.decisions:
        if decision.conversation is None or decision.at >= len(play.generations):  # the model never read it
            continue
        prompt = play.generations[decision.at][0]
        expected = render(decision.conversation)
        assert prompt == expected, (
            f"turn {decision.view.turn}: after the policy's {decision.kind!r} the model read a prompt that is not "
            f"the template's rendering of the conversation it decided (first difference at token "
            f"{next((i for i, (a, b) in enumerate(zip(prompt, expected)) if a != b), min(len(prompt), len(expected)))})")
    opened = [render(d.conversation) for d in play.decisions if d.kind in ("edit", "then", "branch") and d.conversation]
    expected_prompts = Counter(tuple(p) for p in [play.first_prompt, *opened])
    got = Counter(tuple(p.prompt_ids) for p in play.pieces)
    assert got == expected_prompts, (
        f"the trajectory's {len(play.pieces)} segments should start from the first prompt and from each of the "
        f"{len(opened)} contexts the policy made, once each; {sum((got - expected_prompts).values())} start "
        f"elsewhere and {sum((expected_prompts - got).values())} of those contexts opened none")


def check_context_tokens(play: PolicyPlay) -> None:
    """Each generation sits in one segment right after its prompt, trained there once: the masks sum to the
    tokens generated, logprobs as the engine gave them, pieces numbered in order under one key."""
    pieces = play.pieces
    for index, (prompt, generated) in enumerate(play.generations):
        homes = [p for p in pieces if _tokens(p)[:len(prompt)] == prompt
                 and _tokens(p)[len(prompt):len(prompt) + len(generated)] == generated]
        assert homes, f"generation {index} (of {len(play.generations)}) is in no segment right after its prompt"
        home = homes[0]
        start = len(prompt) - len(home.prompt_ids)
        assert start >= 0 and all(home.response_mask[start:start + len(generated)]), \
            f"generation {index}'s tokens are not all trained (mask 1) in its segment"
    generated = sum(len(g) for _, g in play.generations)
    trained = sum(sum(p.response_mask) for p in pieces)
    assert trained == generated, f"the masks sum to {trained} trained tokens; the engine generated {generated}"
    for p in pieces:
        assert len(p.response_ids) == len(p.response_mask) == len(p.logprobs), \
            f"segment {p.piece}: response_ids, response_mask and logprobs differ in length"
        assert all(lp == LOGPROB for lp, m in zip(p.logprobs, p.response_mask) if m), \
            f"segment {p.piece}: a trained token's logprob is not the engine's"
    assert sorted(p.piece for p in pieces) == list(range(len(pieces))), "the segments are not numbered 0..n-1"
    assert len({p.key for p in pieces}) == 1, "the segments do not share the trajectory's key"


def check_context_plans(play: PolicyPlay) -> None:
    """Every edit keeps the task, removes only messages past it and is recorded on the segment it opened."""
    for d in play.decisions:
        task = d.view.messages[:d.view.task]
        if d.kind in ("edit", "then", "branch"):
            assert d.conversation is not None, f"turn {d.view.turn}: the policy's plan holds no messages and no request"
            assert d.conversation[:d.view.task] == task, \
                f"turn {d.view.turn}: the policy's {d.kind!r} drops or changes the task (the first {d.view.task} messages)"
        if d.plan is not None and d.kind != "then":
            removed = d.plan.removed
            assert all(d.view.task <= i < len(d.view.messages) for i in removed), \
                f"turn {d.view.turn}: removed {removed} names messages outside the {d.view.task}..{len(d.view.messages) - 1} " \
                "past the task"
            assert isinstance(d.plan.action, str) and d.plan.action, f"turn {d.view.turn}: a plan needs an action name"
    edits = [d for d in play.decisions if d.kind in ("edit", "then")]
    recorded = [p.edit for p in sorted(play.pieces, key=lambda p: p.piece) if p.edit is not None and p.edit.task is None]
    assert [(e.action, e.removed) for e in recorded] == [(d.plan.action, d.plan.removed) for d in edits if d.plan], \
        "the segments' recorded edits (action, removed) are not the policy's plans, in order"


def check_context_results(play: PolicyPlay) -> None:
    """The main line's tool results on its last segment; every call the tool ran is one result."""
    main = [p for p in play.pieces if p.edit is None or p.edit.task is None]
    last = max(main, key=lambda p: p.piece)
    early = [p.piece for p in main if p is not last and p.tool_results]
    assert not early, f"segments {early} of the main line hold tool results: they belong on its last segment"
    ran = play.tool_calls + sum(1 for d in play.decisions if d.kind == "branch")
    results = sum(len(p.tool_results) for p in play.pieces)
    assert results == ran, f"the trajectory holds {results} tool results; the tool ran {play.tool_calls} calls and " \
                           f"{ran - play.tool_calls} branches returned"


class ContextConformance:
    """Subclass in your plugin's tests and name the policy (``policy_name``, ``policy_options``; an
    example and the six tests: docs/plugins.md, "Context policies"). ``max_context`` is the run's
    ``model.max_context`` (1024); ``edits`` whether the play must see an edit (False for a policy that
    never edits); ``script`` the model's turns (default: read pages, then answer); ``reply`` the model's
    answer to a request (``ask``). ``tokenizer()`` returns the tokenizer whose chat template renders the
    conversation (default: :func:`toolrl.model_sources.qwen_tokenizer`); the calls are in the hermes syntax."""

    policy_name: ClassVar[str] = ""
    policy_options: ClassVar[dict[str, Any]] = {}
    max_context: ClassVar[int | None] = 1024
    edits: ClassVar[bool] = True
    script: ClassVar[Sequence[str]] = DEFAULT_SCRIPT
    reply: ClassVar[str] = REPLY
    _plays: ClassVar[dict[str, PolicyPlay]] = {}

    def tokenizer(self) -> Any:
        return qwen_tokenizer("qwen2_5")

    def play(self) -> PolicyPlay:
        """The play, once per class."""
        key = f"{type(self).__module__}.{type(self).__qualname__}"
        if key not in ContextConformance._plays:
            ContextConformance._plays[key] = play_policy(
                self.policy_name, self.policy_options, self.tokenizer(), max_context=self.max_context,
                script=self.script, reply=self.reply)
        return ContextConformance._plays[key]

    def test_builds_from_rollout_context(self) -> None:
        check_context_build(self.policy_name, self.policy_options, self.max_context)

    def test_the_play_edits(self) -> None:
        changed = [d for d in self.play().decisions if d.kind != "keep"]
        if self.edits:
            assert changed, (f"{self.policy_name!r} never edited in the play ({len(self.play().decisions)} views): "
                             "lower its trigger or max_context, or set edits = False")
        else:
            assert not changed, f"{self.policy_name!r} edited, but the class says edits = False"

    def test_each_prompt_is_the_rendering_of_the_policy_s_conversation(self) -> None:
        check_context_prompts(self.play())

    def test_every_generated_token_is_trained_once(self) -> None:
        check_context_tokens(self.play())

    def test_edits_keep_the_task_and_are_recorded(self) -> None:
        check_context_plans(self.play())

    def test_tool_results_sit_on_the_last_segment(self) -> None:
        check_context_results(self.play())
