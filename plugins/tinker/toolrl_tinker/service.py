"""What the API's calls share, apart from HTTP: each client's sessions and training runs (ownership:
another client's id is answered as unknown), the futures every call answers with, one training run's
run in ``seq_id`` order (:mod:`toolrl_tinker.futures`), and the bases. The calls themselves:
:class:`toolrl_tinker.training_calls.TrainingCalls` and :class:`toolrl_tinker.sampling_calls.SamplingCalls`.

Memory per client: its runs' adapters on the trainer's copy of the base (:mod:`toolrl_tinker.trainer`)
and at most ``max_samplers`` saved weight sets per run on the sampler's (:mod:`toolrl_tinker.sampler`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import logging
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

from toolrl_tinker.bases import Base
from toolrl_tinker.futures import Futures, InOrder
from toolrl_tinker.requests import UserError
from toolrl_tinker.sampling_calls import SamplingCalls
from toolrl_tinker.store import Store
from toolrl_tinker.trainer import Ranks, Run
from toolrl_tinker.training_calls import TrainingCalls
from toolrl_tinker.wire import Result

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Limits:
    max_batch_tokens: int = 65536
    micro_batch_tokens: int = 512
    max_samplers: int = 4
    max_runs_per_client: int = 16
    max_rank: int = 64
    sampler: str = "transformers"  # the sampler's engine (toolrl_tinker.sampler.ENGINES)
    sampler_slots: int = 32  # adapters resident on the sampler's engine


def owner_of(api_key: str) -> str:
    return hashlib.sha256(api_key.encode()).hexdigest()[:16]


class Service:
    def __init__(self, bases: list[str], state_dir: Path, limits: Limits | None = None,
                 ranks: Ranks | None = None) -> None:
        self.base_names = list(bases)
        self.limits = limits or Limits()
        self.ranks = ranks  # where each base's trainer runs (None: in this process)
        self.store = Store(state_dir)
        self.futures = Futures(self.store)
        self.bases: dict[str, Base] = {}
        self.runs: dict[str, Run] = {}
        self.order: dict[str, InOrder] = {}
        self.sessions: dict[str, str] = {}  # session id -> owner
        self.training = TrainingCalls(self)
        self.sampling = SamplingCalls(self)

    async def load_bases(self) -> None:
        for name in self.base_names:
            self.bases[name] = await asyncio.to_thread(Base.load, name, self.limits.max_samplers, self.ranks,
                                                       self.limits.sampler, self.limits.sampler_slots,
                                                       self.limits.max_rank)

    async def close(self) -> None:
        """The bases' trainers ended (a group's ranks on Ray) and their samplers' engines shut down (vLLM's
        processes end with them)."""
        for base in self.bases.values():
            await asyncio.to_thread(base.trainer.close)
            await base.sampler.engine.close()

    def base(self, name: str) -> Base:
        if name not in self.bases:
            raise UserError(f"unknown base model {name!r}: this server holds {', '.join(self.base_names)}")
        return self.bases[name]

    # ------------------------------------------------------------------ futures

    def start(self, owner: str, work: Callable[[], Awaitable[Result]], model_id: str | None = None,
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
            base = self.bases[run.base]
            await asyncio.to_thread(base.trainer.release, run)
            await asyncio.to_thread(base.sampler.release, model_id)

    def run(self, owner: str, model_id: str) -> Run:
        run = self.runs.get(model_id)
        if run is None or run.owner != owner:
            raise UserError(f"unknown model_id {model_id!r}")
        return run

    def new_run(self, owner: str, model_id: str, base: str, rank: int, targets: list[str],
                seed: int | None, first_seq: int = 1) -> Run:
        """A training run; its requests run in seq_id order from ``first_seq`` (a create-via-load's load is 0)."""
        if model_id in self.runs:
            raise UserError(f"model_id {model_id!r} exists already")
        if sum(r.owner == owner for r in self.runs.values()) >= self.limits.max_runs_per_client:
            raise UserError(f"this client holds {self.limits.max_runs_per_client} models, the server's limit "
                            "(tinker serve --max-runs-per-client)")
        if not 0 < rank <= self.limits.max_rank:
            raise UserError(f"lora_config.rank {rank}: this server trains ranks 1 to {self.limits.max_rank}")
        run = Run(model_id, owner, self.base(base).name, rank, targets, seed)
        self.runs[model_id] = run
        self.order[model_id] = InOrder(first=first_seq)
        return run

    def checkpoint(self, owner: str, path: str) -> dict[str, Any]:
        """The store's record of checkpoint ``path`` of ``owner``'s."""
        found = self.store.checkpoint(path)
        if found is None or found["owner"] != owner:
            raise UserError(f"checkpoint {path!r} does not exist")
        return found
