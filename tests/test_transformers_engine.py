"""The transformers rollout engine on the tiny random Qwen3, checked against plain full forwards."""

from __future__ import annotations

import asyncio
import copy
import threading

import pytest
import torch
from toolrl import model_sources
from toolrl.engines import ModelSource, SamplingParams
from toolrl.engines.transformers import TransformersEngine
from toolrl.engines.transformers.decoding import inverse_cdf
from toolrl.engines.transformers.kv_store import KVBatch

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=12)
SAMPLED = SamplingParams(temperature=1.0, max_new_tokens=12, seed=123)
USER_TEXTS = ["hi", "What is 17 * 23? Think step by step.", "Summarise: " + "the quick brown fox " * 12,
              "数学: 2+2=?", "x", "Call the calculator on 12345 * 678 and report the result in words."]


@pytest.fixture(scope="module")
def model(tiny_qwen3_path):
    return model_sources.load_model(tiny_qwen3_path)


@pytest.fixture(scope="module")
def prompts(qwen3_tokenizer):
    """Chat prompts of very different lengths (12 to ~200 tokens; one renders a tool schema)."""
    tool = {"type": "function", "function": {"name": "calculator", "description": "Evaluate arithmetic.",
                                             "parameters": {"type": "object",
                                                            "properties": {"expression": {"type": "string"}}}}}
    out = []
    for i, text in enumerate(USER_TEXTS):
        out.append(qwen3_tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                                       tools=[tool] if i == 5 else None,
                                                       add_generation_prompt=True, return_dict=False))
    return out


def make_engine(path, model, tokenizer, **config):
    return TransformersEngine.create(ModelSource(path=path, module=model, tokenizer=tokenizer),
                                     {"device": "cpu", **config})


@pytest.fixture
async def engine(tiny_qwen3_path, model, qwen3_tokenizer):
    eng = make_engine(tiny_qwen3_path, model, qwen3_tokenizer)
    yield eng
    await eng.close()


@torch.no_grad()
def greedy_reference(model, prompt, steps):
    """Greedy decoding with a full forward over the whole sequence at every step (no KV cache)."""
    ids, out = list(prompt), []
    for _ in range(steps):
        token = int(model(torch.tensor([ids])).logits[0, -1].argmax())
        out.append(token)
        ids.append(token)
    return out


@torch.no_grad()
def logprob_reference(model, prompt, tokens, temperature=1.0):
    """log_softmax(logits / T) of ``tokens`` from one forward over prompt + tokens."""
    logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1].float()
    logp = torch.log_softmax(logits / (temperature or 1.0), dim=-1)
    return logp[torch.arange(len(tokens)), torch.tensor(tokens)].tolist()


def assert_close(a, b, tol=1e-4):
    assert len(a) == len(b)
    assert max((abs(x - y) for x, y in zip(a, b)), default=0.0) <= tol, (a, b)


async def test_greedy_matches_step_by_step_reference(engine, model, prompts):
    for prompt in prompts[:3]:
        [gen] = await engine.generate(prompt, GREEDY)
        assert gen.token_ids == greedy_reference(model, prompt, GREEDY.max_new_tokens)
        assert gen.finish_reason == "length" and gen.stop is None
        assert_close(gen.logprobs, logprob_reference(model, prompt, gen.token_ids))
        assert all(isinstance(x, float) for x in gen.logprobs)


async def test_prompt_logprobs_of_a_padded_batch_are_each_prompts_own_forward(tiny_qwen3_path, model, qwen3_tokenizer,
                                                                             prompts):
    """Prompts of 12 to ~200 tokens scored in batches of 4 (right-padded): each token's log-prob, rank
    and top-3 as a forward of its prompt alone; generation goes on beside it."""
    eng = make_engine(tiny_qwen3_path, model, qwen3_tokenizer, max_batch_size=4)
    try:
        generating = asyncio.ensure_future(eng.generate(prompts[0], GREEDY))
        scored = await eng.prompt_logprobs(prompts, top=3)
        assert (await generating)[0].token_ids == greedy_reference(model, prompts[0], GREEDY.max_new_tokens)
    finally:
        await eng.close()
    for prompt, s in zip(prompts, scored, strict=True):
        with torch.no_grad():
            lp = torch.log_softmax(model(torch.tensor([prompt])).logits[0, :-1].float(), -1)
        assert_close(s.logprobs, logprob_reference(model, prompt[:1], prompt[1:]), tol=1e-5)
        # A rank counts the tokens above this one: those within the log-probs' tolerance of it may fall
        # either side of it in the padded batch's arithmetic (4069 against 4068 on some CPUs).
        for j, (t, rank) in enumerate(zip(prompt[1:], s.ranks, strict=True)):
            assert int((lp[j] > lp[j, t] + 1e-5).sum()) < rank <= int((lp[j] >= lp[j, t] - 1e-5).sum()), (j, rank)
        best = lp.topk(3, -1)
        assert [[t for t, _ in row] for row in s.top] == best.indices.tolist()
        assert_close([v for row in s.top for _, v in row], best.values.flatten().tolist(), tol=1e-5)


