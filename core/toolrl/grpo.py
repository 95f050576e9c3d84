"""GRPO, top to bottom: group-normalised advantages, logprobs at response positions only, the
clipped token-level loss over ``response_mask``, gradient accumulation, clipping, the optimizer step.

Loss aggregation modes (``algorithm.loss_agg``), each normalised over the whole mini-batch so that
gradient accumulation over micro-batches gives exactly the full-batch gradient:

- ``token-mean``: sum of per-token losses / number of trained tokens in the mini-batch (DAPO).
- ``seq-mean-token-mean``: mean over each sequence's trained tokens, then mean over sequences
  (the original GRPO; long responses weigh less per token).
- ``seq-mean-token-sum-norm``: per-sequence token sum / ``max_response_tokens``, mean over sequences
  (Dr. GRPO; no length bias).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from toolrl.config import AlgorithmConfig, OptimConfig
from toolrl.rollout import Trajectory


def group_advantages(rewards: Sequence[float], groups: Sequence[int], norm_by_std: bool = True,
                     eps: float = 1e-6) -> list[float]:
    """(r - mean of its group) / (std of its group + eps); a group of one gets 0."""
    by_group: dict[int, list[float]] = {}
    for r, g in zip(rewards, groups, strict=True):
        by_group.setdefault(g, []).append(r)
    stats = {}
    for g, rs in by_group.items():
        mean = sum(rs) / len(rs)
        std = math.sqrt(sum((r - mean) ** 2 for r in rs) / (len(rs) - 1)) if len(rs) > 1 else 0.0
        stats[g] = (mean, std)
    out = []
    for r, g in zip(rewards, groups, strict=True):
        mean, std = stats[g]
        if len(by_group[g]) == 1:
            out.append(0.0)
        else:
            out.append((r - mean) / (std + eps) if norm_by_std else r - mean)
    return out


@dataclass
class Batch:
    """Trajectories as tensors: ``input_ids`` is prompt + response, right-padded; response tensors
    are (B, R) aligned to each sequence's response start."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    prompt_lens: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    engine_logprobs: torch.Tensor
    advantages: torch.Tensor

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def select(self, idx: slice | torch.Tensor) -> Batch:
        sub = Batch(**{k: v[idx] for k, v in self.__dict__.items()})
        # Trim padding columns the sub-batch does not need.
        width = int(sub.attention_mask.sum(1).max())
        rwidth = max(int(sub.response_ids.ne(-1).sum(1).max()), 1)
        sub.input_ids, sub.attention_mask = sub.input_ids[:, :width], sub.attention_mask[:, :width]
        for k in ("response_ids", "response_mask", "engine_logprobs"):
            setattr(sub, k, getattr(sub, k)[:, :rwidth])
        return sub


def build_batch(trajectories: Sequence[Trajectory], advantages: Sequence[float], pad_id: int,
                device: torch.device | str = "cpu") -> Batch:
    n = len(trajectories)
    width = max(len(t.prompt_ids) + len(t.response_ids) for t in trajectories)
    rwidth = max(len(t.response_ids) for t in trajectories)
    input_ids = torch.full((n, width), pad_id, dtype=torch.long)
    attention = torch.zeros((n, width), dtype=torch.long)
    response_ids = torch.full((n, rwidth), -1, dtype=torch.long)
    response_mask = torch.zeros((n, rwidth), dtype=torch.float32)
    engine_lp = torch.zeros((n, rwidth), dtype=torch.float32)
    for i, t in enumerate(trajectories):
        seq = t.prompt_ids + t.response_ids
        input_ids[i, : len(seq)] = torch.tensor(seq)
        attention[i, : len(seq)] = 1
        r = len(t.response_ids)
        response_ids[i, :r] = torch.tensor(t.response_ids)
        response_mask[i, :r] = torch.tensor(t.response_mask, dtype=torch.float32)
        engine_lp[i, :r] = torch.tensor(t.logprobs, dtype=torch.float32)
    prompt_lens = torch.tensor([len(t.prompt_ids) for t in trajectories])
    return Batch(input_ids.to(device), attention.to(device), prompt_lens.to(device), response_ids.to(device),
                 response_mask.to(device), engine_lp.to(device),
                 torch.tensor(list(advantages), dtype=torch.float32, device=device))


def response_logprobs(model: Any, batch: Batch, temperature: float = 1.0) -> torch.Tensor:
    """Logprobs of each response token, (B, R). The LM head runs only at response positions: on
    tool-schema prompts that is most of the sequence, and the vocabulary projection dominates."""
    base = getattr(model, model.base_model_prefix)
    hidden = base(input_ids=batch.input_ids, attention_mask=batch.attention_mask).last_hidden_state
    rwidth = batch.response_ids.shape[1]
    # Position p predicts token p + 1: response token j of row i is predicted at prompt_len + j - 1.
    pos = batch.prompt_lens[:, None] - 1 + torch.arange(rwidth, device=hidden.device)[None, :]
    pos = pos.clamp(max=hidden.shape[1] - 1)
    h = hidden.gather(1, pos[..., None].expand(-1, -1, hidden.shape[-1]))
    logits = model.get_output_embeddings()(h).float()
    if temperature > 0 and temperature != 1.0:  # skip a full copy of the logits at T = 1
        logits = logits / temperature
    targets = batch.response_ids.clamp(min=0)
    picked = logits.gather(-1, targets[..., None]).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, mode: str, norm: dict[str, float]) -> torch.Tensor:
    if mode == "token-mean":
        return (per_token * mask).sum() / max(norm["tokens"], 1.0)
    if mode == "seq-mean-token-mean":
        return ((per_token * mask).sum(1) / mask.sum(1).clamp(min=1)).sum() / max(norm["seqs"], 1.0)
    if mode == "seq-mean-token-sum-norm":
        return (per_token * mask).sum() / (norm["max_len"] * max(norm["seqs"], 1.0))
    raise ValueError(f"unknown loss_agg {mode!r}")


