"""Running tool code so that no fault escapes: a hard deadline, plain ``def`` methods in a thread, and a
watchdog for code that blocks the event loop.

A blocking call inside an ``async def`` cannot be preempted in-process, so it is reported instead: steps of
the tool's coroutine of ``LOOP_BLOCK_S`` or longer are summed into :attr:`Guarded.blocked_s`, a watchdog
thread names the tool in the log while it still holds the loop, and a call that finishes after its
deadline is a timeout, whatever it returned. The cure is ``isolation: process``
(:mod:`toolrl.tools.isolation`), whose worker is killed when a call overruns.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import logging
import threading
import time
import types
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from toolrl.plugins.registry import describe_exception
from toolrl.schemas import InfrastructureError

log = logging.getLogger("toolrl.tools")

LOOP_BLOCK_S = 0.1  # a coroutine step this long is the tool holding the event loop
WATCHDOG_WARN_S = 1.0  # the watchdog names a tool once one step has held the loop this long
_WATCHDOG_POLL_S = 0.25


@dataclass
class Guarded:
    """The outcome of :func:`run_guarded`. ``error`` is set for exceptions (``TypeName: message``);
    ``timed_out`` when the deadline passed, however the code behaved; ``infrastructure`` when the
    exception was a :class:`toolrl.schemas.InfrastructureError`."""

    value: Any = None
    error: str | None = None
    timed_out: bool = False
    infrastructure: bool = False
    blocked_s: float = 0.0
    # The task running the code; still running after a timeout when the code has not honoured its
    # cancellation yet (``abandoned``).
    task: asyncio.Task[Any] | None = field(default=None, repr=False)
    abandoned: bool = False


# -- the watchdog -----------------------------------------------------------------------------------

# thread id of a running event loop -> [label, step start, warned]; written by loop threads only.
_steps: dict[int, list[Any]] = {}
_watchdog_lock = threading.Lock()
_watchdog: threading.Thread | None = None


def _watch() -> None:
    while True:
        time.sleep(_WATCHDOG_POLL_S)
        now = time.perf_counter()
        for step in list(_steps.values()):
            if not step[2] and now - step[1] >= WATCHDOG_WARN_S:
                step[2] = True
                log.warning("%s has blocked the event loop for %.1f s and still holds it: every other call and "
                            "trajectory is waiting. Make the blocking call async, make the method a plain def "
                            "(it then runs in a thread), or set isolation: process in the tool's config.",
                            step[0], now - step[1])


def _ensure_watchdog() -> None:
    global _watchdog
    if _watchdog is None:
        with _watchdog_lock:
            if _watchdog is None:
                _watchdog = threading.Thread(target=_watch, name="toolrl-loop-watchdog", daemon=True)
                _watchdog.start()


@types.coroutine
def _timed(coro: Any, label: str, outcome: Guarded) -> Generator[Any, Any, Any]:
    """Drive ``coro`` step by step (as ``await coro`` would), timing every step and publishing the
    running step to the watchdog."""
    key = threading.get_ident()
    value: Any = None
    error: BaseException | None = None
    while True:
        step = _steps[key] = [label, time.perf_counter(), False]
        try:
            yielded = coro.send(value) if error is None else coro.throw(error)
        except StopIteration as stop:
            return stop.value
        except SystemExit as exc:  # would stop the whole event loop
            raise ToolExited(exc) from None
        finally:
            held = time.perf_counter() - step[1]
            _steps.pop(key, None)
            if held >= LOOP_BLOCK_S:
                outcome.blocked_s += held
        try:
            value, error = (yield yielded), None
        except BaseException as exc:  # cancellation and friends go to the tool, as with a plain await
            value, error = None, exc


# -- running ------------------------------------------------------------------------------------------


class ToolExited(RuntimeError):
    """Tool code called ``sys.exit()``, which would otherwise stop the whole event loop."""

    def __init__(self, exc: SystemExit) -> None:
        super().__init__(f"the tool called sys.exit({exc.code!r})")


def in_thread(fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]) -> asyncio.Future[Any]:
    """Run a plain function in a daemon thread (a hung one never blocks interpreter exit, unlike a
    thread pool's workers); the future resolves on the calling loop."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()
    context = contextvars.copy_context()

    def settle(ok: bool, value: Any) -> None:
        if not future.done():
            future.set_result(value) if ok else future.set_exception(value)

    def work() -> None:
        try:
            result: tuple[bool, Any] = (True, context.run(fn, *args, **kwargs))
        except SystemExit as exc:
            result = (False, ToolExited(exc))
        except BaseException as exc:  # reported to the caller, never raised in the thread
            result = (False, exc)
        with contextlib.suppress(RuntimeError):  # the loop is gone; nobody is waiting
            loop.call_soon_threadsafe(settle, *result)

    threading.Thread(target=work, name=f"toolrl-tool:{getattr(fn, '__qualname__', fn)}", daemon=True).start()
    return future


async def run_guarded(label: str, fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any],
                      timeout: float) -> Guarded:
    """Call ``fn(*args, **kwargs)`` (async, or plain and then in a thread) with a hard deadline;
    never raises except when the caller itself is cancelled. ``label`` names the code in logs."""
    loop = asyncio.get_running_loop()
    outcome = Guarded()
    start = loop.time()

    async def body() -> Any:
        if inspect.iscoroutinefunction(fn):
            return await _timed(fn(*args, **kwargs), label, outcome)
        value = await in_thread(fn, args, kwargs)
        if inspect.isawaitable(value):  # a plain def that hands back a coroutine
            value = await _timed(value.__await__(), label, outcome)
        return value

    _ensure_watchdog()
    task = outcome.task = loop.create_task(body(), name=f"toolrl:{label}")
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout)
    except asyncio.CancelledError:
        task.cancel()
        raise
    if not done:
        outcome.timed_out = outcome.abandoned = True
        task.cancel()
        task.add_done_callback(lambda t: _report_late(t, label, timeout, start))
    elif task.cancelled():  # the code cancelled itself
        outcome.error = "CancelledError: the call was cancelled"
    elif (exc := task.exception()) is not None:
        outcome.error, outcome.infrastructure = describe_exception(exc), isinstance(exc, InfrastructureError)
    elif loop.time() - start > timeout and outcome.blocked_s:  # it held the loop past its own deadline
        outcome.timed_out = True
    else:
        outcome.value = task.result()
    if outcome.blocked_s:
        log.warning("%s blocked the event loop for %.2f s in total", label, outcome.blocked_s)
    return outcome


def _report_late(task: asyncio.Task[Any], label: str, timeout: float, start: float) -> None:
    """A timed-out call's task finally ended; say so if it did not end by being cancelled."""
    if task.cancelled():
        return
    late = task.get_loop().time() - start
    exc = task.exception()
    log.warning("%s ignored cancellation after its %g s timeout and %s %.1f s after it started; its result "
                "was discarded (use isolation: process to have such calls killed)", label, timeout,
                f"raised {describe_exception(exc)}" if exc else "returned", late)
