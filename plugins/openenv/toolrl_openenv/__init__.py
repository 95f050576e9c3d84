"""toolrl plugin for OpenEnv environment servers (the ``openenv`` package).

- The ``openenv`` environment session: one OpenEnv episode per trajectory, its tools what the episode
  offers at reset (its MCP tools, or its action), each call a step, ``done`` ending the trajectory,
  the last observation's reward as the score.
- The ``openenv`` environment: that session, prompts from data files or a fixed prompt;
  ``env_options: {base_url}`` or ``{app: "module:app"}`` (the plugin starts the server).

This module is the entry point: it registers lazy references only, so loading the plugin imports
neither ``openenv`` nor ``pydantic``.
"""

from __future__ import annotations

from toolrl import hookimpl
from toolrl.hookspecs import Register

__version__ = "0.1.0"


@hookimpl
def register_environment_sessions(register: Register) -> None:
    register("toolrl_openenv.session:OpenEnvSession", name="openenv")


@hookimpl
def register_environments(register: Register) -> None:
    register("toolrl_openenv.environment:OPENENV", name="openenv")
