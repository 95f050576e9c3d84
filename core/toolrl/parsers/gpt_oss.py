"""gpt-oss's harmony format: a response is a series of messages, and a message addressed to a
function is a call. The chat template renders the recipient before the channel; the model also
writes it after::

    <|channel|>analysis<|message|>Need the weather.<|end|>
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>
    <|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}<|call|>

A message's header runs to ``<|message|>`` and its body to ``<|call|>``, ``<|end|>`` or
``<|return|>``. A recipient ``functions.NAME`` (or a bare ``NAME``, as vLLM accepts) makes the message
a call on any channel; ``assistant`` and the built-in tools (``browser``, ``python``, ``container``)
do not, and an empty one (``to=functions.``, ``to=``) is a call without a name: a parse error. The
arguments are the body's JSON object. Content is the response less its call messages.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from toolrl.parsers import ToolParser, parse_result
from toolrl.parsers.arguments import json_object
from toolrl.schemas import ParseError, ParseResult, ToolCall

START, MESSAGE, CALL = "<|start|>", "<|message|>", "<|call|>"
_TOKENS = re.compile(r"<\|(?:start|message|call|end|return)\|>")
_RECIPIENT = re.compile(r"\bto=([^\s<]*)")
CONSTRAIN, CHANNEL = "<|constrain|>", "<|channel|>"
NOT_FUNCTIONS = ("assistant", "browser", "python", "container")


def function_name(recipient: str) -> str | None:
    """The function a recipient names ("" when it names none), or None for the assistant and the
    built-in tools."""
    if recipient.startswith("functions."):
        return recipient[len("functions."):]
    return None if recipient.split(".", 1)[0] in NOT_FUNCTIONS else recipient


@dataclass(slots=True)
class HarmonyMessage:
    """One message: its header is ``text[start:header_end]``, its body runs to ``body_end``, and
    ``end`` is past its closing token (``ending``; None when the text or the next message cuts it)."""

    start: int
    header_end: int
    body_end: int
    end: int
    ending: str | None


def messages(text: str) -> list[HarmonyMessage]:
    """The messages of a response, in one pass over its harmony tokens."""
    found: list[HarmonyMessage] = []
    start, header_end = 0, -1
    for m in _TOKENS.finditer(text):
        token = m.group()
        if token == MESSAGE:
            header_end = m.start() if header_end == -1 else header_end
        elif token != START:
            if header_end != -1:
                found.append(HarmonyMessage(start, header_end, m.start(), m.end(), token))
            start, header_end = m.end(), -1
        else:
            if header_end != -1:
                found.append(HarmonyMessage(start, header_end, m.start(), m.start(), None))
            start, header_end = m.start(), -1
    if header_end != -1:
        found.append(HarmonyMessage(start, header_end, len(text), len(text), None))
    return found


class GptOssParser(ToolParser):
    name = "gpt_oss"
    end_of_call_tokens = ("<|call|>",)

    @property
    def stop_strings(self) -> list[str]:
        return list(self.end_of_call_tokens)

    def parse(self, text: str) -> ParseResult:
        calls: list[ToolCall] = []
        errors: list[ParseError] = []
        content: list[str] = []
        kept = 0
        for message in messages(text):
            header = text[message.start:message.header_end]
            recipient = _RECIPIENT.search(header)
            name = function_name(recipient.group(1)) if recipient else None
            if name is None:
                continue
            content.append(text[kept:message.start])
            kept = message.end
            try:
                calls.append(self.decode(name, header, text[message.header_end + len(MESSAGE):message.body_end],
                                         message.ending))
            except ValueError as exc:
                errors.append(ParseError(message=str(exc), raw=text[message.start:message.end]))
        content.append(text[kept:])
        return parse_result(content, calls, errors, self.end_of_call_tokens)

    @staticmethod
    def content_type(header: str) -> str:
        """``<|constrain|>TYPE``, else a word after the channel's name (``commentary json``), else JSON."""
        if (at := header.rfind(CONSTRAIN)) != -1:
            words = header[at + len(CONSTRAIN):].split()
        else:
            at = header.rfind(CHANNEL)
            words = [w for w in header[at + len(CHANNEL):].split()[1:] if not w.startswith("to=")] if at != -1 else []
        return words[0] if words else "json"

    @staticmethod
    def decode(name: str, header: str, body: str, ending: str | None) -> ToolCall:
        if not name:
            raise ValueError(f"tool call without a function name: the recipient must read to=functions.NAME, "
                             f"got {_RECIPIENT.search(header).group()!r}")  # type: ignore[union-attr]
        if ending is None:
            raise ValueError(f"unterminated tool call to '{name}': missing {CALL}")
        content_type = GptOssParser.content_type(header)
        if "json" not in content_type:
            raise ValueError(f"tool call to '{name}' must send JSON arguments, got {content_type!r}")
        return ToolCall(name=name, arguments=json_object(body, f"arguments of tool call to '{name}'"))
