"""Bad input answered in the error shapes the SDK raises, each naming what was wrong, and the server's
other clients unharmed; a key the server does not hold is refused; a client sees only its own."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from conftest import BASE, KEY, OTHER_KEY


def _datum(n: int = 6, **inputs: Any) -> Any:
    from tinker import types

    tokens = list(range(5, 5 + n))
    given = {"target_tokens": np.array(tokens[1:] + [1], np.int64), "weights": np.ones(n, np.float32), **inputs}
    return types.Datum(model_input=types.ModelInput.from_ints(tokens),
                       loss_fn_inputs={k: v for k, v in given.items() if v is not None})


@pytest.fixture(scope="module")
def trainer(client: Any) -> Any:
    return client.create_lora_training_client(base_model=BASE, rank=2).result()


def _fails(future_or_call: Any, *words: str) -> None:
    import tinker

    with pytest.raises((tinker.RequestFailedError, tinker.BadRequestError, ValueError)) as info:
        future_or_call() if callable(future_or_call) else future_or_call.result()
    text = str(info.value)
    assert all(w in text for w in words), text


def test_unknown_base_model_lists_the_servers(client: Any) -> None:
    _fails(lambda: client.create_lora_training_client(base_model="Qwen/Qwen3-8B", rank=2).result(),
           "unknown base model 'Qwen/Qwen3-8B'", BASE)


def test_bad_datums(trainer: Any) -> None:
    _fails(trainer.forward_backward([_datum(weights=np.ones(4, np.float32))], "cross_entropy"),
           "datum 0", "weights", "[6]")
    _fails(trainer.forward_backward([_datum(advantages=np.ones(6, np.float32))], "cross_entropy"),
           "advantages", "not inputs of cross_entropy")
    _fails(trainer.forward_backward([_datum(weights=None)], "importance_sampling"), "lacks 'logprobs'")
    _fails(trainer.forward_backward([_datum(target_tokens=np.full(6, 10**7, np.int64))], "cross_entropy"),
           "outside the model's vocabulary")
    _fails(trainer.forward_backward([_datum(n=5000)], "cross_entropy"), "over this server's limit")
    ppo = _datum(weights=None, logprobs=np.zeros(6, np.float32), advantages=np.ones(6, np.float32))
    _fails(trainer.forward_backward([ppo], "ppo", {"clip_eps": 0.1}), "unknown key(s) clip_eps")


def test_unknown_loss(trainer: Any) -> None:
    _fails(lambda: trainer.forward_backward([_datum()], "gspo").result(), "unknown loss_fn 'gspo'", "cross_entropy")


def test_missing_checkpoint(client: Any, trainer: Any) -> None:
    _fails(lambda: trainer.load_state("tinker://nothing:train:0/weights/none").result(), "does not exist")
    _fails(lambda: client.create_sampling_client(model_path="tinker://nothing:train:0/sampler_weights/x").result(),
           "does not exist")


def test_a_name_saved_again_replaces_its_checkpoint(served: Any, trainer: Any) -> None:
    """tinker-cookbook's asynchronous loop saves its first batch's state twice under one name: the second save
    succeeds (no overwrite flag) and the name holds the later state."""
    import tinker
    import torch

    def steps(path: str) -> int:
        return torch.load(served.service.store.checkpoint(path)["file"], weights_only=False)["steps"]

    first = trainer.save_state("twice").result().path
    before = steps(first)
    trainer.forward_backward([_datum()], "cross_entropy").result()
    trainer.optim_step(tinker.types.AdamParams(learning_rate=1e-2)).result()
    assert trainer.save_state("twice").result().path == first
    assert steps(first) == before + 1


def test_other_clients_unharmed(trainer: Any) -> None:
    out = trainer.forward_backward([_datum()], "cross_entropy").result()
    assert np.isfinite(out.metrics["loss:sum"])


def test_keys(served: Any, trainer: Any) -> None:
    import tinker

    with pytest.raises(tinker.AuthenticationError):
        tinker.ServiceClient(base_url=served.url, api_key="tml-not-a-key-here").get_server_capabilities()
    other = tinker.ServiceClient(base_url=served.url, api_key=OTHER_KEY)
    rest = other.create_rest_client()
    assert all(r.training_run_id != trainer.model_id for r in rest.list_training_runs().result().training_runs)
    mine = tinker.ServiceClient(base_url=served.url, api_key=KEY).create_rest_client()
    assert any(r.training_run_id == trainer.model_id for r in mine.list_training_runs().result().training_runs)


def test_a_finished_session_leaves_memory(served: Any, trainer: Any) -> None:
    """ServiceClient.close(): its runs' adapters leave the trainer's and the sampler's copies of the base;
    the server's other clients go on; the run's saved state loads again in a new session."""
    import tinker
    from tinker import types
    from toolrl.modeling.adapter_routing import adapter_names

    own = tinker.ServiceClient(base_url=served.url, api_key=KEY)
    tc = own.create_lora_training_client(base_model=BASE, rank=2).result()
    run = served.service.runs[tc.model_id]
    base = served.service.bases[run.base]
    tc.save_weights_and_get_sampling_client().result()
    path = tc.save_state("before-close").result().path
    assert run.adapter in adapter_names(base.trainer.ranks.model) and base.sampler.kept[tc.model_id]
    sampler = base.sampler.kept[tc.model_id][0]
    own.close("success").result()
    assert tc.model_id not in served.service.runs
    assert run.adapter not in adapter_names(base.trainer.ranks.model)
    assert sampler not in adapter_names(base.sampler.engine.model)
    assert np.isfinite(trainer.forward_backward([_datum()], "cross_entropy").result().metrics["loss:sum"])
    again = tinker.ServiceClient(base_url=served.url, api_key=KEY)
    loaded = again.create_training_client_from_state(path).result()
    loaded.forward_backward([_datum()], "cross_entropy").result()
    loaded.optim_step(types.AdamParams(learning_rate=1e-3)).result()
