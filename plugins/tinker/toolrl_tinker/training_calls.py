"""The training client's calls: a run created (or made from a checkpoint), its steps
(``forward_backward``, ``optim_step``: :class:`toolrl_tinker.trainer.Trainer`), its state saved and
loaded; each answered with a future that runs in the run's ``seq_id`` order."""

from __future__ import annotations

import asyncio
import uuid
from typing import TYPE_CHECKING, Any

from toolrl_tinker import adapters, bounded, requests, trainer, wire
from toolrl_tinker.requests import ForwardBackward, UserError

if TYPE_CHECKING:
    from tinker import types
    from toolrl.training.token_step import StepOutput

    from toolrl_tinker.service import Service


class TrainingCalls:
    def __init__(self, service: Service) -> None:
        self.service = service

    def create_model(self, owner: str, req: types.CreateModelRequest) -> dict[str, Any]:
        lora = req.lora_config
        if lora is None:
            raise UserError("create_model without lora_config: this server trains LoRA adapters only")
        model_id = f"{req.session_id}:train:{req.model_seq_id}"
        targets = adapters.target_modules(lora.train_attn, lora.train_mlp)
        run = self.service.new_run(owner, model_id, req.base_model, lora.rank, targets, lora.seed)
        base = self.service.base(run.base)

        async def work() -> wire.Result:
            try:
                await asyncio.to_thread(base.trainer.create, run)
            except Exception:
                self.service.runs.pop(model_id, None)
                raise
            self.service.store.add_run(model_id, owner, run.base, lora.rank, targets, lora.seed)
            return wire.json_body({"model_id": model_id, "type": "create_model"})

        return self.service.start(owner, work)

    def get_info(self, owner: str, model_id: str) -> dict[str, Any]:
        run = self.service.run(owner, model_id)
        base = self.service.base(run.base)
        return {"type": "get_info", "model_id": model_id, "is_lora": True, "lora_rank": run.rank,
                "model_name": base.name,
                "model_data": {"arch": base.trainer.arch, "model_name": base.name,
                               "tokenizer_id": base.path}}

    def forward_backward(self, owner: str, req: ForwardBackward) -> dict[str, Any]:
        run = self.service.run(owner, req.model_id)
        base = self.service.base(run.base)
        limits = self.service.limits

        def step() -> StepOutput:
            rows, loss = requests.token_rows(req, base.trainer.vocab, limits.max_batch_tokens, base.trainer.context)
            return bounded.forward_backward(base.trainer, self.service.turns[run.base], run, rows, loss, req.forward_only,
                                            limits.micro_batch_tokens, limits.request_timeout)

        async def work() -> wire.Result:
            out = await asyncio.to_thread(step)
            self.service.metrics.count("tinker_trained_tokens_total", out.tokens, base=run.base, key=owner)
            return wire.forward_backward_output(out)

        return self.service.start(owner, work, run.model_id, req.seq_id, sum(len(d.tokens) for d in req.data))

    def optim_step(self, owner: str, req: types.OptimStepRequest) -> dict[str, Any]:
        run = self.service.run(owner, req.model_id)
        with self.service.refusing(run.model_id, req.seq_id):
            settings = requests.optimizer_settings(req)

        async def work() -> wire.Result:
            metrics = await asyncio.to_thread(self.service.base(run.base).trainer.optim_step, run, settings)
            return wire.json_body({"metrics": metrics})

        return self.service.start(owner, work, run.model_id, req.seq_id)

    def save_weights(self, owner: str, req: types.SaveWeightsRequest) -> dict[str, Any]:
        run = self.service.run(owner, req.model_id)
        name = req.path or f"step-{uuid.uuid4().hex[:8]}"
        path = f"tinker://{run.model_id}/weights/{name}"
        # A name saved again replaces the checkpoint, overwrite or not: tinker-cookbook's asynchronous loop saves
        # its first batch's state twice under one name (rl/train.py), which a refusal here would fail.

        async def work() -> wire.Result:
            await asyncio.to_thread(self.save, run, path, "weights", name, True, req.ttl_seconds)
            return wire.json_body({"path": path, "type": "save_weights"})

        return self.service.start(owner, work, run.model_id, req.seq_id)

    def save(self, run: trainer.Run, path: str, kind: str, name: str, optimizer: bool, ttl: int | None = None) -> None:
        """The run's checkpoint ``path`` written and recorded (``optimizer``: with its AdamW state), expiring
        ``ttl`` seconds from now (None: the server's default)."""
        expires = self.service.checkpoints.expiry(ttl)
        file = self.service.store.checkpoint_file(run.model_id, kind, name)
        self.service.base(run.base).trainer.save(run, file, optimizer)
        self.service.checkpoints.add(path, run.owner, run.model_id, kind, name, file, expires)

    def save_external(self, owner: str, req: types.SaveWeightsExternalRequest) -> dict[str, Any]:
        """The adapter as a PEFT adapter directory, downloadable through the rest client's
        ``get_external_weights_urls``."""
        run = self.service.run(owner, req.model_id)
        path = f"tinker://{run.model_id}/external_weights/{req.path}"
        with self.service.refusing(run.model_id, req.seq_id):
            if req.age_encryption_recipients:
                raise UserError("age_encryption_recipients: this server stores external weights unencrypted")

        def save() -> int:
            expires = self.service.checkpoints.expiry(req.ttl_seconds)
            folder = self.service.store.checkpoint_file(run.model_id, "external_weights", req.path).with_suffix("")
            size = self.service.base(run.base).trainer.save_peft(run, folder)
            self.service.checkpoints.add(path, run.owner, run.model_id, "external_weights", req.path, folder, expires)
            return size

        async def work() -> wire.Result:
            size = await asyncio.to_thread(save)
            return wire.json_body({"path": path, "size_bytes": size, "type": "save_weights_external"})

        return self.service.start(owner, work, run.model_id, req.seq_id)

    def load_weights(self, owner: str, req: types.LoadWeightsRequest) -> dict[str, Any]:
        """A checkpoint into the run ``req.model_id``, or into a new run made from it (``create_training_client_from_state``)."""
        if req.model_id is not None:
            run = self.service.run(owner, req.model_id)
            seq = req.seq_id
            with self.service.refusing(run.model_id, seq):
                found = self.service.checkpoint(owner, req.path)
        else:  # create-via-load: the load makes the model
            found = self.service.checkpoint(owner, req.path)
            state = trainer.read(found["file"])
            model_id = f"{req.session_id}:train:{req.model_seq_id}"
            run = self.service.new_run(owner, model_id, req.base_model or state["base"], state["rank"], state["targets"],
                                       None, first_seq=0)
            seq = 0

        async def work() -> wire.Result:
            try:
                await asyncio.to_thread(self._load, run, found, req.optimizer, req.model_id is None)
            except Exception:
                if req.model_id is None:  # the run this load was to make is not left half made
                    self.service.runs.pop(run.model_id, None)
                    await asyncio.to_thread(self.service.base(run.base).trainer.release, run)
                raise
            return wire.json_body({"path": req.path, "model_id": run.model_id, "type": "load_weights"})

        return self.service.start(owner, work, run.model_id, seq)

    def _load(self, run: trainer.Run, found: dict[str, Any], optimizer: bool, create: bool) -> None:
        state = trainer.read(found["file"])
        if optimizer and state["optimizer"] is None:
            raise UserError(f"{found['path']} holds no optimizer state (a sampler checkpoint)")
        base = self.service.base(run.base)
        if create:
            base.trainer.create(run)
            self.service.store.add_run(run.model_id, run.owner, run.base, run.rank, run.targets, None)
        base.trainer.load(run, state, optimizer)
