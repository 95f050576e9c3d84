"""LoRA fine-tuning through ``peft``: only the adapters train; engines get the adapters or merged weights.

:func:`apply_lora` injects the adapters into the Hugging Face model *in place* (no ``PeftModel``
wrapper), so the model keeps its own class and attributes: the GRPO code, checkpoints and FSDP2
wrapping per decoder layer see the same module tree as without LoRA, with the adapted Linears
replaced by ``peft`` LoRA layers (``q_proj.base_layer.weight``, ``q_proj.lora_A.default.weight``, ...)
and every base parameter frozen. ``model.lora`` is the one adapter ``"default"``; ``model.adapters`` is one
adapter per role under the role's name (:func:`apply_adapters`), each token routed through its own
(:mod:`toolrl.engines.adapters`).

An engine that takes adapters (``RolloutEngine.loads_adapters``) gets :func:`apply_lora` once (run on its
own base model, or by vLLM on a weightless skeleton to learn the adapter's layout) and then only the
adapter tensors (:func:`iter_adapter_weights`). Any other engine
never sees adapters: :func:`engine_state_dict` gives the base model's state dict under the base
model's parameter names with ``W + alpha / r * B @ A`` in place of each adapted weight, computed one
tensor at a time from the trained model without changing it, so ``engine.update_weights`` and the Ray
broadcast work unchanged. Sharded (FSDP2 ``DTensor``) parameters are gathered one tensor at a time,
which is a collective: every rank must iterate :func:`iter_engine_weights` together.

Several policies on one base (``model.adapters``) are several adapters under their roles' names
(``q_proj.lora_A.<role>.weight``); what trains, syncs, is checkpointed and exported of each:
docs/architecture.md, "Several policies on one base".

``peft`` and ``torch`` are imported inside the functions.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
import warnings
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from toolrl.agent_roles import trained_roles
from toolrl.config import ConfigError
from toolrl.engines.adapters import adapter_names, has_routing, require_routing
from toolrl.model_sources import first_line

if TYPE_CHECKING:
    import torch

    from toolrl.config import AdapterConfig, LoraConfig

ADAPTER = "default"  # the adapter name peft gives a single adapter
_MODULE_REPR = re.compile(r"(Target module \w+)\(.*\n\)", re.S)  # a module's repr in peft's errors


def apply_lora(model: Any, config: LoraConfig, name: str = ADAPTER) -> Any:
    """Inject LoRA adapter ``name`` into ``model`` in place and freeze everything else; returns ``model``.

    Raises :class:`~toolrl.config.ConfigError` naming ``model.lora.target_modules`` when no module
    matches, a match is not a Linear layer, or a match shares its weight with another module (tied
    embeddings: the engine copy has one tensor for both, so the merged weight could not reach it).
    """
    _inject(model, config, name, "model.lora.target_modules")
    return model


def apply_adapters(model: torch.nn.Module, adapters: Mapping[str, AdapterConfig]) -> torch.nn.Module:
    """One LoRA adapter per role (``model.adapters``), injected in place under the role's name, in the
    mapping's order; returns ``model``. Its forwards then run inside
    :func:`toolrl.engines.adapters.routed` (each token through its role's adapter). Only the adapters
    that are not ``frozen`` require grad. The checks of :func:`apply_lora`, each naming
    ``model.adapters.<role>.target_modules``."""
    for role in adapters:
        if "." in role:  # torch's module names (peft's ModuleDict keys, the tensor names) cannot hold one
            raise ConfigError(f"model.adapters.{role}: an adapter per role is named by its role, which "
                              "then cannot contain '.'")
    for role, config in adapters.items():
        with warnings.catch_warnings():  # peft warns that a second adapter makes several: that is the point
            warnings.filterwarnings("ignore", message=".*multiple adapters.*")
            _inject(model, config, role, f"model.adapters.{role}.target_modules")
    require_routing(model)
    trained = trained_roles(adapters)
    for layer in lora_layers(model).values():
        for role in trained:
            for attr in layer.adapter_layer_names:
                if role in getattr(layer, attr):
                    getattr(layer, attr)[role].requires_grad_(True)
    return model


def add_adapter(model: torch.nn.Module, name: str, config: AdapterConfig) -> None:
    """One more adapter ``name`` on ``model`` at run time (a service whose clients come and go): as
    :func:`apply_adapters` for the first, and on a model that routes adapters already, injected beside
    them with peft's own adapter sum kept off and every other adapter's ``requires_grad`` as it was."""
    if not has_routing(model):
        apply_adapters(model, {name: config})
        return
    if name in adapter_names(model):
        raise ValueError(f"model.adapters.{name}: the model has an adapter of that name already")
    trained = {key for key, p in model.named_parameters() if p.requires_grad}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*multiple adapters.*")
        _inject(model, config, name, f"model.adapters.{name}.target_modules")
    for layer in lora_layers(model).values():
        layer.set_adapter([], inference_mode=True)  # injecting activates the new adapter in peft: routing adds it
    for key, p in model.named_parameters():
        p.requires_grad_(key in trained or (not config.frozen and adapter_of(key) == name))


def remove_adapter(model: torch.nn.Module, name: str) -> None:
    """Delete adapter ``name`` (its tensors and config) from a model that routes adapters; the others'
    indices among :func:`toolrl.engines.adapters.adapter_names` shift down past it."""
    if name not in adapter_names(model):
        raise ValueError(f"remove_adapter: the model has no adapter {name!r}")
    trained = {key for key, p in model.named_parameters() if p.requires_grad}
    for layer in lora_layers(model).values():
        if name in layer.lora_A:
            layer.delete_adapter(name)
        layer.set_adapter([], inference_mode=True)  # deleting may activate another adapter in peft
    del model.peft_config[name]
    for key, p in model.named_parameters():
        p.requires_grad_(key in trained)


def _inject(model: Any, config: LoraConfig, name: str, field: str) -> None:
    """Adapter ``name`` into ``model`` in place, the base frozen; a bad target is a ConfigError naming ``field``."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import inject_adapter_in_model
    from peft.tuners.lora import Linear as LoraLinear

    from toolrl.training.vision import is_vision_model

    targets = config.target_modules
    tied = _tied_module_names(model)
    # A vision-language model's adapters go on its language model only (the vision tower stays frozen).
    exclude = r".*\bvisual\b.*" if is_vision_model(model) else None
    # peft's warnings (a tied layer adapted, ...) wait for the checks below: a refused target is one line.
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        try:
            inject_adapter_in_model(
                PeftLoraConfig(r=config.r, lora_alpha=config.alpha, lora_dropout=config.dropout,
                               target_modules=targets, exclude_modules=exclude, bias="none"),
                model, adapter_name=name)
        except ValueError as exc:  # "Target module Qwen3MLP(<its repr, over lines>) is not supported": the class
            said = _MODULE_REPR.sub(lambda m: m.group(1), str(exc))
            raise ConfigError(f"{field}: {first_line(said)}") from None
    layers = {key: m for key, m in lora_layers(model).items()
              if any(name in getattr(m, attr) for attr in m.adapter_layer_names)}
    bad = [f"{key} ({type(m.get_base_layer()).__name__})" for key, m in layers.items()
           if not isinstance(m, LoraLinear)]
    shared = sorted(set(layers) & tied)
    if bad or shared:
        what = (f"are not Linear layers: {', '.join(bad[:3])}" if bad
                else f"share a tied weight with another module: {', '.join(shared[:3])}")
        raise ConfigError(f"{field}: {targets} matches modules that {what}")
    for warning in warned:
        warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)


