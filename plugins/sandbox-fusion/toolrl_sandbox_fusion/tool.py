"""The ``code_interpreter`` tool: runs model-written code and shows the model what happened.

Backends: a SandboxFusion server over HTTP when ``sandbox_fusion_url`` is set, else the embedded
sandbox in this process. Calls pass a rate limiter first (in-flight cap plus optional calls per
second; per process, or cluster-wide through Ray). Replaces verl's ``SandboxFusionTool`` (alias
``verl.tools.sandbox_fusion_tools.SandboxFusionTool``) with the same config keys; unlike it, the
response always shows stdout and stderr and names timeouts, memory kills and sandbox failures.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from toolrl.schemas import ToolResponse
from toolrl.tools import Tool
from toolrl.tools.ratelimit import RateLimiter, make_rate_limiter

from toolrl_sandbox_fusion.client import SandboxFusionClient
from toolrl_sandbox_fusion.embedded import EmbeddedSandbox, SandboxConfig
from toolrl_sandbox_fusion.models import (
    LANGUAGES,
    CommandRunStatus,
    Language,
    RunCodeRequest,
    RunCodeResponse,
    RunStatus,
)

# Each of stdout and stderr is cut to this many characters (head and tail kept) in the response.
MAX_STREAM_CHARS = 8000


class CodeInterpreterConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sandbox_fusion_url: str | None = Field(
        None, description="SandboxFusion server (base URL or .../run_code); unset: the embedded sandbox")
    rate_limit: int | None = Field(10, ge=1, description="most calls in flight; null for no cap")
    calls_per_second: float | None = Field(None, gt=0, description="most calls started per second")
    default_timeout: float = Field(30.0, gt=0, le=3600, description="run time limit (s), also the most a call may ask for")
    memory_limit_mb: int = Field(1024, description="memory limit per run (MB); -1 for none (as SandboxFusion)")
    default_language: Language = "python"
    num_workers: int = Field(10, ge=1, le=256, description="concurrent runs of the embedded sandbox / HTTP connections")
    queue_timeout_s: float = Field(
        30.0, gt=0, description="HTTP backend: the longest a call waits for one of the server's num_workers "
                                "connections (then an infrastructure error)")
    enable_global_rate_limit: bool = Field(
        False, description="share the limits across a Ray cluster (a named actor) instead of per process")
    python_executable: str | None = Field(
        None, description="embedded sandbox: the Python to run (an executable, or a venv/prefix folder), "
                          "mounted read-only inside; default the system /usr/bin/python3")
    # Not `isolation`: that key is the core's, for every tool (none | process).
    sandbox_isolation: Literal["auto", "bwrap", "unshare"] = Field(
        "auto", description="embedded sandbox: bubblewrap when usable (auto), or the unshare fallback")

    @field_validator("python_executable")
    @classmethod
    def _python_exists(cls, value: str | None) -> str | None:
        if value is not None and not os.path.exists(os.path.expanduser(value)):
            raise ValueError(f"no such file or folder: {value}")
        return value

    @model_validator(mode="after")
    def _embedded_only(self) -> CodeInterpreterConfig:
        if self.sandbox_fusion_url and (self.python_executable or self.sandbox_isolation != "auto"):
            raise ValueError("python_executable and sandbox_isolation configure the embedded sandbox; the server at "
                             "sandbox_fusion_url runs code its own way")
        return self


def _clip(text: str, limit: int = MAX_STREAM_CHARS) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n... [{len(text) - 2 * half} characters omitted] ...\n{text[-half:]}"


def outcome(response: RunCodeResponse) -> str:
    """One word for metrics: success, error (non-zero exit), timeout, memory, output_limit, sandbox_error."""
    run = response.run_result or response.compile_result
    if response.status == RunStatus.SandboxError or run is None:
        return "sandbox_error"
    if run.status == CommandRunStatus.TimeLimitExceeded or response.detail.startswith("time limit"):
        return "timeout"
    if response.detail.startswith("memory limit") or (
            run.return_code not in (None, 0) and "MemoryError" in (run.stderr or "")):
        return "memory"
    if response.detail.startswith("output limit"):
        return "output_limit"
    return "success" if response.status == RunStatus.Success else "error"


def render(response: RunCodeResponse, timeout: float, memory_mb: int) -> str:
    """The text the model reads. Plain stdout on a clean run; otherwise a verdict line first."""
    kind = outcome(response)
    if kind == "sandbox_error":
        return f"Sandbox error: the code could not be run. {response.message or 'No details.'}".strip()
    compile_ = response.compile_result
    if compile_ is not None and compile_.return_code not in (None, 0):
        return f"Compilation failed (exit code {compile_.return_code}).\n{_clip(compile_.stderr or compile_.stdout or '')}"
    run = response.run_result or compile_
    assert run is not None
    stdout, stderr = run.stdout or "", run.stderr or ""
    if kind == "success" and not stderr:
        return _clip(stdout.rstrip("\n")) if stdout.strip() else "(no output)"
    verdict = {
        "timeout": f"Error: time limit exceeded: the code ran longer than {timeout:g} s and was stopped.",
        "memory": f"Error: memory limit exceeded ({memory_mb} MB): the code ran out of memory." if memory_mb > 0
                  else "Error: out of memory: the code ran out of memory.",
        "output_limit": "Error: output limit exceeded: the code printed too much and was stopped.",
        "error": _exit_text(run.return_code),
        "success": "",
    }[kind]
    note = response.detail if kind == "error" else ""
    parts = [p for p in (verdict, f"({note})" if note else "") if p]
    parts.append(f"stdout:\n{_clip(stdout.rstrip(chr(10)))}" if stdout else "stdout: (empty)")
    if stderr:
        parts.append(f"stderr:\n{_clip(stderr.rstrip(chr(10)))}")
    return "\n".join(parts)


def _exit_text(code: int | None) -> str:
    if code is not None and code < 0:  # SandboxFusion's -N: killed by signal N
        try:
            name = f" ({signal.Signals(-code).name})"
        except ValueError:
            name = ""
        return f"Error: the code was killed by signal {-code}{name}."
    return f"Error: the code exited with code {code}."


class CodeInterpreterTool(Tool):
    name = "code_interpreter"
    config_model = CodeInterpreterConfig
    schema: ClassVar[dict[str, Any]] = {
        "type": "function",
        "function": {
            "name": "code_interpreter",
            "description": "Run code (Python by default) in a sandbox and return what it prints: stdout, "
                           "and stderr if any. Use print() to see values.",
            "parameters": {
                "type": "object",
                "properties": {
                    "code": {"type": "string", "description": "The code to execute."},
                    "language": {"type": "string", "description": "Programming language (default python)."},
                    "timeout": {"type": "number", "exclusiveMinimum": 0,
                                "description": "Time limit in seconds (capped by the tool's limit)."},
                },
                "required": ["code"],
            },
        },
    }

    def __init__(self, config: dict[str, Any] | None = None, tool_schema: Any = None) -> None:
        super().__init__(config, tool_schema)
        cfg: CodeInterpreterConfig = self.config
        if "timeout" not in (config or {}):
            # The whole call (queueing, retries) must outlast the run limit, or the generic call
            # timeout would hide the sandbox's own time-limit report.
            self.timeout = 2 * cfg.default_timeout + 60
        self.backend_name = "http" if cfg.sandbox_fusion_url else "embedded"
        self._client = (SandboxFusionClient(cfg.sandbox_fusion_url, max_connections=cfg.num_workers,
                                           queue_timeout_s=cfg.queue_timeout_s)
                        if cfg.sandbox_fusion_url else None)
        self._sandbox = (None if cfg.sandbox_fusion_url else
                         EmbeddedSandbox(SandboxConfig(isolation=cfg.sandbox_isolation, max_concurrency=cfg.num_workers,
                                                       pool_size=min(cfg.num_workers, 8),
                                                       interpreter=cfg.python_executable)))
        self._limiter: RateLimiter | None = None

    @property
    def limiter(self) -> RateLimiter:
        if self._limiter is None:  # built on first use: a global one needs Ray connected by then
            cfg: CodeInterpreterConfig = self.config
            self._limiter = make_rate_limiter(
                cfg.rate_limit, cfg.calls_per_second,
                global_name=f"{self.name}:{cfg.sandbox_fusion_url or 'embedded'}" if cfg.enable_global_rate_limit else None,
                lease_timeout_s=2 * cfg.default_timeout + 60 if cfg.enable_global_rate_limit else None,
            )
        return self._limiter

    async def execute(self, instance_id: str, arguments: dict[str, Any], **execute_kwargs: Any
                      ) -> tuple[ToolResponse, float, dict[str, Any]]:
        self.state(instance_id)  # a released or unknown instance is an error, as for every tool
        cfg: CodeInterpreterConfig = self.config
        language = arguments.get("language") or cfg.default_language
        timeout = min(float(arguments.get("timeout") or cfg.default_timeout), cfg.default_timeout)
        metrics: dict[str, Any] = {"backend": self.backend_name, "language": language}
        if language not in LANGUAGES:
            metrics.update(status="invalid_language", latency_s=0.0, queue_wait_s=0.0)
            return (ToolResponse.error(f"Error: unknown language {language!r}; use one of: {', '.join(LANGUAGES)}"),
                    0.0, metrics)
        request = RunCodeRequest(code=arguments["code"], language=language, run_timeout=timeout,
                                 compile_timeout=timeout, memory_limit_MB=cfg.memory_limit_mb)
        start = time.perf_counter()
        attempts = 1
        async with self.limiter.slot() as admission:
            admitted = time.perf_counter()
            # A server out of reach raises SandboxRequestError (an InfrastructureError): the call's status is
            # infra_error and the trajectory ends, untrained, rather than show the model a failure not its own.
            if self._client is not None:
                response, attempts = await self._client.run_code(request)
            else:
                assert self._sandbox is not None
                response = await self._sandbox.arun(request)
        run = response.run_result
        kind = outcome(response)
        metrics.update(
            status=kind,
            sandbox_status=response.status.value,
            run_status=run.status.value if run else None,
            return_code=run.return_code if run else None,
            execution_time_s=run.execution_time if run else None,
            queue_wait_s=admission.wait_s,
            latency_s=time.perf_counter() - start,
            run_latency_s=time.perf_counter() - admitted,
            attempts=attempts,
        )
        text = render(response, timeout, cfg.memory_limit_mb)
        return ToolResponse(text=text, is_error=kind != "success"), 0.0, metrics

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
        if self._sandbox is not None:
            self._sandbox.close()
