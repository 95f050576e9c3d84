"""The embedded sandbox: runs a :class:`RunCodeRequest` in a fresh isolated process, no server needed.

Each run takes one pre-started process from the pool (:mod:`.pool`), sends it the request, collects
stdout, stderr and fetched files (capped), and enforces the compile and run time limits with a
process-group kill (:mod:`.exchange`). Results use SandboxFusion's shapes and status rules
(:mod:`.results`; ``memory_limit_MB`` -1 for no limit), so the tool and ``toolrl sandbox serve`` treat
this and a real SandboxFusion server alike.
"""

from __future__ import annotations

import asyncio
import binascii
import dataclasses
import marshal
import math
import os
import subprocess
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Literal

from toolrl_sandbox_fusion.embedded import jupyter, results
from toolrl_sandbox_fusion.embedded.exchange import Exchange, NotStarted
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
    RunCodeRequest,
    RunCodeResponse,
    RunJupyterRequest,
    RunJupyterResponse,
    RunStatus,
)

PoolKind = Literal["python", "commands", "jupyter"]

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
                except NotStarted:
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
        header = self._header(request, program, files)
        compiling = program is not None and program.compile is not None
        exchange = Exchange(sp, b"%010d" % len(header) + header + (request.stdin or "").encode(), self.config.limits,
                            request.compile_timeout if compiling else None, request.run_timeout)
        exchange.run()
        if exchange.control.error is not None:
            return RunCodeResponse.sandbox_error(f"exception on running code: {exchange.control.error}")
        return results.response(request, exchange.captured(), self.memory_mb(request),
                                self.config.limits.max_output_bytes)
