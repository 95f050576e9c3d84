"""A tool for tests/test_async_ray.py, importable by Ray workers (tests/ is on their PYTHONPATH)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from toolrl.tools import Tool


class GateTool(Tool):
    """Holds its call until the file ``<dir>/<gate>`` exists (``gate`` from the sample's
    execute_kwargs), after writing ``<dir>/<gate>.<pid>.waiting``: a test sees which worker holds a
    trajectory between two turns, and decides when the next turn starts."""

    schema = {"type": "function", "function": {
        "name": "gate", "description": "Waits.",
        "parameters": {"type": "object", "properties": {}, "additionalProperties": False}}}

    async def execute(self, instance_id: str, arguments: dict[str, Any], **execute_kwargs: Any):
        folder = Path(self.config["dir"])
        gate = execute_kwargs["gate"]
        (folder / f"{gate}.{os.getpid()}.waiting").touch()
        while not (folder / gate).exists():
            await asyncio.sleep(0.02)
        return "open", 0.0, {}
