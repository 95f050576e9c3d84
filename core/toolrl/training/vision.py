"""What the trainer does only for vision-language models (Qwen2-VL/Qwen2.5-VL layout).

A trajectory carries its images once (:class:`toolrl.rollout.TrajectoryImage`: PNG and the
processor's patch grid), in the order of their placeholder runs in its tokens. Per packed micro-batch
the trainer:

- turns the images of the kept part of each sequence into pixel values with the model's image
  processor (:func:`pixel_inputs`; one PNG shared by several trajectories of a group is processed
  once per step) and checks each grid against the one the rollout recorded;
- runs the vision tower once over all of them (the model's ``get_image_features``: each image
  attends only within itself) and hands the features to the model's own forward, which scatters them
  over the image placeholders;
- gives the language model Qwen2-VL's 3-D rotary positions computed **per sequence** with the model's
  ``get_rope_index`` and concatenated along the packed row, after the 1-D text positions that cut
  the row into sequences (the ``(4, 1, T)`` layout transformers reads for packed VLM rows).

Image tokens are never trained: :func:`check_untrained` rejects a trajectory whose response mask
covers one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from toolrl.rollout import Trajectory, TrajectoryImage

# A step's cache of processed images: PNG bytes -> (pixel rows, grid).
PixelCache = dict[bytes, tuple[torch.Tensor, torch.Tensor]]


@dataclass
class VisionInputs:
    """A packed micro-batch's images: ``pixel_values`` (patches, D) and ``image_grid_thw`` (n, 3) of
    all its sequences' images in row order; ``per_sequence[s]`` images belong to sequence ``s``."""

    pixel_values: torch.Tensor
    image_grid_thw: torch.Tensor
    per_sequence: list[int]

    def to(self, device: torch.device | str) -> VisionInputs:
        return VisionInputs(self.pixel_values.to(device), self.image_grid_thw.to(device), self.per_sequence)


def image_token_id(processor: Any) -> int:
    """The id of the processor's image placeholder token (``<|image_pad|>`` for Qwen-VL)."""
    return int(processor.image_token_id)


def images_kept(t: Trajectory, kept: Sequence[int], image_id: int) -> list[TrajectoryImage]:
    """The images whose placeholder runs lie in ``kept`` (a prefix of ``t``'s tokens). A run is never
    cut: the prefix ends before a trained token, and image tokens are never trained."""
    runs = sum(1 for j, tok in enumerate(kept) if tok == image_id and (j == 0 or kept[j - 1] != image_id))
    total = sum(1 for j, tok in enumerate(t.prompt_ids + t.response_ids)
                if tok == image_id and (j == 0 or (t.prompt_ids + t.response_ids)[j - 1] != image_id))
    if total != len(t.images):
        raise ValueError(f"trajectory {t.trajectory_id!r} has {total} image placeholder runs but "
                         f"{len(t.images)} images")
    return list(t.images[:runs])


def check_untrained(t: Trajectory, image_id: int) -> None:
    """Image tokens are the vision tower's output, never the model's: none may be trained."""
    if any(m and tok == image_id for tok, m in zip(t.response_ids, t.response_mask, strict=False)):
        raise ValueError(f"trajectory {t.trajectory_id!r} trains an image token (response_mask 1 on "
                         f"token {image_id})")


def _pixels(image: TrajectoryImage, processor: Any, cache: PixelCache) -> tuple[torch.Tensor, torch.Tensor]:
    if image.png not in cache:
        from toolrl.images import from_png

        out = processor.image_processor(images=[from_png(image.png)], return_tensors="pt")
        grid = out["image_grid_thw"][0]
        if tuple(grid.tolist()) != tuple(image.grid_thw):
            raise ValueError(f"the trainer's processor gives an image the patch grid {tuple(grid.tolist())}, "
                             f"the rollout recorded {tuple(image.grid_thw)}: the two use different processors")
        cache[image.png] = (out["pixel_values"], grid)
    return cache[image.png]


def pixel_inputs(images: Sequence[Sequence[TrajectoryImage]], processor: Any,
                 cache: PixelCache | None = None) -> VisionInputs | None:
    """Pixel values and grids of each sequence's ``images``, concatenated in order; None without images."""
    if not any(images):
        return None
    if processor is None:
        raise ValueError("trajectories hold images but the model has no processor (a text-only model?)")
    cache = {} if cache is None else cache
    done = [_pixels(image, processor, cache) for seq in images for image in seq]
    return VisionInputs(torch.cat([p for p, _ in done]), torch.stack([g for _, g in done]),
                        [len(seq) for seq in images])


def rope_positions(base: Any, input_ids: torch.Tensor, bounds: Sequence[int], vision: VisionInputs) -> torch.Tensor:
    """Qwen2-VL's 3-D rotary positions of a packed row, (3, 1, T): the model's ``get_rope_index`` on
    each sequence (its own images' grids), concatenated."""
    image_id = base.config.image_token_id
    out = []
    first = 0
    for s, (a, b) in enumerate(zip(bounds, bounds[1:], strict=False)):
        ids = input_ids[:, a:b]
        n = vision.per_sequence[s]
        grids = vision.image_grid_thw[first:first + n] if n else None
        first += n
        positions, _ = base.get_rope_index(ids, mm_token_type_ids=(ids == image_id).int(), image_grid_thw=grids)
        out.append(positions)
    return torch.cat(out, dim=2)


def forward_inputs(base: Any, input_ids: torch.Tensor, position_ids: torch.Tensor, bounds: Sequence[int],
                   vision: VisionInputs) -> tuple[torch.Tensor, dict[str, Any]]:
    """The packed row's ``(4, 1, T)`` positions (1-D text positions, then the 3-D ones) and the
    encoder outputs for the model's forward (``mm_encoder_outputs``: the vision tower already run)."""
    positions = torch.cat([position_ids[None], rope_positions(base, input_ids, bounds, vision)])
    encoded = base.get_image_features(vision.pixel_values, vision.image_grid_thw, return_dict=True)
    return positions, {"mm_encoder_outputs": {"image": encoded}}


def is_vision_model(model: Any) -> bool:
    """Whether ``model`` (a Hugging Face model) has a vision tower."""
    return getattr(getattr(model, "config", None), "vision_config", None) is not None


def vision_tower(model: Any) -> Any:
    """The vision tower of a Qwen-VL model (``model.model.visual``)."""
    return getattr(model, model.base_model_prefix).visual


def freeze_vision(model: Any) -> None:
    """Freeze the vision tower (patch embedding, blocks and the merger into the language model)."""
    vision_tower(model).requires_grad_(False)