def policy_loss(new_lp: torch.Tensor, old_lp: torch.Tensor, batch: Batch, cfg: AlgorithmConfig,
                norm: dict[str, float], ref_lp: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
    mask, adv = batch.response_mask, batch.advantages[:, None]
    ratio = torch.exp(new_lp - old_lp)
    clipped = torch.clamp(ratio, 1 - cfg.clip_eps_low, 1 + cfg.clip_eps_high)
    per_token = torch.maximum(-adv * ratio, -adv * clipped)
    if cfg.tis_cap is not None:  # correct for the engine sampling from slightly different logprobs
        per_token = per_token * torch.exp(old_lp - batch.engine_logprobs).clamp(max=cfg.tis_cap).detach()
    stats = {"clip_frac": float(((ratio != clipped).float() * mask).sum() / mask.sum().clamp(min=1))}
    if ref_lp is not None and cfg.kl_coef > 0:
        delta = ref_lp - new_lp
        kl = torch.exp(delta) - delta - 1  # k3: unbiased, non-negative
        per_token = per_token + cfg.kl_coef * kl
        stats["kl"] = float((kl.detach() * mask).sum() / mask.sum().clamp(min=1))
    return aggregate(per_token, mask, cfg.loss_agg, norm), stats


def grpo_step(model: Any, optimizer: torch.optim.Optimizer, trajectories: Sequence[Trajectory],
              algo: AlgorithmConfig, optim: OptimConfig, *, pad_id: int, temperature: float,
              max_response_tokens: int, ref_model: Any = None) -> dict[str, float]:
    """One GRPO update on a rollout batch; returns metrics."""
    device = next(model.parameters()).device
    advantages = group_advantages([t.reward for t in trajectories], [t.group for t in trajectories],
                                  algo.norm_adv_by_std)
    usable = [i for i, t in enumerate(trajectories) if any(t.response_mask)]
    if not usable:
        return {"loss": 0.0, "grad_norm": 0.0, "trained_tokens": 0.0}
    batch = build_batch([trajectories[i] for i in usable], [advantages[i] for i in usable], pad_id, device)
    single_update = algo.ppo_epochs == 1 and algo.mini_batches == 1

    def forward_all(m: Any) -> torch.Tensor:
        width = batch.response_ids.shape[1]
        with torch.no_grad():
            return torch.cat([
                _pad_cols(response_logprobs(m, batch.select(slice(i, i + optim.micro_batch_size)), temperature), width)
                for i in range(0, len(batch), optim.micro_batch_size)
            ])

    # Old logprobs: with one update per batch the policy has not moved, so old == new.detach() exactly
    # and a separate no-grad pass would be wasted; otherwise the trainer recomputes them first.
    old_all = None if single_update else forward_all(model)
    ref_all = forward_all(ref_model) if ref_model is not None and algo.kl_coef > 0 else None

    model.train()
    metrics: dict[str, list[float]] = {"loss": [], "grad_norm": [], "clip_frac": [], "kl": [], "lp_mismatch": []}
    order = torch.arange(len(batch))
    for _ in range(algo.ppo_epochs):
        for mb in order.chunk(algo.mini_batches):
            sub = batch.select(mb)
            norm = {"tokens": float(sub.response_mask.sum()), "seqs": float(len(sub)),
                    "max_len": float(max_response_tokens)}
            optimizer.zero_grad(set_to_none=True)
            total = 0.0
            for micro in mb.split(optim.micro_batch_size):
                mbatch = batch.select(micro)
                new_lp = response_logprobs(model, mbatch, temperature)
                old_lp = new_lp.detach() if old_all is None else old_all[micro][:, : new_lp.shape[1]]
                ref_lp = None if ref_all is None else ref_all[micro][:, : new_lp.shape[1]]
                loss, stats = policy_loss(new_lp, old_lp, mbatch, algo, norm, ref_lp)
                loss.backward()
                total += float(loss.detach())
                m = mbatch.response_mask
                metrics["lp_mismatch"].append(
                    float(((new_lp.detach() - mbatch.engine_logprobs).abs() * m).sum() / m.sum().clamp(min=1)))
                metrics["clip_frac"].append(stats["clip_frac"])
                if "kl" in stats:
                    metrics["kl"].append(stats["kl"])
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), optim.grad_clip)
            optimizer.step()
            metrics["loss"].append(total)
            metrics["grad_norm"].append(float(grad_norm))
    optimizer.zero_grad(set_to_none=True)
    out = {k: sum(v) / len(v) for k, v in metrics.items() if v}
    out["trained_tokens"] = float(batch.response_mask.sum())
    out["advantage_abs_mean"] = float(batch.advantages.abs().mean())
    return out


def _pad_cols(t: torch.Tensor, width: int) -> torch.Tensor:
    return torch.nn.functional.pad(t, (0, width - t.shape[1]))
