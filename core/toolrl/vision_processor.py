"""A Qwen2-VL/Qwen2.5-VL processor for images only, for environments without torchvision.

transformers builds these processors with a video processor, and its video processors need
torchvision; toolrl does not depend on torchvision. This processor is transformers' own class with
the video processor left out (images render and expand exactly as upstream; videos are refused).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def _image_only_class() -> type:
    from transformers import Qwen2_5_VLProcessor

    class ImageOnlyQwenVLProcessor(Qwen2_5_VLProcessor):
        def check_argument_for_proper_class(self, argument_name: str, argument: Any) -> Any:
            # The one argument left out: the base class cannot even look up the video processor's
            # class without torchvision.
            if argument_name == "video_processor" and argument is None:
                return None
            return super().check_argument_for_proper_class(argument_name, argument)

    return ImageOnlyQwenVLProcessor


def image_only_processor(path: str | os.PathLike[str], tokenizer: Any) -> Any:
    """The processor of the Qwen2-VL/Qwen2.5-VL checkpoint in ``path`` (``tokenizer``: its tokenizer, as
    :func:`toolrl.model_sources.load_tokenizer` reads it), without its video processor."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    folder = Path(path)
    model_type = json.loads((folder / "config.json").read_text(encoding="utf-8")).get("model_type")
    if model_type not in ("qwen2_vl", "qwen2_5_vl"):
        raise RuntimeError(f"{folder}: a {model_type} processor needs torchvision (pip install torchvision)")
    template_file = folder / "chat_template.jinja"
    template = template_file.read_text(encoding="utf-8") if template_file.is_file() else None
    return _image_only_class()(
        image_processor=Qwen2VLImageProcessorPil.from_pretrained(str(folder)),
        tokenizer=tokenizer,
        chat_template=template,
    )
