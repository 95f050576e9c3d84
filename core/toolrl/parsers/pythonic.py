"""Pythonic calls: the whole answer is a Python list of keyword-argument calls::

    [get_weather(city="Paris", unit="c"), math.factorial(number=5)]

The format of the Berkeley Function Calling Leaderboard's prompting mode, Llama 3.2/4's pythonic tool
calls and vLLM's ``pythonic`` parser. The text is read as BFCL's decoder reads it (``strip("`\\n ")``,
then ``[``/``]`` added where missing; a fence's ``python``/``json`` word is dropped too), so a
well-formed answer reads the same. Nothing is evaluated: the text is parsed with ``ast.parse`` and its
tree walked. Values are literals, bare names (``unit=celsius`` is ``"celsius"``), arithmetic on numbers
(bounded) and nested calls (``{"f": {"k": v}}`` with keywords, their source without); anything else
(attributes, subscripts, lambdas, f-strings, sets, dunder names), a callee that is not a dotted name
and positional arguments make that call a parse error. Text that does not read as a call list is
content, unless it opens like one (``[name(``): then it is a parse error. A call list on its own line
after prose is read too, the prose being content.
"""

from __future__ import annotations

import ast
import json
import math
import operator
import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from toolrl.parsers import ToolParser, parse_result
from toolrl.schemas import ParseError, ParseResult, ToolCall

MAX_CHARS = 100_000  # a longer call list is a parse error, never parsed
MAX_VALUE_DEPTH = 50  # values nested deeper are a parse error
_MAX_INT_BITS = 3_300  # about 1,000 digits: a larger integer is a parse error
_MAX_POWER = (1e6, 64)  # ``a ** b`` only for |a| <= 1e6 and |b| <= 64

_IDENTIFIER = r"[^\W\d]\w*"
_OPENS_CALL = rf"\[\s*{_IDENTIFIER}(?:\s*\.\s*{_IDENTIFIER})*\s*\("
_CALL_LIST_START = re.compile(_OPENS_CALL)  # text that sets out to be a call list
_FENCE_WORD = re.compile(r"(?:python|py|json)[ \t]*\n")  # left by strip("`") of a ```python fence
# The family's end-of-turn token the rollout's text ends with (<|im_end|>, <|eot_id|>, </s>, <end_of_turn>):
# markup, not part of the answer.
TURN_END = re.compile(r"(?:\s*(?:<\|[^|<>\s]+\|>|</s>|<end_of_turn>|<eos>))+\s*\Z")
# A call list on its own line (in a fence or not): a candidate for calls after prose.
_CALLS_AFTER_PROSE = re.compile(rf"^[ \t]*(?:```[ \t]*(?:python|py|json)?[ \t]*\n[ \t]*)?(?={_OPENS_CALL})", re.M)
# The file name model output is parsed under: the warnings compiling it raises (``1if x``, ``"\d"``) are
# the model's, not the program's, and are not shown.
_FILENAME = "<pythonic tool calls>"
warnings.filterwarnings("ignore", module=re.escape(_FILENAME))
_ARITHMETIC: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}


class _Refused(Exception):
    """A call the parser will not read; the message is for the model."""


class PythonicParser(ToolParser):
    """``positional``: positional arguments are bound to the tool's parameters in the order its schema
    lists them (``f('a.txt')`` as a Python call binds them; BFCL's multi-turn answers use them); off, they
    are a parse error."""

    name = "pythonic"

    def __init__(self, positional: bool = False) -> None:
        self.positional = positional
        self.parameters: dict[str, list[str]] = {}

    def bind_tools(self, schemas: Sequence[Mapping[str, Any]]) -> None:
        self.parameters = {s["function"]["name"]: list((s["function"].get("parameters") or {}).get("properties") or {})
                           for s in schemas if isinstance(s.get("function"), Mapping)}

    def parse(self, text: str) -> ParseResult:
        text = TURN_END.sub("", text)
        source, sets_out = call_list_source(text)
        if sets_out and len(source) > MAX_CHARS:
            return _list_error(f"the tool-call list is longer than {MAX_CHARS} characters", text)
        tree = _parse(source) if len(source) <= MAX_CHARS else "too long"
        nodes = _call_nodes(tree) if isinstance(tree, ast.expr) else None
        if nodes:
            calls, errors = read_calls(nodes, source, self.parameters if self.positional else None)
            return ParseResult(content="", calls=calls, errors=errors)
        if sets_out and isinstance(tree, str):
            return _list_error(f"the tool-call list is not valid Python: {tree}; write "
                               "[name(argument=value, ...), ...]", text)
        return _after_prose(text, self.parameters if self.positional else None)


def call_list_source(text: str) -> tuple[str, bool]:
    """The text as BFCL's decoder reads it (stripped, ``[``/``]`` added) and whether it sets out to be
    a call list (opens ``[name(``)."""
    body = text.strip("`\n ")
    if text.lstrip("\n ").startswith("`") and (fence := _FENCE_WORD.match(body)):
        body = body[fence.end():].strip("`\n ")
    sets_out = _CALL_LIST_START.match(body) is not None
    if not body.startswith("["):
        body = "[" + body
    if not body.endswith("]"):
        body += "]"
    return body, sets_out


