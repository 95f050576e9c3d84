"""The offline tiny Qwen2.5-VL (``model.source: tiny-qwen2.5-vl``): a random VLM from config, saved
with a processor assembled from the offline Qwen tokenizer, trl's Qwen2.5-VL chat template and the
PIL image processor."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from toolrl import model_sources
from toolrl.config import ModelConfig
from toolrl.templates import trl_template

pytest.importorskip("PIL")


@pytest.fixture(scope="module")
def vlm() -> str:
    return model_sources.tiny_qwen2_5_vl()


def _image(width: int, height: int):
    from PIL import Image

    img = Image.new("RGB", (width, height))
    img.putdata([((x * 7) % 256, (y * 5) % 256, (x + y) % 256) for y in range(height) for x in range(width)])
    return img


def test_model_loads_as_image_text_to_text(vlm):
    import torch
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(vlm, dtype=torch.float32)
    assert type(model).__name__ == "Qwen2_5_VLForConditionalGeneration"
    tok = model_sources.qwen_tokenizer("qwen2_5")
    ids = model_sources.qwen_added_tokens("qwen2_5")
    assert model.config.image_token_id == ids["<|image_pad|>"] == tok.convert_tokens_to_ids("<|image_pad|>")
    assert model.config.vision_start_token_id == tok.convert_tokens_to_ids("<|vision_start|>")
    assert model.config.vision_end_token_id == tok.convert_tokens_to_ids("<|vision_end|>")
    assert model.config.video_token_id == tok.convert_tokens_to_ids("<|video_pad|>")
    assert type(model_sources.load_model(vlm)).__name__ == "Qwen2_5_VLForConditionalGeneration"
    assert model_sources.is_vision_model_dir(vlm) and not model_sources.is_vision_model_dir(model_sources.tiny_qwen3())
    assert model_sources.load_processor(model_sources.tiny_qwen3()) is None


def test_saved_processor_layout(vlm):
    folder = Path(vlm)
    assert json.loads((folder / "processor_config.json").read_text())["processor_class"] == "Qwen2_5_VLProcessor"
    pre = json.loads((folder / "preprocessor_config.json").read_text())
    assert pre["image_processor_type"].startswith("Qwen2VLImageProcessor")
    assert (folder / "chat_template.jinja").read_text() == trl_template("qwen2_5_vl.jinja")


@pytest.mark.skipif(importlib.util.find_spec("torchvision") is None,
                    reason="transformers' Qwen2.5-VL AutoProcessor needs torchvision (its video processor)")
def test_auto_processor_loads(vlm):
    from transformers import AutoProcessor

    assert type(AutoProcessor.from_pretrained(vlm)).__name__ == "Qwen2_5_VLProcessor"


def test_processor_expands_image_placeholder(vlm):
    import torch

    proc = model_sources.load_processor(vlm)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is x?"}]}]
    text = proc.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text.count("<|image_pad|>") == 1
    out = proc(text=[text], images=[_image(100, 60)], return_tensors="pt")
    t, h, w = out["image_grid_thw"][0].tolist()
    merge = proc.image_processor.merge_size
    pad = model_sources.qwen_added_tokens("qwen2_5")["<|image_pad|>"]
    ids = out["input_ids"][0].tolist()
    assert ids.count(pad) == t * h * w // merge**2 > 1
    assert out["pixel_values"].shape[0] == t * h * w
    # The run of image tokens sits between vision_start and vision_end.
    start = ids.index(pad)
    assert ids[start - 1] == model_sources.qwen_added_tokens("qwen2_5")["<|vision_start|>"]
    assert ids[start + t * h * w // merge**2] == model_sources.qwen_added_tokens("qwen2_5")["<|vision_end|>"]
    model = model_sources.load_model(vlm)
    with torch.no_grad():
        logits = model(input_ids=out["input_ids"], pixel_values=out["pixel_values"],
                       image_grid_thw=out["image_grid_thw"]).logits
    assert logits.shape[:2] == out["input_ids"].shape and torch.isfinite(logits).all()


def test_pixel_bounds_keep_images_small(vlm):
    proc = model_sources.load_processor(vlm)
    big = proc.image_processor(images=[_image(640, 480)], return_tensors="pt")["image_grid_thw"][0]
    assert int(big.prod()) // 4 <= 16


def test_deterministic_and_resolved_from_config(tmp_path):
    import torch
    from safetensors.torch import load_file

    a = model_sources.tiny_qwen2_5_vl(tmp_path / "a", seed=3)
    b = model_sources.tiny_qwen2_5_vl(tmp_path / "b", seed=3)
    wa, wb = load_file(Path(a) / "model.safetensors"), load_file(Path(b) / "model.safetensors")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert any("visual" in k for k in wa)
    assert model_sources.resolve_source(ModelConfig(source="tiny-qwen2.5-vl")) == model_sources.tiny_qwen2_5_vl()


def test_bad_settings_fail_in_one_line():
    with pytest.raises(ValueError, match="head_dim"):
        model_sources.tiny_qwen2_5_vl(hidden_size=96, num_attention_heads=2)
