"""vLLM's ``return_tokens_as_token_ids`` convention: a completion's logprob tokens as ``token_id:N``
strings, so a client gets the exact ids instead of text it would have to re-tokenize."""

from __future__ import annotations

import re
from collections.abc import Sequence

PREFIX = "token_id:"
_TOKEN_ID = re.compile(r"token_id:(\d+)")


def token_id_string(token_id: int) -> str:
    return f"{PREFIX}{token_id}"


def parse_token_ids(tokens: Sequence[str] | None) -> list[int] | None:
    """The ids behind ``token_id:N`` strings; None unless every token has that form."""
    if not tokens:
        return None
    ids = []
    for token in tokens:
        m = _TOKEN_ID.fullmatch(token)
        if m is None:
            return None
        ids.append(int(m.group(1)))
    return ids
