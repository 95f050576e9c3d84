"""toolrl plugin for OpenEnv environment servers (the ``openenv`` package).

- The ``openenv`` tool: one tool-config entry stands for every tool an OpenEnv server offers (its MCP
  tools, or its action), one OpenEnv session per trajectory.
- The ``openenv`` environment: that tool, the server's reward, prompts from data files or a fixed
  prompt; ``env_options: {base_url}`` or ``{app: "module:app"}`` (the plugin starts the server).

This module is the entry point: it registers lazy references only, so loading the plugin imports
neither ``openenv`` nor ``pydantic``.
"""

from __future__ import annotations

from toolrl.hookspecs import Register, hookimpl

__version__ = "0.1.0"


@hookimpl
def register_tools(register: Register) -> None:
    register("toolrl_openenv.tool:OpenEnvTool", name="openenv")


@hookimpl
def register_environments(register: Register) -> None:
    register("toolrl_openenv.environment:OPENENV", name="openenv")
