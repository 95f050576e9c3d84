"""Every adapter the service puts on a base, in one place: a client's LoRA settings, the names adapters
get (a training run's on the trainer, a saved weight set's on the sampler), and an adapter's tensors out
and back in under adapter-neutral names (what a checkpoint holds, what the sampler copies, what a PEFT
directory holds). Adapters are toolrl's (:mod:`toolrl.training.lora`), routed per token
(:mod:`toolrl.engines.adapters`): other adapters' weights and gradients are not touched."""

from __future__ import annotations

import hashlib
from typing import Any

from toolrl_tinker.requests import UserError

# LoRA's scale numerator: the update is ALPHA / rank * B @ A.
ALPHA = 32.0
# The sampler's adapter of zeros that stands for the base model itself.
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
    return "m_" + hashlib.sha1(model_id.encode()).hexdigest()[:16]


def sampler_name(path: str) -> str:
    """A saved weight set's adapter on the sampler: its ``tinker://`` path made a torch module name."""
    return "s_" + hashlib.sha1(path.encode()).hexdigest()[:16]


def _config(rank: int, targets: list[str], frozen: bool = False) -> Any:
    from toolrl.config import AdapterConfig

    return AdapterConfig(r=rank, alpha=ALPHA, target_modules=targets, frozen=frozen)


def add(model: Any, name: str, rank: int, targets: list[str], seed: int | None) -> None:
    """A trained adapter ``name`` (peft's init: A random from ``seed``, B zero)."""
    import torch
    from toolrl.training.lora import add_adapter

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0 if seed is None else seed)
        add_adapter(model, name, _config(rank, targets))


def add_frozen(model: Any, name: str, rank: int, targets: list[str], state: dict[str, Any]) -> None:
    """A frozen adapter ``name`` holding ``state`` (:func:`state`'s tensors); nothing when ``model``
    holds ``name`` already."""
    from toolrl.training.lora import add_adapter

    if holds(model, name):
        return
    add_adapter(model, name, _config(rank, targets, frozen=True))
    load(model, name, state)


def add_zero(model: Any) -> None:
    """:data:`BASE_ADAPTER`: an adapter of zeros on every linear a client may adapt (the base model)."""
    import torch
    from toolrl.config import AdapterConfig
    from toolrl.training.lora import add_adapter

    add_adapter(model, BASE_ADAPTER, AdapterConfig(r=1, alpha=1.0, target_modules=ATTN + MLP, frozen=True))
    with torch.no_grad():
        for p in parameters(model, BASE_ADAPTER):
            p.zero_()


def remove(model: Any, name: str) -> None:
    """Adapter ``name`` off ``model`` (nothing when it holds none of that name)."""
    from toolrl.training.lora import remove_adapter

    if holds(model, name):
        remove_adapter(model, name)


def holds(model: Any, name: str) -> bool:
    from toolrl.engines.adapters import adapter_names

    return name in adapter_names(model)


def parameters(model: Any, name: str) -> list[Any]:
    return list(_named(model, name).values())


def _named(model: Any, name: str) -> dict[str, Any]:
    """The adapter's parameters under names without the adapter's (another adapter's names load them)."""
    from toolrl.training.lora import adapter_of

    tag = f".{name}."
    return {n.replace(tag, "."): p for n, p in model.named_parameters() if adapter_of(n) == name}


def state(model: Any, name: str) -> dict[str, Any]:
    """A copy of the adapter's tensors under adapter-neutral names."""
    return {n: p.detach().clone() for n, p in _named(model, name).items()}


def load(model: Any, name: str, tensors: dict[str, Any]) -> None:
    """``tensors`` (:func:`state`'s) into adapter ``name``."""
    import torch

    mine = _named(model, name)
    if set(mine) != set(tensors):
        raise UserError("the checkpoint's adapter does not fit this model (another base, rank or target modules)")
    with torch.no_grad():
        for n, p in mine.items():
            p.copy_(tensors[n])


def peft_files(tensors: dict[str, Any], rank: int, targets: list[str], base: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """An adapter's tensors (:func:`state`'s) as a PEFT adapter directory holds them: the tensors of
    ``adapter_model.safetensors`` and ``adapter_config.json``."""
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": ALPHA, "target_modules": targets, "lora_dropout": 0.0,
              "bias": "none", "task_type": "CAUSAL_LM", "base_model_name_or_path": base}
    return {f"base_model.model.{k}": v.contiguous() for k, v in tensors.items()}, config
