"""The sampling client's calls: weights saved for a sampler, sampling sessions (on a saved path or a
base model) and ``sample``, through the base's :class:`toolrl_tinker.sampler.Sampler`. A session is a
record of whose it is, its base and the sampler adapter it samples through."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from toolrl_tinker import adapters, requests, steps, trainer, wire
from toolrl_tinker.requests import UserError

if TYPE_CHECKING:
    from tinker import types

    from toolrl_tinker.bases import Bases
    from toolrl_tinker.limits import Limits
    from toolrl_tinker.metrics import Metrics
    from toolrl_tinker.runs import Runs
    from toolrl_tinker.sampler import Sampled
    from toolrl_tinker.store import Store


@dataclass(frozen=True)
class SamplerRecord:
    """A sampling session: its owner, base, adapter on the sampler and the ``tinker://`` path of its
    weights (None: the base model itself)."""

    owner: str
    base: str
    adapter: str
    path: str | None


@dataclass(eq=False)
class SamplingCalls:
    runs: Runs
    bases: Bases
    store: Store
    metrics: Metrics
    limits: Limits
    # A run's checkpoint written and recorded (TrainingCalls.save): sampler weights saved under a name.
    save: Callable[[trainer.Run, str, str, int | None], Path]
    sessions: dict[str, SamplerRecord] = field(default_factory=dict)

    def save_for_sampler(self, owner: str, req: types.SaveWeightsForSamplerRequest) -> dict[str, Any]:
        """The run's weights on the sampler: saved under ``req.path``, or unnamed with a session on them."""
        run = self.runs.owned(owner, req.model_id)
        name = req.path or f"ephemeral-{uuid.uuid4().hex[:8]}"
        path = f"tinker://{run.model_id}/sampler_weights/{name}"
        adapter = adapters.sampler_name(path)

        def put() -> None:
            if req.path is not None:
                self.save(run, "sampler_weights", name, req.ttl_seconds)
            base = self.bases.named(run.base)
            base.sampler.put(run.model_id, adapter, run.rank, run.targets, base.trainer.adapter_state(run))

        async def work() -> wire.Result:
            await asyncio.to_thread(put)
            if req.path is not None:
                return wire.json_body({"path": path, "type": "save_weights_for_sampler"})
            session = self._new(SamplerRecord(owner, run.base, adapter, path))
            return wire.json_body({"path": None, "sampling_session_id": session, "type": "save_weights_for_sampler"})

        return self.runs.start(owner, work, run.model_id, req.seq_id)

    def create_sampling_session(self, owner: str, req: types.CreateSamplingSessionRequest) -> dict[str, Any]:
        return {"type": "create_sampling_session",
                "sampling_session_id": self._new(self._record(owner, req.model_path, req.base_model))}

    def _new(self, record: SamplerRecord) -> str:
        session = f"sampler-{uuid.uuid4().hex[:12]}"
        self.sessions[session] = record
        return session

    def _record(self, owner: str, model_path: str | None, base_model: str | None) -> SamplerRecord:
        """What a request names: a saved path's weights, else the base model's."""
        if model_path is None:
            return SamplerRecord(owner, self.bases.named(base_model or "").name, adapters.BASE_ADAPTER, None)
        found = self.store.owned_checkpoint(owner, model_path)
        run = self.store.run(found["model_id"])
        assert run is not None
        return SamplerRecord(owner, run["base"], adapters.sampler_name(model_path), model_path)

    def sampler(self, owner: str, session: str) -> SamplerRecord:
        found = self.sessions.get(session)
        if found is None or found.owner != owner:
            raise UserError(f"unknown sampling session {session!r}")
        return found

    def sample(self, owner: str, req: types.SampleRequest) -> dict[str, Any]:
        """A future of ``req.num_samples`` sequences, naming them."""
        if req.sampling_session_id is not None:
            record = self.sampler(owner, req.sampling_session_id)
        else:
            record = self._record(owner, req.model_path, req.base_model)
        base = self.bases.named(record.base)
        sampler = base.sampler
        tokens = requests.sample_tokens(req, sampler.context, sampler.vocab)
        time_limit = self.limits.request_timeout

        async def work() -> wire.Result:
            with base.idle.busy():  # its cache and logits given back once the base is idle
                sampled = await self._sample(record, req, time_limit)
            new = sum(len(g.token_ids) for g in sampled.sequences)
            self.metrics.count("tinker_sampled_tokens_total", new, base=record.base, key=owner)
            return wire.sample_response(sampled, req)

        answer = self.runs.start(owner, work, tokens=tokens)
        answer["sample_sequence_ids"] = [f"{answer['request_id']}:{i}" for i in range(req.num_samples)]
        return answer

    async def _sample(self, record: SamplerRecord, req: types.SampleRequest, time_limit: float) -> Sampled:
        sampler = self.bases.named(record.base).sampler
        async with sampler.using(record.adapter):
            if not sampler.holds(record.adapter):
                await asyncio.to_thread(self._reload, record)
            async with steps.time_limit(time_limit, "sample"):
                return await sampler.sample(record.adapter, req)

    def _reload(self, record: SamplerRecord) -> None:
        """A session's weights, dropped from the sampler for newer ones, loaded again from their file."""
        found = self.store.checkpoint(record.path) if record.path is not None else None
        if found is None:
            raise UserError("these sampler weights were dropped for newer ones (a client keeps "
                            f"{self.limits.max_samplers} unnamed sets): save them with a name to keep them")
        state = trainer.read(found["file"])
        self.bases.named(record.base).sampler.restore(found["model_id"], record.adapter, state["rank"],
                                                      state["targets"], state["adapter"])
