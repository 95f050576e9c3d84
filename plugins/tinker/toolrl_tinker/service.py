"""The service put together: the bases (:mod:`toolrl_tinker.bases`), sessions, training runs and where
every request starts (:mod:`toolrl_tinker.runs`), futures, quotas, the checkpoints kept and the metrics;
the calls (:mod:`toolrl_tinker.training_calls`, :mod:`toolrl_tinker.sampling_calls`) get only the parts
they use. Memory per client: its runs' adapters on the trainer's copy of the base and at most
``max_samplers`` saved weight sets per run on the sampler's.
"""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

from toolrl.training.peakmem import rss_bytes

from toolrl_tinker import metrics
from toolrl_tinker.bases import Bases
from toolrl_tinker.futures import Futures
from toolrl_tinker.limits import Limits
from toolrl_tinker.quotas import Quotas
from toolrl_tinker.retention import Retention
from toolrl_tinker.runs import Runs
from toolrl_tinker.sampling_calls import SamplingCalls
from toolrl_tinker.sessions import Sessions
from toolrl_tinker.store import Store
from toolrl_tinker.trainer import Ranks
from toolrl_tinker.training_calls import TrainingCalls


def owner_of(api_key: str) -> str:
    return hashlib.sha256(api_key.encode()).hexdigest()[:16]


class Service:
    def __init__(self, bases: list[str], state_dir: Path, limits: Limits | None = None,
                 ranks: Ranks | None = None) -> None:
        """``bases``: each a name clients use, or ``NAME=SOURCE`` (:func:`toolrl_tinker.hub_names.base_spec`);
        ``ranks``: where each base's trainer runs (None: in this process)."""
        self.limits = limits or Limits()
        self.ranks = ranks
        self.bases = Bases(bases)
        self.metrics = metrics.Metrics()
        self.store = Store(state_dir, self.bases.sources)
        self.store.restarted()
        self.futures = Futures(self.store, self.metrics)
        self.checkpoints = Retention(self.store, self.metrics, self.limits.keep_checkpoints, self.limits.checkpoint_ttl)
        self.sessions = Sessions(self.limits.session_timeout, self._session_ended)
        quotas = Quotas(self.limits, self.futures, self.metrics)
        self.runs = Runs(self.limits, self.bases, self.sessions, quotas, self.futures)
        self.training = TrainingCalls(self.runs, self.bases, self.store, self.checkpoints, self.metrics, self.limits)
        self.sampling = SamplingCalls(self.runs, self.bases, self.store, self.metrics, self.limits, self.training.save)

    async def load_bases(self) -> None:
        """The bases loaded; expiry starts on this loop."""
        await self.bases.load(self.limits, self.ranks)
        self.checkpoints.start(asyncio.get_running_loop())

    async def close(self) -> None:
        await self.bases.close()

    async def finish_session(self, owner: str, session_id: str) -> None:
        """``ServiceClient.close()``: the session ends now (one that ended already, or is not the owner's,
        is left as it is: closing twice, or after a timeout, is no error)."""
        if self.sessions.owners.get(session_id) == owner:
            await self.sessions.end(session_id, "closed")

    async def _session_ended(self, session_id: str, reason: str) -> None:
        """An ended session's training runs leave memory once the request each is running ends; what they
        saved stays, and a new client loads it (``create_training_client_from_state``)."""
        self.metrics.count("tinker_sessions_ended_total", reason=reason)
        await self.runs.end_session(session_id)

    async def metrics_text(self) -> str:
        """The metrics now: counters so far, and gauges read now (memory in a worker thread, under the
        bases' locks)."""
        keys = {r.owner for r in self.runs.values()} | set(self.futures.running)
        stored = self.store.checkpoint_totals()
        gauges: list[metrics.Sample] = [
            *(("tinker_requests_in_flight", {"kind": k}, n) for k, n in self.futures.kinds.items()),
            *(("tinker_trainer_waiting", {"base": b}, self.bases[b].turns.waiting) for b in self.bases.distinct()),
            *(("tinker_key_requests_in_flight", {"key": k}, self.futures.running[k]) for k in keys),
            *(("tinker_key_tokens_in_flight", {"key": k}, self.futures.tokens[k]) for k in keys),
            *(("tinker_key_training_clients", {"key": k}, sum(r.owner == k for r in self.runs.values())) for k in keys),
            *(("tinker_key_checkpoints", {"key": k}, n) for k, n, _ in stored),
            *(("tinker_key_checkpoint_bytes", {"key": k}, size) for k, _, size in stored),
            ("tinker_sessions", {}, len(self.sessions.owners)),
        ]
        if (rss := rss_bytes()) is not None:
            gauges.append(("tinker_process_resident_memory_bytes", {}, rss))
        for name in self.bases.distinct():
            memory = await asyncio.to_thread(self.bases[name].memory)
            gauges += [("tinker_base_memory_bytes", {"base": name, "copy": copy, "part": part}, value)
                       for copy, parts in memory.items() for part, value in parts.items()]
        return self.metrics.render(gauges)
