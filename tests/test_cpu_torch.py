"""scripts/cpu_torch.py: where torch 2.13.0's CPU build comes from, read as pip reads its settings."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load() -> object:
    spec = importlib.util.spec_from_file_location("cpu_torch", ROOT / "scripts" / "cpu_torch.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_wheel_folder_pip_reads_is_used_else_pytorchs_cpu_index(tmp_path: Path) -> None:
    cpu_torch = load()
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"")
    no_config = tmp_path / "none.conf"
    no_config.write_text("")
    # Neither pip's settings nor a mirror of the machine running the test (TOOLRL_TORCH_INDEX).
    base = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k != "TOOLRL_TORCH_INDEX"}
    base |= {"PIP_CONFIG_FILE": str(no_config), "HOME": str(tmp_path)}
    index = ["torch==2.13.0", "--index-url", "https://download.pytorch.org/whl/cpu"]
    assert cpu_torch.pip_args(base) == index
    assert cpu_torch.pip_args(base | {"PIP_FIND_LINKS": str(wheels)}) == ["torch==2.13.0"]
    assert cpu_torch.pip_args(base | {"PIP_FIND_LINKS": str(tmp_path)}) == index  # no CPU wheel there
    config = tmp_path / "pip.conf"
    config.write_text(f"[global]\nfind-links = file://{wheels}\n")
    assert cpu_torch.pip_args(base | {"PIP_CONFIG_FILE": str(config)}) == ["torch==2.13.0"]
    assert cpu_torch.pip_args(base | {"TOOLRL_TORCH_INDEX": "https://mirror.example/cpu"})[-1] == \
        "https://mirror.example/cpu"
