"""Hand-built trajectories with images for the tiny Qwen2.5-VL: a prompt with a figure, a tool call,
a tool result holding a second image (never trained), and a final answer."""

from __future__ import annotations

import io

from toolrl.trajectory import Trajectory, TrajectoryImage


def image(width: int, height: int, seed: int = 0):
    from PIL import Image

    img = Image.new("RGB", (width, height))
    img.putdata([((x * 7 + seed * 31) % 256, (y * 5 + seed) % 256, (x * y + seed) % 256)
                 for y in range(height) for x in range(width)])
    return img


def png(img) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def _render(processor, text: str, images: list) -> tuple[list[int], list[TrajectoryImage]]:
    if not images:
        return processor.tokenizer.encode(text, add_special_tokens=False), []
    out = processor(text=[text], images=images, return_tensors="pt")
    grids = [tuple(g) for g in out["image_grid_thw"].tolist()]
    return out["input_ids"][0].tolist(), [TrajectoryImage(png=png(i), grid_thw=g) for i, g in zip(images, grids)]


def vision_trajectory(processor, name: str, figure, crop, answer: str, group: int = 0, reward: float = 0.0,
                      tool_image: bool = True) -> Trajectory:
    """Prompt (system, user with ``figure``), a tool call, a tool result with ``crop``, an answer."""
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Find x in the figure."}]}]
    prompt_text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    prompt_ids, images = _render(processor, prompt_text, [figure])
    call, _ = _render(processor, '<tool_call>\n{"name": "crop", "arguments": {"box": [0, 0, 10, 10]}}\n'
                                 "</tool_call><|im_end|>", [])
    tool_text = "\n<|im_start|>user\n<tool_response>\n" + (
        "<|vision_start|><|image_pad|><|vision_end|>" if tool_image else "no image") + \
        "</tool_response><|im_end|>\n<|im_start|>assistant\n"
    tool_ids, tool_images = _render(processor, tool_text, [crop] if tool_image else [])
    final, _ = _render(processor, f"{answer}<|im_end|>", [])
    response = call + tool_ids + final
    mask = [1] * len(call) + [0] * len(tool_ids) + [1] * len(final)
    return Trajectory(trajectory_id=name, sample_index=group, group=group, prompt_ids=prompt_ids,
                      images=images + tool_images, response_ids=response, response_mask=mask,
                      logprobs=[0.0] * len(response), reward=reward)
