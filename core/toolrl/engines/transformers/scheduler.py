"""The transformers engine's scheduler: every ``generate`` call becomes a :class:`Request` in a queue, and
one task on the event loop runs the engine's *steps* in a worker thread (``asyncio.to_thread``, so tool
calls keep running meanwhile). Each step gets the queued requests whose samples (a :class:`Row` each) fit
beside the running rows (``max_batch_size``), naming no more adapters than the engine has slots for
(``max_adapters``), and the running ones whose callers went away; a request so waits at most one step
before it starts, never for a whole batch to finish (or, past the slots, for a running adapter's rows to end)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from toolrl.engines import FinishReason, Generation, SamplingParams
from toolrl.seeds import sample_seed
from toolrl.trajectory import RoutedExperts

if TYPE_CHECKING:
    import torch

# Uniforms a sampled row draws from its generator at once: block draws continue the generator's stream
# exactly as one draw per token would (CPU generators), at one call per block instead of one per token.
UNIFORM_BLOCK = 64


@dataclass
class Request:
    """One ``generate`` call."""

    prompt: list[int]
    params: SamplingParams
    n: int
    session_id: str | None
    future: asyncio.Future[list[Generation]]
    results: list[Generation | None] = field(default_factory=list)
    remaining: int = 0  # its samples still decoding: its rows in the running batch
    weight_version: int = 0  # the engine's when the first token was sampled
    images: list[Any] = field(default_factory=list)  # the prompt's (toolrl.trajectory.TrajectoryImage)
    prefill_tokens_saved: int = 0  # prompt tokens not prefilled for it (kept KV, or another's prefill)
    adapter: str | None = None  # by name, so its route follows adapters added or removed (RowAdapters)

    def rows(self, unseeded: Iterator[int]) -> list[Row]:
        """A row per sample, each with its own generator (None: greedy), seeded by ``params.seed`` or,
        without one, by the next of ``unseeded``."""
        import torch

        seeds = [None if self.params.temperature == 0 else self.params.seed if self.params.seed is not None
                 else next(unseeded) for _ in range(self.n)]
        return [Row(self, j, None if seed is None else torch.Generator().manual_seed(sample_seed(seed, j)))
                for j, seed in enumerate(seeds)]


@dataclass
class Row:
    """One sample being decoded."""

    req: Request
    index: int
    generator: torch.Generator | None  # on the host, whatever the device; None: greedy
    next_token: int = -1  # sampled but not yet fed to the model
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    experts: list[torch.Tensor] = field(default_factory=list)  # [tokens, layers, top_k] pieces (record_routes)
    uniforms: list[float] = field(default_factory=list)  # drawn from the generator, not yet used (last first)

    def uniform(self) -> float:
        """The generator's next uniform in [0, 1), drawn UNIFORM_BLOCK at a time."""
        if not self.uniforms:
            import torch

            block = torch.rand(UNIFORM_BLOCK, generator=self.generator, dtype=torch.float64)
            self.uniforms = block.tolist()[::-1]
        return self.uniforms.pop()

    def generation(self, reason: FinishReason, stop: int | str | None) -> Generation:
        """The sample as its caller gets it (the request's saved prefill counted on its first sample)."""
        import torch

        req = self.req
        return Generation(list(self.tokens), list(self.logprobs), reason, stop, req.weight_version,
                          req.prefill_tokens_saved if self.index == 0 else 0,
                          RoutedExperts.of(torch.cat(self.experts).cpu()) if self.experts else None)

    def finish(self, tokenizer: Any, max_model_len: int) -> tuple[FinishReason | None, int | str | None]:
        """Why the row ends at its last token (None: it goes on), and the stop token or string that ended
        it. ``tokenizer``: the engine's, loaded where the request has stop strings."""
        params = self.req.params
        tok = self.tokens[-1]
        if tok in params.stop_token_ids:
            return "stop", tok
        if params.stop_strings:
            # A stop string of b bytes spans at most b + 1 tokens (every token is >= 1 byte), and
            # the check runs after every token, so this window sees every new occurrence.
            width = max(len(s.encode()) for s in params.stop_strings) + 1
            tail = tokenizer.decode(self.tokens[-width:], skip_special_tokens=False, clean_up_tokenization_spaces=False)
            for s in params.stop_strings:
                if s in tail:
                    return "stop_string", s
        if len(self.tokens) >= params.max_new_tokens or len(self.req.prompt) + len(self.tokens) >= max_model_len:
            return "length", None
        return None, None


class Scheduler:
    """The queue of requests, the running ones, and the task that steps them (module docstring)."""

    def __init__(self, max_rows: int, max_adapters: int | None = None) -> None:
        self.max_rows, self.max_adapters = max_rows, max_adapters
        self.pending: list[Request] = []
        self.running: list[Request] = []  # admitted, with rows in the engine's batch
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()  # set when there is work; a new one for each event loop

    def start(self, loop: asyncio.AbstractEventLoop, step: Callable[..., None]) -> bool:
        """Run ``step(admitted, cancelled ids, finished)`` on ``loop`` unless it runs there; True when it
        starts: first use, or a new loop (an ``asyncio.run`` per rollout phase), where whatever the
        old one left behind can never complete."""
        if self._task is not None and self._task.get_loop() is loop and not self._task.done():
            return False
        self.fail_all(RuntimeError("engine restarted on a new event loop"))
        self._wake = asyncio.Event()
        self._task = loop.create_task(self._run(step), name="toolrl-transformers-engine")
        return True

    def submit(self, req: Request) -> None:
        self.pending.append(req)
        self._wake.set()

    async def _run(self, step: Callable[..., None]) -> None:
        while True:
            if not self.pending and not self.running:
                self._wake.clear()
                await self._wake.wait()
                continue
            admitted = self._admit()
            cancelled = {id(req) for req in self.running if req.future.done()}
            finished: list[Request] = []
            failed: Exception | None = None
            try:
                await asyncio.to_thread(step, admitted, cancelled, finished)
            except Exception as exc:  # a failed step fails its requests, not the engine
                failed = exc
            # Requests completed before a failure later in the step have their whole results: they get
            # them (they have left the batch, so failing the batch would never reach them).
            for req in finished:
                if not req.future.done():
                    req.future.set_result(list(req.results))  # type: ignore[arg-type]
            gone = {id(req) for req in finished} | cancelled
            self.running = [req for req in self.running + admitted if id(req) not in gone]
            if failed is not None:
                self.fail_all(failed, pending=False)

    def _admit(self) -> list[Request]:
        admitted: list[Request] = []
        rows = sum(req.remaining for req in self.running)
        adapters = {req.adapter for req in self.running}  # a step's adapters fit the engine's slots
        while self.pending:
            req = self.pending[0]
            if req.future.done():  # cancelled while queued
                self.pending.pop(0)
                continue
            if rows and (rows + req.n > self.max_rows or req.adapter not in adapters
                         and self.max_adapters is not None and len(adapters) >= self.max_adapters):
                break
            admitted.append(self.pending.pop(0))
            rows += req.n
            adapters.add(req.adapter)
        return admitted

    def fail_all(self, exc: BaseException, pending: bool = True) -> None:
        """Fail the running requests, and the queued ones with ``pending``."""
        for req in self.running + (self.pending if pending else []):
            if not req.future.done() and not req.future.get_loop().is_closed():
                req.future.set_exception(exc)
        self.running, self.pending = [], [] if pending else self.pending

    async def close(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, RuntimeError):
                await self._task
        self.fail_all(RuntimeError("engine closed"))
