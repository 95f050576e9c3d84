"""Every example config in the repository loads: a setting that moves (the algorithm's knobs onto their
parts' options) cannot leave a demo that fails at its first line."""

from pathlib import Path

import pytest
from toolrl.config import load_config

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted([*ROOT.glob("examples/*.yaml"), *ROOT.glob("plugins/*/examples/*.yaml")])


def test_the_demos_are_among_them():
    assert {"quickstart.yaml", "multi_turn.yaml", "tiny.yaml"} <= {p.name for p in EXAMPLES}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: str(p.relative_to(ROOT)))
def test_an_example_config_loads(path):
    load_config(path)
