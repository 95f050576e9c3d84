"""What a run captured, as SandboxFusion reports it: a compile step's own ``compile_result`` (and no run
when it failed), output that is not UTF-8 reported as its decode error, the limit that stopped a
program named in ``detail``."""

from __future__ import annotations

import signal

from toolrl_sandbox_fusion.embedded.exchange import Captured
from toolrl_sandbox_fusion.models import (
    CommandRunResult,
    CommandRunStatus,
    RunCodeRequest,
    RunCodeResponse,
    overall_status,
)

# Signals the sandbox's own limits send; the tool names the signal itself.
_SIGNAL_NOTES = {
    signal.SIGXCPU: "CPU time limit exceeded",
    signal.SIGXFSZ: "file size limit exceeded",
}


def response(request: RunCodeRequest, run: Captured, memory_mb: int | None, max_output_bytes: int) -> RunCodeResponse:
    """The response to ``request`` (whose memory limit was ``memory_mb``, its output cap ``max_output_bytes``)."""
    files = run.files if request.fetch_files else {}
    if run.compile_s is None:
        return _run_response(request, run, files, memory_mb, max_output_bytes)
    compile_result = _compile_result(run, run.compile_s)
    if compile_result.status != CommandRunStatus.Finished or compile_result.return_code != 0:
        detail = (f"compile time limit of {request.compile_timeout:g} s exceeded; the compiler was killed"
                  if run.killed == "compile_timeout" else "")
        return RunCodeResponse(status=overall_status(None, compile_result), compile_result=compile_result,
                               detail=detail, files=files)
    out = _run_response(request, run, files, memory_mb, max_output_bytes)
    out.compile_result = compile_result
    out.status = overall_status(out.run_result, compile_result)
    return out


def _run_response(request: RunCodeRequest, run: Captured, files: dict[str, str], memory_mb: int | None,
                  max_output_bytes: int) -> RunCodeResponse:
    stdout, stderr = _decode(run.stdout), _decode(run.stderr)
    returncode, detail = run.returncode, ""
    if run.killed == "timeout":
        result = CommandRunResult(status=CommandRunStatus.TimeLimitExceeded, execution_time=run.run_s,
                                  return_code=None, stdout=stdout, stderr=stderr)
        detail = f"time limit of {request.run_timeout:g} s exceeded; the process was killed"
    else:
        if run.killed == "output":
            returncode = -signal.SIGKILL
            detail = f"output limit of {max_output_bytes} bytes exceeded; the process was killed"
        elif returncode < 0 and -returncode in _SIGNAL_NOTES:
            detail = _SIGNAL_NOTES[signal.Signals(-returncode)]
        elif returncode != 0 and "MemoryError" in stderr[-2000:]:
            detail = "out of memory (MemoryError)" if memory_mb is None else (
                f"memory limit of {memory_mb} MB exceeded (MemoryError)")
        result = CommandRunResult(status=CommandRunStatus.Finished, execution_time=run.run_s,
                                  return_code=returncode, stdout=stdout, stderr=stderr)
    return RunCodeResponse(status=overall_status(result), run_result=result, detail=detail, files=files)


def _decode(data: bytes) -> str:
    """Output as SandboxFusion reports it: UTF-8, else the decode error in its place."""
    try:
        return data.decode()
    except UnicodeDecodeError as exc:
        return f"[DecodeError] {exc}"


def _compile_result(run: Captured, elapsed: float) -> CommandRunResult:
    """The compile step's result: its report, or what stopped the sandbox before it reported."""
    if run.compiled is not None:
        return CommandRunResult(status=CommandRunStatus.Finished, execution_time=elapsed,
                                return_code=run.compiled["return_code"], stdout=_decode(run.compiled["stdout"]),
                                stderr=_decode(run.compiled["stderr"]))
    if run.killed == "compile_timeout":
        return CommandRunResult(status=CommandRunStatus.TimeLimitExceeded, execution_time=elapsed)
    # The sandbox ended before the compiler reported (killed, out of memory): what it printed.
    return CommandRunResult(status=CommandRunStatus.Finished, execution_time=elapsed, return_code=run.returncode,
                            stdout=_decode(run.stdout), stderr=_decode(run.stderr))
