"""Adapters in and out of the service, on the machine that holds its state directory:

- out (``toolrl tinker export``): a client's checkpoint merged into its base's full weights, a Hugging
  Face model directory that ``from_pretrained`` loads (weights, config, tokenizer files);
- in (``toolrl tinker import``): an outside PEFT LoRA adapter directory made a checkpoint of a key's, which
  that client starts a training client from (``create_training_client_from_state``) or samples
  (``create_sampling_client(model_path=...)``).

A checkpoint is :mod:`toolrl_tinker.store`'s: a ``.pt`` file of the adapter's tensors under
adapter-neutral names (``model.layers.0.self_attn.q_proj.lora_A.weight``), or a PEFT directory for
``external_weights``. The update of a module is ``ALPHA / rank * B @ A`` (:data:`toolrl_tinker.adapters.ALPHA`);
an imported adapter's own scale (``lora_alpha / r``, or ``lora_alpha / sqrt(r)`` with rsLoRA) is folded
into its ``B``, so it computes what it computed under PEFT.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

from toolrl_tinker import adapters
from toolrl_tinker.adapters import ALPHA, ATTN, MLP
from toolrl_tinker.requests import UserError
from toolrl_tinker.store import Store

A, B = ".lora_A.weight", ".lora_B.weight"
PREFIX = "base_model.model."  # what PEFT puts before the model's own module names
# PEFT settings this server's adapters have no counterpart for, with the value that means "not used".
UNSUPPORTED = {"use_dora": False, "fan_in_fan_out": False, "lora_bias": False, "rank_pattern": {}, "alpha_pattern": {},
               "layers_to_transform": None, "modules_to_save": None, "layer_replication": None,
               "trainable_token_indices": None}


def read_peft(folder: Path) -> tuple[dict[str, Any], int, list[str], str | None]:
    """A PEFT LoRA adapter directory as (tensors under adapter-neutral names, their ``B`` scaled for
    :data:`ALPHA`; rank; target modules; ``base_model_name_or_path``)."""
    import torch
    from safetensors.torch import load_file

    config_file = folder / "adapter_config.json"
    if not config_file.is_file():
        raise UserError(f"{folder}: no adapter_config.json (a PEFT adapter directory has one)")
    config = json.loads(config_file.read_text())
    if config.get("peft_type") != "LORA":
        raise UserError(f"{config_file}: peft_type {config.get('peft_type')!r}: only LORA adapters are taken")
    for key, unused in UNSUPPORTED.items():
        if config.get(key, unused) not in (unused, None, {}, []):
            raise UserError(f"{config_file}: {key}={config[key]!r}: this server's adapters have no such setting")
    if config.get("bias", "none") != "none":
        raise UserError(f"{config_file}: bias={config['bias']!r}: this server's adapters train no biases")
    weights = folder / "adapter_model.safetensors"
    if weights.is_file():
        raw = load_file(str(weights))
    elif (folder / "adapter_model.bin").is_file():
        raw = torch.load(folder / "adapter_model.bin", weights_only=True)
    else:
        raise UserError(f"{folder}: no adapter_model.safetensors or adapter_model.bin")
    rank, alpha = int(config["r"]), float(config["lora_alpha"])
    scale = (alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank) / (ALPHA / rank)
    tensors: dict[str, Any] = {}
    for key, value in raw.items():
        name = key.removeprefix(PREFIX)
        if not name.endswith((A, B)):
            raise UserError(f"{weights.name}: tensor {key!r} is not a LoRA A or B weight (DoRA, biases, embeddings "
                            "and saved modules are not taken)")
        tensors[name] = value.float().contiguous() * (scale if name.endswith(B) else 1.0)
    targets = {name.removesuffix(A).removesuffix(B).rsplit(".", 1)[-1] for name in tensors}
    if unknown := sorted(targets - set(ATTN + MLP)):
        raise UserError(f"{folder}: target modules {', '.join(unknown)}: this server adapts {', '.join(ATTN + MLP)}")
    return tensors, rank, [t for t in ATTN + MLP if t in targets], config.get("base_model_name_or_path")


def import_peft(state_dir: Path, folder: Path, owner: str, base: str, source: str, name: str | None = None) -> str:
    """PEFT adapter ``folder`` as a checkpoint of ``owner``'s on base ``base`` (which loads ``source``) in
    the server's state ``state_dir``; its ``tinker://`` path. The adapter must cover every layer's
    ``q_proj``... it names, with shapes that fit the base."""
    import torch

    tensors, rank, targets, _ = read_peft(folder)
    _check_fits(tensors, rank, targets, _model_dir(source))
    store = Store(state_dir, {base: source})
    model_id = f"import-{uuid.uuid4().hex[:12]}"
    name = name or folder.resolve().name
    file = store.checkpoint_file(model_id, "weights", name)
    torch.save({"adapter": tensors, "base": base, "rank": rank, "targets": targets, "steps": 0, "optimizer": None}, file)
    store.add_run(model_id, owner, base, rank, targets, None)
    path = f"tinker://{model_id}/weights/{name}"
    store.add_checkpoint(path, owner, model_id, "weights", name, file)
    return path


def export_merged(state_dir: Path, path: str, out: Path, dtype: str = "float32") -> Path:
    """Checkpoint ``path`` of the server's state ``state_dir`` merged into its base's weights, written
    to ``out`` as a Hugging Face model directory (safetensors in ``dtype``, config, tokenizer files)."""
    import torch
    from toolrl.model_sources import load_model

    from toolrl_tinker import trainer
    from toolrl_tinker.hub_names import ALIASES, TOKENIZER_FILES

    store = Store(state_dir)
    found = store.checkpoint(path)
    if found is None:
        raise UserError(f"checkpoint {path!r} is not in {state_dir} (the rest client's list_checkpoints names them)")
    run = store.run(found["model_id"]) or {}
    source = run.get("source") or ALIASES.get(run.get("base", ""), run.get("base", ""))
    if found["kind"] == "external_weights":
        tensors, rank, _, _ = read_peft(Path(found["file"]))
    else:
        state = trainer.read(found["file"])
        tensors, rank = state["adapter"], state["rank"]
    model_dir = _model_dir(source)
    model = load_model(model_dir, dtype="float32", device="cpu")
    with torch.no_grad():
        for key, a in tensors.items():
            if key.endswith(A):
                module = key.removesuffix(A)
                weight = model.get_submodule(module).weight
                weight.add_(tensors[module + B].float() @ a.float(), alpha=ALPHA / rank)
    tmp = out.with_name(f".{out.name}.{uuid.uuid4().hex[:6]}")
    model.to(getattr(torch, dtype)).save_pretrained(str(tmp))
    for file in (Path(model_dir) / f for f in TOKENIZER_FILES):  # the base's, beside what save_pretrained wrote
        if file.is_file() and not (tmp / file.name).exists():
            shutil.copyfile(file, tmp / file.name)
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return out


def _model_dir(source: str) -> str:
    from toolrl.config import ModelConfig
    from toolrl.model_sources import resolve_source

    return resolve_source(ModelConfig(source=source))


def _check_fits(tensors: dict[str, Any], rank: int, targets: list[str], model_dir: str) -> None:
    """Raise :class:`UserError` unless ``tensors`` are the rank-``rank`` adapter on ``targets`` that the
    trainer makes on the model in ``model_dir`` (its shapes read from its config, no weights loaded)."""
    import torch
    from toolrl.modeling.adapters import adapter_parameters, add_adapter
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    add_adapter(model, "fits", adapters.config(rank, targets))
    want = {name: tuple(p.shape) for name, p in adapter_parameters(model, "fits").items()}
    if missing := sorted(set(want) - set(tensors)):
        raise UserError(f"the adapter lacks {len(missing)} tensor(s) of the base's {', '.join(targets)} (first: "
                        f"{missing[0]}): this server's adapters cover every layer")
    if extra := sorted(set(tensors) - set(want)):
        raise UserError(f"the adapter's tensor {extra[0]} is no {', '.join(targets)} linear of the base")
    if bad := [k for k, shape in want.items() if tuple(tensors[k].shape) != shape]:
        raise UserError(f"the adapter's {bad[0]} has shape {list(tensors[bad[0]].shape)}, the base needs "
                        f"{list(want[bad[0]])}: another base model, or another rank")
