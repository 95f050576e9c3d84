"""geo3k as the vision task it is: the problem's figure reaches a VLM policy (the tiny Qwen2.5-VL), and
``crop_image`` returns a zoom of it that reaches the next turn's tokens; bad boxes are error results."""

from __future__ import annotations

import base64
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from PIL import Image
from toolrl_geo3k.crop import CropImageTool
from toolrl_geo3k.preprocess import preprocess

PARITY = Path(__file__).parent / "parity"  # a distribution registering the `parity` reward


def figure(width: int = 112, height: int = 84) -> bytes:
    pixels = np.random.default_rng(0).integers(0, 256, (height, width, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def call(name: str, arguments: dict) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


@pytest.fixture
def verl_parquet(tmp_path: Path) -> Path:
    """A verl-format parquet made by ``toolrl geo3k preprocess`` from geometry3k rows with figures."""
    source = tmp_path / "geometry3k.parquet"
    rows = [{"problem": "<image>Find x.", "answer": "16.5", "images": [{"bytes": figure(), "path": None}]}]
    pq.write_table(pa.Table.from_pylist(rows), source)
    return preprocess(source, tmp_path / "verl", "train")


@pytest.mark.parametrize("box, message", [
    ([0, 0, 200, 40], "is not inside the 112x84 figure"),
    ([30, 10, 20, 40], "is not inside the 112x84 figure"),
    ([10, 10, 12, 40], "a crop needs at least 4 pixels a side"),
])
async def test_bad_boxes_are_error_results(box: list[int], message: str) -> None:
    tool = CropImageTool()
    instance = await tool.create("t", images=[figure()])
    result = await tool.call(instance, {"box": box})
    assert result.status == "error" and message in result.response.text and not result.response.images


async def test_a_crop_is_the_region_enlarged() -> None:
    tool = CropImageTool()
    instance = await tool.create("t", images=[figure()])
    result = await tool.call(instance, {"box": [56, 42, 84, 63]})
    [crop] = result.response.images
    assert result.status == "ok" and crop.size == (112, 84)  # 28x21 zoomed 4x
    expected = Image.open(io.BytesIO(figure())).convert("RGB").crop((56, 42, 84, 63)).resize((112, 84))
    assert np.array_equal(np.asarray(crop), np.asarray(expected))
    missing = await tool.call(instance, {"box": [0, 0, 8, 8], "image": 1})
    assert missing.status == "error" and "there is no figure 1" in missing.response.text


def test_rollout_shows_the_figure_and_the_crop_to_a_vlm(verl_parquet: Path, tmp_path: Path) -> None:
    script = [call("crop_image", {"box": [0, 0, 56, 42]}), call("crop_image", {"box": [0, 0, 500, 40]}),
              "x = \\boxed{16.5}"]
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({
        "model": {"source": "tiny-qwen2.5-vl"},
        "env": "geo3k", "env_options": {"train_files": [str(verl_parquet)], "crop_tool": True},
        "data": {"batch_size": 1},
        "engine": {"name": "scripted", "options": {"script": script}},
        "rollout": {"n": 1, "max_turns": 5, "max_response_tokens": 2048},
        "trainer": {"total_steps": 1, "output_dir": str(tmp_path / "out"), "progress": False},
    }))
    done = subprocess.run([sys.executable, "-m", "toolrl", "rollout", str(tmp_path / "config.yaml")],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    [trace] = [json.loads(line) for line in (tmp_path / "out/rollouts/step_00001.jsonl").read_text().splitlines()]
    first, second = trace["tool_results"][:2]
    assert first["status"] == "ok" and first["response"]["text"].startswith("Region [0, 0, 56, 42] of the 112x84")
    assert second["status"] == "error" and "not inside the 112x84 figure" in second["response"]["text"]
    # The figure in the prompt, the crop after the first tool call, nothing from the failed one.
    assert len(trace["images"]) == 2
    crop = Image.open(io.BytesIO(base64.urlsafe_b64decode(trace["images"][1]["png"])))
    assert crop.size == (112, 84)
    assert "<|vision_start|><|image_pad|>" in trace["prompt_text"] and "<image>" not in trace["prompt_text"]
    crop_turn = trace["response_text"].split("<tool_response>")[1]
    assert crop_turn.startswith("\n<|vision_start|><|image_pad|>") and "Region [0, 0, 56, 42]" in crop_turn
    assert trace["reward"] > 0


def test_train_on_the_tiny_vlm_with_figures(verl_parquet: Path, tmp_path: Path) -> None:
    """``toolrl train`` on the tiny Qwen2.5-VL with the geo3k environment: the figures reach the engine
    and the trainer, and two GRPO steps train (the random model's geo3k reward is always 0, so a
    parity reward gives the group something to learn)."""
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({
        "model": {"source": "tiny-qwen2.5-vl"},
        "env": "geo3k", "env_options": {"train_files": [str(verl_parquet)]},
        "reward": {"functions": [{"name": "parity"}, {"name": "geo3k"}]},
        "data": {"batch_size": 1},
        "engine": {"name": "transformers"},
        "rollout": {"n": 4, "max_new_tokens": 8, "max_response_tokens": 16},
        "optim": {"lr": 1.0e-3, "micro_batch_size": 4},
        "trainer": {"total_steps": 2, "output_dir": str(tmp_path / "out"), "progress": False, "plot": False},
    }))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PARITY), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "toolrl", "train", str(tmp_path / "config.yaml")],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = [json.loads(line) for line in (tmp_path / "out/metrics.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "grad_norm" in m]
    assert len(steps) == 2 and all(m["grad_norm"] > 0 for m in steps), steps
    traces = [json.loads(line) for line in (tmp_path / "out/rollouts/step_00001.jsonl").read_text().splitlines()]
    assert len(traces) == 4 and all(len(t["images"]) == 1 for t in traces)
    assert all("<|vision_start|><|image_pad|>" in t["prompt_text"] for t in traces)


def test_images_false_gives_a_vlm_the_text_only(verl_parquet: Path, tmp_path: Path) -> None:
    """``env_options.images: false``: the tiny VLM reads the problem as a text model does (``<image>`` as
    text, no image tokens, no images in the trajectory); with ``crop_tool`` it is a one-line config error."""
    config = {
        "model": {"source": "tiny-qwen2.5-vl"},
        "env": "geo3k", "env_options": {"train_files": [str(verl_parquet)], "images": False},
        "data": {"batch_size": 1},
        "engine": {"name": "scripted", "options": {"script": ["x = \\boxed{16.5}"]}},
        "rollout": {"n": 1, "max_turns": 5, "max_response_tokens": 256},
        "trainer": {"total_steps": 1, "output_dir": str(tmp_path / "out"), "progress": False},
    }

    def rollout(cfg: dict) -> subprocess.CompletedProcess:
        (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
        return subprocess.run([sys.executable, "-m", "toolrl", "rollout", str(tmp_path / "config.yaml")],
                              capture_output=True, text=True, timeout=600)

    done = rollout(config)
    assert done.returncode == 0, done.stderr[-3000:]
    [trace] = [json.loads(line) for line in (tmp_path / "out/rollouts/step_00001.jsonl").read_text().splitlines()]
    assert not trace.get("images") and "<image>" in trace["prompt_text"]
    assert "<|vision_start|>" not in trace["prompt_text"] and trace["reward"] > 0
    config["env_options"]["crop_tool"] = True
    bad = rollout(config)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "crop_tool: crop_image shows parts of the figures, which images: false leaves out" in bad.stderr
