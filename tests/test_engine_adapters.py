"""The transformers engine serving an adapter per role (model.adapters): rows of different adapters in one
batch, each exactly as a separate model with its adapter merged; KV reused only under its own adapter;
updates that carry some adapters' tensors; engines that serve none refuse model.adapters."""

from __future__ import annotations

import asyncio

import pytest
import torch
from test_adapters_routing import ROLES, merged_model
from test_transformers_engine import greedy_reference, logprob_reference
from toolrl.config import AdapterConfig, load_config
from toolrl.engines import ModelSource, SamplingParams
from toolrl.engines.transformers import TransformersEngine
from toolrl.model_sources import load_model
from toolrl.modeling.adapter_routing import adapter_names
from toolrl.modeling.adapters import apply_adapters
from toolrl.plugins.parts import RunFacts

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=8)


def adapter_tensors(model: torch.nn.Module, seed: int, roles: str = "abc") -> dict[str, torch.Tensor]:
    """New values for the adapter tensors of ``roles``, by the model's names (what a weight sync carries)."""
    gen = torch.Generator().manual_seed(seed)
    return {name: torch.randn(p.shape, generator=gen) * 0.05 for name, p in model.named_parameters()
            if "lora_" in name and name.split(".")[-2] in roles}


def load(engine: TransformersEngine, tensors: dict[str, torch.Tensor], version: int) -> None:
    """Through the rows path every weight sync takes."""
    with engine.updating_weights(version):
        for name, value in tensors.items():
            engine.load_weight_rows(name, value.shape, 0, value)
        engine.finish_weight_rows()


@pytest.fixture
async def engine(tiny_qwen3_path, qwen3_tokenizer):
    eng = TransformersEngine.create(ModelSource(path=tiny_qwen3_path, tokenizer=qwen3_tokenizer), {"device": "cpu"})
    eng.apply_adapters(lambda model: apply_adapters(model, ROLES))
    load(eng, adapter_tensors(eng.model, seed=0), 1)
    yield eng
    await eng.close()


def chat(tokenizer, text: str) -> list[int]:
    return tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                         return_dict=False)


async def test_a_mixed_batch_samples_each_row_as_its_adapter_merged(engine, tiny_qwen3_path, qwen3_tokenizer):
    # One prompt under two adapters (never one prefill for both), a long one (the per-adapter prefill
    # path) and short ones; all admitted together, so prefill and decode steps hold several adapters.
    short, long = chat(qwen3_tokenizer, "hi"), chat(qwen3_tokenizer, "Summarise: " + "the quick brown fox " * 20)
    asks = [(short, "a"), (short, "b"), (long, "c"), (chat(qwen3_tokenizer, "2+2?"), "b"), (long, "a")]
    gens = await asyncio.gather(*(engine.generate(p, GREEDY, adapter=role) for p, role in asks))
    assert engine.stats.steps == GREEDY.max_new_tokens  # one prefill, then every decode step for all rows
    refs = {role: merged_model(tiny_qwen3_path, engine.model, role) for role in "abc"}
    for (prompt, role), [gen] in zip(asks, gens):
        assert gen.token_ids == greedy_reference(refs[role], prompt, GREEDY.max_new_tokens), role
        want = logprob_reference(refs[role], prompt, gen.token_ids)
        assert max(abs(x - y) for x, y in zip(gen.logprobs, want)) <= 1e-5, role
        assert gen.prefill_tokens_saved == 0
    assert gens[0][0].token_ids != gens[1][0].token_ids  # the adapters differ where it shows


async def test_kv_is_reused_only_under_the_adapter_that_computed_it(engine, tiny_qwen3_path, qwen3_tokenizer):
    first = chat(qwen3_tokenizer, "Tell me about foxes.")
    [gen] = await engine.generate(first, GREEDY, session_id="s", adapter="a")
    follow = first + gen.token_ids + chat(qwen3_tokenizer, "And dogs?")
    [same] = await engine.generate(follow, GREEDY, session_id="s", adapter="a")
    assert same.prefill_tokens_saved > 0
    [other] = await engine.generate(follow + same.token_ids, GREEDY, session_id="s", adapter="b")
    assert other.prefill_tokens_saved == 0  # the kept KV is adapter a's
    ref = merged_model(tiny_qwen3_path, engine.model, "b")
    assert other.token_ids == greedy_reference(ref, follow + same.token_ids, GREEDY.max_new_tokens)


