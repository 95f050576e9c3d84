"""Shared fixtures: the real Qwen3 tokenizer (built offline) and a rollout through toolrl's own loop
(routes and tools built from the environment, as ``toolrl train`` builds them)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    from toolrl import model_sources

    return model_sources.qwen_tokenizer("qwen3")


async def rollout(env: str, engine: Any, tokenizer: Any, split: str = "train", env_options: dict | None = None,
                  limit: int | None = None, only: set[str] | None = None, **rollout: Any) -> list[Any]:
    """Every sample of ``env``'s ``split`` (the first ``limit``; only the tasks ``only`` names) rolled
    out once by ``engine``."""
    from toolrl.config import load_config
    from toolrl.data.sources import load_samples
    from toolrl.renderers.chat import ChatRenderer
    from toolrl.rollout import RolloutContext, run_rollouts
    from toolrl.rollout.routes import build_routes

    config = load_config(None, data={"env": env, "env_options": env_options or {},
                                     "rollout": {"max_new_tokens": 2048, "max_response_tokens": 32768, **rollout}})
    samples = [s for s in load_samples(config, split)[:limit] if only is None or s.ground_truth in only]
    routes, tools = await build_routes(config, samples)
    try:
        ctx = RolloutContext(engine=engine, renderer_factory=lambda schemas: ChatRenderer(tokenizer, schemas),
                             config=config.rollout, routes=routes)
        return await run_rollouts(ctx, samples, 1, seed=0)
    finally:
        for tool in tools:
            await tool.close()