async def test_prompt_logprobs_from_a_start_are_the_tail_of_the_whole_prompts(tiny_qwen3_path, model, qwen3_tokenizer,
                                                                              prompts):
    """``start`` (one for all, or one a prompt, in batches of 4 with different starts): exactly the tail of
    the lists a call without it gives, from token ``max(start, 1)`` on; a start past the prompt is refused."""
    eng = make_engine(tiny_qwen3_path, model, qwen3_tokenizer, max_batch_size=4)
    try:
        whole = await eng.prompt_logprobs(prompts, top=3)
        starts = [(7 * i) % len(p) for i, p in enumerate(prompts)]
        each = await eng.prompt_logprobs(prompts, top=3, start=starts)
        shared = await eng.prompt_logprobs(prompts, top=3, start=5)
        with pytest.raises(ValueError, match="start must be 0 to"):
            await eng.prompt_logprobs([prompts[0]], start=len(prompts[0]))
    finally:
        await eng.close()
    for w, e, sh, s in zip(whole, each, shared, starts, strict=True):
        cut = max(s, 1) - 1
        assert (e.logprobs, e.ranks, e.top) == (w.logprobs[cut:], w.ranks[cut:], w.top[cut:])
        assert (sh.logprobs, sh.ranks, sh.top) == (w.logprobs[4:], w.ranks[4:], w.top[4:])


async def test_sampled_logprobs_are_temperature_scaled(engine, model, prompts):
    params = SamplingParams(temperature=0.7, max_new_tokens=16, seed=11)
    [gen] = await engine.generate(prompts[1], params)
    assert_close(gen.logprobs, logprob_reference(model, prompts[1], gen.token_ids, temperature=0.7))


async def test_concurrent_batch_equals_solo(tiny_qwen3_path, model, qwen3_tokenizer, prompts):
    solo_engine = make_engine(tiny_qwen3_path, model, qwen3_tokenizer, max_batch_size=1)
    solo = [(await solo_engine.generate(p, GREEDY))[0] for p in prompts]
    solo_sampled = [(await solo_engine.generate(p, SAMPLED))[0] for p in prompts]
    await solo_engine.close()

    # All at once, then staggered so that requests join a batch that is already decoding, with a
    # batch cap that forces queueing.
    for cap, delays in ((32, [0.0] * len(prompts)), (3, [0.0, 0.01, 0.02, 0.05, 0.0, 0.03])):
        eng = make_engine(tiny_qwen3_path, model, qwen3_tokenizer, max_batch_size=cap)

        async def late(prompt, delay, params, eng=eng):
            await asyncio.sleep(delay)
            return (await eng.generate(prompt, params))[0]

        batched = await asyncio.gather(*(late(p, d, GREEDY) for p, d in zip(prompts, delays)))
        # Seeded sampling makes the tokens depend on the whole distribution, not just its argmax.
        sampled = await asyncio.gather(*(late(p, d, SAMPLED) for p, d in zip(prompts, delays)))
        await eng.close()
        for s, b in zip(solo + solo_sampled, batched + sampled):
            assert b.token_ids == s.token_ids
            assert_close(b.logprobs, s.logprobs)


async def test_mixed_lengths_and_sampling_share_a_batch(engine, model, prompts):
    """Greedy and sampled rows with different max_new_tokens decode together; each row stays exact."""
    params = [SamplingParams(temperature=0.0, max_new_tokens=5 + 3 * i) if i % 2 == 0 else
              SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=4 + i, seed=i) for i in range(len(prompts))]
    gens = await asyncio.gather(*(engine.generate(p, sp) for p, sp in zip(prompts, params)))
    for prompt, sp, [gen] in zip(prompts, params, gens):
        assert len(gen.token_ids) == sp.max_new_tokens and gen.finish_reason == "length"
        assert_close(gen.logprobs, logprob_reference(model, prompt, gen.token_ids, sp.temperature))
        if sp.temperature == 0:
            assert gen.token_ids == greedy_reference(model, prompt, sp.max_new_tokens)
    assert engine._batch.rows == []


