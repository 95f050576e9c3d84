"""SandboxFusion's ``/run_code`` request and response, field for field.

Both backends speak these shapes: the HTTP client sends and parses them, the embedded sandbox
returns them, and ``toolrl sandbox serve`` serves them, so a client written for SandboxFusion works
against any of the three.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Literal, get_args

from pydantic import BaseModel, Field

# SandboxFusion's language literal (sandbox/runners/types.py); the embedded sandbox runs those in
# embedded/languages.py whose toolchain the host has.
Language = Literal[
    "python", "cpp", "nodejs", "go", "go_test", "java", "php", "csharp", "bash", "typescript", "sql",
    "rust", "cuda", "lua", "R", "perl", "D_ut", "ruby", "scala", "julia", "pytest", "junit",
    "kotlin_script", "jest", "verilog", "python_gpu", "lean", "swift", "racket",
]
LANGUAGES: tuple[str, ...] = get_args(Language)


class RunStatus(str, Enum):
    Success = "Success"  # every command finished with return code 0
    Failed = "Failed"  # a non-zero return code or a time limit
    SandboxError = "SandboxError"  # the sandbox itself failed; the code may not have run


class CommandRunStatus(str, Enum):
    Finished = "Finished"
    Error = "Error"
    TimeLimitExceeded = "TimeLimitExceeded"


class CommandRunResult(BaseModel):
    status: CommandRunStatus
    execution_time: float | None = None
    return_code: int | None = None
    stdout: str | None = None
    stderr: str | None = None


# A request that names no memory limit gets this one (SandboxFusion's default is none): one runaway
# program among thousands of RL rollouts must not take the host's memory. -1 (or 0), asked for, is none.
DEFAULT_MEMORY_LIMIT_MB = 1024


class RunCodeRequest(BaseModel):
    compile_timeout: float = Field(10, description="compile timeout for compiled languages (s)")
    run_timeout: float = Field(10, description="run timeout (s)")
    memory_limit_MB: int = Field(DEFAULT_MEMORY_LIMIT_MB, description="memory limit in MB; -1 (or 0) for none")
    code: str
    stdin: str | None = None
    language: Language
    files: dict[str, str | None] = Field(default_factory=dict, description="path -> base64 content")
    fetch_files: list[str] = Field(default_factory=list, description="paths to return after the run")
    args: list[str] = Field(default_factory=list, description="extra command-line arguments")


class RunCodeResponse(BaseModel):
    status: RunStatus
    message: str = ""  # as SandboxFusion: set only for a SandboxError
    compile_result: CommandRunResult | None = None
    run_result: CommandRunResult | None = None
    executor_pod_name: str | None = None
    files: dict[str, str] = Field(default_factory=dict)
    # Not on the wire: why the embedded sandbox stopped the run (time, memory, output limit, a
    # signal), for the text the model reads. Empty from an HTTP server.
    detail: str = Field("", exclude=True)

    @classmethod
    def sandbox_error(cls, message: str) -> RunCodeResponse:
        return cls(status=RunStatus.SandboxError, message=message)


def overall_status(run: CommandRunResult | None, compile_: CommandRunResult | None = None) -> RunStatus:
    """SandboxFusion's rule: any Error -> SandboxError; else a time limit or non-zero code -> Failed."""
    results = [r for r in (compile_, run) if r is not None]
    if any(r.status == CommandRunStatus.Error for r in results):
        return RunStatus.SandboxError
    if any(r.status == CommandRunStatus.TimeLimitExceeded for r in results):
        return RunStatus.Failed
    if any(r.return_code not in (None, 0) for r in results):
        return RunStatus.Failed
    return RunStatus.Success


class RunJupyterRequest(BaseModel):
    """SandboxFusion's ``/run_jupyter`` request: cells run in order in one kernel, sharing its state."""

    cells: list[str] = Field(..., description="code cells, run in order in one kernel")
    cell_timeout: float = Field(0, description="most run time of each cell (s); 0: only the total limit")
    total_timeout: float = Field(45, description="most run time of all the cells (s)")
    memory_limit_MB: int = Field(DEFAULT_MEMORY_LIMIT_MB, description="memory limit in MB; -1 (or 0) for none")
    kernel: Literal["python3"] = "python3"
    files: dict[str, str] = Field(default_factory=dict, description="path -> base64 content")
    fetch_files: list[str] = Field(default_factory=list, description="paths to return after the run")


class CellRunResult(BaseModel):
    stdout: str
    stderr: str
    display: list[dict[str, Any]]  # each display_data / execute_result's data, by MIME type
    error: list[dict[str, Any]]  # each error's content: ename, evalue, traceback


class RunJupyterResponse(BaseModel):
    status: RunStatus
    message: str = ""
    driver: CommandRunResult | None = None  # the process that ran the kernel
    cells: list[CellRunResult] = Field(default_factory=list)
    executor_pod_name: str | None = None
    files: dict[str, str] = Field(default_factory=dict)
