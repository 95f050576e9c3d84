"""A CPU engine's linears on oneDNN-packed weights (engine.options.packed_linears): the dense product to
float32 rounding, one row bit for bit, packed again when the weight changes, gradients on the weight
itself, the model's modules untouched, and an engine that samples every adapter as merged with them and
frees its copies asleep."""

from __future__ import annotations

import asyncio

import pytest
import torch
import torch.nn.functional as F
from test_adapters_routing import ROLES, merged_model
from test_engine_adapters import adapter_tensors, chat, load
from test_transformers_engine import greedy_reference, logprob_reference
from toolrl.config import load_config
from toolrl.engines import ModelSource, SamplingParams
from toolrl.engines.transformers import TransformersEngine
from toolrl.model_sources import load_model
from toolrl.modeling import packed_linears
from toolrl.modeling.adapters import apply_adapters
from toolrl.plugins.parts import RunFacts

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=8)


def packed_layer(out_features: int = 96, in_features: int = 80, seed: int = 0
                 ) -> tuple[torch.nn.Linear, packed_linears.PackedLinears]:
    torch.manual_seed(seed)
    layer = torch.nn.Linear(in_features, out_features).requires_grad_(False)
    return layer, packed_linears.PackedLinears(layer)


def test_a_packed_layer_computes_the_dense_product():
    layer, packed = packed_layer()
    assert packed.layers == [layer] and type(layer) is torch.nn.Linear
    for shape in [(1, 80), (1, 1, 80), (2, 80), (4, 80), (3, 11, 80)]:
        x = torch.randn(shape)
        with packed.applied():
            got = layer(x)
        want = F.linear(x, layer.weight, layer.bias)
        assert got.shape == want.shape
        if x.numel() == 80:  # one row: the dense product itself
            assert torch.equal(got, want)
        else:
            assert packed.copies == 1
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-5)
    assert torch.equal(layer(x), want) and "forward" not in layer.__dict__  # outside applied(): its own forward


def test_a_weight_written_in_place_or_replaced_is_packed_again():
    layer, packed = packed_layer()
    x = torch.randn(4, 80)

    def run() -> torch.Tensor:
        with packed.applied():
            return layer(x)

    before = run()
    with torch.no_grad():
        layer.weight.mul_(-2.0)  # in place: the version moves
    torch.testing.assert_close(run(), F.linear(x, layer.weight, layer.bias), rtol=1e-6, atol=1e-5)
    assert not torch.allclose(run(), before)
    layer.weight = torch.nn.Parameter(torch.randn(96, 80), requires_grad=False)  # replaced: a new storage
    torch.testing.assert_close(run(), F.linear(x, layer.weight, layer.bias), rtol=1e-6, atol=1e-5)


def test_forwards_with_gradients_take_the_dense_weight():
    layer, packed = packed_layer()
    layer.requires_grad_(True)
    x = torch.randn(4, 80)
    with packed.applied():
        out = layer(x)
    assert torch.equal(out, F.linear(x, layer.weight, layer.bias))
    out.sum().backward()
    torch.testing.assert_close(layer.weight.grad, x.sum(0).expand(96, 80))
    assert packed.copies == 0  # nothing packed for it


def test_packing_leaves_loras_a_and_b_plain(tiny_qwen3_path):
    model = apply_adapters(load_model(tiny_qwen3_path), ROLES)
    packed = packed_linears.PackedLinears(model)
    chosen = {id(m) for m in packed.layers}
    linears = {name: m for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    assert 0 < len(chosen) < len(linears)
    for name, m in linears.items():
        assert type(m) is torch.nn.Linear
        assert (id(m) not in chosen) == (".lora_A." in name or ".lora_B." in name), name


def test_a_torch_without_the_onednn_ops_is_one_line(monkeypatch):
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"^packed_linears: true needs torch built with oneDNN and its ops "
                                         r"torch\.ops\.mkldnn\._reorder_linear_weight and _linear_pointwise, "
                                         r"which torch \S+ here lacks$"):
        packed_layer()