async def test_finished_long_row_frees_its_columns(engine, model, prompts):
    """When the longest row finishes, the others' left padding is compacted away, exactly."""
    lengths: list[int] = []
    step = engine._step

    def recording_step(*args):
        finished = step(*args)
        lengths.append(engine._batch.length)
        return finished

    engine._step = recording_step
    long_prompt = prompts[5]  # ~200 tokens
    params = [SamplingParams(temperature=0.0, max_new_tokens=3)] + [SAMPLED] * 3
    gens = await asyncio.gather(*(engine.generate(p, sp) for p, sp in zip([long_prompt] + prompts[:3], params)))
    short = max(len(p) for p in prompts[:3]) + SAMPLED.max_new_tokens
    assert max(lengths) >= len(long_prompt) and 0 < min(x for x in lengths if x) <= short
    for prompt, [gen] in zip(prompts[:3], gens[1:]):
        assert_close(gen.logprobs, logprob_reference(model, prompt, gen.token_ids))


async def test_rows_join_and_leave_through_slots_in_place(tiny_qwen3_path, model, qwen3_tokenizer, prompts,
                                                         monkeypatch):
    """A finishing row hands its slot to the last live row and a joining row takes the next free slot,
    both in the running batch's buffers (copying one row's KV, not the batch's), including a newcomer
    longer than the batch (a masked gap in the others); every row stays exact."""
    eng = make_engine(tiny_qwen3_path, model, qwen3_tokenizer, max_batch_size=4)
    in_place = {"_keep": 0, "merge": 0}

    def watch(owner, name):  # the engine's _keep, the running batch's merge
        inner = getattr(owner, name)

        def call(batch, *args):
            before = (batch.keys[0].data_ptr() if batch.keys else None, batch.slots, batch.capacity)
            length, live = batch.length, len(batch.rows)
            result = inner(batch, *args)
            if name == "merge":
                expected = max(length, args[0].length)
                grew = live + len(args[0].rows) > before[1] or expected > before[2]
            else:
                expected, grew = length, False
            # Unless the buffers had to grow, or padding was compacted away, they are the same ones.
            if live and batch.rows and not grew and batch.length == expected:
                assert batch.keys[0].data_ptr() == before[0], name
                in_place[name] += 1
            return result

        monkeypatch.setattr(owner, name, call)

    watch(eng, "_keep")
    watch(KVBatch, "merge")
    order = [0, 3, 4, 1, 5, 2]  # short prompts first, the ~200-token ones join later
    lengths = [3, 9, 5, 14, 7, 11]

    # Request i arrives once the engine has run JOIN[i] steps, and the next step waits for it: rows join a
    # running batch however fast a step is (arrivals 10 ms apart let a fast machine's rows all join in one
    # prefill, then none merges in place).
    JOIN = [0, 1, 2, 4, 6, 8]
    arrived = {n: threading.Event() for n in JOIN[1:]}
    done_steps = 0
    step = eng._step

    def gated(*args):
        nonlocal done_steps
        step(*args)
        done_steps += 1
        if done_steps in arrived:
            assert arrived[done_steps].wait(60)

    eng._step = gated

    async def late(i):
        for _ in range(60_000):  # a minute at most
            if done_steps >= JOIN[i]:
                break
            await asyncio.sleep(0.001)
        assert done_steps >= JOIN[i], f"the engine stopped after {done_steps} steps"
        sp = SamplingParams(temperature=0.0, max_new_tokens=lengths[i])
        queued = asyncio.ensure_future(eng.generate(prompts[order[i]], sp))
        await asyncio.sleep(0)  # the request is in the queue
        if i:
            arrived[JOIN[i]].set()
        return (await queued)[0]

    gens = await asyncio.gather(*(late(i) for i in range(6)))
    await eng.close()
    for i, gen in enumerate(gens):
        prompt = prompts[order[i]]
        assert gen.token_ids == greedy_reference(model, prompt, lengths[i])
        assert_close(gen.logprobs, logprob_reference(model, prompt, gen.token_ids))
    assert in_place["_keep"] and in_place["merge"], in_place


