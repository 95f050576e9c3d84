"""Token log-probabilities through the LM head in chunks of positions.

The naive way (``log_softmax(hidden @ W.T)`` then gather) keeps an fp32 (tokens × vocabulary) logits
tensor alive for backward: with a 152k vocabulary that is 0.6 MB per token, gigabytes for a few
thousand response tokens, and every elementwise pass over it is a pass over gigabytes. Here the
forward keeps only each position's log-sum-exp, and the backward recomputes one chunk of logits at a
time into the same buffer, so the head never holds more than ``chunk_size × vocabulary`` logits.

Both directions work in place on one reused buffer (fresh multi-hundred-megabyte allocations cost
page faults on every use). The backward folds the upstream gradient into the exponent: with
``p = softmax(z)``, ``d lp / d z = onehot(target) - p``, and ``g · p = sign(g) · exp(z - lse + log|g|)``,
so one matmul-with-offset and one ``exp`` give the whole softmax term; the one-hot term is a row
gather and a scatter. Values and gradients are the naive computation's, up to float rounding.
"""

from __future__ import annotations

import torch

from toolrl.config import DEFAULT_LOGPROB_CHUNK


def _logits_into(out: torch.Tensor, h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                 inv_t: float, offset: torch.Tensor | None = None) -> torch.Tensor:
    """``out[:n] = fp32(h @ W.T + b) / T + offset[:, None]`` for ``n = len(h)``, without temporaries
    for an fp32 head without bias."""
    z = out[: h.shape[0]]
    if weight.dtype == torch.float32 and bias is None:
        hs = h * inv_t if inv_t != 1.0 else h
        if offset is None:
            torch.mm(hs, weight.t(), out=z)
        else:
            torch.addmm(offset[:, None], hs, weight.t(), out=z)
        return z
    z.copy_(torch.nn.functional.linear(h, weight, bias))  # the half-precision head's logits, cast to fp32
    if inv_t != 1.0:
        z.mul_(inv_t)
    if offset is not None:
        z.add_(offset[:, None])
    return z


class _ChunkedLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, weight, bias, targets, inv_t, chunk_size):  # noqa: ANN001
        n, vocab = h.shape[0], weight.shape[0]
        lp = torch.empty(n, dtype=torch.float32, device=h.device)
        lse = torch.empty(n, dtype=torch.float32, device=h.device)
        buf = torch.empty((min(chunk_size, n), vocab), dtype=torch.float32, device=h.device)
        for a in range(0, n, chunk_size):
            b = min(a + chunk_size, n)
            z = _logits_into(buf, h[a:b], weight, bias, inv_t)
            picked = z.gather(1, targets[a:b, None]).squeeze(1)
            top = z.amax(1)
            lse[a:b] = top + z.sub_(top[:, None]).exp_().sum(1).log_()
            lp[a:b] = picked - lse[a:b]
        ctx.save_for_backward(h, weight, bias, targets, lse)
        ctx.inv_t, ctx.chunk_size = inv_t, chunk_size
        return lp

    @staticmethod
    def backward(ctx, grad_lp):  # noqa: ANN001
        h, weight, bias, targets, lse = ctx.saved_tensors
        inv_t, chunk_size = ctx.inv_t, ctx.chunk_size
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        n = h.shape[0]
        g = grad_lp.float()
        onehot_coef = g * inv_t  # d loss / d z = (g / T) · (onehot - p)
        soft_coef = g.sign() * inv_t
        offset = g.abs().log() - lse  # exp(z + offset) = |g| · p; rows with g = 0 give exactly 0
        grad_h = torch.empty_like(h) if need_h else None
        # Weight/bias gradients accumulate over chunks in fp32 (one fp32 copy of the head at most).
        grad_w = torch.zeros_like(weight, dtype=torch.float32) if need_w else None
        grad_b = torch.zeros_like(bias, dtype=torch.float32) if need_b else None
        buf = torch.empty((min(chunk_size, n), weight.shape[0]), dtype=torch.float32, device=h.device)
        for a in range(0, n, chunk_size):
            b = min(a + chunk_size, n)
            y, hc = targets[a:b], h[a:b]
            gp = _logits_into(buf, hc, weight, bias, inv_t, offset[a:b]).exp_()  # |g| · p
            gpw = gp if weight.dtype == torch.float32 else gp.to(weight.dtype)
            if need_h:
                grad_h[a:b] = (onehot_coef[a:b, None] * weight[y].float()
                               - soft_coef[a:b, None] * (gpw @ weight).float()).to(h.dtype)
            if need_w:
                grad_w.index_add_(0, y, onehot_coef[a:b, None] * hc.float())
                scaled = (soft_coef[a:b, None] * hc.float()).to(gpw.dtype)
                if gpw.dtype == torch.float32:
                    grad_w.addmm_(gpw.t(), scaled, alpha=-1.0)
                else:
                    grad_w.sub_(gpw.t() @ scaled)
            if need_b:
                grad_b.index_add_(0, y, onehot_coef[a:b])
                grad_b.sub_(soft_coef[a:b] @ gp)
        return (grad_h, None if grad_w is None else grad_w.to(weight.dtype),
                None if grad_b is None else grad_b.to(bias.dtype), None, None, None)


def token_logprobs(hidden: torch.Tensor, head: torch.nn.Module, targets: torch.Tensor, temperature: float = 1.0,
                   chunk_size: int = DEFAULT_LOGPROB_CHUNK) -> torch.Tensor:
    """``log softmax(head(hidden) / T)[target]`` for each row of ``hidden`` (N, H): fp32, (N,).
    Temperature 0 means greedy sampling, whose logprobs the engine reports at T = 1."""
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    inv_t = 1.0 / temperature if temperature > 0 else 1.0
    return _ChunkedLogprobs.apply(hidden, head.weight, getattr(head, "bias", None), targets, inv_t, chunk_size)
