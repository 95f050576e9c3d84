"""Trainer weights to files vLLM reads: a safetensors checkpoint its loader reads in place, or (under
LoRA) a peft adapter directory it serves as a LoRA adapter.

The engine runs in other processes, so weights travel through a file: one ``model.safetensors``
written atomically (temporary name, then rename) into a directory the engine owns. Tensors that share
storage (tied embeddings: ``lm_head.weight`` is ``model.embed_tokens.weight``) are written once, under
the first name, which is how Hugging Face checkpoints of tied models look and what vLLM expects.
An adapter update is written to a new directory of its own (small: the ``lora_A``/``lora_B`` tensors),
one per adapter it carries (an adapter per role: ``...lora_A.<role>.weight``).
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

WEIGHTS_FILE = "model.safetensors"


def unique_tensors(state_dict: Mapping[str, Any]) -> dict[str, Any]:
    """Detached, contiguous CPU copies of the tensors, each storage once (first name wins)."""
    import torch

    seen: set[tuple[int, int, tuple[int, ...], tuple[int, ...]]] = set()
    out: dict[str, Any] = {}
    for name, value in state_dict.items():
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"update_weights: {name!r} is a {type(value).__name__}, not a tensor")
        key = (value.untyped_storage().data_ptr(), value.storage_offset(), tuple(value.shape), tuple(value.stride()))
        if key in seen:
            continue
        seen.add(key)
        out[name] = value.detach().to("cpu", copy=True).contiguous()
    return out


def write_checkpoint(state_dict: Mapping[str, Any], directory: Path) -> Path:
    """Write ``state_dict`` to ``directory/model.safetensors``; returns the file."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    final = directory / WEIGHTS_FILE
    tmp = directory / f".{WEIGHTS_FILE}.tmp"
    save_file(unique_tensors(state_dict), str(tmp), metadata={"format": "pt"})
    os.replace(tmp, final)
    return final


ADAPTER_FILE = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
# The trainer's adapter tensor names (peft layers injected in place: adapter ``default``, or the role's name).
_TRAINER_ADAPTER_KEY = re.compile(r"^(?P<module>.+)\.(?P<which>lora_[AB])\.(?P<adapter>[^.]+)\.weight$")


@dataclass(frozen=True)
class AdapterLayout:
    """One of the trainer's adapters as the engine's base model holds it: every tensor's name and
    shape, and peft's ``adapter_config.json`` (rank, alpha, target modules) for vLLM to load it with."""

    shapes: dict[str, tuple[int, ...]]
    config_json: str
    rank: int

    def named(self, old: str, new: str) -> AdapterLayout:
        """This layout for the adapter ``new`` of the same config (its tensors' names say ``new``, not ``old``)."""
        shapes = {}
        for name, shape in self.shapes.items():
            key = _TRAINER_ADAPTER_KEY.match(name)
            assert key is not None and key["adapter"] == old
            shapes[f"{key['module']}.{key['which']}.{new}.weight"] = shape
        return AdapterLayout(shapes, self.config_json, self.rank)

    def zeros(self) -> dict[str, Any]:
        """The initial adapter: ``B·A = 0`` (the trainer's starts with ``lora_B`` zero), the base model."""
        import torch

        return {name: torch.zeros(shape) for name, shape in self.shapes.items()}


def adapter_layouts(model_path: str, inject: Callable[[Any], Any]) -> tuple[dict[str, AdapterLayout], bool]:
    """Run the trainer's own injection on a skeleton of the model in ``model_path`` (meta device: no
    weights loaded) to learn each adapter's names, shapes and peft config exactly as the trainer has
    them, by adapter name in injection order (``default`` alone under ``model.lora``); and whether they
    are adapters per role (``model.adapters``: each request names its own)."""
    import torch
    from toolrl.modeling.adapter_routing import adapter_names, has_routing
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    config = AutoConfig.from_pretrained(model_path)
    auto = AutoModelForImageTextToText if getattr(config, "vision_config", None) else AutoModelForCausalLM
    with torch.device("meta"):
        model = auto.from_config(config)
    inject(model)
    state = model.state_dict()
    layouts: dict[str, AdapterLayout] = {}
    for name in adapter_names(model):
        peft_config = model.peft_config[name]
        shapes = {k: tuple(v.shape) for k, v in state.items()
                  if (key := _TRAINER_ADAPTER_KEY.match(k)) and key["adapter"] == name}
        with tempfile.TemporaryDirectory() as tmp:
            peft_config.save_pretrained(tmp)
            config_json = (Path(tmp) / ADAPTER_CONFIG).read_text()
        layouts[name] = AdapterLayout(shapes, config_json, peft_config.r)
    return layouts, has_routing(model)


def adapters_of(tensors: Mapping[str, Any], layouts: Mapping[str, AdapterLayout]) -> dict[str, dict[str, Any]]:
    """An update's adapter tensors (the trainer's names) by the adapter they belong to; a tensor of no
    adapter the engine serves is a ValueError."""
    out: dict[str, dict[str, Any]] = {}
    for name, tensor in tensors.items():
        key = _TRAINER_ADAPTER_KEY.match(name)
        if key is None or key["adapter"] not in layouts or name not in layouts[key["adapter"]].shapes:
            raise ValueError(f"vllm engine: {name!r} is not one of the run's adapter tensors (under LoRA the "
                             "engine loads the adapters only)")
        out.setdefault(key["adapter"], {})[name] = tensor
    return out


def write_adapter(tensors: Mapping[str, Any], layout: AdapterLayout, directory: Path) -> Path:
    """One adapter's tensors (every one of ``layout``'s, by the trainer's names) as a peft directory
    vLLM loads (``base_model.model.<module>.lora_A.weight``); returns ``directory``."""
    from safetensors.torch import save_file

    if missing := sorted(set(layout.shapes) - set(tensors)):
        raise ValueError(f"vllm engine: an adapter update lacks {len(missing)} of the adapter's tensors: "
                         f"{missing[:3]}")
    peft: dict[str, Any] = {}
    for name, tensor in tensors.items():
        key = _TRAINER_ADAPTER_KEY.match(name)
        assert key is not None and name in layout.shapes  # adapters_of sorted them
        peft[f"base_model.model.{key['module']}.{key['which']}.weight"] = tensor
    directory.mkdir(parents=True, exist_ok=True)
    save_file(unique_tensors(peft), str(directory / ADAPTER_FILE), metadata={"format": "pt"})
    (directory / ADAPTER_CONFIG).write_text(layout.config_json)
    return directory
