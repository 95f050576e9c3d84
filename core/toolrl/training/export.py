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
from toolrl.model_sources import model_path
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
    vision-language model is exported whole (towers and processor files)."""
    import torch
    import torch.distributed.checkpoint as dcp
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    ckpt_dir = run_dir / "checkpoints"
    path = latest(ckpt_dir) if step is None else ckpt_dir / f"step_{step:06d}"
    if path is None or not (path / META).is_file():
        have = ", ".join(str(read_meta(p)["step"]) for p in sorted(ckpt_dir.glob("step_*")) if (p / META).is_file())
        raise ExportError(f"{run_dir}: no checkpoint{'' if step is None else f' for step {step}'}"
                          f" (have: {have or 'none'})")
    files = ckpt_dir / HF_FILES
    if not (files / "config.json").is_file():
        raise ExportError(f"{files}: the model's config.json is missing")
    config = AutoConfig.from_pretrained(str(files))
    auto = AutoModelForImageTextToText if getattr(config, "vision_config", None) else AutoModelForCausalLM
    with torch.device("meta"):
        model = auto.from_config(config)
    model = model.to_empty(device="cpu")
    model.tie_weights()  # to_empty gave tied parameters separate storage
    run_config = run_dir / "config.json"
    run = json.loads(run_config.read_text()) if run_config.is_file() else {}
    if run.get("model", {}).get("lora") or run.get("model", {}).get("freeze_vision"):
        merged = _rebuilt_from_source(run, path)
        missing, unexpected = model.load_state_dict(merged, strict=False)
        tied = set(getattr(model, "_tied_weights_keys", None) or ())
        if unexpected or set(missing) - tied:
            raise ExportError(f"{path}: merged weights do not fit {files / 'config.json'}: "
                              f"missing {sorted(set(missing) - tied)[:3]}, unexpected {sorted(unexpected)[:3]}")
    else:
        state = {"model": model.state_dict()}
        dcp.load(state, checkpoint_id=str(path), no_dist=True)
        model.load_state_dict(state["model"])
    if out_dir.exists():
        shutil.rmtree(out_dir)
    tmp = out_dir.with_name(f".{out_dir.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(str(tmp))
    for f in files.iterdir():
        if not (tmp / f.name).exists():
            shutil.copy2(f, tmp / f.name)
    os.replace(tmp, out_dir)
    return out_dir


def _rebuilt_from_source(run: dict[str, Any], path: Path) -> dict[str, Any]:
    """A LoRA run's checkpoint holds only the adapters, a frozen-vision run's no vision tower: rebuild
    the trained model (frozen weights from ``model.source``, trained ones from the checkpoint) and merge
    any adapters, under the base model's names."""
    import torch.distributed.checkpoint as dcp

    config = Config.model_validate(run)
    model = build_policy(config, model_path(config), "cpu")
    state = {"model": lora.trainable_state_dict(model)}
    dcp.load(state, checkpoint_id=str(path), no_dist=True)
    lora.load_trainable_state_dict(model, state["model"])
    return lora.engine_state_dict(model)
