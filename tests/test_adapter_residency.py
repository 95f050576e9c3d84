"""The adapter slots the transformers engine and a step rank share (toolrl.modeling.adapter_residency): at
most ``slots`` adapters resident, the least recently used parked to make room for those needed, each back
with what its park gave; host copies of a state dict's tensors."""

from __future__ import annotations

import torch
from toolrl.modeling.adapter_residency import AdapterResidency, host_copy


def test_the_least_recently_used_are_parked_for_the_needed_ones() -> None:
    model: dict[str, str] = {}  # a stand-in: the adapters in the model and their weights
    moves: list[str] = []

    def park(name: str) -> str:
        moves.append(f"park {name}")
        return model.pop(name)

    def unpark(name: str, weights: str) -> None:
        moves.append(f"unpark {name}")
        model[name] = weights

    slots: AdapterResidency[str] = AdapterResidency(2, park, unpark)
    for name in "abc":
        slots.make_room(1)
        model[name] = f"weights of {name}"
        slots.resident[name] = None
    assert list(slots.resident) == ["b", "c"] and slots.parked == {"a": "weights of a"} and moves == ["park a"]
    assert slots.bring({"b", None}) == [] and list(slots.resident) == ["c", "b"]  # used: the most recent
    assert slots.bring({"a", "b"}) == ["a"] and list(slots.resident) == ["b", "a"] and model["a"] == "weights of a"
    assert moves == ["park a", "park c", "unpark a"] and list(slots.parked) == ["c"]
    unlimited: AdapterResidency[str] = AdapterResidency(None, park, unpark)
    unlimited.resident.update(dict.fromkeys("xyz"))
    unlimited.make_room(5)
    assert list(unlimited.resident) == ["x", "y", "z"] and not unlimited.parked


def test_a_host_copy_keeps_a_host_tensor_and_copies_the_nesting() -> None:
    t = torch.ones(2, 3)
    state = {"state": {0: {"exp_avg": t, "step": torch.tensor(3.0)}}, "param_groups": [{"lr": 0.1}]}
    copied = host_copy(state, pin=False)
    assert copied["state"][0]["exp_avg"] is t and copied["param_groups"] == [{"lr": 0.1}]
    assert host_copy(None, pin=False) is None
    if torch.cuda.is_available():
        pinned = host_copy(t.cuda(), pin=True)
        assert pinned.is_pinned() and pinned.device.type == "cpu" and torch.equal(pinned, t)
