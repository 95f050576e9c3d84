"""A single-turn BFCL entry: the entry's functions handed out as tools, the model's one answer, BFCL's
verdict on it. Nothing runs: a call is recorded and ends the episode (BFCL executes none of them).

The verdict follows BFCL's eval runner category by category: ``ast`` entries go to its AST checker with
the decoded calls (an answer that does not decode as calls is wrong); ``irrelevance`` is right when the
answer holds no call, ``relevance`` when it holds one. "Decodes", under ``prompting``: the answer is a call
list and nothing else (no prose, no fence word) and its calls parse, which is where BFCL's decoder raises;
positional arguments, which its decoder drops, are dropped. The test_parity tests hold this against
``bfcl evaluate`` on recorded answers.
"""

from __future__ import annotations

import ast
import re
from typing import Any

from toolrl.parsers.pythonic import TURN_END, PythonicParser
from toolrl.schemas import ToolCall
from toolrl.sessions import Reset, StepResult
from toolrl.trajectory import Trajectory

from toolrl_bfcl import categories, upstream
from toolrl_bfcl.session import BfclSessionOptions


def tool_schemas(functions: list[dict[str, Any]], format: str) -> list[dict[str, Any]]:
    """The entry's functions as OpenAI tool schemas (BFCL's conversion); under ``prompting`` with BFCL's
    own (dotted) names, which is what a prompted model answers with."""
    schemas = upstream.openai_tools(functions)
    if format == "prompting":
        for schema, function in zip(schemas, functions, strict=True):
            schema["function"]["name"] = function["name"]
    return schemas


# A fence's language word, which BFCL's strip("`\n ") leaves in front of the calls (then its decoder fails).
_FENCE_WORD = re.compile(r"(?:python|py|json)[ \t]*\n")


def whole_answer(text: str) -> bool:
    """Whether a prompting answer is a call list and nothing else, which is what BFCL's decoder reads
    (toolrl's parser also reads a call list after prose, or in a ```python fence)."""
    return not PythonicParser().parse(text).content.strip() \
        and not _FENCE_WORD.match(TURN_END.sub("", text).strip("`\n "))


# The value nodes BFCL's decoder resolves (resolve_ast_by_type); any other makes it raise: no call.
_RESOLVED = (ast.Constant, ast.UnaryOp, ast.List, ast.Dict, ast.BinOp, ast.Name, ast.Call, ast.Tuple, ast.Lambda,
             ast.Subscript)


def bfcl_calls(text: str) -> list[ast.Call] | None:
    """The calls BFCL's decoder reads in a prompting answer, as syntax (its strip and brackets, then the
    whole answer a call or a list of calls); None where it reads none. Nothing is evaluated."""
    body = TURN_END.sub("", text).strip("`\n ")
    source = ("" if body.startswith("[") else "[") + body + ("" if body.endswith("]") else "]")
    try:
        tree = ast.parse(source, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    calls = [tree] if isinstance(tree, ast.Call) else getattr(tree, "elts", None)
    return calls if calls is not None and all(isinstance(c, ast.Call) for c in calls) else None


def holds_call(text: str) -> bool:
    """Whether BFCL's decoder reads a prompting answer as holding a call, the question relevance and
    irrelevance entries ask: a non-empty list of calls whose keyword values are of the kinds its decoder
    resolves. Read from the syntax tree alone: where BFCL's decoder evaluates a value (arithmetic, a
    lambda), this reads its shape; positional arguments, which BFCL ignores, are ignored."""
    calls = bfcl_calls(text)
    return bool(calls) and all(isinstance(k.value, _RESOLVED) for c in calls or [] for k in c.keywords)


def decoded(trajectory: Trajectory, format: str, turn: int = 1) -> list[dict[str, dict[str, Any]]] | None:
    """The calls of model turn ``turn`` as BFCL's decoder gives them (``[{name: {param: value}}]``);
    None where the answer does not decode: a call in it failed to parse, or, under ``prompting``, the
    answer is not a call list alone (:func:`whole_answer`)."""
    if trajectory.parse_errors:
        return None
    results = [r for r in trajectory.tool_results if r.turn == turn]
    if format != "prompting" or len(trajectory.model_text) < turn:
        return [{r.name: dict(r.arguments)} for r in results]
    text = trajectory.model_text[turn - 1]
    if not whole_answer(text):
        return None
    # BFCL's decoder drops positional arguments (the parser binds them to the parameters): so do we.
    written = [[k.arg for k in call.keywords] for call in bfcl_calls(text) or []]
    if len(written) != len(results):
        return None
    return [{r.name: {k: r.arguments[k] for k in names if k in r.arguments}} for r, names in zip(results, written)]


def checker_model(format: str) -> str:
    return upstream.PROMPT_MODEL if format == "prompting" else upstream.FC_MODEL


def ast_verdict(entry: dict[str, Any], category: str, calls: list[dict[str, Any]] | None, format: str) -> bool:
    """BFCL's AST checker on ``calls`` (None or none: the answer did not decode as calls: wrong)."""
    if not calls:
        return False
    bfcl = upstream.load()
    result = bfcl.ast_checker(entry["function"], calls, entry["ground_truth"], bfcl.Language.PYTHON, category,
                              checker_model(format))
    return bool(result["valid"])


class SingleTurnEpisode:
    def __init__(self, entry: dict[str, Any], category: str, options: BfclSessionOptions) -> None:
        self.entry, self.category, self.options = entry, category, options
        self.kind = categories.KINDS[category]

    async def reset(self) -> Reset:
        # Under prompting, BFCL's prompt lists the functions: the chat template gets none.
        return Reset(tools=tool_schemas(self.entry["function"], self.options.format), replace_tools=True,
                     render_tools=self.options.format == "native")

    async def step(self, call: ToolCall) -> StepResult:
        return StepResult(response="recorded", done=True)

    async def respond(self, message: str) -> str | None:
        return None

    def verdict(self, trajectory: Trajectory) -> tuple[float, dict[str, float]]:
        calls = decoded(trajectory, self.options.format)
        if self.kind in ("irrelevance", "relevance"):
            called = holds_call(trajectory.model_text[0]) if self.options.format == "prompting" \
                and trajectory.model_text else bool(calls)
            return float(called == (self.kind == "relevance")), {}
        from toolrl_bfcl.shaped import match_parts

        attempted = bool(trajectory.parse_errors or trajectory.tool_results)
        parts = {"format": 1.0 if calls else 0.5 if attempted else 0.0,
                 **match_parts(calls or [], self.entry["ground_truth"], self.options.format)}
        return float(ast_verdict(self.entry, self.category, calls, self.options.format)), parts

    def close(self) -> None:
        pass
