"""Training runs on one base: the trainer's copy of the base model with every training client's LoRA
adapter on it, each with its own AdamW; each request a step of toolrl's public training API
(:mod:`toolrl.training.token_step`, :mod:`toolrl.training.optimizer`) through the client's adapter
alone; and a run's state (adapter, optimizer, steps) saved to a checkpoint file and loaded back, or its adapter
as a PEFT directory.

Memory per run: its adapter (rank × the adapted layers' widths, fp32), its gradient and AdamW's two
moments: four copies of the adapter. Requests run one at a time per base (the adapters' routing lives
on the model's layers): each takes the trainer's lock.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from toolrl.model_sources import load_model
from toolrl.training.optimizer import OptimizerSettings, adamw, optimizer_step
from toolrl.training.token_step import LossSpec, StepOutput, TokenRow, forward_backward

from toolrl_tinker import adapters
from toolrl_tinker.requests import UserError

# AdamW's settings until a run's first optim_step, which brings its own (as each step does).
START = OptimizerSettings(lr=1e-4)


@dataclass
class Run:
    """A training client's run on base ``base``: its adapter's shape, its optimizer, its steps."""

    model_id: str
    owner: str
    base: str
    rank: int
    targets: list[str]
    seed: int | None
    optimizer: Any = None
    steps: int = 0

    @property
    def adapter(self) -> str:
        return adapters.training_name(self.model_id)


class Trainer:
    """One base's trainer copy and the runs' adapters on it."""

    def __init__(self, path: str) -> None:
        self.model = load_model(path, dtype="float32", device="cpu")
        self.model.config.use_cache = False
        self.vocab = int(self.model.get_output_embeddings().weight.shape[0])
        self.context = int(getattr(self.model.config, "max_position_embeddings", 0) or 1 << 20)
        self.lock = threading.Lock()

    def create(self, run: Run) -> None:
        """The run's adapter (peft's init from its seed) and a fresh AdamW."""
        with self.lock:
            adapters.add(self.model, run.adapter, run.rank, run.targets, run.seed)
            run.optimizer = adamw(self.params(run), START)

    def params(self, run: Run) -> list[Any]:
        return adapters.parameters(self.model, run.adapter)

    def step(self, run: Run, rows: Sequence[TokenRow], loss: LossSpec, forward_only: bool,
             micro_tokens: int) -> StepOutput:
        """A forward (and backward, adding to the adapter's gradients) of ``rows`` through the run's
        adapter, in micro-batches of ``micro_tokens``."""
        with self.lock:
            return forward_backward(self.model, rows, loss, adapter=run.adapter, backward=not forward_only,
                                    max_tokens=micro_tokens)

    def optim_step(self, run: Run, settings: OptimizerSettings) -> dict[str, float]:
        """One AdamW step of the run's adapter; the gradient norm before clipping, when clipped."""
        with self.lock:
            norm = optimizer_step(run.optimizer, settings)
            run.steps += 1
        return {} if norm is None else {"grad_norm:mean": norm}

    def adapter_state(self, run: Run) -> dict[str, Any]:
        with self.lock:
            return adapters.state(self.model, run.adapter)

    def save(self, run: Run, file: Path, optimizer: bool) -> None:
        """The run's checkpoint file: its adapter, shape and steps and, with ``optimizer``, its AdamW state
        (without: a sampler's weights, ``optimizer`` None)."""
        with self.lock:
            state = {"adapter": adapters.state(self.model, run.adapter), "base": run.base, "rank": run.rank,
                     "targets": run.targets, "steps": run.steps,
                     "optimizer": run.optimizer.state_dict() if optimizer else None}
        torch.save(state, file)

    def save_peft(self, run: Run, folder: Path) -> int:
        """The run's adapter as a PEFT adapter directory (``adapter_model.safetensors``,
        ``adapter_config.json``); its size in bytes."""
        from safetensors.torch import save_file

        tensors, config = adapters.peft_files(self.adapter_state(run), run.rank, run.targets, run.base)
        folder.mkdir(parents=True, exist_ok=True)
        save_file(tensors, folder / "adapter_model.safetensors")
        (folder / "adapter_config.json").write_text(json.dumps(config, indent=1))
        return sum(f.stat().st_size for f in folder.iterdir())

    def load(self, run: Run, state: dict[str, Any], optimizer: bool) -> None:
        """A checkpoint's adapter into the run and, with ``optimizer``, its AdamW state and steps (else
        a fresh AdamW); the run is left as it was when the checkpoint does not fit."""
        with self.lock:
            fresh = adamw(self.params(run), START)
            if optimizer:
                try:
                    fresh.load_state_dict(state["optimizer"])
                except ValueError as exc:
                    raise UserError(f"the checkpoint's optimizer state does not fit this model: {exc}") from None
            adapters.load(self.model, run.adapter, state["adapter"])
            run.optimizer = fresh
            if optimizer:
                run.steps = state["steps"]

    def release(self, run: Run) -> None:
        """The run's adapter off the model, its optimizer with it."""
        with self.lock:
            adapters.remove(self.model, run.adapter)
            run.optimizer = None


def read(file: str | Path) -> dict[str, Any]:
    """A checkpoint file (:meth:`Trainer.save`'s)."""
    return torch.load(file, weights_only=True)
