"""What the API's calls share, apart from HTTP: each client's sessions (:mod:`toolrl_tinker.sessions`)
and training runs (ownership: another client's id is answered as unknown), the futures every call
answers with, one training run's run in ``seq_id`` order (:mod:`toolrl_tinker.futures`), each key's
quotas (:mod:`toolrl_tinker.quotas`), the checkpoints kept (:mod:`toolrl_tinker.retention`), the
metrics, and the bases with their turns (:mod:`toolrl_tinker.bounded`). The calls themselves:
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
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

from toolrl_tinker import metrics
from toolrl_tinker.bases import Base
from toolrl_tinker.bounded import Turns
from toolrl_tinker.futures import Futures, InOrder
from toolrl_tinker.hub_names import base_spec
from toolrl_tinker.quotas import Quotas
from toolrl_tinker.requests import UserError
from toolrl_tinker.retention import Retention
from toolrl_tinker.sampling_calls import SamplingCalls
from toolrl_tinker.sessions import Sessions
from toolrl_tinker.store import Store
from toolrl_tinker.trainer import Ranks, Run
from toolrl_tinker.training_calls import TrainingCalls
from toolrl_tinker.wire import Result

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Limits:
    """The server's limits (``toolrl tinker serve --help`` says what each is); "client" is an API key."""

    max_batch_tokens: int = 65536
    micro_batch_tokens: int = 512
    max_samplers: int = 4
    max_runs_per_client: int = 16
    max_rank: int = 64
    sampler: str = "transformers"  # the sampler's engine (toolrl_tinker.sampler.ENGINES)
    sampler_slots: int = 32  # adapters resident on the sampler's engine
    max_futures_per_client: int = 256
    max_tokens_per_client: int = 1 << 20
    request_timeout: float = 600.0
    session_timeout: float = 300.0
    keep_checkpoints: int = 0
    checkpoint_ttl: float | None = None
    max_request_bytes: int = 64 << 20


def owner_of(api_key: str) -> str:
    return hashlib.sha256(api_key.encode()).hexdigest()[:16]


