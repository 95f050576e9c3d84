"""What the transformers engine needs to prefill a vision-language model's prompt (Qwen2-VL family):
the multimodal rotary positions of its tokens and the pixel values of the images in a span of them.

Image tokens take 3-D (temporal, height, width) positions; text after an image continues from the
largest position before it, so a row's text positions are its token index plus a constant *rope delta*
(<= 0) that decoding adds to the plain position count.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from toolrl.images import images_held, pixel_values

if TYPE_CHECKING:
    from toolrl.engines.transformers.scheduler import Request


class PromptVision:
    """A vision-language model's prompt inputs, from its processor and its ``get_rope_index``."""

    def __init__(self, model: Any, processor: Any) -> None:
        self.processor = processor
        self.image_token_id: int = model.config.image_token_id
        self.merge: int = processor.image_processor.merge_size
        inner = getattr(model, "model", model)  # *ForConditionalGeneration wraps the model that has it
        self._rope_index = inner.get_rope_index

    def positions(self, ids: Sequence[int], images: Sequence[Any], device: torch.device) -> tuple[torch.Tensor, int]:
        """The 3-D positions [3, len(ids)] of a whole prompt and its rope delta."""
        if not images:
            return torch.arange(len(ids), device=device).expand(3, -1), 0
        input_ids = torch.tensor([list(ids)], device=device)
        grid = torch.tensor([list(i.grid_thw) for i in images], device=device)
        types = (input_ids == self.image_token_id).int()
        pos, delta = self._rope_index(input_ids, mm_token_type_ids=types, image_grid_thw=grid)
        return pos[:, 0], int(delta.view(-1)[0])

    def prefill(self, admitted: Sequence[Request], prefix: Sequence[int], width: int, device: torch.device,
                dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """A prefill's inputs for the prompts of ``admitted``, each on its first ``prefix`` tokens' kept KV:
        3-D positions [3, rows, width] of each row's new tokens (left-padded), each row's rope delta, and
        the pixel inputs of the images among the new tokens, in row order (the order the model fills them in)."""
        pos = torch.zeros(3, len(admitted), width, dtype=torch.long, device=device)
        deltas, shown = [], []
        for i, (req, p) in enumerate(zip(admitted, prefix)):
            full, delta = self.positions(req.prompt, req.images, device)
            pos[:, i, width - (len(req.prompt) - p):] = full[:, p:]
            deltas.append(delta)
            shown += req.images[images_held(req.images, req.prompt[:p], self.image_token_id, self.merge):]
        if not shown:
            return pos, torch.tensor(deltas, device=device), {}
        pixels, grid = pixel_values(self.processor, shown, "the engine")
        return pos, torch.tensor(deltas, device=device), {"pixel_values": pixels.to(device, dtype),
                                                         "image_grid_thw": grid.to(device)}
