"""What the model is shown after its calls: their results and its parse errors as a token delta (a
chat-template tool turn, or inline result tags), each response cut to ``tool_response_max_tokens``,
and the images the results hold."""

from __future__ import annotations

from collections.abc import Sequence

from toolrl.images import ImageError
from toolrl.renderers.chat import Truncation, truncated
from toolrl.rollout.episode import Episode, image_for
from toolrl.schemas import ParseError, ToolResponse, ToolResult
from toolrl.trajectory import TrajectoryImage


def tool_results_delta(ep: Episode, results: Sequence[ToolResult], errors: Sequence[ParseError],
                       call_ids: Sequence[str | None] = ()) -> tuple[list[int], list[TrajectoryImage]]:
    """The tokens that show the model its calls' results and its parse errors: a chat-template tool
    turn, or inline result tags; each response cut to ``tool_response_max_tokens``. With a processor,
    the images the results hold come with them (the second value, in token order). ``call_ids``: the
    results' calls' ids, in order (for templates that pair a result with its call)."""
    cfg, renderer, parser = ep.ctx.config, ep.renderer, ep.parser
    shown = tool_images(ep, results) if renderer.processor is not None and parser.result_mode == "chat" else []
    texts = [(r.name, renderer.truncate(_precut(r.response.text, cfg.tool_response_max_tokens,
                                                cfg.tool_response_truncation),
                                        cfg.tool_response_max_tokens, cfg.tool_response_truncation))
             for r in results]
    texts += [("error", f"Error: {e.message}") for e in errors]
    if parser.result_mode == "inline":
        return renderer.text_ids("".join(parser.format_inline_result(ToolResponse(text=t)) for _, t in texts)), []
    counts = [len(s) for s in shown] + [0] * (len(texts) - len(shown))
    ids = [*call_ids, *[None] * (len(texts) - len(call_ids))]
    messages = [renderer.tool_message(t, name, n, i) for (name, t), n, i in zip(texts, counts, ids)]
    ep.messages += messages
    images = [image for s in shown for image in s]
    return renderer.tool_delta(messages, [i.grid_thw for i in images]), images


def tool_images(ep: Episode, results: Sequence[ToolResult]) -> list[list[TrajectoryImage]]:
    """The images each result shows, within ``rollout.images``. A result whose image cannot be shown
    (corrupt, over the pixel cap, over the trajectory's image count) becomes an error result saying
    so, which the model sees instead of its images."""
    limits, held = ep.ctx.config.images, len(ep.traj.images)
    shown: list[list[TrajectoryImage]] = []
    for result in results:
        images: list[TrajectoryImage] = []
        try:
            if held + len(result.response.images) > limits.max_per_trajectory:
                raise ImageError(f"{len(result.response.images)} more would exceed the trajectory's limit of "
                                 f"{limits.max_per_trajectory} images (rollout.images.max_per_trajectory)")
            for n, value in enumerate(result.response.images):
                try:
                    images.append(image_for(ep.renderer, value, limits))
                except ImageError as exc:
                    raise ImageError(f"image {n}: {exc}") from None
        except ImageError as exc:
            images = []
            result.status = "error"
            result.response = ToolResponse.error(f"{result.response.text}\nError: the tool's images cannot be "
                                                 f"shown: {exc}".lstrip("\n"))
        else:  # the trajectory holds them once (Trajectory.images), not its tool results too
            result.response = result.response.model_copy(update={"images": []})
        held += len(images)
        shown.append(images)
    return shown


def _precut(text: str, max_tokens: int, mode: Truncation) -> str:
    """Cut a huge tool response by characters before it is tokenized: tokenizing a megabyte would hold
    the event loop (every trajectory) for seconds, only to keep ``max_tokens`` of it."""
    limit = 32 * max_tokens  # characters: far more than max_tokens tokens of ordinary text
    if len(text) <= limit:
        return text
    return truncated(text, limit, mode, f"...[{len(text) - limit} characters truncated]...", str)
