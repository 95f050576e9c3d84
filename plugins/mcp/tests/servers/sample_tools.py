"""toolrl tools for the ``toolrl mcp serve`` tests (registered by ``sample_plugin``)."""

from __future__ import annotations

import os
from typing import Any

from toolrl.schemas import ToolResponse
from toolrl.tools import Tool

PIXEL_PNG = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGD4DwABBAEAwS2OUAAAAABJRU5ErkJggg=="
)


class MultiplyTool(Tool):
    """Multiplies; its reward is the number of calls its instance has seen, so a served call that
    runs create, execute and calc_reward on one instance reports reward 1. ``close()`` appends a line
    to the file named by ``SAMPLE_TOOLS_CLOSE_LOG``, so tests can see a server close its tools."""

    schema = {
        "type": "function",
        "function": {
            "name": "multiply",
            "description": "Multiply two numbers.",
            "parameters": {
                "type": "object",
                "properties": {
                    "x": {"type": "number", "description": "first factor"},
                    "y": {"type": "number", "description": "second factor"},
                },
                "required": ["x", "y"],
                "additionalProperties": False,
            },
        },
    }

    async def execute(self, instance_id: str, arguments: dict[str, Any], **kwargs: Any) -> tuple[str, float, dict]:
        state = self.state(instance_id)
        state["calls"] = state.get("calls", 0) + 1
        product = arguments["x"] * arguments["y"]
        return f"{product:g}", 0.5, {}

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        return float(self.state(instance_id).get("calls", 0))

    async def close(self) -> None:
        log = os.environ.get("SAMPLE_TOOLS_CLOSE_LOG")
        if log:
            with open(log, "a") as file:
                file.write("closed\n")


class PixelTool(Tool):
    schema = {
        "type": "function",
        "function": {"name": "pixel", "description": "A one-pixel image.",
                     "parameters": {"type": "object", "properties": {}}},
    }

    async def execute(self, instance_id: str, arguments: dict[str, Any], **kwargs: Any) -> tuple[ToolResponse, float, dict]:
        return ToolResponse(text="a pixel", images=[f"data:image/png;base64,{PIXEL_PNG}"]), 0.0, {}


class ExplodeTool(Tool):
    schema = {
        "type": "function",
        "function": {"name": "explode", "description": "Always raises.",
                     "parameters": {"type": "object", "properties": {}}},
    }

    async def execute(self, instance_id: str, arguments: dict[str, Any], **kwargs: Any) -> tuple[str, float, dict]:
        raise RuntimeError("kaboom")
