"""Fixtures: the tiny random Qwen3 (head_dim 64, which vLLM's CPU attention accepts), its tokenizer,
transformers references, and one vLLM engine shared by every test of the session (starting one takes
~1 min), with what it sampled as started (the weight-transport tests' reference, so they need no
engine of their own): a test that changes its weights puts the tiny model's back, and the test that
closes it (marked ``closes_engine``) runs last."""

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
def started_engine(tiny_path: str, tokenizer: Any) -> Iterator[tuple[Any, Any]]:
    """The session's engine, and what it samples (vllm_support.samples) as started from the tiny
    model's checkpoint, taken before any test changes its weights."""
    from toolrl.engines import ModelSource
    from toolrl_vllm.engine import VLLMEngine
    from vllm_support import samples, sync_prompts

    # sleep_level 1 drives vLLM's sleep / wake-up calls (a no-op for memory on CPU, the GPU path's API).
    eng = VLLMEngine.create(ModelSource(tiny_path), {"device": "cpu", "max_batch_size": 16, "sleep_level": 1})
    try:
        yield eng, asyncio.run(samples(eng, sync_prompts(tokenizer)))
    finally:
        asyncio.run(eng.close())


@pytest.fixture(scope="session")
def engine(started_engine: tuple[Any, Any]) -> Any:
    return started_engine[0]


@pytest.fixture(scope="session")
def as_started(started_engine: tuple[Any, Any]) -> Any:
    """The session engine's samples of vllm_support's sync prompts on the weights it started from (the
    tiny model's checkpoint): an engine loaded from that checkpoint, the weight-transport tests' reference."""
    return started_engine[1]
