"""Token log-probabilities through the LM head in chunks of positions.

The naive way (``log_softmax(hidden @ W.T)`` then gather) keeps an fp32 (tokens × vocabulary) logits
tensor alive for backward: with a 152k vocabulary that is 0.6 MB per token, gigabytes for a few
thousand response tokens. Here the forward keeps only the per-token log-sum-exp; the backward
recomputes each chunk's logits and turns them into gradients right away, so the head never holds more
than ``chunk_size × vocabulary`` logits at once. The values and gradients are those of the naive
computation (same fp32 logits, same temperature scaling), up to float summation order.
"""

from __future__ import annotations

import torch

from toolrl.config import DEFAULT_LOGPROB_CHUNK


def _chunk_logits(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  temperature: float) -> torch.Tensor:
    # Same order of operations as ``lm_head(h).float() / T``, so values match the naive path bit for bit.
    logits = torch.nn.functional.linear(h, weight, bias).float()
    if temperature != 1.0:
        logits.div_(temperature)
    return logits


class _ChunkedLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, weight, bias, targets, temperature, chunk_size, with_entropy):  # noqa: ANN001
        n = h.shape[0]
        lp = torch.empty(n, dtype=torch.float32, device=h.device)
        lse = torch.empty(n, dtype=torch.float32, device=h.device)
        entropy = torch.empty(n if with_entropy else 0, dtype=torch.float32, device=h.device)
        for a in range(0, n, chunk_size):
            b = min(a + chunk_size, n)
            logits = _chunk_logits(h[a:b], weight, bias, temperature)
            lse[a:b] = torch.logsumexp(logits, dim=-1)
            lp[a:b] = logits.gather(1, targets[a:b, None]).squeeze(1) - lse[a:b]
            if with_entropy:  # H = lse - sum(p * logits), reported only (no gradient)
                p = torch.exp(logits - lse[a:b, None])
                entropy[a:b] = lse[a:b] - (p * logits).sum(-1)
        ctx.save_for_backward(h, weight, bias, targets, lse)
        ctx.temperature, ctx.chunk_size = temperature, chunk_size
        ctx.mark_non_differentiable(entropy)
        return lp, entropy

    @staticmethod
    def backward(ctx, grad_lp, _grad_entropy):  # noqa: ANN001
        h, weight, bias, targets, lse = ctx.saved_tensors
        temperature, chunk_size = ctx.temperature, ctx.chunk_size
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_h = torch.empty_like(h) if need_h else None
        # Accumulate weight/bias gradients over chunks in fp32 (one fp32 copy of the head at most).
        grad_w = torch.zeros_like(weight, dtype=torch.float32) if need_w else None
        grad_b = torch.zeros_like(bias, dtype=torch.float32) if need_b else None
        for a in range(0, h.shape[0], chunk_size):
            b = min(a + chunk_size, h.shape[0])
            g = grad_lp[a:b].float()
            # d lp / d logits = onehot(target) - softmax; times the upstream gradient and d logits / d z = 1/T.
            dz = _chunk_logits(h[a:b], weight, bias, temperature)
            dz.sub_(lse[a:b, None]).exp_().mul_(-g[:, None])
            dz.scatter_add_(1, targets[a:b, None], g[:, None])
            if temperature != 1.0:
                dz.div_(temperature)
            dz = dz.to(weight.dtype)
            if need_h:
                grad_h[a:b] = dz @ weight
            if need_w and grad_w.dtype == dz.dtype:
                grad_w.addmm_(dz.t(), h[a:b])
            elif need_w:  # half-precision head: this chunk's product as the naive path has it, summed in fp32
                grad_w += dz.t() @ h[a:b]
            if need_b:
                grad_b += dz.float().sum(0)
        return (grad_h, None if grad_w is None else grad_w.to(weight.dtype),
                None if grad_b is None else grad_b.to(bias.dtype), None, None, None, None)


def token_logprobs(hidden: torch.Tensor, head: torch.nn.Module, targets: torch.Tensor, temperature: float = 1.0,
                   chunk_size: int = DEFAULT_LOGPROB_CHUNK, with_entropy: bool = False
                   ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``log softmax(head(hidden) / T)[target]`` for each row of ``hidden`` (N, H), fp32, (N,); and the
    entropy of each row's distribution (no gradient) when ``with_entropy``. Temperature 0 means greedy
    sampling, whose logprobs the engine reports at T = 1."""
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    t = temperature if temperature > 0 else 1.0
    lp, entropy = _ChunkedLogprobs.apply(hidden, head.weight, getattr(head, "bias", None), targets, float(t),
                                         chunk_size, with_entropy)
    return lp, entropy if with_entropy else None
