"""The complete data row docs/plugins.md shows loads as the core reads data files."""

from __future__ import annotations

import re
from pathlib import Path

from toolrl.data import load_files


def test_the_data_row_in_plugins_md_loads(tmp_path):
    doc = (Path(__file__).resolve().parents[1] / "docs" / "plugins.md").read_text()
    block = re.search(r"## A data row\n.*?```jsonl\n(.*?)```", doc, re.S).group(1)
    (tmp_path / "train.jsonl").write_text(block)
    (sample,) = load_files([tmp_path / "train.jsonl"])
    assert [m.role for m in sample.prompt] == ["system", "user"] and sample.ground_truth == "27"
    assert sample.env == "arithmetic" and sample.data_source == "arithmetic" and sample.index == 0
    assert sample.tools_kwargs["calculator"].create_kwargs == {"ground_truth": "27"}
