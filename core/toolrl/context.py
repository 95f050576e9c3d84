"""The context policy part kind (``rollout.context``; its contract: ``register_context_policies`` in
hookspecs.py): what an agent's context becomes when it grows past a budget. Each edit starts a new
*segment* of the trajectory, its prompt the edited conversation's rendering, so each generated token is
trained exactly once (docs/rollouts.md). Every policy keeps the task: the system prompt, the sample's
prompt and a session's opening messages.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from toolrl.config import Tokens
from toolrl.plugins.parts import NoOptions
from toolrl.schemas import ToolCall

if TYPE_CHECKING:
    from toolrl.plugins.parts import RunFacts

Messages = list[dict[str, Any]]

@dataclass
class ContextView:
    """The live conversation as a policy sees it: ``messages`` (the first ``task`` of them are the
    task, which every policy keeps), its length in tokens (the live segment's) and the turn."""

    messages: Messages
    task: int
    tokens: int
    turn: int

    def after_task(self, role: str) -> list[int]:
        """The positions of the messages of ``role`` after the task."""
        return [i for i in range(self.task, len(self.messages)) if self.messages[i].get("role") == role]


@dataclass
class ContextPlan:
    """An edit: ``messages`` (the edited conversation) or, for an edit the model writes, ``ask`` (a
    user turn appended to the live context) and ``then`` (its reply's text -> the edited
    conversation). ``action`` and ``removed`` (indices of the messages dropped or replaced) are
    recorded in the trajectory (:class:`toolrl.trajectory.ContextEdit`)."""

    action: str
    removed: list[int] = field(default_factory=list)
    messages: Messages | None = None
    ask: str | None = None
    then: Callable[[str], Messages] | None = None
    max_reply_tokens: int | None = None


@dataclass
class Branch:
    """A sub-task to run in a branch (``fold``): ``messages`` (the branch's conversation: the task and the
    sub-task), its turn limit, and the most tokens of its answer returned to the main line."""

    task: str
    messages: Messages
    max_turns: int
    max_result_tokens: int


class ContextPolicy:
    """The base of every context policy; itself the ``none`` policy (it never edits).

    ``Options`` (a pydantic model) types ``rollout.context``'s keys besides ``name``; ``build(options,
    context)`` makes one policy per route, with the run's ``model.max_context``
    (``context.inputs["max_context"]``, None when unset)."""

    name: ClassVar[str] = "none"
    Options: ClassVar[type[BaseModel]] = NoOptions

    def __init__(self, options: BaseModel, max_context: int | None) -> None:
        self.options = options
        self.max_context = max_context

    @classmethod
    def build(cls, options: BaseModel, context: Any) -> ContextPolicy:
        return cls(options, context.input("max_context"))

    def plan(self, view: ContextView) -> ContextPlan | None:
        """The edit to make now, or None to keep the context as it is."""
        return None

    def check_run(self, facts: RunFacts) -> list[str]:
        """The run check (:class:`toolrl.plugins.parts.RunFacts`, before any model loads): a policy that
        edits needs a route whose parser takes tool results as chat messages (an inline-tag parser
        writes them into the model's turn, which no edit can cut). Returns warning lines; a subclass
        extends it with its own options' checks."""
        parser = facts.parser
        if self.name != ContextPolicy.name and parser is not None and parser.result_mode == "inline":
            raise ValueError(f"{self.name}: edits conversations of chat turns, and parser {parser.name!r} calls tools "
                             "inline (its results go into the model's turn); use a chat parser (hermes, ...) or "
                             "context: none")
        return []

    def tool_schemas(self) -> list[dict[str, Any]]:
        """The tools the policy gives the model besides the trajectory's (their calls are run by the
        loop through :meth:`branch`, not by a tool)."""
        return []

    def branch(self, view: ContextView, call: ToolCall) -> Branch | None:
        """The branch ``call`` opens, or None (a call of the trajectory's tools). A branch call with bad
        arguments raises ValueError, whose text the model gets as the call's error."""
        return None


class TriggeredOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    trigger_tokens: int | None = Field(None, gt=0, description="edit when the live context passes this many "
                                       "tokens; None: the policy's share of model.max_context")


class TriggeredPolicy(ContextPolicy):
    """A policy that edits once the live context passes ``trigger_tokens`` (default: ``trigger_share``
    of ``model.max_context``)."""

    trigger_share: ClassVar[float] = 0.75

    def __init__(self, options: TriggeredOptions, max_context: int | None) -> None:
        super().__init__(options, max_context)
        trigger = options.trigger_tokens
        if trigger is None and max_context is None:
            raise ValueError(f"{self.name} needs trigger_tokens or model.max_context")
        if trigger is not None and max_context is not None and trigger >= max_context:
            raise ValueError(f"trigger_tokens: {trigger} leaves no room below model.max_context ({max_context})")
        self.trigger: int = trigger if trigger is not None else int(self.trigger_share * (max_context or 0))

    def plan(self, view: ContextView) -> ContextPlan | None:
        return self.edit(view) if view.tokens > self.trigger else None

    def check_run(self, facts: RunFacts) -> list[str]:
        """A trigger the model's context ends before never fires: one warning."""
        warnings = super().check_run(facts)
        if facts.window is not None and self.trigger >= facts.window:
            how = "trigger_tokens" if self.options.trigger_tokens is not None else \
                f"its default trigger ({self.trigger_share:g} of model.max_context)"
            warnings.append(f"{facts.where('rollout.context')}: {self.name}'s {how} is {self.trigger:,} tokens, at or "
                            f"beyond the model's context ({facts.window:,}, {facts.window_stated}): it never edits")
        return warnings

    def edit(self, view: ContextView) -> ContextPlan | None:
        raise NotImplementedError


class DropToolOutputs(TriggeredPolicy):
    """Past the trigger, every tool result but the last ``keep_last`` becomes ``stub``; the calls
    and the model's turns stay."""

    name = "drop_tool_outputs"

    class Options(TriggeredOptions):
        keep_last: int = Field(1, ge=0, description="the newest tool results kept whole")
        stub: str = Field("[tool output dropped to save context]", min_length=1)

    options: Options

    def edit(self, view: ContextView) -> ContextPlan | None:
        tools = view.after_task("tool")
        old = tools[:len(tools) - self.options.keep_last] if self.options.keep_last else tools
        removed = [i for i in old if view.messages[i].get("content") != self.options.stub]
        if not removed:
            return None
        messages = [dict(m, content=self.options.stub) if i in removed else m
                    for i, m in enumerate(view.messages)]
        return ContextPlan("drop_tool_outputs", removed, messages=messages)


class Window(TriggeredPolicy):
    """Past the trigger, the context becomes the task and the last ``keep_turns`` turns (an assistant
    turn with its tool results)."""

    name = "window"

    class Options(TriggeredOptions):
        keep_turns: int = Field(2, ge=1, description="the newest turns kept")

    options: Options

    def edit(self, view: ContextView) -> ContextPlan | None:
        starts = view.after_task("assistant")  # where each turn starts (its tool results follow it)
        if len(starts) <= self.options.keep_turns:
            return None
        cut = starts[-self.options.keep_turns]
        return ContextPlan("window", list(range(view.task, cut)),
                           messages=view.messages[:view.task] + view.messages[cut:])


SUMMARY_REQUEST = ("Your context is almost full. Write a summary of everything you will still need: the task, "
                   "every value you found that matters and what remains to do. Make no tool call.")
SUMMARY_HEADER = "Summary of your work so far (the earlier turns were removed to save context):\n"


class Summarise(TriggeredPolicy):
    """Past the trigger, the model is asked for a summary (``request``, a user turn); its reply is
    generated and trained like any turn, and the conversation goes on from the task and a user turn
    holding the summary (``header`` + the reply)."""

    name = "summarise"

    class Options(TriggeredOptions):
        request: str = Field(SUMMARY_REQUEST, min_length=1)
        header: str = SUMMARY_HEADER
        max_summary_tokens: Tokens = Field(256, gt=0, description="the summary turn's generation limit")

    options: Options
    trigger_share = 0.5  # the request and the summary are generated on top of the context that passed it

    def __init__(self, options: Options, max_context: int | None) -> None:
        super().__init__(options, max_context)
        if max_context is not None and self.trigger + options.max_summary_tokens >= max_context:
            raise ValueError(f"trigger_tokens ({self.trigger}) + max_summary_tokens ({options.max_summary_tokens}) "
                             f"leave no room for the summary below model.max_context ({max_context})")

    def check_run(self, facts: RunFacts) -> list[str]:
        """A summary the model's context cannot hold is refused (its trigger past it is a warning)."""
        limit = self.options.max_summary_tokens
        if facts.window is not None and limit >= facts.window:
            raise ValueError(f"max_summary_tokens: {limit:,} is not below the model's context ({facts.window:,}, "
                             f"{facts.window_stated}): the summary is generated inside it")
        return super().check_run(facts)

    def edit(self, view: ContextView) -> ContextPlan | None:
        task = view.messages[:view.task]

        def then(reply: str) -> Messages:
            return [*task, {"role": "user", "content": self.options.header + reply.strip()}]

        return ContextPlan("summarise", list(range(view.task, len(view.messages))), ask=self.options.request,
                           then=then, max_reply_tokens=self.options.max_summary_tokens)


BRANCH_TOOL = "branch"
BRANCH_SCHEMA: dict[str, Any] = {"type": "function", "function": {
    "name": BRANCH_TOOL,
    "description": "Run a sub-task in a branch of its own: it starts from the task and the sub-task, makes its "
                   "own tool calls, and only its final answer comes back here as this call's result.",
    "parameters": {"type": "object", "properties": {"task": {"type": "string", "description": "the sub-task"}},
                   "required": ["task"], "additionalProperties": False}}}
FOLD_HEADER = ("You are in a branch working on one sub-task of the task above. Work on it alone; your answer "
               "(a turn without a tool call) is returned to the main task as the result of its branch call.\n"
               "Sub-task: ")


class Fold(ContextPolicy):
    """The model gets a ``branch`` tool. A call runs its sub-task in a branch: a segment of its own whose
    prompt is the task and the sub-task (``header`` + ``task``), whose turns are generated and trained
    like any; the branch's answer (cut to ``max_result_tokens``) is the call's one short result, and the
    main line goes on without the branch's turns (Context-Folding, arXiv 2510.11967)."""

    name = "fold"

    class Options(BaseModel):
        model_config = ConfigDict(extra="forbid", frozen=True)

        max_branch_turns: int = Field(16, gt=0, description="a branch's turn limit")
        max_result_tokens: int = Field(256, gt=0, description="the most of a branch's answer the main line gets")
        header: str = Field(FOLD_HEADER, min_length=1, description="the branch's user turn, before its sub-task")

    options: Options

    def tool_schemas(self) -> list[dict[str, Any]]:
        return [BRANCH_SCHEMA]

    def branch(self, view: ContextView, call: ToolCall) -> Branch | None:
        if call.name != BRANCH_TOOL:
            return None
        task = call.arguments.get("task")
        if not isinstance(task, str) or not task.strip():
            raise ValueError("field 'task': the sub-task to run in the branch, a non-empty string")
        messages = [*view.messages[:view.task], {"role": "user", "content": self.options.header + task.strip()}]
        return Branch(task.strip(), messages, self.options.max_branch_turns, self.options.max_result_tokens)
