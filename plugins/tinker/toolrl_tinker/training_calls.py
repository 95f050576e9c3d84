"""The training client's calls: a run created (or made from a checkpoint), its steps
(``forward_backward``, ``optim_step``: :class:`toolrl_tinker.trainer.Trainer`), its state saved and
loaded; each answered with a future that runs in the run's ``seq_id`` order."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from toolrl.training.lora import save_peft

from toolrl_tinker import adapters, requests, steps, trainer, wire
from toolrl_tinker.requests import ForwardBackward, UserError
from toolrl_tinker.store import size_on_disk

if TYPE_CHECKING:
    from tinker import types
    from toolrl.training.token_step import StepOutput

    from toolrl_tinker.bases import Bases
    from toolrl_tinker.limits import Limits
    from toolrl_tinker.metrics import Metrics
    from toolrl_tinker.retention import Retention
    from toolrl_tinker.runs import Runs
    from toolrl_tinker.store import Store


@dataclass(eq=False)
class TrainingCalls:
    runs: Runs
    bases: Bases
    store: Store
    checkpoints: Retention
    metrics: Metrics
    limits: Limits

    def create_model(self, owner: str, req: types.CreateModelRequest) -> dict[str, Any]:
        lora = req.lora_config
        if lora is None:
            raise UserError("create_model without lora_config: this server trains LoRA adapters only")
        model_id = f"{req.session_id}:train:{req.model_seq_id}"
        targets = adapters.target_modules(lora.train_attn, lora.train_mlp)
        run = self.runs.new(owner, model_id, req.base_model, lora.rank, targets, lora.seed)
        base = self.bases.named(run.base)

        async def work() -> wire.Result:
            try:
                await asyncio.to_thread(base.trainer.create, run)
            except Exception:
                self.runs.pop(model_id, None)
                raise
            self.store.add_run(model_id, owner, run.base, lora.rank, targets, lora.seed)
            return wire.json_body({"model_id": model_id, "type": "create_model"})

        return self.runs.start(owner, work)

    def get_info(self, owner: str, req: types.GetInfoRequest) -> dict[str, Any]:
        run = self.runs.owned(owner, req.model_id)
        base = self.bases.named(run.base)
        return {"type": "get_info", "model_id": req.model_id, "is_lora": True, "lora_rank": run.rank, "model_name": base.name,
                "model_data": {"arch": base.trainer.arch, "model_name": base.name, "tokenizer_id": base.path}}

    def forward_backward(self, owner: str, req: ForwardBackward) -> dict[str, Any]:
        run = self.runs.owned(owner, req.model_id)
        base = self.bases.named(run.base)
        limits = self.limits

        def step() -> StepOutput:
            with base.idle.busy():  # its activations given back once the base is idle
                rows, loss = requests.token_rows(req, base.trainer.vocab, limits.max_batch_tokens, base.trainer.context)
                return steps.forward_backward(base.trainer, base.turns, run, rows, loss, req.forward_only,
                                              limits.micro_batch_tokens, limits.request_timeout)

        async def work() -> wire.Result:
            out = await asyncio.to_thread(step)
            self.metrics.count("tinker_trained_tokens_total", out.tokens, base=run.base, key=owner)
            return wire.forward_backward_output(out)

        return self.runs.start(owner, work, run.model_id, req.seq_id, sum(len(d.tokens) for d in req.data))

    def optim_step(self, owner: str, req: types.OptimStepRequest) -> dict[str, Any]:
        run = self.runs.owned(owner, req.model_id)
        with self.runs.refusing(run.model_id, req.seq_id):
            settings = requests.optimizer_settings(req)

        async def work() -> wire.Result:
            metrics = await asyncio.to_thread(self.bases.named(run.base).trainer.optim_step, run, settings)
            return wire.json_body({"metrics": metrics})

        return self.runs.start(owner, work, run.model_id, req.seq_id)

    def save_weights(self, owner: str, req: types.SaveWeightsRequest) -> dict[str, Any]:
        run = self.runs.owned(owner, req.model_id)
        name = req.path or f"step-{uuid.uuid4().hex[:8]}"
        path = f"tinker://{run.model_id}/weights/{name}"
        # A name saved again replaces the checkpoint, overwrite or not: tinker-cookbook's asynchronous loop saves
        # its first batch's state twice under one name (rl/train.py), which a refusal here would fail.

        async def work() -> wire.Result:
            await asyncio.to_thread(self.save, run, "weights", name, req.ttl_seconds)
            return wire.json_body({"path": path, "type": "save_weights"})

        return self.runs.start(owner, work, run.model_id, req.seq_id)

    def save(self, run: trainer.Run, kind: str, name: str, ttl: int | None = None) -> Path:
        """The run's checkpoint ``name`` of ``kind`` written and recorded, expiring ``ttl`` seconds from now (None:
        the server's default): a training state (with its AdamW state), sampler weights, or external weights (a
        PEFT adapter directory); its file."""
        expires = self.checkpoints.expiry(ttl)
        file = self.store.checkpoint_file(run.model_id, kind, name)
        held = self.bases.named(run.base).trainer
        if kind == "external_weights":
            file = file.with_suffix("")
            save_peft(held.adapter_state(run), adapters.peft_config(run.rank, run.targets), file, run.base)
        else:
            held.save(run, file, optimizer=kind == "weights")
        self.checkpoints.add(f"tinker://{run.model_id}/{kind}/{name}", run.owner, run.model_id, kind, name, file, expires)
        return file

    def save_external(self, owner: str, req: types.SaveWeightsExternalRequest) -> dict[str, Any]:
        """The adapter as a PEFT adapter directory, downloadable through the rest client's
        ``get_external_weights_urls``."""
        run = self.runs.owned(owner, req.model_id)
        path = f"tinker://{run.model_id}/external_weights/{req.path}"
        with self.runs.refusing(run.model_id, req.seq_id):
            if req.age_encryption_recipients:
                raise UserError("age_encryption_recipients: this server stores external weights unencrypted")

        async def work() -> wire.Result:
            folder = await asyncio.to_thread(self.save, run, "external_weights", req.path, req.ttl_seconds)
            return wire.json_body({"path": path, "size_bytes": size_on_disk(folder), "type": "save_weights_external"})

        return self.runs.start(owner, work, run.model_id, req.seq_id)

    def load_weights(self, owner: str, req: types.LoadWeightsRequest) -> dict[str, Any]:
        """A checkpoint into the run ``req.model_id``, or into a new run made from it (``create_training_client_from_state``)."""
        if req.model_id is not None:
            run = self.runs.owned(owner, req.model_id)
            seq = req.seq_id
            with self.runs.refusing(run.model_id, seq):
                found = self.store.owned_checkpoint(owner, req.path)
        else:  # create-via-load: the load makes the model, shaped as the checkpoint's run (its file read once, in _load)
            found = self.store.owned_checkpoint(owner, req.path)
            saved = self.store.run(found["model_id"])
            assert saved is not None  # a checkpoint's run is recorded before it
            model_id = f"{req.session_id}:train:{req.model_seq_id}"
            run = self.runs.new(owner, model_id, req.base_model or saved["base"], saved["rank"], saved["targets"],
                                None, first_seq=0)
            seq = 0

        async def work() -> wire.Result:
            try:
                await asyncio.to_thread(self._load, run, found, req.optimizer, req.model_id is None)
            except Exception:
                if req.model_id is None:  # the run this load was to make is not left half made
                    self.runs.pop(run.model_id, None)
                    await asyncio.to_thread(self.bases.named(run.base).trainer.release, run)
                raise
            return wire.json_body({"path": req.path, "model_id": run.model_id, "type": "load_weights"})

        return self.runs.start(owner, work, run.model_id, seq)

    def _load(self, run: trainer.Run, found: dict[str, Any], optimizer: bool, create: bool) -> None:
        state = trainer.read(found["file"])
        if optimizer and state["optimizer"] is None:
            raise UserError(f"{found['path']} holds no optimizer state (a sampler checkpoint)")
        base = self.bases.named(run.base)
        if create:
            base.trainer.create(run)
            self.store.add_run(run.model_id, run.owner, run.base, run.rank, run.targets, None)
        base.trainer.load(run, state, optimizer)
