"""The ``read_page`` tool: one page of the trajectory's ledger (its ``seed``, ``pages`` and ``rows``
come from the sample's ``tools_kwargs.read_page.create_kwargs``)."""

from __future__ import annotations

from typing import Any, ClassVar

from toolrl.schemas import ToolResponse
from toolrl.tools import Tool

from toolrl_ledger.pages import page_text


class ReadPageTool(Tool):
    schema: ClassVar[dict[str, Any]] = {
        "type": "function",
        "function": {
            "name": "read_page",
            "description": "Read one page of the ledger.",
            "parameters": {
                "type": "object",
                "properties": {"n": {"type": "integer", "minimum": 1, "description": "the page, from 1"}},
                "required": ["n"],
                "additionalProperties": False,
            },
        },
    }
    default_timeout = 5.0

    async def execute(self, instance_id: str, arguments: dict[str, Any],
                      **execute_kwargs: Any) -> tuple[ToolResponse, float, dict[str, Any]]:
        ledger = self.state(instance_id)
        n, pages = arguments["n"], ledger["pages"]
        if n > pages:
            return ToolResponse.error(f"Error: field 'n': page {n} is past the ledger's {pages} pages"), 0.0, {}
        return ToolResponse(text=page_text(ledger["seed"], n, pages, ledger["rows"])), 0.0, {}
