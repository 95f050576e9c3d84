"""Call blocks between an opening and a closing marker, and the reasoning regions around them, found in
one pass for the model-family parsers.

A block runs from its opening marker to the first closing marker before the next opening marker;
without one it is unterminated and ends where the next block opens (or at the end). A format's data
regions inside a block (``Markers.data`` to where the parser's ``data_end`` says: a parameter value, a
call's JSON) are data, so a marker written inside an argument neither ends the block nor opens one; a
data region that does not end as its grammar says is not one, and its markers count. Reasoning
regions follow the hermes parser's rule: ``OPEN`` to its ``CLOSE`` or the end, and a ``CLOSE`` before
any ``OPEN`` closes a block the prompt opened, so everything before it is reasoning. Blocks (and stray
closing markers) that start inside reasoning are not calls: they stay in the content. Each search is
bounded by the next opening marker (or data region), so the time is linear in the text.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, ClassVar

from toolrl.parsers import ToolParser, parse_result
from toolrl.parsers.arguments import ToolSchemas
from toolrl.schemas import ParseError, ParseResult, ToolCall


@dataclass(frozen=True, slots=True)
class Markers:
    open: str
    close: str
    think_open: str = ""
    think_close: str = ""
    data: str = ""  # opens a data region inside a block
    data_close: str = ""  # closes one (the default BlockParser.data_end's grammar: see value_end)


@dataclass(slots=True)
class Block:
    """A call block (``kind == "call"``), a stray closing marker (``"stray"``) or a reasoning marker."""

    start: int
    end: int
    kind: str
    body_start: int = 0
    body_end: int = 0
    terminated: bool = True


@cache
def _pattern(markers: Markers) -> re.Pattern[str]:
    return re.compile("|".join(re.escape(m) for m in (markers.open, markers.close, markers.think_open,
                                                      markers.think_close) if m))


DataEnd = Callable[[str, int], int]  # (text, where a data region opens) -> where it ends, or -1


def find_blocks(text: str, markers: Markers, data_end: DataEnd | None = None) -> list[Block]:
    """Call blocks and stray closing markers outside reasoning, in order."""
    found = [(m.start(), m.group()) for m in _pattern(markers).finditer(text)]
    opens = [p for p, tag in found if tag == markers.open]
    spans: list[Block] = []
    cursor = 0
    for pos, tag in found:
        if pos < cursor:
            continue
        if tag == markers.open:
            spans.append(_block(text, pos, markers, opens, data_end))
        else:
            spans.append(Block(pos, pos + len(tag), "stray" if tag == markers.close else tag))
        cursor = spans[-1].end
    return outside_reasoning(spans, len(text), markers, ("call", "stray")) if markers.think_open else spans


def _block(text: str, pos: int, markers: Markers, opens: list[int], data_end: DataEnd | None) -> Block:
    """The block opened at ``pos``: to its closing marker outside data regions, else unterminated at the
    next opening marker outside them."""
    body = i = pos + len(markers.open)
    limit = _next(opens, pos, len(text))
    close = text.find(markers.close, body, limit)
    if close != -1 and not (data_end and _in_data(text, body, close, markers.data, data_end)):
        return Block(pos, close + len(markers.close), "call", body, close)  # the common case: no scan of the data
    while True:
        data = text.find(markers.data, i, limit) if markers.data and data_end else -1
        close = text.find(markers.close, i, data if data != -1 else limit)
        if close != -1:
            return Block(pos, close + len(markers.close), "call", body, close)
        if data == -1:
            return Block(pos, limit, "call", body, limit, terminated=False)
        end = data_end(text, data)  # type: ignore[misc]
        i = end if end != -1 else data + len(markers.data)
        limit = max(limit, _next(opens, i - 1, len(text)))  # an opening marker in the data is data


def _in_data(text: str, body: int, pos: int, data: str, data_end: DataEnd) -> bool:
    """Whether ``pos`` lies in a data region of the block whose body starts at ``body``. A region ends
    before the next one opens, so only the last one opened before ``pos`` can hold it."""
    last = text.rfind(data, body, pos)
    return last != -1 and data_end(text, last) > pos


def _next(positions: list[int], pos: int, default: int) -> int:
    """The first of the sorted ``positions`` after ``pos``."""
    k = bisect_right(positions, pos)
    return positions[k] if k < len(positions) else default


def value_end(text: str, pos: int, opening: str, closing: str) -> int:
    """Past the first ``closing`` after the ``opening`` at ``pos`` and before the next ``opening``, or -1."""
    after = pos + len(opening)
    following = text.find(opening, after)
    end = text.find(closing, after, following if following != -1 else len(text))
    return end + len(closing) if end != -1 else -1


def outside_reasoning(spans: list[Block], length: int, markers: Markers, kinds: Sequence[str]) -> list[Block]:
    """The ``spans`` of ``kinds`` that start outside reasoning (``spans`` holds the reasoning markers too)."""
    regions = iter(reasoning_regions(spans, length, markers))
    region = next(regions, None)
    kept = []
    for span in spans:
        while region is not None and region[1] <= span.start:
            region = next(regions, None)
        if span.kind in kinds and (region is None or span.start < region[0]):
            kept.append(span)
    return kept


def reasoning_regions(spans: list[Block], length: int, markers: Markers) -> list[tuple[int, int]]:
    """``(start, end)`` of each reasoning region among ``spans``' reasoning markers."""
    tags = [s for s in spans if s.kind in (markers.think_open, markers.think_close)]
    regions: list[tuple[int, int]] = []
    k = 0
    if tags and tags[0].kind == markers.think_close:
        regions.append((0, tags[0].end))
        k = 1
    while k < len(tags):
        if tags[k].kind == markers.think_open:
            start = tags[k].start
            while k < len(tags) and tags[k].kind != markers.think_close:
                k += 1
            regions.append((start, tags[k].end if k < len(tags) else length))
        k += 1
    return regions


