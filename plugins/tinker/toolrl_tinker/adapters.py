"""Every adapter the service puts on a base, in one place: a client's LoRA settings, the names adapters
get (a training run's on the trainer, a saved weight set's on the sampler), and an adapter's tensors out
and back in under adapter-neutral names (what a checkpoint holds, what the sampler copies, what a PEFT
directory holds). Adapters are toolrl's (:mod:`toolrl.modeling.adapters`), routed per token
(:mod:`toolrl.modeling.adapter_routing`): other adapters' weights and gradients are not touched."""

from __future__ import annotations

import re
from typing import Any

from toolrl_tinker.requests import UserError

# LoRA's scale numerator: the update is ALPHA / rank * B @ A.
ALPHA = 32.0
# The sampler's adapter that stands for the base model itself: rank 1 on every linear a client may adapt,
# never sent tensors (lora_B zero).
BASE_ADAPTER = "base"
ATTN = ["q_proj", "k_proj", "v_proj", "o_proj"]
MLP = ["gate_proj", "up_proj", "down_proj"]


def target_modules(train_attn: bool, train_mlp: bool) -> list[str]:
    targets = (ATTN if train_attn else []) + (MLP if train_mlp else [])
    if not targets:
        raise UserError("lora_config: train_attn and train_mlp are both false: nothing would train")
    return targets


def training_name(model_id: str) -> str:
    """A training run's adapter on the trainer: its model id made a torch module name."""
    from toolrl.modeling.adapters import adapter_name

    return adapter_name("m", model_id)


def sampler_name(path: str) -> str:
    """A saved weight set's adapter on the sampler: its ``tinker://`` path made a torch module name."""
    from toolrl.modeling.adapters import adapter_name

    return adapter_name("s", path)


def config(rank: int, targets: list[str], frozen: bool = False) -> Any:
    """A client's LoRA settings as toolrl's adapter config (an engine's :meth:`add_adapter` takes it too)."""
    from toolrl.config import AdapterConfig

    return AdapterConfig(r=rank, alpha=ALPHA, target_modules=targets, frozen=frozen)


def add(model: Any, name: str, rank: int, targets: list[str], seed: int | None) -> None:
    """A trained adapter ``name`` (peft's init: A random from ``seed``, 0 when None, B zero)."""
    from toolrl.modeling.adapters import add_adapter

    add_adapter(model, name, config(rank, targets), seed=0 if seed is None else seed)


def remove(model: Any, name: str) -> None:
    """Adapter ``name`` off ``model`` (nothing when it holds none of that name)."""
    from toolrl.modeling.adapters import remove_adapter

    if holds(model, name):
        remove_adapter(model, name)


def holds(model: Any, name: str) -> bool:
    from toolrl.modeling.adapter_routing import adapter_names

    return name in adapter_names(model)


def parameters(model: Any, name: str) -> list[Any]:
    from toolrl.modeling.adapters import adapter_parameters

    return list(adapter_parameters(model, name).values())


def state(model: Any, name: str) -> dict[str, Any]:
    """A copy of the adapter's tensors under adapter-neutral names."""
    from toolrl.modeling.adapters import adapter_state

    return adapter_state(model, name)


def named_for(tensors: dict[str, Any], name: str) -> dict[str, Any]:
    """An adapter's tensors (:func:`state`'s) under the names an engine takes them for adapter ``name``: the
    trainer's (``...q_proj.lora_A.<name>.weight``)."""
    return {re.sub(r"(\.lora_[^.]+)\.", rf"\1.{name}.", key, count=1): t for key, t in tensors.items()}


def load(model: Any, name: str, tensors: dict[str, Any]) -> None:
    """``tensors`` (:func:`state`'s) into adapter ``name``."""
    from toolrl.modeling.adapters import load_adapter_state

    try:
        load_adapter_state(model, name, tensors)
    except ValueError:
        raise UserError("the checkpoint's adapter does not fit this model (another base, rank or target modules)") from None


def peft_files(tensors: dict[str, Any], rank: int, targets: list[str], base: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """An adapter's tensors (:func:`state`'s) as a PEFT adapter directory holds them: the tensors of
    ``adapter_model.safetensors`` and ``adapter_config.json``."""
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": ALPHA, "target_modules": targets, "lora_dropout": 0.0,
              "bias": "none", "task_type": "CAUSAL_LM", "base_model_name_or_path": base}
    return {f"base_model.model.{k}": v.contiguous() for k, v in tensors.items()}, config
