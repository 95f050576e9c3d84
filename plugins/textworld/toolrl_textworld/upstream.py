"""TextWorld's own code, imported once: its game generators and its pure-Python engine
(``textworld.envs.tw.TextWorldEnv``, which plays a game from its ``.json`` file on the game's own rules).

TextWorld's package imports jericho, its z-machine interpreter, at import time, for the compiled ``.z8``
games this plugin never plays; jericho is a C build (gcc, make), left out of the install (README). Where it
is absent, a stand-in module answers the two warning classes TextWorld's import reads and nothing else:
anything that would run a z-machine fails there, naming jericho.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
import types
from typing import Any

VERSION = "1.7.0"


class TextworldMissing(ValueError):
    """TextWorld is not installed: a ValueError, so that building the environment is one config error line."""


def _jericho_stand_in() -> types.ModuleType:
    module = types.ModuleType("jericho")

    def attribute(name: str) -> Any:
        if name.endswith("Warning"):  # the warnings textworld's import silences
            return type(name, (UserWarning,), {})
        raise AttributeError(f"jericho.{name}: jericho is not installed; toolrl's TextWorld sessions play games "
                             "on TextWorld's Python engine, never on the z-machine")

    module.__getattr__ = attribute  # type: ignore[method-assign]
    return module


@functools.cache
def load() -> types.SimpleNamespace:
    """TextWorld's modules (imported on first use); :class:`TextworldMissing` with the install line if absent."""
    if importlib.util.find_spec("textworld") is None:
        raise TextworldMissing(f"textworld is not installed: pip install --no-deps textworld=={VERSION} "
                               "(toolrl-plugin-textworld's README)")
    if importlib.util.find_spec("jericho") is None:
        sys.modules.setdefault("jericho", _jericho_stand_in())
    import textworld
    from textworld.challenges import CHALLENGES
    from textworld.envs.tw import TextWorldEnv
    from textworld.generator.game import GameOptions

    return types.SimpleNamespace(textworld=textworld, challenges=CHALLENGES, GameOptions=GameOptions,
                                 TextWorldEnv=TextWorldEnv, EnvInfos=textworld.EnvInfos, Game=textworld.Game)
