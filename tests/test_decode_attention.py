"""A decode step's attention (engines.decode_attention): one query a row over grouped key/value heads,
read without copying them to every query head, equals transformers' sdpa."""

from __future__ import annotations

import pytest
import torch
from toolrl.engines import decode_attention
from transformers.integrations import sdpa_attention


@pytest.mark.parametrize("mask_kind", ["bool", "float", "none"])
def test_one_query_step_equals_transformers_sdpa_without_copying_heads(monkeypatch, mask_kind):
    torch.manual_seed(0)
    rows, heads, kv_heads, keys, dim = 5, 8, 2, 37, 16
    q, k, v = torch.randn(rows, heads, 1, dim), torch.randn(rows, kv_heads, keys, dim), torch.randn(rows, kv_heads, keys, dim)
    seen = torch.rand(rows, 1, 1, keys) < 0.7
    seen[..., 0] = True
    mask = {"bool": seen, "float": torch.zeros(seen.shape).masked_fill(~seen, float("-inf")), "none": None}[mask_kind]
    module = type("Attention", (), {"num_key_value_groups": heads // kv_heads, "training": False})()
    want, _ = sdpa_attention.sdpa_attention_forward(module, q, k, v, mask, scaling=0.3)

    def copied(*args, **kwargs):
        raise AssertionError("a one-query step copied the key/value heads")

    monkeypatch.setattr(sdpa_attention, "repeat_kv", copied)
    got, _ = decode_attention.sdpa(module, q, k, v, mask, scaling=0.3)
    assert got.shape == want.shape == (rows, 1, heads, dim)
    assert torch.allclose(got, want, atol=1e-6, rtol=0)


def test_an_engine_runs_its_model_through_the_decode_attention(tiny_qwen3_path, qwen3_tokenizer):
    from toolrl.engines.transformers import TransformersEngine, TransformersEngineConfig
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_qwen3_path, attn_implementation="sdpa")
    TransformersEngine(model, qwen3_tokenizer, TransformersEngineConfig(device="cpu"))
    assert model.config._attn_implementation == decode_attention.DECODE_SDPA
