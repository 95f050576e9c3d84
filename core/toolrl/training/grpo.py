"""GRPO, top to bottom: group-normalised advantages, logprobs at trained positions only (packed
rows, chunked LM head), the clipped token-level loss over ``response_mask``, gradient accumulation,
clipping, the optimizer step.

Loss aggregation modes (``algorithm.loss_agg``), each normalised over the whole mini-batch so that
gradient accumulation over micro-batches gives exactly the full-batch gradient:

- ``token-mean``: sum of per-token losses / number of trained tokens in the mini-batch (DAPO).
- ``seq-mean-token-mean``: mean over each sequence's trained tokens, then mean over sequences
  (the original GRPO; long responses weigh less per token).
- ``seq-mean-token-sum-norm``: per-sequence token sum / ``max_response_tokens``, mean over sequences
  (Dr. GRPO; no length bias).

The objective is the decoupled PPO objective (Hilton et al. 2021; AReaL, Fu et al. 2025), per trained
token, with three policies: the behaviour policy that sampled the token (the engine's logprob,
``PackedBatch.engine_logprobs``; possibly some updates stale under ``trainer.max_staleness``), the proximal
policy (the trainer's weights before this step's first update: recomputed without gradient, or simply
``new.detach()`` when the step makes one update) and the policy being trained::

    r = π_θ / π_prox                      (the PPO ratio, against the proximal policy, not the behaviour one)
    w = min(π_prox / π_behav, tis_cap)    (the truncated importance weight, no gradient)
    loss = -w · min(r · A, clip(r, 1 - clip_eps_low, 1 + clip_eps_high) · A)

so the trust region is centred on recent weights however stale the sample, and the weight corrects for
the sample coming from another policy. ``algorithm.tis_cap`` None leaves ``w`` out (``w = 1``: the
on-policy PPO loss); an asynchronous run gets ``toolrl.config.ASYNC_TIS_CAP`` when it sets none.
Per step, over trained tokens: ``clip_frac`` (share with ``r`` outside the clip range),
``is_weight_mean``/``_max``/``_min`` (of ``π_prox / π_behav`` before truncation) and
``is_truncated_frac`` (share above the cap).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import torch

from toolrl.config import DEFAULT_LOGPROB_CHUNK, AlgorithmConfig, OptimConfig
from toolrl.rollout import Trajectory
from toolrl.training.logprobs import token_logprobs
from toolrl.training.microbatch import plan
from toolrl.training.packing import PackedBatch, build_batch, input_length, packed_hidden_states
from toolrl.training.peakmem import PeakMemory

__all__ = ["Policy", "aggregate", "build_batch", "group_advantages", "grpo_step", "policy_loss",
           "response_logprobs"]


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


def response_logprobs(model: Any, batch: PackedBatch, temperature: float = 1.0,
                      chunk_size: int = DEFAULT_LOGPROB_CHUNK) -> torch.Tensor:
    """Logprobs of each trained response token, (B, R), 0 at untrained positions (tool output,
    padding). The LM head runs only at the positions that predict trained tokens, in chunks."""
    hidden = packed_hidden_states(model, batch)[batch.head_pos]
    lp = token_logprobs(hidden, model.get_output_embeddings(), batch.targets, temperature, chunk_size)
    return batch.response_mask.new_zeros(batch.response_mask.shape).index_put((batch.rows, batch.cols), lp)


class Policy(torch.nn.Module):
    """The causal LM ``lm`` with the loss's forward: ``forward(batch, temperature, chunk_size)`` gives
    :func:`response_logprobs`. Under FSDP2 it is the root unit (:mod:`toolrl.training.sharding`): the log-probs
    read the base model and the LM head separately, and only a forward through the root gathers the
    root's parameters (embeddings, final norm, head) for them."""

    def __init__(self, lm: Any) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, batch: PackedBatch, temperature: float = 1.0, chunk_size: int = DEFAULT_LOGPROB_CHUNK) -> torch.Tensor:
        return response_logprobs(self.lm, batch, temperature, chunk_size)


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, mode: str, norm: dict[str, float]) -> torch.Tensor:
    if mode == "token-mean":
        return (per_token * mask).sum() / max(norm["tokens"], 1.0)
    if mode == "seq-mean-token-mean":
        return ((per_token * mask).sum(1) / mask.sum(1).clamp(min=1)).sum() / max(norm["seqs"], 1.0)
    if mode == "seq-mean-token-sum-norm":
        return (per_token * mask).sum() / (norm["max_len"] * max(norm["seqs"], 1.0))
    raise ValueError(f"unknown loss_agg {mode!r}")


