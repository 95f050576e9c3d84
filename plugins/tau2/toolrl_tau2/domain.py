"""τ²-bench's own objects, from its domains' modules: a domain's tasks and splits, a fresh environment
(its own database copy), its policy and tool schemas. The only module that imports τ² at load time, and
only when first used. Not through ``tau2.registry``: importing it imports τ²'s agents and with them litellm
(6 s of CPU), which listing the environments, building a prompt or running a session here never uses."""

from __future__ import annotations

import functools
import importlib
import os
from typing import Any

# τ² imports litellm, which would try three times to download its model cost map: use the bundled one.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

# Domains whose package ships a solo policy: no user, the ticket is the first message.
SOLO_DOMAINS = frozenset({"mock", "telecom"})
# Solo by default when no user is configured: telecom's user runs tools on its own device, which the
# simulated user here does not (the agent gets those tools in solo mode).
SOLO_BY_DEFAULT = frozenset({"telecom"})
# toolrl split -> τ² split. The mock domain has only its "base" set, used for both.
SPLITS = {"mock": {"train": "base", "test": "base"}}


# τ²'s domains as its registry names them (tau2/registry.py): the module under tau2.domains and the function
# that builds a fresh environment (the registry's telecom is the manual policy's).
DOMAINS = {"airline": ("airline", "get_environment"), "retail": ("retail", "get_environment"),
           "telecom": ("telecom", "get_environment_manual_policy"),
           "telecom-workflow": ("telecom", "get_environment_workflow_policy"), "mock": ("mock", "get_environment")}


@functools.cache
def module(domain: str) -> Any:
    """The domain's ``tau2.domains.NAME.environment`` module."""
    from loguru import logger

    logger.disable("tau2")  # τ² logs every tool response at DEBUG to stderr
    return importlib.import_module(f"tau2.domains.{DOMAINS[domain][0]}.environment")


def tasks(domain: str, split: str) -> list[Any]:
    """The tasks of ``split`` (train/test, from the package's split_tasks.json), in file order."""
    return list(_tasks(domain, SPLITS.get(domain, {}).get(split, split)))


@functools.cache
def _tasks(domain: str, tau2_split: str) -> tuple[Any, ...]:
    return tuple(module(domain).get_tasks(tau2_split))


@functools.cache
def task_index(domain: str) -> dict[str, Any]:
    return {t.id: t for t in module(domain).get_tasks()}


def new_environment(domain: str, solo: bool) -> Any:
    """A fresh τ² environment of ``domain``: the constructor loads its own database copy."""
    return getattr(module(domain), DOMAINS[domain][1])(solo_mode=solo)


@functools.cache
def policy(domain: str, solo: bool) -> str:
    return new_environment(domain, solo).get_policy()


@functools.cache
def tool_schemas(domain: str, solo: bool) -> tuple[dict[str, Any], ...]:
    """The OpenAI schemas of the tools the agent has (in solo mode also the user's tools)."""
    env = new_environment(domain, solo)
    tools = list(env.get_tools())
    if solo and env.user_tools is not None:
        tools += env.get_user_tools()
    return tuple(t.openai_schema for t in tools)


def opening(task: Any, solo: bool) -> str:
    """The first user message: the ticket in solo mode, else the user's scenario as τ² words it
    (what the simulated user knows; the model reads it when no user is simulated)."""
    if solo and task.ticket:
        return task.ticket
    return str(task.user_scenario.instructions)


def history(task: Any) -> list[Any]:
    """The τ² messages the task's conversation starts from (its initial state)."""
    state = task.initial_state
    return list(state.message_history or []) if state is not None else []


def user_in_history(task: Any) -> bool:
    """Solo mode cannot start from such a history (τ²'s environment refuses user messages there)."""
    return any(m.role == "user" for m in history(task))


def chat_messages(messages: list[Any]) -> list[dict[str, Any]]:
    """τ² messages as chat-template messages (the prompt's conversation so far)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.role == "tool":
            out.append({"role": "tool", "content": m.content or ""})
            continue
        message: dict[str, Any] = {"role": m.role, "content": m.content or ""}
        if getattr(m, "tool_calls", None):
            message["tool_calls"] = [{"type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                                     for c in m.tool_calls]
        out.append(message)
    return out
