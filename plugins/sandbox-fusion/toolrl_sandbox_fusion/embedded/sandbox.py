"""The embedded sandbox: runs a :class:`RunCodeRequest` in a fresh isolated process, no server needed.

Each run takes one pre-started process from the pool, sends it the request, collects stdout, stderr
and fetched files (capped), and enforces the compile and run time limits with a process-group kill.
Results use SandboxFusion's shapes and status rules (a compile step's own ``compile_result``, output
that is not UTF-8 reported as its decode error, ``memory_limit_MB`` -1 for no limit), so the tool and
``toolrl sandbox serve`` treat this and a real SandboxFusion server alike.
"""

from __future__ import annotations

import asyncio
import binascii
import dataclasses
import json
import marshal
import math
import os
import select
import signal
import subprocess
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Literal

from toolrl_sandbox_fusion.embedded import jupyter
from toolrl_sandbox_fusion.embedded.gocache import GoBuildCache
from toolrl_sandbox_fusion.embedded.languages import (
    GO_CACHE,
    JUPYTER_DIR,
    LANGUAGES,
    Program,
    Toolchains,
    base_toolchains,
    discover,
    jupyter_mounts,
)
from toolrl_sandbox_fusion.embedded.launch import (
    Interpreter,
    IsolationMode,
    SandboxLimits,
    build_command,
    choose_mode,
    find_interpreter,
    popen_env,
    sandbox_env,
)
from toolrl_sandbox_fusion.embedded.pool import ProcessPool, SandboxProcess, SandboxStartError
from toolrl_sandbox_fusion.models import (
    CommandRunResult,
    CommandRunStatus,
    RunCodeRequest,
    RunCodeResponse,
    RunJupyterRequest,
    RunJupyterResponse,
    RunStatus,
    overall_status,
)

PoolKind = Literal["python", "commands", "jupyter"]

# Signals the sandbox's own limits send; the tool names the signal itself.
_SIGNAL_NOTES = {
    signal.SIGXCPU: "CPU time limit exceeded",
    signal.SIGXFSZ: "file size limit exceeded",
}
_MAX_SIGNAL = 64
# Address space a run may reserve beyond its memory limit (a JVM's class space and code cache: ~1.3 GB).
ADDRESS_SPACE_HEADROOM_MB = 4096


@dataclass(frozen=True)
class SandboxConfig:
    isolation: Literal["auto", "bwrap", "unshare"] = "auto"
    max_concurrency: int = 8  # runs at once; more wait for a worker thread
    pool_size: int = 4  # processes kept started and waiting (warm); 0: each run starts its own (cold)
    idle_timeout: float = 300.0  # seconds without a run after which a pool keeps one process ready, not pool_size
    # A Python executable or a venv/prefix folder, mounted read-only in the sandbox. Default:
    # /usr/bin/python3, else this interpreter's real path.
    interpreter: str | None = None
    limits: SandboxLimits = field(default_factory=SandboxLimits)
    start_timeout: float = 30.0


class _NotStarted(Exception):
    """The pooled process was gone before it took the request; another one is tried."""


