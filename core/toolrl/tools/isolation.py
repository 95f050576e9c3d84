"""``isolation: process``: a tool that runs in a worker process of its own.

The rollout holds a :class:`ProcessTool` (built by :func:`toolrl.tools.verl_config.build_entry` through
:meth:`ProcessTool.start`) that forwards every lifecycle call to the child. A crash fails only the calls
in flight and the next call starts a fresh worker, where each instance is created again from its
``create_kwargs``; a call that overruns its timeout and has not stopped ``kill_grace_s`` after its
cancellation gets the worker killed: the cure for tools that block or hang, which in-process can only
be detected (:mod:`toolrl.tools.guard`). What it costs and what it cannot isolate: docs/plugins.md,
"Tools: faults and isolation".
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import os
import pickle
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping
from concurrent.futures import Future
from multiprocessing.connection import Connection
from typing import Any, ClassVar

from toolrl.plugins.registry import import_reference
from toolrl.schemas import ToolResult
from toolrl.tools import Tool, ToolConfigError
from toolrl.tools.guard import in_thread

START_TIMEOUT_S = 120.0  # importing a tool's dependencies in a fresh interpreter can take a while


class WorkerDied(RuntimeError):
    """The worker process ended (crashed or was killed) while a call was in flight."""


class WorkerUnreachable(WorkerDied):
    """A call could not be sent: the worker is going down. The call never ran, so it may be retried."""


# -- the wire: pickled messages over a socketpair, framed by multiprocessing's Connection ------------
# (its recv() reads what send_bytes(pickle) wrote, and raises EOFError once the other side is gone)


def _send(conn: Connection, lock: threading.Lock, message: Any) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)  # before the lock; a failure sends nothing
    with lock:
        conn.send_bytes(data)


# -- the parent's side ------------------------------------------------------------------------------


class _Worker:
    """One worker process; loop-agnostic (replies arrive through a reader thread as
    ``concurrent.futures.Future`` results), so tools built on one event loop work on another."""

    def __init__(self, label: str, init: tuple[Any, ...], on_death: Any = None) -> None:
        self.label = label
        self.init = init
        self.on_death = on_death  # called from the reader thread once the process is gone
        self.live: set[str] = set()  # instances created in this worker
        parent, child = socket.socketpair()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "toolrl.tools.isolation", str(child.fileno())],
            pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL, stdout=sys.__stderr__ or subprocess.DEVNULL,
            env=env,
        )
        child.close()
        self.conn = Connection(parent.detach())
        self.lock = threading.Lock()
        self.pending: dict[int, Future[Any]] = {}
        self.ids = itertools.count()
        self.death: str | None = None  # why the worker is gone, once it is
        self.kill_reason: str | None = None
        self.ready = self.submit("init", init, {})
        threading.Thread(target=self._read, name=f"toolrl-worker-reader:{label}", daemon=True).start()

    @property
    def alive(self) -> bool:
        return self.death is None

    def submit(self, op: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Future[Any]:
        future: Future[Any] = Future()
        if self.death is not None:
            future.set_exception(WorkerUnreachable(self.death))
            return future
        req = next(self.ids)  # 0: the init request, sent first
        future.request_id = req  # type: ignore[attr-defined]
        self.pending[req] = future
        try:
            _send(self.conn, self.lock, ("call", req, op, args, dict(kwargs)))
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            self.pending.pop(req, None)
            future.set_exception(TypeError(f"cannot send the call to the worker process: {exc}"))
        except OSError as exc:  # the worker is gone; the reader reports why
            self.pending.pop(req, None)
            future.set_exception(WorkerUnreachable(f"cannot reach the worker process: {exc}"))
        return future

    def cancel(self, future: Future[Any], grace_s: float) -> None:
        """Cancel a call in the worker; kill the worker if it has not answered ``grace_s`` later."""
        req = getattr(future, "request_id", None)
        if req is None or req not in self.pending or self.death is not None:
            return
        with contextlib.suppress(OSError):
            _send(self.conn, self.lock, ("cancel", req))

        def check() -> None:
            if req in self.pending and self.death is None:
                self.kill(f"a call overran its timeout and had not stopped {grace_s:g} s after cancellation "
                          "(it blocks the worker's event loop, ignores cancellation or runs on in its thread)")

        timer = threading.Timer(grace_s, check)
        timer.daemon = True
        timer.start()

    def kill(self, reason: str) -> None:
        self.kill_reason = self.kill_reason or reason
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()

    def _read(self) -> None:
        with contextlib.suppress(EOFError, OSError, pickle.UnpicklingError):  # the worker is gone
            while True:
                req, ok, value = self.conn.recv()
                future = self.pending.pop(req, None)
                if future is not None and future.set_running_or_notify_cancel():
                    future.set_result(value) if ok else future.set_exception(value)
        code = self.proc.wait()
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        self.death = f"the tool's worker process {how}" + (f": {self.kill_reason}" if self.kill_reason else "")
        self.conn.close()
        if self.on_death is not None:  # first, so callers told of the death find the replacement
            self.on_death(self)
        for future in list(self.pending.values()):
            if future.set_running_or_notify_cancel():
                future.set_exception(WorkerDied(self.death))
        self.pending.clear()


class ProcessTool(Tool):
    """The parent's handle on a tool running in a worker process (``isolation: process``)."""

    kill_grace_s: ClassVar[float] = 1.0
    runs_isolated: ClassVar[bool] = True

    def __init__(self, tool_cls: type[Tool], config: Mapping[str, Any], tool_schema: Mapping[str, Any],
                 worker: _Worker) -> None:
        config = dict(config)
        config.setdefault("timeout", tool_cls.default_timeout)
        super().__init__(config, tool_schema)
        self.tool_cls = tool_cls
        # self._instances (the base class's): instance -> create_kwargs, to create it again after a crash
        self._closed = False
        self._replacing = threading.Lock()
        self.workers_started = 1
        self._worker = worker
        worker.on_death = self._replace
        if not worker.alive:  # it died before we could watch it
            self._replace(worker)

    @classmethod
    async def start(cls, tool_cls: type[Tool], config: Mapping[str, Any], tool_schema: Mapping | None) -> ProcessTool:
        """Start a worker, build the tool there (config errors come back as ToolConfigError) and
        return the handle, with the schema the worker's tool has."""
        if tool_cls.from_config.__func__ is not Tool.from_config.__func__:  # type: ignore[attr-defined]
            raise ToolConfigError(f"config.isolation: process is not supported by {tool_cls.__qualname__}: it "
                                  "builds its tools in from_config")
        if "<locals>" in tool_cls.__qualname__:
            raise ToolConfigError(f"config.isolation: process needs a tool class the worker can import; "
                                  f"{tool_cls.__module__}.{tool_cls.__qualname__} is defined inside a function")
        worker_config = {k: v for k, v in config.items() if k != "isolation"}
        init = (tool_cls.__module__, tool_cls.__qualname__, worker_config, tool_schema)
        worker = _Worker(tool_cls.__qualname__, init)
        try:
            async with asyncio.timeout(START_TIMEOUT_S):
                schema = await asyncio.wrap_future(worker.ready)
        except ToolConfigError:
            worker.kill("its tool did not build")
            raise
        except (asyncio.TimeoutError, WorkerDied) as exc:
            worker.kill("it did not start")
            raise ToolConfigError(f"tool {tool_cls.__qualname__} (isolation: process): the worker did not start: "
                                  f"{exc or 'no answer within ' + format(START_TIMEOUT_S, 'g') + ' s'}") from None
        return cls(tool_cls, config, schema, worker)

    def _replace(self, dead: _Worker) -> None:
        """Start a fresh worker as soon as one dies (from its reader thread), so that the next call
        does not spend its timeout waiting for a new interpreter to start."""
        with self._replacing:
            if not self._closed and self._worker is dead:
                self.workers_started += 1
                self._worker = _Worker(dead.label, dead.init, on_death=self._replace)

    async def _ready_worker(self) -> _Worker:
        worker = self._worker
        if not worker.alive:  # its reader thread has not got round to replacing it yet
            self._replace(worker)
            worker = self._worker
        ready = asyncio.wrap_future(worker.ready)
        ready.add_done_callback(lambda f: f.cancelled() or f.exception())  # retrieved even if nobody waits
        await asyncio.shield(ready)  # shared by every caller: never cancel it
        return worker

    async def _request(self, worker: _Worker, op: str, *args: Any, **kwargs: Any) -> Any:
        future = worker.submit(op, args, kwargs)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            worker.cancel(future, self.kill_grace_s)
            raise

    async def _forward(self, op: str, instance_id: str, *args: Any, retry: type[BaseException] = WorkerUnreachable,
                       **kwargs: Any) -> Any:
        """``op`` on the instance in the current worker, creating the instance there first if the
        worker is new. Tried once more on a fresh worker after a ``retry`` failure: a call that never
        reached the worker always; a lifecycle step that another call's crash took down too, for
        create and calc_reward (never execute: that call may be the one that crashes it)."""
        if instance_id not in self._instances:
            raise KeyError(f"tool {self.name!r} has no instance {instance_id!r}: call create() first")
        for attempt in (1, 2):
            worker = await self._ready_worker()
            try:
                if op != "create" and instance_id not in worker.live:  # a fresh worker: create it again
                    await self._request(worker, "create", instance_id, **self._instances[instance_id])
                    worker.live.add(instance_id)
                value = await self._request(worker, op, instance_id, *args, **kwargs)
                if op == "create":
                    worker.live.add(instance_id)
                return value
            except retry:
                if attempt == 2:
                    raise
                worker.kill("a call could not reach it")
                await self._until_dead(worker)
        raise AssertionError("unreachable")

    @staticmethod
    async def _until_dead(worker: _Worker) -> None:
        for _ in range(500):  # its reader thread notices within milliseconds of the kill
            if not worker.alive:
                return
            await asyncio.sleep(0.01)

    async def call(self, instance_id: str, arguments: Any, **execute_kwargs: Any) -> ToolResult:
        # A replacement worker's start-up is not the call's time: wait for it outside the deadline.
        with contextlib.suppress(Exception):
            async with asyncio.timeout(START_TIMEOUT_S):
                await self._ready_worker()
        return await super().call(instance_id, arguments, **execute_kwargs)

    # -- the lifecycle, forwarded ---------------------------------------------------------------

    async def create(self, instance_id: str | None = None, **create_kwargs: Any) -> str:
        instance_id = await super().create(instance_id, **create_kwargs)
        try:
            worker_id = await self._forward("create", instance_id, retry=WorkerDied, **create_kwargs)
        except BaseException:
            self._instances.pop(instance_id, None)
            raise
        return worker_id

    async def execute(self, instance_id: str, arguments: dict[str, Any], **execute_kwargs: Any) -> Any:
        return await self._forward("execute", instance_id, arguments, **execute_kwargs)

    async def calc_reward(self, instance_id: str, **calc_reward_kwargs: Any) -> Any:
        return await self._forward("calc_reward", instance_id, retry=WorkerDied, **calc_reward_kwargs)

    async def release(self, instance_id: str, **release_kwargs: Any) -> None:
        """Idempotent; an instance whose worker died is already gone, so releasing it is done."""
        self._instances.pop(instance_id, None)
        worker = self._worker
        if instance_id in worker.live and worker.alive:
            worker.live.discard(instance_id)
            with contextlib.suppress(WorkerDied):
                await self._request(worker, "release", instance_id, **release_kwargs)

    async def close(self) -> None:
        self._closed = True
        worker = self._worker
        ready = worker.ready.done() and worker.ready.exception() is None
        if worker.alive and ready:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(5.0):
                    await self._request(worker, "close")
        worker.kill("closed")


