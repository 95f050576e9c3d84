"""Sequence parallelism (DeepSpeed-Ulysses) across trainer ranks: ``trainer.sequence_parallel: N``.

Each rank of a group of N runs the model over its contiguous N-th of the group's packed row; each
attention layer is wrapped in two all-to-alls (:meth:`SequenceParallel.to_heads`, ``to_tokens``, around
:func:`toolrl.modeling.packed_attention.ulysses_sdpa`: all heads over the rank's tokens to H/N heads
over the whole row, and back); one differentiable sum over the group gives every
rank the micro-batch's whole log-prob grid, so any loss is computed as on one rank, and each rank
backpropagates 1/N of it. How each piece works, what is refused (:func:`check_sequence_parallel`) and
why: docs/long_context.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from toolrl.config import ConfigError, read_json
from toolrl.model_sources import text_config
from toolrl.modeling import attention
from toolrl.modeling.packed_attention import SP_KWARG
from toolrl.training.logprobs import token_logprobs
from toolrl.training.packing import PackedBatch, run_packed

if TYPE_CHECKING:
    from toolrl.config import Config


@dataclass(frozen=True)
class SequenceParallel:
    """This rank's sequence-parallel group: ``group`` (a process group of ``size`` ranks; None with one
    rank), this rank's place in it, and the data-parallel group it belongs to."""

    group: Any
    rank: int
    size: int
    dp_rank: int
    dp_size: int

    @property
    def lead(self) -> bool:
        """The group's first rank: the one that counts the loss's figures."""
        return self.rank == 0

    def to_heads(self, x: torch.Tensor) -> torch.Tensor:
        """(1, H, t, D) for this rank's t tokens → (1, H/N, N·t, D) for its heads over the whole row."""
        _, h, t, d = x.shape
        n = self.size
        out = _AllToAll.apply(x.reshape(n, h // n, t, d), self.group)  # chunk j: rank j's tokens, my heads
        return out.permute(1, 0, 2, 3).reshape(1, h // n, n * t, d)

    def to_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """(1, N·t, H/N, D), attention's output for this rank's heads → (1, t, H, D) for its own tokens."""
        _, length, h, d = x.shape
        n = self.size
        t = length // n
        out = _AllToAll.apply(x.reshape(n, t, h, d), self.group)  # chunk i: head group i over my tokens
        return out.permute(1, 0, 2, 3).reshape(1, t, n * h, d)


def new_groups(rank: int, world_size: int, size: int) -> SequenceParallel | None:
    """The sequence-parallel groups of ``world_size`` ranks, ``size`` consecutive ranks each (every
    rank creates every group, as ``torch.distributed.new_group`` requires); this rank's, or None for
    ``size`` 1."""
    import torch.distributed as dist

    if size == 1:
        return None
    if world_size % size:
        raise ValueError(f"sequence_parallel {size} does not divide world_size {world_size}")
    groups = [dist.new_group(list(range(first, first + size))) for first in range(0, world_size, size)]
    return SequenceParallel(groups[rank // size], rank % size, size, rank // size, world_size // size)


def check_sequence_parallel(config: Config, model_dir: str | Path) -> None:
    """What sequence parallelism cannot run with, refused before anything starts (one line each)."""
    n = config.trainer.sequence_parallel
    if n == 1:
        return
    field = f"trainer.sequence_parallel={n}"
    if config.critic is not None:
        raise ConfigError(f"{field}: not supported with a critic (critic.*): its value model is not split yet")
    if config.model.lora is not None:
        raise ConfigError(f"{field}: not supported with model.lora yet (the adapters' forward is not wrapped)")
    path = Path(model_dir) / "config.json"
    model = read_json(path, "model.source") if path.exists() else {}
    if "vision_config" in model:
        raise ConfigError(f"{field}: not supported for a vision-language model ({path}): the images' 3-D "
                          "positions and vision tower are not split across ranks")
    text = text_config(model)
    heads = text.get("num_attention_heads")
    if isinstance(heads, int) and heads % n:
        raise ConfigError(f"{field} must divide the model's attention heads ({heads}, num_attention_heads in {path})")
    impl = text.get("attn_implementation") or text.get("_attn_implementation")
    if impl not in (None, "sdpa"):
        raise ConfigError(f"{field}: needs sdpa attention; {path} asks for {impl!r}")


class _AllToAll(torch.autograd.Function):
    """``all_to_all_single`` over equal chunks of dim 0: chunk j goes to rank j. It is its own adjoint,
    so the backward is the same exchange of the gradient."""

    @staticmethod
    def forward(ctx, x, group):  # noqa: ANN001
        import torch.distributed as dist

        ctx.group = group
        x = x.contiguous()  # (empty_like keeps a view's strides; the exchange writes contiguously)
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        dist.all_to_all_single(out, x, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):  # noqa: ANN001
        return _AllToAll.apply(grad.contiguous(), ctx.group), None


class _AllReduce(torch.autograd.Function):
    """A sum over the group; each rank's input feeds every rank's output, so its gradient is the sum
    of every rank's output gradient."""

    @staticmethod
    def forward(ctx, x, group):  # noqa: ANN001
        import torch.distributed as dist

        ctx.group = group
        out = x.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):  # noqa: ANN001
        return _AllReduce.apply(grad.contiguous(), ctx.group), None


# ----------------------------------------------------------------- the split forward


def local_span(tokens: int, sp: SequenceParallel) -> tuple[int, int]:
    """This rank's positions [lo, hi) of a row of ``tokens`` padded to a multiple of N."""
    per_rank = math.ceil(tokens / sp.size)
    return sp.rank * per_rank, (sp.rank + 1) * per_rank


def local_hidden_states(model: Any, batch: PackedBatch, sp: SequenceParallel) -> torch.Tensor:
    """The base model's last hidden states at this rank's positions of the row, (hi - lo, H). The
    padding is one more span of its own (positions from 0) whose states nobody reads."""
    if batch.vision is not None:
        raise ValueError("trainer.sequence_parallel: a batch with images cannot be split across ranks")
    base = getattr(model, model.base_model_prefix)
    # The loaded model can be split: sdpa attention (what the wrapper is around), heads divisible.
    impl, heads = base.config._attn_implementation, base.config.num_attention_heads
    if not attention.of(impl).sdpa:
        raise ValueError(f"trainer.sequence_parallel={sp.size}: needs sdpa attention; the model runs "
                         f"{impl!r}")
    if heads % sp.size:
        raise ValueError(f"trainer.sequence_parallel={sp.size} must divide the model's attention heads "
                         f"({heads})")
    attention.install(base, attention.ULYSSES_SDPA)
    lo, hi = local_span(batch.tokens, sp)
    pad = sp.size * (hi - lo) - batch.tokens
    ids, positions, bounds, tree = batch.input_ids, batch.position_ids, list(batch.bounds), batch.attention
    if pad:
        ids = torch.cat([ids, ids.new_zeros((1, pad))], dim=1)
        positions = torch.cat([positions, torch.arange(pad, device=ids.device)[None]], dim=1)
        bounds.append(batch.tokens + pad)
        tree = None if tree is None else [*tree, None]
    # Every rank passes the whole row's span edges (attention runs over the whole row) and its own tokens.
    return run_packed(base, ids[:, lo:hi], positions[:, lo:hi], bounds, tree, {SP_KWARG: sp})


def split_response_logprobs(model: Any, batch: PackedBatch, sp: SequenceParallel,
                            temperature: float, chunk_size: int) -> torch.Tensor:
    """:func:`toolrl.training.step.response_logprobs` with the row split over ``sp``'s ranks: each rank
    runs the LM head at its own trained positions; the sum over the group gives every rank the (B, R)
    grid of the whole micro-batch."""
    hidden = local_hidden_states(model, batch, sp)
    lo, hi = local_span(batch.tokens, sp)
    mine = (batch.head_pos >= lo) & (batch.head_pos < hi)
    lp = token_logprobs(hidden[batch.head_pos[mine] - lo], model.get_output_embeddings(), batch.targets[mine],
                        temperature, chunk_size)
    grid = batch.response_mask.new_zeros(batch.response_mask.shape).index_put((batch.rows[mine], batch.cols[mine]), lp)
    return _AllReduce.apply(grid, sp.group)


__all__ = ["SequenceParallel", "check_sequence_parallel", "local_span", "new_groups", "split_response_logprobs"]
