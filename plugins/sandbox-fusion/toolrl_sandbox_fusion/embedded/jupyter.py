"""``/run_jupyter`` on the embedded sandbox: a request becomes one sandboxed python run of the driver
(``jupyter_driver.py``), which starts a real kernel inside the sandbox and runs the cells in it; the
run's limits, files and isolation are every run's. Shapes and status rules are SandboxFusion's: the
driver's own result as ``driver``; ``Success`` with the cells when they all ran, ``Failed`` when the
driver did not finish them (a cell or the total time limit: the cells run so far, the last one cut
short, are still returned), ``SandboxError`` when no kernel can be had here."""

from __future__ import annotations

import base64
import json
from pathlib import Path

from toolrl_sandbox_fusion.models import (
    CellRunResult,
    CommandRunStatus,
    RunCodeRequest,
    RunCodeResponse,
    RunJupyterRequest,
    RunJupyterResponse,
    RunStatus,
)

DRIVER = Path(__file__).with_name("jupyter_driver.py").read_text()
OUTPUT = "/run/toolrl/jupyter-cells.json"  # where the driver writes the cells; fetched, never returned
DRIVER_GRACE_S = 10.0  # the driver's time beyond the cells' (kernel start and shutdown), as SandboxFusion's


def driver_request(request: RunJupyterRequest, packages: str) -> RunCodeRequest:
    """The python run that drives the kernel; ``packages``: where jupyter_client and ipykernel are
    mounted, or "" when the sandbox's Python has them."""
    config = {"kernel": request.kernel, "cells": request.cells, "cell_timeout": request.cell_timeout,
              "total_timeout": request.total_timeout, "output": OUTPUT, "packages": packages}
    return RunCodeRequest(
        language="python", code=f"{DRIVER}\n_main({json.dumps(config)!r})\n", files=dict(request.files),
        fetch_files=[*request.fetch_files, OUTPUT], run_timeout=request.total_timeout + DRIVER_GRACE_S,
        memory_limit_MB=request.memory_limit_MB)


def jupyter_response(run: RunCodeResponse) -> RunJupyterResponse:
    if run.status == RunStatus.SandboxError:
        return RunJupyterResponse(status=RunStatus.SandboxError, message=run.message)
    files = dict(run.files)
    output = files.pop(OUTPUT, None)
    response = RunJupyterResponse(status=RunStatus.Failed, driver=run.run_result, files=files)
    if output is None:  # the driver failed before any cell ran (its stderr says why) or was killed
        return response
    try:
        report = json.loads(base64.b64decode(output))
        response.cells = [CellRunResult.model_validate(cell) for cell in report["cells"]]
    except (ValueError, KeyError, TypeError):  # the cells' code can overwrite the file: its own loss
        return response
    finished = report.get("status") == "Finished" and run.run_result is not None and (
        run.run_result.status == CommandRunStatus.Finished)
    response.status = RunStatus.Success if finished else RunStatus.Failed
    return response
