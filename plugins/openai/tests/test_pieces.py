"""Token pieces (streamed chunks, text offsets) join to exactly the decoded text."""

from __future__ import annotations

from typing import Any

from toolrl_openai.conversations import Conversations
from toolrl_openai.service import Service


def test_pieces_join_to_the_text(tokenizer: Any) -> None:
    service = Service(None, tokenizer, None, "m", Conversations(tokenizer))  # type: ignore[arg-type]
    text = "Grüße, 日本語 café 𓀀🦜!\n<tool_call>\n{\"a\": 1}\n</tool_call> done  \t end"
    ids = tokenizer.encode(text, add_special_tokens=False)
    pieces = service._pieces(ids)
    assert len(pieces) == len(ids)
    assert "".join(pieces) == tokenizer.decode(ids) == text
    assert "" in pieces  # 𓀀 and 🦜 span tokens: the first gets nothing, the last the character
