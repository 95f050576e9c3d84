"""Bad clients against one served instance (the team server of conftest.py), through the official SDK
where it can send the request and raw HTTP where it cannot: bodies that are not what they claim, every
number out of its range, a request past its time bound, a key queueing 200 futures, a client killed
mid-request. Each is answered in the SDK's error shape, nothing the client saved is lost, its training
client trains on (or its saved state loads), and the other clients are unharmed. A restart while
requests run: tests/test_state.py; sessions timing out: test_sessions_time_out below."""

from __future__ import annotations

import asyncio
import math
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from conftest import BASE, FLOOD_KEY, GONE_KEY, KEY, OTHER_KEY, TEAM, held, limited, on_loop
from test_team import scrape, value
from toolrl_tinker.service import owner_of

CLIENTS = Path(__file__).parent / "clients"


def _datum(n: int = 6, **inputs: Any) -> Any:
    from tinker import types

    tokens = list(range(30, 30 + n + 1))
    given = {"target_tokens": np.array(tokens[1:], np.int64), "weights": np.ones(n, np.float32), **inputs}
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                       loss_fn_inputs={k: v for k, v in given.items() if v is not None})


def _rl(n: int = 6, logprobs: float = -2.0, advantages: float = 1.0) -> Any:
    return _datum(n, weights=None, logprobs=np.full(n, logprobs, np.float32), advantages=np.full(n, advantages, np.float32))


@pytest.fixture(scope="module")
def service(team: Any) -> Any:
    import tinker

    return tinker.ServiceClient(base_url=team.url, api_key=KEY)


@pytest.fixture(scope="module")
def trainer(service: Any) -> Any:
    return service.create_lora_training_client(base_model=BASE, rank=2, seed=3).result()


def _fails(call: Any, *words: str) -> None:
    import tinker

    with pytest.raises((tinker.RequestFailedError, tinker.BadRequestError)) as info:
        call()
    assert all(w in str(info.value) for w in words), str(info.value)


def _trains_on(team: Any, tc: Any) -> None:
    """The client's next step works and leaves its adapter finite; another key's request is served."""
    import tinker
    from tinker import types

    tc.forward_backward([_datum()], "cross_entropy").result()
    tc.optim_step(types.AdamParams(learning_rate=1e-3)).result()
    run, trainer = held(team, tc.model_id)
    assert all(bool(t.isfinite().all()) for t in trainer.adapter_state(run).values())
    other = tinker.ServiceClient(base_url=team.url, api_key=OTHER_KEY).create_sampling_client(base_model=BASE)
    assert len(other.sample(types.ModelInput.from_ints([5, 6]), 1, types.SamplingParams(max_tokens=2)).result()
               .sequences[0].tokens) == 2


def test_bodies_that_are_not_what_they_claim(team: Any, trainer: Any) -> None:
    import zstandard

    url, key = f"{team.url}/api/v1", {"X-API-Key": KEY}

    def post(route: str, body: bytes, **headers: str) -> httpx.Response:
        return httpx.post(f"{url}/{route}", content=body, headers={**key, **headers})

    for answer, says in ((post("forward_backward", b"\x0a\xff\xff garbage"), "not a ForwardBackwardRequest protobuf"),
                         (post("forward_backward", b"garbage", **{"content-encoding": "zstd"}), "not a zstd body"),
                         (post("forward_backward", zstandard.ZstdCompressor().compress(bytes(2 << 20)),
                               **{"content-encoding": "zstd"}), "decompresses past"),
                         (post("forward_backward", b"x", **{"content-encoding": "br"}), "takes zstd or none"),
                         (post("create_model", b"{not json"), "Expecting property name"),
                         (post("create_model", b"[1, 2]"), "CreateModelRequest"),
                         (post("create_model", b'{"session_id": "s-not-mine", "model_seq_id": 0, "base_model": '
                               b'"tiny-qwen3", "lora_config": {"rank": 2}}'), "unknown session")):
        assert answer.status_code == 400 and says in answer.json()["error"], (answer.status_code, answer.text)
        assert answer.json()["category"] == "user"
    over = post("forward_backward", bytes(2 << 20))
    assert over.status_code == 413 and "max-request-bytes" in over.json()["error"]

    # A client killed mid-upload: nothing is made, the server goes on.
    running = dict(team.service.futures.running)
    with socket.create_connection(("127.0.0.1", int(team.url.rsplit(":", 1)[1]))) as raw:
        raw.sendall(f"POST /api/v1/forward_backward HTTP/1.1\r\nHost: x\r\nX-API-Key: {KEY}\r\n"
                    "Content-Length: 100000\r\n\r\n".encode() + b"\x0a" * 100)
    from test_team import scrape, value

    deadline = time.time() + 30
    while not value(scrape(team.url), "tinker_http_requests_total", route="forward_backward", code="499"):
        assert time.time() < deadline, "the server never saw the client go"
        time.sleep(0.1)
    _fails(lambda: trainer.save_state("../../outside").result(), "checkpoint name '../../outside'")
    assert not list(Path(team.service.store.root).parent.glob("outside*"))
    assert dict(team.service.futures.running) == running
    _trains_on(team, trainer)


