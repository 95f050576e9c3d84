"""The conformance kit for tool-call parsers: the shared corpus written in the parser's own syntax,
hostile inputs, a bounded fuzz and linear time, as pytest tests (:class:`ParserConformance`) or as
``check_*`` functions that raise ``AssertionError`` saying what to fix.

A parser is described by how its model writes calls: ``render(calls) -> text``, the text of one
assistant turn making ``calls`` (``(name, arguments)`` pairs) exactly as the family's chat template
renders them. The kit writes the corpus of :mod:`toolrl.testing.parser_corpus` (one call, one after
prose, parallel calls, nested JSON, unicode, multi-line code, typed values) with it and checks that
the parser reads back exactly those calls, the prose as content, and no errors. A parser whose calls
cannot carry arbitrary arguments (inline tags) gives no ``render``: it gets the other checks.
"""

from __future__ import annotations

import gc
import json
import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from toolrl.parsers import ToolParser
from toolrl.plugins.parts import BuildContext, build_part
from toolrl.schemas import ParseResult
from toolrl.testing.contract import check_build_contract
from toolrl.testing.parser_corpus import CODE, SEARCH, TOOLS, TYPED, UNICODE, WEATHER, Call

Render = Callable[[Sequence[Call]], str]

# The shared corpus: what each case's text calls.
CORPUS: Mapping[str, tuple[Call, ...]] = {
    "single": (WEATHER,), "parallel": (WEATHER, SEARCH, UNICODE), "nested_json": (SEARCH,),
    "unicode": (UNICODE,), "multiline_code": (CODE,), "typed_values": (TYPED,)}
PROSE = "Let me check the weather."
# Pieces of JSON and markup every fuzz input may hold besides the parser's own text.
JSON_BITS = ['{', '}', '[', ']', '"', '\\"', ':', ',', '"name"', '"arguments"', 'null', 'NaN', '1e999', '\n',
             '<', '>', '</', '<think>', '</think>', '\\u0000', '\ud800', '\x00']


def parsed(parser: ToolParser, text: str) -> ParseResult:
    """``parser.parse(text)``, checked to be what every parser returns: a ParseResult (never an
    exception) of strict JSON, calls with a name and an arguments object, errors with a message."""
    try:
        result = parser.parse(text)
    except Exception as exc:  # the contract: model output never raises
        raise AssertionError(f"parse raised {type(exc).__name__}: {exc} on {text[:200]!r}") from None
    assert isinstance(result, ParseResult), f"parse returned {type(result).__name__}, not a ParseResult"
    try:
        json.dumps(result.model_dump(), allow_nan=False)
    except (ValueError, TypeError) as exc:
        raise AssertionError(f"the result is not strict JSON ({exc}) for {text[:200]!r}") from None
    for call in result.calls:
        assert call.name and isinstance(call.arguments, dict), f"a call without a name or an object: {call}"
    for error in result.errors:
        assert isinstance(error.message, str) and error.message, f"a parse error without a message: {error}"
    return result


def check_parser_corpus(parser: ToolParser, render: Render) -> None:
    """The shared corpus written with ``render`` reads back exactly: the calls, no errors, and prose
    around a call as content."""
    for case, calls in CORPUS.items():
        result = parsed(parser, render(calls))
        got = [(c.name, c.arguments) for c in result.calls]
        assert got == list(calls), f"corpus case {case!r}: read {got}, expected {list(calls)}"
        assert not result.errors, f"corpus case {case!r}: errors {[e.message for e in result.errors]}"
    after = parsed(parser, f"{PROSE}\n\n{render(CORPUS['single'])}")
    assert [(c.name, c.arguments) for c in after.calls] == [WEATHER], "a call after prose is lost"
    assert PROSE in after.content, f"the prose before a call is not content: {after.content!r}"
    plain = parsed(parser, PROSE)
    assert not plain.calls and not plain.errors and PROSE in plain.content, "plain prose is not content"


