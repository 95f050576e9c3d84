"""Which adapters sit in a model, at most ``slots``, and which are parked in host memory, the least recently used
first: the transformers engine's (frozen) and a step rank's (with gradients and AdamW state), each parked its own
way (``torch``: imported inside :func:`host_copy`)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Collection
from typing import Any, Generic, TypeVar

P = TypeVar("P")


class AdapterResidency(Generic[P]):
    """``resident``: least recently used first; ``parked``: each as ``park(name)`` gave it, taking it out of the
    model, and ``unpark(name, parked)`` puts back. ``slots``: at most this many resident (None: any number). An
    owner enters an adapter it added in ``resident`` (after :meth:`make_room`) and drops one it removed."""

    def __init__(self, slots: int | None, park: Callable[[str], P], unpark: Callable[[str, P], None]) -> None:
        self.slots, self._park, self._unpark = slots, park, unpark
        self.resident: OrderedDict[str, None] = OrderedDict()
        self.parked: dict[str, P] = {}

    def make_room(self, count: int, keep: Collection[Any] = ()) -> None:
        """Park the least recently used resident adapters outside ``keep`` until ``count`` more fit."""
        over = 0 if self.slots is None else len(self.resident) + count - self.slots
        for name in [n for n in self.resident if n not in keep][:max(over, 0)]:
            self.parked[name] = self._park(name)
            del self.resident[name]

    def bring(self, needed: set[Any]) -> list[str]:
        """The adapters of ``needed`` (names; None passes) resident and the most recently used, others parked
        for them (``needed`` holds at most ``slots``); those brought back."""
        for name in needed & self.resident.keys():
            self.resident.move_to_end(name)
        missing = [n for n in self.parked if n in needed]
        self.make_room(len(missing), keep=needed)
        for name in missing:
            self._unpark(name, self.parked[name])
            del self.parked[name]
            self.resident[name] = None
        return missing


def host_copy(value: Any, pin: bool) -> Any:
    """``value`` (a tensor, or a state dict's nesting of them) with its tensors in host memory: pinned with
    ``pin`` (a GPU's host copy), the tensor itself when it is there already."""
    import torch

    if isinstance(value, torch.Tensor):
        if value.device.type == "cpu" and not pin:
            return value
        return torch.empty(value.shape, dtype=value.dtype, device="cpu", pin_memory=pin).copy_(value.detach())
    if isinstance(value, dict):
        return {k: host_copy(v, pin) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(host_copy(v, pin) for v in value)
    return value
