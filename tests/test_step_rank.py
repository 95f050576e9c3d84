"""A step rank in this process (toolrl.processes.step_rank): named adapters stepped through the public step,
their state read and loaded, and adapter slots: an adapter moved out of the model and back (its weights,
gradient and AdamW state) gives, bit for bit, what one never moved gives."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from toolrl.config import AdapterConfig
from toolrl.modeling.adapter_routing import adapter_names
from toolrl.processes.step_rank import StepRank
from toolrl.training.optimizer import OptimizerSettings
from toolrl.training.token_step import LossSpec, TokenRow

TOKENS = [3, 17, 99, 2048, 5, 77, 1023, 64, 8, 300, 41]
PPO = LossSpec(name="ppo_clip")
STEP = OptimizerSettings(lr=1e-2, betas=(0.9, 0.95))
LORA = AdapterConfig(r=4, alpha=32.0, target_modules=["q_proj", "v_proj", "down_proj"])


def _rows(seed: int) -> list[TokenRow]:
    rng = np.random.default_rng(seed)
    return [TokenRow(tokens=TOKENS[:n], targets=TOKENS[1:n + 1], advantages=rng.normal(0, 1, n),
                     logprobs=rng.uniform(-12.5, -11.0, n)) for n in (10, 6)]


def _script(rank: StepRank) -> list:
    """Three clients' calls interleaved (each switch, with one slot, moves adapters out and back): what
    each call gave, and each adapter's state and gradients at the end."""
    seen = []
    for name, seed in (("a", 1), ("b", 2), ("c", 3)):
        rank.add_adapter(name, LORA, seed=seed)
    for turn in range(2):
        for i, name in enumerate("abc"):
            seen.append(rank.forward_backward(name, _rows(10 * turn + i), PPO))
        for name in "ab":  # c's gradient stays pending while the others move it out and back
            seen.append(rank.optimizer_step(name, STEP))
    seen.extend(rank.state(name) for name in "abc")
    seen.extend(rank.gradients(name) for name in "abc")
    return seen


def _same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, torch.Tensor | np.ndarray):
        return torch.equal(torch.as_tensor(a), torch.as_tensor(b))
    if hasattr(a, "logprobs"):
        return _same(a.model_dump(), b.model_dump())
    return a == b


@pytest.fixture(scope="module")
def unlimited(tiny_qwen3_path):
    rank = StepRank(tiny_qwen3_path)
    rank.setup()
    return rank


def test_adapters_moved_out_of_the_model_and_back_train_as_if_never_moved(tiny_qwen3_path, unlimited) -> None:
    reference = _script(unlimited)
    slotted = StepRank(tiny_qwen3_path, slots=1)
    slotted.setup()
    assert _same(_script(slotted), reference)
    assert adapter_names(slotted.model) == ["c"] and sorted(slotted.residency.parked) == ["a", "b"]
    assert slotted.residency.parked["b"].grads["model.layers.0.self_attn.q_proj.lora_A.weight"] is None  # stepped: none pending
    slotted.remove_adapter("a")  # out of host memory; "c" stays in the model
    assert sorted(slotted.residency.parked) == ["b"] and adapter_names(slotted.model) == ["c"]


def test_a_state_loads_back_and_a_misfit_changes_nothing(unlimited) -> None:
    rank = unlimited
    rank.add_adapter("x", LORA, seed=5)
    rank.forward_backward("x", _rows(7), PPO)
    rank.optimizer_step("x", STEP)
    saved = rank.state("x")
    rank.forward_backward("x", _rows(8), PPO)
    rank.optimizer_step("x", STEP)
    rank.forward_backward("x", _rows(9), PPO)
    moved = rank.state("x")
    other = AdapterConfig(r=2, alpha=32.0, target_modules=["q_proj"])
    rank.add_adapter("y", other, seed=6)
    with pytest.raises(ValueError, match="do not fit"):
        rank.load_state("x", rank.state("y")["adapter"])
    assert _same(rank.state("x"), moved) and any(g is not None for g in rank.gradients("x").values())
    rank.load_state("x", saved["adapter"], saved["optimizer"])
    assert _same(rank.state("x"), saved) and all(g is None for g in rank.gradients("x").values())
    with pytest.raises(ValueError, match="exists already"):
        rank.add_adapter("x", LORA)
    with pytest.raises(ValueError, match="no adapter 'z'"):
        rank.forward_backward("z", _rows(1), PPO)


def test_gradients_set_back_and_memory_by_part(tiny_qwen3_path) -> None:
    """A request that fails after some backward calls is undone by setting the gradients it read before;
    the memory a rank reports moves with the adapters it holds, in the model or moved out."""
    rank = StepRank(tiny_qwen3_path, slots=1)
    rank.setup()
    rank.add_adapter("g", LORA, seed=1)
    empty = rank.memory()
    assert empty["weights"] > 0 and empty["gradients"] == 0 and empty["optimizer"] == 0 and empty["host"] == 0
    rank.forward_backward("g", _rows(1), PPO)
    before = rank.gradients("g")
    rank.forward_backward("g", _rows(2), PPO)
    assert not _same(rank.gradients("g"), before)
    rank.set_gradients("g", before)
    assert _same(rank.gradients("g"), before)
    rank.optimizer_step("g", STEP)
    held = rank.memory()
    adapter = sum(t.numel() * 4 for t in rank.state("g", optimizer=False)["adapter"].values())
    assert held["adapters"] == adapter and held["optimizer"] == 2 * adapter + 4 * len(before)  # moments, steps
    rank.add_adapter("h", LORA, seed=2)  # one slot: g moves to host memory (weights and moments)
    assert rank.memory()["host"] == 3 * adapter + 4 * len(before)
