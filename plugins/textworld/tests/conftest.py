"""The plugin's games go to a cache of this test session's own (never the user's), made before any test
module is imported: the conformance plays are read from a generated game's walkthrough."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from typing import Any

import pytest

os.environ["TOOLRL_TEXTWORLD_CACHE"] = tempfile.mkdtemp(prefix="toolrl-textworld-")
atexit.register(shutil.rmtree, os.environ["TOOLRL_TEXTWORLD_CACHE"], True)  # each test run's games, gone after it


@pytest.fixture(scope="session")
def qwen3_tokenizer() -> Any:
    from toolrl.model_sources import qwen_tokenizer

    return qwen_tokenizer("qwen3")
