"""The public plugin API: the only names a plugin imports from toolrl, and a check that it does.

:data:`PUBLIC_API` maps each public module to the names a plugin may take from it; they keep their
paths across releases, and everything else is internal and may move. docs/plugins.md ("Public import
paths") lists exactly this table, each name with its use, and every in-tree plugin's package imports
nothing else but :mod:`toolrl.plugin_support` (``tests/test_public_api.py``). Run
:func:`check_public_imports` over your own package in its tests to hold it to the same contract."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

PUBLIC_API: Mapping[str, frozenset[str]] = {module: frozenset(names) for module, names in {
    "toolrl": ("hookimpl", "__version__", "InfrastructureError"),
    "toolrl.hookspecs": ("Register",),
    "toolrl.schemas": ("ToolSchema", "ToolCall", "ToolResult", "ToolResponse", "Message", "Sample",
                       "ParseResult", "ParseError"),
    "toolrl.tools": ("Tool", "ToolSet", "ToolConfigError", "SharedResources", "trajectory_of"),
    "toolrl.tools.verl_config": ("ToolSection", "load_tools_file", "parse_tools_config", "build_tools",
                                 "build_default_tool"),
    "toolrl.tools.ratelimit": ("RateLimiter", "make_rate_limiter"),
    "toolrl.parsers": ("ToolParser", "MAX_REPORTED_ERRORS"),
    "toolrl.parsers.pythonic": ("PythonicParser", "TURN_END"),
    "toolrl.rewards": ("RewardFunction", "last_boxed"),
    "toolrl.engines": ("RolloutEngine", "SamplingParams", "Generation", "FinishReason", "ModelSource",
                       "check_request", "CoreEngineOptions", "PromptLogprobs", "score_starts"),
    "toolrl.modeling.adapters": ("add_adapter", "remove_adapter", "adapter_of", "adapter_name", "adapter_parameters",
                                 "adapter_state", "load_adapter_state", "adapter_keys"),
    "toolrl.modeling.adapter_routing": ("adapter_names", "has_routing", "routed"),
    "toolrl.environments": ("Environment", "FileSplit", "HubSplit", "get_environment"),
    "toolrl.data.sources": ("load_split",),
    "toolrl.sessions": ("EnvironmentSession", "Reset", "StepResult", "SessionContext", "SessionKind", "SessionRun",
                        "SessionError"),
    "toolrl.trajectory": ("Trajectory", "TrajectoryImage"),
    "toolrl.families": ("ModelFamily", "Detection", "Template", "FamilyError"),
    "toolrl.renderers.chat": ("ChatRenderer",),
    "toolrl.algorithms": ("AdvantageEstimator", "AdvantageInputs", "PolicyLoss", "LossInputs", "LossTerms",
                          "LossOptions", "NoOptions", "build_loss", "StepField", "VALUES", "CANDIDATE_IDS",
                          "CANDIDATE_LOGPROBS"),
    "toolrl.algorithms.turns": ("TURNS", "TURN_IDS", "TURN_STATES", "TURN_STEP_REWARDS", "turn_fields", "turn_rewards"),
    "toolrl.context": ("ContextPolicy", "ContextView", "ContextPlan", "Branch", "TriggeredPolicy", "TriggeredOptions"),
    "toolrl.agents": ("Agent", "AgentOptions", "AgentTask", "Endpoint", "AgentFailure"),
    "toolrl.curricula": ("Curriculum", "TrainingSet", "GroupOutcome"),
    "toolrl.gateway.protocol": ("ChatMessage", "ChatRequest", "CompletionRequest", "RequestError", "parse_body",
                                "message_key", "is_assistant_key", "sse", "Body", "validated"),
    "toolrl.gateway.protocols": ("GatewayProtocol",),
    "toolrl.gateway.session": ("GatewaySession", "Ask", "Choice", "Turn"),
    "toolrl.gateway.messages": ("tool_schemas", "template_messages", "reply_message", "chat_chunks",
                                "finish_reason", "model_list"),
    "toolrl.loggers": ("Logger", "scalars"),
    "toolrl.images": ("ImageError", "ImageLimits", "load", "is_image_part", "part_image", "prepare"),
    "toolrl.config": ("Config", "ConfigError", "load_config", "format_errors", "ModelConfig", "AdapterConfig",
                      "AlgorithmConfig", "ApiRoot", "RayConfig"),
    "toolrl.model_sources": ("load_tokenizer", "tokenizer_or_load", "load_processor", "model_path", "check_model_dir",
                             "ModelUnavailable", "resolve_source", "load_model", "model_skeleton"),
    "toolrl.plugins.parts": ("build_part", "BuildContext", "registered_parts", "RunFacts"),
    "toolrl.processes.step_rank": ("StepRank",),
    "toolrl.processes.step_group": ("StepGroup",),
    "toolrl.cli": ("cli", "UsageFailure", "user_errors", "mapping_option"),
    "toolrl.testing": sys.modules[__package__].__all__,  # the whole kit (a package loads before its modules)
    "toolrl.transports": ("WeightTransport", "LinkedTransport", "TransportOptions", "WeightSender", "WeightReceiver",
                          "Bucket", "BucketHeader", "RowPiece", "Link", "TransportError"),
    "toolrl.training.token_step": ("TokenRow", "LossSpec", "StepOutput", "forward_backward", "micro_batch_spans"),
    "toolrl.training.optimizer": ("OptimizerSettings", "adamw", "optimizer_step"),
    "toolrl.training.lora": ("save_peft", "engine_state_dict"),
    "toolrl.training.peakmem": ("rss_bytes",),
    "toolrl.testing.parser_corpus": ("CASES", "TOOLS", "FAMILIES", "Case"),
}.items()}


_LISTING = """
import sys
from toolrl.cli import cli
sys.argv = ["toolrl", "list-plugins"]
try:
    cli()
