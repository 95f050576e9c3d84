"""What each API call does, apart from HTTP: sessions, training runs on the bases, checkpoints,
sampling sessions, and the work behind every future (:mod:`toolrl_tinker.futures`).

Each client (API key) sees only its own runs, checkpoints, sessions and futures: another's id is
answered as unknown. Memory per client: its adapters on the trainer's copy (rank × the adapted
layers' widths, fp32, plus AdamW's two moments and the gradient: four copies) and at most
``max_samplers`` saved weight sets on the sampler per run (older ones are dropped from memory and
reloaded from their file when sampled again).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

from toolrl_tinker import models, wire
from toolrl_tinker.batch import UserError
from toolrl_tinker.futures import Futures, InOrder
from toolrl_tinker.store import Store

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Limits:
    max_batch_tokens: int = 65536
    micro_batch_tokens: int = 512
    max_samplers: int = 4
    max_runs_per_client: int = 16
    max_rank: int = 64


def owner_of(api_key: str) -> str:
    return hashlib.sha256(api_key.encode()).hexdigest()[:16]


class Service:
    def __init__(self, bases: list[str], state_dir: Path, limits: Limits | None = None) -> None:
        self.base_names = list(bases)
        self.limits = limits or Limits()
        self.store = Store(state_dir)
        self.futures = Futures(self.store)
        self.bases: dict[str, models.Base] = {}
        self.runs: dict[str, models.Run] = {}
        self.order: dict[str, InOrder] = {}
        self.sessions: dict[str, str] = {}  # session id -> owner
        self.samplers: dict[str, dict[str, Any]] = {}  # sampling session id -> owner, base, adapter, path
        # Sampler adapters with requests in flight are dropped only once those end (the engine routes
        # queued rows by adapter name).
        self._inflight: dict[str, int] = {}
        self._doomed: set[str] = set()
        self._drop_lock = threading.Lock()

    async def load_bases(self) -> None:
        for name in self.base_names:
            self.bases[name] = await asyncio.to_thread(models.Base, name)

    def base(self, name: str) -> models.Base:
        if name not in self.bases:
            raise UserError(f"unknown base model {name!r}: this server holds {', '.join(self.base_names)}")
        return self.bases[name]

    # ------------------------------------------------------------------ futures

    def start(self, owner: str, work: Callable[[], Awaitable[wire.Result]], model_id: str | None = None,
              seq_id: int | None = None) -> dict[str, Any]:
        """A future for ``work``: run now, or in ``model_id``'s order of ``seq_id``."""
        request_id, _ = self.futures.new(owner)

        async def job() -> None:
            try:
                body, content_type = await work()
                self.futures.finish(request_id, body, content_type)
            except UserError as exc:
                self.futures.fail(request_id, str(exc), "user")
            except Exception as exc:  # a bug or a broken model: the client hears it, the server goes on
                log.exception("request %s failed", request_id)
                self.futures.fail(request_id, f"{type(exc).__name__}: {exc}", "server")

        if model_id is None:
            asyncio.ensure_future(job())
        else:
            asyncio.ensure_future(self.order[model_id].submit(seq_id, job))
        return {"request_id": request_id, "model_id": model_id}

    @contextlib.contextmanager
    def refusing(self, model_id: str, seq_id: int | None) -> Iterator[None]:
        """A request of ``model_id`` refused before it runs still takes its turn (its ``seq_id``), so
        that the client's next requests do not wait for it."""
        try:
            yield
        except UserError:
            async def nothing() -> None:
                return None

            asyncio.ensure_future(self.order[model_id].submit(seq_id, nothing))
            raise

    def start_sample(self, owner: str, work: Callable[[], Awaitable[wire.Result]], n: int) -> dict[str, Any]:
        """A sampling future, naming the ``n`` sequences it will hold."""
        answer = self.start(owner, work)
        answer["sample_sequence_ids"] = [f"{answer['request_id']}:{i}" for i in range(n)]
        return answer

    # ------------------------------------------------------------------ sessions and runs

    def create_session(self, owner: str) -> str:
        session_id = f"s{uuid.uuid4().hex[:12]}"
        self.sessions[session_id] = owner
        return session_id

    async def finish_session(self, owner: str, session_id: str) -> None:
        """A finished session's training runs leave memory (their adapters, optimizers and sampler
        copies); what they saved stays, and a new client loads it (``create_training_client_from_state``)."""
        if self.sessions.get(session_id) != owner:
            raise KeyError(session_id)
        del self.sessions[session_id]
        for model_id in [m for m, r in self.runs.items() if r.owner == owner and m.startswith(f"{session_id}:")]:
            run = self.runs.pop(model_id)
            await self.order.pop(model_id).closed()
            await asyncio.to_thread(models.release, run)
            for name in run.samplers:
                await asyncio.to_thread(self._drop_sampler, run.base, name)
            run.samplers.clear()

    def run(self, owner: str, model_id: str) -> models.Run:
        run = self.runs.get(model_id)
        if run is None or run.owner != owner:
            raise UserError(f"unknown model_id {model_id!r}")
        return run

    def new_run(self, owner: str, model_id: str, base: str, rank: int, targets: list[str],
                seed: int | None, first_seq: int = 1) -> models.Run:
        """A training run; its requests run in seq_id order from ``first_seq`` (a create-via-load's load is 0)."""
        if model_id in self.runs:
            raise UserError(f"model_id {model_id!r} exists already")
        if sum(r.owner == owner for r in self.runs.values()) >= self.limits.max_runs_per_client:
            raise UserError(f"this client holds {self.limits.max_runs_per_client} models, the server's limit "
                            "(tinker serve --max-runs-per-client)")
        if not 0 < rank <= self.limits.max_rank:
            raise UserError(f"lora_config.rank {rank}: this server trains ranks 1 to {self.limits.max_rank}")
        run = models.Run(model_id, owner, self.base(base), rank, targets, seed)
        self.runs[model_id] = run
        self.order[model_id] = InOrder(first=first_seq)
        return run

    def create_model(self, owner: str, req: Any) -> dict[str, Any]:
        lora = req.lora_config
        if lora is None:
            raise UserError("create_model without lora_config: this server trains LoRA adapters only")
        model_id = f"{req.session_id}:train:{req.model_seq_id}"
        targets = models.target_modules(lora.train_attn, lora.train_mlp)
        run = self.new_run(owner, model_id, req.base_model, lora.rank, targets, lora.seed)

        async def work() -> wire.Result:
            try:
                await asyncio.to_thread(models.create_adapter, run)
            except Exception:
                self.runs.pop(model_id, None)
                raise
            self.store.add_run(model_id, owner, req.base_model, lora.rank, targets, lora.seed)
            return wire.json_body({"model_id": model_id, "type": "create_model"})

        return self.start(owner, work)

    def get_info(self, owner: str, model_id: str) -> dict[str, Any]:
        run = self.run(owner, model_id)
        return {"type": "get_info", "model_id": model_id, "is_lora": True, "lora_rank": run.rank,
                "model_name": run.base.name,
                "model_data": {"arch": type(run.base.model).__name__, "model_name": run.base.name,
                               "tokenizer_id": run.base.path}}

    # ------------------------------------------------------------------ training

    def forward_backward(self, owner: str, body: bytes, encoding: str | None) -> dict[str, Any]:
        req = wire.forward_backward_request(body, encoding)
        run = self.run(owner, req.model_id)
        loss_fn = req.loss_fn

        async def work() -> wire.Result:
            lps, loss = await asyncio.to_thread(models.forward_backward, run, req.data, loss_fn, req.config,
                                                req.forward_only, self.limits.max_batch_tokens,
                                                self.limits.micro_batch_tokens)
            return wire.forward_backward_output(lps, loss)

        return self.start(owner, work, run.model_id, req.seq_id)

    def optim_step(self, owner: str, req: Any) -> dict[str, Any]:
        run = self.run(owner, req.model_id)
        params = req.optim_params
        with self.refusing(run.model_id, req.seq_id):
            if not hasattr(params, "beta2"):
                raise UserError(f"optimizer {getattr(params, 'type', '?')!r}: this server steps AdamW only (AdamParams)")

        async def work() -> wire.Result:
            metrics = await asyncio.to_thread(models.optim_step, run, params.learning_rate, params.beta1,
                                              params.beta2, params.eps, params.weight_decay, params.grad_clip_norm)
            return wire.json_body({"metrics": metrics})

        return self.start(owner, work, run.model_id, req.seq_id)

    # ------------------------------------------------------------------ checkpoints

    def save_weights(self, owner: str, req: Any) -> dict[str, Any]:
        run = self.run(owner, req.model_id)
        name = req.path or f"step-{uuid.uuid4().hex[:8]}"
        path = f"tinker://{run.model_id}/weights/{name}"
        # A name saved again replaces the checkpoint, overwrite or not: tinker-cookbook's asynchronous loop saves
        # its first batch's state twice under one name (rl/train.py), which a refusal here would fail.

        async def work() -> wire.Result:
            await asyncio.to_thread(self._save, run, path, "weights", name, True)
            return wire.json_body({"path": path, "type": "save_weights"})

        return self.start(owner, work, run.model_id, req.seq_id)

    def _save(self, run: models.Run, path: str, kind: str, name: str, optimizer: bool) -> None:
        import torch

        file = self.store.checkpoint_file(run.model_id, kind, name)
        with run.base.lock:
            state = {"adapter": run.adapter_state(), "base": run.base.name, "rank": run.rank,
                     "targets": run.targets, "steps": run.steps,
                     "optimizer": wire.optimizer_state(run) if optimizer else None}
        torch.save(state, file)
        self.store.add_checkpoint(path, run.owner, run.model_id, kind, name, file)

    def save_external(self, owner: str, req: Any) -> dict[str, Any]:
        """The adapter as a PEFT adapter directory (``adapter_model.safetensors``, ``adapter_config.json``),
        downloadable through the rest client's ``get_external_weights_urls``."""
        run = self.run(owner, req.model_id)
        path = f"tinker://{run.model_id}/external_weights/{req.path}"
        with self.refusing(run.model_id, req.seq_id):
            if req.age_encryption_recipients:
                raise UserError("age_encryption_recipients: this server stores external weights unencrypted")

        async def work() -> wire.Result:
            size = await asyncio.to_thread(self._save_external, run, path, req.path)
            return wire.json_body({"path": path, "size_bytes": size, "type": "save_weights_external"})

        return self.start(owner, work, run.model_id, req.seq_id)

    def _save_external(self, run: models.Run, path: str, name: str) -> int:
        from safetensors.torch import save_file

        folder = self.store.checkpoint_file(run.model_id, "external_weights", name).with_suffix("")
        folder.mkdir(parents=True, exist_ok=True)
        with run.base.lock:
            tensors = {f"base_model.model.{k}": v.contiguous() for k, v in run.adapter_state().items()}
        save_file(tensors, folder / "adapter_model.safetensors")
        config = {"peft_type": "LORA", "r": run.rank, "lora_alpha": models.ALPHA, "target_modules": run.targets,
                  "lora_dropout": 0.0, "bias": "none", "task_type": "CAUSAL_LM", "base_model_name_or_path": run.base.name}
        (folder / "adapter_config.json").write_text(json.dumps(config, indent=1))
        self.store.add_checkpoint(path, run.owner, run.model_id, "external_weights", name, folder)
        return sum(f.stat().st_size for f in folder.iterdir())

    def _checkpoint(self, owner: str, path: str) -> dict[str, Any]:
        found = self.store.checkpoint(path)
        if found is None or found["owner"] != owner:
            raise UserError(f"checkpoint {path!r} does not exist")
        return found

    def load_weights(self, owner: str, req: Any) -> dict[str, Any]:
        if req.model_id is not None:
            run = self.run(owner, req.model_id)
            seq = req.seq_id
            with self.refusing(run.model_id, seq):
                found = self._checkpoint(owner, req.path)
        else:  # create-via-load: the load makes the model
            import torch

            found = self._checkpoint(owner, req.path)
            state = torch.load(found["file"], weights_only=True)
            model_id = f"{req.session_id}:train:{req.model_seq_id}"
            base = req.base_model or state["base"]
            run = self.new_run(owner, model_id, base, state["rank"], state["targets"], None, first_seq=0)
            seq = 0

        async def work() -> wire.Result:
            await asyncio.to_thread(self._load, run, found, req.optimizer, req.model_id is None)
            return wire.json_body({"path": req.path, "model_id": run.model_id, "type": "load_weights"})

        return self.start(owner, work, run.model_id, seq)

    def _load(self, run: models.Run, found: dict[str, Any], optimizer: bool, create: bool) -> None:
        import torch

        state = torch.load(found["file"], weights_only=True)
        if create:
            models.create_adapter(run)
            self.store.add_run(run.model_id, run.owner, run.base.name, run.rank, run.targets, None)
        with run.base.lock:
            run.load_adapter_state(state["adapter"])
            if optimizer:
                if state["optimizer"] is None:
                    raise UserError(f"{found['path']} holds no optimizer state (a sampler checkpoint)")
                wire.load_optimizer_state(run, state["optimizer"])
                run.steps = state["steps"]
            else:
                run.optimizer = torch.optim.AdamW(run.params(), lr=1e-4)

    # ------------------------------------------------------------------ sampling

    def save_for_sampler(self, owner: str, req: Any) -> dict[str, Any]:
        run = self.run(owner, req.model_id)
        name = req.path or f"ephemeral-{uuid.uuid4().hex[:8]}"
        path = f"tinker://{run.model_id}/sampler_weights/{name}"

        async def work() -> wire.Result:
            if req.path is not None:
                await asyncio.to_thread(self._save, run, path, "sampler_weights", name, False)
            adapter = await asyncio.to_thread(self._to_sampler, run, path)
            if req.path is not None:
                return wire.json_body({"path": path, "type": "save_weights_for_sampler"})
            session = self._new_sampler(owner, run.base.name, adapter, path)
            return wire.json_body({"path": None, "sampling_session_id": session, "type": "save_weights_for_sampler"})

        return self.start(owner, work, run.model_id, req.seq_id)

    def _to_sampler(self, run: models.Run, path: str, state: dict[str, Any] | None = None) -> str:
        adapter = "s_" + hashlib.sha1(path.encode()).hexdigest()[:16]
        with run.base.lock:
            if state is None:
                state = run.adapter_state()
        if adapter in run.samplers:  # saved again under the same name: the new weights replace the old
            run.samplers.remove(adapter)
            self._drop_sampler(run.base, adapter, now=True)
        models.copy_to_sampler(run.base, run.rank, run.targets, adapter, state)
        run.samplers.append(adapter)
        while len(run.samplers) > self.limits.max_samplers:
            self._drop_sampler(run.base, run.samplers.pop(0))
        return adapter

    def _drop_sampler(self, base: models.Base, name: str, now: bool = False) -> None:
        """Sampler adapter ``name`` off the engine, or once its requests in flight end (``now``: wait for them)."""
        while True:
            with self._drop_lock:
                if not self._inflight.get(name):
                    self._doomed.discard(name)
                    models.drop_sampler(base, name)
                    return
                if not now:
                    self._doomed.add(name)
                    return
            time.sleep(0.05)

    @contextlib.asynccontextmanager
    async def _sampling(self, found: dict[str, Any]) -> AsyncIterator[str]:
        """The session's adapter on the sampler, held there while the request runs."""
        name = found["adapter"]
        with self._drop_lock:
            self._inflight[name] = self._inflight.get(name, 0) + 1
        try:
            yield await self._sampler_adapter(found)
        finally:
            with self._drop_lock:
                self._inflight[name] -= 1
                last = self._inflight[name] == 0 and name in self._doomed
            if last:
                await asyncio.to_thread(self._drop_sampler, self.base(found["base"]), name)

    def _new_sampler(self, owner: str, base: str, adapter: str, path: str | None) -> str:
        session = f"sampler-{uuid.uuid4().hex[:12]}"
        self.samplers[session] = {"owner": owner, "base": base, "adapter": adapter, "path": path}
        return session

    def create_sampling_session(self, owner: str, req: Any) -> str:
        if req.model_path is None:
            self.base(req.base_model or "")
            return self._new_sampler(owner, req.base_model, models.BASE_ADAPTER, None)
        found = self._checkpoint(owner, req.model_path)
        adapter = "s_" + hashlib.sha1(req.model_path.encode()).hexdigest()[:16]
        return self._new_sampler(owner, self.runs_base(found), adapter, req.model_path)

    def runs_base(self, found: dict[str, Any]) -> str:
        row = self.store.run(found["model_id"])
        assert row is not None
        return row["base"]

    def sampler(self, owner: str, session: str) -> dict[str, Any]:
        found = self.samplers.get(session)
        if found is None or found["owner"] != owner:
            raise UserError(f"unknown sampling session {session!r}")
        return found

    async def _sampler_adapter(self, found: dict[str, Any]) -> str:
        """The session's adapter on the sampler, loaded again from its file when it was dropped."""
        from toolrl.modeling.adapter_routing import adapter_names

        base = self.base(found["base"])
        if found["adapter"] in adapter_names(base.engine.model):
            return found["adapter"]
        if found["path"] is None or self.store.checkpoint(found["path"]) is None:
            raise UserError("these sampler weights were dropped for newer ones (a client keeps "
                            f"{self.limits.max_samplers} unnamed sets): save them with a name to keep them")
        import torch

        ckpt = self.store.checkpoint(found["path"])
        assert ckpt is not None
        state = await asyncio.to_thread(torch.load, ckpt["file"], weights_only=True)
        run = self.runs.get(ckpt["model_id"])
        rank, targets = state["rank"], state["targets"]
        await asyncio.to_thread(models.copy_to_sampler, base, rank, targets, found["adapter"], state["adapter"])
        if run is not None:
            run.samplers.append(found["adapter"])
        return found["adapter"]

    def sample(self, owner: str, req: Any) -> dict[str, Any]:
        if req.sampling_session_id is not None:
            found = self.sampler(owner, req.sampling_session_id)
        elif req.model_path is not None:
            ckpt = self._checkpoint(owner, req.model_path)
            found = {"owner": owner, "base": self.runs_base(ckpt), "path": req.model_path,
                     "adapter": "s_" + hashlib.sha1(req.model_path.encode()).hexdigest()[:16]}
        else:
            self.base(req.base_model or "")
            found = {"owner": owner, "base": req.base_model, "adapter": models.BASE_ADAPTER, "path": None}
        base = self.base(found["base"])

        async def work() -> wire.Result:
            async with self._sampling(found) as adapter:
                return await wire.sample(base, adapter, req)

        return self.start_sample(owner, work, req.num_samples)
