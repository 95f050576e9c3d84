"""What the trainer does only for vision-language models (Qwen2-VL/Qwen2.5-VL layout). Per packed
micro-batch:

- the distinct images (by PNG) of its sequences become pixel values (:func:`pixel_inputs`, once per step
  for an image a group shares), each grid checked against the one the rollout recorded;
- the vision tower runs once over them and one feature block per placeholder run of the row is scattered
  into the row's input embeddings (:func:`image_embeddings`): an image a shared prefix holds is encoded once;
- Qwen2-VL's 3-D rotary positions are computed **per sequence** on the unshared layout
  (:func:`rope_positions`) and put after the 1-D text positions (the ``(4, 1, T)`` layout transformers
  reads for packed rows); sequences share a row only where they agree on tokens and images before it
  (:func:`image_keys`), so their positions agree there.

Image tokens are never trained (:func:`check_untrained`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from toolrl.images import pixel_values
from toolrl.trajectory import Trajectory, TrajectoryImage

# A step's cache of processed images: PNG bytes -> (pixel rows, grid).
PixelCache = dict[bytes, tuple[torch.Tensor, torch.Tensor]]


@dataclass
class VisionInputs:
    """A packed micro-batch's images: ``pixel_values`` (patches, D) and ``image_grid_thw`` (n, 3) of its
    n distinct images (by PNG); ``per_sequence[s]`` the images (indexes into those n, in order) of its
    ``s``-th sequence with tokens; ``runs`` the image of each placeholder run of the packed row, in row
    order (sequence after sequence unshared; a prefix tree holds a shared run once)."""

    pixel_values: torch.Tensor
    image_grid_thw: torch.Tensor
    per_sequence: list[list[int]]
    runs: list[int]

    def to(self, device: torch.device | str) -> VisionInputs:
        return VisionInputs(self.pixel_values.to(device), self.image_grid_thw.to(device), self.per_sequence,
                            self.runs)


def run_starts(tokens: Sequence[int], image_id: int) -> list[int]:
    """Where each image placeholder run of ``tokens`` begins."""
    return [j for j, tok in enumerate(tokens) if tok == image_id and (j == 0 or tokens[j - 1] != image_id)]


def images_kept(t: Trajectory, kept: Sequence[int], image_id: int) -> list[TrajectoryImage]:
    """The images whose placeholder runs lie in ``kept`` (a prefix of ``t``'s tokens). A run is never
    cut: the prefix ends before a trained token, and image tokens are never trained."""
    total = len(run_starts(t.prompt_ids + t.response_ids, image_id))
    if total != len(t.images):
        raise ValueError(f"trajectory {t.trajectory_id!r} has {total} image placeholder runs but "
                         f"{len(t.images)} images")
    return list(t.images[:len(run_starts(kept, image_id))])


def image_keys(tokens: Sequence[int], images: Sequence[int], image_id: int) -> list[int]:
    """``tokens`` with the placeholders of their ``k``-th run replaced by ``-1 - images[k]`` (its
    distinct image's key): sequences whose keys agree hold the same tokens and the same images, so a
    prefix tree built on keys shares a placeholder run only between sequences that show the same image."""
    out = list(tokens)
    for start, image in zip(run_starts(tokens, image_id), images, strict=True):
        j = start
        while j < len(out) and out[j] == image_id:
            out[j] = -1 - image
            j += 1
    return out


def row_runs(seqs: Sequence[Sequence[int]], paths: Sequence[Sequence[int]], per_sequence: Sequence[Sequence[int]],
             image_id: int) -> list[int]:
    """The image of each placeholder run of a packed row, in row order: ``paths[s]`` the row of each
    token of ``seqs[s]``; ``per_sequence`` the images of the sequences with tokens. A run that several
    sequences share sits at one row and counts once."""
    owners = iter(per_sequence)
    starts: dict[int, int] = {}
    for seq, path in zip(seqs, paths, strict=True):
        if len(seq):
            for j, image in zip(run_starts(seq, image_id), next(owners), strict=True):
                starts[path[j]] = image
    return [starts[r] for r in sorted(starts)]


def check_untrained(t: Trajectory, image_id: int) -> None:
    """Image tokens are the vision tower's output, never the model's: none may be trained."""
    if any(m and tok == image_id for tok, m in zip(t.response_ids, t.response_mask, strict=False)):
        raise ValueError(f"trajectory {t.trajectory_id!r} trains an image token (response_mask 1 on "
                         f"token {image_id})")


def _pixels(image: TrajectoryImage, processor: Any, cache: PixelCache) -> tuple[torch.Tensor, torch.Tensor]:
    if image.png not in cache:
        pixels, grids = pixel_values(processor, [image], "the trainer")
        cache[image.png] = (pixels, grids[0])
    return cache[image.png]


def distinct(images: Sequence[Sequence[TrajectoryImage]]) -> list[list[int]]:
    """Each sequence's ``images`` as indexes into the distinct ones (by PNG, first seen first)."""
    index: dict[bytes, int] = {}
    return [[index.setdefault(image.png, len(index)) for image in seq] for seq in images]


def pixel_inputs(images: Sequence[Sequence[TrajectoryImage]], processor: Any,
                 cache: PixelCache | None = None) -> VisionInputs | None:
    """Pixel values and grids of the :func:`distinct` images among the sequences' ``images`` (one list
    per sequence with tokens), and the runs of their unshared packing; None without images. Every
    image's recorded grid is checked."""
    if not any(images):
        return None
    cache = {} if cache is None else cache
    per_sequence = distinct(images)
    done = {i: _pixels(image, processor, cache)
            for seq, owners in zip(images, per_sequence, strict=True) for image, i in zip(seq, owners, strict=True)}
    return VisionInputs(torch.cat([done[i][0] for i in range(len(done))]),
                        torch.stack([done[i][1] for i in range(len(done))]), per_sequence,
                        [i for owners in per_sequence for i in owners])


def rope_positions(base: Any, input_ids: torch.Tensor, bounds: Sequence[int], vision: VisionInputs) -> torch.Tensor:
    """Qwen2-VL's 3-D rotary positions of an unshared packed row cut at ``bounds`` (empty pieces
    skipped; the others are ``vision``'s sequences with tokens), (3, 1, T): the model's ``get_rope_index`` on each
    sequence (its own images' grids), concatenated."""
    image_id = base.config.image_token_id
    segments = [(a, b) for a, b in zip(bounds, bounds[1:], strict=False) if b > a]
    out = []
    for (a, b), images in zip(segments, vision.per_sequence, strict=True):
        ids = input_ids[:, a:b]
        grids = vision.image_grid_thw[images] if images else None
        positions, _ = base.get_rope_index(ids, mm_token_type_ids=(ids == image_id).int(), image_grid_thw=grids)
        out.append(positions)
    return torch.cat(out, dim=2)


def image_embeddings(base: Any, vision: VisionInputs, runs: Sequence[int], input_ids: torch.Tensor) -> torch.Tensor:
    """The packed row's input embeddings with the images in: the vision tower run once over the distinct
    images, one feature block per placeholder run scattered over its placeholders (``runs``: the image of
    each, in row order; an image held by several runs is encoded once and its gradient is their sum).
    Handed to the model as ``inputs_embeds``, which every transformers version takes (its newer
    ``mm_encoder_outputs`` is silently ignored by older ones: the images would be left out)."""
    features = base.get_image_features(vision.pixel_values, vision.image_grid_thw, return_dict=True).pooler_output
    embeds = base.get_input_embeddings()(input_ids)
    placeholders = (input_ids == base.config.image_token_id)[..., None]
    blocks = torch.cat([features[i] for i in runs]).to(embeds.dtype)
    if int(placeholders.sum()) != blocks.shape[0]:
        raise ValueError(f"{int(placeholders.sum())} image placeholders in the row, {blocks.shape[0]} image features")
    return embeds.masked_scatter(placeholders, blocks)


def is_vision_model(model: Any) -> bool:
    """Whether ``model`` (a Hugging Face model) has a vision tower."""
    return getattr(getattr(model, "config", None), "vision_config", None) is not None


def freeze_vision(model: Any) -> None:
    """Freeze the vision tower of a Qwen-VL model (``model.model.visual``: patch embedding, blocks and the
    merger into the language model)."""
    getattr(model, model.base_model_prefix).visual.requires_grad_(False)