@pytest.fixture
async def engine(tiny_qwen3_path, qwen3_tokenizer):
    eng = TransformersEngine.create(ModelSource(path=tiny_qwen3_path, tokenizer=qwen3_tokenizer),
                                    {"device": "cpu", "packed_linears": True})
    eng.apply_adapters(lambda model: apply_adapters(model, ROLES))
    load(eng, adapter_tensors(eng.model, seed=0), 1)
    yield eng
    await eng.close()


async def test_a_packed_engine_samples_each_adapter_as_merged(engine, tiny_qwen3_path, qwen3_tokenizer):
    # Rows of three adapters in one prefill and in every decode step: the packed path throughout.
    short, long = chat(qwen3_tokenizer, "hi"), chat(qwen3_tokenizer, "Summarise: " + "the quick brown fox " * 20)
    asks = [(short, "a"), (short, "b"), (long, "c"), (chat(qwen3_tokenizer, "2+2?"), "b")]
    gens = await asyncio.gather(*(engine.generate(p, GREEDY, adapter=role) for p, role in asks))
    assert engine._packed.copies == len(engine._packed.layers) > 0  # every layer but LoRA's ran packed
    refs = {role: merged_model(tiny_qwen3_path, engine.model, role) for role in "abc"}
    for (prompt, role), [gen] in zip(asks, gens):
        assert gen.token_ids == greedy_reference(refs[role], prompt, GREEDY.max_new_tokens), role
        want = logprob_reference(refs[role], prompt, gen.token_ids)
        assert max(abs(x - y) for x, y in zip(gen.logprobs, want)) <= 1e-5, role


async def test_a_packed_engine_decodes_on_updated_weights_and_sleeps_without_its_copies(engine, tiny_qwen3_path, qwen3_tokenizer):
    prompts = [chat(qwen3_tokenizer, "hi"), chat(qwen3_tokenizer, "2+2?")]

    async def both() -> list[list[int]]:
        return [g[0].token_ids for g in await asyncio.gather(*(engine.generate(p, GREEDY, adapter="c")
                                                               for p in prompts))]

    before = await both()  # packed once
    old = {n: t.clone() for n, t in engine.weight_tensors().items() if n.endswith("down_proj.base_layer.weight")}
    gen = torch.Generator().manual_seed(3)
    new = {n: t + torch.randn(t.shape, generator=gen) * 0.2 for n, t in old.items()}
    engine.update_weights(new)  # in place: every packed copy of them is stale
    after = await both()
    ref = merged_model(tiny_qwen3_path, engine.model, "c")
    with torch.no_grad():
        own = dict(ref.named_parameters())
        for n in new:
            own[n.replace(".base_layer", "")].add_(new[n] - old[n])
    assert after == [greedy_reference(ref, p, GREEDY.max_new_tokens) for p in prompts] != before
    packed = engine._packed
    await engine.sleep()  # the packed copies are freed, and made again when rows decode
    assert packed.copies == 0
    assert await both() == after
    assert packed.copies == len(packed.layers) > 0


def test_packed_linears_take_a_cpu_float32_engine(tiny_qwen3_path, qwen3_tokenizer):
    source = ModelSource(path=tiny_qwen3_path, tokenizer=qwen3_tokenizer)
    with pytest.raises(ValueError, match=r"^packed_linears: true takes a CPU engine with float32 weights, this one "
                                         r"has bfloat16 weights on cpu$"):
        TransformersEngine.create(source, {"device": "cpu", "dtype": "bfloat16", "packed_linears": True})
    for options, refused in [({"device": "cuda:0"}, "float32 weights on cuda"), ({"dtype": "bfloat16"}, "bfloat16"),
                             ({}, None), ({"device": "auto"}, None)]:  # auto: checked again on the engine's device
        config = load_config(None, data={"env": "arithmetic",
                                         "engine": {"options": {"packed_linears": True, **options}}})
        facts = RunFacts(config, tiny_qwen3_path, {}, {}, None, None)
        if refused:  # before any model loads: the run check
            with pytest.raises(ValueError, match=refused):
                TransformersEngine.check_run(facts)
        else:
            assert TransformersEngine.check_run(facts) == []
