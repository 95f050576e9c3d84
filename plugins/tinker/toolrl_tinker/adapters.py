"""Every adapter the service puts on a base, in one place: a client's LoRA settings (toolrl's config, and
peft's for a PEFT directory) and the names adapters get (a training run's on the trainer, a saved weight set's
on the sampler). Tensors move under adapter-neutral names (what a checkpoint holds, what the sampler copies,
what a PEFT directory holds). Adapters are toolrl's (:mod:`toolrl.modeling.adapters`), routed per token
(:mod:`toolrl.modeling.adapter_routing`): other adapters' weights and gradients are not touched."""

from __future__ import annotations

from typing import Any

from toolrl.config import AdapterConfig
from toolrl.modeling.adapters import adapter_name

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
    return adapter_name("m", model_id)


def sampler_name(path: str) -> str:
    """A saved weight set's adapter on the sampler: its ``tinker://`` path made a torch module name."""
    return adapter_name("s", path)


def config(rank: int, targets: list[str], frozen: bool = False) -> AdapterConfig:
    """A client's LoRA settings as toolrl's adapter config (an engine's :meth:`add_adapter` takes it too)."""
    return AdapterConfig(r=rank, alpha=ALPHA, target_modules=targets, frozen=frozen)


def peft_config(rank: int, targets: list[str]) -> Any:
    """The same settings as peft's config, what a PEFT directory records (:func:`toolrl.training.lora.save_peft`)."""
    from peft import LoraConfig

    return LoraConfig(r=rank, lora_alpha=ALPHA, target_modules=targets, task_type="CAUSAL_LM")
