"""DeepSpeed-Ulysses attention (``toolrl_ulysses_sdpa`` in :mod:`toolrl.modeling.attention`): a rank
holding its contiguous N-th of a packed row's tokens runs its attention layer for H/N heads over the whole
row, between two all-to-alls (all heads over the rank's tokens to H/N heads over the row, and back). The
groups, the split forward and what is refused: :mod:`toolrl.training.sequence_parallel`,
docs/long_context.md.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from toolrl.modeling.packed_attention import varlen_sdpa

SP_KWARG = "toolrl_sp"  # the keyword that carries the group through the model to ulysses_attention


class UlyssesGroup(Protocol):
    """What the attention reads of a rank's sequence-parallel group
    (:class:`toolrl.training.sequence_parallel.SequenceParallel`): its process group and its size."""

    @property
    def group(self) -> Any: ...

    @property
    def size(self) -> int: ...


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


def seq_to_heads(x: torch.Tensor, sp: UlyssesGroup) -> torch.Tensor:
    """(1, H, t, D) for this rank's t tokens → (1, H/N, N·t, D) for its heads over the whole row."""
    _, h, t, d = x.shape
    n = sp.size
    out = _AllToAll.apply(x.reshape(n, h // n, t, d), sp.group)  # chunk j: rank j's tokens, my heads
    return out.permute(1, 0, 2, 3).reshape(1, h // n, n * t, d)


def heads_to_seq(x: torch.Tensor, sp: UlyssesGroup) -> torch.Tensor:
    """(1, N·t, H/N, D), attention's output for this rank's heads → (1, t, H, D) for its own tokens."""
    _, length, h, d = x.shape
    n = sp.size
    t = length // n
    out = _AllToAll.apply(x.reshape(n, t, h, d), sp.group)  # chunk i: head group i over my tokens
    return out.permute(1, 0, 2, 3).reshape(1, t, n * h, d)


class _HeadGroups:
    """``module`` as attention sees it after key/value heads were repeated: one query head per key
    head (``num_key_value_groups`` 1), everything else the module's own."""

    def __init__(self, module: Any, groups: int) -> None:
        self._module = module
        self.num_key_value_groups = groups

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)


def ulysses_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, *, toolrl_sp: UlyssesGroup | None = None,
                      **kwargs: Any) -> tuple[torch.Tensor, None]:
    """The packed row's attention (:func:`toolrl.modeling.packed_attention.varlen_sdpa`) for H/N heads over the
    whole row, between the two all-to-alls; without a group, that function itself."""
    if toolrl_sp is None:
        return varlen_sdpa(module, query, key, value, attention_mask, **kwargs)
    n, heads, kv_heads = toolrl_sp.size, query.shape[1], key.shape[1]
    groups = heads // kv_heads
    if kv_heads % n:  # too few key/value heads to split: each query head gets its own copy
        key, value = (x.repeat_interleave(groups, dim=1) for x in (key, value))
        groups = 1
    q, k, v = (seq_to_heads(x, toolrl_sp) for x in (query, key, value))
    out, _ = varlen_sdpa(_HeadGroups(module, groups), q, k, v, None, **kwargs)
    return heads_to_seq(out, toolrl_sp), None
