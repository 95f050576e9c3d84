"""LoRA adapters on a torch model through ``peft``, injected *in place* (no ``PeftModel`` wrapper): the
model keeps its class, so the trainer's code, checkpoints and FSDP2 see the same module tree, the
adapted Linears now peft's LoRA layers (``q_proj.base_layer.weight``, ``q_proj.lora_A.default.weight``)
and the base frozen. ``model.lora`` is the one adapter ``"default"`` (:func:`apply_lora`); ``model.adapters``
one per role under its name (:func:`apply_adapters`), each token routed through its own
(:mod:`toolrl.modeling.adapter_routing`). A service adds and removes adapters by name at run time and
moves one adapter's tensors into another under names without either's (:func:`adapter_state`).
``peft`` and ``torch`` are imported inside the functions.
"""

from __future__ import annotations

import hashlib
import re
import sys
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from toolrl.config import ConfigError, first_line
from toolrl.modeling.adapter_routing import adapter_names, has_routing, route_adapters

if TYPE_CHECKING:
    import torch

    from toolrl.config import AdapterConfig, LoraConfig

ADAPTER = "default"  # the adapter name peft gives a single adapter
_MODULE_REPR = re.compile(r"(Target module \w+)\(.*\n\)", re.S)  # a module's repr in peft's errors


def adapter_name(prefix: str, key: str) -> str:
    """The adapter name for any string ``key`` (a client's model id, a checkpoint's path): ``prefix`` (a
    letter, then letters, digits or '_'), '_' and 16 hex digits of the key's SHA-1: a torch module name."""
    if not re.fullmatch(r"[A-Za-z]\w*", prefix):
        raise ValueError(f"adapter_name: the prefix {prefix!r} is not a letter followed by letters, digits or '_'")
    return f"{prefix}_{hashlib.sha1(key.encode()).hexdigest()[:16]}"


def apply_lora(model: Any, config: LoraConfig, name: str = ADAPTER) -> Any:
    """Inject LoRA adapter ``name`` into ``model`` in place and freeze everything else; returns ``model``.
    Raises ConfigError naming ``model.lora.target_modules`` when no module matches, a match is not a
    Linear layer, or shares its weight with another module (tied embeddings: an engine has one tensor for
    both, so the merged weight could not reach it)."""
    _inject(model, config, name, "model.lora.target_modules")
    return model


def apply_adapters(model: torch.nn.Module, adapters: Mapping[str, AdapterConfig]) -> torch.nn.Module:
    """One adapter per role (``model.adapters``) under the role's name, in order (:func:`add_adapter`);
    returns ``model``, whose forwards then run inside :func:`toolrl.modeling.adapter_routing.routed`."""
    for role, config in adapters.items():
        add_adapter(model, role, config)
    return model


def add_adapter(model: torch.nn.Module, name: str, config: AdapterConfig, seed: int | None = None) -> None:
    """Adapter ``name`` on ``model``, routed beside any others: its parameters require grad unless
    ``config.frozen``, every other's ``requires_grad`` stays (the first adapter freezes the base).
    ``seed``: peft's initialisation (``lora_A`` random, ``lora_B`` zero) drawn from it, the process's
    random state untouched. Raises ConfigError naming ``model.adapters.<name>`` (a bad name or target),
    ValueError for a name in use."""
    import torch

    if not name or "." in name:  # peft's ModuleDict keys, then the tensor names
        raise ConfigError(f"model.adapters.{name}: an adapter's name is part of torch's module names, which "
                          "cannot be empty or contain '.'")
    if name in adapter_names(model):
        raise ValueError(f"model.adapters.{name}: the model has an adapter of that name already")
    trained = {key for key, p in model.named_parameters() if p.requires_grad} if has_routing(model) else set()
    with warnings.catch_warnings(), torch.random.fork_rng(devices=[], enabled=seed is not None):
        warnings.filterwarnings("ignore", message=".*multiple adapters.*")  # several adapters: the point
        if seed is not None:
            torch.manual_seed(seed)
        _inject(model, config, name, f"model.adapters.{name}.target_modules")
    route_adapters(model)  # injecting activates the new adapter in peft: routing adds it
    for key, p in model.named_parameters():
        p.requires_grad_(key in trained or (not config.frozen and adapter_of(key) == name))


def remove_adapter(model: torch.nn.Module, name: str) -> None:
    """Delete adapter ``name`` (its tensors and config) from a model that routes adapters; the others'
    indices among :func:`toolrl.modeling.adapter_routing.adapter_names` shift down past it."""
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


# A LoRA tensor's part of its parameter name (``.lora_A.``), before the adapter's name in a model's names.
_LORA_PART = r"(\.lora_[^.]+)\."


def adapter_parameters(model: torch.nn.Module, name: str) -> dict[str, torch.nn.Parameter]:
    """Adapter ``name``'s parameters by their names without the adapter's (``...q_proj.lora_A.weight``),
    in the model's order; raises ValueError for an adapter the model does not hold."""
    if name not in adapter_names(model):
        raise ValueError(f"the model has no adapter {name!r}")
    # The part after lora_A (lora_B, ...) names the adapter: dropped.
    return {re.sub(_LORA_PART + r"[^.]+\.", r"\1.", key, count=1): p for key, p in model.named_parameters()
            if adapter_of(key) == name}


def adapter_keys(state: Mapping[str, Any], name: str) -> dict[str, Any]:
    """:func:`adapter_state`'s tensors under adapter ``name``'s parameter names
    (``...q_proj.lora_A.<name>.weight``): the inverse of :func:`adapter_parameters`' naming, what an engine's
    weight rows carry for that adapter."""
    return {re.sub(_LORA_PART, rf"\1.{name}.", key, count=1): t for key, t in state.items()}


def adapter_state(model: torch.nn.Module, name: str) -> dict[str, torch.Tensor]:
    """A copy of adapter ``name``'s tensors by :func:`adapter_parameters`' names: what
    :func:`load_adapter_state` loads into any adapter of the same rank and targets on the same base."""
    return {key: p.detach().clone() for key, p in adapter_parameters(model, name).items()}


def load_adapter_state(model: torch.nn.Module, name: str, state: Mapping[str, torch.Tensor]) -> None:
    """Copy ``state`` (as :func:`adapter_state` gives it) into adapter ``name``'s tensors; raises
    ValueError, nothing written, unless it holds exactly that adapter's names and shapes."""
    import torch

    own = adapter_parameters(model, name)
    if set(own) != set(state) or any(tuple(p.shape) != tuple(state[key].shape) for key, p in own.items()):
        raise ValueError(f"the adapter's tensors do not fit adapter {name!r} of this model (another base, rank "
                         "or target modules)")
    with torch.no_grad():
        for key, p in own.items():
            p.copy_(state[key])


def _inject(model: Any, config: LoraConfig, name: str, field: str) -> None:
    """Adapter ``name`` into ``model`` in place, the base frozen; a bad target is a ConfigError naming ``field``."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import inject_adapter_in_model
    from peft.tuners.lora import Linear as LoraLinear

    targets = config.target_modules
    tied = _tied_module_names(model)
    # A vision-language model's (its config names a vision tower) adapters go on its language model only.
    exclude = r".*\bvisual\b.*" if getattr(model.config, "vision_config", None) is not None else None
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


def adapter_of(name: str) -> str | None:
    """The adapter a tensor of the model belongs to, by its name (``...q_proj.lora_A.<adapter>.weight``);
    None: a tensor of no adapter."""
    parts = name.split(".")
    return next((parts[i + 1] for i, part in enumerate(parts[:-1]) if part.startswith("lora_")), None)
