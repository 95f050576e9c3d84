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
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from toolrl.engines import rows_of
from toolrl.modeling.adapter_residency import AdapterResidency, host_copy
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
    """The run-time adapters of one engine's ``model``: resident ones by last use, evicted ones as
    adapter_state's tensors on the host (``residency``). ``changed`` is called (under the engine's step lock,
    as every call here) once adapters went into the model or out of it."""

    def __init__(self, model: Any, slots: int | None, changed: Callable[[], None]) -> None:
        self.model, self.changed = model, changed
        self.configs: dict[str, AdapterConfig] = {}  # every run-time adapter, resident or not
        self.residency: AdapterResidency[dict[str, Any]] = AdapterResidency(slots, self._evict, self._restore)

    def names(self) -> list[str]:
        return adapter_names(self.model) + list(self.residency.parked)

    def check(self, rows: RowAdapters, adapter: str | None, work: str = "") -> None:
        """A request's ``adapter`` checked against the model's (``rows``; ``work``: it runs every row under
        one policy, :meth:`~toolrl.modeling.adapter_routing.RowAdapters.one_policy`); an evicted one passes,
        brought back by the step that needs it."""
        if adapter in self.residency.parked:
            return
        if self.residency.parked and adapter is not None and adapter not in self.names():  # rows know the resident ones only
            raise ValueError(f"unknown adapter {adapter!r}: the engine serves {', '.join(self.names())}")
        if work:
            rows.one_policy(work, adapter)
        else:
            rows.index(adapter)

    def add(self, name: str, config: AdapterConfig) -> None:
        """``name`` resident (``lora_B`` zero), the least recently used evicted to make room."""
        if name in self.residency.parked:
            raise ValueError(f"model.adapters.{name}: the model has an adapter of that name already")
        self.residency.make_room(1)
        add_adapter(self.model, name, config.model_copy(update={"frozen": True}))
        self.configs[name] = config
        self.residency.resident[name] = None
        self.changed()

    def remove(self, name: str) -> None:
        """``name`` gone, resident or evicted."""
        if self.residency.parked.pop(name, None) is not None:
            del self.configs[name]
            return
        remove_adapter(self.model, name)  # ValueError for an adapter it does not hold
        self.configs.pop(name, None)
        self.residency.resident.pop(name, None)
        self.changed()

    def bring(self, needed: set[Any]) -> None:
        """The adapters of ``needed`` (names, None for none) resident (:meth:`AdapterResidency.bring`)."""
        if self.residency.bring(needed):
            self.changed()

    def write(self, name: str, shape: Sequence[int], start: int, rows: Any) -> bool:
        """Rows of weight ``name`` into an evicted adapter's tensors (a sync that finds it evicted); whether
        ``name`` is one."""
        tensors = self.residency.parked.get(adapter_of(name) or "")
        key = re.sub(r"(\.lora_[^.]+)\.[^.]+\.", r"\1.", name, count=1)  # adapter_state's name for it
        if tensors is None or key not in tensors:
            return False
        if tuple(tensors[key].shape) != tuple(shape):
            raise ValueError(f"a weight update sent {name!r} as {tuple(shape)}, the adapter's is "
                             f"{tuple(tensors[key].shape)}")
        rows_of(tensors[key], start, rows).copy_(rows)
        return True

    def _evict(self, name: str) -> dict[str, Any]:
        """``name`` out of the model: its tensors, on the host (pinned when they were on a GPU)."""
        state = adapter_state(self.model, name)
        host = host_copy(state, pin=next(iter(state.values())).is_cuda)
        remove_adapter(self.model, name)
        return host

    def _restore(self, name: str, tensors: dict[str, Any]) -> None:
        add_adapter(self.model, name, self.configs[name].model_copy(update={"frozen": True}))
        load_adapter_state(self.model, name, tensors)