async def test_a_joining_row_that_finishes_at_once_leaves_the_others_exact(tiny_qwen3_path, model, qwen3_tokenizer,
                                                                          prompts):
    """Two requests prefilled together while another decodes, one done at its first token (a stop at
    once, or a budget of one token): the other joins the batch from the prefill's buffers, which keep a
    slot for the finished one. Every request completes, each equal to its greedy reference (joining
    copied the spare slot too and failed the step, and the finished request's answer was lost with it:
    its trajectory waited forever)."""
    eng = make_engine(tiny_qwen3_path, model, qwen3_tokenizer, max_batch_size=4)

    async def request(prompt, tokens, delay=0.0):
        await asyncio.sleep(delay)
        return (await eng.generate(prompt, SamplingParams(temperature=0.0, max_new_tokens=tokens)))[0]

    running = asyncio.ensure_future(request(prompts[0], 40))
    while not eng._batch.rows:  # decoding
        await asyncio.sleep(0.001)
    # Created together: admitted together, into one prefill.
    gens = await asyncio.wait_for(asyncio.gather(running, request(prompts[1], 1), request(prompts[2], 12)), 120)
    await eng.close()
    for prompt, tokens, gen in zip(prompts[:3], (40, 1, 12), gens, strict=True):
        assert gen.token_ids == greedy_reference(model, prompt, tokens)


async def test_a_step_that_fails_late_still_answers_what_it_completed(tiny_qwen3_path, model, qwen3_tokenizer, prompts,
                                                                     monkeypatch):
    """A step that raises after some requests completed in it: those get their results, the rest the
    error; none is left waiting."""
    eng = make_engine(tiny_qwen3_path, model, qwen3_tokenizer, max_batch_size=4)

    def broken(batch, new, *args):
        raise RuntimeError("merge broke")

    monkeypatch.setattr(KVBatch, "merge", broken)
    done, failing = await asyncio.wait_for(asyncio.gather(
        eng.generate(prompts[1], SamplingParams(temperature=0.0, max_new_tokens=1)),
        eng.generate(prompts[2], SamplingParams(temperature=0.0, max_new_tokens=5)), return_exceptions=True), 60)
    await eng.close()
    assert done[0].token_ids == greedy_reference(model, prompts[1], 1)
    assert isinstance(failing, RuntimeError) and "merge broke" in str(failing)


async def test_a_long_turn_is_prefilled_into_a_buffer_that_holds_its_generation(engine, model, prompts, monkeypatch):
    """The prefill buffer has room for the turn's max_new_tokens (a long context's turn is never copied
    to grow), but a short prompt with a large limit reserves at most its own length again."""
    grew = []
    reserve = KVBatch.reserve

    def watching(batch, needed, *args):
        before = batch.capacity
        reserve(batch, needed, *args)
        if batch.capacity != before:
            grew.append((before, batch.capacity))

    monkeypatch.setattr(KVBatch, "reserve", watching)
    long_prompt = prompts[5]  # ~200 tokens
    [gen] = await engine.generate(long_prompt, SamplingParams(temperature=0.0, max_new_tokens=150))
    assert len(gen.token_ids) == 150 and grew == []
    assert_close(gen.logprobs, logprob_reference(model, long_prompt, gen.token_ids))  # one forward
    [gen] = await engine.generate(prompts[4], SamplingParams(temperature=0.0, max_new_tokens=150))
    assert len(gen.token_ids) == 150 and grew and grew[0][0] == len(prompts[4]) + 64


async def test_bfloat16(tiny_qwen3_path, model, prompts):
    eng = TransformersEngine.create(ModelSource(path=tiny_qwen3_path), {"device": "cpu", "dtype": "bfloat16"})
    assert eng.dtype == torch.bfloat16
    [gen] = await eng.generate(prompts[1], SAMPLED)
    assert len(gen.token_ids) == SAMPLED.max_new_tokens
    assert_close(gen.logprobs, logprob_reference(model, prompts[1], gen.token_ids), 0.1)
    await eng.close()


async def test_stop_token_ids(engine, prompts):
    params = SamplingParams(temperature=1.0, max_new_tokens=16, seed=2)
    [free] = await engine.generate(prompts[2], params)
    tokens = free.token_ids
    stop_at = next(i for i in range(3, 16) if tokens[i] not in tokens[:i])
    params = SamplingParams(temperature=1.0, max_new_tokens=16, seed=2, stop_token_ids=[tokens[stop_at], 151645])
    [gen] = await engine.generate(prompts[2], params)
    assert gen.token_ids == tokens[: stop_at + 1]  # the stop token is kept
    assert (gen.finish_reason, gen.stop) == ("stop", tokens[stop_at])
    assert_close(gen.logprobs, free.logprobs[: stop_at + 1], 1e-5)