except SystemExit as exc:  # the listing's own exit status, given back once the modules are printed
    code = exc.code
else:
    code = 0
print()
print(sorted(m for m in sys.modules if m.split(".")[0] in {packages!r}))
sys.exit(code)
"""


def listing_imports(*packages: str) -> tuple[str, list[str]]:
    """``toolrl list-plugins`` in a fresh interpreter: what it printed, and the modules of ``packages`` (top
    level names) it imported. Every toolrl process lists the plugins, so an entry point should import
    nothing but its own module and toolrl's hooks (lazy references for the rest). A listing that exits
    with any status but 0 raises AssertionError."""
    done = subprocess.run([sys.executable, "-c", _LISTING.format(packages=set(packages))], capture_output=True,
                          text=True, timeout=120)
    if done.returncode != 0:
        raise AssertionError(f"toolrl list-plugins exited {done.returncode}: {done.stderr[-3000:]}")
    printed, _, modules = done.stdout.rstrip("\n").rpartition("\n")
    return printed, ast.literal_eval(modules)


def check_public_imports(paths: Iterable[Path], api: Mapping[str, frozenset[str]] = PUBLIC_API) -> list[str]:
    """Every use of toolrl outside ``api`` in the Python files under ``paths`` (files or directories),
    as ``file:line: what``: ``from M import n`` needs M public and n one of its names (or a public
    module M.n); ``import M`` needs M public; ``M.n`` on an imported module needs n public too.
    Imports inside functions and under ``TYPE_CHECKING`` count alike."""
    files = sorted(f for p in paths for f in ([p] if p.is_file() else Path(p).rglob("*.py")))
    return [problem for f in files for problem in _problems(f, api)]


def _problems(path: Path, api: Mapping[str, frozenset[str]]) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    modules: dict[str, str] = {}  # local name -> the toolrl module it is bound to
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and _ours(node.module or ""):
            for alias in node.names:
                found += [(node.lineno, w) for w in _name_problems(node.module or "", alias.name, api)]
                if f"{node.module}.{alias.name}" in api:
                    modules[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if _ours(alias.name):
                    if alias.name not in api:
                        found.append((node.lineno, f"import {alias.name}: not a public module"))
                    # `import toolrl.x` binds `toolrl`; `import toolrl.x as y` binds y to toolrl.x
                    modules[alias.asname or alias.name.partition(".")[0]] = alias.name if alias.asname else "toolrl"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and (dotted := _dotted(node)) is not None:
            root, _, rest = dotted.partition(".")
            if root in modules and not isinstance(getattr(node, "ctx", None), ast.Del):
                found += [(node.lineno, w) for w in _attribute_problems(f"{modules[root]}.{rest}", api)]
    return [f"{path}:{line}: {what}" for line, what in sorted(set(found))]


def _ours(module: str) -> bool:
    return module == "toolrl" or module.startswith("toolrl.")


def _name_problems(module: str, name: str, api: Mapping[str, frozenset[str]]) -> list[str]:
    if f"{module}.{name}" in api or name in api.get(module, ()):
        return []
    if module not in api:
        return [f"from {module} import {name}: {module} is not a public module"]
    return [f"from {module} import {name}: {name} is not public in {module}"]


def _attribute_problems(dotted: str, api: Mapping[str, frozenset[str]]) -> list[str]:
    """``toolrl.a.b.c`` used as an attribute chain: the longest public module it starts with, then a
    public name of it."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        module = ".".join(parts[:end])
        if module in api:
            if end == len(parts) or parts[end] in api[module]:
                return []
            return [f"{module}.{parts[end]}: {parts[end]} is not public in {module}"]
    return [f"{dotted}: not public"]


def _dotted(node: ast.Attribute) -> str | None:
    """``a.b.c`` for a chain of attributes on a name, the outermost chain only."""
    pieces: list[str] = []
    current: ast.expr = node
    while isinstance(current, ast.Attribute):
        pieces.append(current.attr)
        current = current.value
    if not isinstance(current, ast.Name):
        return None
    return ".".join([current.id, *reversed(pieces)])
