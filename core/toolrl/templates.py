"""Chat templates the installed ``trl`` package ships (``trl/chat_templates/*.jinja``): model
families recognise a tokenizer's template by them and take their history-preserving training twins
from them, and a tokenizer built from a GGUF file (which holds none) gets its family's. Read from the
installed package, never fetched."""

from __future__ import annotations

from functools import cache
from importlib import resources


@cache
def trl_template(file: str) -> str:
    """One of the chat templates the installed ``trl`` package ships."""
    return resources.files("trl").joinpath("chat_templates", file).read_text(encoding="utf-8")
