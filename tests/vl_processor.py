"""An offline Qwen2.5-VL processor for rendering tests: the Qwen2.5 tokenizer, trl's Qwen2.5-VL chat
template and the PIL image processor with small pixel bounds (a few dozen image tokens an image)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def vl_processor() -> Any:
    import trl
    from transformers import Qwen2_5_VLProcessor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from toolrl.models import qwen_tokenizer

    template = (Path(trl.__file__).parent / "chat_templates" / "qwen2_5_vl.jinja").read_text()
    tokenizer = qwen_tokenizer("qwen2_5")
    tokenizer.chat_template = template
    images = Qwen2VLImageProcessorPil(min_pixels=28 * 28, max_pixels=28 * 28 * 16)
    return Qwen2_5_VLProcessor(image_processor=images, tokenizer=tokenizer, chat_template=template)