# -- the worker's side --------------------------------------------------------------------------------


def _build_tool(module: str, qualname: str, config: Mapping[str, Any],
                tool_schema: Mapping[str, Any] | None) -> tuple[Tool | None, bool, Any]:
    """The ``init`` request: (the tool or None, ok, the reply: its schema, or the error as a ToolConfigError)."""
    try:
        tool = import_reference(f"{module}:{qualname}")(config, tool_schema)
        return tool, True, tool.tool_schema.model_dump(exclude_none=True)
    except ToolConfigError as exc:
        return None, False, ToolConfigError(str(exc))
    except BaseException as exc:
        return None, False, ToolConfigError(f"cannot build {qualname} in the worker process: "
                                            f"{type(exc).__name__}: {exc}")


async def _call_tool(tool: Tool, op: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """One lifecycle method of the worker's tool, ``async def`` or plain (in a thread)."""
    fn = getattr(tool, op)
    if inspect.iscoroutinefunction(fn):
        value = await fn(*args, **kwargs)
    else:
        running = in_thread(fn, args, kwargs)
        try:
            value = await asyncio.shield(running)
        except asyncio.CancelledError:
            # A thread cannot be stopped: answer only once it ends, so the parent kills us if it does not.
            await asyncio.wait({running})
            raise
        if inspect.isawaitable(value):
            value = await value
    if op == "create" and value != args[0]:  # the parent names instances
        raise ToolConfigError(f"with isolation: process, create must use the instance id it is given "
                              f"(returned {value!r} for {args[0]!r})")
    return value


async def _serve(conn: Connection) -> None:
    loop = asyncio.get_running_loop()
    inbox: asyncio.Queue[Any] = asyncio.Queue()
    lock = threading.Lock()
    tasks: dict[int, asyncio.Task[Any]] = {}
    tool: Tool | None = None

    def read() -> None:  # a thread: keeps reading (and seeing the parent go) even while the loop is blocked
        try:
            while True:
                loop.call_soon_threadsafe(inbox.put_nowait, conn.recv())
        except (EOFError, OSError):
            os._exit(0)  # the parent is gone

    def reply(req: int, ok: bool, value: Any) -> None:
        try:
            _send(conn, lock, (req, ok, value))
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            what = "returned a value" if ok else f"raised {type(value).__name__}, which"
            problem = TypeError(f"the tool {what} cannot be sent from its worker process: {exc}")
            _send(conn, lock, (req, False, problem))

    async def run(req: int, op: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        try:
            assert tool is not None
            reply(req, True, await _call_tool(tool, op, args, kwargs))
        except asyncio.CancelledError:
            reply(req, False, asyncio.CancelledError())
        except BaseException as exc:  # everything goes back to the parent as the call's error
            reply(req, False, exc if not isinstance(exc, SystemExit) else RuntimeError(
                f"the tool called sys.exit({exc.code!r})"))
        finally:
            tasks.pop(req, None)

    threading.Thread(target=read, name="toolrl-worker-inbox", daemon=True).start()
    while True:
        message = await inbox.get()
        if message[0] == "cancel":
            if (task := tasks.get(message[1])) is not None:
                task.cancel()
            continue
        _, req, op, args, kwargs = message
        if op == "init":
            tool, ok, value = _build_tool(*args)
            reply(req, ok, value)
            continue
        tasks[req] = loop.create_task(run(req, op, args, kwargs))


def main() -> None:
    asyncio.run(_serve(Connection(int(sys.argv[1]))))


if __name__ == "__main__":
    main()
