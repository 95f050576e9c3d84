"""Training runs on one base: the trainer's copy of the base model with every training client's LoRA
adapter on it, each with its own AdamW; each request a step of toolrl's public training API
(:mod:`toolrl.training.token_step`, :mod:`toolrl.training.optimizer`) through the client's adapter
alone; and a run's state (adapter, optimizer, steps) saved to a checkpoint file and loaded back.

Memory per run: its adapter, its gradient and AdamW's two moments (four copies of the adapter, fp32) on every
rank, or in host memory for the least recently used runs past ``slots``, brought back on their next request.
A group's driver (this process) also keeps each run's state after its last step, and its backward calls since,
to restore it on a new group. Requests run one at a time per base (the adapters' routing lives on the model's
layers): each takes the trainer's lock.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from toolrl.config import RayConfig
from toolrl.processes.step_group import StepGroup
from toolrl.processes.step_rank import StepRank
from toolrl.training.optimizer import OptimizerSettings
from toolrl.training.token_step import LossSpec, StepOutput, TokenRow

from toolrl_tinker import adapters
from toolrl_tinker.requests import UserError


@dataclass
class Run:
    """A training client's run on base ``base``: its adapter's shape, its steps."""

    model_id: str
    owner: str
    base: str
    rank: int
    targets: list[str]
    seed: int | None
    steps: int = 0

    @property
    def adapter(self) -> str:
        return adapters.training_name(self.model_id)


@dataclass(frozen=True)
class Ranks:
    """Where a base's trainer runs: in this process (``world_size`` 1, no ``ray``: a ``StepRank``), or as
    ``world_size`` ranks placed on the Ray cluster by ``ray`` (``toolrl train``'s ``ray`` section; a ``StepGroup``:
    the base sharded with FSDP2, each adapter and its AdamW on every rank, a lost rank replaced with the runs'
    state); ``slots``: the runs' adapters a rank holds in its model at once (None: every run's)."""

    world_size: int = 1
    ray: RayConfig | None = None
    slots: int | None = None


class Trainer:
    """One base's trainer copy and the runs' adapters on it."""

    def __init__(self, path: str, ranks: Ranks | None = None) -> None:
        ranks = ranks or Ranks()
        self.ranks: StepRank | StepGroup
        if ranks.world_size == 1 and ranks.ray is None:
            self.ranks = StepRank(path, slots=ranks.slots)
            info = self.ranks.setup()
        else:
            self.ranks = StepGroup(path, ranks.world_size, ranks.ray, slots=ranks.slots)
            info = self.ranks.start()
        self.arch, self.vocab, self.context = info["arch"], info["vocab"], info["context"]
        self.held: set[str] = set()  # the runs' adapters made on the ranks
        self.lock = threading.Lock()

    def create(self, run: Run) -> None:
        """The run's adapter (peft's init from its seed) and a fresh AdamW."""
        with self.lock:
            self.ranks.add_adapter(run.adapter, adapters.config(run.rank, run.targets),
                                   seed=0 if run.seed is None else run.seed)
            self.held.add(run.adapter)

    def step(self, run: Run, rows: Sequence[TokenRow], loss: LossSpec, forward_only: bool,
             micro_tokens: int) -> StepOutput:
        """A forward (and backward, adding to the adapter's gradients) of ``rows`` through the run's
        adapter, in micro-batches of ``micro_tokens``."""
        with self.lock:
            return self.ranks.forward_backward(run.adapter, rows, loss, backward=not forward_only,
                                               max_tokens=micro_tokens)

    def optim_step(self, run: Run, settings: OptimizerSettings) -> dict[str, float]:
        """One AdamW step of the run's adapter; the gradient norm before clipping."""
        with self.lock:
            norm = self.ranks.optimizer_step(run.adapter, settings)
            run.steps += 1
        return {"grad_norm:mean": norm}

    def adapter_state(self, run: Run) -> dict[str, Any]:
        """A copy of the run's adapter's tensors (adapter-neutral names)."""
        with self.lock:
            return self.ranks.state(run.adapter, optimizer=False)["adapter"]

    def gradients(self, run: Run) -> dict[str, Any]:
        """A copy of the run's adapter's gradients (None where none is pending)."""
        with self.lock:
            return self.ranks.gradients(run.adapter)

    def set_gradients(self, run: Run, grads: dict[str, Any]) -> None:
        """The run's adapter's gradients set back to ``grads`` (:meth:`gradients`' copy)."""
        with self.lock:
            self.ranks.set_gradients(run.adapter, grads)

    def memory(self) -> dict[str, int]:
        """Tensor bytes the trainer holds by part (per rank: :meth:`toolrl.processes.step_rank.StepRank.memory`)."""
        with self.lock:
            return self.ranks.memory()

    def save(self, run: Run, file: Path, optimizer: bool) -> None:
        """The run's checkpoint file: its adapter, shape and steps and, with ``optimizer``, its AdamW state
        (without: a sampler's weights, ``optimizer`` None)."""
        with self.lock:
            state = self.ranks.state(run.adapter, optimizer)
            steps = run.steps
        torch.save({**state, "base": run.base, "rank": run.rank, "targets": run.targets, "steps": steps}, file)

    def load(self, run: Run, state: dict[str, Any], optimizer: bool) -> None:
        """A checkpoint's adapter into the run and, with ``optimizer``, its AdamW state and steps (else
        a fresh AdamW); its gradient cleared. The run is left as it was when the checkpoint does not fit."""
        with self.lock:
            try:
                self.ranks.load_state(run.adapter, state["adapter"], state["optimizer"] if optimizer else None)
            except ValueError as exc:
                raise UserError(f"the checkpoint does not fit this model (another base, rank or target modules): "
                                f"{exc}") from None
            if optimizer:
                run.steps = state["steps"]

    def release(self, run: Run) -> None:
        """The run's adapter off the model, its optimizer with it (nothing when it has none)."""
        with self.lock:
            if run.adapter in self.held:
                self.ranks.remove_adapter(run.adapter)
                self.held.discard(run.adapter)

    def close(self) -> None:
        with self.lock:
            self.ranks.close()


def read(file: str | Path) -> dict[str, Any]:
    """A checkpoint file (:meth:`Trainer.save`'s)."""
    return torch.load(file, weights_only=True)
