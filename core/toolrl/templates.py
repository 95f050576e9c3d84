"""Chat templates the installed ``trl`` package ships (``trl/chat_templates/*.jinja``): model
families recognise a tokenizer's template by them and take their history-preserving training twins
from them, and a tokenizer built from a GGUF file (which holds none) gets its family's. Read from the
installed package, never fetched."""

from __future__ import annotations

from functools import cache
from importlib.util import find_spec
from pathlib import Path


@cache
def trl_template(file: str) -> str:
    """One of the chat templates the installed ``trl`` package ships: read from where the package lies,
    without importing it (trl's import takes a third of a second, and family detection reads four)."""
    spec = find_spec("trl")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("the trl package is not installed", name="trl")
    return (Path(spec.submodule_search_locations[0]) / "chat_templates" / file).read_text(encoding="utf-8")
