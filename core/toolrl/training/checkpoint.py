"""The checkpoint index, and export to a Hugging Face model directory.

A checkpoint is ``checkpoints/step_NNNNNN/``: the trainer ranks' shards of model and optimizer
(``torch.distributed.checkpoint``, so any world size can load it), one RNG file per rank, the
controller's RNG (``controller.pt``) and ``meta.json`` (step, data position, world size). Ranks write
into ``.tmp_step_NNNNNN/``; the controller adds its files once every rank has finished and renames the
directory, so a crash never leaves a checkpoint that looks complete. ``hf/`` beside the checkpoints
holds the model's config and tokenizer (no weights), which is what export needs besides a checkpoint.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

META = "meta.json"
HF_FILES = "hf"
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".msgpack", ".h5")


def staging_dir(ckpt_dir: Path, step: int) -> Path:
    """An empty directory for the ranks to write step ``step`` into."""
    tmp = ckpt_dir / f".tmp_step_{step:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


def finalize(ckpt_dir: Path, staged: Path, step: int, meta: dict[str, Any], keep: int) -> Path:
    """Add the controller's state to ``staged`` and publish it as ``step_NNNNNN`` (atomic rename)."""
    import torch

    torch.save({"python_rng": random.getstate(), "torch_rng": torch.get_rng_state()}, staged / "controller.pt")
    (staged / META).write_text(json.dumps({"step": step, **meta}, indent=2))
    final = ckpt_dir / f"step_{step:06d}"
    shutil.rmtree(final, ignore_errors=True)
    os.replace(staged, final)
    for old in sorted(ckpt_dir.glob("step_*"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest(ckpt_dir: Path) -> Path | None:
    found = sorted(p for p in ckpt_dir.glob("step_*") if (p / META).is_file())
    return found[-1] if found else None


def read_meta(path: Path) -> dict[str, Any]:
    return json.loads((path / META).read_text())


def restore_controller(path: Path) -> None:
    import torch

    state = torch.load(path / "controller.pt", weights_only=False)
    random.setstate(state["python_rng"])
    torch.set_rng_state(state["torch_rng"])


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

    from toolrl.config import Config
    from toolrl.roles.compose import build_policy, model_path
    from toolrl.training import lora

    config = Config.model_validate(run)
    model = build_policy(config, model_path(config), "cpu")
    state = {"model": lora.trainable_state_dict(model)}
    dcp.load(state, checkpoint_id=str(path), no_dist=True)
    lora.load_trainable_state_dict(model, state["model"])
    return lora.engine_state_dict(model)