def _clean_window(tokenizer, tokens, start):
    for k in range(start, len(tokens) - 2):
        text = tokenizer.decode(tokens[k : k + 2])
        if text.strip() and "\ufffd" not in text:
            return k, text
    raise AssertionError("no clean two-token window")


@pytest.mark.parametrize("seed", [3, 4])
async def test_stop_strings(engine, qwen3_tokenizer, prompts, seed):
    params = SamplingParams(temperature=1.0, max_new_tokens=40, seed=seed)
    [free] = await engine.generate(prompts[1], params)
    _, stop = _clean_window(qwen3_tokenizer, free.token_ids, 6)  # spans two tokens
    # Reference: the first prefix whose full decoded text contains the stop string.
    end = next(j for j in range(len(free.token_ids)) if stop in qwen3_tokenizer.decode(free.token_ids[: j + 1]))
    params = SamplingParams(temperature=1.0, max_new_tokens=40, seed=seed, stop_strings=["<never>", stop])
    [gen] = await engine.generate(prompts[1], params)
    assert gen.token_ids == free.token_ids[: end + 1]
    assert (gen.finish_reason, gen.stop) == ("stop_string", stop)
    assert gen.logprobs == pytest.approx(free.logprobs[: end + 1], abs=1e-5)


async def test_stop_string_on_an_added_token(engine, qwen3_tokenizer, prompts):
    """A tag that is one added token (e.g. ``</tool_call>``) stops as a string too."""
    params = SamplingParams(temperature=1.0, max_new_tokens=30, seed=5)
    [free] = await engine.generate(prompts[0], params)
    target = qwen3_tokenizer.decode(free.token_ids[7:8])
    end = next(j for j in range(30) if target in qwen3_tokenizer.decode(free.token_ids[: j + 1]))
    [gen] = await engine.generate(prompts[0], SamplingParams(temperature=1.0, max_new_tokens=30, seed=5,
                                                             stop_strings=[target]))
    assert gen.finish_reason == "stop_string" and gen.token_ids == free.token_ids[: end + 1]


async def test_n_samples_and_seeds_are_reproducible(engine, prompts):
    params = SamplingParams(temperature=1.0, max_new_tokens=10, seed=7)
    first = await engine.generate(prompts[1], params, n=4)
    assert len(first) == 4 and len({tuple(g.token_ids) for g in first}) == 4
    # Same seed alone, and while other requests share the batch: the same samples.
    again, *_ = await asyncio.gather(engine.generate(prompts[1], params, n=4),
                                     engine.generate(prompts[0], SamplingParams(temperature=1.0, seed=1), n=3),
                                     engine.generate(prompts[2], GREEDY))
    assert [g.token_ids for g in again] == [g.token_ids for g in first]
    for a, b in zip(again, first):
        assert_close(a.logprobs, b.logprobs, 1e-5)
    other = await engine.generate(prompts[1], SamplingParams(temperature=1.0, max_new_tokens=10, seed=8), n=4)
    assert [g.token_ids for g in other] != [g.token_ids for g in first]


async def test_tiny_top_p_is_greedy_with_scaled_logprobs(engine, model, prompts):
    [gen] = await engine.generate(prompts[3], SamplingParams(temperature=1.0, top_p=1e-9, max_new_tokens=8, seed=0))
    assert gen.token_ids == greedy_reference(model, prompts[3], 8)
    assert_close(gen.logprobs, logprob_reference(model, prompts[3], gen.token_ids))


async def test_top_p_samples_stay_in_the_nucleus(engine, model, prompts):
    [gen] = await engine.generate(prompts[4], SamplingParams(temperature=1.0, top_p=0.5, max_new_tokens=12, seed=9))
    with torch.no_grad():
        logits = model(torch.tensor([prompts[4] + gen.token_ids])).logits[0, len(prompts[4]) - 1 : -1]
    for step, token in enumerate(gen.token_ids):
        probs, order = torch.softmax(logits[step], -1).sort(descending=True)
        size = int(((probs.cumsum(-1) - probs) < 0.5).sum())
        assert token in order[: size + 1].tolist()  # +1: float rounding at the boundary


