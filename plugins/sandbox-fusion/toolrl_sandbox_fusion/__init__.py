"""toolrl plugin: the ``code_interpreter`` tool, the ``python-math`` environment and ``toolrl sandbox serve``.

This module is the plugin's entry point. It registers a lazy reference to the tool and adds the
``sandbox`` command group; pydantic, aiohttp, starlette and uvicorn are imported only when used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from toolrl import hookimpl
from toolrl.hookspecs import Register

if TYPE_CHECKING:
    import click

__version__ = "0.1.0"


@hookimpl
def register_tools(register: Register) -> None:
    register(
        "toolrl_sandbox_fusion.tool:CodeInterpreterTool",
        name="code_interpreter",
        aliases=("verl.tools.sandbox_fusion_tools.SandboxFusionTool", "sandbox_fusion"),
    )


@hookimpl
def register_environments(register: Register) -> None:
    register("toolrl_sandbox_fusion.environment:PYTHON_MATH", name="python-math")


@hookimpl
def register_commands(cli: click.Group) -> None:
    from toolrl_sandbox_fusion.cli import sandbox

    cli.add_command(sandbox)