async def test_an_update_of_one_adapter_reaches_its_rows_only(engine, tiny_qwen3_path, qwen3_tokenizer):
    prompt = chat(qwen3_tokenizer, "hi")

    async def both() -> list[list[int]]:
        gens = await asyncio.gather(engine.generate(prompt, GREEDY, adapter="a"),
                                    engine.generate(prompt, GREEDY, adapter="b"))
        return [g[0].token_ids for g in gens]

    before = await both()  # a decode step of a and b: the stacked weights are kept
    load(engine, adapter_tensors(engine.model, seed=7, roles="b"), 2)
    after = await both()
    assert after[0] == before[0]
    assert after[1] == greedy_reference(merged_model(tiny_qwen3_path, engine.model, "b"), prompt,
                                        GREEDY.max_new_tokens) != before[1]


async def test_a_request_names_one_of_the_engines_adapters(engine, tiny_qwen3_path, qwen3_tokenizer):
    prompt = chat(qwen3_tokenizer, "hi")
    with pytest.raises(ValueError, match=r"unknown adapter 'nope': the engine serves an adapter per role: a, b, c"):
        await engine.generate(prompt, GREEDY, adapter="nope")
    with pytest.raises(ValueError, match="no adapter: the engine serves an adapter per role"):
        await engine.generate(prompt, GREEDY)
    plain = TransformersEngine(load_model(tiny_qwen3_path), qwen3_tokenizer, engine.config)
    with pytest.raises(ValueError, match="has no LoRA adapter per role"):
        await plain.generate(prompt, GREEDY, adapter="a")
    await plain.close()


def test_static_decode_is_refused_with_an_adapter_per_role(tiny_qwen3_path):
    static = load_config(None, data={"env": "arithmetic", "model": {"adapters": {"planner": {"r": 4}}},
                                     "engine": {"options": {"decode": "static"}}})
    with pytest.raises(ValueError, match="decode: static"):
        TransformersEngine.check_run(RunFacts(static, tiny_qwen3_path, {}, {}, None, None))


async def test_prompt_logprobs_under_a_named_adapter(engine, tiny_qwen3_path, qwen3_tokenizer):
    """A prompt scored under an adapter is scored by that adapter merged; an engine with adapters per
    role wants one named."""
    prompt = chat(qwen3_tokenizer, "Score me under one policy")
    (scored,) = await engine.prompt_logprobs([prompt], top=2, adapter="b")
    with torch.no_grad():
        ref = torch.log_softmax(merged_model(tiny_qwen3_path, engine.model, "b")(
            input_ids=torch.tensor([prompt])).logits[0, :-1].float(), -1)
    want = ref.gather(-1, torch.tensor(prompt[1:])[:, None])[:, 0]
    torch.testing.assert_close(torch.tensor(scored.logprobs), want, rtol=0, atol=1e-5)
    assert [t for t, _ in scored.top[0]] == ref[0].topk(2).indices.tolist()
    with pytest.raises(NotImplementedError, match="name one"):
        await engine.prompt_logprobs([prompt])


async def test_an_adapter_removed_while_others_run_leaves_their_routes(engine, tiny_qwen3_path, qwen3_tokenizer):
    """A service drops one client's adapter while another's rows are queued or decoding: those rows keep
    their own adapter (by name: its index shifts down), sampling exactly as it merged."""
    prompt = chat(qwen3_tokenizer, "keep my adapter")
    ref = merged_model(tiny_qwen3_path, engine.model, "c")
    longer = SamplingParams(temperature=0.0, max_new_tokens=48)
    running = asyncio.ensure_future(engine.generate(prompt, longer, adapter="c"))
    while engine.stats.steps < 2:  # prefilled and decoding before the removal
        await asyncio.sleep(0.001)
    queued = asyncio.ensure_future(engine.generate(prompt, GREEDY, adapter="c"))
    await asyncio.sleep(0)
    await asyncio.to_thread(engine.remove_adapter, "a")
    assert not running.done()
    (decoded,), (fresh,) = await asyncio.gather(running, queued)
    assert decoded.token_ids == greedy_reference(ref, prompt, longer.max_new_tokens)
    assert fresh.token_ids == greedy_reference(ref, prompt, GREEDY.max_new_tokens)


# ----------------------------------------------------------------- adapters added at run time (add_adapter)