def test_inverse_cdf_matches_a_full_cumsum():
    gen = torch.Generator().manual_seed(0)
    vocab = 3 * 1024 + 100  # whole blocks plus a tail
    probs = torch.rand(4, vocab, generator=gen) ** 8
    probs[0, :2048] = 0  # mass only in the last blocks
    probs[1, 1500:] = 0  # mass only in the first blocks
    probs[2] = 0
    probs[2, [5, 1023, 1024, 3100, vocab - 1]] = torch.tensor([0.1, 0.2, 0.3, 0.25, 0.15])
    for _ in range(200):
        u = torch.rand(4, generator=gen, dtype=torch.float64)
        cdf = probs.double().cumsum(-1)
        want = torch.searchsorted(cdf, ((1 - u) * cdf[:, -1])[:, None])[:, 0]
        assert torch.equal(inverse_cdf(probs, u), want)
    # The extremes land on the first and last entries with mass, never on zeros.
    edges = inverse_cdf(probs[2:3].expand(2, -1), torch.tensor([0.0, 1 - 1e-16], dtype=torch.float64))
    assert edges.tolist() == [vocab - 1, 5]


def test_inverse_cdf_frequencies():
    probs = torch.zeros(1, 5000)
    support = torch.tensor([0, 17, 1023, 1024, 2047, 2500, 4096, 4999])
    weights = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0])
    probs[0, support] = weights
    u = torch.rand(40000, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    picks = inverse_cdf(probs.expand(40000, -1), u)
    counts = torch.bincount(picks, minlength=5000).double()
    assert counts.sum() == counts[support].sum()
    tv = 0.5 * (counts[support] / 40000 - weights / weights.sum()).abs().sum()
    assert tv < 0.02


async def test_update_weights(tiny_qwen3_path, qwen3_tokenizer, prompts):
    own = model_sources.load_model(tiny_qwen3_path)
    other = model_sources.load_model(model_sources.tiny_qwen3(seed=1))
    eng = TransformersEngine.create(ModelSource(path=tiny_qwen3_path), {"device": "cpu", "dtype": "float32"})
    try:
        [before] = await eng.generate(prompts[1], SAMPLED)
        assert_close(before.logprobs, logprob_reference(own, prompts[1], before.token_ids))
        eng.update_weights(eng.model.state_dict(keep_vars=True))  # same tensors: nothing to do
        [same] = await eng.generate(prompts[1], SAMPLED)
        assert same.token_ids == before.token_ids
        eng.update_weights(other.state_dict())
        [after] = await eng.generate(prompts[1], SAMPLED)
        assert after.token_ids != before.token_ids
        assert_close(after.logprobs, logprob_reference(other, prompts[1], after.token_ids))
        with pytest.raises(KeyError, match="not_a_weight"):
            eng.update_weights({"not_a_weight": torch.zeros(1)})
    finally:
        await eng.close()


async def test_shared_module_sees_trainer_updates(tiny_qwen3_path, qwen3_tokenizer, prompts):
    module = model_sources.load_model(tiny_qwen3_path)
    eng = make_engine(tiny_qwen3_path, module, qwen3_tokenizer)
    [before] = await eng.generate(prompts[0], SAMPLED)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn_like(p) * 0.05)  # what an optimizer step does
    [after] = await eng.generate(prompts[0], SAMPLED)
    assert after.token_ids != before.token_ids
    assert_close(after.logprobs, logprob_reference(module, prompts[0], after.token_ids))
    await eng.close()


async def _two_turns(eng, prompt, tokenizer, session_id, diverge=False, result="391"):
    [first] = await eng.generate(prompt, GREEDY, session_id=session_id)
    tool_turn = tokenizer.encode(f"<|im_end|>\n<|im_start|>user\n<tool_response>\n{result}\n</tool_response><|im_end|>\n"
                                 "<|im_start|>assistant\n", add_special_tokens=False)
    history = prompt + first.token_ids
    if diverge:  # the next prompt re-renders part of the history differently
        history = history[: len(prompt) - 3] + tokenizer.encode(" changed", add_special_tokens=False)
    second_prompt = history + tool_turn
    [second] = await eng.generate(second_prompt, GREEDY, session_id=session_id)
    return first, second, second_prompt


