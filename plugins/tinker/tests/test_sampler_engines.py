"""The sampler on each engine it runs on, in a server of its own with one adapter slot (so that every
client's request finds its adapter evicted by the last one's): toolrl's transformers engine, and vLLM
where it is installed (the vllm plugin's nox session runs this module's vLLM tests). Sample and
compute_logprobs give the client's forward's log-probs (transformers 1e-5, vLLM 1e-4: its own attention
and LoRA kernels, float32 too), and a client evicted from the engine's adapter slots samples exactly as
it did before (greedy tokens and log-probs); the engine contract's adapters at run time, on each engine."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import BASE, KEY, start_server
from test_exactness import TOKENS, _warm, check_sample_logprobs

# Sample's and compute_logprobs' log-probs against forward's, per engine.
ATOL = {"transformers": 1e-5, "vllm": 1e-4}
VLLM = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")


@pytest.fixture(scope="module", params=["transformers", pytest.param("vllm", marks=VLLM)])
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    s = start_server(tmp_path_factory.mktemp("tinker-state"), sampler=request.param, sampler_slots=1)
    yield s
    s.stop()


def tinker_client(served: Any) -> Any:
    import tinker

    return tinker.ServiceClient(base_url=served.url, api_key=KEY)


@pytest.fixture(scope="module")
def engine_client(served: Any) -> tuple[str, Any]:
    return served.service.limits.sampler, tinker_client(served)


def test_sample_logprobs_equal_forward(engine_client: tuple[str, Any]) -> None:
    engine, client = engine_client
    check_sample_logprobs(client, ATOL[engine])


def test_an_evicted_client_samples_as_never_evicted(engine_client: tuple[str, Any]) -> None:
    """Three clients' samplers on one slot: each request evicts the one before, and each client's greedy
    samples and scores equal its first ones, bit for bit."""
    from tinker import types

    prompt, greedy = types.ModelInput.from_ints(TOKENS[:5]), types.SamplingParams(max_tokens=5, temperature=0.0)

    def answers(sampler: Any) -> tuple[Any, ...]:
        (seq,) = sampler.sample(prompt, 1, greedy).result().sequences
        return seq.tokens, seq.logprobs, sampler.compute_logprobs(types.ModelInput.from_ints(TOKENS)).result()

    _, client = engine_client
    samplers = []
    for seed in range(3):
        tc = client.create_lora_training_client(base_model=BASE, rank=4, seed=20 + seed).result()
        _warm(tc)
        samplers.append(tc.save_weights_and_get_sampling_client().result())
    first = [answers(s) for s in samplers]
    assert first[0] != first[1]  # the clients' adapters differ where it shows
    assert [answers(s) for s in reversed(samplers)] == first[::-1]



def test_adapters_come_and_go_through_the_engine_contract(served: Any) -> None:
    """add_adapter, the tensors as rows, adapters, remove_adapter on the sampler's engine itself: an adapter
    added but sent no tensors samples the base model, one sent a client's tensors as that client's sampler
    does, and one removed is gone (refused by name)."""
    import asyncio

    from tinker import types
    from toolrl.engines import SamplingParams
    from toolrl.modeling.adapters import adapter_keys
    from toolrl_tinker import adapters

    client = tinker_client(served)
    tc = client.create_lora_training_client(base_model=BASE, rank=4, seed=31).result()
    _warm(tc)
    (seq,) = tc.save_weights_and_get_sampling_client().result().sample(
        types.ModelInput.from_ints(TOKENS), 1, types.SamplingParams(max_tokens=4, temperature=0.0, stop=[])
    ).result().sequences
    run = served.service.runs[tc.model_id]
    state = served.service.bases[BASE].trainer.adapter_state(run)
    engine = served.service.bases[BASE].sampler.engine
    greedy = SamplingParams(temperature=0.0, max_new_tokens=4)

    def tokens(adapter: str) -> list[int]:  # on the server's event loop, as its requests run
        gen = asyncio.run_coroutine_threadsafe(engine.generate(TOKENS, greedy, adapter=adapter), served.loop)
        return gen.result(300)[0].token_ids

    engine.add_adapter("probe", adapters.config(run.rank, run.targets))
    assert "probe" in engine.adapters() and tokens("probe") == tokens(adapters.BASE_ADAPTER)
    with engine.updating_weights(engine.weight_version):
        for key, tensor in adapter_keys(state, "probe").items():
            engine.load_weight_rows(key, tuple(tensor.shape), 0, tensor)
        engine.finish_weight_rows()
    assert tokens("probe") == seq.tokens
    engine.remove_adapter("probe")
    assert "probe" not in engine.adapters()
    with pytest.raises(ValueError, match="unknown adapter 'probe'"):
        tokens("probe")