CLIENTS = {"x": AdapterConfig(r=4, alpha=8, target_modules=["q_proj", "v_proj"]), "y": AdapterConfig(r=8, alpha=32),
           "z": AdapterConfig(r=2, alpha=2)}


async def clients_engine(path: str, tokenizer, **options) -> TransformersEngine:
    """A plain engine given CLIENTS' adapters one by one, each loaded as rows (seeded by its name)."""
    eng = TransformersEngine.create(ModelSource(path=path, tokenizer=tokenizer), {"device": "cpu", **options})
    for i, (name, config) in enumerate(CLIENTS.items()):
        eng.add_adapter(name, config)
        load(eng, adapter_tensors(eng.model, seed=10 + i, roles=name), i + 1)
    return eng


async def test_adapters_added_and_removed_at_run_time(tiny_qwen3_path, qwen3_tokenizer):
    """The engine API a service uses (add_adapter / rows / remove_adapter / adapters): each adapter samples as
    the base with it merged; one added but sent no rows is the base model; a removed one is refused."""
    eng = TransformersEngine.create(ModelSource(path=tiny_qwen3_path, tokenizer=qwen3_tokenizer), {"device": "cpu"})
    try:
        prompt = chat(qwen3_tokenizer, "hi")
        base = greedy_reference(load_model(tiny_qwen3_path), prompt, GREEDY.max_new_tokens)
        for name, config in CLIENTS.items():
            eng.add_adapter(name, config)
        load(eng, adapter_tensors(eng.model, seed=3, roles="xy"), 1)
        assert eng.adapters() == ["x", "y", "z"]
        for name in "xy":
            [gen] = await eng.generate(prompt, GREEDY, adapter=name)
            assert gen.token_ids == greedy_reference(merged_model(tiny_qwen3_path, eng.model, name), prompt,
                                                     GREEDY.max_new_tokens) != base, name
        assert (await eng.generate(prompt, GREEDY, adapter="z"))[0].token_ids == base
        eng.remove_adapter("y")
        assert eng.adapters() == ["x", "z"] and not any(".y." in n for n in eng.model.state_dict())
        with pytest.raises(ValueError, match="unknown adapter 'y'"):
            await eng.generate(prompt, GREEDY, adapter="y")
        with pytest.raises(ValueError, match="has an adapter of that name already"):
            eng.add_adapter("x", CLIENTS["x"])
    finally:
        await eng.close()


async def test_an_evicted_adapter_samples_as_one_never_evicted(tiny_qwen3_path, qwen3_tokenizer):
    """Two adapter slots for three clients: at most two adapters sit in the model at any forward (the
    scheduler admits no third into a step), the least recently used waits on the host and comes back with
    its very tensors: every sample and score equals an engine's that keeps all three (greedy tokens,
    log-probs); a sync that finds an adapter evicted writes its host copy."""
    slots = await clients_engine(tiny_qwen3_path, qwen3_tokenizer, max_adapters=2)
    kept = await clients_engine(tiny_qwen3_path, qwen3_tokenizer)
    resident: list[int] = []
    slots.model.register_forward_pre_hook(lambda m, args: resident.append(len(adapter_names(m))))
    try:
        assert sorted(slots.adapters()) == kept.adapters()
        prompt, longer = chat(qwen3_tokenizer, "Tell me about foxes."), SamplingParams(temperature=0.0, max_new_tokens=24)

        async def each(eng: TransformersEngine) -> list:
            alone = [(await eng.generate(prompt, GREEDY, adapter=n))[0] for n in "xyzx"]
            together = await asyncio.gather(*(eng.generate(prompt, longer, adapter=n) for n in "zyx"))
            (scored,) = await eng.prompt_logprobs([prompt], top=2, adapter="y")
            return [*alone, *(g for [g] in together), scored]

        assert list(slots._slots.residency.parked) == ["x"]  # the least recently added: a sync writes its host copy
        load(slots, adapter_tensors(kept.model, seed=5, roles="x"), 9)
        load(kept, adapter_tensors(kept.model, seed=5, roles="x"), 9)
        for got, want in zip(await each(slots), await each(kept), strict=True):
            if hasattr(got, "token_ids"):
                assert got.token_ids == want.token_ids
            assert max(abs(a - b) for a, b in zip(got.logprobs, want.logprobs, strict=True)) <= 1e-5
        assert max(resident) == 2 and len(slots._slots.residency.parked) == 1
    finally:
        await slots.close()
        await kept.close()
