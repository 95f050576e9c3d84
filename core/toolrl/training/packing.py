"""Padding-free batches: a micro-batch's trajectories concatenated into one row, each with its own
``position_ids`` (0, 1, 2, ... from its first token) and causal attention confined to itself.

No compute or memory goes to padding. Each sequence is cut after the last position whose hidden state
predicts a trained token (later tokens cannot influence earlier positions under causal attention),
and the LM head runs only at the positions that predict trained tokens (``response_mask`` 1; tool
output and padding get none).

Attention over the packed row:

- flash-attention models (``flash_attention_2``/``3``, kernels): transformers' varlen path, given
  ``cu_seq_lens``.
- sdpa models (the default): the model's attention implementation is switched, once, to
  ``toolrl_varlen_sdpa``, which is sdpa itself for every ordinary call (same mask function, same
  kernel) and runs one causal sdpa per sequence when it is given ``cu_seq_lens``. The switch is
  permanent rather than scoped to the forward so that gradient checkpointing, which re-runs the
  forward inside backward, takes the same path.
- anything else (eager, flex): transformers' own packed-sequence detection from ``position_ids``
  (a block-diagonal mask).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from toolrl.rollout import Trajectory

VARLEN_SDPA = "toolrl_varlen_sdpa"


@dataclass
class PackedBatch:
    """A packed micro-batch. ``input_ids``/``position_ids`` are (1, T); sequence ``i`` occupies
    ``bounds[i]:bounds[i + 1]`` of the row (empty for a sequence with nothing to train). The LM head
    runs at the N positions ``head_pos``, predicting ``targets``, which land at ``(rows, cols)`` of the
    (B, R) response grid that the loss reads (``response_mask``, ``engine_logprobs``, B ``advantages``)."""

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

    def __len__(self) -> int:
        return self.response_mask.shape[0]

    @property
    def tokens(self) -> int:
        """Tokens the model runs on (no padding)."""
        return self.input_ids.shape[1]


def input_length(t: Trajectory) -> int:
    """Tokens of ``t`` a forward needs: up to, not including, its last trained token."""
    last = max((j for j, m in enumerate(t.response_mask) if m), default=None)
    return 0 if last is None else len(t.prompt_ids) + last


def build_batch(trajectories: Sequence[Trajectory], advantages: Sequence[float],
                device: torch.device | str = "cpu") -> PackedBatch:
    """Pack ``trajectories`` into one row (no padding, so no pad id)."""
    n = len(trajectories)
    rwidth = max(1, max(len(t.response_ids) for t in trajectories))
    ids: list[int] = []
    positions: list[int] = []
    bounds = [0]
    head_pos: list[int] = []
    targets: list[int] = []
    rows: list[int] = []
    cols: list[int] = []
    response_mask = torch.zeros((n, rwidth), dtype=torch.float32)
    engine_lp = torch.zeros((n, rwidth), dtype=torch.float32)
    for i, t in enumerate(trajectories):
        length = input_length(t)
        if length and not t.prompt_ids:
            raise ValueError(f"trajectory {t.trajectory_id!r} has an empty prompt: its first response token "
                             "has no position to be predicted from")
        start, p = bounds[-1], len(t.prompt_ids)
        ids.extend((t.prompt_ids + t.response_ids)[:length])
        positions.extend(range(length))
        bounds.append(start + length)
        for j, m in enumerate(t.response_mask):
            if m:  # response token j sits at p + j and is predicted by the hidden state at p + j - 1
                head_pos.append(start + p + j - 1)
                targets.append(t.response_ids[j])
                rows.append(i)
                cols.append(j)
        r = len(t.response_ids)
        response_mask[i, :r] = torch.tensor(t.response_mask, dtype=torch.float32)
        engine_lp[i, :r] = torch.tensor(t.logprobs, dtype=torch.float32)

    def long(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=device)

    return PackedBatch(long(ids)[None], long(positions)[None], bounds, long(head_pos), long(targets), long(rows),
                 long(cols), response_mask.to(device), engine_lp.to(device),
                 torch.tensor(list(advantages), dtype=torch.float32, device=device))


def packed_hidden_states(model: Any, batch: PackedBatch) -> torch.Tensor:
    """The base model's last hidden states over the packed row, (T, H)."""
    base = getattr(model, model.base_model_prefix)
    config = base.config
    segments = [(a, b) for a, b in zip(batch.bounds, batch.bounds[1:], strict=False) if b > a]
    if not segments:
        return batch.input_ids.new_zeros((0, config.hidden_size), dtype=base.dtype)
    device = batch.input_ids.device
    cu = torch.tensor([0] + [b - a for a, b in segments], dtype=torch.int32, device=device).cumsum(0, dtype=torch.int32)
    longest = max(b - a for a, b in segments)
    # No KV cache: nothing is decoded after this forward (and a cache would disable packed detection).
    varlen = {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": longest, "max_length_k": longest,
              "use_cache": False}
    impl = config._attn_implementation
    if impl == "sdpa":
        _install_varlen_sdpa(base)
        impl = VARLEN_SDPA
    if impl == VARLEN_SDPA:
        # An all-ones mask: sdpa's mask function turns it into "no mask" and skips packed detection.
        out = base(input_ids=batch.input_ids, position_ids=batch.position_ids,
                   attention_mask=torch.ones_like(batch.input_ids), **varlen)
    elif "flash" in (impl or ""):
        out = base(input_ids=batch.input_ids, position_ids=batch.position_ids, **varlen)
    else:  # transformers detects the packing from position_ids and builds a block-diagonal mask
        out = base(input_ids=batch.input_ids, position_ids=batch.position_ids, use_cache=False)
    return out.last_hidden_state[0]


def _varlen_sdpa(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 attention_mask: torch.Tensor | None, *, cu_seq_lens_q: torch.Tensor | None = None,
                 **kwargs: Any) -> tuple[torch.Tensor, None]:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if cu_seq_lens_q is None or attention_mask is not None or query.shape[0] != 1:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    for k in ("cu_seq_lens_k", "max_length_q", "max_length_k", "is_causal"):
        kwargs.pop(k, None)
    bounds = cu_seq_lens_q.tolist()
    outs = [sdpa_attention_forward(module, query[:, :, a:b], key[:, :, a:b], value[:, :, a:b], None,
                                   is_causal=True, **kwargs)[0]
            for a, b in zip(bounds, bounds[1:], strict=False)]
    return torch.cat(outs, dim=1), None


def _install_varlen_sdpa(base: Any) -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    if VARLEN_SDPA not in ALL_MASK_ATTENTION_FUNCTIONS:
        AttentionInterface.register(VARLEN_SDPA, _varlen_sdpa)
        ALL_MASK_ATTENTION_FUNCTIONS.register(VARLEN_SDPA, sdpa_mask)
    base.config._attn_implementation = VARLEN_SDPA
