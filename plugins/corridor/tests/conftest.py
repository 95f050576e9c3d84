"""Fixtures: the real Qwen3 tokenizer (built offline, cached on disk by toolrl)."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(scope="session")
def qwen3_tokenizer() -> Any:
    from toolrl.model_sources import qwen_tokenizer

    return qwen_tokenizer("qwen3")
