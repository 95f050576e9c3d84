"""The LoRA adapters a vLLM engine serves: which ones, under which vLLM LoRA id, from which directory.

This is the engine's bookkeeping for LoRA (the checks against the ranks and number of adapters vLLM
started with, the peft directories each update writes); the engine makes vLLM's calls with it
(``add_lora`` inside a load's pause, ``remove_lora``).
"""

from __future__ import annotations

import functools
import itertools
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from toolrl.config import AdapterConfig, ConfigError
from toolrl.modeling.adapters import add_adapter

from toolrl_vllm.weights import AdapterLayout, adapter_layouts, write_adapter

# The adapter ranks vLLM's LoRA support takes (vllm.config.lora.MaxLoRARanks).
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
# The adapter name add_adapter's skeleton gets (its layout is then renamed for each adapter of that config).
LAYOUT_NAME = "layout"


def lora_rank(rank: int, chosen: int | None, field: str) -> int:
    """The ``max_lora_rank`` a run whose largest adapter rank is ``rank`` (config ``field``) starts vLLM
    with: ``chosen`` (the engine's option) when set, else the smallest rank vLLM takes that holds it."""
    if chosen is not None:
        if chosen < rank:
            raise ConfigError(f"engine.options.max_lora_rank: {chosen} is below {field} ({rank})")
        return chosen
    if rank > LORA_RANKS[-1]:
        raise ConfigError(f"{field}: {rank}, but vLLM serves adapters of rank at most {LORA_RANKS[-1]}")
    return next(r for r in LORA_RANKS if r >= rank)


class ServedAdapters:
    """The adapters updates carry, by name (``apply``: the run's; ``add``: one more at run time): each
    one's layout, its vLLM LoRA id (from 1, in the order they came) and the LoRARequest that serves it
    once its tensors came (its newest directory, under ``directory``); one without is the base model
    (``lora_B`` zero)."""

    def __init__(self, model_path: str, max_lora_rank: int | None, max_loras: int, directory: Path) -> None:
        self.model_path, self.max_lora_rank, self.max_loras = model_path, max_lora_rank, max_loras
        self.directory = directory
        self.layouts: dict[str, AdapterLayout] = {}
        self.ids: dict[str, int] = {}
        self.loras: dict[str, Any] = {}
        self.per_role = False  # model.adapters: each request names its adapter (else model.lora's one serves all)
        self._next_id = itertools.count(1)
        self._skeletons: dict[str, AdapterLayout] = {}  # add's, by its config (one skeleton per config)
        self._written = itertools.count()

    def apply(self, inject: Callable[[Any], Any]) -> dict[str, dict[str, Any]]:
        """Serve the run's adapters as ``inject`` makes them (see :meth:`VLLMEngine.apply_adapters`);
        returns each one's initial tensors (``lora_B`` zero) for the engine to load."""
        layouts, per_role = adapter_layouts(self.model_path, inject)
        for name, layout in layouts.items():
            field = f"model.adapters.{name}.r" if per_role else "model.lora.r"
            if self.max_lora_rank is None or layout.rank > self.max_lora_rank:
                started = f"max_lora_rank {self.max_lora_rank}" if self.max_lora_rank else "no LoRA support"
                raise ConfigError(f"{field}: rank {layout.rank}, but the vllm engine was started with {started} "
                                  "(engine.options.max_lora_rank)")
        if len(layouts) > self.max_loras:
            raise ConfigError(f"model.adapters: {len(layouts)} adapters, but the vllm engine was started to serve "
                              f"{self.max_loras} at once (engine.options.max_loras)")
        self.layouts, self.per_role = layouts, per_role
        self.ids = {name: next(self._next_id) for name in layouts}
        return {name: layout.zeros() for name, layout in layouts.items()}

    def clear(self) -> None:
        """Serve none (the run's adapters failed to load)."""
        self.layouts, self.ids, self.loras, self.per_role = {}, {}, {}, False

    def add(self, name: str, config: AdapterConfig) -> None:
        """One more adapter, beside the others (see :meth:`VLLMEngine.add_adapter`): its layout from a
        skeleton given ``config``'s adapter by toolrl's own injection, once per config."""
        if self.layouts and not self.per_role:
            raise ValueError(f"add_adapter {name!r}: the vllm engine serves model.lora's adapter (every request carries it)")
        if name in self.layouts:
            raise ValueError(f"model.adapters.{name}: the vllm engine has an adapter of that name already")
        if self.max_lora_rank is None or config.r > self.max_lora_rank:
            raise ValueError(f"adapter {name!r}: rank {config.r}, but the vllm engine was started with "
                             f"max_lora_rank {self.max_lora_rank} (engine.options.max_lora_rank)")
        key = config.model_dump_json(include={"r", "alpha", "target_modules"})
        if key not in self._skeletons:
            inject = functools.partial(add_adapter, name=LAYOUT_NAME, config=config)
            self._skeletons[key] = adapter_layouts(self.model_path, inject)[0][LAYOUT_NAME]
        self.layouts[name] = self._skeletons[key].named(LAYOUT_NAME, name)
        self.ids[name] = next(self._next_id)
        self.per_role = True

    def remove(self, name: str) -> tuple[int, Any]:
        """Forget ``name``: its vLLM LoRA id and LoRARequest (None if its tensors never came), for the
        engine to take it off vLLM and delete its directory."""
        if name not in self.layouts:
            raise ValueError(f"remove_adapter: the vllm engine has no adapter {name!r}")
        del self.layouts[name]
        return self.ids.pop(name), self.loras.pop(name, None)

    def lora_for(self, adapter: str | None) -> Any:
        """The LoRARequest a request for ``adapter`` carries: under ``model.adapters`` its role's (named:
        a role the engine does not serve is a ValueError naming those it does); else model.lora's one
        adapter, or None without LoRA (``adapter`` then None)."""
        if not self.per_role:
            if adapter is not None:
                raise ValueError(f"adapter {adapter!r}: the vllm engine serves no LoRA adapter per role")
            return next(iter(self.loras.values()), None)
        if adapter not in self.layouts:
            asked = "no adapter" if adapter is None else f"unknown adapter {adapter!r}"
            raise ValueError(f"{asked}: the vllm engine serves an adapter per role: {', '.join(self.layouts)}")
        return self.loras.get(adapter)  # None until its tensors come: the base model

    def update(self, adapters: Mapping[str, Mapping[str, Any]], load: Callable[[dict[str, Path]], None]) -> None:
        """Write each adapter's tensors (every one of its tensors, the trainer's names) to a new
        directory, ``load`` them in place of the current ones and drop the old directories (the new
        ones if that fails); the adapters not in ``adapters`` stay as they are."""
        old = [Path(self.loras[name].lora_path) for name in adapters if name in self.loras]
        paths: dict[str, Path] = {}
        try:
            for name, tensors in adapters.items():
                paths[name] = write_adapter(tensors, self.layouts[name],
                                            self.directory / f"adapter-{next(self._written)}")
            load(paths)
        except BaseException:
            for path in paths.values():
                shutil.rmtree(path, ignore_errors=True)
            raise
        for path in old:
            shutil.rmtree(path, ignore_errors=True)
