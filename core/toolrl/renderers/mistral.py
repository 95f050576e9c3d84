"""Mistral's renderer: the tokenizer's own request encoding (mistral-common), with calls paired to results.

Mistral has no jinja template: transformers' ``MistralCommonBackend`` encodes a chat request with
mistral-common, which reads assistant turns as structured calls (text such as ``[TOOL_CALLS]`` in a
message's content is encoded as plain text, not as the control token the model wrote) and requires
every tool result to name its call: ``[TOOL_RESULTS]{"content": …, "call_id": …}`` before v11,
``[TOOL_RESULTS]id[TOOL_CONTENT]…`` in v11, the id checked in v13 though no longer written. So the
model's turns are rebuilt as structured messages from the parsed calls, each call keeps the id the
model wrote (``"id"`` in pre-v11 JSON, ``[CALL_ID]`` in v11) or gets a generated one (9 letters and
digits, as mistral-common requires), and each result carries its call's id.
"""

from __future__ import annotations

import hashlib
import json
import re
import string
from collections.abc import Sequence
from typing import Any

from toolrl.renderers.chat import ChatRenderer
from toolrl.schemas import ParseResult, ToolCall

_ALPHABET = string.ascii_letters + string.digits
# Reasoning at the start of a turn (Magistral's [THINK]…[/THINK]); the request holds it apart from the text.
_THINK = re.compile(r"\s*\[THINK\](.*?)\[/THINK\]", re.DOTALL)


def call_id(seed: str) -> str:
    """A 9-character id of letters and digits (mistral-common's format), fixed by ``seed``."""
    n = int.from_bytes(hashlib.sha256(seed.encode()).digest()[:8], "big")
    out = []
    for _ in range(9):
        n, k = divmod(n, len(_ALPHABET))
        out.append(_ALPHABET[k])
    return "".join(out)


class MistralRenderer(ChatRenderer):
    def _render_closed_turn(self, messages: list[dict[str, Any]]) -> list[int]:
        # Serving mode refuses a conversation that ends with an assistant turn unless it is a prefix
        # to continue; the prefix stops before the turn's "</s>", which the delta then starts after.
        return self._render(messages, False, continue_final_message=True)

    def _shows(self, text: str, rendered: str) -> bool:
        # Before v11 a result is written as JSON ({"content": …}): text that decodes as JSON as that
        # value (3.50 -> 3.5), other text as a JSON string (quotes and newlines escaped).
        try:
            value = json.loads(text)
        except ValueError:
            value = text
        return text in rendered or json.dumps(value, ensure_ascii=False) in rendered

    def with_call_ids(self, calls: list[ToolCall], seed: str) -> list[ToolCall]:
        return [c if c.id else c.model_copy(update={"id": call_id(f"{seed}:{i}")}) for i, c in enumerate(calls)]

    def assistant_message(self, ids: Sequence[int], parsed: ParseResult | None = None) -> dict[str, Any]:
        calls = parsed.calls if parsed is not None else []
        # A turn with calls: its text less the calls (the parser read it with its "</s>", which the
        # encoding adds itself); else the text as written.
        content = parsed.content.removesuffix(self.end_of_turn or "").strip() if calls else self.turn_text(ids)
        message: dict[str, Any] = {"role": "assistant"}
        think = _THINK.match(content)
        if think:
            message["reasoning_content"], content = think.group(1), content[think.end():]
        message["content"] = content
        if calls:
            message["tool_calls"] = [
                {"id": c.id, "type": "function",
                 "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}}
                for c in calls]
        return message

    def tool_message(self, text: str, name: str, images: int = 0, call_id: str | None = None) -> dict[str, Any]:
        if call_id is None:  # a parse error answers no call, and mistral-common needs one: a user turn
            return {"role": "user", "content": text}
        return {**super().tool_message(text, name, images), "tool_call_id": call_id}
