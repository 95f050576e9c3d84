"""A multi-turn BFCL entry: the entry's backends (a file system, a trading bot, ...) built for this
episode alone, the model's calls run on them turn by turn, the next user turn (or the held-out functions
of ``miss_func``) given when the model answers without a call, and BFCL's multi-turn checker as the verdict.

bfcl-eval's own runner has two hazards, both avoided here:

1. It runs each call with ``eval()`` on the model's text (``execute_multi_turn_func_call``). Here the
   model's text is never evaluated while the episode runs: toolrl's parser has read each call into a name
   and literal values, and the call goes straight to the backend method of that name — only a public
   method of the entry's backends that its functions (so far revealed) name; anything else is an error the
   model reads. BFCL's checker, which still evaluates call strings, is given only the calls the episode
   ran, each formatted by BFCL's own formatter and checked to read back as exactly
   ``name(keyword=literal, ...)`` with the arguments that ran (:func:`call_source`).
2. It caches backend instances in its module's globals, named by model and entry, for the life of the
   process: two trajectories of one entry would share one file system, and every entry scored leaks its
   instances. Here each episode builds its own instances (``close`` drops them); the checker, which uses
   those globals to re-run both the model's and the ground truth's calls, runs under a lock, and the
   globals it makes for the entry are deleted after it (and before, should any be left over).

Two lesser ones are contained too: MathAPI sets mpmath's and decimal's precision for the whole process
(restored after each call: :func:`contained_arithmetic`), and a precision or exponent the model picks can
make one call compute for minutes on the event loop (capped: :data:`COSTLY`).

A session cannot add tools after reset, so the tools handed out are all of the entry's functions, the
held-out ones of ``miss_func`` included: one answers as an unknown name until the user turn that reveals
it (BFCL's words, its docs in them). Under ``prompting`` the chat template is given none of them
(``Reset.render_tools``): BFCL's system prompt lists the visible ones. Under ``native`` the template would
show every tool from the start, so ``miss_func`` is refused there.

A session's ``step`` is not told which model turn made a call, so BFCL's step limit (``max_steps`` model
turns of calls in one user turn) is applied by the verdict, from the trajectory's turns; the rollout's
``max_turns`` bounds the run itself.
"""

from __future__ import annotations

import ast
import contextlib
import copy
import decimal
import importlib
import inspect
import json
import re
import threading
from collections.abc import Callable, Iterator
from typing import Any

from toolrl.schemas import ToolCall, ToolResponse
from toolrl.sessions import Reset, StepResult
from toolrl.trajectory import Trajectory

from toolrl_bfcl import upstream
from toolrl_bfcl.session import BfclSessionOptions
from toolrl_bfcl.single_turn import checker_model, tool_schemas, whole_answer

# Each call the episode ran carries its index in ``MultiTurnEpisode.calls`` in its result's metrics: the
# verdict reads which model turn made it from the trajectory (``ToolResult.turn``).
CALL_KEY = "bfcl.call"
# BFCL's checker keeps its instances in its module's globals (hazard 2): one checker at a time.
_CHECKER_LOCK = threading.Lock()
# Arguments that set how much arithmetic a call does, capped far above any entry's (precisions up to 10)
# and far below what holds the event loop for minutes: a step cannot be interrupted, and the checker
# runs the call again. Over its cap a call is an error the model reads, and is not run.
COSTLY: dict[str, tuple[str, int]] = {"logarithm": ("precision", 1000), "square_root": ("precision", 1000),
                                      "power": ("exponent", 1000)}


def build_backends(entry: dict[str, Any]) -> dict[str, Any]:
    """The entry's backend instances, as BFCL builds them (its module table; the scenario deep-copied;
    stateless classes left unloaded; long-context scenarios for the long-context category), but fresh."""
    upstream.load()  # bfcl-eval's project root and model table first
    from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING, STATELESS_CLASSES

    category = entry["id"].rsplit("_", 1)[0]  # as BFCL reads it
    backends: dict[str, Any] = {}
    for name in entry["involved_classes"]:
        instance = getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[name]), name)()
        if name not in STATELESS_CLASSES:
            instance._load_scenario(copy.deepcopy(entry["initial_config"].get(name, {})),
                                    long_context="long_context" in category or "composite" in category)
        backends[name] = instance
    return backends


def public_methods(backends: dict[str, Any]) -> dict[str, Callable[..., Any]]:
    """Method name → bound method, public ones only; a later class wins a shared name, as in BFCL."""
    return {name: method for instance in backends.values()
            for name, method in inspect.getmembers(instance, inspect.ismethod) if not name.startswith("_")}


