"""Shared session fixtures: the real Qwen3 tokenizer and a tiny random Qwen3 model.

Both are built once and cached on disk (``$TOOLRL_CACHE`` or ``~/.cache/toolrl``), so later test
sessions only load them.
"""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(scope="session")
def qwen3_tokenizer() -> Any:
    from toolrl.models import qwen_tokenizer

    return qwen_tokenizer("qwen3")


@pytest.fixture(scope="session")
def tiny_qwen3_path() -> str:
    from toolrl.models import tiny_qwen3

    return tiny_qwen3()
