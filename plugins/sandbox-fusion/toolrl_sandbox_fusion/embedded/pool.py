"""A pool of pre-started sandbox processes (warm workers), each used for exactly one run and then discarded.

Interpreter and namespace start-up (~15-20 ms) happens here, in the background, so a run only pays
for sending its code and the program itself (``benchmarks/env_load.py --warm-pool``: cold vs warm).
Processes are never reused: every run gets a process that no other code has touched, so nothing one
trajectory's code did (files, globals, children) can reach another's. A ready worker that dies while
it waits (killed, out of memory) is dropped and replaced, at the latest when a run would take it; a
pool unused for ``idle_timeout`` seconds shrinks back to one ready worker (idle reaping). Size 0 keeps
none ready: each run starts its own (cold). One long-lived thread starts every process, because
bubblewrap's ``--die-with-parent`` fires when the *thread* that started it exits.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import queue
import select
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)


class SandboxStartError(RuntimeError):
    """Sandbox processes cannot be started (the message says why: bwrap error, missing binary...)."""


@dataclass
class SandboxProcess:
    proc: subprocess.Popen[bytes]
    control: int  # read end of the control pipe: the ready byte, then fetched files
    started: float = field(default_factory=time.monotonic)

    def kill(self) -> None:
        """SIGKILL the whole process group. Under bubblewrap that takes the PID namespace down too:
        its init dies with bwrap (--die-with-parent) and the kernel kills every process inside.
        Never after the leader was reaped: its pid (the group id) could then belong to another."""
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)

    def discard(self) -> None:
        self.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        with contextlib.suppress(OSError):
            os.close(self.control)


def _stderr_of(sp: SandboxProcess) -> str:
    assert sp.proc.stderr is not None
    os.set_blocking(sp.proc.stderr.fileno(), False)
    try:
        data = sp.proc.stderr.read(8192) or b""
    except OSError:
        data = b""
    return data.decode(errors="replace").strip()


class ProcessPool:
    """``take`` hands out a ready process; ``done`` says its run finished.

    Starting a process costs more CPU than a short run, so refills wait for a quiet moment (no run
    active and none finished within ``refill_delay``) as long as at least half the pool is ready or
    starting; below that, or while a ``take`` waits with none ready, they start at once. Until the
    first ``take`` (or ``warm``) only one process is kept, so a one-off use (``toolrl tool call``)
    starts one sandbox, not a pool; after ``idle_timeout`` s with no run, again one."""

    def __init__(self, spawn: Callable[[], SandboxProcess], size: int, start_timeout: float = 30.0,
                 refill_delay: float = 0.05, idle_timeout: float = 300.0) -> None:
        self._spawn = spawn
        self.size = max(0, size)
        self._target = min(1, self.size)
        self.start_timeout = start_timeout
        self.refill_delay = refill_delay
        self.idle_timeout = idle_timeout
        self._waiting = 0  # takes waiting for a ready process
        self.replaced = 0  # ready processes found dead and replaced
        self.reaped = 0  # ready processes ended by idle reaping
        self._active = 0
        self._last_activity = 0.0
        self._ready: deque[SandboxProcess] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._error: str | None = None
        self._failures = 0
        self._retry_at = 0.0
        self._wake_r, self._wake_w = os.pipe()
        self._retired: queue.SimpleQueue[SandboxProcess | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name="toolrl-sandbox-pool", daemon=True)
        self._thread.start()
        self._reaper = threading.Thread(target=self._reap, name="toolrl-sandbox-reaper", daemon=True)
        self._reaper.start()

    # -- consumer side ----------------------------------------------------------------------------

    def take(self, timeout: float) -> SandboxProcess:
        """The next ready process; raises SandboxStartError when none can be started."""
        deadline = time.monotonic() + timeout
        dead: list[SandboxProcess] = []
        with self._cond:
            self._target = self.size
            self._last_activity = time.monotonic()
            while True:
                while self._ready and self._ready[0].proc.poll() is not None:  # died while it waited
                    dead.append(self._ready.popleft())
                    self.replaced += 1
                if self._ready:
                    break
                if self._closed:
                    raise SandboxStartError("the sandbox pool is closed")
                if self._failures >= 3 and self._error:
                    raise SandboxStartError(self._error)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise SandboxStartError(f"no sandbox process became ready within {timeout:g} s")
                self._waiting += 1
                self._wake()  # none ready: the starter thread starts one now, quiet moment or not
                try:
                    self._cond.wait(remaining)
                finally:
                    self._waiting -= 1
            sp = self._ready.popleft()
            self._active += 1
            self._last_activity = time.monotonic()
        self._wake()
        for sp_dead in dead:
            self._retired.put(sp_dead)
        return sp

    def warm(self) -> None:
        """Fill the whole pool now (idle reaping counts from now)."""
        with self._cond:
            self._target = self.size
            self._last_activity = time.monotonic()
        self._wake()

    def done(self, sp: SandboxProcess) -> None:
        """The run on ``sp`` is over: kill what is left of it now, reap it in the background (the
        kernel's namespace teardown takes milliseconds the caller need not wait for)."""
        sp.kill()
        self._retired.put(sp)
        with self._cond:
            self._active -= 1
            self._last_activity = time.monotonic()
        self._wake()

    def _reap(self) -> None:
        while (sp := self._retired.get()) is not None:
            sp.discard()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            ready, self._ready = list(self._ready), deque()
            self._cond.notify_all()
        self._wake()
        self._thread.join(timeout=10)
        self._retired.put(None)
        self._reaper.join(timeout=30)
        for sp in ready:
            sp.discard()
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")

    # -- the starter thread -----------------------------------------------------------------------

    def _fail(self, message: str) -> None:
        with self._cond:
            self._failures += 1
            self._error = message
            # Back off 0.2, 0.4, ... 5 s while starts keep failing.
            self._retry_at = time.monotonic() + min(5.0, 0.1 * 2 ** min(self._failures, 6))
            self._cond.notify_all()
        logger.warning("code sandbox failed to start: %s", message)

    def _check_ready(self, now: float) -> None:
        """With the lock held: drop ready processes that died while they waited (their replacements
        start in this round), and after ``idle_timeout`` s without a run, all but one (idle reaping)."""
        for sp in [sp for sp in self._ready if sp.proc.poll() is not None]:
            self._ready.remove(sp)
            self._retired.put(sp)
            self.replaced += 1
        idle = not self._active and not self._waiting and now - self._last_activity > self.idle_timeout
        if idle and self._target > min(1, self.size):
            self._target = min(1, self.size)
        while idle and len(self._ready) > self._target:
            self._retired.put(self._ready.popleft())
            self.reaped += 1

    def _loop(self) -> None:
        poller = select.poll()
        poller.register(self._wake_r, select.POLLIN)
        starting: dict[int, SandboxProcess] = {}
        try:
            while True:
                with self._cond:
                    if self._closed:
                        return
                    now = time.monotonic()
                    self._check_ready(now)
                    have = len(self._ready) + len(starting)
                    missing = max(self._target - have, self._waiting - have)
                    retry_at = self._retry_at
                    if self._waiting <= have and 2 * have >= self._target:
                        # Busy: wait for the next done() (it wakes us) or a quiet moment.
                        quiet_at = self._last_activity + self.refill_delay
                        retry_at = max(retry_at, math.inf if self._active else quiet_at)
                now = time.monotonic()
                if missing > 0 and now >= retry_at:
                    for _ in range(missing):
                        try:
                            sp = self._spawn()
                        except Exception as exc:  # OSError, a missing setpriv...: report, back off
                            self._fail(f"{type(exc).__name__}: {exc}")
                            break
                        starting[sp.control] = sp
                        poller.register(sp.control, select.POLLIN)
                wait_ms = 1000
                if missing > 0 and now < retry_at:
                    wait_ms = int(min(1.0, retry_at - now) * 1000) + 1
                for fd, _ in poller.poll(wait_ms):
                    if fd == self._wake_r:
                        os.read(self._wake_r, 4096)
                        continue
                    sp = starting.pop(fd)
                    poller.unregister(fd)
                    try:
                        ready = os.read(fd, 1) == b"R"
                    except OSError:
                        ready = False
                    if ready:
                        with self._cond:
                            self._ready.append(sp)
                            self._failures, self._error = 0, None
                            self._cond.notify()
                    else:
                        sp.kill()
                        try:
                            code = sp.proc.wait(timeout=5)
                        except subprocess.TimeoutExpired:
                            code = None
                        self._fail(f"sandbox process exited during start-up (code {code}): {_stderr_of(sp) or 'no output'}")
                        sp.discard()
                for fd, sp in list(starting.items()):
                    if time.monotonic() - sp.started > self.start_timeout:
                        del starting[fd]
                        poller.unregister(fd)
                        self._fail(f"sandbox process not ready after {self.start_timeout:g} s: {_stderr_of(sp)}")
                        sp.discard()
        finally:
            for sp in starting.values():
                sp.discard()
