"""Adapters in and out (``toolrl tinker export`` / ``import``): a client's checkpoint merged into full
weights that ``from_pretrained`` loads and that score a sequence as the server's sampler does; a PEFT
adapter made by ``peft`` itself imported as a key's checkpoint, which the SDK starts a training client
from (``create_training_client_from_state``) and samples, scoring as PEFT does."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from conftest import BASE, KEY

TOKENS = [5, 17, 99, 2048, 5, 77, 1023, 64, 8, 300]


def _toolrl(*args: str) -> Any:
    """``toolrl ARGS`` of the plugin's commands, in this process."""
    import click
    import toolrl_tinker

    cli = click.Group("toolrl")
    toolrl_tinker.register_commands(cli=cli)
    return CliRunner().invoke(cli, list(args))


def _scored(model: Any) -> np.ndarray:
    """Each token's log-prob after the first, under ``model`` (a causal LM)."""
    with torch.no_grad():
        logits = model(torch.tensor([TOKENS])).logits.float()
    return torch.log_softmax(logits[0, :-1], -1).gather(-1, torch.tensor(TOKENS[1:])[:, None])[:, 0].numpy()


def _served_scores(service: Any, **where: str) -> np.ndarray:
    """The server's sampler's scores of the tokens (``model_path=`` a checkpoint, or ``base_model=``)."""
    from tinker import types

    return np.array(service.create_sampling_client(**where).compute_logprobs(
        types.ModelInput.from_ints(TOKENS)).result()[1:])


@pytest.fixture
def client(served: Any) -> Iterator[Any]:
    """A client of its own, closed after the test (its training clients leave the shared server)."""
    import tinker

    with tinker.ServiceClient(base_url=served.url, api_key=KEY) as own:
        yield own


def test_export_merged_loads_with_from_pretrained(served: Any, client: Any, tmp_path: Path) -> None:
    from tinker import types
    from transformers import AutoModelForCausalLM

    tc = client.create_lora_training_client(base_model=BASE, rank=4, seed=2).result()
    datum = types.Datum(model_input=types.ModelInput.from_ints(TOKENS[:-1]),
                        loss_fn_inputs={"target_tokens": np.array(TOKENS[1:]), "weights": np.ones(9, np.float32)})
    for _ in range(2):
        tc.forward_backward([datum], "cross_entropy").result()
        tc.optim_step(types.AdamParams(learning_rate=5e-2)).result()
    state = tc.save_state("to-export").result().path
    sampler_path = tc.save_weights_for_sampler("to-export").result().path
    external = tc.save_weights_external("to-export").result().path
    want = _served_scores(client, model_path=sampler_path)
    root = str(served.service.store.root)
    for path in (state, external):
        out = tmp_path / path.rsplit("/", 2)[1]
        done = _toolrl("tinker", "export", path, str(out), "--state-dir", root)
        assert done.exit_code == 0, done.output
        model = AutoModelForCausalLM.from_pretrained(str(out))
        assert np.abs(_scored(model) - want).max() < 1e-4
        base_dir = Path(served.service.bases[BASE].path)
        assert all((out / f).read_bytes() == (base_dir / f).read_bytes() for f in ("tokenizer.json", "tokenizer_config.json"))
    missing = _toolrl("tinker", "export", "tinker://nothing:train:0/weights/none", str(tmp_path / "x"), "--state-dir", root)
    assert missing.exit_code == 2 and missing.output.startswith("error: checkpoint 'tinker://nothing:train:0/weights/none'")


@pytest.mark.parametrize("rslora", [False, True])
def test_import_a_peft_adapter(served: Any, client: Any, tmp_path: Path, rslora: bool) -> None:
    """An adapter on q_proj and v_proj only, of rank 4 and lora_alpha 16 (rsLoRA's scale too), its B
    not zero: the server's training client computes what PEFT computes, and trains on."""
    from peft import LoraConfig, get_peft_model
    from tinker import types
    from toolrl.model_sources import load_model

    model = load_model(served.service.bases[BASE].path, dtype="float32")
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                                                  init_lora_weights=False, use_rslora=rslora))
    peft_model.save_pretrained(str(tmp_path / "adapter"))
    want = _scored(peft_model)
    assert np.abs(want - _served_scores(client, base_model=BASE)).max() > 1e-3  # the adapter changes the scores

    done = _toolrl("tinker", "import", str(tmp_path / "adapter"), "--base", BASE, "--state-dir",
                   str(served.service.store.root), "--api-key", KEY, "--name", f"peft-{rslora}")
    assert done.exit_code == 0, done.output
    path = done.output.strip()
    assert path.startswith("tinker://import-") and path.endswith(f"/weights/peft-{rslora}")

    tc = client.create_training_client_from_state(path).result()
    datum = types.Datum(model_input=types.ModelInput.from_ints(TOKENS[:-1]),
                        loss_fn_inputs={"target_tokens": np.array(TOKENS[1:]), "weights": np.ones(9, np.float32)})
    got = np.array(tc.forward([datum], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].data)
    assert np.abs(got - want).max() < 1e-5
    assert np.abs(_served_scores(client, model_path=path) - want).max() < 1e-4
    tc.forward_backward([datum], "cross_entropy").result()
    tc.optim_step(types.AdamParams(learning_rate=1e-3)).result()


def test_import_refuses_what_it_cannot_serve(served: Any, tmp_path: Path) -> None:
    from peft import LoraConfig, get_peft_model
    from toolrl.model_sources import load_model

    model = load_model(served.service.bases[BASE].path, dtype="float32")
    get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"], use_dora=True)).save_pretrained(str(tmp_path / "dora"))
    done = _toolrl("tinker", "import", str(tmp_path / "dora"), "--base", BASE, "--state-dir",
                   str(served.service.store.root), "--api-key", KEY)
    assert done.exit_code == 2 and done.output.startswith("error: ") and "use_dora=True" in done.output
    assert len(done.output.strip().splitlines()) == 1
