"""GRPO on one rank of N, until :func:`toolrl.grpo.grpo_step` takes ``rank`` and ``world_size`` itself.

Every rank gets the whole batch. Advantages and the loss normalisers (trained tokens, sequences) are
computed over the whole mini-batch, each rank trains a contiguous, token-balanced share of it, and
FSDP sums the ranks' gradients (:func:`toolrl.sharding.shard`): the sum equals the one-rank gradient,
so ``grad_norm`` and the update match one rank's. Every rank runs the same number of micro-steps
(FSDP gathers parameters collectively in each forward); a rank out of rows runs a zero-weighted one.

Supported here: one update per batch (``ppo_epochs=1``, ``mini_batches=1``) and no KL term; the
trainer rejects other settings for ``world_size > 1``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from toolrl.config import AlgorithmConfig, OptimConfig
from toolrl.grpo import build_batch, group_advantages, policy_loss
from toolrl.rollout import Trajectory


def token_balanced_split(tokens: Sequence[float], parts: int) -> list[range]:
    """Contiguous row ranges, one per part, cut where the running token count crosses k/parts."""
    total = sum(tokens) or 1.0
    bounds, running, k = [0], 0.0, 1
    for i, t in enumerate(tokens):
        running += t
        while k < parts and running >= total * k / parts:
            bounds.append(i + 1)
            k += 1
    bounds += [len(tokens)] * (parts + 1 - len(bounds))
    return [range(bounds[i], bounds[i + 1]) for i in range(parts)]


def grpo_step(model: Any, optimizer: torch.optim.Optimizer, trajectories: Sequence[Trajectory],
              algo: AlgorithmConfig, optim: OptimConfig, *, pad_id: int, temperature: float,
              max_response_tokens: int, ref_model: Any = None, rank: int = 0, world_size: int = 1) -> dict[str, float]:
    """``model``: the FSDP root (:class:`toolrl.sharding.Policy`). Returns the same metrics on every rank."""
    import torch.distributed as dist

    if algo.ppo_epochs != 1 or algo.mini_batches != 1 or (ref_model is not None and algo.kl_coef > 0):
        raise ValueError("world_size > 1 supports ppo_epochs=1, mini_batches=1 and kl_coef=0")
    device = next(model.parameters()).device
    advantages = group_advantages([t.reward for t in trajectories], [t.group for t in trajectories],
                                  algo.norm_adv_by_std)
    usable = [i for i, t in enumerate(trajectories) if any(t.response_mask)]
    if not usable:
        return {"loss": 0.0, "grad_norm": 0.0, "trained_tokens": 0.0}
    batch = build_batch([trajectories[i] for i in usable], [advantages[i] for i in usable], pad_id, device)
    norm = {"tokens": float(batch.response_mask.sum()), "seqs": float(len(batch)),
            "max_len": float(max_response_tokens)}
    shares = token_balanced_split(batch.response_mask.sum(1).tolist(), world_size)
    mine = torch.tensor(list(shares[rank]), dtype=torch.long)
    micro_steps = max(-(-len(s) // optim.micro_batch_size) for s in shares)

    model.train()
    optimizer.zero_grad(set_to_none=True)
    sums = torch.zeros(4, dtype=torch.float64)  # loss, lp_mismatch·tokens, clip_frac·tokens, tokens
    for k in range(micro_steps):
        rows = mine[k * optim.micro_batch_size:(k + 1) * optim.micro_batch_size]
        weight = 1.0 if len(rows) else 0.0
        mbatch = batch.select(rows if len(rows) else torch.tensor([0]))
        new_lp = model(mbatch, temperature)
        loss, stats = policy_loss(new_lp, new_lp.detach(), mbatch, algo, norm)
        (loss * weight).backward()
        m = mbatch.response_mask * weight
        tokens = float(m.sum())
        sums += torch.tensor([float(loss.detach()) * weight,
                              float(((new_lp.detach() - mbatch.engine_logprobs).abs() * m).sum()),
                              stats["clip_frac"] * tokens, tokens], dtype=torch.float64)
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), optim.grad_clip)
    if hasattr(grad_norm, "full_tensor"):
        grad_norm = grad_norm.full_tensor()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    dist.all_reduce(sums)
    loss_sum, mismatch, clip, tokens = sums.tolist()
    return {"loss": loss_sum, "grad_norm": float(grad_norm), "clip_frac": clip / max(tokens, 1.0),
            "lp_mismatch": mismatch / max(tokens, 1.0), "trained_tokens": norm["tokens"],
            "advantage_abs_mean": float(batch.advantages.abs().mean())}