def policy_loss(new_lp: torch.Tensor, prox_lp: torch.Tensor, batch: PackedBatch, cfg: AlgorithmConfig,
                norm: dict[str, float], ref_lp: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """The decoupled PPO loss of one micro-batch (module docstring) and its figures over trained
    tokens, for :func:`grpo_step` to turn into token means: ``tokens``, ``clipped``, ``is_weight_sum``,
    ``is_weight_max`` (-inf without tokens), ``is_weight_min`` (inf), ``is_truncated``, ``mismatch``
    (sum of ``|new - behaviour|``) and, with a reference model, ``kl_sum``."""
    mask, adv = batch.response_mask, batch.advantages[:, None]
    ratio = torch.exp(new_lp - prox_lp)
    clipped = torch.clamp(ratio, 1 - cfg.clip_eps_low, 1 + cfg.clip_eps_high)
    per_token = torch.maximum(-adv * ratio, -adv * clipped)
    weight = torch.exp(prox_lp.detach() - batch.engine_logprobs)  # π_prox / π_behav
    if cfg.tis_cap is not None:
        per_token = per_token * weight.clamp(max=cfg.tis_cap)
    trained = mask.bool()
    cap = math.inf if cfg.tis_cap is None else cfg.tis_cap
    figures = {"tokens": mask.sum(), "clipped": ((ratio != clipped) & trained).sum(),
               "is_weight_sum": (weight * mask).sum(),
               "is_weight_max": torch.where(trained, weight, -math.inf).max(),
               "is_weight_min": torch.where(trained, weight, math.inf).min(),
               "is_truncated": ((weight > cap) & trained).sum(),
               "mismatch": ((new_lp.detach() - batch.engine_logprobs).abs() * mask).sum()}
    if ref_lp is not None and cfg.kl_coef > 0:
        delta = ref_lp - new_lp
        kl = torch.exp(delta) - delta - 1  # k3: unbiased, non-negative
        per_token = per_token + cfg.kl_coef * kl
        figures["kl_sum"] = (kl.detach() * mask).sum()
    # One device-to-host copy for all of them.
    stats = dict(zip(figures, torch.stack([v.detach().float() for v in figures.values()]).tolist(), strict=True))
    return aggregate(per_token, mask, cfg.loss_agg, norm), stats


def grpo_step(model: Any, optimizer: torch.optim.Optimizer, trajectories: Sequence[Trajectory],
              algo: AlgorithmConfig, optim: OptimConfig, *, pad_id: int, temperature: float,
              max_response_tokens: int, ref_model: Any = None, rank: int = 0, world_size: int = 1
              ) -> dict[str, float]:
    """One GRPO update on a rollout batch; returns metrics.

    Sharded training: every rank passes the whole batch and trains its ``rank``'s share of each
    mini-batch (:mod:`toolrl.training.microbatch`); the loss normalisers are the whole mini-batch's, so the sum
    of all ranks' gradients is the single-rank gradient (reduce with a sum, not a mean). All ranks run
    the same number of forward/backward micro-steps (zero-weight dummy steps fill the gaps).
    ``grad_norm`` is ``clip_grad_norm_``'s (global for DTensor parameters). The other metrics are this
    rank's, for the caller to reduce: ``loss`` is its part of the loss (sum over ranks); ``clip_frac``,
    ``kl``, ``lp_mismatch``, ``is_weight_mean`` and ``is_truncated_frac`` are means over the trained
    tokens its loss ran over, ``loss_tokens`` of them (every epoch counted: the weights of the group's
    means); ``is_weight_max``/``_min`` its extremes; ``trainer_peak_mb`` is its peak memory
    (:mod:`toolrl.training.peakmem`); ``trainer_tokens_per_s`` the tokens (prompt + response, no padding) it ran
    forward and backward per second of this call; ``padding_fraction`` the share of its forwarded
    tokens that belonged to dummy steps. ``trained_tokens`` counts the whole batch's trained tokens.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside world_size {world_size}")
    t_start = time.perf_counter()
    device = next(model.parameters()).device
    advantages = group_advantages([t.reward for t in trajectories], [t.group for t in trajectories],
                                  algo.norm_adv_by_std)
    usable = [i for i, t in enumerate(trajectories) if any(t.response_mask)]
    if not usable:
        return {"loss": 0.0, "grad_norm": 0.0, "trained_tokens": 0.0}
    trajs = [trajectories[i] for i in usable]
    advs = [advantages[i] for i in usable]
    lengths = [input_length(t) for t in trajs]
    minis = [m.tolist() for m in torch.arange(len(trajs)).chunk(algo.mini_batches)]
    # This rank's micro-batches per mini-batch, None for a dummy step; built once, reused every epoch.
    dummy = Trajectory(trajectory_id="dummy", sample_index=0, group=-1, prompt_ids=[pad_id], response_ids=[pad_id],
                       response_mask=[1], logprobs=[0.0])
    steps = [[(None, build_batch([dummy], [0.0], device)) if micro is None else
              (micro, build_batch([trajs[i] for i in micro], [advs[i] for i in micro], device))
              for micro in plan(mini, lengths, world_size, optim.micro_batch_size,
                                optim.max_tokens_per_micro_batch)[rank]]
             for mini in minis]
    norms = [{"tokens": float(sum(sum(trajs[i].response_mask) for i in mini)), "seqs": float(len(mini)),
              "max_len": float(max_response_tokens)} for mini in minis]
    single_update = algo.ppo_epochs == 1 and algo.mini_batches == 1

    def logprobs(m: Any, batch: PackedBatch) -> torch.Tensor:
        if isinstance(m, Policy):
            return m(batch, temperature, optim.logprob_chunk_size)
        return response_logprobs(m, batch, temperature, optim.logprob_chunk_size)

    def forward_all(m: Any) -> list[list[torch.Tensor]]:
        with torch.no_grad():
            return [[logprobs(m, batch) for _, batch in mini] for mini in steps]

    metrics: dict[str, list[float]] = {"loss": [], "grad_norm": []}
    sums = {"tokens": 0.0, "clipped": 0.0, "is_weight_sum": 0.0, "is_truncated": 0.0, "mismatch": 0.0}
    w_max, w_min = -math.inf, math.inf
    real_tokens = dummy_tokens = 0
    with PeakMemory(device) as peak:
        # Proximal logprobs: with one update per batch the policy has not moved, so prox == new.detach()
        # exactly and a separate no-grad pass would be wasted; otherwise they are computed first.
        old_all = None if single_update else forward_all(model)
        ref_all = forward_all(ref_model) if ref_model is not None and algo.kl_coef > 0 else None
        model.train()
        for _ in range(algo.ppo_epochs):
            for k, mini in enumerate(steps):
                optimizer.zero_grad(set_to_none=True)
                total = 0.0
                for j, (micro, mbatch) in enumerate(mini):
                    new_lp = logprobs(model, mbatch)
                    prox_lp = new_lp.detach() if old_all is None else old_all[k][j]
                    ref_lp = None if ref_all is None else ref_all[k][j]
                    loss, stats = policy_loss(new_lp, prox_lp, mbatch, algo, norms[k], ref_lp)
                    if micro is None:  # keeps the collectives in step with busier ranks, adds no gradient
                        (loss * 0.0).backward()
                        dummy_tokens += mbatch.tokens
                        continue
                    loss.backward()
                    real_tokens += mbatch.tokens
                    total += float(loss.detach())
                    for key in ("tokens", "clipped", "is_weight_sum", "is_truncated", "mismatch", "kl_sum"):
                        if key in stats:
                            sums[key] = sums.get(key, 0.0) + stats[key]
                    w_max, w_min = max(w_max, stats["is_weight_max"]), min(w_min, stats["is_weight_min"])
                grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), optim.grad_clip)
                if hasattr(grad_norm, "full_tensor"):  # DTensor parameters: the norm over every shard
                    grad_norm = grad_norm.full_tensor()
                optimizer.step()
                metrics["loss"].append(total)
                metrics["grad_norm"].append(float(grad_norm))
        optimizer.zero_grad(set_to_none=True)
    elapsed = time.perf_counter() - t_start
    out = {k: sum(v) / len(v) for k, v in metrics.items() if v}
    if sums["tokens"]:
        tokens = sums["tokens"]
        out.update(loss_tokens=tokens, clip_frac=sums["clipped"] / tokens, lp_mismatch=sums["mismatch"] / tokens,
                   is_weight_mean=sums["is_weight_sum"] / tokens, is_weight_max=w_max, is_weight_min=w_min,
                   is_truncated_frac=sums["is_truncated"] / tokens)
        if "kl_sum" in sums:
            out["kl"] = sums["kl_sum"] / tokens
    out["trained_tokens"] = float(sum(sum(t.response_mask) for t in trajs))
    out["advantage_abs_mean"] = sum(abs(a) for a in advs) / len(advs)
    out["padding_fraction"] = dummy_tokens / max(real_tokens + dummy_tokens, 1)
    out["trainer_tokens_per_s"] = real_tokens / elapsed
    if peak.mb is not None:
        out["trainer_peak_mb"] = peak.mb
    return out
