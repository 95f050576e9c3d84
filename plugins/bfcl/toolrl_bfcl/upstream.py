"""bfcl-eval's own code, imported once: its data loaders, its prompt, its docs → OpenAI schemas conversion,
its AST and multi-turn checkers and its leaderboard aggregation. Nothing here re-implements BFCL.

Two things stand between bfcl-eval and a trainer's process. Its checker reads one flag of its model table
(``MODEL_CONFIG_MAPPING[name].underscore_to_dot``), and importing that table imports every provider SDK
bfcl-eval can call; installed without them (``pip install --no-deps bfcl-eval``, the README), the table is
this module's two entries, one per answer format. And importing its config makes ``result/``, ``score/``
and ``.file_locks/`` under ``BFCL_PROJECT_ROOT`` (site-packages by default): they go to a cache folder.
"""

from __future__ import annotations

import functools
import os
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The model names the checker is given: prompting answers keep BFCL's dotted function names; function
# calling answers use the OpenAI-safe names (dots as underscores), mapped back by the checker.
PROMPT_MODEL = "toolrl-prompt"
FC_MODEL = "toolrl-fc"
VERSION = "2026.3.23"


class BfclMissing(ValueError):
    """bfcl-eval is not installed: a ValueError, so that building the environment is one config error line."""


@dataclass(frozen=True)
class _ModelConfig:
    underscore_to_dot: bool


def _cache_root() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return base / "toolrl" / "bfcl"


@functools.cache
def load() -> types.SimpleNamespace:
    """bfcl-eval's modules (imported on first use); :class:`BfclMissing` with the install line if absent."""
    os.environ.setdefault("BFCL_PROJECT_ROOT", str(_cache_root()))
    try:
        from bfcl_eval.constants import model_config
    except ModuleNotFoundError as exc:
        if exc.name is not None and exc.name.startswith("bfcl_eval"):
            raise BfclMissing(f"bfcl-eval is not installed: pip install --no-deps bfcl-eval=={VERSION} "
                              "(toolrl-plugin-bfcl's README)") from None
        # Installed without the provider SDKs its model table imports: the table is ours (module docstring).
        model_config = types.ModuleType("bfcl_eval.constants.model_config")
        model_config.MODEL_CONFIG_MAPPING = {}  # type: ignore[attr-defined]
        sys.modules["bfcl_eval.constants.model_config"] = model_config
    model_config.MODEL_CONFIG_MAPPING.setdefault(PROMPT_MODEL, _ModelConfig(underscore_to_dot=False))
    model_config.MODEL_CONFIG_MAPPING.setdefault(FC_MODEL, _ModelConfig(underscore_to_dot=True))

    from bfcl_eval import utils
    from bfcl_eval.constants.enums import Language, ModelStyle
    from bfcl_eval.constants.type_mappings import GORILLA_TO_OPENAPI
    from bfcl_eval.eval_checker import eval_runner_helper as leaderboard
    from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_checker, multi_turn_utils
    from bfcl_eval.model_handler import utils as handler_utils

    return types.SimpleNamespace(
        utils=utils, Language=Language, ModelStyle=ModelStyle, GORILLA_TO_OPENAPI=GORILLA_TO_OPENAPI,
        leaderboard=leaderboard, ast_checker=ast_checker, multi_turn_checker=multi_turn_checker,
        multi_turn_utils=multi_turn_utils, handler_utils=handler_utils)


def openai_tools(functions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """An entry's function docs as OpenAI tool schemas, as BFCL's own function-calling path sends them
    (types mapped, dotted names as underscores)."""
    bfcl = load()
    return bfcl.handler_utils.convert_to_tool(functions, bfcl.GORILLA_TO_OPENAPI, bfcl.ModelStyle.OPENAI_COMPLETIONS)


def prompting_messages(messages: list[dict[str, Any]], functions: list[dict[str, Any]],
                       docs: str = "json") -> list[dict[str, Any]]:
    """The first turn's messages with BFCL's prompting system prompt in front (the answer format
    ``[func(param=value), ...]``, the functions documented as ``docs``: json, BFCL's default, or one of
    the variants its format-sensitivity category measures: python, xml), as BFCL prompts a model that
    has no function calling."""
    bfcl = load()
    # BFCL reads a prompt variant from a format-sensitivity entry id ("name:variant:original id").
    variant = f"ret_fmt=python&tool_call_tag=False&func_doc_fmt={docs}&prompt_fmt=plaintext&style=classic"
    return bfcl.handler_utils.system_prompt_pre_processing_chat_model(
        [dict(m) for m in messages], functions, f"toolrl:{variant}:toolrl")