@pytest.mark.parametrize("diverge", [False, True])
async def test_session_kv_reuse_is_exact(tiny_qwen3_path, model, qwen3_tokenizer, prompts, diverge):
    reuse = make_engine(tiny_qwen3_path, model, qwen3_tokenizer)
    fresh = make_engine(tiny_qwen3_path, model, qwen3_tokenizer, reuse_kv_cache=False)
    a1, a2, p2 = await _two_turns(reuse, prompts[1], qwen3_tokenizer, "traj-0", diverge)
    b1, b2, _ = await _two_turns(fresh, prompts[1], qwen3_tokenizer, "traj-0", diverge)
    assert (a1.token_ids, a2.token_ids) == (b1.token_ids, b2.token_ids)
    assert_close(a2.logprobs, b2.logprobs, 1e-5)
    assert a2.token_ids == greedy_reference(model, p2, 12)
    assert_close(a2.logprobs, logprob_reference(model, p2, a2.token_ids))
    kept = len(prompts[1]) - 3 if diverge else len(prompts[1]) + len(a1.token_ids) - 1
    assert reuse.stats.reused_tokens == kept and fresh.stats.reused_tokens == 0
    # Each generation says what its request did not prefill: the second turn, the kept KV.
    assert (a1.prefill_tokens_saved, a2.prefill_tokens_saved, b2.prefill_tokens_saved) == (0, kept, 0)
    assert reuse.stats.prefilled_tokens == len(prompts[1]) + len(p2) - kept
    await reuse.close()
    await fresh.close()


async def test_sliding_window_layers_see_their_window_by_position(tiny_qwen3_path, windowed, qwen3_tokenizer,
                                                                   prompts):
    """A model whose first layer sees only the 6 positions before each token decodes as full forwards
    do while sessions of different lengths continue together: their rows hold the kept KV, then a gap,
    then the new tokens."""
    module = copy.deepcopy(windowed).eval()
    eng = make_engine(tiny_qwen3_path, module, qwen3_tokenizer)
    results = {0: "391", 1: "the sum of the first forty primes is 4, 1, 0, 9 and more", 3: "7"}
    runs = await asyncio.gather(*(_two_turns(eng, prompts[i], qwen3_tokenizer, f"s{i}", result=results[i])
                                  for i in (0, 1, 3)))
    for prompt, (first, second, p2) in zip((prompts[0], prompts[1], prompts[3]), runs):
        assert first.token_ids == greedy_reference(module, prompt, 12)
        assert second.token_ids == greedy_reference(module, p2, 12)
        assert_close(second.logprobs, logprob_reference(module, p2, second.token_ids))
    assert eng.stats.reused_tokens > 0
    await eng.close()


async def test_session_dropped_on_weight_change_and_end(tiny_qwen3_path, qwen3_tokenizer, prompts):
    module = model_sources.load_model(tiny_qwen3_path)
    eng = make_engine(tiny_qwen3_path, module, qwen3_tokenizer)
    await eng.generate(prompts[0], GREEDY, session_id="a")
    with torch.no_grad():
        next(module.parameters()).mul_(1.0)  # an in-place write, even one that changes nothing
    await _two_turns(eng, prompts[0], qwen3_tokenizer, "a")
    assert eng.stats.reused_tokens == len(prompts[0]) + 11  # only the second turn of _two_turns reused
    eng.end_session("a")
    [gen] = await eng.generate(prompts[0] + [13, 14], GREEDY, session_id="a")
    assert eng.stats.reused_tokens == len(prompts[0]) + 11
    await eng.close()


async def test_event_loop_keeps_running_during_generation(engine, prompts):
    ticks = 0
    done = asyncio.Event()

    async def ticker():
        nonlocal ticks
        while not done.is_set():
            await asyncio.sleep(0.001)
            ticks += 1

    task = asyncio.create_task(ticker())
    await asyncio.gather(*(engine.generate(p, SamplingParams(temperature=1.0, max_new_tokens=48, seed=1))
                           for p in prompts))
    done.set()
    await task
    assert ticks >= 20  # the loop ran between (and during) the ~50 decode steps


async def test_cancelled_request_leaves_others_intact(engine, model, prompts):
    long = asyncio.create_task(engine.generate(prompts[2], SamplingParams(temperature=0.0, max_new_tokens=400)))
    short = asyncio.create_task(engine.generate(prompts[0], GREEDY))
    await asyncio.sleep(0.05)
    long.cancel()
    [gen] = await short
    assert gen.token_ids == greedy_reference(model, prompts[0], 12)
    with pytest.raises(asyncio.CancelledError):
        await long
    [again] = await engine.generate(prompts[1], GREEDY)
    assert again.token_ids == greedy_reference(model, prompts[1], 12)
    assert engine._batch.rows == []


def test_engine_survives_a_new_event_loop(tiny_qwen3_path, model, qwen3_tokenizer, prompts):
    eng = make_engine(tiny_qwen3_path, model, qwen3_tokenizer)
    first = asyncio.run(eng.generate(prompts[0], GREEDY))
    second = asyncio.run(eng.generate(prompts[0], GREEDY))
    assert first[0].token_ids == second[0].token_ids
    asyncio.run(eng.close())