def _parse(source: str) -> ast.expr | str:
    """The expression in ``source``, or why it does not parse."""
    try:
        return ast.parse(source, _FILENAME, mode="eval").body
    except SyntaxError as exc:
        return exc.msg if "line" in exc.msg else f"{exc.msg} (line {exc.lineno})"
    except (RecursionError, MemoryError):  # the parser's own nesting limits
        return "it is nested too deeply"
    except ValueError as exc:  # null bytes, lone surrogates
        return str(exc)


def _call_nodes(tree: ast.expr) -> list[ast.Call] | None:
    """The calls of a call list (or of one call); None when ``tree`` is anything else or empty."""
    if isinstance(tree, ast.Call):
        return [tree]
    if not isinstance(tree, (ast.List, ast.Tuple)):
        return None
    calls = [e for e in tree.elts if isinstance(e, ast.Call)]
    return calls if calls and len(calls) == len(tree.elts) else None


def _list_error(message: str, text: str) -> ParseResult:
    return ParseResult(errors=[ParseError(message=message, raw=text.strip())])


def _after_prose(text: str, parameters: Mapping[str, list[str]] | None) -> ParseResult:
    """Calls in a call list that runs from the start of a line to the end of the text (the first or the
    last such line: two parses at most), the prose before it content; else the whole text is content."""
    prose_start = len(text) - len(text.lstrip())
    matches = [m for m in _CALLS_AFTER_PROSE.finditer(text) if m.start() > prose_start]
    for match in dict.fromkeys(matches[:1] + matches[-1:]):
        source, _ = call_list_source(text[match.start():])
        tree = _parse(source) if len(source) <= MAX_CHARS else None
        nodes = _call_nodes(tree) if isinstance(tree, ast.expr) else None
        if nodes:
            calls, errors = read_calls(nodes, source, parameters)
            return parse_result([text[:match.start()]], calls, errors)
    return parse_result([text], [], [])


def read_calls(nodes: list[ast.Call], source: str, parameters: Mapping[str, list[str]] | None = None
               ) -> tuple[list[ToolCall], list[ParseError]]:
    """Each call node as a :class:`ToolCall`, or a :class:`ParseError` saying why not. ``parameters``: each
    tool's parameter names in order, which positional arguments bind to (None: they are refused)."""
    calls: list[ToolCall] = []
    errors: list[ParseError] = []
    segments = _Segments(source)
    for node in nodes:
        try:
            name = _callee(node.func)
            calls.append(ToolCall(name=name, arguments=_keywords(node, 1, _positional(node, name, parameters))))
        except _Refused as exc:
            errors.append(ParseError(message=f"tool call {len(calls) + len(errors) + 1}: {exc}",
                                     raw=segments.text(node)))
    return calls, errors


def _callee(func: ast.expr) -> str:
    """A call's function as its dotted name (``math.factorial``)."""
    parts: list[str] = []
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if not isinstance(func, ast.Name):
        raise _Refused(f"the function must be a name or a dotted name (module.function), not {_kind(func)}")
    parts.append(func.id)
    for part in parts:
        _not_dunder(part)
    return ".".join(reversed(parts))


def _positional(call: ast.Call, name: str, parameters: Mapping[str, list[str]] | None) -> list[str]:
    """The parameter names a call's positional arguments bind to (none given: none)."""
    if not call.args:
        return []
    if any(isinstance(a, ast.Starred) for a in call.args):
        raise _Refused("*args is not accepted: write name=value")
    if parameters is None:
        raise _Refused("positional arguments are not accepted: write every argument as name=value")
    if name not in parameters:
        raise _Refused(f"positional arguments need the tool's parameters, and there is no tool {name!r}")
    if len(call.args) > len(parameters[name]):
        raise _Refused(f"{name} takes {len(parameters[name])} arguments, {len(call.args)} were given")
    return parameters[name][:len(call.args)]


def _keywords(call: ast.Call, depth: int, positional: Sequence[str] = ()) -> dict[str, Any]:
    """A call's arguments by name: its positional ones bound to ``positional`` (names), then its keywords."""
    if call.args and len(positional) != len(call.args):
        raise _Refused("positional arguments are not accepted: write every argument as name=value")
    arguments: dict[str, Any] = {name: _value(arg, depth + 1) for name, arg in zip(positional, call.args)}
    for keyword in call.keywords:
        if keyword.arg is None:
            raise _Refused("**kwargs is not accepted: write every argument as name=value")
        if keyword.arg in arguments:
            raise _Refused(f"argument {keyword.arg!r} is given twice")
        arguments[keyword.arg] = _value(keyword.value, depth + 1)
    return arguments


