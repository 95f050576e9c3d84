"""The rollout-engine conformance kit (toolrl.testing.engines) over the transformers engine on the
tiny random Qwen3, against full forwards of the same weights; and the kit failing an engine that
reports wrong logprobs or ignores a weight update."""

from __future__ import annotations

import pytest
from toolrl import model_sources
from toolrl.engines import ModelSource
from toolrl.engines.transformers import TransformersEngine
from toolrl.testing.engines import (
    check_engine_cancellation,
    check_engine_contract,
    check_engine_logprobs,
    check_engine_weight_update,
)


@pytest.fixture(scope="module")
def prompts(qwen3_tokenizer):
    texts = ["hi", "What is 17 * 23? Think step by step.", "数学: 2+2=?"]
    return [qwen3_tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True,
                                                return_dict=False) for t in texts]


@pytest.fixture
async def engine(tiny_qwen3_path):
    engine = TransformersEngine.create(ModelSource(path=tiny_qwen3_path), {"device": "cpu", "dtype": "float32"})
    yield engine
    await engine.close()


async def test_the_transformers_engine_keeps_the_engine_contract(engine, tiny_qwen3_path, prompts) -> None:
    model = model_sources.load_model(tiny_qwen3_path)
    await check_engine_logprobs(engine, model, prompts)
    await check_engine_cancellation(engine, prompts)
    await check_engine_weight_update(engine, model, prompts)


class OffByATenth(TransformersEngine):
    async def generate(self, *args, **kwargs):
        out = await super().generate(*args, **kwargs)
        for generation in out:
            generation.logprobs = [lp + 0.1 for lp in generation.logprobs]
        return out


class Deaf(TransformersEngine):
    def load_weight_rows(self, name, shape, start, rows) -> None:
        pass  # ignores every weight it is sent


async def test_the_kit_fails_an_engine_that_breaks_the_contract(tiny_qwen3_path, prompts) -> None:
    model = model_sources.load_model(tiny_qwen3_path)
    for cls, check, message in ((OffByATenth, check_engine_logprobs, "logprobs differ"),
                                (Deaf, check_engine_weight_update, "the model gives")):
        engine = cls.create(ModelSource(path=tiny_qwen3_path), {"device": "cpu", "dtype": "float32"})
        try:
            with pytest.raises(AssertionError, match=message):
                await check(engine, model, prompts)
        finally:
            await engine.close()


async def test_a_check_declared_not_applicable_must_fail_on_the_engine(engine, tiny_qwen3_path, prompts) -> None:
    model = model_sources.load_model(tiny_qwen3_path)
    with pytest.raises(AssertionError, match="not_applicable names no check: speed"):
        await check_engine_contract(engine, model, prompts, {"speed": "slow"})
    with pytest.raises(AssertionError, match=r"'logprobs' is declared not applicable \(why not\) but passes"):
        await check_engine_contract(engine, model, prompts, {"logprobs": "why not"})
