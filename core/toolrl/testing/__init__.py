"""toolrl.testing: the conformance kit for plugin authors (docs/plugins.md, "The conformance kit"): a kit per
kind of part, any part's build contract, a package's imports (:data:`PUBLIC_API`) and :class:`ScriptedEngine`,
the engine that stands in for a model in tests. Every tool lifecycle runs through
:class:`toolrl.tools.ToolSet`, the driver rollouts use, so the kit exercises the path training takes. The
pytest plugin (loaded automatically) adds the fixtures ``toolrl_plugins`` and ``toolrl_reload_plugins``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Submodule -> the names it gives. Imported on first use, so loading the pytest plugin (which imports this
# package in every pytest run) costs nothing until a test uses the kit.
_EXPORTS = {
    "conformance": ("ToolConformance",),
    "contract": ("check_build_contract",),
    "public_api": ("PUBLIC_API", "check_public_imports", "listing_imports"),
    "parsers": ("ParserConformance", "check_parser_corpus", "check_parser_hostile", "check_parser_fuzz",
        "check_parser_linear_time", "hostile_parser_inputs"),
    "engines": ("check_engine_contract", "check_engine_logprobs", "check_engine_cancellation",
        "check_engine_weight_update", "reference_greedy"),
    "families": ("FamilyConformance", "registered_family", "check_family_tokens", "check_family_parser",
        "check_family_end_of_turn", "check_family_detected"),
    "contexts": ("ContextConformance", "PolicyPlay", "play_policy", "check_context_build", "check_context_prompts",
        "check_context_tokens", "check_context_plans", "check_context_results"),
    "sessions": ("SessionConformance", "SessionPlay", "PlayedSession", "prepared_session_kind", "play_session",
        "check_session_play", "check_session_isolation", "check_dead_session"),
    "transports": ("check_weight_transport",),
    "curricula": ("check_curriculum", "play_curriculum", "training_set"),
    "scripted_engine": ("ScriptedEngine", "ScriptedCall"),
    "lifecycle": ("LIFECYCLE", "CallRecorder", "LifecycleCall", "LifecycleError", "LifecycleRun", "instrument",
        "run_lifecycle"),
    "checks": ("build_tool", "check_calc_reward", "check_cancellation", "check_concurrency",
        "check_invalid_arguments", "check_isolation", "check_lifecycle", "check_no_loop_blocking", "check_order",
        "check_registered", "check_release_idempotent", "check_released_and_unknown", "check_return_types",
        "check_schema", "derive_invalid_arguments"),
}
_HOME = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_HOME)

# ruff: noqa: F401
if TYPE_CHECKING:  # __all__'s names, for type checkers; at run time, __getattr__
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
    from toolrl.testing.curricula import check_curriculum, play_curriculum, training_set
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
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module 'toolrl.testing' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"toolrl.testing.{module}"), name)
    globals()[name] = value
    return value
