"""toolrl plugin for verifiers environments (``verifiers==0.4.0``, ``verifiers.v1``): the ``verifiers``
environment (a verifiers taskset's tasks as samples) and the ``verifiers`` environment session (per
trajectory its toolsets' tools and its tasks' ``@vf.reward`` functions and judges, one term each).

This module is the plugin's entry point: it registers lazy references only, so loading the plugin
imports neither verifiers nor mcp.
"""

from __future__ import annotations

from toolrl import hookimpl
from toolrl.hookspecs import Register

__version__ = "0.1.0"


@hookimpl
def register_environments(register: Register) -> None:
    register("toolrl_verifiers.environment:VERIFIERS", name="verifiers")


@hookimpl
def register_environment_sessions(register: Register) -> None:
    register("toolrl_verifiers.session:VerifiersSession", name="verifiers")
