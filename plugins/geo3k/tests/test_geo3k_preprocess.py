"""Preprocessing geometry3k rows (written here, with real PNG images) into verl-format parquet."""

from __future__ import annotations

import base64
import io
import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from PIL import Image
from toolrl.data import to_sample
from toolrl.testing import build_tool, run_lifecycle
from toolrl_geo3k.cli import geo3k, preprocess_command
from toolrl_geo3k.preprocess import Geo3kDataError, convert, image_bytes, preprocess

SAMPLES = [
    ("<image>Find x. Round to the nearest tenth.", "16.5"),
    ("Find the area of the triangle.", "2\\sqrt{3}"),  # no placeholder: one is added
    ("<image>Find m \\angle 2.", "60"),
]


def png(color: str, size: tuple[int, int] = (8, 6)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, format="PNG")
    return buffer.getvalue()


def write_parquet(path: Path, rows: list[dict]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


@pytest.fixture
def hf_parquet(tmp_path: Path) -> Path:
    """Hugging Face's layout: images as {"bytes", "path"} structs."""
    rows = [
        {"problem": p, "answer": a, "images": [{"bytes": png(c), "path": None}]}
        for (p, a), c in zip(SAMPLES, ["red", "green", "blue"])
    ]
    return write_parquet(tmp_path / "train-00000-of-00001.parquet", rows)


def read(path: Path) -> list[dict]:
    return pq.read_table(path).to_pylist()


def test_rows_have_verl_fields(hf_parquet: Path, tmp_path: Path) -> None:
    out = preprocess(hf_parquet, tmp_path / "out", "train")
    assert out == tmp_path / "out" / "train.parquet"
    rows = read(out)
    assert len(rows) == 3
    for index, (row, (problem, answer)) in enumerate(zip(rows, SAMPLES)):
        assert row["data_source"] == "hiyouga/geometry3k" and row["ability"] == "math"
        assert row["agent_name"] == "tool_agent"
        assert row["reward_model"] == {"style": "rule", "ground_truth": answer}
        system, user = row["prompt"]
        assert system["role"] == "system" and "calc_geo3k_reward" in system["content"]
        assert user["role"] == "user" and user["content"].count("<image>") == 1
        assert user["content"].startswith("<image>") and problem.replace("<image>", "") in user["content"]
        assert "calc_geo3k_reward" in user["content"] and "\\boxed{}" in user["content"]
        extra = row["extra_info"]
        assert extra["split"] == "train" and extra["index"] == index
        assert extra["answer"] == answer and extra["question"] == problem
        assert extra["need_tools_kwargs"] is True
        assert extra["tools_kwargs"] == {"calc_geo3k_reward": {"create_kwargs": {"ground_truth": answer}}}
        [image] = row["images"]
        assert Image.open(io.BytesIO(image["bytes"])).size == (8, 6)


async def test_rows_validate_as_samples_and_drive_the_tool(hf_parquet: Path, tmp_path: Path) -> None:
    rows = read(preprocess(hf_parquet, tmp_path, "train"))
    tool, _ = await build_tool("calc_geo3k_reward")
    for n, (row, (_, answer)) in enumerate(zip(rows, SAMPLES), 1):
        sample = to_sample(row, f"train.parquet row {n}")
        assert sample.ground_truth == answer
        assert [Image.open(io.BytesIO(i)).size for i in sample.images] == [(8, 6)]
        create_kwargs = sample.tools_kwargs["calc_geo3k_reward"].create_kwargs
        assert create_kwargs == {"ground_truth": answer}
        run = await run_lifecycle(tool, {"answer": answer}, create_kwargs=create_kwargs)
        assert run.reward == 1.0


def test_images_as_paths_pil_bytes_and_data_urls(tmp_path: Path) -> None:
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "a.png").write_bytes(png("white"))
    data_url = "data:image/png;base64," + base64.b64encode(png("black")).decode()
    lines = [
        {"problem": "<image><image>Compare the figures.", "answer": 1, "images": ["img/a.png", data_url]},
        {"problem": "No figure here.", "answer": "x=2", "images": []},
    ]
    source = tmp_path / "test.jsonl"
    source.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    rows = convert(source, "test")
    assert [len(r["images"]) for r in rows] == [2, 0]
    assert rows[0]["images"][0]["path"] == "a.png" and rows[0]["reward_model"]["ground_truth"] == "1"
    assert rows[1]["prompt"][1]["content"].startswith("No figure here.")


def test_in_memory_images(tmp_path: Path) -> None:
    data, name = image_bytes(Image.new("L", (3, 3)), tmp_path)
    assert Image.open(io.BytesIO(data)).size == (3, 3) and name is None
    assert image_bytes(png("red"), tmp_path) == (png("red"), None)
    (tmp_path / "b.png").write_bytes(png("blue"))
    assert image_bytes({"bytes": None, "path": "b.png"}, tmp_path) == (png("blue"), "b.png")
    with pytest.raises(Geo3kDataError, match="unsupported image value of type int"):
        image_bytes(7, tmp_path)


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"answer": "1", "images": []}, "missing field 'problem'"),
        ({"problem": "P", "images": []}, "missing field 'answer'"),
        ({"problem": "  ", "answer": "1"}, "'problem' must be a non-empty string"),
        ({"problem": "P", "answer": ""}, "'answer' is empty"),
        ({"problem": "P", "answer": "1", "images": ["data:image/png;base64,eA=="]}, "does not decode"),
        ({"problem": "<image><image>P", "answer": "1", "images": []}, "2 <image> placeholders but 0 images"),
        ({"problem": "P", "answer": "1", "images": ["missing.png"]}, "cannot read image"),
    ],
)
def test_bad_rows_are_reported_with_file_and_row(tmp_path: Path, row: dict, message: str) -> None:
    source = tmp_path / "bad.jsonl"
    source.write_text(json.dumps({"problem": "ok", "answer": "1"}) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(Geo3kDataError, match="bad.jsonl, row 1") as info:
        convert(source, "train")
    assert message in str(info.value)


def test_directory_input_picks_each_split(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    write_parquet(data / "train-00000-of-00001.parquet", [{"problem": "A", "answer": "1", "images": []}] * 2)
    write_parquet(data / "test-00000-of-00001.parquet", [{"problem": "B", "answer": "2", "images": []}])
    result = CliRunner().invoke(
        geo3k,
        [
            "preprocess",
            "--input",
            str(data),
            "--output-dir",
            str(tmp_path / "out"),
            "--split",
            "train",
            "--split",
            "test",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "train: 2 rows" in result.output and "test: 1 rows" in result.output
    assert [r["extra_info"]["question"] for r in read(tmp_path / "out" / "test.parquet")] == ["B"]
    missing = CliRunner().invoke(
        preprocess_command,
        ["--input", str(data), "--output-dir", str(tmp_path / "o"), "--split", "validation"],
    )
    assert missing.exit_code == 1 and "no file name starts with the split 'validation'" in missing.output


def test_console_script(hf_parquet: Path, tmp_path: Path) -> None:
    script = Path(sys.executable).parent / "toolrl-geo3k-preprocess"
    done = subprocess.run(
        [str(script), "--input", str(hf_parquet), "--output-dir", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert len(read(tmp_path / "o" / "train.parquet")) == 3


def test_toolrl_subcommand(hf_parquet: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "toolrl",
            "geo3k",
            "preprocess",
            "--input",
            str(hf_parquet),
            "--output-dir",
            str(tmp_path / "o"),
            "--split",
            "train",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "train: 3 rows" in done.stdout
