"""Fixtures: the tiny random Qwen3 (head_dim 64, which vLLM's CPU attention accepts), its tokenizer,
transformers references, and one vLLM engine shared by every test of the session (starting one takes
~1 min): a test that changes its weights puts the tiny model's back, and the test that closes it
(marked ``closes_engine``) runs last."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from toolrl import model_sources


@pytest.fixture(scope="session")
def tiny_path() -> str:
    return model_sources.tiny_qwen3()


@pytest.fixture(scope="session")
def tokenizer(tiny_path: str) -> Any:
    return model_sources.load_tokenizer(tiny_path)


@pytest.fixture(scope="session")
def hf_model(tiny_path: str) -> Any:
    return model_sources.load_model(tiny_path)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The test that closes the shared engine after every other."""
    items.sort(key=lambda item: item.get_closest_marker("closes_engine") is not None)


@pytest.fixture(scope="session")
def engine(tiny_path: str) -> Iterator[Any]:
    from toolrl.engines import ModelSource
    from toolrl_vllm.engine import VLLMEngine

    # sleep_level 1 drives vLLM's sleep / wake-up calls (a no-op for memory on CPU, the GPU path's API).
    eng = VLLMEngine.create(ModelSource(tiny_path), {"device": "cpu", "max_batch_size": 16, "sleep_level": 1})
    yield eng
    asyncio.run(eng.close())
