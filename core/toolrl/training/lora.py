"""What the trainer does with LoRA adapters (injected by :mod:`toolrl.modeling.adapters`): only they train
(:func:`param_groups`), checkpoints hold them (:func:`trainable_state_dict`), ``export`` writes them in peft's
format (:func:`save_adapter`; :func:`save_peft` from the tensors alone). An engine that takes adapters gets only
the adapter tensors (:func:`iter_adapter_weights`); any other gets the base weights with ``W + alpha / r * B @ A``
merged in, one tensor at a time (:func:`iter_engine_weights`; gathering a sharded one is a collective). Several
policies on one base: docs/architecture.md.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from toolrl.agent_roles import trained_roles
from toolrl.modeling.adapters import ADAPTER, adapter_of, adapter_parameters, has_lora, lora_layers

if TYPE_CHECKING:
    import torch

    from toolrl.config import AdapterConfig


def trainable_parameters(model: Any) -> list[torch.nn.Parameter]:
    """What the optimizer gets: parameters that require grad (only the adapters under LoRA)."""
    return [p for p in model.parameters() if p.requires_grad]


def param_groups(model: Any, adapters: Mapping[str, AdapterConfig] | None, lr: float) -> list[dict[str, Any]]:
    """The optimizer's parameter groups: the trainable parameters at ``lr`` (``optim.lr``); under
    ``model.adapters`` one group per trained adapter at its own lr (``AdapterConfig.lr``, else ``lr``),
    a frozen one's parameters in none."""
    if adapters is None:
        return [{"params": trainable_parameters(model), "lr": lr}]
    groups = [{"params": list(adapter_parameters(model, name).values()),
               "lr": adapters[name].lr if adapters[name].lr is not None else lr} for name in trained_roles(adapters)]
    grouped = {id(p) for g in groups for p in g["params"]}
    stray = [name for name, p in model.named_parameters() if p.requires_grad and id(p) not in grouped]
    if stray or any(not p.requires_grad for g in groups for p in g["params"]):
        raise ValueError(f"model.adapters: the trainable parameters are not the trained adapters' "
                         f"(outside them: {stray[:3]})")
    return groups


def trainable_state_dict(model: Any) -> dict[str, torch.Tensor]:
    """What a checkpoint holds of the model, under its own names: the trained tensors and every adapter's, a
    frozen policy's too (a run resumes and exports every policy as it ran); sharded ones stay sharded."""
    return {name: p.detach() for name, p in model.named_parameters() if _saved(name, p)}


def frozen_adapter_state_dict(model: Any) -> dict[str, torch.Tensor]:
    """The frozen adapters' tensors (``model.adapters``' frozen policies): what a checkpoint holds
    beside the trained tensors and the optimizer state."""
    return {name: p.detach() for name, p in model.named_parameters()
            if not p.requires_grad and adapter_of(name) is not None}


def _saved(name: str, p: Any) -> bool:
    return bool(p.requires_grad) or adapter_of(name) is not None


def load_trainable_state_dict(model: Any, state: Mapping[str, Any]) -> None:
    """Load what :func:`trainable_state_dict` saved; every tensor it saves must be there."""
    wanted = {name for name, p in model.named_parameters() if _saved(name, p)}
    missing, unexpected = sorted(wanted - set(state)), sorted(set(state) - wanted)
    if missing or unexpected:
        raise KeyError(f"adapter checkpoint does not match the model: missing {missing[:3]}, "
                       f"unexpected {unexpected[:3]}")
    model.load_state_dict(dict(state), strict=False)


def save_adapter(model: Any, directory: str | os.PathLike[str], base_model: str | None = None,
                 adapter: str = ADAPTER) -> Path:
    """Write adapter ``adapter`` (``model.lora``'s, else a role's of ``model.adapters``) with
    :func:`save_peft`; gathers sharded tensors (a collective, like :func:`iter_engine_weights`)."""
    from peft import get_peft_model_state_dict

    if not has_lora(model):
        raise ValueError("save_adapter: the model has no LoRA adapters")
    state = {k: _full(v).detach() for k, v in get_peft_model_state_dict(model, adapter_name=adapter).items()}
    return save_peft(state, model.peft_config[adapter], directory, base_model)


