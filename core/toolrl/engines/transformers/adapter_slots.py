"""The transformers engine's adapter slots (``engine.options.max_adapters``): of the adapters added at run time
(:meth:`~toolrl.engines.RolloutEngine.add_adapter`), at most ``max_adapters`` sit in the model's LoRA layers
(resident, routed); the others wait in host memory as plain tensors, the least recently used evicted first,
and come back when a step or a scoring needs them. The scheduler admits no more adapters into a step than
there are slots, so a step's adapters always fit.

Why bound them: on a GPU a resident adapter takes device memory (an evicted one pinned host memory); on a
CPU both are the same memory, but each resident adapter adds three modules to every adapted layer, which
every adapter added, removed or brought back walks. An evicted adapter comes back with its very tensors:
its samples are those of one never evicted.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from toolrl.engines import rows_of
from toolrl.modeling.adapter_routing import adapter_names
from toolrl.modeling.adapters import (
    adapter_of,
    adapter_state,
    add_adapter,
    load_adapter_state,
    remove_adapter,
)

if TYPE_CHECKING:
    from toolrl.config import AdapterConfig
    from toolrl.modeling.adapter_routing import RowAdapters


class AdapterSlots:
    """The run-time adapters of one engine's ``model``: resident ones by last use, evicted ones with their
    tensors. ``changed`` is called (under the engine's step lock, as every call here) once adapters went
    into the model or out of it."""

    def __init__(self, model: Any, slots: int | None, changed: Callable[[], None]) -> None:
        self.model, self.slots, self.changed = model, slots, changed
        self.configs: dict[str, AdapterConfig] = {}  # every run-time adapter, resident or not
        self.resident: OrderedDict[str, None] = OrderedDict()  # least recently used first
        self.host: dict[str, dict[str, Any]] = {}  # evicted: adapter_state's tensors, on the host

    def names(self) -> list[str]:
        return adapter_names(self.model) + list(self.host)

    def check(self, rows: RowAdapters, adapter: str | None, work: str = "") -> None:
        """A request's ``adapter`` checked against the model's (``rows``; ``work``: it runs every row under
        one policy, :meth:`~toolrl.modeling.adapter_routing.RowAdapters.one_policy`); an evicted one passes,
        brought back by the step that needs it."""
        if adapter in self.host:
            return
        if self.host and adapter is not None and adapter not in self.names():  # rows know the resident ones only
            raise ValueError(f"unknown adapter {adapter!r}: the engine serves {', '.join(self.names())}")
        if work:
            rows.one_policy(work, adapter)
        else:
            rows.index(adapter)

    def add(self, name: str, config: AdapterConfig) -> None:
        """``name`` resident (``lora_B`` zero), the least recently used evicted to make room."""
        if name in self.host:
            raise ValueError(f"model.adapters.{name}: the model has an adapter of that name already")
        self._make_room(1, keep=set())
        add_adapter(self.model, name, config.model_copy(update={"frozen": True}))
        self.configs[name] = config
        self.resident[name] = None
        self.changed()

    def remove(self, name: str) -> None:
        """``name`` gone, resident or evicted."""
        if self.host.pop(name, None) is not None:
            del self.configs[name]
            return
        remove_adapter(self.model, name)  # ValueError for an adapter it does not hold
        self.configs.pop(name, None)
        self.resident.pop(name, None)
        self.changed()

    def bring(self, needed: set[Any]) -> None:
        """The adapters of ``needed`` (names, None for none) resident and the most recently used, others
        evicted for them. ``needed`` holds at most ``slots`` run-time adapters."""
        for name in needed & self.resident.keys():
            self.resident.move_to_end(name)
        missing = [n for n in self.host if n in needed]
        self._make_room(len(missing), keep=needed)
        for name in missing:
            add_adapter(self.model, name, self.configs[name].model_copy(update={"frozen": True}))
            load_adapter_state(self.model, name, self.host.pop(name))
            self.resident[name] = None
        if missing:
            self.changed()

    def write(self, name: str, shape: Sequence[int], start: int, rows: Any) -> bool:
        """Rows of weight ``name`` into an evicted adapter's tensors (a sync that finds it evicted); whether
        ``name`` is one."""
        tensors = self.host.get(adapter_of(name) or "")
        key = re.sub(r"(\.lora_[^.]+)\.[^.]+\.", r"\1.", name, count=1)  # adapter_state's name for it
        if tensors is None or key not in tensors:
            return False
        if tuple(tensors[key].shape) != tuple(shape):
            raise ValueError(f"a weight update sent {name!r} as {tuple(shape)}, the adapter's is "
                             f"{tuple(tensors[key].shape)}")
        rows_of(tensors[key], start, rows.shape[0] if rows.dim() else 1).copy_(rows)
        return True

    def _make_room(self, count: int, keep: set[Any]) -> None:
        """Evict the least recently used resident adapters outside ``keep`` until ``count`` more fit."""
        if self.slots is None:
            return
        over = len(self.resident) + count - self.slots
        for name in [n for n in self.resident if n not in keep][:max(over, 0)]:
            state = adapter_state(self.model, name)
            pin = next(iter(state.values())).is_cuda
            self.host[name] = {k: t.to("cpu").pin_memory() if pin else t for k, t in state.items()}
            remove_adapter(self.model, name)
            del self.resident[name]