async def test_edge_cases(engine, prompts):
    empty = await engine.generate(prompts[0], SamplingParams(max_new_tokens=0), n=2)
    assert [(g.token_ids, g.finish_reason) for g in empty] == [([], "length")] * 2
    [one] = await engine.generate(prompts[0], SamplingParams(temperature=0.0, max_new_tokens=1))
    assert len(one.token_ids) == 1 and one.finish_reason == "length"
    with pytest.raises(ValueError, match="empty"):
        await engine.generate([], GREEDY)
    # The data check's wording (toolrl.rollout.context_check), one line.
    with pytest.raises(ValueError, match=r"^prompt: 40,000 tokens; the model's context is [\d,]+ "
                                         r"\(the engine's max_model_len\), so no response fits$"):
        await engine.generate([1] * 40000, GREEDY)


async def test_max_model_len_cuts_generation(tiny_qwen3_path, model, qwen3_tokenizer, prompts):
    eng = make_engine(tiny_qwen3_path, model, qwen3_tokenizer, max_model_len=len(prompts[0]) + 5)
    [gen] = await eng.generate(prompts[0], GREEDY)
    assert len(gen.token_ids) == 5 and gen.finish_reason == "length"
    await eng.close()


def test_config_is_validated(tiny_qwen3_path, model):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="max_batch_szie"):
        TransformersEngine.create(ModelSource(path=tiny_qwen3_path, module=model), {"max_batch_szie": 4})
    with pytest.raises(ValidationError):
        TransformersEngine.create(ModelSource(path=tiny_qwen3_path, module=model), {"device": "tpu"})


def test_registered_as_builtin():
    from toolrl.plugins import get_plugins

    assert get_plugins().load_part("rollout_engines", "transformers") is TransformersEngine
    assert get_plugins().load_part("rollout_engines", "hf") is TransformersEngine


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
async def test_cuda_matches_cpu(tiny_qwen3_path, prompts):
    cpu = TransformersEngine.create(ModelSource(path=tiny_qwen3_path), {"device": "cpu"})
    gpu = TransformersEngine.create(ModelSource(path=tiny_qwen3_path), {"device": "cuda"})
    assert gpu.device.type == "cuda"
    a = await asyncio.gather(*(cpu.generate(p, GREEDY) for p in prompts))
    b = await asyncio.gather(*(gpu.generate(p, GREEDY) for p in prompts))
    for [x], [y] in zip(a, b):
        assert x.token_ids == y.token_ids
        assert_close(x.logprobs, y.logprobs, 1e-3)
    await cpu.close()
    await gpu.close()


async def test_a_groups_shared_prompt_is_prefilled_once(tiny_qwen3_path, model, qwen3_tokenizer, prompts):
    """A group's trajectories arrive as n separate requests (own sessions, own seeds) with one prompt:
    it is prefilled once and its KV forked, with the samples of prefilling it for each."""
    runs = {}
    for share in (True, False):
        eng = make_engine(tiny_qwen3_path, model, qwen3_tokenizer, share_prompts=share)
        requests = [eng.generate(prompts[5], SamplingParams(temperature=1.0, max_new_tokens=8, seed=s),
                                 session_id=f"t{s}") for s in range(4)]
        out = await asyncio.gather(*requests, eng.generate(prompts[1], GREEDY, session_id="other"))
        runs[share] = ([g for [g] in out], eng.stats)
        await eng.close()
    (shared, stats), (unshared, plain) = runs[True], runs[False]
    assert [g.token_ids for g in shared] == [g.token_ids for g in unshared]
    assert len({tuple(g.token_ids) for g in shared[:4]}) == 4  # four different samples of one prefill
    for a, b in zip(shared, unshared):
        assert_close(a.logprobs, b.logprobs, 1e-5)
    assert stats.prefilled_tokens == len(prompts[5]) + len(prompts[1])
    assert stats.prefill_tokens_saved == 3 * len(prompts[5])
    assert plain.prefilled_tokens == 4 * len(prompts[5]) + len(prompts[1]) and plain.prefill_tokens_saved == 0
    # Per generation: three of the group read the first one's prefill.
    assert sorted(g.prefill_tokens_saved for g in shared) == [0, 0, *[len(prompts[5])] * 3]
    assert [g.prefill_tokens_saved for g in unshared] == [0] * 5
