"""Where toolrl keeps what it builds or learns once and reuses: offline models and tokenizers
(:mod:`toolrl.model_sources`) and the plugin-screening verdicts (:mod:`toolrl.plugins.verdicts`)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


def cache_root(env: Mapping[str, str] | None = None) -> Path:
    """``$TOOLRL_CACHE``, else ``$XDG_CACHE_HOME/toolrl``, else ``~/.cache/toolrl`` (``env`` defaults to
    the process environment)."""
    env = os.environ if env is None else env
    if env.get("TOOLRL_CACHE"):
        return Path(env["TOOLRL_CACHE"])
    if env.get("XDG_CACHE_HOME"):
        return Path(env["XDG_CACHE_HOME"]) / "toolrl"
    return Path.home() / ".cache" / "toolrl"
