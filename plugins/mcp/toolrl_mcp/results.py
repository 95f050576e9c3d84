"""Translating tool results between MCP (``CallToolResult``) and toolrl (``ToolResponse``)."""

from __future__ import annotations

import base64
import binascii
import io
import json
import re
from typing import Any

import mcp.types as types
from toolrl.schemas import ToolResponse

_DATA_URL = re.compile(r"^data:(?P<mime>[\w.+-]+/[\w.+-]+);base64,(?P<data>.*)$", re.DOTALL)


def _blob_note(kind: str, mime: str | None, data: str, uri: str | None = None) -> str:
    try:
        size = f"{len(base64.b64decode(data, validate=True))} bytes"
    except (binascii.Error, ValueError):
        size = "undecodable data"
    where = f" {uri}" if uri else ""
    return f"[{kind}{where} ({mime or 'unknown type'}), {size}]"


def to_tool_response(result: types.CallToolResult) -> tuple[ToolResponse, dict[str, Any]]:
    """Text blocks joined by newlines, images as data URLs in ``images``, other blocks as short
    notes; structured content goes into the metrics and becomes the text when there is no text."""
    texts: list[str] = []
    images: list[str] = []
    for block in result.content:
        if isinstance(block, types.TextContent):
            texts.append(block.text)
        elif isinstance(block, types.ImageContent):
            images.append(f"data:{block.mime_type};base64,{block.data}")
        elif isinstance(block, types.AudioContent):
            texts.append(_blob_note("audio", block.mime_type, block.data))
        elif isinstance(block, types.ResourceLink):
            texts.append(f"[resource link {block.uri}" + (f": {block.description}]" if block.description else "]"))
        elif isinstance(block, types.EmbeddedResource):
            resource = block.resource
            if isinstance(resource, types.TextResourceContents):
                texts.append(resource.text)
            elif (resource.mime_type or "").startswith("image/"):
                images.append(f"data:{resource.mime_type};base64,{resource.blob}")
            else:
                texts.append(_blob_note("resource", resource.mime_type, resource.blob, str(resource.uri)))
    text = "\n".join(texts)
    metrics: dict[str, Any] = {}
    if result.structured_content is not None:
        metrics["structured_content"] = result.structured_content
        if not texts:
            text = json.dumps(result.structured_content, ensure_ascii=False)
    if result.is_error and not text:
        text = "Error: the tool failed without a message"
    return ToolResponse(text=text, images=images, is_error=result.is_error), metrics


def _image_block(image: Any) -> types.ImageContent:
    if isinstance(image, str):
        match = _DATA_URL.match(image)
        if match:
            return types.ImageContent(data=match["data"], mime_type=match["mime"])
        return types.ImageContent(data=image, mime_type="image/png")  # bare base64, as ToolResponse allows
    if hasattr(image, "save"):  # a PIL image
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        return types.ImageContent(data=base64.b64encode(buffer.getvalue()).decode(), mime_type="image/png")
    raise TypeError(f"cannot send an image of type {type(image).__name__} over MCP")


def to_call_tool_result(response: ToolResponse, meta: dict[str, Any] | None = None) -> types.CallToolResult:
    """A toolrl response as an MCP result: the text, then the images; ``is_error`` carried over."""
    content: list[types.ContentBlock] = []
    if response.text or not response.images:
        content.append(types.TextContent(text=response.text))
    content.extend(_image_block(image) for image in response.images)
    return types.CallToolResult(content=content, is_error=response.is_error, _meta=meta)
