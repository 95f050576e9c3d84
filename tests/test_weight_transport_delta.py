"""Delta weight sync (``trainer.weight_sync: delta``): a sync sends only the tensors written since the
same receivers' last one, and the engines end bit for bit where a full sync leaves them."""

from __future__ import annotations

import pytest
import torch
from test_weight_transport import LINKED, PROMPTS, logprobs
from test_weight_transport_lora import engine, sync
from toolrl.model_sources import load_model
from toolrl.training.weight_sync import Delta, SyncPlan

DELTA = SyncPlan(delta=True)


def recorded(engines):
    """The names each engine loads from now on (wrapping its loading paths)."""
    names: set[str] = set()
    for e in engines:
        rows, whole = e.load_weight_rows, e.update_weights

        def load_rows(name, shape, start, data, rows=rows):
            names.add(name)
            rows(name, shape, start, data)

        def update(state, whole=whole):
            names.update(state)
            whole(state)

        e.load_weight_rows, e.update_weights = load_rows, update
    return names


def step(model, seed: int) -> None:
    """A "training step": every trainable tensor written in place."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn(p.shape, generator=g) * 0.02)


@pytest.mark.parametrize("name", ["in_process", *LINKED])
async def test_delta_sends_only_what_changed_and_equals_a_full_sync(name, tiny_qwen3_path, tmp_path):
    model = load_model(tiny_qwen3_path, dtype="float32", device="cpu")
    frozen = "model.embed_tokens.weight"  # tied to the LM head: one tensor, sent once
    model.get_parameter(frozen).requires_grad_(False)
    every = {k for k, v in model.state_dict().items()} - ({"lm_head.weight"} if model.config.tie_word_embeddings else set())
    full_bytes = sum(v.numel() * v.element_size() for k, v in model.state_dict().items() if k in every)
    deltas = [Delta(), Delta()]
    by_delta, by_full = [engine(tiny_qwen3_path)], [engine(tiny_qwen3_path)]
    try:
        step(model, 1)
        names = recorded(by_delta)
        # The first sync to these receivers sends everything.
        assert sync(name, model, by_delta, 1, DELTA, tmp_path, deltas, key="d1") == full_bytes
        assert names == every
        for d in deltas:
            d.commit()
        for version, seed in ((2, 2), (3, 3)):
            step(model, seed)
            names.clear()
            sent = sync(name, model, by_delta, version, DELTA, tmp_path, deltas, key=f"d{version}")
            for d in deltas:
                d.commit()
            assert names == every - {frozen} and frozen not in names
            assert sent == full_bytes - model.get_parameter(frozen).numel() * 4
        assert sync(name, model, by_full, 3, SyncPlan(), tmp_path, key="full") == full_bytes
        assert await logprobs(by_delta[0], PROMPTS) == await logprobs(by_full[0], PROMPTS)
        # Nothing written since: nothing sent. New receivers (a reset): everything again.
        names.clear()
        assert sync(name, model, by_delta, 4, DELTA, tmp_path, deltas, key="d4") == 0 and not names
        for d in deltas:
            d.reset()
        assert sync(name, model, by_delta, 5, DELTA, tmp_path, deltas, key="d5") == full_bytes
    finally:
        for e in [*by_delta, *by_full]:
            await e.close()