def hostile_parser_inputs(render: Render | None = None) -> list[str]:
    """Inputs no model should write and every parser must survive: empty, control characters, lone
    surrogates, deep nesting, huge numbers, runs of markup; with ``render``, a call cut at 40 places,
    doubled without a separator, nested 200 levels deep, with non-finite numbers."""
    texts = ["", " ", "\x00" * 1000, "\ud800", "\udfff{}", "{" * 100_000, "[" * 100_000, '"' * 10_000,
             "<" * 10_000, "\\" * 10_000, "1" * 100_000, "\u202e\u200b" * 1000, "<think>" * 5000]
    if render is not None:
        call = render([WEATHER])
        texts += [call[:i] for i in sorted({len(call) * k // 40 for k in range(40)})]
        texts += [call + call, call * 1000, call.replace("3", "NaN"), call.replace("3", "1e999"),
                  call.replace("3", "9" * 5000), call.replace("Paris", "Pa\ud800ris"),
                  render([("log", {"entry": _nested(100)})]), render([("", {})]), render([("get_time", {})])]
    return texts


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = {"a": [value]}
    return value


def check_parser_hostile(parser: ToolParser, render: Render | None = None) -> None:
    for text in hostile_parser_inputs(render):
        parsed(parser, text)


def check_parser_fuzz(parser: ToolParser, render: Render | None = None, inputs: int = 2000, seed: int = 0) -> None:
    """``inputs`` texts made of pieces of the corpus in the parser's syntax, JSON and markup pieces and
    random characters (seeded, so a failure repeats): none raises or gives a result that is not strict
    JSON."""
    rng = random.Random(seed)
    texts = [render(calls) for calls in CORPUS.values()] if render is not None else []
    pieces = JSON_BITS + [t[a:b] for t in texts for a, b in _cuts(rng, len(t))] + texts
    for _ in range(inputs):
        text = "".join(rng.choice(pieces) if rng.random() < 0.85 else chr(rng.randrange(1, 0x3000))
                       for _ in range(rng.randrange(0, 14)))
        parsed(parser, text)


def _cuts(rng: random.Random, length: int) -> list[tuple[int, int]]:
    return [tuple(sorted((rng.randrange(length + 1), rng.randrange(length + 1)))) for _ in range(8)]  # type: ignore[misc]


def check_parser_linear_time(parser: ToolParser, render: Render | None = None, small: int = 500,
                      factor: int = 16, slack: float = 4.0) -> None:
    """Parsing ``factor`` times more text takes at most ``factor * slack`` times longer (a parser
    quadratic in the response would take ``factor**2``): for complete calls, for calls cut in half
    (unterminated: where backtracking parsers go quadratic) and for markup. The best of three runs of
    the thread's CPU time each, so a loaded machine does not fail it."""
    unit = [render([WEATHER]) + "\n", render([WEATHER])[: len(render([WEATHER])) // 2] + "\n"] if render else []
    for piece in [*unit, "<tool_call>{[\"", "x" * 40 + "\n"]:
        times = [_best_of_three(parser, piece * (small * n)) for n in (1, factor)]
        ratio = times[1] / max(times[0], 1e-4)
        assert ratio <= factor * slack, (f"parsing {factor}x more of {piece[:40]!r} took {ratio:.0f}x longer "
                                         f"({times[0]:.4f} s vs {times[1]:.4f} s): not linear")


def _best_of_three(parser: ToolParser, text: str) -> float:
    best = math.inf
    for _ in range(3):
        gc.disable()  # a collection inside one run is noise, not the parser's time
        try:
            start = time.thread_time()  # CPU time: a busy machine's preemptions are not the parser's
            parsed(parser, text)
            best = min(best, time.thread_time() - start)
        finally:
            gc.enable()
    return best


class ParserConformance:
    """Subclass in your plugin's tests; pytest collects the ``test_*`` methods::

        class TestTickParser(ParserConformance):
            parser_name = "tick"                  # registered name or alias
            parser_options = {}                   # rollout.parser_options
            @staticmethod
            def render(calls):                    # one turn making these calls, as the template writes it
                return "".join(f"<<call name={n!r}>>{json.dumps(a)}<</call>>" for n, a in calls)
    """

    parser_name: ClassVar[str] = ""
    parser_options: ClassVar[Mapping[str, Any]] = {}
    tools: ClassVar[Sequence[Mapping[str, Any]]] = TOOLS  # bound before parsing (the XML formats type values)
    render: ClassVar[Render | None] = None
    fuzz_inputs: ClassVar[int] = 2000

    def parser(self) -> ToolParser:
        parser = build_part("tool_parsers", self.parser_name, dict(self.parser_options),
                            BuildContext("rollout.parser", "rollout.parser_options"))
        parser.bind_tools(list(self.tools))
        return parser

    def test_builds_through_the_registry(self) -> None:
        assert self.parser_name, "set parser_name"
        check_build_contract("tool_parsers", self.parser_name)
        assert isinstance(self.parser(), ToolParser)

    def test_reads_the_corpus_in_its_own_syntax(self) -> None:
        import pytest

        if self.render is None:
            pytest.skip("no render: the parser's calls cannot carry the corpus's arguments")
        check_parser_corpus(self.parser(), type(self).render)  # type: ignore[arg-type]

    def test_survives_hostile_inputs(self) -> None:
        check_parser_hostile(self.parser(), type(self).render)

    def test_survives_a_bounded_fuzz(self) -> None:
        check_parser_fuzz(self.parser(), type(self).render, self.fuzz_inputs)

    def test_takes_linear_time(self) -> None:
        check_parser_linear_time(self.parser(), type(self).render)
