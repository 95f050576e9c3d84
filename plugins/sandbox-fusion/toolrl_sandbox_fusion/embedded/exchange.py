"""One run's exchange with its pooled sandbox process: the request written to its stdin, its stdout and
stderr captured (up to the output cap), the control stream's frames parsed, and the compile and run
time limits and the output cap enforced with a process-group kill.

Everything goes through one ``poll`` over non-blocking pipes and a pidfd, so a program that floods its
output, never reads its stdin or leaves a child holding a pipe cannot stall the sandbox's thread.
"""

from __future__ import annotations

import binascii
import json
import math
import os
import select
import time
from dataclasses import dataclass

from toolrl_sandbox_fusion.embedded.launch import SandboxLimits
from toolrl_sandbox_fusion.embedded.pool import SandboxProcess

_MAX_SIGNAL = 64


class NotStarted(Exception):
    """The pooled process was gone before it took the request; another one is tried."""


@dataclass
class Captured:
    """What a run left for its response."""

    stdout: bytes  # up to the output cap
    stderr: bytes
    compiled: dict | None  # the compile step's report (return_code, stdout, stderr), if it reported
    files: dict[str, str]  # fetched files, base64
    killed: str | None  # what the sandbox killed it for: "compile_timeout", "timeout", "output"
    returncode: int  # the program's reported exit code, else the sandbox's (a signal N as -N)
    compile_s: float | None  # start to the compile step's report (or the end); None: no compile step
    run_s: float  # the compile step's report (or the start) to the end


class Exchange:
    """Sends ``payload`` (the bootstrap's header, then the program's stdin) to ``sp`` and collects what
    comes back; :meth:`run` raises :class:`NotStarted` if the process was gone before it read any."""

    def __init__(self, sp: SandboxProcess, payload: bytes, limits: SandboxLimits, compile_timeout: float | None,
                 run_timeout: float) -> None:
        self.sp, self.payload, self.limits, self.run_timeout = sp, payload, limits, run_timeout
        proc = sp.proc
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        fds = {"stdout": proc.stdout.fileno(), "stderr": proc.stderr.fileno(), "control": sp.control}
        self.chunks: dict[str, list[bytes]] = {name: [] for name in fds}
        self.by_fd = {fd: name for name, fd in fds.items()}  # the streams still read
        self.stdin_fd: int | None = proc.stdin.fileno()  # None once the payload is sent
        for fd in [*fds.values(), self.stdin_fd]:
            os.set_blocking(fd, False)
        self.poller = select.poll()
        for fd in fds.values():
            self.poller.register(fd, select.POLLIN)
        self.poller.register(self.stdin_fd, select.POLLOUT)
        self.control = ControlFrames()
        self.compiling = compile_timeout is not None
        self.start = time.monotonic()
        self.deadline = self.start + (run_timeout if compile_timeout is None else compile_timeout)
        self.compiled_at: float | None = None  # when the compile step reported
        self.drain_until: float | None = None  # set once the process is gone or killed
        self.sent = self.output = 0
        self.killed: str | None = None
        self.ended: float | None = None

    def run(self) -> None:
        """Until the program reports its exit code (all its output is then in the pipes) or the process
        is gone and its pipes drained. A program that closes its stdout and keeps running is still
        running."""
        pidfd = os.pidfd_open(self.sp.proc.pid)
        self.poller.register(pidfd, select.POLLIN)
        try:
            while self.control.exit_code is None and self.control.error is None and (
                    self.by_fd or self.stdin_fd is not None or self.ended is None):
                now = time.monotonic()
                if self.drain_until is None and now >= self.deadline:
                    self.sp.kill()
                    self.killed = "compile_timeout" if self.compiling and self.compiled_at is None else "timeout"
                    self.drain_until = now + 1.0
                if self.drain_until is not None and now >= self.drain_until:
                    break  # a process outside our reach still holds a pipe: stop waiting for it
                limit = (self.drain_until if self.drain_until is not None else self.deadline) - now
                for fd, _ in self.poller.poll(max(1, int(limit * 1000) + 1)):
                    if fd == pidfd:
                        self.poller.unregister(pidfd)
                        self.ended = time.monotonic()
                        # Like the end of bubblewrap's PID namespace: nothing outlives the program.
                        self.sp.kill()
                        self.drain_until = min(self.drain_until or math.inf, self.ended + 0.5)
                    elif fd == self.stdin_fd:
                        self._send()
                    elif fd in self.by_fd:
                        self._read(fd)
            if self.control.exit_code is not None:
                self.ended = time.monotonic()
                for fd in [fd for fd, name in self.by_fd.items() if name != "control"]:
                    try:
                        while self._read(fd):
                            pass
                    except BlockingIOError:
                        pass  # drained: the program flushed before it reported
            elif self.stdin_fd is not None and self.sent == 0 and self.sp.proc.poll() is not None:
                raise NotStarted
        finally:
            os.close(pidfd)

    def _send(self) -> None:
        """Write what the pipe takes of the rest of the payload; close stdin once it is all sent."""
        assert self.stdin_fd is not None and self.sp.proc.stdin is not None
        try:
            self.sent += os.write(self.stdin_fd, self.payload[self.sent:self.sent + 65536])
        except (BrokenPipeError, ConnectionResetError):
            if self.sent == 0:
                raise NotStarted from None
            self.sent = len(self.payload)  # the program stopped reading its stdin
        if self.sent >= len(self.payload):
            self.poller.unregister(self.stdin_fd)
            self.sp.proc.stdin.close()
            self.stdin_fd = None

    def _read(self, fd: int) -> bool:
        """Read what is there; False at end of stream."""
        data = os.read(fd, 65536)
        if not data:
            self.poller.unregister(fd)
            del self.by_fd[fd]
            return False
        name = self.by_fd[fd]
        if name == "control":
            self.control.feed(data)
            if self.control.size > 2 * self.limits.max_fetch_bytes:
                self.poller.unregister(fd)
                del self.by_fd[fd]
            if self.compiling and self.control.compiled is not None and self.compiled_at is None:
                self.compiled_at = time.monotonic()  # the run's limit starts
                self.deadline = self.compiled_at + self.run_timeout
            return True
        room = self.limits.max_output_bytes - self.output
        if room > 0:  # beyond the cap, output is read (so the writer is not stuck) and dropped
            self.chunks[name].append(data[:room])
        self.output += len(data)
        if self.output > self.limits.max_output_bytes and self.killed is None:
            self.sp.kill()
            self.killed, self.drain_until = "output", time.monotonic() + 1.0
        return True

    def captured(self) -> Captured:
        """What the run left (after :meth:`run`, when the control stream reported no error)."""
        returncode = self.control.exit_code
        if returncode is None:
            self.sp.kill()
            returncode = self.sp.proc.wait(timeout=5)
            # The program was killed by a signal: bubblewrap's init and the fallback's report it as
            # 128 + N; SandboxFusion reports -N. (An os._exit(129..192) that skipped the exit-code
            # report reads the same: it cannot be told apart.)
            if 128 < returncode <= 128 + _MAX_SIGNAL:
                returncode = 128 - returncode
        end = self.ended or time.monotonic()
        return Captured(
            stdout=b"".join(self.chunks["stdout"]), stderr=b"".join(self.chunks["stderr"]),
            compiled=self.control.compiled, files=self.control.files, killed=self.killed, returncode=returncode,
            compile_s=(self.compiled_at or end) - self.start if self.compiling else None,
            run_s=end - (self.compiled_at or self.start))


