"""toolrl plugin for verifiers environments (``verifiers==0.4.0``, ``verifiers.v1``): the ``verifiers``
environment (a verifiers taskset's tasks as samples), the ``verifiers`` tool (its toolsets' tools) and
the ``verifiers`` reward function (its tasks' ``@vf.reward`` functions and judges, one term each).

This module is the plugin's entry point: it registers lazy references only, so loading the plugin
imports neither verifiers nor mcp.
"""

from __future__ import annotations

from toolrl.hookspecs import Register, hookimpl

__version__ = "0.1.0"


@hookimpl
def register_environments(register: Register) -> None:
    register("toolrl_verifiers.environment:VERIFIERS", name="verifiers")


@hookimpl
def register_tools(register: Register) -> None:
    register("toolrl_verifiers.tools:VerifiersTool", name="verifiers")


@hookimpl
def register_reward_functions(register: Register) -> None:
    register("toolrl_verifiers.reward:VerifiersRubric", name="verifiers")
