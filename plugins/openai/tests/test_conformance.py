"""The ``openai`` engine through the rollout-engine conformance kit, against ``toolrl serve`` of the
tiny random Qwen3 (examples/tiny.yaml) on loopback, checked against full forwards of the same weights:
token-exact greedy generations and logprobs, a cancelled request leaving the others as they were. The
weight update cannot hold by design (the OpenAI API carries no weights: the served model is the
server's), so it is declared not applicable, and the kit checks that it indeed fails."""

from __future__ import annotations

from typing import Any

from support import ServeProcess
from toolrl import model_sources
from toolrl.engines import ModelSource
from toolrl.testing import check_engine_contract
from toolrl_openai.engine import OpenAIEngine

NO_WEIGHTS = "the OpenAI API carries no weights: the engine keeps sampling the model the server serves"


async def test_the_openai_engine_keeps_the_engine_contract(tiny_server: ServeProcess, tiny_path: str,
                                                           tokenizer: Any) -> None:
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True,
                                             return_dict=False) for t in ("hi", "What is 17 * 23?", "数学: 2+2=?")]
    engine = OpenAIEngine.create(ModelSource(tiny_path, tokenizer=tokenizer),
                                 {"base_url": tiny_server.url, "token_exact": True})
    try:
        outcome = await check_engine_contract(engine, model_sources.load_model(tiny_path), prompts,
                                              not_applicable={"weight_update": NO_WEIGHTS})
    finally:
        await engine.close()
    assert outcome == {"logprobs": "passed", "cancellation": "passed",
                       "weight_update": f"not applicable: {NO_WEIGHTS}"}
