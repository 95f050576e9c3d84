"""A server a team runs, through the official SDK: its metrics (``GET /metrics``, the Prometheus text
format, every name in docs/tinker.md), each key's quotas (what the SDK does when it meets one), the
checkpoints kept (the latest K per run, TTLs set on save and through the rest client's TTL call, then
expired), and a hosted model's name offered on local weights."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from conftest import BASE, HOSTED, KEY, OTHER_KEY, TEAM, limited, on_loop
from toolrl_tinker.service import owner_of

DOCS = Path(__file__).resolve().parents[3] / "docs" / "tinker.md"
LINE = re.compile(r'([a-z_]+)(?:\{((?:[a-z_]+="(?:[^"\\]|\\.)*",?)*)\})? (-?[0-9.e+]+|\+Inf|NaN)')


def scrape(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """``GET /metrics`` (no key) parsed, every line checked against the text format."""
    text = httpx.get(f"{url}/metrics").text
    samples = {}
    for line in text.splitlines():
        if line.startswith("# ") or not line:
            continue
        found = LINE.fullmatch(line)
        assert found, line
        labels = frozenset(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', found.group(2) or ""))
        samples[found.group(1), labels] = float(found.group(3))
    return samples


def value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def _datum(n: int = 6) -> Any:
    from tinker import types

    tokens = list(range(11, 11 + n + 1))
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                       loss_fn_inputs={"target_tokens": np.array(tokens[1:], np.int64), "weights": np.ones(n, np.float32)})


@pytest.fixture(scope="module")
def service(team: Any) -> Any:
    import tinker

    return tinker.ServiceClient(base_url=team.url, api_key=KEY)


def test_metrics_count_what_clients_do(team: Any, service: Any) -> None:
    from tinker import types
    from toolrl_tinker.metrics import FAMILIES

    me = owner_of(KEY)
    before = scrape(team.url)
    tc = service.create_lora_training_client(base_model=BASE, rank=2).result()
    tc.forward_backward([_datum(7)], "cross_entropy").result()
    tc.optim_step(types.AdamParams(learning_rate=1e-3)).result()
    sampler = tc.save_weights_and_get_sampling_client().result()
    out = sampler.sample(types.ModelInput.from_ints([5, 6, 7]), 2, types.SamplingParams(max_tokens=5, seed=3)).result()
    after = scrape(team.url)

    def grew(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert grew("tinker_trained_tokens_total", base=BASE, key=me) == 7
    assert grew("tinker_sampled_tokens_total", base=BASE, key=me) == sum(len(s.tokens) for s in out.sequences)
    assert grew("tinker_requests_total", kind="forward_backward", outcome="ok", key=me) == 1
    assert grew("tinker_requests_total", kind="asample", outcome="ok", key=me) == 1
    assert grew("tinker_request_duration_seconds_count", kind="forward_backward") == 1
    assert grew("tinker_http_requests_total", route="forward_backward", code="200") == 1
    assert value(after, "tinker_key_training_clients", key=me) >= 1 and value(after, "tinker_sessions") >= 1
    assert value(after, "tinker_process_resident_memory_bytes") > 1e7
    for part in ("weights", "adapters", "optimizer"):
        assert value(after, "tinker_base_memory_bytes", base=BASE, copy="trainer", part=part) > 0
    assert value(after, "tinker_base_memory_bytes", base=BASE, copy="sampler", part="adapters") > 0
    assert {re.sub(r"_(bucket|sum|count)$", "", name) for name, _ in after} <= set(FAMILIES)
    assert not any(name == "tinker_http_requests_total" and dict(labels)["code"].startswith("5") for name, labels in after)

    # The queue depth: a request waiting for its turn on the base.
    with team.service.bases[BASE].turns.turn():
        pending = tc.forward_backward([_datum()], "cross_entropy")
        deadline = time.time() + 30
        while team.service.bases[BASE].turns.waiting < 1 and time.time() < deadline:
            time.sleep(0.05)
        held = scrape(team.url)
    pending.result()
    assert value(held, "tinker_requests_in_flight", kind="forward_backward") == 1
    assert value(held, "tinker_trainer_waiting", base=BASE) == 1
    assert value(held, "tinker_key_tokens_in_flight", key=me) == 6


def test_docs_name_every_metric() -> None:
    """docs/tinker.md's table of metrics is the list the server writes (toolrl_tinker.metrics.FAMILIES)."""
    from toolrl_tinker.metrics import FAMILIES

    section = DOCS.read_text().split("### Metrics", 1)[1].split("\n## ", 1)[0]
    documented = {m.group(1): m.group(2) for m in re.finditer(r"^\| `(tinker_[a-z_]+)` \| (\w+) \|", section, re.M)}
    assert documented == {name: kind for name, (kind, _) in FAMILIES.items()}