def test_a_forward_backward_refused_as_it_is_read_takes_its_turn(team: Any, trainer: Any) -> None:
    """A body refused while it is read (an image chunk: this server takes tokens) takes its training client's
    turn all the same: the client's next request runs now, not after the 30 s wait for a seq_id that never
    comes, and no gap is counted."""
    from tinker import types

    image = types.ModelInput(chunks=[types.ImageChunk(data=b"\x89PNG", format="png", expected_tokens=4)])
    given = {"target_tokens": np.arange(4, dtype=np.int64), "weights": np.ones(4, np.float32)}
    _fails(lambda: trainer.forward_backward([types.Datum(model_input=image, loss_fn_inputs=given)],
                                            "cross_entropy").result(), "only token chunks")
    trainer.forward_backward([_datum()], "cross_entropy").result(timeout=15)
    assert not value(scrape(team.url), "tinker_seq_gaps_total", key=owner_of(KEY))


def test_a_seq_id_never_sent_is_waited_for_then_skipped_and_counted(team: Any, service: Any, caplog: Any,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A request sent past a seq_id its client never sends waits for it (GAP_S, shortened here), then runs;
    the server logs the seq_id and counts the gap."""
    from toolrl_tinker import futures

    monkeypatch.setattr(futures, "GAP_S", 1.0)
    trainer = service.create_lora_training_client(base_model=BASE, rank=2).result()
    skipped = team.service.runs.order[trainer.model_id].next
    before = value(scrape(team.url), "tinker_seq_gaps_total", key=owner_of(KEY))
    sent = time.monotonic()
    answer = httpx.post(f"{team.url}/api/v1/optim_step", headers={"X-API-Key": KEY},
                        json={"model_id": trainer.model_id, "seq_id": skipped + 1, "adam_params": {"learning_rate": 0.0}})
    assert answer.status_code == 200, answer.text
    done = httpx.post(f"{team.url}/api/v1/retrieve_future", headers={"X-API-Key": KEY},
                      json={"request_id": answer.json()["request_id"]}, timeout=60)
    assert done.status_code == 200 and "metrics" in done.json(), done.text
    assert 1.0 <= time.monotonic() - sent < 15
    assert value(scrape(team.url), "tinker_seq_gaps_total", key=owner_of(KEY)) == before + 1
    assert f"{trainer.model_id}: seq_id {skipped} never came" in caplog.text
    _trains_on(team, trainer)  # the SDK's next seq_id (the skipped one) comes late and runs


def test_a_request_far_over_the_limits(team: Any, trainer: Any) -> None:
    """One datum over --max-batch-tokens is refused naming the limit; several under it that are over it
    together are sent by the SDK in pieces the server takes (the chunk size its client_config gives)."""
    import tinker

    with limited(team, max_batch_tokens=64):
        tc = tinker.ServiceClient(base_url=team.url, api_key=KEY).create_lora_training_client(base_model=BASE, rank=2)
        out = tc.result().forward_backward([_datum(40), _datum(40), _datum(40)], "cross_entropy").result()
        assert len(out.loss_fn_outputs) == 3
        _fails(lambda: trainer.forward_backward([_datum(100)], "cross_entropy").result(),
               "the batch holds 100 tokens, over this server's limit of 64")
    context = team.service.bases[BASE].trainer.context
    with limited(team, max_batch_tokens=2 * context, max_tokens_per_client=2 * context):
        _fails(lambda: trainer.forward_backward([_datum(context + 1)], "cross_entropy").result(),
               f"datum 0: model_input holds {context + 1} tokens, beyond the model's context of {context}")


def test_numbers_out_of_range(team: Any, service: Any, trainer: Any) -> None:
    """Each answered naming the number; a forward_backward whose loss overflows leaves the run's
    gradients as they were."""
    from tinker import types

    fb = trainer.forward_backward
    _fails(lambda: fb([_datum(weights=np.array([1, 1, math.nan, 1, 1, 1], np.float32))], "cross_entropy").result(),
           "loss_fn_inputs['weights'] holds nan at position 2")
    _fails(lambda: fb([_rl(advantages=math.inf)], "importance_sampling").result(), "['advantages'] holds inf")
    _fails(lambda: fb([_rl(logprobs=-math.inf)], "ppo").result(), "['logprobs'] holds -inf")
    _fails(lambda: fb([_rl()], "ppo", {"clip_low_threshold": math.nan}).result(), "clip_low_threshold=nan")
    run, base = held(team, trainer.model_id)
    fb([_datum()], "cross_entropy").result()  # a gradient to keep
    before = base.gradients(run)
    _fails(lambda: fb([_rl(logprobs=-1e30)], "importance_sampling").result(), "the loss of this request is")
    assert all(torch.equal(g, before[k]) for k, g in base.gradients(run).items())

    # The SDK sends a NaN or infinity as null; a client sending JSON's NaN meets the finite check.
    for params, says in ((types.AdamParams(learning_rate=math.nan), "learning_rate: Input should be a valid number"),
                         (types.AdamParams(learning_rate=math.inf), "learning_rate: Input should be a valid number"),
                         (types.AdamParams(learning_rate=-1.0), "lr"),
                         (types.AdamParams(learning_rate=1e-3, beta1=1.0), "betas"),
                         (types.AdamParams(learning_rate=1e-3, eps=0.0), "eps"),
                         (types.AdamParams(learning_rate=1e-3, weight_decay=-0.1), "weight_decay"),
                         (types.AdamParams(learning_rate=1e-3, grad_clip_norm=math.nan), "grad_clip_norm")):
        _fails(lambda params=params: trainer.optim_step(params).result(), says)
    # Each refused step took its turn: the client's next request runs now, not after the gap wait (30 s).
    trainer.forward_backward([_datum()], "cross_entropy").result(timeout=15)
    raw = httpx.post(f"{team.url}/api/v1/optim_step", headers={"X-API-Key": KEY},
                     content=f'{{"model_id": "{trainer.model_id}", "adam_params": {{"learning_rate": NaN}}}}')
    assert raw.status_code == 400 and "learning_rate=nan: not a finite number" in raw.json()["error"], raw.text

    sampler = service.create_sampling_client(base_model=BASE)
    prompt = types.ModelInput.from_ints([5, 6, 7])
    context = team.service.bases[BASE].sampler.context
    for args, says in (((prompt, 1, types.SamplingParams(max_tokens=0)), "max_tokens 0"),
                       ((prompt, 1, types.SamplingParams(max_tokens=context)), f"context of {context}"),
                       ((types.ModelInput.from_ints([]), 1, types.SamplingParams(max_tokens=2)), "prompt: it is empty"),
                       ((prompt, 0, types.SamplingParams(max_tokens=2)), "num_samples 0"),
                       ((prompt, 1, types.SamplingParams(max_tokens=2, temperature=-1.0)), "temperature -1.0"),
                       ((prompt, 1, types.SamplingParams(max_tokens=2, top_p=0.0)), "top_p 0.0"),
                       ((prompt, 1, types.SamplingParams(max_tokens=2, top_p=1.5)), "top_p 1.5")):
        _fails(lambda args=args: sampler.sample(*args).result(), says)
    raw = httpx.post(f"{team.url}/api/v1/asample", headers={"X-API-Key": KEY},  # the SDK sends no NaN: another client
                     content=f'{{"base_model": "{BASE}", "prompt": {prompt.model_dump_json()}, "num_samples": 1, '
                             '"sampling_params": {"max_tokens": 2, "temperature": NaN}}')
    assert raw.status_code == 400 and "temperature nan" in raw.json()["error"], raw.text
    _fails(lambda: sampler.sample(prompt, 1, types.SamplingParams(max_tokens=2), include_prompt_logprobs=True,
                                  topk_prompt_logprobs=-1).result(), "topk_prompt_logprobs -1")
    _fails(lambda: service.create_lora_training_client(base_model=BASE, rank=0).result(), "rank 0")
    _fails(lambda: service.create_lora_training_client(base_model=BASE, rank=2, seed=1 << 70).result(), "seed")
    _trains_on(team, trainer)


def test_a_request_past_its_time_bound(team: Any, service: Any, trainer: Any) -> None:
    """A forward_backward that holds its base past --request-timeout stops between micro-batches, its
    gradient not kept; a sample past it is cancelled. Both fail naming the bound."""
    from tinker import types

    run, base = held(team, trainer.model_id)
    trainer.forward_backward([_datum()], "cross_entropy").result()
    before = base.gradients(run)
    with limited(team, request_timeout=1e-6, micro_batch_tokens=8):
        _fails(lambda: trainer.forward_backward([_datum()] * 8, "cross_entropy").result(),
               "past this server's bound of 1e-06 s per request", "7 of its 8 datums left")
        _fails(lambda: service.create_sampling_client(base_model=BASE).sample(
            types.ModelInput.from_ints([5, 6]), 1, types.SamplingParams(max_tokens=200)).result(),
            "sample ran past this server's bound")
    assert all(torch.equal(g, before[k]) for k, g in base.gradients(run).items())
    _trains_on(team, trainer)


def test_a_long_request_shares_its_base(team: Any) -> None:
    """A request of many micro-batches takes its base one micro-batch at a time: a request that came after
    it, from another key, ends while it still runs."""
    import tinker

    turns = team.service.bases[BASE].turns

    def queued(n: int) -> None:
        deadline = time.time() + 30
        while turns.waiting < n and time.time() < deadline:
            time.sleep(0.02)
        assert turns.waiting == n

    # One request (the SDK's chunk size follows --max-batch-tokens) of 16 micro-batches.
    with limited(team, micro_batch_tokens=100, max_batch_tokens=1 << 14):
        long = tinker.ServiceClient(base_url=team.url, api_key=FLOOD_KEY).create_lora_training_client(base_model=BASE, rank=2)
        short = tinker.ServiceClient(base_url=team.url, api_key=OTHER_KEY).create_lora_training_client(base_model=BASE, rank=2)
        long_tc, short_tc = long.result(), short.result()
        with turns.turn():  # both wait on the base, the long one first
            first = long_tc.forward_backward([_datum(100)] * 16, "cross_entropy")
            queued(1)
            second = short_tc.forward_backward([_datum()], "cross_entropy")
            queued(2)
        second.result()
        assert team.service.futures.running[owner_of(FLOOD_KEY)] == 1  # the long one has micro-batches left
        assert len(first.result().loss_fn_outputs) == 16


def test_an_unclaimed_result_is_forgotten(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A result nobody retrieves (its client gone) leaves memory after futures.UNCLAIMED_S."""
    from toolrl_tinker import futures
    from toolrl_tinker.metrics import Metrics
    from toolrl_tinker.store import Store

    monkeypatch.setattr(futures, "UNCLAIMED_S", 0.05)

    async def scenario() -> None:
        kept = futures.Futures(Store(tmp_path), Metrics())
        request_id, _ = kept.new("me", tokens=5)
        assert (kept.running["me"], kept.tokens["me"]) == (1, 5)
        kept.finish(request_id, b"{}", "application/json")
        assert (kept.running["me"], kept.tokens["me"]) == (0, 0)
        await asyncio.sleep(0.2)
        with pytest.raises(KeyError):
            await kept.wait(request_id, "me")

    asyncio.run(scenario())


def test_a_key_queueing_200_futures(team: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """One key sends 200 requests at once, over its quota of 16: the SDK sends the rest as the quota
    frees (429s), every result comes back right and in order, and another key's request meanwhile is
    served as soon as the base is free, not after the flood."""
    import tinker
    from tinker import types

    flood = tinker.ServiceClient(base_url=team.url, api_key=FLOOD_KEY).create_lora_training_client(base_model=BASE, rank=2)
    tc = flood.result()
    other = tinker.ServiceClient(base_url=team.url, api_key=OTHER_KEY).create_lora_training_client(base_model=BASE, rank=2)
    other_tc = other.result()
    expected = tc.forward([_datum()], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].data
    # When the server took each request and when it ended it, and whose: a client's own wait for its result
    # says nothing of the order in which the server served two keys.
    kept = team.service.futures
    new, finish = kept.new, kept.finish
    took: dict[str, tuple[str, float]] = {}
    ended: dict[str, float] = {}

    def taking(owner: str, *args: Any, **kwargs: Any) -> tuple[str, Any]:
        request_id, fut = new(owner, *args, **kwargs)
        took[request_id] = (owner, time.monotonic())
        return request_id, fut

    def ending(request_id: str, *args: Any) -> None:
        ended[request_id] = time.monotonic()
        finish(request_id, *args)

    monkeypatch.setattr(kept, "new", taking)
    monkeypatch.setattr(kept, "finish", ending)
    futures = [tc.forward([_datum()], "cross_entropy") for _ in range(200)]
    other_tc.forward([_datum()], "cross_entropy").result()
    outputs = [f.result() for f in futures]
    assert all(o.loss_fn_outputs[0]["logprobs"].data == expected for o in outputs)
    flood_ends = sorted(ended[r] for r, (key, _) in took.items() if key == owner_of(FLOOD_KEY))
    [(other_taken, other_done)] = [(t, ended[r]) for r, (key, t) in took.items() if key == owner_of(OTHER_KEY)]
    assert len(flood_ends) == 200
    assert other_done < flood_ends[-1], "the other key's request was served after the flood"
    # As soon as the base was free: while it was at the server it waited on the flood's request on the base
    # (a request or two: turns go first come, first served), not on the flood's queue (up to its quota).
    waited_on = sum(other_taken < t < other_done for t in flood_ends)
    assert waited_on < TEAM["max_futures_per_client"], f"the other key's request waited on {waited_on} of the flood's"
    samples = scrape(team.url)
    assert value(samples, "tinker_quota_refusals_total", key=owner_of(FLOOD_KEY), quota="futures") > 0
    assert value(samples, "tinker_quota_refusals_total", key=owner_of(OTHER_KEY), quota="futures") == 0
    assert team.service.futures.running[owner_of(FLOOD_KEY)] == 0
    tc.optim_step(types.AdamParams(learning_rate=1e-3)).result()


def test_a_client_killed_mid_request(team: Any) -> None:
    """Its requests in the queue run (and end: its quota is free again), the other clients are served,
    its session ends when its heartbeats stop (the timer's end, called here), its training client
    leaves memory, and its saved state loads into a new client bit for bit."""
    import tinker

    me = owner_of(GONE_KEY)
    env = {**os.environ, "TINKER_API_KEY": GONE_KEY}
    proc = subprocess.Popen([sys.executable, str(CLIENTS / "killed.py"), team.url], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdin is not None
    lines: dict[str, str] = {}

    def read_until(word: str) -> None:
        while word not in lines:
            line = proc.stdout.readline()
            assert line, proc.stderr.read() if proc.stderr else ""
            first, _, rest = line.strip().partition(" ")
            lines[first] = rest

    read_until("model")
    with team.service.bases[BASE].turns.turn():  # the base busy: the client's requests wait in the queue
        proc.stdin.write("go\n")
        proc.stdin.flush()
        read_until("sent")
        deadline = time.time() + 30
        while team.service.futures.running[me] < 2 and time.time() < deadline:
            time.sleep(0.05)
        assert team.service.futures.running[me] == 2
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    deadline = time.time() + 60
    while team.service.futures.running[me] and time.time() < deadline:
        time.sleep(0.05)
    assert team.service.futures.running[me] == 0  # its requests ran to their end

    model_id = lines["model"]
    run, trainer = held(team, model_id)
    session = model_id.split(":")[0]
    on_loop(team, team.service.sessions.end, session, "timed_out")
    assert model_id not in team.service.runs and not team.service.sessions.owners.get(session)
    from toolrl.modeling.adapter_routing import adapter_names

    assert run.adapter not in adapter_names(trainer.ranks.model)
    gone = httpx.post(f"{team.url}/api/v1/session_heartbeat", json={"session_id": session},
                      headers={"X-API-Key": GONE_KEY})
    assert gone.status_code == 410

    saved = torch.load(team.service.store.checkpoint(lines["saved"])["file"], weights_only=True)["adapter"]
    again = tinker.ServiceClient(base_url=team.url, api_key=GONE_KEY).create_training_client_from_state(lines["saved"])
    loaded, trainer = held(team, again.result().model_id)
    assert all(torch.equal(saved[k], v) for k, v in trainer.adapter_state(loaded).items())
    _trains_on(team, again.result())


def test_sessions_time_out() -> None:
    """A session lives while heartbeats come, ends ``timeout`` seconds after the last, and a heartbeat
    then is answered as gone."""
    from toolrl_tinker.sessions import SessionGone, Sessions

    async def scenario() -> list[tuple[str, str]]:
        ended: list[tuple[str, str]] = []

        async def on_end(session_id: str, reason: str) -> None:
            ended.append((session_id, reason))

        sessions = Sessions(0.2, on_end)
        alive, closed = sessions.create("me"), sessions.create("me")
        await sessions.end(closed)
        for _ in range(5):  # a heartbeat every 0.1 s for 0.5 s: alive past its timeout
            await asyncio.sleep(0.1)
            sessions.heartbeat("me", alive)
        assert ended == [(closed, "closed")]
        await asyncio.sleep(0.4)
        with pytest.raises(SessionGone):
            sessions.heartbeat("me", alive)
        return ended

    session_ids = asyncio.run(scenario())
    assert [reason for _, reason in session_ids] == ["closed", "timed_out"]
