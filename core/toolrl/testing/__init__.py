"""toolrl.testing: the conformance kit for plugin authors: tools (below), parsers
(:mod:`toolrl.testing.parsers`), environment sessions (:mod:`toolrl.testing.sessions`), context policies (:mod:`toolrl.testing.contexts`), model families
(:mod:`toolrl.testing.families`), rollout engines (:mod:`toolrl.testing.engines`), any part's build contract, a package's imports (:data:`PUBLIC_API`),
and :class:`ScriptedEngine`, the engine that stands in for a model in tests (fixed texts, the calls it got recorded).

Every tool a rollout uses must behave the same way: resolve through the plugin registry, declare a
valid OpenAI function schema, run ``create -> execute* -> calc_reward -> release`` per trajectory,
turn bad input into error responses that name the field, keep trajectories apart, and survive many
concurrent trajectories. The kit checks all of that on any registered tool.

Quick start, in your plugin's ``tests/``::

    from toolrl.testing import ToolConformance

    class TestCalculatorConformance(ToolConformance):
        tool_name = "calculator"                  # registered name or alias
        tool_config = {}                          # the tool's config mapping
        valid_arguments = {"expression": "1+2"}
        invalid_arguments = [{"expression": "1+"}]  # plus calls derived from the schema
        create_kwargs = {}                        # per-trajectory create kwargs
        expected_text = "3"                       # optional: expected in the valid call's response

Instead of ``tool_name``/``tool_config`` you can point ``tools_config_file`` at a verl-format tools YAML
(relative to the test file) and set ``tool_name`` to the function name of one of its tools. Other
knobs: ``execute_kwargs``, ``other_create_kwargs`` (the second instance of the isolation check; make
it differ, e.g. another ground truth), ``derive_invalid_arguments``, ``deterministic``,
``concurrent_lifecycles``, ``check_timeout_s``, ``blocking_threshold_s``, ``cancellation_grace_s``. The
tests are synchronous and need no asyncio plugin.

What each generated test checks: docs/plugins.md, "The conformance kit" (each is a ``check_*`` function,
importable, see below).

Every lifecycle runs through :class:`toolrl.tools.ToolSet`, the driver rollouts and ``toolrl tool
call`` use (validation, deadlines, checks of return values, calc_reward/release always), so the
kit exercises the path training takes. Tools with ``isolation: process`` in ``tool_config`` are
checked through their worker process.

Helpers for your own tests (all async except where noted):

- :func:`run_lifecycle` ``(tool, arguments, create_kwargs=..., execute_kwargs=...)`` runs one
  lifecycle the way a rollout does (through ``ToolSet``) and returns a :class:`LifecycleRun`
  (``result``: the :class:`~toolrl.schemas.ToolResult`, ``reward``, ``calls``/``order``: the recorded
  lifecycle calls, ``loop_blocked_s``).
- :func:`instrument` (sync) records every lifecycle call on a tool object in a :class:`CallRecorder`.
- :func:`build_tool` builds a registered tool (or one from a tools YAML).
- ``check_*`` functions raise ``AssertionError`` with a message saying what to fix; use them in
  ``pytest.raises`` to test your own checks, or on tools that are not registered.

The pytest plugin (loaded automatically) adds the fixtures ``toolrl_plugins`` (a fresh
:class:`toolrl.plugins.Plugins`) and ``toolrl_reload_plugins`` (resets the process-wide plugins), and
lists every toolrl plugin with its status in the report header.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Names -> submodule. Imported on first use, so loading the pytest plugin (which imports this package
# in every pytest run) costs nothing until a test uses the kit.
_EXPORTS = {
    "ToolConformance": "conformance",
    "check_build_contract": "contract",
    "PUBLIC_API": "public_api",
    "ParserConformance": "parsers",
    "check_parser_corpus": "parsers",
    "check_parser_hostile": "parsers",
    "check_parser_fuzz": "parsers",
    "check_parser_linear_time": "parsers",
    "hostile_parser_inputs": "parsers",
    "check_engine_contract": "engines",
    "check_engine_logprobs": "engines",
    "check_engine_cancellation": "engines",
    "check_engine_weight_update": "engines",
    "reference_greedy": "engines",
    "FamilyConformance": "families",
    "registered_family": "families",
    "check_family_tokens": "families",
    "check_family_parser": "families",
    "check_family_end_of_turn": "families",
    "check_family_detected": "families",
    "ContextConformance": "contexts",
    "PolicyPlay": "contexts",
    "play_policy": "contexts",
    "check_context_build": "contexts",
    "check_context_prompts": "contexts",
    "check_context_tokens": "contexts",
    "check_context_plans": "contexts",
    "check_context_results": "contexts",
    "SessionConformance": "sessions",
    "SessionPlay": "sessions",
    "PlayedSession": "sessions",
    "prepared_session_kind": "sessions",
    "play_session": "sessions",
    "check_session_play": "sessions",
    "check_session_isolation": "sessions",
    "check_dead_session": "sessions",
    "check_public_imports": "public_api",
    "check_weight_transport": "transports",
    "ScriptedEngine": "scripted_engine",
    "ScriptedCall": "scripted_engine",
    **dict.fromkeys(
        (
            "LIFECYCLE",
            "CallRecorder",
            "LifecycleCall",
            "LifecycleError",
            "LifecycleRun",
            "instrument",
            "run_lifecycle",
        ),
        "lifecycle",
    ),
    **dict.fromkeys(
        (
            "build_tool",
            "check_calc_reward",
            "check_cancellation",
            "check_concurrency",
            "check_invalid_arguments",
            "check_isolation",
            "check_lifecycle",
            "check_no_loop_blocking",
            "check_order",
            "check_registered",
            "check_release_idempotent",
            "check_released_and_unknown",
            "check_return_types",
            "check_schema",
            "derive_invalid_arguments",
        ),
        "checks",
    ),
}
__all__ = [
    "CallRecorder",
    "ContextConformance",
    "FamilyConformance",
    "LIFECYCLE",
    "LifecycleCall",
    "LifecycleError",
    "LifecycleRun",
    "PUBLIC_API",
    "ParserConformance",
    "PlayedSession",
    "PolicyPlay",
    "ScriptedCall",
    "ScriptedEngine",
    "SessionConformance",
    "SessionPlay",
    "ToolConformance",
    "build_tool",
    "check_build_contract",
    "check_calc_reward",
    "check_cancellation",
    "check_concurrency",
    "check_context_build",
    "check_context_plans",
    "check_context_prompts",
    "check_context_results",
    "check_context_tokens",
    "check_dead_session",
    "check_engine_cancellation",
    "check_engine_contract",
    "check_engine_logprobs",
    "check_engine_weight_update",
    "check_family_detected",
    "check_family_end_of_turn",
    "check_family_parser",
    "check_family_tokens",
    "check_invalid_arguments",
    "check_isolation",
    "check_lifecycle",
    "check_no_loop_blocking",
    "check_order",
    "check_parser_corpus",
    "check_parser_fuzz",
    "check_parser_hostile",
    "check_parser_linear_time",
    "check_public_imports",
    "check_registered",
    "check_release_idempotent",
    "check_released_and_unknown",
    "check_return_types",
    "check_schema",
    "check_session_isolation",
    "check_session_play",
    "check_weight_transport",
    "derive_invalid_arguments",
    "hostile_parser_inputs",
    "instrument",
    "play_policy",
    "play_session",
    "prepared_session_kind",
    "reference_greedy",
    "registered_family",
    "run_lifecycle",
]

if TYPE_CHECKING:
    from toolrl.testing.checks import (
        build_tool,
        check_calc_reward,
        check_cancellation,
        check_concurrency,
        check_invalid_arguments,
        check_isolation,
        check_lifecycle,
        check_no_loop_blocking,
        check_order,
        check_registered,
        check_release_idempotent,
        check_released_and_unknown,
        check_return_types,
        check_schema,
        derive_invalid_arguments,
    )
    from toolrl.testing.conformance import ToolConformance
    from toolrl.testing.contexts import (
        ContextConformance,
        PolicyPlay,
        check_context_build,
        check_context_plans,
        check_context_prompts,
        check_context_results,
        check_context_tokens,
        play_policy,
    )
    from toolrl.testing.contract import check_build_contract
    from toolrl.testing.engines import (
        check_engine_cancellation,
        check_engine_contract,
        check_engine_logprobs,
        check_engine_weight_update,
        reference_greedy,
    )
    from toolrl.testing.families import (
        FamilyConformance,
        check_family_detected,
        check_family_end_of_turn,
        check_family_parser,
        check_family_tokens,
        registered_family,
    )
    from toolrl.testing.lifecycle import (
        LIFECYCLE,
        CallRecorder,
        LifecycleCall,
        LifecycleError,
        LifecycleRun,
        instrument,
        run_lifecycle,
    )
    from toolrl.testing.parsers import (
        ParserConformance,
        check_parser_corpus,
        check_parser_fuzz,
        check_parser_hostile,
        check_parser_linear_time,
        hostile_parser_inputs,
    )
    from toolrl.testing.public_api import PUBLIC_API, check_public_imports
    from toolrl.testing.scripted_engine import ScriptedCall, ScriptedEngine
    from toolrl.testing.sessions import (
        PlayedSession,
        SessionConformance,
        SessionPlay,
        check_dead_session,
        check_session_isolation,
        check_session_play,
        play_session,
        prepared_session_kind,
    )


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'toolrl.testing' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"toolrl.testing.{module}"), name)
    globals()[name] = value
    return value
