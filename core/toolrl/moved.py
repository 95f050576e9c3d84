"""Import paths of the flat 0.1 layout, kept working for one release.

``import toolrl.grpo`` still gives the module (now ``toolrl.training.grpo``: the same object, so
``isinstance`` and patching behave) and warns with the new path. docs/plugins.md lists the
public import paths a plugin should use.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import sys
import warnings
from types import ModuleType

MOVED = {
    "toolrl.batches": "toolrl.data.batches",
    "toolrl.builtin_plugins": "toolrl.plugins.builtin",
    "toolrl.chat": "toolrl.rollout.chat",
    "toolrl.checkpoint": "toolrl.training.checkpoint",
    "toolrl.cli_env": "toolrl.cli.env",
    "toolrl.cli_errors": "toolrl.cli.errors",
    "toolrl.compose": "toolrl.roles.compose",
    "toolrl.distributed": "toolrl.roles.rollout_workers",
    "toolrl.evaluate": "toolrl.roles.evaluate",
    "toolrl.grpo": "toolrl.training.grpo",
    "toolrl.guard": "toolrl.tools.guard",
    "toolrl.isolation": "toolrl.tools.isolation",
    "toolrl.logprobs": "toolrl.training.logprobs",
    "toolrl.lora": "toolrl.training.lora",
    "toolrl.microbatch": "toolrl.training.microbatch",
    "toolrl.packing": "toolrl.training.packing",
    "toolrl.peakmem": "toolrl.training.peakmem",
    "toolrl.ratelimit": "toolrl.tools.ratelimit",
    "toolrl.recorded": "toolrl.data.recorded",
    "toolrl.registry": "toolrl.plugins.registry",
    "toolrl.rundir": "toolrl.roles.run_dir",
    "toolrl.sharding": "toolrl.training.sharding",
    "toolrl.toolconfig": "toolrl.tools.verl_config",
    "toolrl.trainer": "toolrl.roles.controller",
    "toolrl.trainer_group": "toolrl.roles.trainer_group",
    "toolrl.trainer_rank": "toolrl.roles.trainer_rank",
    "toolrl.weight_sync": "toolrl.training.weight_sync",
}


class _OldPath:
    """Finds an old path and loads it as the module at its new path (a meta path finder and its loader;
    the importlib.abc base classes would cost every command their import)."""

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = MOVED[spec.name]
        warnings.warn(f"{spec.name} is now {new}; the old path will be removed", DeprecationWarning,
                      stacklevel=2)
        module = importlib.import_module(new)
        spec.loader_state = module.__spec__  # the import system sets the alias spec on the module next
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = module.__spec__.loader_state  # give the module its own spec back


def install() -> None:
    if not any(isinstance(finder, _OldPath) for finder in sys.meta_path):
        sys.meta_path.append(_OldPath())