def save_peft(state: Mapping[str, torch.Tensor], config: Any, directory: str | os.PathLike[str],
              base_model: str | None = None) -> Path:
    """An adapter's tensors (named as the model's, without the adapter's name: ``...q_proj.lora_A.weight``)
    and its ``config`` (peft's ``LoraConfig``) in peft's own format (``adapter_config.json`` +
    ``adapter_model.safetensors``), which ``peft.PeftModel.from_pretrained`` and LoRA-serving engines (vLLM)
    load; ``base_model`` is recorded as ``base_model_name_or_path``. Returns the directory."""
    from safetensors.torch import save_file

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    # peft's files name tensors as seen from a PeftModel wrapper (prefix base_model.model.).
    save_file({f"base_model.model.{k}": v.detach().cpu().contiguous() for k, v in state.items()},
              str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
    dataclasses.replace(config, base_model_name_or_path=base_model).save_pretrained(str(out))
    return out


def _full(t: torch.Tensor) -> torch.Tensor:
    """A plain tensor: an FSDP2-sharded ``DTensor`` is gathered (a collective over its mesh)."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def _merged(layer: Any, weight: torch.Tensor, adapter: str | None = None) -> torch.Tensor:
    """``W + scale * B @ A`` for each active adapter (``adapter``: for that one alone), as a new tensor
    in ``W``'s dtype; the sum is done in float32 so bf16 weights lose no more than the final rounding."""
    import torch

    w = _full(weight)
    if layer.merged:  # peft's own merge_adapter() already wrote the adapters into W
        return w
    out = None
    for name in layer.active_adapters if adapter is None else [adapter]:
        if name not in layer.lora_A:
            continue
        a = _full(layer.lora_A[name].weight).to(device=w.device, dtype=torch.float32)
        b = _full(layer.lora_B[name].weight).to(device=w.device, dtype=torch.float32)
        if layer.fan_in_fan_out:  # W is stored transposed ([in, out], GPT-2's Conv1D)
            a, b = b.T, a.T
        # One fused pass (a new tensor; W itself is only read); a float32 W is not copied first.
        out = torch.addmm(w.to(torch.float32) if out is None else out, b, a, alpha=layer.scaling[name])
    return w if out is None else out.to(w.dtype)


def iter_engine_weights(model: Any, state: Mapping[str, Any] | None = None,
                        adapter: str | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """``(base name, tensor)`` for every entry of the base model's state dict, LoRA merged in (the
    active adapters; ``adapter``: that one alone, a role's policy under ``model.adapters``).

    One merged tensor exists at a time unless the consumer keeps them; unadapted tensors are the
    model's own (detached, not copied) unless they are sharded, then gathered one by one. ``state``:
    the model's state dict already taken (a walk of a large model costs milliseconds).
    """
    import torch

    layers = lora_layers(model)
    with torch.no_grad():
        for key, value in (model.state_dict() if state is None else state).items():
            owner, rel = _split_lora_key(key, layers)
            if owner is None:
                yield key, _full(value).detach()
            elif rel.startswith("base_layer."):  # adapter tensors (lora_A, lora_B, ...) are dropped
                leaf = rel.removeprefix("base_layer.")
                merged = _merged(layers[owner], value, adapter) if leaf == "weight" else _full(value)
                yield f"{owner}.{leaf}", merged.detach()


def iter_adapter_weights(model: Any, state: Mapping[str, Any] | None = None,
                         adapters: Collection[str] | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` of every adapter tensor (``lora_A``, ``lora_B``, ...) under the model's own
    names, as an engine holding the same adapters (:func:`toolrl.modeling.adapters.apply_lora` on its base model) loads them;
    ``adapters``: of those adapters only. The model's own tensors, detached: a sharded one stays a
    ``DTensor`` (its owner sends its rows). ``state``: as for :func:`iter_engine_weights`."""
    layers = lora_layers(model)
    for key, value in (model.state_dict() if state is None else state).items():
        owner, rel = _split_lora_key(key, layers)
        if owner is not None and rel.startswith("lora_") and (adapters is None or adapter_of(rel) in adapters):
            yield key, value.detach()


def engine_state_dict(model: Any, adapter: str | None = None) -> dict[str, torch.Tensor]:
    """The state dict an engine loads: base names, adapters merged (``adapter``: that one alone); without
    LoRA the model's own (gathered if sharded)."""
    return dict(iter_engine_weights(model, adapter=adapter))


def _split_lora_key(key: str, layers: Mapping[str, Any]) -> tuple[str | None, str]:
    """``("model.layers.0.self_attn.q_proj", "base_layer.weight")`` for a key inside a LoRA layer."""
    if layers:
        parts = key.split(".")
        for i in range(len(parts) - 1, 0, -1):
            owner = ".".join(parts[:i])
            if owner in layers:
                return owner, ".".join(parts[i:])
    return None, key
