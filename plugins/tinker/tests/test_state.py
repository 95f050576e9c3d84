"""State survives a restart: checkpoints listed and downloadable through the rest client, a training
client from a saved state (with its optimizer) equal to the one saved, a sampler path sampled again;
a future that was running when the server stopped fails naming the restart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import numpy as np
import torch
from conftest import BASE, KEY, held, start_server
from toolrl_tinker.service import owner_of


def _datum() -> Any:
    from tinker import types

    tokens = [4, 9, 16, 25, 36, 49, 64]
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                       loss_fn_inputs={"target_tokens": np.array(tokens[1:], np.int64),
                                       "weights": np.ones(6, np.float32)})


def test_restart_keeps_checkpoints_and_fails_running_futures(tmp_path: Path) -> None:
    import tinker
    from tinker import types

    first = start_server(tmp_path)
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
        moments = trainer.optimizer_state(run)
        first.service.store.future_started("req-cut-off", owner_of(KEY))  # as a request in flight is recorded
    finally:
        first.stop()

    second = start_server(tmp_path)
    try:
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
        state = trainer.optimizer_state(loaded)["state"]
        assert all(torch.equal(t, state[i][n]) for i, v in moments["state"].items() for n, t in v.items())
        again.forward_backward([_datum()], "cross_entropy").result()  # it trains on

        sampler = service.create_sampling_client(model_path=sampler_path).result()
        out = sampler.sample(types.ModelInput.from_ints([4, 9, 16]), 1, types.SamplingParams(max_tokens=3, seed=0))
        assert len(out.result().sequences[0].tokens) == 3

        lost = httpx.post(f"{second.url}/api/v1/retrieve_future", json={"request_id": "req-cut-off"},
                          headers={"X-API-Key": KEY}).json()
        assert "the server restarted while this request ran" in lost["error"]
    finally:
        second.stop()
