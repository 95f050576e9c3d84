"""A decode step's attention (modeling.decode_attention): one query a row over grouped key/value heads,
read without copying them to every query head, equals transformers' sdpa."""

from __future__ import annotations

import pytest
import torch
from toolrl.modeling import attention, decode_attention
from transformers.integrations import sdpa_attention


@pytest.mark.parametrize("mask_kind", ["bool", "float", "none"])
def test_one_query_attention_equals_transformers_sdpa(mask_kind):
    torch.manual_seed(0)
    rows, heads, kv_heads, keys, dim = 5, 8, 2, 37, 16
    q, k, v = torch.randn(rows, heads, 1, dim), torch.randn(rows, kv_heads, keys, dim), torch.randn(rows, kv_heads, keys, dim)
    seen = torch.rand(rows, 1, 1, keys) < 0.7
    seen[..., 0] = True
    mask = {"bool": seen, "float": torch.zeros(seen.shape).masked_fill(~seen, float("-inf")), "none": None}[mask_kind]
    module = type("Attention", (), {"num_key_value_groups": heads // kv_heads, "training": False})()
    want, _ = sdpa_attention.sdpa_attention_forward(module, q, k, v, mask, scaling=0.3)
    got = decode_attention.one_query_attention(q, k, v, mask, 0.3)
    assert got.shape == want.shape == (rows, 1, heads, dim)
    assert torch.allclose(got, want, atol=1e-6, rtol=0)


def test_a_gpu_step_copies_no_head_and_a_cpu_step_keeps_transformers_path(monkeypatch):
    """Off the CPU (here the meta device: shapes only, as no GPU exists here) a one-query step takes the
    fold; on CPU transformers' sdpa, whose sums every CPU figure was recorded with."""
    calls = []
    monkeypatch.setattr(sdpa_attention, "repeat_kv", lambda x, n: calls.append(n) or x.repeat_interleave(n, 1))
    module = type("Attention", (), {"num_key_value_groups": 4, "training": False})()
    for device in ("meta", "cpu"):
        q, k = torch.zeros(3, 8, 1, 16, device=device), torch.zeros(3, 2, 20, 16, device=device)
        out, _ = decode_attention.sdpa(module, q, k, k, torch.ones(3, 1, 1, 20, dtype=torch.bool, device=device))
        assert out.shape == (3, 1, 8, 16)
        assert len(calls) == (0 if device == "meta" else 2), device


def test_an_engine_runs_its_model_through_the_decode_attention(tiny_qwen3_path, qwen3_tokenizer):
    from toolrl.engines.transformers import TransformersEngine, TransformersEngineConfig
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_qwen3_path, attn_implementation="sdpa")
    TransformersEngine(model, qwen3_tokenizer, TransformersEngineConfig(device="cpu"))
    assert model.config._attn_implementation == attention.DECODE_SDPA
