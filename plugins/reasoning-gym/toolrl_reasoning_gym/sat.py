"""pycosat, the SAT solver reasoning-gym imports with the package although only its zebra puzzles use it.
Its package indexes carry it as source only (installing it compiles C), so the plugin installs
reasoning-gym without it (``--no-deps``). Where it is missing, a module whose solvers refuse every call
stands in for it: ``import reasoning_gym`` then works, every other generator loads, and the options
refuse the generators that need it before anything is generated."""

from __future__ import annotations

import sys
import types

# reasoning-gym 0.1.25's generators whose module imports its SAT helpers (logic/contrib/logic_puzzle/
# sat_utils.py, through logic_puzzle/generate.py): zebra_puzzles alone.
NEEDS_PYCOSAT = frozenset({"zebra_puzzles"})
INSTALL = "pip install pycosat==0.6.6 (it compiles C: needs a C compiler)"


def _refuse(*args: object, **kwargs: object) -> None:
    raise ModuleNotFoundError(f"pycosat is not installed (reasoning-gym's zebra_puzzles solves with it): {INSTALL}",
                              name="pycosat")


def stand_in() -> None:
    """A missing pycosat replaced by the refusing module; run where a generator is built
    (:mod:`toolrl_reasoning_gym.generators`), before reasoning_gym is first imported, and nowhere else:
    loading the plugin leaves ``sys.modules`` alone."""
    try:
        import pycosat  # noqa: F401
    except ImportError:
        module = types.ModuleType("pycosat", "Stands in for the missing pycosat: every solver call raises.")
        module.itersolve = module.solve = _refuse
        module.stand_in = True
        sys.modules["pycosat"] = module


def missing() -> bool:
    """Whether the refusing module stands where pycosat should be."""
    return getattr(sys.modules.get("pycosat"), "stand_in", False)
