"""Test support for environment plugins."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any


def listed_environments(**env: str) -> list[dict[str, Any]]:
    """``toolrl env list --json`` in a fresh interpreter, with ``env`` added to its environment (e.g.
    ``TOOLRL_DISABLE_PLUGINS``): what a user of the installed plugins sees."""
    out = subprocess.run([sys.executable, "-m", "toolrl", "env", "list", "--json"], capture_output=True, text=True,
                         env={**os.environ, **env}, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)