def _value(node: ast.expr, depth: int) -> Any:
    """An argument value, read from the tree without evaluating it (tuples as lists)."""
    if depth > MAX_VALUE_DEPTH:
        raise _Refused(f"a value is nested more than {MAX_VALUE_DEPTH} levels deep")
    if isinstance(node, ast.Constant):
        return _constant(node.value)
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_value(e, depth + 1) for e in node.elts]
    if isinstance(node, ast.Dict):
        return {_key(k, depth + 1): _value(v, depth + 1) for k, v in zip(node.keys, node.values)}
    if isinstance(node, ast.Name):
        return _not_dunder(node.id)
    if isinstance(node, (ast.UnaryOp, ast.BinOp)):
        return _number(node, depth)
    if isinstance(node, ast.Call):
        return _nested_call(node, depth)
    raise _Refused(f"unsupported argument value: {_kind(node)} (write a string, number, list, dict, "
                   "True, False or None)")


def _constant(constant: Any) -> Any:
    if constant is Ellipsis:
        return "..."
    if isinstance(constant, (str, bool)) or constant is None:
        return constant
    if isinstance(constant, (int, float)):
        return _finite(constant)
    raise _Refused(f"unsupported argument value: a {type(constant).__name__} literal")


def _key(node: ast.expr | None, depth: int) -> str:
    """A dict key: a string; a number, True, False or None as JSON writes it."""
    if node is None:
        raise _Refused("**mapping in a dict is not accepted")
    key = _value(node, depth)
    if isinstance(key, str):
        return key
    if isinstance(key, (int, float, bool)) or key is None:
        return json.dumps(key)
    raise _Refused("dict keys must be strings or numbers")


def _number(node: ast.expr, depth: int) -> int | float:
    """A number: a numeric constant, ``+``/``-`` of one, or arithmetic on numbers, computed here."""
    if depth > MAX_VALUE_DEPTH:
        raise _Refused(f"arithmetic is nested more than {MAX_VALUE_DEPTH} levels deep")
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return _finite(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        number = _number(node.operand, depth + 1)
        return -number if isinstance(node.op, ast.USub) else number
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
        left, right = _number(node.left, depth + 1), _number(node.right, depth + 1)
        if isinstance(node.op, ast.Pow) and (abs(left) > _MAX_POWER[0] or abs(right) > _MAX_POWER[1]):
            raise _Refused(f"a power is out of bounds (base at most {_MAX_POWER[0]:g}, exponent at most "
                           f"{_MAX_POWER[1]} in absolute value)")
        try:
            return _finite(_ARITHMETIC[type(node.op)](left, right))
        except (ArithmeticError, ValueError) as exc:
            raise _Refused(f"arithmetic failed: {exc}") from None
    raise _Refused(f"unsupported argument value: {_kind(node)} (arithmetic is on numbers with + - * / // % **)")


def _finite(number: Any) -> int | float:
    if isinstance(number, int) and number.bit_length() > _MAX_INT_BITS:
        raise _Refused("a number is too large (more than about 1,000 digits)")
    if isinstance(number, float) and not math.isfinite(number):
        raise _Refused("a number is not finite")
    if not isinstance(number, (int, float)):  # (-8) ** 0.5 is complex
        raise _Refused(f"a number is not real: {type(number).__name__}")
    return number


def _nested_call(node: ast.Call, depth: int) -> Any:
    """A call as a value: ``{name: {keyword: value}}``, or its source when it has no keywords (BFCL's forms)."""
    try:
        name = _callee(node.func)
    except _Refused as exc:
        raise _Refused(f"a call as a value: {exc}") from None
    if node.keywords:
        return {name: _keywords(node, depth)}
    stack = [(child, depth + 1) for child in ast.iter_child_nodes(node)]
    while stack:  # checked without recursion before ast.unparse recurses into it
        child, level = stack.pop()
        if level > MAX_VALUE_DEPTH:
            raise _Refused(f"a value is nested more than {MAX_VALUE_DEPTH} levels deep")
        if isinstance(child, ast.Name):
            _not_dunder(child.id)
        elif isinstance(child, ast.Attribute):
            _not_dunder(child.attr)
        stack.extend((grandchild, level + 1) for grandchild in ast.iter_child_nodes(child))
    return ast.unparse(node)


def _not_dunder(name: str) -> str:
    if name.startswith("__") and name.endswith("__"):
        raise _Refused(f"dunder names ({name}) are not accepted")
    return name


def _kind(node: ast.AST) -> str:
    try:
        text = ast.unparse(node)
    except (RecursionError, ValueError):
        text = "…"
    return f"{type(node).__name__} `{text if len(text) <= 60 else text[:57] + '...'}`"


class _Segments:
    """The source text of nodes: AST columns are UTF-8 byte offsets within a line, so the source is
    encoded and its lines found once (when the first is asked for), each text then cut in O(its length)."""

    def __init__(self, source: str) -> None:
        self._source = source
        self._data = b""
        self._lines: list[int] = []

    def text(self, node: ast.expr) -> str:
        if not self._lines:
            self._data = self._source.encode("utf-8", "replace")
            self._lines = [0, *(m.end() for m in re.finditer(rb"\r\n|\r|\n", self._data))]
        lineno, end_lineno = node.lineno, node.end_lineno or node.lineno
        if end_lineno > len(self._lines) or node.end_col_offset is None:
            return ""
        start = self._lines[lineno - 1] + node.col_offset
        return self._data[start:self._lines[end_lineno - 1] + node.end_col_offset].decode("utf-8", "replace")
