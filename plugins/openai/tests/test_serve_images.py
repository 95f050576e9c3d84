"""``toolrl serve`` with a vision-language model (the tiny Qwen2.5-VL on the transformers engine):
image parts in chat messages are rendered with the model's processor, reach the engine, and are
recorded with the conversation; bad images and images for a text model are request errors. Driven
in-process through the service the HTTP routes call."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image
from toolrl import model_sources
from toolrl.engines import ModelSource
from toolrl.engines.transformers import TransformersEngine
from toolrl.gateway.protocol import ChatRequest
from toolrl.plugins import get_plugins
from toolrl_openai.conversations import RECORD_FILE, Conversations
from toolrl_openai.service import RequestError, Service


def data_url(width: int, height: int, seed: int = 0) -> str:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def question(url: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": "What is in the figure?"}]}]


@pytest.fixture(scope="module")
def vlm_path() -> str:
    return model_sources.tiny_qwen2_5_vl()


def service(path: str, record: Path | None, with_processor: bool = True) -> Service:
    processor = model_sources.load_processor(path) if with_processor else None
    tokenizer = model_sources.load_tokenizer(path)
    engine = TransformersEngine.create(ModelSource(path=path, tokenizer=tokenizer), {"device": "cpu"})
    parser = get_plugins().load_part("tool_parsers", "hermes")()
    return Service(engine, tokenizer, parser, "vlm", Conversations(tokenizer, record), processor=processor)


async def test_image_parts_are_rendered_generated_and_recorded(vlm_path: str, tmp_path: Path) -> None:
    served = service(vlm_path, tmp_path)
    url = data_url(60, 40)
    try:
        out = await served.chat(ChatRequest(model="vlm", messages=question(url), max_tokens=4, temperature=0.0))
        served.conversations.close_all()
    finally:
        await served.engine.close()
    processor = model_sources.load_processor(vlm_path)
    template = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is in the figure?"}]}]
    text = processor.apply_chat_template(template, add_generation_prompt=True, tokenize=False)
    image = Image.open(io.BytesIO(base64.b64decode(url.partition(",")[2])))
    expected = processor(text=[text], images=[image], return_tensors="np")["input_ids"][0].tolist()
    assert out["usage"]["prompt_tokens"] == len(expected)
    [row] = [json.loads(line) for line in (tmp_path / RECORD_FILE).read_text().splitlines()]
    assert row["prompt_ids"] == expected and len(row["images"]) == 1
    assert row["images"][0]["grid_thw"] == list(processor.image_processor(images=[image])["image_grid_thw"][0])


@pytest.mark.parametrize("messages, with_processor, message", [
    (question("data:image/png;base64,aGVsbG8="), True, "messages.0.content.0: does not decode as an image"),
    (question(data_url(8, 8)), False, "messages.0.content.0: this model takes no images"),
    ([{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}], True,
     "messages.0.content.0: only text and image parts are supported"),
])
async def test_bad_image_parts_are_request_errors(vlm_path: str, messages: list, with_processor: bool,
                                                  message: str) -> None:
    served = service(vlm_path, None, with_processor)
    try:
        with pytest.raises(RequestError, match=f"^{message}"):
            await served.chat(ChatRequest(model="vlm", messages=messages, max_tokens=4))
    finally:
        await served.engine.close()
