"""What in-tree plugins take from the core's internals. Not the plugin API (docs/plugins.md, "Public import
paths"): these may change or go in any release, so don't build on them. Each is the core's own, imported
from its home on first use, and here because:

- ``build_served_model``: ``toolrl serve`` (``openai``) serves the model as training composes it.
- ``after_startup``: an ``openenv`` or ``fleet`` server holds a rollout's many episodes, and ``env bench``'s
  client stands for a rollout process: each takes a rollout's collector tuning.
- ``stop_child``: ``openenv``'s servers, like the ``fleet``'s, are children that exit when stdin closes.
- ``read_json``, ``problem_results``, ``ProblemResult``: ``toolrl view`` reads the core's run directories.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # for type checkers and the layer check; at run time, __getattr__
    from toolrl.children import stop_child
    from toolrl.config import read_json
    from toolrl.gc_policy import after_startup
    from toolrl.processes.serving import build_served_model
    from toolrl.run_dir import ProblemResult, problem_results

_HOMES = {"build_served_model": "toolrl.processes.serving", "after_startup": "toolrl.gc_policy",
          "stop_child": "toolrl.children", "read_json": "toolrl.config",
          "problem_results": "toolrl.run_dir", "ProblemResult": "toolrl.run_dir"}
__all__ = ["ProblemResult", "after_startup", "build_served_model", "problem_results", "read_json",
           "stop_child"]


def __getattr__(name: str) -> Any:  # on first use: the viewer need not load what `toolrl serve` builds
    if name not in _HOMES:
        raise AttributeError(f"module 'toolrl.plugin_support' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)
