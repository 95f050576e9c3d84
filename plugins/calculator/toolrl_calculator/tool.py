"""The ``calculator`` tool: one arithmetic expression in, its value (or an error) out."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict
from toolrl.schemas import ToolResponse
from toolrl.tools import Tool

from toolrl_calculator.evaluate import (
    CONSTANTS,
    FUNCTIONS,
    MAX_EXPRESSION_CHARS,
    CalculatorError,
    evaluate,
    format_number,
)


class CalculatorConfig(BaseModel):
    """The calculator takes no options; unknown config keys are errors, not silently ignored."""

    model_config = ConfigDict(extra="forbid")


class CalculatorTool(Tool):
    schema: ClassVar[dict[str, Any]] = {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": (
                "Evaluate an arithmetic expression. Integers are exact; other results are floats. Supports "
                "+ - * / // % ** (or ^), parentheses, the constants "
                + ", ".join(CONSTANTS)
                + " and the functions "
                + ", ".join(FUNCTIONS)
                + "."
            ),
            "parameters": {
                "type": "object",
                "properties": {
                    "expression": {
                        "type": "string",
                        "description": "The expression, e.g. '2*(3+4)**2' or 'sqrt(2)/2'.",
                        "maxLength": MAX_EXPRESSION_CHARS,
                    }
                },
                "required": ["expression"],
                "additionalProperties": False,
            },
        },
    }
    config_model = CalculatorConfig
    default_timeout = 5.0

    async def execute(
        self, instance_id: str, arguments: dict[str, Any], **execute_kwargs: Any
    ) -> tuple[ToolResponse, float, dict[str, Any]]:
        self.state(instance_id)  # raises for released or unknown instances
        try:
            value = evaluate(arguments["expression"])
        except CalculatorError as exc:
            return ToolResponse.error(f"Error in 'expression': {exc}"), 0.0, {}
        return ToolResponse(text=format_number(value)), 0.0, {}