def _tied_module_names(model: Any) -> set[str]:
    """Modules whose ``weight`` is the same tensor as another module's (tied input/output embeddings)."""
    owners: dict[int, list[str]] = {}
    wrappers = {id(m) for m in lora_layers(model).values()}
    for name, module in model.named_modules(remove_duplicate=False):
        if id(module) in wrappers:  # a LoRA layer's weight is its base layer's: no tie (another adapter's)
            continue
        weight = getattr(module, "weight", None)
        if weight is not None:
            owners.setdefault(id(weight), []).append(name.removesuffix(".base_layer"))
    return {name for names in owners.values() if len(names) > 1 for name in names}


def lora_layers(model: Any) -> dict[str, Any]:
    """The model's peft LoRA layers by module name (empty without LoRA)."""
    if "peft" not in sys.modules:  # no LoRA layer can exist; full fine-tuning never imports peft
        return {}
    from peft.tuners.lora import LoraLayer

    return {name: m for name, m in model.named_modules() if isinstance(m, LoraLayer)}


def has_lora(model: Any) -> bool:
    """Whether :func:`apply_lora` (or peft) put adapters into ``model``."""
    return bool(lora_layers(model))


def trainable_parameters(model: Any) -> list[torch.nn.Parameter]:
    """What the optimizer gets: parameters that require grad (only the adapters under LoRA)."""
    return [p for p in model.parameters() if p.requires_grad]


