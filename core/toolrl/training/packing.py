"""Padding-free batches: a micro-batch's trajectories concatenated into one row, each with its own
``position_ids`` (0, 1, 2, ... from its first token) and causal attention confined to itself.

Each sequence is cut after the last position that predicts a trained token, and the LM head runs only
at the positions that predict trained tokens. Attention over the row, by implementation: flash takes
transformers' varlen path (``cu_seq_lens``); sdpa is switched, once and for good (gradient checkpointing
re-runs the forward), to :mod:`toolrl.modeling.packed_attention`'s; eager gets one additive mask built here
(:func:`row_masks`: gpt-oss hands its mask functions no ``position_ids``); anything else, transformers'
packed-sequence detection from ``position_ids``. Under sdpa and eager every token sees what it saw
unpacked (:func:`toolrl.masks.visible`, sliding windows included).

Prefix-shared batches (:mod:`toolrl.training.prefix_tree`) hold a common prefix once; an implementation
that takes no tree (flash, flex) runs the unshared row rebuilt from it (``expand``), with a warning once:
the same values and gradients, no saving. A batch may carry a vision model's images (``vision``) and each
row token's adapter (``adapter_ids``, :func:`through_adapters`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from toolrl import masks
from toolrl.modeling import attention
from toolrl.modeling.adapter_routing import routed
from toolrl.modeling.packed_attention import PATTERN_KWARG, TREE_KWARG, RowPattern
from toolrl.training import prefix_tree, vision
from toolrl.trajectory import Trajectory

log = logging.getLogger(__name__)


@dataclass
class PackedBatch:
    """A packed micro-batch. ``input_ids``/``position_ids`` are (1, T). The row is cut into ``spans``
    (:mod:`toolrl.training.prefix_tree`): without shared prefixes one per sequence (``bounds`` are their
    edges, ``attention`` None); with them ``attention`` holds, per span, None (causal over itself) or
    the rows it attends to (its context, then itself: the sequence's positions from 0). The LM head runs
    at the N positions ``head_pos``, predicting ``targets``, which land at ``(rows, cols)`` of the
    (B, R) response grid that the loss reads (``response_mask``, ``engine_logprobs``, B ``advantages``).
    ``expand`` lists, sequence after sequence, the row of each token of the unshared packing (edges
    ``path_bounds``); ``first_copy`` the first place of each row in it: the way back to the unshared
    layout for models whose attention cannot take the tree."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    bounds: list[int]
    head_pos: torch.Tensor
    targets: torch.Tensor
    rows: torch.Tensor
    cols: torch.Tensor
    response_mask: torch.Tensor
    engine_logprobs: torch.Tensor
    advantages: torch.Tensor
    attention: list[torch.Tensor | None] | None = None
    expand: torch.Tensor | None = None
    path_bounds: list[int] | None = None
    first_copy: torch.Tensor | None = None
    vision: vision.VisionInputs | None = None  # the images of a vision-language model's sequences
    # (T, layers, top_k): the experts the engine routed each row token to, when every trajectory has them.
    routed_experts: torch.Tensor | None = None
    # (1, T): the adapter each row token runs through, an index into the model's adapters (model.adapters);
    # None: the model's own weights (and model.lora's one adapter).
    adapter_ids: torch.Tensor | None = None
    # What the run's parts read of these rows beyond their tokens (toolrl.algorithms.AlgorithmPart.fields),
    # a tensor (B, ...) over the (B, R) grid or a tuple of B values (toolrl.algorithms.StepField):
    # CANDIDATE_IDS (B, R, K) among them are run through the LM head too.
    fields: dict[str, Any] = field(default_factory=dict)

    @property
    def tokens(self) -> int:
        """Tokens the model runs on (no padding; shared prefixes once)."""
        return self.input_ids.shape[1]

    @property
    def total_tokens(self) -> int:
        """Tokens the unshared packing would run on."""
        return self.tokens if self.path_bounds is None else self.path_bounds[-1]


def input_length(t: Trajectory) -> int:
    """Tokens of ``t`` a forward needs: up to, not including, its last trained token."""
    last = max((j for j, m in enumerate(t.response_mask) if m), default=None)
    return 0 if last is None else len(t.prompt_ids) + last


def input_tokens(t: Trajectory) -> list[int]:
    """The tokens of ``t`` a forward needs (:func:`input_length` of them)."""
    length = input_length(t)
    if length and not t.prompt_ids:
        raise ValueError(f"trajectory {t.trajectory_id!r} has an empty prompt: its first response token "
                         "has no position to be predicted from")
    return (t.prompt_ids + t.response_ids)[:length]


def tree_keys(trajectories: Sequence[Trajectory], processor: Any = None) -> list[list[int]]:
    """Each trajectory's input tokens as prefix trees see them (what micro-batch plans group by): with
    a vision model's ``processor``, each image placeholder run keyed by its image
    (:func:`toolrl.training.vision.image_keys`)."""
    seqs = [input_tokens(t) for t in trajectories]
    if processor is None:
        return seqs
    image_id = int(processor.image_token_id)  # <|image_pad|> for Qwen-VL
    images = vision.distinct([vision.images_kept(t, seq, image_id) for t, seq in zip(trajectories, seqs, strict=True)])
    return [vision.image_keys(seq, owners, image_id) for seq, owners in zip(seqs, images, strict=True)]


def build_batch(trajectories: Sequence[Trajectory], advantages: Sequence[float] | Sequence[torch.Tensor],
                device: torch.device | str = "cpu", share_prefixes: bool = False, processor: Any = None,
                pixel_cache: vision.PixelCache | None = None, adapters: Sequence[int] | None = None) -> PackedBatch:
    """Pack ``trajectories`` into one row (no padding, so no pad id); with ``share_prefixes``, common
    prefixes once (:mod:`toolrl.training.prefix_tree`). ``advantages``: one number per trajectory (B,),
    or one row per trajectory (each a tensor over its response tokens), zero-padded to (B, R).
    ``processor``: a vision-language model's, which turns the trajectories' images into pixel values
    (``pixel_cache``: images already processed this step). ``adapters``: each trajectory's adapter
    (``model.adapters``), given to its row tokens; prefixes are shared only within one."""
    seqs = [input_tokens(t) for t in trajectories]
    keys, pixels = seqs, None
    if processor is None and any(t.images for t in trajectories):
        raise ValueError("trajectories hold images but no processor was given (a text-only model?)")
    if processor is not None:
        image_id = int(processor.image_token_id)
        for t in trajectories:
            vision.check_untrained(t, image_id)
        pixels = vision.pixel_inputs([vision.images_kept(t, seq, image_id)
                                      for t, seq in zip(trajectories, seqs, strict=True) if seq],
                                     processor, pixel_cache)
    if pixels is not None:
        owners = iter(pixels.per_sequence)
        keys = [vision.image_keys(seq, next(owners), image_id) if seq else seq for seq in seqs]
    tree = prefix_tree.layout(keys, share_prefixes, groups=adapters)
    if pixels is not None:  # the keys back to the placeholder token; each run's image in row order
        tree.ids = [image_id if k < 0 else k for k in tree.ids]
        pixels = dataclasses.replace(pixels, runs=vision.row_runs(seqs, tree.paths, pixels.per_sequence, image_id))
    n = len(trajectories)
    rwidth = max(1, max(len(t.response_ids) for t in trajectories))
    trained = [(i, j) for i, t in enumerate(trajectories) for j, m in enumerate(t.response_mask) if m]
    # Response token j sits at p + j (p: the prompt's length), predicted by the hidden state at p + j - 1.
    head_pos = [tree.paths[i][len(trajectories[i].prompt_ids) + j - 1] for i, j in trained]
    response_mask = torch.zeros((n, rwidth), dtype=torch.float32)
    engine_lp = torch.zeros((n, rwidth), dtype=torch.float32)
    for i, t in enumerate(trajectories):
        r = len(t.response_ids)
        response_mask[i, :r] = torch.tensor(t.response_mask, dtype=torch.float32)
        engine_lp[i, :r] = torch.tensor(t.logprobs, dtype=torch.float32)

    def long(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=device)

    if advantages and isinstance(advantages[0], torch.Tensor):
        adv = torch.zeros((n, rwidth), dtype=torch.float32)  # the padding is never trained
        for i, row in enumerate(advantages):
            adv[i, :len(row)] = row[:rwidth]
    else:
        adv = torch.tensor(list(advantages), dtype=torch.float32)
    batch = PackedBatch(long(tree.ids)[None], long(tree.positions)[None], [0] + [s.end for s in tree.spans],
                        long(head_pos), long([trajectories[i].response_ids[j] for i, j in trained]),
                        long([i for i, _ in trained]), long([j for _, j in trained]),
                        response_mask.to(device), engine_lp.to(device), adv.to(device),
                        vision=None if pixels is None else pixels.to(device))
    if tree.shared:
        add_tree(batch, tree, device)
    if adapters is not None:
        ids = [0] * len(tree.ids)
        for adapter, path in zip(adapters, tree.paths, strict=True):
            for r in path:
                ids[r] = adapter
        batch.adapter_ids = long(ids)[None]
    if all(t.routed_experts is not None for t in trajectories):
        batch.routed_experts = row_experts(trajectories, tree.paths, len(tree.ids), device)
    return batch


def row_experts(trajectories: Sequence[Trajectory], paths: Sequence[Sequence[int]], tokens: int,
                device: torch.device | str) -> torch.Tensor:
    """The engine's routed experts of each row token, (T, layers, top_k): each trajectory's recorded
    experts at its path's rows (a shared prefix row takes its last sequence's: the same tokens)."""
    first = trajectories[0].routed_experts
    assert first is not None
    out = torch.arange(first.top_k).expand(tokens, first.layers, first.top_k).clone()
    for t, path in zip(trajectories, paths, strict=True):
        experts = t.routed_experts
        assert experts is not None
        if (experts.layers, experts.top_k) != (first.layers, first.top_k) or experts.tokens < len(path):
            raise ValueError(f"trajectory {t.trajectory_id!r}: routed experts for {experts.tokens} tokens of "
                             f"{experts.layers}x{experts.top_k} experts, its forward runs {len(path)} tokens of "
                             f"{first.layers}x{first.top_k}")
        out[torch.tensor(list(path), dtype=torch.long)] = torch.tensor(experts.array()[:len(path)], dtype=torch.long)
    return out.to(device)


def dummy_batch(pad_id: int, device: torch.device | str = "cpu") -> PackedBatch:
    """One pad token, trained: the zero-weight step a rank runs while a busier rank still has a
    micro-batch, so that every rank issues FSDP's collectives the same number of times."""
    dummy = Trajectory(trajectory_id="dummy", sample_index=0, group=-1, prompt_ids=[pad_id], response_ids=[pad_id],
                       response_mask=[1], logprobs=[0.0])
    return build_batch([dummy], [0.0], device)


def add_tree(batch: PackedBatch, tree: prefix_tree.TreeLayout, device: torch.device | str) -> None:
    """The tree's attention (per span: the rows it attends to) and the way back to the unshared layout."""
    attention = [torch.tensor(s.context + list(range(s.start, s.end)), dtype=torch.long, device=device)
                 if s.context else None for s in tree.spans]
    expand = torch.tensor([r for path in tree.paths for r in path], dtype=torch.long, device=device)
    first = torch.full((batch.tokens,), expand.numel(), dtype=torch.long, device=device)
    batch.attention = attention
    batch.expand = expand
    batch.path_bounds = [0, *itertools.accumulate(len(path) for path in tree.paths)]
    batch.first_copy = first.scatter_reduce(0, expand, torch.arange(expand.numel(), device=device), "amin")


def sharing_metrics(batches: Sequence[PackedBatch]) -> dict[str, float]:
    """Per step: ``trainer_tokens_computed`` (tokens the model ran on), ``trainer_tokens_total`` (those
    the unshared packing runs on) and ``prefix_share`` (1 - computed / total)."""
    computed = float(sum(b.tokens for b in batches))
    total = float(sum(b.total_tokens for b in batches))
    return {"trainer_tokens_computed": computed, "trainer_tokens_total": total,
            "prefix_share": 1.0 - computed / total if total else 0.0}


def packed_hidden_states(model: Any, batch: PackedBatch) -> torch.Tensor:
    """The base model's last hidden states over the packed row, (T, H). A batch with ``adapter_ids``
    runs inside :func:`through_adapters`."""
    base = getattr(model, model.base_model_prefix)
    attention.install(base, attention.VARLEN_SDPA)  # over sdpa (and the engine's decode sdpa on a shared module)
    impl = base.config._attn_implementation
    tree = not runs_unshared(base, batch)  # eager attention takes a tree (one mask over the row)
    positions, extra = _model_inputs(base, batch, tree)
    if impl == "eager":
        out = base(position_ids=positions, attention_mask=row_masks(base, batch), use_cache=False,
                   **_token_inputs(batch.input_ids, extra))
        return out.last_hidden_state[0]
    if tree:
        return run_packed(base, batch.input_ids, positions, batch.bounds, batch.attention, extra)
    _warn_unshared(impl)
    return run_packed(base, batch.input_ids[:, batch.expand], positions, batch.path_bounds, extra=extra)[batch.first_copy]


def runs_unshared(base: Any, batch: PackedBatch) -> bool:
    """Whether :func:`packed_hidden_states` runs ``batch`` as the unshared row rebuilt from its tree:
    a tree, and an attention that cannot take one (flash, flex: no dense mask)."""
    return batch.attention is not None and not attention.of(base.config._attn_implementation).trees


def through_adapters(model: Any, batch: PackedBatch) -> contextlib.AbstractContextManager[Any]:
    """Where ``model``'s forwards (and backward: gradient checkpointing runs the forward again there)
    over ``batch`` run: each token through its adapter (``adapter_ids``, or their copies on the
    unshared row: :func:`runs_unshared`) by :func:`toolrl.modeling.adapter_routing.routed`; nothing is routed
    for a batch without them."""
    if batch.adapter_ids is None:
        return contextlib.nullcontext()
    unshared = runs_unshared(getattr(model, model.base_model_prefix), batch)
    return routed(model, batch.adapter_ids[:, batch.expand] if unshared else batch.adapter_ids)


def row_masks(base: Any, batch: PackedBatch) -> torch.Tensor | dict[str, torch.Tensor]:
    """Additive (1, 1, T, T) masks over a packed row, its pattern's rule (:class:`RowPattern`): each span
    sees its context (if it is in a tree) and, causally, itself; sliding-window layers only within their
    window. One mask per layer type for a model with layer types, else the one its layers use."""
    allowed = RowPattern.of(batch.bounds, batch.attention, batch.input_ids.device).dense(None)
    pos = batch.position_ids[0]
    return masks.by_layer_type(allowed[None, None], pos[:, None], pos[None, :], base.config, base.dtype)


def _model_inputs(base: Any, batch: PackedBatch, tree: bool) -> tuple[torch.Tensor, dict[str, Any] | None]:
    """Position ids and further keyword arguments (a vision model's encoder outputs) for ``batch``'s
    row (``tree``) or the unshared row rebuilt from it. Images: the 3-D rotary positions are computed
    per sequence on the unshared layout; a tree row takes those of its first copy there (every copy
    has the same ones: sequences share a row only where they agree on tokens and images before it)."""
    unshared = batch.expand is None
    positions = batch.position_ids if tree or unshared else batch.position_ids[:, batch.expand]
    if batch.vision is None:
        return positions, None
    v = batch.vision
    if unshared:
        rope = vision.rope_positions(base, batch.input_ids, batch.bounds, v)
    else:
        rope = vision.rope_positions(base, batch.input_ids[:, batch.expand], batch.path_bounds, v)
        rope = rope[:, :, batch.first_copy] if tree else rope
    runs = v.runs if tree or unshared else [i for owners in v.per_sequence for i in owners]
    row = batch.input_ids if tree or unshared else batch.input_ids[:, batch.expand]
    return torch.cat([positions[None], rope]), {"inputs_embeds": vision.image_embeddings(base, v, runs, row)}


def _token_inputs(input_ids: torch.Tensor, extra: dict[str, Any] | None) -> dict[str, Any]:
    """The row's tokens as the model takes them, with ``extra``: its ``input_ids``, or the
    ``inputs_embeds`` in ``extra`` that stand for them (a vision model's, images in), never both."""
    extra = extra or {}
    return dict(extra) if "inputs_embeds" in extra else {"input_ids": input_ids, **extra}


@functools.cache  # once per attention implementation
def _warn_unshared(impl: str) -> None:
    log.warning("attention %r cannot take a prefix-shared (tree) batch: each sequence runs its shared prefix "
                "again, as without optim.share_prefixes", impl)


def run_packed(base: Any, input_ids: torch.Tensor, position_ids: torch.Tensor, bounds: list[int],
               tree: list[torch.Tensor | None] | None = None,
               extra: dict[str, Any] | None = None) -> torch.Tensor:
    """``base`` over a packed row cut at ``bounds`` (each piece causal over itself, or per ``tree``);
    ``extra``: more keyword arguments for ``base`` (a vision model's ``inputs_embeds``, which then stand
    for ``input_ids``)."""
    config = base.config
    segments = [(a, b) for a, b in zip(bounds, bounds[1:], strict=False) if b > a]
    if not segments:
        return input_ids.new_zeros((0, config.get_text_config().hidden_size), dtype=base.dtype)
    device = input_ids.device
    cu = torch.tensor([0] + [b - a for a, b in segments], dtype=torch.int32, device=device).cumsum(0, dtype=torch.int32)
    longest = max(b - a for a, b in segments)
    # No KV cache: nothing is decoded after this forward (and a cache would disable packed detection).
    tokens = _token_inputs(input_ids, extra)
    varlen = {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": longest, "max_length_k": longest,
              "use_cache": False, **tokens}
    impl = config._attn_implementation
    if attention.of(impl).packed_rows:
        if one_call_attention(device):
            varlen[PATTERN_KWARG] = RowPattern.of([0, *itertools.accumulate(b - a for a, b in segments)], tree, device)
        elif tree is not None:
            varlen[TREE_KWARG] = tree
        # An all-ones mask: sdpa's mask function turns it into "no mask" and skips packed detection.
        out = base(position_ids=position_ids, attention_mask=torch.ones_like(input_ids), **varlen)
    elif "flash" in (impl or ""):
        out = base(position_ids=position_ids, **varlen)
    else:  # transformers detects the packing from position_ids and builds a block-diagonal mask
        out = base(position_ids=position_ids, use_cache=False, **tokens)
    return out.last_hidden_state[0]


def one_call_attention(device: torch.device) -> bool:
    """Whether a packed row's attention is one call per layer (:mod:`toolrl.modeling.packed_attention`)
    rather than one sdpa call per span. On CUDA: the loop's launches, not the GPU, bound the shared-prefix
    step (docs/gpu.md). On CPU the loop is faster: one call computes every (query, key) pair of the row,
    the loop only those within each span and its context (benchmarks/prefix_sharing.py --one-call)."""
    return device.type == "cuda"