class Service:
    def __init__(self, bases: list[str], state_dir: Path, limits: Limits | None = None,
                 ranks: Ranks | None = None) -> None:
        """``bases``: each a name clients use, or ``NAME=SOURCE`` (:func:`toolrl_tinker.hub_names.base_spec`);
        ``ranks``: where each base's trainer runs (None: in this process)."""
        self.sources = dict(base_spec(b) for b in bases)
        self.base_names = list(self.sources)
        self.limits = limits or Limits()
        self.ranks = ranks
        self.metrics = metrics.Metrics()
        self.store = Store(state_dir, self.sources)
        self.store.restarted()
        self.futures = Futures(self.store, self.metrics)
        self.quotas = Quotas(self)
        self.checkpoints = Retention(self.store, self.metrics, self.limits.keep_checkpoints, self.limits.checkpoint_ttl)
        self.sessions = Sessions(self.limits.session_timeout, self._session_ended)
        self.bases: dict[str, Base] = {}
        self.turns: dict[str, Turns] = {}
        self.runs: dict[str, Run] = {}
        self.order: dict[str, InOrder] = {}
        self.training = TrainingCalls(self)
        self.sampling = SamplingCalls(self)

    async def load_bases(self) -> None:
        """Each base loaded, once per source: names of one source share its copies and turns (as
        :meth:`distinct` lists them); expiry starts on this loop."""
        for first, names in self.distinct().items():
            base = await asyncio.to_thread(Base.load, first, self.limits.max_samplers, self.sources[first], self.ranks,
                                           self.limits.sampler, self.limits.sampler_slots, self.limits.max_rank)
            turns = Turns()
            for name in names:
                self.bases[name], self.turns[name] = dataclasses.replace(base, name=name), turns
        self.checkpoints.start(asyncio.get_running_loop())

    async def close(self) -> None:
        """The bases' trainers ended (a group's ranks on Ray) and their samplers' engines shut down (vLLM's
        processes end with them)."""
        for first in self.distinct():
            if first in self.bases:
                await asyncio.to_thread(self.bases[first].trainer.close)
                await self.bases[first].sampler.engine.close()

    def distinct(self) -> dict[str, list[str]]:
        """Each loaded base's first name, and every name it is offered under."""
        names: dict[str, list[str]] = {}
        first: dict[str, str] = {}
        for name, source in self.sources.items():
            names.setdefault(first.setdefault(source, name), []).append(name)
        return names

    def base(self, name: str) -> Base:
        if name not in self.bases:
            raise UserError(f"unknown base model {name!r}: this server holds {', '.join(self.base_names)}")
        return self.bases[name]

    # ------------------------------------------------------------------ futures

    def start(self, owner: str, work: Callable[[], Awaitable[Result]], model_id: str | None = None,
              seq_id: int | None = None, tokens: int = 0) -> dict[str, Any]:
        """A future for ``work`` holding ``tokens`` of ``owner``'s quota: run now, or in ``model_id``'s
        order of ``seq_id``. Over the quota: :class:`toolrl_tinker.quotas.QuotaExceeded` (sent again by
        the SDK, so its turn stays open) or :class:`UserError` (its turn taken)."""
        with self.refusing(model_id, seq_id):
            self.quotas.admit(owner, tokens, model_id is not None and seq_id == self.order[model_id].next)
        request_id, _ = self.futures.new(owner, tokens)

        async def job() -> None:
            try:
                if model_id is not None and model_id not in self.runs:
                    raise UserError(f"model_id {model_id!r}: its session ended before this request ran")
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
    def refusing(self, model_id: str | None, seq_id: int | None) -> Iterator[None]:
        """A request of ``model_id`` refused before it runs still takes its turn (its ``seq_id``), so
        that the client's next requests do not wait for it."""
        try:
            yield
        except UserError:
            if model_id is not None:
                self._skip(model_id, seq_id)
            raise

    def skip_turn(self, owner: str, body: Any) -> None:
        """A request whose body was refused before it was read takes its turn all the same, when the body
        names a training client of ``owner``'s and a ``seq_id``."""
        model_id, seq_id = (body.get("model_id"), body.get("seq_id")) if isinstance(body, dict) else (None, None)
        run = self.runs.get(model_id) if isinstance(model_id, str) else None
        if run is not None and run.owner == owner and isinstance(seq_id, int):
            self._skip(model_id, seq_id)

    def _skip(self, model_id: str, seq_id: int | None) -> None:
        async def nothing() -> None:
            return None

        asyncio.ensure_future(self.order[model_id].submit(seq_id, nothing))

    # ------------------------------------------------------------------ sessions and runs

    async def finish_session(self, owner: str, session_id: str) -> None:
        """``ServiceClient.close()``: the session ends now (one that ended already, or is not the owner's,
        is left as it is: closing twice, or after a timeout, is no error)."""
        if self.sessions.owners.get(session_id) == owner:
            await self.sessions.end(session_id, "closed")

    async def _session_ended(self, session_id: str, reason: str) -> None:
        """An ended session's training runs leave memory (their adapters, optimizers and sampler copies)
        once the request each is running ends; what they saved stays, and a new client loads it
        (``create_training_client_from_state``)."""
        self.metrics.count("tinker_sessions_ended_total", reason=reason)
        for model_id in [m for m in self.runs if m.startswith(f"{session_id}:")]:
            run = self.runs.pop(model_id)
            await self.order.pop(model_id).closed()
            base = self.bases[run.base]
            await asyncio.to_thread(base.trainer.release, run)
            await asyncio.to_thread(base.sampler.release, model_id)

    def run(self, owner: str, model_id: str) -> Run:
        run = self.runs.get(model_id)
        if run is None or run.owner != owner:
            raise UserError(f"unknown model_id {model_id!r}: its session ended (closed, {self.limits.session_timeout:g} s "
                            "without a heartbeat, or a server restart); make a training client from its saved state")
        return run

    async def metrics_text(self) -> str:
        """The metrics now: counters so far, and gauges read now (memory in a worker thread, under the
        bases' locks)."""
        keys = {r.owner for r in self.runs.values()} | set(self.futures.running)
        stored = self.store.checkpoint_totals()
        gauges: list[metrics.Sample] = [
            *(("tinker_requests_in_flight", {"kind": k}, n) for k, n in self.futures.kinds.items()),
            *(("tinker_trainer_waiting", {"base": b}, self.turns[b].waiting) for b in self.distinct()),
            *(("tinker_key_requests_in_flight", {"key": k}, self.futures.running[k]) for k in keys),
            *(("tinker_key_tokens_in_flight", {"key": k}, self.futures.tokens[k]) for k in keys),
            *(("tinker_key_training_clients", {"key": k}, sum(r.owner == k for r in self.runs.values())) for k in keys),
            *(("tinker_key_checkpoints", {"key": k}, n) for k, n, _ in stored),
            *(("tinker_key_checkpoint_bytes", {"key": k}, size) for k, _, size in stored),
            ("tinker_sessions", {}, len(self.sessions.owners)),
        ]
        if (rss := metrics.resident_bytes()) is not None:
            gauges.append(("tinker_process_resident_memory_bytes", {}, rss))
        for name in self.distinct():
            gauges += await asyncio.to_thread(metrics.base_memory, self.bases[name])
        return self.metrics.render(gauges)

    def new_run(self, owner: str, model_id: str, base: str, rank: int, targets: list[str],
                seed: int | None, first_seq: int = 1) -> Run:
        """A training run; its requests run in seq_id order from ``first_seq`` (a create-via-load's load is 0)."""
        self.sessions.check(owner, model_id.split(":")[0])
        if model_id in self.runs:
            raise UserError(f"model_id {model_id!r} exists already")
        self.quotas.admit_run(owner)
        if not 0 < rank <= self.limits.max_rank:
            raise UserError(f"lora_config.rank {rank}: this server trains ranks 1 to {self.limits.max_rank}")
        if seed is not None and not -(1 << 63) <= seed < 1 << 64:
            raise UserError(f"lora_config.seed {seed}: a 64-bit integer")
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