def call_source(name: str, arguments: dict[str, Any]) -> str | None:
    """The call as BFCL's formatter writes it (what its checker evaluates), or None where that text is
    not exactly ``name(keyword=literal, ...)`` with these arguments: BFCL writes a dict of dicts as a
    nested call and puts dict keys in quotes unescaped, and ``nan`` is no literal."""
    try:
        source = upstream.load().handler_utils.decoded_output_to_execution_list([{name: arguments}])[0]
        tree = ast.parse(source, mode="eval").body
        exact = (isinstance(tree, ast.Call) and isinstance(tree.func, ast.Name) and tree.func.id == name
                 and not tree.args and [k.arg for k in tree.keywords] == list(arguments)
                 and all(ast.literal_eval(k.value) == arguments[k.arg] for k in tree.keywords))
    except Exception:  # BFCL's formatter fails on some values ({}), the parse on deep ones
        return None
    return source if exact else None


def too_costly(name: str, arguments: dict[str, Any]) -> str | None:
    """Why the call is not run (an argument past its :data:`COSTLY` cap), or None."""
    key, cap = COSTLY.get(name, ("", 0))
    value = arguments.get(key)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) > cap:
        return f"{name}: {key} must be at most {cap}"
    return None


@contextlib.contextmanager
def contained_arithmetic() -> Iterator[None]:
    """MathAPI sets mpmath's precision for the whole process and decimal's for the thread (BFCL runs in
    a process of its own); here both are restored after each call, for the other code of the process."""
    import mpmath

    with decimal.localcontext(), mpmath.workdps(mpmath.mp.dps):
        yield


def result_text(value: Any) -> str:
    """A return value as BFCL gives it back to the model: a str as it is, a dict as JSON (its str where
    it does not serialise), anything else its str."""
    if type(value) is str:
        return value
    if type(value) is dict:
        try:
            return json.dumps(value)
        except Exception:
            return str(value)
    return str(value)


def execution_error(message: str, metrics: dict[str, Any] | None = None) -> StepResult:
    """An error as BFCL reports a failed call to the model."""
    return StepResult(response=ToolResponse.error(f"Error during execution: {message}"), metrics=metrics or {})


def reveal_message(functions: list[dict[str, Any]]) -> str:
    """The user turn that reveals held-out functions, as BFCL's prompting path words it (their docs, then
    "I have updated some more functions ..."); its function-calling path's words without the docs would
    need the tools to change mid-trajectory, which the native format refuses (reset)."""
    upstream.load()
    from bfcl_eval.constants import default_prompts

    return default_prompts.DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING.format(functions=functions)


def instance_globals(model: str, entry: dict[str, Any]) -> list[str]:
    """The names BFCL's checker gives the entry's instances in its module's globals: the model's and the
    ground truth's, of evaluation runs and (should anything run one) inference runs."""
    return [re.sub(r"[-./:]", "_", f"{prefix}_{entry['id']}_{name}_instance")
            for prefix in (model, f"{model}_eval", f"{model}_ground_truth", f"{model}_ground_truth_eval")
            for name in entry["involved_classes"]]


def checker_verdict(decoded: list[list[list[str]]], entry: dict[str, Any], category: str, model: str) -> bool:
    """BFCL's multi-turn checker on the decoded result, alone, leaving no instance behind (hazard 2)."""
    bfcl = upstream.load()
    names, space = instance_globals(model, entry), vars(bfcl.multi_turn_utils)
    with _CHECKER_LOCK:
        try:
            for name in names:  # a leftover would be taken up as this entry's state
                space.pop(name, None)
            with contained_arithmetic():
                result = bfcl.multi_turn_checker.multi_turn_checker(decoded, entry["ground_truth"], entry,
                                                                    category, model)
        finally:
            for name in names:
                space.pop(name, None)
    return bool(result["valid"])


