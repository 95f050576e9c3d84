"""State survives a restart: checkpoints listed and downloadable through the rest client, a training
client from a saved state (with its optimizer) equal to the one saved, a sampler path sampled again;
a request the SDK sent that was running when the server stopped fails, through the SDK's own future,
naming the restart; the client's session ended with it."""

from __future__ import annotations

import socket
import sqlite3
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from conftest import BASE, KEY, held, start_server
from toolrl_tinker.service import owner_of


def _datum() -> Any:
    from tinker import types

    tokens = [4, 9, 16, 25, 36, 49, 64]
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                       loss_fn_inputs={"target_tokens": np.array(tokens[1:], np.int64),
                                       "weights": np.ones(6, np.float32)})


def test_restart_keeps_checkpoints_and_fails_running_futures(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tinker
    from tinker import types
    from toolrl_tinker import server as server_module

    monkeypatch.setattr(server_module, "SHUTDOWN_GRACE_S", 0.5)  # the SDK's long poll would hold the stop 5 s
    with socket.socket() as s:  # one port for both runs: the SDK's client reconnects to it
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    first = start_server(tmp_path, port=port)
    turn = first.service.bases[BASE].turns.turn()
    try:
        service = tinker.ServiceClient(base_url=first.url, api_key=KEY)
        tc = service.create_lora_training_client(base_model=BASE, rank=4, seed=1).result()
        for _ in range(2):
            tc.forward_backward([_datum()], "cross_entropy").result()
            tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
        state_path = tc.save_state("after-two").result().path
        sampler_path = tc.save_weights_for_sampler("w2").result().path
        external_path = tc.save_weights_external("peft").result().path
        run, trainer = held(first, tc.model_id)
        weights = trainer.adapter_state(run)
        moments = trainer.ranks.state(run.adapter)["optimizer"]
        turn.__enter__()  # the base busy: the next request is running (waiting for its turn) when the server stops
        cut_off = tc.forward_backward([_datum()], "cross_entropy")
        deadline = time.time() + 30
        while first.service.futures.running[owner_of(KEY)] < 1 and time.time() < deadline:
            time.sleep(0.05)
        assert first.service.futures.running[owner_of(KEY)] == 1
    finally:
        first.stop()

    # The state file keeps a write-ahead log: no request waits for a disk sync on the event loop.
    assert sqlite3.connect(tmp_path / "state.sqlite").execute("pragma journal_mode").fetchone()[0] == "wal"
    second = start_server(tmp_path, port=port)
    try:
        with pytest.raises(tinker.RequestFailedError, match="the server restarted while this request ran"):
            cut_off.result(60)
        with pytest.raises(tinker.BadRequestError, match="server restart"):
            tc.forward_backward([_datum()], "cross_entropy").result()
        turn.__exit__(None, None, None)
        rest = tinker.RestClient(base_url=second.url, api_key=KEY)
        listed = {c.tinker_path for c in rest.list_checkpoints(tc.model_id).result().checkpoints}
        assert listed == {state_path, sampler_path, external_path}
        urls = rest.get_external_weights_urls(external_path).result().urls
        assert set(urls) == {"adapter_config.json", "adapter_model.safetensors"}
        download = httpx.get(urls["adapter_model.safetensors"])  # a signed URL: no key
        from safetensors.torch import load

        assert {k.removeprefix("base_model.model."): v for k, v in load(download.content).items()}.keys() == weights.keys()

        service = tinker.ServiceClient(base_url=second.url, api_key=KEY)
        again = service.create_training_client_from_state_with_optimizer(state_path).result()
        loaded, trainer = held(second, again.model_id)
        assert all(torch.equal(weights[k], v) for k, v in trainer.adapter_state(loaded).items())
        state = trainer.ranks.state(loaded.adapter)["optimizer"]["state"]
        assert all(torch.equal(t, state[i][n]) for i, v in moments["state"].items() for n, t in v.items())
        again.forward_backward([_datum()], "cross_entropy").result()  # it trains on

        sampler = service.create_sampling_client(model_path=sampler_path).result()
        out = sampler.sample(types.ModelInput.from_ints([4, 9, 16]), 1, types.SamplingParams(max_tokens=3, seed=0))
        assert len(out.result().sequences[0].tokens) == 3
    finally:
        second.stop()