class EmbeddedSandbox:
    """Thread-safe; :meth:`run` blocks, :meth:`arun` runs it on the sandbox's worker threads. The
    pool starts on first use and is rebuilt in a forked child (the parent's processes are not ours)."""

    def __init__(self, config: SandboxConfig | None = None) -> None:
        self.config = config or SandboxConfig()
        self._lock = threading.Lock()
        self._pools: dict[PoolKind, ProcessPool] = {}
        self._executor: ThreadPoolExecutor | None = None
        self._owner_pid = 0
        self._mode: IsolationMode | None = None
        self._interpreter: Interpreter | None = None
        self._toolchains: Toolchains | None = None
        self._go_cache: GoBuildCache | None = None
        self._finalizer = weakref.finalize(self, EmbeddedSandbox._shutdown, [{}, None, None])

    @property
    def interpreter(self) -> Interpreter:
        """Resolved on first use (a configured one is asked for its prefixes); RuntimeError if unusable."""
        if self._interpreter is None:
            self._interpreter = find_interpreter(self.config.interpreter)
        return self._interpreter

    @property
    def toolchains(self) -> Toolchains:
        """This host's toolchains for the languages other than python, found on first use."""
        if self._toolchains is None:
            interpreter = self.interpreter
            self._toolchains = discover(interpreter.version, interpreter.has_pytest)
        return self._toolchains

    @property
    def mode(self) -> IsolationMode:
        if self._mode is None:
            self._mode = choose_mode(self.config.isolation, self.interpreter)
        return self._mode

    # -- lifecycle --------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the python pool now instead of on the first run."""
        self._pool("python").warm()

    def _ensure_started(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._executor is None or self._owner_pid != os.getpid():
                self._pools = {}
                self._executor = ThreadPoolExecutor(self.config.max_concurrency, thread_name_prefix="toolrl-sandbox")
                self._owner_pid = os.getpid()
                self._finalizer.detach()
                self._go_cache = None
                self._finalizer = weakref.finalize(self, EmbeddedSandbox._shutdown, [self._pools, self._executor, None])
            return self._executor

    def _pool_toolchains(self, kind: PoolKind) -> Toolchains:
        """What a pool's sandboxes have mounted: python's only the base (each mount costs start-up
        time, about 1 ms under bubblewrap, and python runs are the hot path); the other languages'
        the toolchains and the pool's Go build cache; jupyter's the kernel's packages when the
        sandbox's Python lacks them. Called with the lock held."""
        if kind == "python":
            return base_toolchains()
        if kind == "jupyter":
            found, why = ([], None) if self.interpreter.has_jupyter else jupyter_mounts(self.interpreter.version)
            if why:
                raise ValueError(f"/run_jupyter cannot run here: {why}")
            base = base_toolchains()
            return dataclasses.replace(base, mounts=base.mounts + tuple(found))
        toolchains = self.toolchains
        if "go" in dict(toolchains.commands):
            self._go_cache = GoBuildCache()
            self._finalizer.detach()
            self._finalizer = weakref.finalize(self, EmbeddedSandbox._shutdown,
                                               [self._pools, self._executor, self._go_cache])
            toolchains = dataclasses.replace(toolchains, mounts=toolchains.mounts + ((self._go_cache.path, GO_CACHE),))
        return toolchains

    def _pool(self, kind: PoolKind) -> ProcessPool:
        """The pool of ``kind``'s sandboxes, started on its first run (see _pool_toolchains)."""
        self._ensure_started()
        with self._lock:
            pool = self._pools.get(kind)
            if pool is None:
                mode, interpreter = self.mode, self.interpreter
                toolchains = self._pool_toolchains(kind)
                limits = self.config.limits

                def spawn() -> SandboxProcess:
                    read_fd, write_fd = os.pipe()
                    try:
                        proc = subprocess.Popen(
                            build_command(mode, interpreter, toolchains, limits, write_fd),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            pass_fds=(write_fd,), env=popen_env(mode, interpreter), cwd="/", start_new_session=True,
                        )
                    except BaseException:
                        os.close(read_fd)
                        raise
                    finally:
                        os.close(write_fd)
                    return SandboxProcess(proc, read_fd)

                pool = self._pools[kind] = ProcessPool(spawn, self.config.pool_size, self.config.start_timeout,
                                                        idle_timeout=self.config.idle_timeout)
            return pool

    @staticmethod
    def _shutdown(parts: list) -> None:
        pools, executor, go_cache = parts
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)
        for pool in list(pools.values()):
            pool.close()
        if go_cache is not None:
            go_cache.close()

    def close(self) -> None:
        with self._lock:
            if self._owner_pid == os.getpid():
                self._finalizer()
            else:
                self._finalizer.detach()
            self._pools, self._executor, self._go_cache = {}, None, None

    def __enter__(self) -> EmbeddedSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- running ----------------------------------------------------------------------------------

    async def arun(self, request: RunCodeRequest) -> RunCodeResponse:
        executor = self._ensure_started()
        return await asyncio.get_running_loop().run_in_executor(executor, self.run, request)

    async def arun_jupyter(self, request: RunJupyterRequest) -> RunJupyterResponse:
        executor = self._ensure_started()
        return await asyncio.get_running_loop().run_in_executor(executor, self.run_jupyter, request)

    def run_jupyter(self, request: RunJupyterRequest) -> RunJupyterResponse:
        """SandboxFusion's /run_jupyter: the cells in one Jupyter kernel inside a sandbox (jupyter.py)."""
        try:
            packages = "" if self.interpreter.has_jupyter else JUPYTER_DIR
        except RuntimeError as exc:  # the interpreter cannot be run
            return RunJupyterResponse(status=RunStatus.SandboxError, message=f"sandbox unavailable: {exc}")
        return jupyter.jupyter_response(self.run(jupyter.driver_request(request, packages), pool="jupyter"))

    def run(self, request: RunCodeRequest, pool: PoolKind | None = None) -> RunCodeResponse:
        """One request; ``pool`` picks the sandboxes it runs in (default: by its language)."""
        program = None  # python runs in the sandbox's interpreter itself
        if request.language != "python":
            try:
                program = self.toolchains.program(request.language, request.code, request.files, request.args,
                                                  self.memory_mb(request))
            except ValueError as exc:
                return RunCodeResponse.sandbox_error(str(exc))
            except RuntimeError as exc:  # the interpreter cannot be run
                return RunCodeResponse.sandbox_error(f"sandbox unavailable: {exc}")
        # Paths are relative to the working folder or absolute in the sandbox's own root, as on a
        # SandboxFusion server; content None means no file (as there). Bad input is the request's
        # fault: a SandboxError, as SandboxFusion reports it, never the program failing.
        files: dict[str, bytes] = {}
        for path, content in request.files.items():
            if not path or "\0" in path:
                return RunCodeResponse.sandbox_error(f"exception on running code: invalid file path {path!r}")
            if content is not None:
                try:
                    files[path] = binascii.a2b_base64(content)
                except (binascii.Error, ValueError) as exc:
                    return RunCodeResponse.sandbox_error(
                        f"exception on running code: file {path!r} is not valid base64: {exc}")
        try:
            pool = self._pool(pool or ("python" if program is None else "commands"))
            if request.language in ("go", "go_test") and self._go_cache is not None:
                # Once per sandbox object, before the first Go run (outside its time limits).
                self._go_cache.warm(dict(self.toolchains.commands)["go"],
                                    {**sandbox_env(self.interpreter), **dict(LANGUAGES["go"].env)})
            for _ in range(3):
                sp = pool.take(self.config.start_timeout)
                try:
                    return self._execute(sp, request, program, files)
                except _NotStarted:
                    continue
                finally:
                    pool.done(sp)
        except (SandboxStartError, RuntimeError) as exc:
            return RunCodeResponse.sandbox_error(f"sandbox unavailable: {exc}")
        except ValueError as exc:  # a pool that cannot be had here (no Jupyter kernel)
            return RunCodeResponse.sandbox_error(str(exc))
        return RunCodeResponse.sandbox_error("sandbox processes kept dying before running the code")

    def memory_mb(self, request: RunCodeRequest) -> int | None:
        """The run's memory limit: the request's (SandboxFusion: -1 or 0 is none), within the cap."""
        cap = self.config.limits.max_memory_mb
        asked = request.memory_limit_MB if request.memory_limit_MB > 0 else None
        return cap if asked is None else asked if cap is None else min(asked, cap)

    def _limits(self, request: RunCodeRequest, timeout: float) -> dict[str, list[int]]:
        lim = self.config.limits
        memory_mb = self.memory_mb(request)
        cpu = max(1, math.ceil(timeout))
        # RLIMIT_DATA counts what a process commits (its private writable mappings: heap, malloc,
        # arrays), not what it only reserves: a JVM reserves more than 1 GB of address space before it
        # runs anything, which a 1 GB RLIMIT_AS (tried before) refused. Shared anonymous mappings escape
        # RLIMIT_DATA, so the address space gets a backstop that every runtime's reservations fit in.
        # Not RLIMIT_STACK, which SandboxFusion sets too: that large, it is every new thread's stack.
        memory = {} if memory_mb is None else {
            "DATA": [memory_mb << 20] * 2, "AS": [(memory_mb + ADDRESS_SPACE_HEADROOM_MB) << 20] * 2}
        return {
            **memory,
            # The wall-clock kill is the limit; the CPU limit backs it up if that kill were missed.
            "CPU": [cpu + 1, cpu + 2],
            "NPROC": [lim.max_processes] * 2,
            "FSIZE": [lim.max_file_mb << 20] * 2,
            "NOFILE": [lim.max_open_files] * 2,
            "CORE": [0, 0],
        }

    def _header(self, request: RunCodeRequest, program: Program | None, files: dict[str, bytes]) -> bytes:
        """The request as the bootstrap reads it: marshal, which it reads without importing anything
        (version 4: Python 3.4+). ``run`` None: python, in the sandbox's interpreter."""
        lim = self.config.limits
        return marshal.dumps({
            "code": program.code if program else request.code, "args": list(request.args), "files": files,
            "fetch_files": list(request.fetch_files), "limits": self._limits(request, request.run_timeout),
            "max_fetch_bytes": lim.max_fetch_bytes, "max_output_bytes": lim.max_output_bytes,
            "source": program and program.source, "run": program and program.run,
            "compile": program and program.compile, "env": program.env if program else {},
            "compile_limits": self._limits(request, request.compile_timeout),
        }, 4)

    def _execute(self, sp: SandboxProcess, request: RunCodeRequest, program: Program | None,
                 files: dict[str, bytes]) -> RunCodeResponse:
        lim = self.config.limits
        header = self._header(request, program, files)
        payload = b"%010d" % len(header) + header + (request.stdin or "").encode()
        proc = sp.proc
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        fds = {"stdout": proc.stdout.fileno(), "stderr": proc.stderr.fileno(), "control": sp.control}
        chunks: dict[str, list[bytes]] = {name: [] for name in fds}
        by_fd = {fd: name for name, fd in fds.items()}
        stdin_fd: int | None = proc.stdin.fileno()
        for fd in [*fds.values(), stdin_fd]:
            os.set_blocking(fd, False)
        poller = select.poll()
        for fd in fds.values():
            poller.register(fd, select.POLLIN)
        poller.register(stdin_fd, select.POLLOUT)
        pidfd = os.pidfd_open(proc.pid)
        poller.register(pidfd, select.POLLIN)
        control = _ControlFrames()

        def read(fd: int) -> bool:
            """Read what is there; False at end of stream."""
            nonlocal output, killed, drain_until, compiled_at, deadline
            data = os.read(fd, 65536)
            if not data:
                poller.unregister(fd)
                del by_fd[fd]
                return False
            name = by_fd[fd]
            if name == "control":
                control.feed(data)
                if control.size > 2 * lim.max_fetch_bytes:
                    poller.unregister(fd)
                    del by_fd[fd]
                if compiling and control.compiled is not None and compiled_at is None:  # the run's limit starts
                    compiled_at = time.monotonic()
                    deadline = compiled_at + request.run_timeout
                return True
            room = lim.max_output_bytes - output
            if room > 0:  # beyond the cap, output is read (so the writer is not stuck) and dropped
                chunks[name].append(data[:room])
            output += len(data)
            if output > lim.max_output_bytes and killed is None:
                sp.kill()
                killed, drain_until = "output", time.monotonic() + 1.0
            return True

        start = time.monotonic()
        compiling = program is not None and program.compile is not None
        deadline = start + (request.compile_timeout if compiling else request.run_timeout)
        compiled_at: float | None = None  # when the compile step reported
        drain_until: float | None = None  # set once the process is gone or killed
        sent = output = 0
        killed: str | None = None
        ended: float | None = None
        try:
            # Until the program reports its exit code (all its output is then in the pipes) or the
            # process is gone and its pipes drained. A program that closes its stdout and keeps
            # running is still running.
            while control.exit_code is None and control.error is None and (
                    by_fd or stdin_fd is not None or ended is None):
                now = time.monotonic()
                if drain_until is None and now >= deadline:
                    sp.kill()
                    killed = "compile_timeout" if compiling and compiled_at is None else "timeout"
                    drain_until = now + 1.0
                if drain_until is not None and now >= drain_until:
                    break  # a process outside our reach still holds a pipe: stop waiting for it
                limit = (drain_until if drain_until is not None else deadline) - now
                for fd, _ in poller.poll(max(1, int(limit * 1000) + 1)):
                    if fd == pidfd:
                        poller.unregister(pidfd)
                        ended = time.monotonic()
                        # Like the end of bubblewrap's PID namespace: nothing outlives the program.
                        sp.kill()
                        drain_until = min(drain_until or math.inf, ended + 0.5)
                    elif fd == stdin_fd:
                        try:
                            sent += os.write(stdin_fd, payload[sent:sent + 65536])
                        except (BrokenPipeError, ConnectionResetError):
                            if sent == 0:
                                raise _NotStarted from None
                            sent = len(payload)  # the program stopped reading its stdin
                        if sent >= len(payload):
                            poller.unregister(stdin_fd)
                            proc.stdin.close()
                            stdin_fd = None
                    elif fd in by_fd:
                        read(fd)
            if control.exit_code is not None:
                ended = time.monotonic()
                for fd in [fd for fd, name in by_fd.items() if name != "control"]:
                    try:
                        while read(fd):
                            pass
                    except BlockingIOError:
                        pass  # drained: the program flushed before it reported
            elif stdin_fd is not None and sent == 0 and proc.poll() is not None:
                raise _NotStarted
        finally:
            os.close(pidfd)
        if control.error is not None:
            return RunCodeResponse.sandbox_error(f"exception on running code: {control.error}")
        returncode = control.exit_code
        if returncode is None:
            sp.kill()
            returncode = proc.wait(timeout=5)
            # The program was killed by a signal: bubblewrap's init and the fallback's report it as
            # 128 + N; SandboxFusion reports -N. (An os._exit(129..192) that skipped the exit-code
            # report reads the same: it cannot be told apart.)
            if 128 < returncode <= 128 + _MAX_SIGNAL:
                returncode = 128 - returncode
        end = ended or time.monotonic()
        files = control.files if request.fetch_files else {}
        if compiling:
            compile_result = _compile_result(control.compiled, killed, returncode, (compiled_at or end) - start, chunks)
            if compile_result.status != CommandRunStatus.Finished or compile_result.return_code != 0:
                detail = (f"compile time limit of {request.compile_timeout:g} s exceeded; the compiler was killed"
                          if killed == "compile_timeout" else "")
                return RunCodeResponse(status=overall_status(None, compile_result), compile_result=compile_result,
                                       detail=detail, files=files)
            response = self._response(request, chunks, files, returncode, killed, end - (compiled_at or start))
            response.compile_result = compile_result
            response.status = overall_status(response.run_result, compile_result)
            return response
        return self._response(request, chunks, files, returncode, killed, end - start)

    def _response(self, request: RunCodeRequest, chunks: dict[str, list[bytes]], files: dict[str, str],
                  returncode: int, killed: str | None, elapsed: float) -> RunCodeResponse:
        lim = self.config.limits
        stdout, stderr = _decode(b"".join(chunks["stdout"])), _decode(b"".join(chunks["stderr"]))
        detail = ""
        if killed == "timeout":
            run = CommandRunResult(status=CommandRunStatus.TimeLimitExceeded, execution_time=elapsed,
                                   return_code=None, stdout=stdout, stderr=stderr)
            detail = f"time limit of {request.run_timeout:g} s exceeded; the process was killed"
        else:
            if killed == "output":
                returncode = -signal.SIGKILL
                detail = f"output limit of {lim.max_output_bytes} bytes exceeded; the process was killed"
            elif returncode < 0 and -returncode in _SIGNAL_NOTES:
                detail = _SIGNAL_NOTES[signal.Signals(-returncode)]
            elif returncode != 0 and "MemoryError" in stderr[-2000:]:
                memory = self.memory_mb(request)
                detail = "out of memory (MemoryError)" if memory is None else (
                    f"memory limit of {memory} MB exceeded (MemoryError)")
            run = CommandRunResult(status=CommandRunStatus.Finished, execution_time=elapsed,
                                   return_code=returncode, stdout=stdout, stderr=stderr)
        return RunCodeResponse(status=overall_status(run), run_result=run, detail=detail, files=files)


def _decode(data: bytes) -> str:
    """Output as SandboxFusion reports it: UTF-8, else the decode error in its place."""
    try:
        return data.decode()
    except UnicodeDecodeError as exc:
        return f"[DecodeError] {exc}"


def _compile_result(report: dict | None, killed: str | None, returncode: int, elapsed: float,
                    chunks: dict[str, list[bytes]]) -> CommandRunResult:
    """The compile step's result: its report, or what stopped the sandbox before it reported."""
    if report is not None:
        return CommandRunResult(status=CommandRunStatus.Finished, execution_time=elapsed,
                                return_code=report["return_code"], stdout=_decode(report["stdout"]),
                                stderr=_decode(report["stderr"]))
    if killed == "compile_timeout":
        return CommandRunResult(status=CommandRunStatus.TimeLimitExceeded, execution_time=elapsed)
    # The sandbox ended before the compiler reported (killed, out of memory): what it printed.
    return CommandRunResult(status=CommandRunStatus.Finished, execution_time=elapsed, return_code=returncode,
                            stdout=_decode(b"".join(chunks["stdout"])), stderr=_decode(b"".join(chunks["stderr"])))


class _ControlFrames:
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