class MultiTurnEpisode:
    """One trajectory on a multi-turn entry (the Episode protocol of :mod:`toolrl_bfcl.session`)."""

    def __init__(self, entry: dict[str, Any], category: str, options: BfclSessionOptions,
                 trajectory_id: str) -> None:
        self.entry, self.category, self.options, self.trajectory_id = entry, category, options, trajectory_id
        self.held_out: dict[str, list[dict[str, Any]]] = entry.get("missed_function") or {}
        self.backends = build_backends(entry)
        self.methods = public_methods(self.backends)
        # Tool name the model calls → backend method, for the functions revealed so far.
        self.names: dict[str, str] = self._names(entry["function"])
        self.turn = 0  # the user turn going on (0-based)
        self.answered = 0  # user turns the model ended by answering without a call
        self.calls: list[tuple[int, str]] = []  # each call run: its user turn and its BFCL call string

    def _names(self, functions: list[dict[str, Any]]) -> dict[str, str]:
        schemas = tool_schemas(functions, self.options.format)
        return {s["function"]["name"]: f["name"] for s, f in zip(schemas, functions, strict=True)}

    async def reset(self) -> Reset:
        if self.held_out and self.options.format == "native":
            raise ValueError(f"{self.category} cannot run under format native: the chat template shows every "
                             "tool from the start and a session cannot add tools later, so its held-out "
                             "functions would not be held out (use format prompting)")
        held = [doc for turn in sorted(self.held_out, key=int) for doc in self.held_out[turn]]
        return Reset(tools=tool_schemas(self.entry["function"] + held, self.options.format), replace_tools=True,
                     render_tools=self.options.format == "native")

    async def step(self, call: ToolCall) -> StepResult:
        # Unknown, private and not yet revealed names answer as BFCL's eval of an unknown name would.
        name = self.names.get(call.name)
        if name is None or name.startswith("_") or name not in self.methods:
            return execution_error(f"name '{call.name}' is not defined")
        arguments = copy.deepcopy(dict(call.arguments))  # a backend may keep (and change) what it is given
        source = call_source(name, arguments)
        if source is None:
            return execution_error(f"{call.name}: the arguments must be plain literals (strings, numbers, "
                                   "booleans, null, lists, flat dicts)")
        if (why := too_costly(name, arguments)) is not None:
            return execution_error(why)
        self.calls.append((self.turn, source))
        metrics = {CALL_KEY: len(self.calls) - 1}
        try:  # the result's text too: BFCL reports a value that has none (a huge int) as the call's error
            with contained_arithmetic():
                text = result_text(self.methods[name](**arguments))
        except Exception as exc:  # the backend's own error, which the model reads (as in BFCL)
            return execution_error(str(exc), metrics)
        return StepResult(response=text, metrics=metrics)

    async def respond(self, message: str) -> str | None:
        """The next user turn once the model answers without a call; None after the last."""
        questions = self.entry["question"]
        self.answered = min(self.answered + 1, len(questions))
        if self.turn + 1 >= len(questions):
            return None
        self.turn += 1
        held = self.held_out.get(str(self.turn))
        if held:  # miss_func: the held-out functions join the callable ones
            self.names.update(self._names(held))
            return reveal_message(held)
        return "\n\n".join(m["content"] for m in questions[self.turn] if m["role"] == "user")

    def decoded(self, trajectory: Trajectory) -> list[list[list[str]]]:
        """BFCL's decoded model result: per user turn the model ended, per model turn of it that ran
        calls, their call strings in the order written. A user turn past ``max_steps`` such model turns
        ends the result there, cut after the step that passed it (BFCL's force-termination); one cut short
        by the rollout's limits is not in it."""
        steps: dict[int, list[int]] = {}  # model turn → the calls it ran
        for result in trajectory.tool_results:
            index = result.metrics.get(CALL_KEY)
            if isinstance(index, int) and 0 <= index < len(self.calls) and self._decodes(trajectory, result.turn):
                steps.setdefault(result.turn, []).append(index)
        turns: list[list[list[str]]] = [[] for _ in range(self.turn + 1)]
        for model_turn in sorted(steps):
            indices = steps[model_turn]
            turns[self.calls[indices[0]][0]].append([self.calls[i][1] for i in indices])
        for index, turn in enumerate(turns):
            if len(turn) > self.options.max_steps:
                return turns[:index] + [turn[: self.options.max_steps + 1]]
        return turns[: self.answered]

    def _decodes(self, trajectory: Trajectory, model_turn: int) -> bool:
        """Whether BFCL's decoder reads that model turn's answer as calls (a step it cannot decode it skips)."""
        texts = trajectory.model_text
        return self.options.format != "prompting" or not 0 < model_turn <= len(texts) \
            or whole_answer(texts[model_turn - 1])

    def verdict(self, trajectory: Trajectory) -> tuple[float, dict[str, float]]:
        """BFCL's verdict; no shaped parts: a multi-turn entry has no per-call answer key to match
        against (its ground truth is checked by state and results, not call by call)."""
        decoded = self.decoded(trajectory)
        if len(decoded) != len(self.entry["ground_truth"]):  # force-terminated: wrong, as BFCL scores it
            return 0.0, {}
        return float(checker_verdict(decoded, self.entry, self.category, checker_model(self.options.format))), {}

    def close(self) -> None:
        self.backends, self.methods, self.names = {}, {}, {}
