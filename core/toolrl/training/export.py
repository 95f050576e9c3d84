"""Export a checkpoint to a Hugging Face model directory (``toolrl export``): the policy rebuilt from
the run's model files (``hf/`` beside the checkpoints, no weights), its shards loaded whatever world
size wrote them, adapters merged. The checkpoint layout itself is :mod:`toolrl.run_dir`'s."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from toolrl.config import Config
from toolrl.model_sources import model_path, model_skeleton
from toolrl.run_dir import HF_FILES, META, latest, read_meta
from toolrl.training import lora
from toolrl.training.policy import build_policy

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".msgpack", ".h5")


def save_model_files(model_dir: str, out: Path) -> None:
    """Copy the model's config, generation config and tokenizer files (not its weights) to ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    for f in Path(model_dir).iterdir():
        if f.is_file() and not f.name.endswith(_WEIGHT_SUFFIXES) and not f.name.endswith(".index.json"):
            shutil.copy2(f, out / f.name)


class ExportError(ValueError):
    """A run directory that has nothing to export; the message says what is missing."""


def export(run_dir: Path, out_dir: Path, step: int | None = None) -> Path:
    """Write checkpoint ``step`` (default: the latest) of ``run_dir`` as a Hugging Face model directory:
    safetensors weights, config, generation config and tokenizer. Reads the sharded checkpoint in
    this process, without a process group (DCP reshards every rank's pieces into whole tensors). A
    LoRA run is exported with its adapters merged into the base weights (a plain model). A
    vision-language model is exported whole (towers and processor files). A run of several policies
    (``model.adapters``) is exported per role: ``OUT/<role>/`` the base model with that role's adapter
    merged, ``OUT/<role>/adapter/`` the adapter in peft's format (frozen policies too)."""
    ckpt_dir = run_dir / "checkpoints"
    path = latest(ckpt_dir) if step is None else ckpt_dir / f"step_{step:06d}"
    if path is None or not (path / META).is_file():
        have = ", ".join(str(read_meta(p)["step"]) for p in sorted(ckpt_dir.glob("step_*")) if (p / META).is_file())
        raise ExportError(f"{run_dir}: no checkpoint{'' if step is None else f' for step {step}'}"
                          f" (have: {have or 'none'})")
    files = ckpt_dir / HF_FILES
    if not (files / "config.json").is_file():
        raise ExportError(f"{files}: the model's config.json is missing")
    run_config = run_dir / "config.json"
    saved = json.loads(run_config.read_text()) if run_config.is_file() else {}
    tmp = out_dir.with_name(f".{out_dir.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    if saved.get("model", {}).get("adapters"):
        config = Config.model_validate(saved)
        trained = _trained_policy(config, path)
        for role in config.model.adapters or {}:
            _plain_model(files, path, lora.engine_state_dict(trained, role)).save_pretrained(str(tmp / role))
            _copy_missing(files, tmp / role)
            lora.save_adapter(trained, tmp / role / "adapter", base_model=config.model.source, adapter=role)
    else:
        merged = None
        if any(saved.get("model", {}).get(key) for key in ("lora", "freeze_vision", "freeze_output_head")):
            merged = lora.engine_state_dict(_trained_policy(Config.model_validate(saved), path))
        _plain_model(files, path, merged).save_pretrained(str(tmp))
        _copy_missing(files, tmp)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    os.replace(tmp, out_dir)
    return out_dir


def _plain_model(files: Path, path: Path, merged: dict[str, Any] | None) -> Any:
    """The model of ``files``' config with ``merged`` weights (under the base model's names), or those
    of checkpoint ``path`` (a run that trained every weight)."""
    import torch.distributed.checkpoint as dcp

    model = model_skeleton(files).to_empty(device="cpu")
    model.tie_weights()  # to_empty gave tied parameters separate storage
    if merged is None:
        state = {"model": model.state_dict()}
        dcp.load(state, checkpoint_id=str(path), no_dist=True)
        model.load_state_dict(state["model"])
        return model
    missing, unexpected = model.load_state_dict(merged, strict=False)
    tied = set(getattr(model, "_tied_weights_keys", None) or ())
    if unexpected or set(missing) - tied:
        raise ExportError(f"{path}: merged weights do not fit {files / 'config.json'}: "
                          f"missing {sorted(set(missing) - tied)[:3]}, unexpected {sorted(unexpected)[:3]}")
    return model


def _copy_missing(files: Path, out: Path) -> None:
    """The run's model files (tokenizer, processor, generation config) that ``save_pretrained`` did not write."""
    for f in files.iterdir():
        if not (out / f.name).exists():
            shutil.copy2(f, out / f.name)


def _trained_policy(config: Config, path: Path) -> Any:
    """A LoRA run's checkpoint holds only the adapters, a frozen-vision run's no vision tower, a frozen-head
    run's no output head: the trained model rebuilt (frozen weights from ``model.source``, the rest from
    checkpoint ``path``)."""
    import torch.distributed.checkpoint as dcp

    model = build_policy(config, model_path(config), "cpu")
    state = {"model": lora.trainable_state_dict(model)}
    dcp.load(state, checkpoint_id=str(path), no_dist=True)
    lora.load_trainable_state_dict(model, state["model"])
    return model
