"""``toolrl tinker tokenizers``: the Hugging Face cache it writes makes a held model's name load offline in
tinker-cookbook's own ``get_tokenizer`` (its venv, its transformers), as the same tokenizer the server
trains with."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

COOKBOOK_PYTHON = os.environ.get("TOOLRL_COOKBOOK_PYTHON", "")
TEXT = "What is 12 + 30?<|im_end|>\n<|im_start|>assistant\n42 ünïcödé"
ENCODE = """
import json, sys
from tinker_cookbook.tokenizer_utils import get_tokenizer
tok = get_tokenizer(sys.argv[1])
print(json.dumps({"ids": tok.encode(sys.argv[2], add_special_tokens=False), "eos": tok.eos_token}))
"""


def tokenizers(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "toolrl", "tinker", "tokenizers", *args], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})


@pytest.mark.skipif(not COOKBOOK_PYTHON, reason="TOOLRL_COOKBOOK_PYTHON names no interpreter with tinker-cookbook "
                    "(nox -s 'plugin(tinker)' makes one)")
def test_cookbook_loads_the_held_name_offline(tmp_path: Path) -> None:
    from toolrl import model_sources

    result = tokenizers("tiny-qwen3", "--hub-cache", str(tmp_path / "hub"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"export HF_HUB_CACHE={(tmp_path / 'hub').resolve()} HF_HUB_OFFLINE=1"
    revision = (tmp_path / "hub" / "models--tiny-qwen3" / "refs" / "main").read_text()
    assert tokenizers("tiny-qwen3", "--hub-cache", str(tmp_path / "hub")).returncode == 0
    assert (tmp_path / "hub" / "models--tiny-qwen3" / "refs" / "main").read_text() == revision  # written once

    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
    env.pop("PYTHONPATH", None)
    run = subprocess.run([COOKBOOK_PYTHON, "-c", ENCODE, "tiny-qwen3", TEXT], capture_output=True, text=True,
                         env=env, timeout=120, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    served = model_sources.load_tokenizer(model_sources.tiny_qwen3())
    assert json.loads(run.stdout) == {"ids": served.encode(TEXT, add_special_tokens=False), "eos": "<|im_end|>"}


def test_a_name_it_cannot_build_is_one_line(tmp_path: Path) -> None:
    result = tokenizers("no-such-model", "--hub-cache", str(tmp_path / "hub"))
    assert result.returncode == 2
    assert result.stderr.startswith("error: model.source: 'no-such-model' is not a built-in model")
    assert len(result.stderr.strip().splitlines()) == 1