class ControlFrames:
    """Parses the control stream after the ready byte: "E" the request's files could not be written,
    "C" a compile step's result (JSON), "F" fetched files (JSON), "X" the exit code. A python program
    could write here too (not before its files are written, so not an "E"; commands never get the
    fd); malformed frames end the parsing, never the launcher."""

    def __init__(self) -> None:
        self.buffer = b""
        self.size = 0
        self.files: dict[str, str] = {}
        self.compiled: dict | None = None
        self.exit_code: int | None = None
        self.error: str | None = None
        self._broken = False

    def feed(self, data: bytes) -> None:
        self.size += len(data)
        if self._broken:
            return
        self.buffer += data
        while len(self.buffer) >= 11:
            kind, length = self.buffer[:1], self.buffer[1:11]
            if not length.isdigit():
                self._broken = True
                return
            end = 11 + int(length)
            if len(self.buffer) < end:
                return
            body, self.buffer = self.buffer[11:end], self.buffer[end:]
            try:
                if kind == b"F":
                    found = json.loads(body)
                    self.files = {k: v for k, v in found.items() if isinstance(k, str) and isinstance(v, str)}
                elif kind == b"X":
                    self.exit_code = int(body)
                elif kind == b"C" and self.compiled is None:
                    report = json.loads(body)
                    self.compiled = {"return_code": int(report["return_code"]),
                                     **{k: binascii.a2b_base64(report[k]) for k in ("stdout", "stderr")}}
                elif kind == b"E" and self.exit_code is None:
                    self.error = body.decode(errors="replace")
            except (ValueError, AttributeError, KeyError, TypeError, binascii.Error):
                self._broken = True
                return
