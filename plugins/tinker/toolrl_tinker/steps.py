"""The training step a request runs on a base (``forward``, ``forward_backward``): micro-batches taken
in turns; how long any request may hold a base, and what a request that fails leaves behind.

A ``forward`` or ``forward_backward`` runs one micro-batch at a time (``--micro-batch-tokens``, or one
datum alone), each in its turn on the base's trainer (:class:`Turns`: first come, first served, and back to
the end of the line after each micro-batch), so a request waits at most one micro-batch of each request
ahead of it, whatever their sizes. The loss is a sum over tokens, so the pieces add up to one pass over the
batch (float32 rounding aside). A request holds its base for at most ``--request-timeout`` seconds of
micro-batches (plus the one under way); a ``forward_backward`` that stops or fails, or whose loss or gradient
is not finite, leaves its run's gradients as they were before it and fails naming why. A ``sample`` has the
same bound (:func:`time_limit`).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import TYPE_CHECKING

from toolrl.training.token_step import LossSpec, StepOutput, TokenRow, micro_batch_spans

from toolrl_tinker.requests import UserError

if TYPE_CHECKING:
    from toolrl_tinker.trainer import Run, Trainer


class Turns:
    """One base's turns on its trainer, handed out in the order they were asked for."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._line: deque[object] = deque()

    @contextlib.contextmanager
    def turn(self) -> Iterator[None]:
        me = object()
        with self._changed:
            self._line.append(me)
            self._changed.wait_for(lambda: self._line[0] is me)
        try:
            yield
        finally:
            with self._changed:
                self._line.popleft()
                self._changed.notify_all()

    @property
    def waiting(self) -> int:
        """Turns asked for and not yet given."""
        return max(0, len(self._line) - 1)


def forward_backward(trainer: Trainer, turns: Turns, run: Run, rows: Sequence[TokenRow], loss: LossSpec,
                     forward_only: bool, micro_tokens: int, time_limit: float) -> StepOutput:
    """``rows`` through ``run``'s adapter, a micro-batch per turn; gradients added unless ``forward_only``,
    and put back as they were when the request fails."""
    spans = micro_batch_spans([len(row.tokens) for row in rows], micro_tokens)
    before = None if forward_only else trainer.gradients(run)
    pieces: list[StepOutput] = []
    held = 0.0
    try:
        for start, end in spans:
            if held > time_limit:
                raise UserError(f"this request held its base for {held:.1f} s, past this server's bound of "
                                f"{time_limit:g} s per request (tinker serve --request-timeout), with "
                                f"{len(rows) - start} of its {len(rows)} datums left: send fewer tokens at once")
            with turns.turn():
                began = time.monotonic()
                pieces.append(trainer.step(run, rows[start:end], loss, forward_only, micro_tokens))
                held += time.monotonic() - began
        total = sum(p.loss for p in pieces)  # in order, as one call over the spans adds them
        # A forward's loss is only reported; a gradient that is not finite would ruin the run at its next step.
        if not forward_only and (not math.isfinite(total) or not all(
                g is None or bool(g.isfinite().all()) for g in trainer.gradients(run).values())):
            raise UserError(f"the loss of this request is {total} (or its gradient is not finite): its inputs "
                            "overflow (logprobs or advantages far out of range?); the run's gradients are as "
                            "they were before it")
    except BaseException:
        if before is not None:
            trainer.set_gradients(run, before)
        raise
    return StepOutput(logprobs=[lp for p in pieces for lp in p.logprobs], loss=total,
                      tokens=sum(p.tokens for p in pieces), micro_batches=sum(p.micro_batches for p in pieces))


@contextlib.asynccontextmanager
async def time_limit(seconds: float, what: str) -> AsyncIterator[None]:
    """The block cancelled, and :class:`UserError` raised, when it runs past ``seconds``."""
    try:
        async with asyncio.timeout(seconds):
            yield
    except TimeoutError:
        raise UserError(f"{what} ran past this server's bound of {seconds:g} s per request (tinker serve "
                        "--request-timeout): ask for fewer samples or tokens at once") from None
