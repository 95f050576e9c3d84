"""Adapters in and out of the service, on the machine that holds its state directory: out (``toolrl tinker
export``), a client's checkpoint merged into its base's weights by toolrl's merge
(:func:`toolrl.training.lora.engine_state_dict`), a Hugging Face model directory that ``from_pretrained`` loads;
in (``toolrl tinker import``), an outside PEFT LoRA adapter directory made a checkpoint of a key's, which that
client trains from (``create_training_client_from_state``) or samples. Checkpoints are :mod:`toolrl_tinker.store`'s.
An imported adapter's own scale (``lora_alpha / r``, or ``lora_alpha / sqrt(r)`` with rsLoRA) is folded into its
``B`` for the server's ``ALPHA / rank``, so it computes what it computed under PEFT.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from toolrl.model_sources import load_model, model_skeleton
from toolrl.modeling.adapters import adapter_parameters, add_adapter, load_adapter_state
from toolrl.training.lora import engine_state_dict

from toolrl_tinker import adapters
from toolrl_tinker.adapters import ALPHA, ATTN, MLP
from toolrl_tinker.hub_names import ALIASES, TOKENIZER_FILES, model_dir
from toolrl_tinker.requests import UserError
from toolrl_tinker.store import Store

A, B = ".lora_A.weight", ".lora_B.weight"
PREFIX = "base_model.model."  # what PEFT puts before the model's own module names
# PEFT settings this server's adapters have no counterpart for, with the value that means "not used".
UNSUPPORTED = {"use_dora": False, "fan_in_fan_out": False, "lora_bias": False, "rank_pattern": {}, "alpha_pattern": {},
               "layers_to_transform": None, "modules_to_save": None, "layer_replication": None,
               "trainable_token_indices": None, "bias": "none"}


def read_peft(folder: Path) -> tuple[dict[str, Any], int, list[str]]:
    """A PEFT LoRA adapter directory as (tensors under adapter-neutral names, their ``B`` scaled for
    :data:`ALPHA`; rank; target modules)."""
    config_file = folder / "adapter_config.json"
    if not config_file.is_file():
        raise UserError(f"{folder}: no adapter_config.json (a PEFT adapter directory has one)")
    config = json.loads(config_file.read_text())
    if config.get("peft_type") != "LORA":
        raise UserError(f"{config_file}: peft_type {config.get('peft_type')!r}: only LORA adapters are taken")
    for key, unused in UNSUPPORTED.items():
        if config.get(key, unused) not in (unused, None, {}, []):
            raise UserError(f"{config_file}: {key}={config[key]!r}: this server's adapters have no such setting")
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
    return tensors, rank, [t for t in ATTN + MLP if t in targets]


def import_peft(state_dir: Path, folder: Path, owner: str, base: str, source: str, name: str | None = None) -> str:
    """PEFT adapter ``folder`` as a checkpoint of ``owner``'s on base ``base`` (which loads ``source``) in
    the server's state ``state_dir``; its ``tinker://`` path. The adapter must cover every layer's
    ``q_proj``... it names, with shapes that fit the base."""
    tensors, rank, targets = read_peft(folder)
    _check_fits(tensors, rank, targets, model_dir(source))
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
    from toolrl_tinker import trainer

    store = Store(state_dir)
    found = store.checkpoint(path)
    if found is None:
        raise UserError(f"checkpoint {path!r} is not in {state_dir} (the rest client's list_checkpoints names them)")
    run = store.run(found["model_id"]) or {}
    source = run.get("source") or ALIASES.get(run.get("base", ""), run.get("base", ""))
    if found["kind"] == "external_weights":
        tensors, rank, targets = read_peft(Path(found["file"]))
    else:
        state = trainer.read(found["file"])
        tensors, rank, targets = state["adapter"], state["rank"], state["targets"]
    base_dir = model_dir(source)
    model = load_model(base_dir, dtype="float32", device="cpu")
    add_adapter(model, "export", adapters.config(rank, targets))
    load_adapter_state(model, "export", tensors)
    to = getattr(torch, dtype)
    # Cast once per tensor, so that a tied weight (the input embedding as the output head) stays one, saved once.
    cast: dict[tuple[int, Any], Any] = {}
    merged = {k: cast.setdefault((t.data_ptr(), t.shape), t.to(to)) for k, t in engine_state_dict(model, "export").items()}
    tmp = out.with_name(f".{out.name}.{uuid.uuid4().hex[:6]}")
    model.to(to).save_pretrained(str(tmp), state_dict=merged)
    for file in (Path(base_dir) / f for f in TOKENIZER_FILES):  # the base's, beside what save_pretrained wrote
        if file.is_file() and not (tmp / file.name).exists():
            shutil.copyfile(file, tmp / file.name)
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return out


def _check_fits(tensors: dict[str, Any], rank: int, targets: list[str], base_dir: str) -> None:
    """Raise :class:`UserError` unless ``tensors`` are the rank-``rank`` adapter on ``targets`` that the
    trainer makes on the model in ``base_dir`` (its shapes read from its config, no weights loaded)."""
    model = model_skeleton(base_dir)
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
