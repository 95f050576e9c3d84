"""gpt-oss's renderer: the model's harmony text rebuilt as the structured message its template reads.

gpt-oss's template refuses an assistant message whose content holds harmony channels; it reads the
analysis channel from ``thinking``, the final channel from ``content`` and calls from ``tool_calls``
(one per message, arguments as an object). Rebuilt that way, the history can be re-rendered, so the
template's rewrites (it drops earlier analysis, writes the call's recipient before its channel) are
detected and ``fork`` continues from the re-rendering.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from toolrl.renderers.chat import ChatRenderer
from toolrl.schemas import ParseResult

# One harmony message: its channel (with any recipient/constraint after it), then its text up to the
# next message's start or its end marker. Linear: each text is a lazy run to the first such marker.
_MESSAGE = re.compile(r"<\|channel\|>(\w+)[^<]*(?:<\|constrain\|>[^<]*)?<\|message\|>(.*?)"
                      r"(?=<\|end\|>|<\|call\|>|<\|return\|>|<\|start\|>|$)", re.DOTALL)


def harmony_channels(text: str) -> dict[str, list[str]]:
    """The texts of each channel's messages in a harmony turn, in order."""
    out: dict[str, list[str]] = {}
    for m in _MESSAGE.finditer(text):
        out.setdefault(m.group(1), []).append(m.group(2))
    return out


class HarmonyRenderer(ChatRenderer):
    def assistant_message(self, ids: Sequence[int], parsed: ParseResult | None = None) -> dict[str, Any]:
        text = self.turn_text(ids)
        channels = harmony_channels(text)
        if not channels:  # no harmony: plain text the template renders as the final channel
            return {"role": "assistant", "content": text}
        message: dict[str, Any] = {"role": "assistant", "content": "".join(channels.get("final", []))}
        if "analysis" in channels:
            message["thinking"] = "".join(channels["analysis"])
        if parsed is not None and parsed.calls:
            message["tool_calls"] = [{"type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                                     for c in parsed.calls]
        return message