def adapter_of(name: str) -> str | None:
    """The adapter a tensor of the model belongs to, by its name (``...q_proj.lora_A.<adapter>.weight``);
    None: a tensor of no adapter."""
    parts = name.split(".")
    return next((parts[i + 1] for i, part in enumerate(parts[:-1]) if part.startswith("lora_")), None)


def param_groups(model: Any, adapters: Mapping[str, AdapterConfig] | None, lr: float) -> list[dict[str, Any]]:
    """The optimizer's parameter groups: the trainable parameters at ``lr`` (``optim.lr``); under
    ``model.adapters`` one group per trained adapter at its own lr (``AdapterConfig.lr``, else ``lr``),
    a frozen one's parameters in none."""
    if adapters is None:
        return [{"params": trainable_parameters(model), "lr": lr}]
    by_adapter: dict[str, list[Any]] = {}
    for name, p in model.named_parameters():
        if (adapter := adapter_of(name)) is not None:
            by_adapter.setdefault(adapter, []).append(p)
    groups = [{"params": by_adapter[name], "lr": adapters[name].lr if adapters[name].lr is not None else lr}
              for name in trained_roles(adapters)]
    grouped = {id(p) for g in groups for p in g["params"]}
    stray = [name for name, p in model.named_parameters() if p.requires_grad and id(p) not in grouped]
    if stray or any(not p.requires_grad for g in groups for p in g["params"]):
        raise ValueError(f"model.adapters: the trainable parameters are not the trained adapters' "
                         f"(outside them: {stray[:3]})")
    return groups


def trainable_state_dict(model: Any) -> dict[str, torch.Tensor]:
    """What a checkpoint holds of the model, under its own names: the trained tensors (an adapter-only
    checkpoint under LoRA) and every adapter's, a frozen policy's too (``model.adapters``: a run
    resumes and exports every policy as it ran).

    Sharded parameters stay sharded (``DTensor``), as torch.distributed.checkpoint expects.
    """
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
    """Write adapter ``adapter`` (``model.lora``'s, else a role's of ``model.adapters``) in peft's own
    format (``adapter_config.json`` + ``adapter_model.safetensors``), which
    ``peft.PeftModel.from_pretrained`` and LoRA-serving engines (vLLM) load; ``base_model`` is recorded
    as ``base_model_name_or_path``. Gathers sharded tensors (a collective, like
    :func:`iter_engine_weights`). Returns the directory."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    if not has_lora(model):
        raise ValueError("save_adapter: the model has no LoRA adapters")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    # peft's files name tensors as seen from a PeftModel wrapper (prefix base_model.model.).
    state = {f"base_model.model.{k}": _full(v).detach().cpu().contiguous()
             for k, v in get_peft_model_state_dict(model, adapter_name=adapter).items()}
    save_file(state, str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
    dataclasses.replace(model.peft_config[adapter], base_model_name_or_path=base_model).save_pretrained(str(out))
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
                name = f"{owner}.{leaf}"
                merged = _merged(layers[owner], value, adapter) if leaf == "weight" else _full(value)
                yield name, merged.detach()


def iter_adapter_weights(model: Any, state: Mapping[str, Any] | None = None,
                         adapters: Collection[str] | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` of every adapter tensor (``lora_A``, ``lora_B``, ...) under the model's own
    names, as an engine holding the same adapters (:func:`apply_lora` on its base model) loads them;
    ``adapters``: of those adapters only. The model's own tensors, detached: a sharded one stays a
    ``DTensor`` (its owner sends its rows). ``state``: as for :func:`iter_engine_weights`."""
    layers = lora_layers(model)
    for key, value in (model.state_dict() if state is None else state).items():
        owner, rel = _split_lora_key(key, layers)
        if owner is not None and rel.startswith("lora_") and (adapters is None or adapter_of(rel) in adapters):
            yield key, value.detach()


def engine_state_dict(model: Any, adapter: str | None = None) -> dict[str, torch.Tensor]:
    """The state dict an engine loads: base names, adapters merged (``adapter``: that one alone);
    ``model`` is left as it was.

    Without LoRA this is the model's own state dict (gathered if sharded).
    """
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
