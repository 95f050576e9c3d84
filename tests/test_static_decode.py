"""The transformers engine's static decode step (engines.transformers.static_decode), run eagerly on CPU, against
the growing path: the same tokens (greedy and seeded draws) and log-probs within 1e-5 in fp32."""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch
from toolrl import model_sources
from toolrl.engines import ModelSource, SamplingParams
from toolrl.engines.transformers import TransformersEngine
from toolrl.engines.transformers.static_decode import bucket

USER_TEXTS = ["hi", "What is 17 * 23? Think step by step.", "Summarise: " + "the quick brown fox " * 12,
              "x", "Call the calculator on 12345 * 678 and report the result in words."]


@pytest.fixture(scope="module")
def prompts(qwen3_tokenizer):
    return [qwen3_tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True,
                                                return_dict=False) for t in USER_TEXTS]


def _engine(path, module, tokenizer, decode, **config):
    return TransformersEngine.create(ModelSource(path=path, module=module, tokenizer=tokenizer),
                                     {"device": "cpu", "decode": decode, **config})





async def _workload(eng, prompts):
    """Greedy, sampled and top-p requests of different lengths, n > 1, a request joining while others
    decode, and a session's second turn on its kept KV: rows are padded to buckets, leave, join."""
    first = [eng.generate(p, SamplingParams(temperature=0.0 if i % 2 else 1.0, top_p=0.8 if i == 2 else 1.0,
                                            max_new_tokens=6 + 5 * i, seed=i), session_id=f"s{i}")
             for i, p in enumerate(prompts[:3])]
    grouped = eng.generate(prompts[3], SamplingParams(temperature=0.8, max_new_tokens=9, seed=7), n=3)

    async def late():
        await asyncio.sleep(0.05)
        return await eng.generate(prompts[4], SamplingParams(temperature=1.0, max_new_tokens=13, seed=3))

    results = await asyncio.gather(*first, grouped, late())
    gens = [g for r in results for g in r]
    turn = prompts[1] + gens[1].token_ids + [13, 14, 15]
    gens += await eng.generate(turn, SamplingParams(temperature=1.0, max_new_tokens=10, seed=5), session_id="s1")
    return gens


def _sharpened(module, scale):
    """``module`` with its output layer scaled up: a random model's next-token distribution is nearly
    uniform over 151,936 tokens, where a rounding-level change of the logits (the static step sums
    attention over more, masked, columns) moves an inverse-CDF draw to the next token. A trained
    model's is peaked, as this one's becomes: the same uniforms then draw the same tokens."""
    module = copy.deepcopy(module).eval()
    with torch.no_grad():
        module.get_output_embeddings().weight.mul_(scale)
    return module


async def compare(path, module, scale, tokenizer, prompts, tol=1e-5, **config):
    """The workload on the eager and the static path of ``module`` (sharpened by ``scale``, on the
    ``device`` in ``config``): the same tokens, log-probs within ``tol``; returns the static engine."""
    module, out = _sharpened(module, scale).to(config.get("device", "cpu")), {}
    for mode in ("eager", "static"):
        eng = _engine(path, module, tokenizer, mode, **config)
        out[mode] = (await _workload(eng, prompts), eng)
        await eng.close()
    (eager, e), (static, s) = out["eager"], out["static"]
    assert s._static is not None and e._static is None
    for a, b in zip(eager, static, strict=True):
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) <= tol
    # The draws were not all near-certain: a sampled row took tokens of probability well below one.
    assert min(lp for g in static for lp in g.logprobs) < -0.5
    assert s.stats.reused_tokens == e.stats.reused_tokens > 0
    assert s.stats.generated_tokens == e.stats.generated_tokens
    return s


async def test_static_decode_matches_eager(tiny_qwen3_path, qwen3_tokenizer, prompts):
    module = model_sources.load_model(tiny_qwen3_path)
    await compare(tiny_qwen3_path, module, 12.0, qwen3_tokenizer, prompts, max_batch_size=6)


async def test_static_decode_keeps_sliding_windows(tiny_qwen3_path, windowed, qwen3_tokenizer, prompts):
    """Gemma 3's first layer sees only the 6 positions before each token: the static step's mask over
    the whole capacity keeps that window by position."""
    await compare(tiny_qwen3_path, windowed, 40.0, qwen3_tokenizer, prompts)


def test_static_decode_is_chosen_on_cuda_only(tiny_qwen3_path, qwen3_tokenizer):
    module = model_sources.load_model(tiny_qwen3_path)
    assert _engine(tiny_qwen3_path, module, qwen3_tokenizer, "auto")._static is None  # CPU: the growing path
    eng = _engine(tiny_qwen3_path, module, qwen3_tokenizer, "static")
    assert eng._static is not None and eng._static.graphs is None  # no CUDA graphs off CUDA
    assert eng._capacity(65) == 128 and _engine(tiny_qwen3_path, module, qwen3_tokenizer, "eager")._capacity(65) == 65
    assert [bucket(n, 48) for n in (1, 2, 3, 17, 33, 48)] == [1, 2, 4, 32, 48, 48]


def test_static_decode_refuses_route_recording(tiny_qwen3_path, qwen3_tokenizer):
    with pytest.raises(ValueError, match="decode: static takes a text model that records no routes"):
        _engine(model_sources.tiny_moe(), model_sources.load_model(model_sources.tiny_moe()), qwen3_tokenizer,
                "static", record_routes=True)


def test_block_draws_continue_each_rows_stream():
    """A sampled row draws its uniforms UNIFORM_BLOCK at a time: the same values, in the same order, as
    one draw per token from its seeded generator (the streams the seeded tests pin)."""
    from toolrl.engines.transformers import _Row

    row = _Row(None, 0, torch.Generator().manual_seed(2**62 + 7))
    reference = torch.Generator().manual_seed(2**62 + 7)
    drawn = [row.uniform() for _ in range(150)]
    assert drawn == [float(torch.rand((), generator=reference, dtype=torch.float64)) for _ in range(150)]