class BlockParser(ToolParser):
    """A format whose calls sit in ``markers`` blocks, each decoded on its own by :meth:`decode`.
    Formats that write argument values as text type them from the bound tools' ``schemas``."""

    markers: ClassVar[Markers]

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.schemas = ToolSchemas()

    def bind_tools(self, schemas: Sequence[Mapping[str, Any]]) -> None:
        self.schemas = ToolSchemas(schemas)

    def parse(self, text: str) -> ParseResult:
        """Content (the text outside the blocks, less the end-of-call tokens), the calls and call errors
        :meth:`decode` reads from each terminated block's body, and a parse error for each block it
        rejects (its :class:`ValueError`), each unterminated block and each stray closing marker."""
        markers = self.markers
        calls: list[ToolCall] = []
        errors: list[ParseError] = []
        content: list[str] = []
        pos = 0
        for block in find_blocks(text, markers, self.data_end if markers.data else None):
            content.append(text[pos:block.start])
            pos = block.end
            raw = text[block.start:block.end]
            if block.kind == "stray":
                stray = f"stray {markers.close} without an opening {markers.open}"
                errors.append(ParseError(message=stray, raw=raw))
            elif not block.terminated:
                errors.append(ParseError(message=f"unterminated tool call: missing {markers.close}", raw=raw))
            else:
                try:
                    for item in self.decode(text[block.body_start:block.body_end]):
                        found = errors if isinstance(item, ParseError) else calls
                        found.append(item)  # type: ignore[arg-type]
                except ValueError as exc:
                    errors.append(ParseError(message=str(exc), raw=raw))
        content.append(text[pos:])
        return parse_result(content, calls, errors, self.end_of_call_tokens)

    def data_end(self, text: str, pos: int) -> int:
        """Where the data region opening at ``pos`` (``markers.data``) ends as the format's grammar says,
        or -1 when it does not; by default past its ``markers.data_close`` (:func:`value_end`)."""
        return value_end(text, pos, self.markers.data, self.markers.data_close)

    def decode(self, body: str) -> Sequence[ToolCall | ParseError]:
        """The calls in one block's body, a malformed one as its own ParseError; a ValueError is the
        whole block's parse error."""
        raise NotImplementedError