def test_quotas(team: Any, service: Any) -> None:
    """Over a key's quota for now: 429 with Retry-After, which the SDK waits out (sampling and training
    clients alike), the other keys untouched; a request that could never fit, and a training client
    too many, are BadRequestError at once."""
    import tinker
    from tinker import types

    tc = service.create_lora_training_client(base_model=BASE, rank=2).result()
    sampler = service.create_sampling_client(base_model=BASE)
    prompt = types.ModelInput.from_ints([5, 6, 7])
    with pytest.raises(tinker.BadRequestError, match="over this server's limit of 8192 tokens in flight"):
        sampler.sample(prompt, 4, types.SamplingParams(max_tokens=4000)).result()
    held = sum(r.owner == owner_of(KEY) for r in team.service.runs.values())
    with limited(team, max_runs_per_client=held), pytest.raises(tinker.BadRequestError, match="max-runs-per-client"):
        service.create_lora_training_client(base_model=BASE, rank=2).result()

    quota = TEAM["max_futures_per_client"]
    with team.service.bases[BASE].turns.turn():  # the base busy: this key's requests queue up to its quota
        queued = [tc.forward([_datum()], "cross_entropy") for _ in range(quota)]
        deadline = time.time() + 30
        while team.service.futures.running[owner_of(KEY)] < quota and time.time() < deadline:
            time.sleep(0.05)
        refused = httpx.post(f"{team.url}/api/v1/asample", headers={"X-API-Key": KEY},
                             json={"base_model": BASE, "prompt": prompt.model_dump(mode="json"), "num_samples": 1,
                                   "sampling_params": {"max_tokens": 2}})
        assert refused.status_code == 429 and refused.headers["retry-after-ms"] == "250"
        assert "max-futures-per-client" in refused.json()["error"] and refused.json()["category"] == "user"
        waiting = {}
        sdk = threading.Thread(target=lambda: waiting.setdefault("out", sampler.sample(
            prompt, 1, types.SamplingParams(max_tokens=2, seed=0)).result()))
        sdk.start()
        other = tinker.ServiceClient(base_url=team.url, api_key=OTHER_KEY).create_sampling_client(base_model=BASE)
        other.sample(prompt, 1, types.SamplingParams(max_tokens=2, seed=0)).result()  # another key is not held back
        sdk.join(1.0)
        assert sdk.is_alive()  # the SDK waits while the quota is full
    sdk.join(60)
    assert len(waiting["out"].sequences[0].tokens) == 2
    assert all(len(f.result().loss_fn_outputs) == 1 for f in queued)


def test_checkpoints_kept_latest_and_expired(team: Any, service: Any) -> None:
    import tinker
    from tinker import types

    rest = tinker.RestClient(base_url=team.url, api_key=KEY)
    tc = service.create_lora_training_client(base_model=BASE, rank=2).result()
    paths = [tc.save_state(name).result().path for name in ("a", "b", "c")]
    tc.save_weights_for_sampler("s").result()

    def listed() -> dict[str, Any]:
        return {c.tinker_path: c for c in rest.list_checkpoints(tc.model_id).result().checkpoints}

    assert set(listed()) == {*paths[1:], f"tinker://{tc.model_id}/sampler_weights/s"}  # the latest 2 training states

    rest.set_checkpoint_ttl_from_tinker_path(paths[2], 7200).result()
    expires = listed()[paths[2]].expires_at.timestamp()
    assert abs(expires - (time.time() + 7200)) < 60
    timer = team.service.checkpoints._timer
    assert timer is not None and abs(timer.when() - team.loop.time() - 7200) < 60  # expiry waits on a timer
    rest.set_checkpoint_ttl_from_tinker_path(paths[2], None).result()
    assert listed()[paths[2]].expires_at is None
    with pytest.raises(tinker.BadRequestError, match="an hour"):
        rest.set_checkpoint_ttl_from_tinker_path(paths[2], 5).result()
    with pytest.raises(tinker.NotFoundError):
        tinker.RestClient(base_url=team.url, api_key=OTHER_KEY).set_checkpoint_ttl_from_tinker_path(paths[2], 7200).result()

    short = tc.save_weights_for_sampler("short", ttl_seconds=3600).result().path
    assert abs(listed()[short].expires_at.timestamp() - (time.time() + 3600)) < 60
    file = Path(team.service.store.checkpoint(short)["file"])
    on_loop(team, team.service.checkpoints.sweep, time.time() + 3601)  # an hour on: the timer's sweep
    assert short not in listed() and not file.exists() and paths[2] in listed()
    with pytest.raises(tinker.BadRequestError, match="does not exist"):
        service.create_sampling_client(model_path=short).sample(
            types.ModelInput.from_ints([5]), 1, types.SamplingParams(max_tokens=1)).result()
    deleted = scrape(team.url)
    assert value(deleted, "tinker_checkpoints_deleted_total", reason="ttl") >= 1
    assert value(deleted, "tinker_checkpoints_deleted_total", reason="keep_latest") >= 1


def test_a_hosted_name_on_local_weights(team: Any, service: Any, tmp_path: Path) -> None:
    """``--base Qwen/Qwen3-4B-Instruct-2507=tiny-qwen3``: clients see and use the hosted name, and
    ``toolrl tinker tokenizers NAME=SOURCE`` gives them SOURCE's tokenizer under that name, offline."""
    import tinker
    from toolrl import model_sources
    from toolrl_tinker.hub_names import write_hub_cache

    names = [m.model_name for m in tinker.RestClient(base_url=team.url, api_key=KEY).get_server_capabilities()
             .result().supported_models]
    assert names == [BASE, HOSTED]
    assert team.service.bases[HOSTED].trainer is team.service.bases[BASE].trainer  # one source, loaded once
    tc = service.create_lora_training_client(base_model=HOSTED, rank=2).result()
    assert tc.get_info().model_data.model_name == HOSTED
    assert np.isfinite(tc.forward_backward([_datum()], "cross_entropy").result().metrics["loss:sum"])

    # The files a client loads under the name are the source's (loading them: test_cookbook_tokenizers.py).
    cache = write_hub_cache((f"{HOSTED}={BASE}",), tmp_path / "hub")
    repo = cache / "models--Qwen--Qwen3-4B-Instruct-2507"
    snapshot = repo / "snapshots" / (repo / "refs" / "main").read_text()
    source = Path(model_sources.tiny_qwen3())
    assert (snapshot / "tokenizer.json").read_bytes() == (source / "tokenizer.json").read_bytes()
