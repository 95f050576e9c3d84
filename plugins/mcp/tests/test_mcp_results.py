"""Result translation in both directions: MCP CallToolResult <-> toolrl ToolResponse."""

from __future__ import annotations

import base64
import io

import mcp.types as types
import pytest
from toolrl.schemas import ToolResponse
from toolrl_mcp.results import to_call_tool_result, to_tool_response

PNG = base64.b64encode(b"\x89PNG fake").decode()


def test_text_blocks_are_joined_and_structured_content_kept() -> None:
    result = types.CallToolResult(
        content=[types.TextContent(text="line 1"), types.TextContent(text="line 2")],
        structured_content={"n": 2},
    )
    response, metrics = to_tool_response(result)
    assert response == ToolResponse(text="line 1\nline 2")
    assert metrics == {"structured_content": {"n": 2}}


def test_structured_content_is_the_text_when_there_is_no_text() -> None:
    response, metrics = to_tool_response(types.CallToolResult(content=[], structured_content={"x": [1, "é"]}))
    assert response.text == '{"x": [1, "é"]}'
    assert metrics["structured_content"] == {"x": [1, "é"]}


def test_is_error_is_kept_and_never_empty() -> None:
    response, _ = to_tool_response(types.CallToolResult(content=[types.TextContent(text="bad")], is_error=True))
    assert response.is_error and response.text == "bad"
    response, _ = to_tool_response(types.CallToolResult(content=[], is_error=True))
    assert response.is_error and "failed" in response.text


def test_images_pass_through_as_data_urls_and_other_blocks_as_notes() -> None:
    result = types.CallToolResult(content=[
        types.TextContent(text="see"),
        types.ImageContent(data=PNG, mime_type="image/png"),
        types.AudioContent(data=base64.b64encode(b"abcd").decode(), mime_type="audio/wav"),
        types.ResourceLink(name="doc", uri="file:///doc.txt", description="the doc"),
        types.EmbeddedResource(resource=types.TextResourceContents(uri="file:///a.txt", text="inline text")),
        types.EmbeddedResource(resource=types.BlobResourceContents(uri="file:///b.jpg", blob=PNG,
                                                                   mime_type="image/jpeg")),
        types.EmbeddedResource(resource=types.BlobResourceContents(uri="file:///c.bin", blob="AAEC",
                                                                   mime_type="application/octet-stream")),
    ])
    response, _ = to_tool_response(result)
    assert response.images == [f"data:image/png;base64,{PNG}", f"data:image/jpeg;base64,{PNG}"]
    assert response.text.splitlines() == [
        "see",
        "[audio (audio/wav), 4 bytes]",
        "[resource link file:///doc.txt: the doc]",
        "inline text",
        "[resource file:///c.bin (application/octet-stream), 3 bytes]",
    ]


def test_toolrl_responses_become_mcp_results() -> None:
    result = to_call_tool_result(ToolResponse(text="hi", images=[f"data:image/jpeg;base64,{PNG}", PNG]),
                                 {"toolrl": {"status": "ok"}})
    assert [b.type for b in result.content] == ["text", "image", "image"]
    assert result.content[1].mime_type == "image/jpeg" and result.content[1].data == PNG
    assert result.content[2].mime_type == "image/png"
    assert result.meta == {"toolrl": {"status": "ok"}} and not result.is_error
    error = to_call_tool_result(ToolResponse.error("Error: no"))
    assert error.is_error and error.content[0].text == "Error: no"
    assert to_call_tool_result(ToolResponse(text="", images=[PNG])).content[0].type == "image"


def test_pil_images_are_encoded_as_png() -> None:
    image_module = pytest.importorskip("PIL.Image")
    result = to_call_tool_result(ToolResponse(images=[image_module.new("RGB", (2, 2), "red")]))
    decoded = image_module.open(io.BytesIO(base64.b64decode(result.content[0].data)))
    assert decoded.size == (2, 2) and result.content[0].mime_type == "image/png"


def test_unsendable_images_are_reported() -> None:
    with pytest.raises(TypeError, match="cannot send an image of type int"):
        to_call_tool_result(ToolResponse(images=[3]))
