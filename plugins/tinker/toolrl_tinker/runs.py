"""The training runs in memory (each training client's, by model id; another client's id is answered as
unknown), and where every request starts: a future at once (:mod:`toolrl_tinker.futures`) once its key's
quotas admit it (:mod:`toolrl_tinker.quotas`), its work run now, or in its training run's ``seq_id`` order.
A session's runs leave memory when it ends; what they saved stays.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from toolrl_tinker.bases import Bases
from toolrl_tinker.futures import Futures, InOrder
from toolrl_tinker.limits import Limits
from toolrl_tinker.quotas import Quotas
from toolrl_tinker.requests import UserError
from toolrl_tinker.sessions import Sessions
from toolrl_tinker.trainer import Run
from toolrl_tinker.wire import Result

log = logging.getLogger(__name__)


class Runs(dict[str, Run]):
    def __init__(self, limits: Limits, bases: Bases, sessions: Sessions, quotas: Quotas, futures: Futures) -> None:
        super().__init__()
        self.limits = limits
        self.bases = bases
        self.sessions = sessions
        self.quotas = quotas
        self.futures = futures
        self.order: dict[str, InOrder] = {}

    def owned(self, owner: str, model_id: str) -> Run:
        run = self.get(model_id)
        if run is None or run.owner != owner:
            raise UserError(f"unknown model_id {model_id!r}: its session ended (closed, {self.limits.session_timeout:g} s "
                            "without a heartbeat, or a server restart); make a training client from its saved state")
        return run

    def new(self, owner: str, model_id: str, base: str, rank: int, targets: list[str], seed: int | None,
            first_seq: int = 1) -> Run:
        """A training run; its requests run in seq_id order from ``first_seq`` (a create-via-load's load is 0)."""
        self.sessions.check(owner, model_id.split(":")[0])
        if model_id in self:
            raise UserError(f"model_id {model_id!r} exists already")
        self.quotas.admit_run(owner, sum(r.owner == owner for r in self.values()))
        if not 0 < rank <= self.limits.max_rank:
            raise UserError(f"lora_config.rank {rank}: this server trains ranks 1 to {self.limits.max_rank}")
        if seed is not None and not -(1 << 63) <= seed < 1 << 64:
            raise UserError(f"lora_config.seed {seed}: a 64-bit integer")
        run = Run(model_id, owner, self.bases.named(base).name, rank, targets, seed)
        self[model_id] = run
        self.order[model_id] = InOrder(first_seq, functools.partial(self._gap, model_id, owner))
        return run

    def _gap(self, model_id: str, owner: str, first: int, last: int) -> None:
        log.warning("%s: seq_id %s never came; its later requests waited for it, then ran", model_id,
                    first if first == last else f"{first}-{last}")
        self.futures.metrics.count("tinker_seq_gaps_total", key=owner)

    async def end_session(self, session_id: str) -> None:
        """The session's runs out of memory (their adapters, optimizers and sampler copies), each once the
        request it is running ends."""
        for model_id in [m for m in self if m.startswith(f"{session_id}:")]:
            run = self.pop(model_id)
            await self.order.pop(model_id).closed()
            base = self.bases[run.base]
            await asyncio.to_thread(base.trainer.release, run)
            await asyncio.to_thread(base.sampler.release, model_id)

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
                if model_id is not None and model_id not in self:
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
        run = self.get(model_id) if isinstance(model_id, str) else None
        if run is not None and run.owner == owner and isinstance(seq_id, int):
            self._skip(model_id, seq_id)

    def _skip(self, model_id: str, seq_id: int | None) -> None:
        async def nothing() -> None:
            return None

        asyncio.ensure_future(self.order[model_id].submit(seq_id, nothing))
