"""Tool-call parsers: one model response (text) -> content, calls and parse errors.

The rule: **a parser's failure is one call's error and never another call's loss.** Parsers never raise
on model output: every malformed call becomes a :class:`toolrl.schemas.ParseError` the model reads, and the
calls around it still run. A format's markers written inside an argument are data; the tokens that end a
family's turn are not content. :func:`parse_within` holds every parser to it: one that raises, or runs past
``rollout.parser_timeout_s`` (then it is handed no more text: a thread cannot be stopped), costs its turn a
parse error, and a turn's malformed calls are capped (:data:`MAX_REPORTED_ERRORS`).
"""

from __future__ import annotations

import asyncio
import copy
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from toolrl.schemas import ParseError, ParseResult, ToolCall, ToolResponse

if TYPE_CHECKING:
    from toolrl.plugins.parts import RunFacts


class ToolParser:
    """The base of every tool-call parser (``register_tool_parsers``; ``rollout.parser``): set ``name`` and
    implement :meth:`parse` (the module docstring's rule); options come as constructor keywords
    (``rollout.parser_options``). The other attributes and methods are for formats whose calls end before
    the turn does, whose results are appended inline, or whose values are typed from the tools' schemas.
    Check one with :class:`toolrl.testing.ParserConformance`."""

    name: ClassVar[str] = ""
    # "chat": tool results go back as chat-template tool messages (hermes);
    # "inline": the result text is appended to the response and generation continues (inline tags).
    result_mode: ClassVar[Literal["chat", "inline"]] = "chat"
    # Special tokens the model emits after its calls (the turn end included): generation stops at
    # them so the calls can run. ``stop_strings`` holds those the chat template's end of turn misses.
    end_of_call_tokens: ClassVar[tuple[str, ...]] = ()

    def __init__(self, **options: Any) -> None:
        if options:
            raise TypeError(f"parser {self.name!r} takes no options, got {sorted(options)}")

    @property
    def stop_strings(self) -> list[str]:
        """Strings at which generation should stop so calls can run mid-response."""
        return []

    def bind_tools(self, schemas: Sequence[Mapping[str, Any]]) -> None:
        """The route's tool schemas (OpenAI function format). Formats whose argument values are
        untyped text (``<parameter=n>5</parameter>``) type them from the schemas; the rest ignore them."""

    def for_tools(self, schemas: Sequence[Mapping[str, Any]]) -> ToolParser:
        """A parser for one trajectory whose tools its session handed out: a copy bound to them, since
        the route's parser is shared by every trajectory of the route. A parser that reads no schemas is
        itself."""
        if type(self).bind_tools is ToolParser.bind_tools:
            return self
        bound = copy.copy(self)
        bound.bind_tools(schemas)
        return bound

    def check_run(self, facts: RunFacts) -> list[str]:
        """The run check before any weights load (:class:`toolrl.plugins.parts.RunFacts`; hookspecs): raise
        ValueError on a setting this part cannot run with, return warning lines; none here."""
        return []

    def parse(self, text: str) -> ParseResult:
        raise NotImplementedError

    def format_inline_result(self, response: ToolResponse) -> str:
        """The text appended after an inline call (``result_mode == "inline"``)."""
        raise NotImplementedError(f"parser {self.name!r} renders results through the chat template")


def parse_result(pieces: Sequence[str], calls: list[ToolCall], errors: list[ParseError],
                 tokens: Sequence[str] = ()) -> ParseResult:
    """A parse's result: the content from its ``pieces`` (the text around the calls), stripped, less a
    family's end-of-turn and end-of-call ``tokens`` (markup, not the model's words); the calls and errors."""
    content = "".join(pieces)
    for token in tokens:
        content = content.replace(token, "")
    return ParseResult(content=content.strip(), calls=calls, errors=errors)


def parse_on_thread(parser: ToolParser, text: str) -> Future[Any]:
    """``parser.parse(text)`` on a daemon thread; the caller waits for it with a time limit. A daemon,
    since a parser that never returns cannot be stopped and must not hold the process open at exit;
    BaseException too, since a plugin's SystemExit would otherwise end the thread silently."""
    future: Future[Any] = Future()
    future.set_running_or_notify_cancel()  # a waiter that gives up cannot cancel it under the thread

    def run() -> None:
        try:
            future.set_result(parser.parse(text))
        except BaseException as exc:
            future.set_exception(exc)

    threading.Thread(target=run, name=f"toolrl-parser-{parser.name}", daemon=True).start()
    return future


# Malformed calls of one turn shown to the model (and kept in the trace); the rest become one count. A
# 20 MB output of unterminated tags is otherwise millions of tool messages.
MAX_REPORTED_ERRORS = 5


def capped(result: ParseResult) -> ParseResult:
    """``result`` with its first :data:`MAX_REPORTED_ERRORS` errors, and one counting those left out."""
    if len(result.errors) <= MAX_REPORTED_ERRORS:
        return result
    rest = len(result.errors) - MAX_REPORTED_ERRORS
    more = ParseError(message=f"{rest} more malformed tool call{'s' if rest != 1 else ''} not shown")
    return result.model_copy(update={"errors": [*result.errors[:MAX_REPORTED_ERRORS], more]})


# Parsers that ran past their time limit in this process, by id (the object is held, so the id stays
# its own): their thread still runs, and they are handed no more text.
_STUCK: dict[int, ToolParser] = {}


async def parse_within(parser: ToolParser, text: str, seconds: float) -> ParseResult:
    """``parser.parse(text)`` under a time and exception boundary, as a tool call runs: a parser that
    raises, returns no :class:`ParseResult` or runs past ``seconds`` makes the whole text one parse
    error, so a third-party parser's bug costs a turn, never the run. Its errors are :func:`capped`."""
    if id(parser) in _STUCK:
        return _failed(parser, f"it ran past its {seconds:g} s limit earlier in this run and still runs", text)
    future = parse_on_thread(parser, text)
    try:
        # asyncio.timeout, not wait_for: Python 3.11's wait_for drops a cancellation that arrives as the
        # parse finishes, and a cancelled trajectory would then run on.
        async with asyncio.timeout(seconds):
            result = await asyncio.wrap_future(future)
    except TimeoutError:
        _STUCK[id(parser)] = parser
        return _failed(parser, f"it did not finish within {seconds:g} s (rollout.parser_timeout_s)", text)
    except asyncio.CancelledError:
        raise
    except BaseException as exc:  # whatever a plugin raises (SystemExit too) is this turn's error
        return _failed(parser, f"{type(exc).__name__}: {exc}", text)
    if not isinstance(result, ParseResult):
        return _failed(parser, f"it returned {type(result).__name__}, not a ParseResult", text)
    return capped(result)


def _failed(parser: ToolParser, why: str, text: str) -> ParseResult:
    name = parser.name or type(parser).__name__
    return ParseResult(content=text, errors=[ParseError(message=f"the tool-call parser {name!r} failed: {why}",
                                                        raw=text)])
