"""``crop_image``: the model zooms into part of the problem's figure by a pixel box and sees the crop.

The figure is the sample's own image (the rollout gives a tool with ``takes_sample_images`` the
prompt's images as ``create_kwargs.images``). Boxes are ``[left, top, right, bottom]`` in the figure's
pixels; a box that is not inside the figure, or is empty, is an error result naming the figure's
size, so the model can correct itself. The crop is enlarged (up to ``max_zoom``) towards the figure's
own size, the point of zooming in.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field
from toolrl.images import ImageError, ImageLimits, load
from toolrl.schemas import ToolResponse
from toolrl.tools import Tool


class CropToolConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_zoom: float = Field(4.0, ge=1.0, description="largest enlargement of a crop")
    min_side: int = Field(4, ge=1, description="smallest crop width or height, in pixels")


class CropImageTool(Tool):
    takes_sample_images: ClassVar[bool] = True
    schema: ClassVar[dict[str, Any]] = {
        "type": "function",
        "function": {
            "name": "crop_image",
            "description": "Zoom into a region of the problem's figure: returns the region [left, top, right, "
                           "bottom] (pixels of the figure, origin at its top left), enlarged.",
            "parameters": {
                "type": "object",
                "properties": {
                    "box": {"type": "array", "items": {"type": "number"}, "minItems": 4, "maxItems": 4,
                            "description": "[left, top, right, bottom] in pixels"},
                    "image": {"type": "integer", "minimum": 0, "description": "which figure (default 0)"},
                },
                "required": ["box"],
                "additionalProperties": False,
            },
        },
    }
    config_model = CropToolConfig

    async def create(self, instance_id: str | None = None, images: Any = (), **create_kwargs: Any) -> str:
        instance_id = await super().create(instance_id, **create_kwargs)
        self.state(instance_id)["images"] = list(images)
        return instance_id

    async def execute(self, instance_id: str, arguments: dict[str, Any],
                      **execute_kwargs: Any) -> tuple[ToolResponse, float, dict[str, Any]]:
        figures = self.state(instance_id)["images"]
        index = arguments.get("image", 0)
        if index >= len(figures):
            return ToolResponse.error(f"Error: there is no figure {index} (the problem has {len(figures)})"), 0.0, {}
        try:  # the sample's images are PNG already checked at load: this only decodes them
            figure = load(figures[index], ImageLimits(max_pixels=1 << 62, hard_max_pixels=1 << 62))
        except ImageError as exc:
            return ToolResponse.error(f"Error: figure {index} cannot be read: {exc}"), 0.0, {}
        width, height = figure.size
        left, top, right, bottom = arguments["box"]
        if not (0 <= left < right <= width and 0 <= top < bottom <= height):
            return ToolResponse.error(
                f"Error: box {arguments['box']} is not inside the {width}x{height} figure (need 0 <= left < "
                f"right <= {width} and 0 <= top < bottom <= {height})"), 0.0, {}
        box = (round(left), round(top), round(right), round(bottom))
        w, h = box[2] - box[0], box[3] - box[1]
        if min(w, h) < self.config.min_side:
            return ToolResponse.error(f"Error: box {arguments['box']} is {w}x{h} pixels; a crop needs at least "
                                      f"{self.config.min_side} pixels a side"), 0.0, {}
        zoom = min(self.config.max_zoom, max(1.0, min(width / w, height / h)))
        crop = figure.crop(box).resize((round(w * zoom), round(h * zoom)))
        return ToolResponse(text=f"Region {list(box)} of the {width}x{height} figure, zoomed {zoom:.2g}x.",
                            images=[crop]), 0.0, {"zoom": zoom}
