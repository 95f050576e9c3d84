"""One policy step, top to bottom: advantages from the configured estimator, log-probs at trained positions
only (packed rows, chunked LM head), the configured policy loss (:mod:`toolrl.algorithms`) with what every
loss shares (the importance weight, KL, aggregation), gradient accumulation, clipping, the optimizer step.

Every ``algorithm.loss_agg`` mode (docs/algorithms.md) is normalised over the whole mini-batch, so that
gradient accumulation over micro-batches gives exactly the full-batch gradient. The objective is the
decoupled PPO objective with a truncated importance weight (docs/async.md). Under ``model.adapters``
each row trains its role's adapter in the same step (docs/architecture.md).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from toolrl.agent_roles import episode_keys, role_groups, role_reward, trains
from toolrl.algorithms import (
    CANDIDATE_IDS,
    CANDIDATE_LOGPROBS,
    AdvantageEstimator,
    AdvantageInputs,
    AlgorithmPart,
    LossInputs,
    PolicyLoss,
    StepField,
    build_estimator,
    build_loss,
)
from toolrl.algorithms.advantages import Grpo
from toolrl.algorithms.correction import correction
from toolrl.algorithms.overlong import shape_rewards
from toolrl.config import DEFAULT_LOGPROB_CHUNK, AlgorithmConfig, OptimConfig
from toolrl.training.expert_replay import ExpertReplay
from toolrl.training.logprobs import token_logprobs
from toolrl.training.microbatch import plan
from toolrl.training.optimizer import clipped_step
from toolrl.training.packing import (
    PackedBatch,
    build_batch,
    dummy_batch,
    input_length,
    packed_hidden_states,
    sharing_metrics,
    through_adapters,
    tree_keys,
)
from toolrl.training.peakmem import PeakMemory
from toolrl.training.sequence_parallel import SequenceParallel, split_response_logprobs
from toolrl.trajectory import Trajectory

__all__ = ["Policy", "ProximalLogprobs", "StepOptions", "advantage_inputs", "aggregate", "build_batch", "field_rows",
           "group_advantages", "part_fields", "train_step", "policy_loss", "response_logprobs", "token_advantages"]

Fields = Mapping[str, StepField]


def part_fields(trajectories: Sequence[Trajectory], parts: Sequence[AlgorithmPart]) -> dict[str, StepField]:
    """What the parts read of the step beyond its own inputs (:meth:`toolrl.algorithms.AlgorithmPart.fields`),
    over its (B, R) response grid (R: the longest response)."""
    width = max(1, max(len(t.response_ids) for t in trajectories))
    return {name: value for part in parts for name, value in part.fields(trajectories, width).items()}


def field_rows(fields: Fields, rows: Sequence[int], width: int | None = None,
               device: torch.device | None = None) -> dict[str, StepField]:
    """Rows ``rows`` of each field, whatever it holds: a tensor's (the first ``width`` columns of its grid,
    given one; on ``device``, given one), a tuple's items."""
    def take(value: StepField) -> StepField:
        if isinstance(value, tuple):
            return tuple(value[i] for i in rows)
        index = list(rows)
        taken = value[index] if width is None or value.dim() < 2 else value[index, :width]
        return taken if device is None else taken.to(device)
    return {name: take(value) for name, value in fields.items()}


def advantage_inputs(trajectories: Sequence[Trajectory], max_response_tokens: int, algo: AlgorithmConfig,
                     fields: Fields | None = None) -> AdvantageInputs:
    """What an estimator reads of the step, over its (B, R) response grid (R: the longest response):
    the rewards shaped by ``algorithm.overlong``, groups and response mask; ``fields``: what the parts
    read besides (:func:`part_fields`, and what the run gives: the critic's values)."""
    width = max(1, max(len(t.response_ids) for t in trajectories))
    mask = torch.zeros((len(trajectories), width), dtype=torch.float32)
    for i, t in enumerate(trajectories):
        mask[i, :len(t.response_mask)] = torch.tensor(t.response_mask, dtype=torch.float32)
    # Each role's reward and group in a run with roles (per-role baselines: toolrl.agent_roles).
    rewards = shape_rewards([role_reward(t) for t in trajectories], [len(t.response_ids) for t in trajectories],
                            max_response_tokens, algo.overlong)
    groups = torch.tensor(role_groups(trajectories), dtype=torch.long)
    return AdvantageInputs(torch.tensor(rewards, dtype=torch.float64), groups, mask, fields or {})


def token_advantages(trajectories: Sequence[Trajectory], estimator: AdvantageEstimator,
                     max_response_tokens: int, algo: AlgorithmConfig, fields: Fields | None = None) -> torch.Tensor:
    """The step's advantages, (B, R) over its response grid (:func:`advantage_inputs`). The pieces of a
    forked trajectory (:mod:`toolrl.renderers.rewrite`) share its key and reward: an outcome estimator sees
    the trajectory once (its group statistics count it once) and each piece gets its number; a per-token
    estimator runs over each piece as a sequence of its own. In a run with roles, once per role it acted
    in, against that role's baseline in its group. ``fields``: what it reads (None: the estimator's own,
    :func:`part_fields`)."""
    inputs = advantage_inputs(trajectories, max_response_tokens, algo,
                              part_fields(trajectories, [estimator]) if fields is None else fields)
    keys = episode_keys(trajectories)
    if not estimator.outcome or len(set(keys)) == len(keys):
        return estimator(inputs)
    first: dict[Hashable, int] = {}
    for i, key in enumerate(keys):
        first.setdefault(key, i)
    rows = list(first.values())
    once = estimator(AdvantageInputs(inputs.rewards[rows], inputs.groups[rows], inputs.response_mask[rows],
                                     field_rows(inputs.fields, rows)))[:, 0]
    index = {key: n for n, key in enumerate(first)}
    return once[[index[key] for key in keys]][:, None].expand(inputs.response_mask.shape).contiguous()


def group_advantages(rewards: Sequence[float], groups: Sequence[int], norm_by_std: bool = True) -> list[float]:
    """The ``grpo`` estimator's one number per trajectory: (r - mean of its group) / (std of its group
    + eps), or r - mean without ``norm_by_std``; a group of one gets 0."""
    estimator = Grpo(Grpo.Options(norm_by_std=norm_by_std), AlgorithmConfig())
    mask = torch.ones((len(rewards), 1))
    inputs = AdvantageInputs(torch.tensor(list(rewards), dtype=torch.float64), torch.tensor(list(groups)), mask)
    return estimator(inputs)[:, 0].tolist()


def response_logprobs(model: Any, batch: PackedBatch, temperature: float = 1.0,
                      chunk_size: int = DEFAULT_LOGPROB_CHUNK, sp: SequenceParallel | None = None,
                      top: bool = False, top_grad: bool = True) -> torch.Tensor:
    """Logprobs of each trained response token, (B, R), 0 at untrained positions (tool output,
    padding). The LM head runs only at the positions that predict trained tokens, in chunks. With
    ``sp`` the row is split over its ranks (:mod:`toolrl.training.sequence_parallel`); every rank gets
    the whole grid. With ``top`` and the batch's ``CANDIDATE_IDS`` (B, R, K): (B, R, 1 + K), the sampled
    token's then each candidate's (the same hidden states through the head again; without gradient
    unless ``top_grad``: a part that reads them detached)."""
    candidates = batch.fields.get(CANDIDATE_IDS) if top else None
    if sp is not None:
        if candidates is not None:
            raise ValueError("sequence parallelism gives no log-probs at candidate tokens")
        return split_response_logprobs(model, batch, sp, temperature, chunk_size)
    hidden = packed_hidden_states(model, batch)[batch.head_pos]
    head = model.get_output_embeddings()
    lp = token_logprobs(hidden, head, batch.targets, temperature, chunk_size)
    grid = batch.response_mask.new_zeros(batch.response_mask.shape).index_put((batch.rows, batch.cols), lp)
    if candidates is None:
        return grid
    ids = candidates[batch.rows, batch.cols]  # (N, K)
    k = ids.shape[1]
    with torch.set_grad_enabled(top_grad and torch.is_grad_enabled()):  # no K-fold backward for nothing
        top_lp = token_logprobs(hidden.repeat_interleave(k, 0), head, ids.reshape(-1), temperature, chunk_size)
    tops = grid.new_zeros((*grid.shape, k)).index_put((batch.rows, batch.cols), top_lp.view(-1, k))
    return torch.cat([grid[..., None], tops], -1)


class Policy(torch.nn.Module):
    """The causal LM ``lm`` with the loss's forward: ``forward(batch, temperature, chunk_size)`` gives
    :func:`response_logprobs`. Under FSDP2 it is the root unit (:mod:`toolrl.training.sharding`): the log-probs
    read the base model and the LM head separately, and only a forward through the root gathers the
    root's parameters (embeddings, final norm, head) for them."""

    def __init__(self, lm: Any) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, batch: PackedBatch, temperature: float = 1.0, chunk_size: int = DEFAULT_LOGPROB_CHUNK,
                sp: SequenceParallel | None = None, top: bool = False, top_grad: bool = True) -> torch.Tensor:
        return response_logprobs(self.lm, batch, temperature, chunk_size, sp, top, top_grad)


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, mode: str, norm: dict[str, float]) -> torch.Tensor:
    if mode == "token-mean":
        return (per_token * mask).sum() / max(norm["tokens"], 1.0)
    if mode == "seq-mean-token-mean":
        return ((per_token * mask).sum(1) / mask.sum(1).clamp(min=1)).sum() / max(norm["seqs"], 1.0)
    if mode == "seq-mean-token-sum-norm":
        return (per_token * mask).sum() / (norm["max_len"] * max(norm["seqs"], 1.0))
    raise ValueError(f"unknown loss_agg {mode!r}")


def policy_loss(new_lp: torch.Tensor, prox_lp: torch.Tensor, batch: PackedBatch, cfg: AlgorithmConfig,
                norm: dict[str, float], ref_lp: torch.Tensor | None = None,
                loss_fn: PolicyLoss | None = None, candidate_lp: torch.Tensor | None = None,
                estimator: AdvantageEstimator | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """The decoupled loss of one micro-batch (module docstring): ``loss_fn``'s per-token term (None:
    ``algorithm.loss`` built here), times the truncated importance weight, plus KL, aggregated; and
    its figures over trained tokens, for :func:`train_step` to turn into token means: ``tokens``,
    ``clipped``, ``is_weight_sum``, ``is_weight_max`` (-inf without tokens), ``is_weight_min`` (inf),
    ``is_truncated``, ``mismatch`` (sum of ``|new - behaviour|``) and, with a reference model, ``kl_sum``.
    ``batch.advantages``: (B, R) per token, or (B,) one per sequence. ``candidate_lp``: the policy's
    log-probs at the batch's ``CANDIDATE_IDS``. ``estimator`` (None: ``algorithm.advantage`` built here)
    gives the advantages the loss reads (:meth:`toolrl.algorithms.AdvantageEstimator.loss_advantages`)."""
    mask = batch.response_mask
    adv = batch.advantages if batch.advantages.dim() == 2 else batch.advantages[:, None].expand(mask.shape)
    loss_fn = build_loss(cfg) if loss_fn is None else loss_fn
    estimator = build_estimator(cfg) if estimator is None else estimator
    fields = batch.fields if candidate_lp is None else {**batch.fields, CANDIDATE_LOGPROBS: candidate_lp}
    inputs = LossInputs(new_lp, prox_lp, batch.engine_logprobs, adv, mask, fields)
    terms = loss_fn(dataclasses.replace(inputs, advantages=estimator.loss_advantages(inputs)))
    per_token = terms.per_token
    corr = correction(prox_lp, batch.engine_logprobs, mask, cfg)
    if corr.weight is not None:
        per_token = per_token * corr.weight
    trained = mask.bool()
    weight = corr.ratio  # π_prox / π_behav, per token
    cap = math.inf if cfg.tis_cap is None or cfg.correction.mode == "mask" else cfg.tis_cap
    figures = {"tokens": mask.sum(), "clipped": (terms.clipped & trained).sum(),
               "is_weight_sum": (weight * mask).sum(),
               "is_weight_max": torch.where(trained, weight, -math.inf).max(),
               "is_weight_min": torch.where(trained, weight, math.inf).min(),
               "is_truncated": ((weight > cap) & trained).sum(),
               "is_masked": (corr.dropped & trained).sum(),
               # k3 of KL(engine || trainer) over the engine's samples: ρ - 1 - log ρ
               "mismatch_kl_sum": ((weight - 1 - (prox_lp.detach() - batch.engine_logprobs)) * mask).sum(),
               "mismatch": ((new_lp.detach() - batch.engine_logprobs).abs() * mask).sum()}
    if ref_lp is not None and loss_fn.kl_coef > 0:
        delta = ref_lp - new_lp
        kl = torch.exp(delta) - delta - 1  # k3: unbiased, non-negative
        per_token = per_token + loss_fn.kl_coef * kl
        figures["kl_sum"] = (kl.detach() * mask).sum()
    # One device-to-host copy for all of them.
    stats = dict(zip(figures, torch.stack([v.detach().float() for v in figures.values()]).tolist(), strict=True))
    return aggregate(per_token, mask, cfg.loss_agg, norm), stats


@dataclass(frozen=True)
class StepOptions:
    """What one update runs with besides the model, the optimizer and the batch. ``max_response_tokens``:
    what ``seq-mean-token-sum-norm`` divides by; ``estimator``/``loss``: the parts when the caller built
    them once (None: built from ``algo``); ``processor``: a vision-language model's; ``sp``: this rank's
    sequence-parallel group; ``adapters``: ``model.adapters``' names in the model's order, which each
    trajectory's ``role`` picks from, and the ``frozen`` ones, whose pieces are not trained (their adapter
    takes no gradient: beside others they would only dilute the normaliser)."""

    algo: AlgorithmConfig
    optim: OptimConfig
    pad_id: int
    temperature: float
    max_response_tokens: int
    rank: int = 0
    world_size: int = 1
    estimator: AdvantageEstimator | None = None
    loss: PolicyLoss | None = None
    processor: Any = None
    sp: SequenceParallel | None = None
    adapters: tuple[str, ...] = ()
    frozen: tuple[str, ...] = ()

    @property
    def data_parallel(self) -> tuple[int, int]:
        """This rank's place among the groups that train different trajectories, and their number:
        the ranks of a sequence-parallel group train the same ones."""
        return (self.rank, self.world_size) if self.sp is None else (self.sp.dp_rank, self.sp.dp_size)


MicroStep = tuple[list[int] | None, PackedBatch]  # indexes into the usable trajectories (None: a dummy step), batch


@dataclass
class MiniBatch:
    """One optimizer update's share for this rank: its micro-steps, the whole mini-batch's loss
    normalisers (:func:`aggregate`) and, per micro-step, the proximal and reference log-probs once
    :func:`anchor_logprobs` has computed them (None: not needed)."""

    micro_steps: list[MicroStep]
    norm: dict[str, float]
    prox: list[torch.Tensor] | None = None
    ref: list[torch.Tensor] | None = None


def train_step(model: Any, optimizer: torch.optim.Optimizer, trajectories: Sequence[Trajectory],
              options: StepOptions, ref_model: Any = None, fields: Fields | None = None) -> dict[str, Any]:
    """One update on a rollout batch; returns metrics. ``fields``: what the run gives the step besides its
    parts' (the critic's per-token values, which ``gae`` reads).

    Sharded training: every rank passes the whole batch and trains its share of each mini-batch
    (:mod:`toolrl.training.microbatch`) with the whole mini-batch's normalisers, so the sum of the ranks'
    gradients is the single-rank gradient; dummy steps keep every rank's micro-step count equal. The
    metrics are this rank's, for the caller to reduce: ``loss`` sums over ranks; ``clip_frac``, ``kl``,
    ``lp_mismatch``, ``is_weight_mean`` and ``is_truncated_frac`` are means over its ``loss_tokens`` (every
    epoch counted: their weights); ``trainer_tokens_per_s``: the tokens it ran forward and backward (no
    padding) per second; ``padding_fraction``: its forwarded tokens' share in dummy steps; ``grad_norm`` is
    global, ``trained_tokens`` and ``advantage_*`` the whole batch's. Not metrics: ``advantages`` (each trajectory's, for the traces: a number from an outcome
    estimator, else the per-token list) and ``trainer_logprobs`` (:class:`ProximalLogprobs`' rows).
    """
    if not 0 <= options.rank < options.world_size:
        raise ValueError(f"rank {options.rank} outside world_size {options.world_size}")
    t_start = time.perf_counter()
    device = next(model.parameters()).device
    estimator = options.estimator or build_estimator(options.algo)
    loss_fn = options.loss or build_loss(options.algo)
    options = dataclasses.replace(options, estimator=estimator, loss=loss_fn)
    fields = {**part_fields(trajectories, (estimator, loss_fn)), **(fields or {})}
    grid = token_advantages(trajectories, estimator, options.max_response_tokens, options.algo, fields)
    recorded = [grid[i, 0].item() if estimator.outcome else grid[i, :len(t.response_ids)].tolist()
                for i, t in enumerate(trajectories)]
    usable = [i for i, t in enumerate(trajectories) if any(t.response_mask) and trains(t, options.frozen)]
    if not usable:
        return {"loss": 0.0, "grad_norm": 0.0, "trained_tokens": 0.0, "advantages": recorded, "trainer_logprobs": {}}
    trajs = [trajectories[i] for i in usable]
    advs = [grid[i, :max(1, len(trajectories[i].response_ids))] for i in usable]
    minis = split_mini_batches(trajs, advs, options, device, field_rows(fields, usable))
    tally = StepTally()
    proximal = ProximalLogprobs(trajs)
    replay = None if options.algo.routing_replay == "off" else ExpertReplay(model, options.algo.routing_replay, options.sp)
    with PeakMemory(device) as peak:
        try:
            anchor_logprobs(model, ref_model if loss_fn.kl_coef > 0 else None, minis, options, replay)
            model.train()
            for epoch in range(options.algo.ppo_epochs):
                for mini in minis:
                    # Every epoch compares against the same proximal log-probs: kept from the first.
                    mini_batch_update(model, optimizer, mini, options, tally, loss_fn, proximal if epoch == 0 else None,
                                      replay)
        finally:
            if replay is not None:
                replay.close()
        optimizer.zero_grad(set_to_none=True)
    metrics = tally.metrics(trajs, advs, time.perf_counter() - t_start, peak.mb)
    if replay is not None:
        metrics.update(replay.metrics())
    lead = options.sp is None or options.sp.lead  # a sequence-parallel group's batches counted once
    metrics.update(sharing_metrics([batch for mini in minis for micro, batch in mini.micro_steps
                                    if micro is not None and lead]))
    return {**metrics, "advantages": recorded, "trainer_logprobs": proximal.rows}


def split_mini_batches(trajs: Sequence[Trajectory], advs: Sequence[torch.Tensor], options: StepOptions,
                       device: torch.device, fields: Fields | None = None) -> list[MiniBatch]:
    """The batch cut into ``algo.mini_batches`` updates, each into this rank's micro-steps (a dummy
    step where this rank has nothing left but a busier rank does; ``fields``: :func:`part_fields` of
    ``trajs``, each micro-batch given its rows'); built once, reused every epoch."""
    lengths = [input_length(t) for t in trajs]
    seqs = tree_keys(trajs, options.processor) if options.optim.share_prefixes else None
    adapters = row_adapters(trajs, options.adapters) if options.adapters else None
    minis = []
    dp_rank, dp_size = options.data_parallel
    # A sequence-parallel group splits each row over its ranks: the token budget is per rank.
    max_tokens = options.optim.max_tokens_per_micro_batch
    if max_tokens is not None and options.sp is not None:
        max_tokens *= options.sp.size
    pixel_cache: dict[bytes, Any] = {}  # an image shared by a group's trajectories is processed once
    for mini in (m.tolist() for m in torch.arange(len(trajs)).chunk(options.algo.mini_batches)):
        shares = plan(mini, lengths, dp_size, options.optim.micro_batch_size, max_tokens, seqs, adapters)
        micro_steps = packed_micro_steps(trajs, advs, shares[dp_rank], device, options.pad_id,
                                         options.optim.share_prefixes, options.processor, pixel_cache, adapters,
                                         fields)
        norm = {"tokens": float(sum(sum(trajs[i].response_mask) for i in mini)), "seqs": float(len(mini)),
                "max_len": float(options.max_response_tokens)}
        minis.append(MiniBatch(micro_steps, norm))
    return minis


def row_adapters(trajs: Sequence[Trajectory], adapters: Sequence[str]) -> list[int]:
    """Each trajectory's adapter: the index of its ``role`` in ``adapters`` (the rollouts give every
    piece the role that sampled it; a piece without one cannot be trained under several policies)."""
    index = {name: i for i, name in enumerate(adapters)}
    rows = [index.get(t.role or "", -1) for t in trajs]  # "" is no role's name
    for t, i in zip(trajs, rows, strict=True):
        if i < 0:
            raise ValueError(f"trajectory {t.trajectory_id!r} has role {t.role!r}, which names no adapter of "
                             f"model.adapters ({', '.join(adapters)}): each piece trains its role's adapter")
    return rows


def packed_micro_steps(trajs: Sequence[Trajectory], advs: Sequence[Any], share: Sequence[list[int] | None],
                       device: torch.device, pad_id: int, share_prefixes: bool, processor: Any,
                       cache: dict[bytes, Any], adapters: Sequence[int] | None = None,
                       fields: Fields | None = None) -> list[MicroStep]:
    """A rank's share of a plan (:func:`toolrl.training.microbatch.plan`) packed: each micro-batch's rows
    ``trajs[i]`` with advantages ``advs[i]`` (prefix trees with ``share_prefixes``; ``cache``: images
    processed once; ``adapters[i]``: the row's adapter, :func:`row_adapters`; ``fields``: what the parts
    read, row ``i`` of each and the micro-batch's grid's columns), and a dummy step (one pad token) for each
    None, where a busier rank still has work, to keep FSDP's collectives in step."""
    def packed(micro: list[int]) -> PackedBatch:
        rows = [trajs[i] for i in micro]
        batch = build_batch(rows, [advs[i] for i in micro], device, share_prefixes, processor, cache,
                            None if adapters is None else [adapters[i] for i in micro])
        return dataclasses.replace(batch, fields=field_rows(fields or {}, micro, batch.response_mask.shape[1], device))
    return [(None, dummy_batch(pad_id, device)) if micro is None else (micro, packed(micro)) for micro in share]


def logprobs(model: Any, batch: PackedBatch, options: StepOptions, replay: ExpertReplay | None = None,
             dummy: bool = False, top: bool = False, top_grad: bool = True) -> torch.Tensor:
    """:func:`response_logprobs` of ``model``, through its own forward when it is a :class:`Policy`;
    routed by ``replay`` (``algorithm.routing_replay``) when given; each row through its adapter
    (``model.adapters``); with ``top``, the candidate tokens' too."""
    if replay is not None:
        replay.before(batch, dummy)
    forward = model if isinstance(model, Policy) else functools.partial(response_logprobs, model)
    with through_adapters(causal_lm(model), batch):
        lp = forward(batch, options.temperature, options.optim.logprob_chunk_size, options.sp, top, top_grad)
    if replay is not None:
        replay.after(batch)
    return lp


def anchor_logprobs(model: Any, ref_model: Any, minis: Sequence[MiniBatch], options: StepOptions,
                    replay: ExpertReplay | None = None) -> None:
    """The log-probs the loss compares against, without gradient, before any update. Proximal: with
    one update per batch the policy has not moved, so prox == new.detach() exactly and a separate pass
    would be wasted (``prox`` stays None); otherwise these weights'. Reference: when ``ref_model`` is
    given (the caller passes it only for a KL term)."""
    with torch.no_grad():
        if options.algo.ppo_epochs != 1 or options.algo.mini_batches != 1:
            for mini in minis:
                mini.prox = [logprobs(model, batch, options, replay, micro is None) for micro, batch in mini.micro_steps]
        if ref_model is not None:
            for mini in minis:
                mini.ref = [logprobs(ref_model, batch, options) for _, batch in mini.micro_steps]


def mini_batch_update(model: Any, optimizer: torch.optim.Optimizer, mini: MiniBatch, options: StepOptions,
                      tally: StepTally, loss_fn: PolicyLoss, proximal: ProximalLogprobs | None = None,
                      replay: ExpertReplay | None = None) -> None:
    """One optimizer update: this rank's micro-steps forward and backward (gradients accumulate),
    then clipping and the optimizer step. In a sequence-parallel group every rank computes the whole
    micro-batch's loss from the group's log-probs and backpropagates 1/N of it (the group's gradients
    add up to the one-rank gradient); its first rank alone counts the loss's figures and keeps the
    proximal log-probs in ``proximal`` (None: not kept)."""
    optimizer.zero_grad(set_to_none=True)
    loss_sum = 0.0
    sp = options.sp
    scale = 1.0 if sp is None else 1.0 / sp.size
    for j, (micro, batch) in enumerate(mini.micro_steps):
        new_lp = logprobs(model, batch, options, replay, micro is None, top=True,
                          top_grad=CANDIDATE_LOGPROBS in loss_fn.reads)
        # The policy's log-probs at the batch's candidate tokens, where a part gives some.
        new_lp, candidate_lp = (new_lp[..., 0], new_lp[..., 1:]) if new_lp.dim() == 3 else (new_lp, None)
        prox_lp = new_lp.detach() if mini.prox is None else mini.prox[j]
        ref_lp = None if mini.ref is None else mini.ref[j]
        loss, stats = policy_loss(new_lp, prox_lp, batch, options.algo, mini.norm, ref_lp, loss_fn, candidate_lp,
                                  options.estimator)
        tokens = batch.tokens if sp is None else -(-batch.tokens // sp.size)  # forwarded by this rank
        if micro is None:  # keeps the collectives in step with busier ranks, adds no gradient
            (loss * 0.0).backward()
            tally.dummy_tokens += tokens
            continue
        if proximal is not None and (sp is None or sp.lead):
            proximal.add(micro, prox_lp)
        with through_adapters(causal_lm(model), batch):  # gradient checkpointing runs the forward again
            (loss * scale).backward()
        loss_sum += float(loss.detach()) * scale
        first = proximal is not None  # the step's first update: the ratios against the proximal weights
        ratios = torch.exp(prox_lp.detach() - batch.engine_logprobs)[batch.response_mask.bool()] if first else None
        tally.add_micro_step(tokens, stats if sp is None or sp.lead else None, ratios)
    tally.grad_norms.append(clipped_step(optimizer, model.parameters(), options.optim.grad_clip))
    tally.losses.append(loss_sum)


def causal_lm(model: Any) -> Any:
    """The causal LM of ``model`` (itself, or a :class:`Policy`'s)."""
    return model.lm if isinstance(model, Policy) else model


class ProximalLogprobs:
    """Each trained trajectory's log-probs under the weights the step started from (the proximal policy),
    for its trace row: by trajectory id, None at untrained tokens. Kept as the loss runs: no extra forward,
    one copy to the host per micro-batch."""

    def __init__(self, trajs: Sequence[Trajectory]) -> None:
        self.trajs = trajs
        self.rows: dict[str, list[float | None]] = {}

    def add(self, micro: Sequence[int], prox_lp: torch.Tensor) -> None:
        """``prox_lp``: the micro-batch's (B, R) grid, row i the trajectory ``micro[i]``."""
        grid = prox_lp.detach().float().cpu().tolist()
        for i, k in enumerate(micro):
            t = self.trajs[k]
            self.rows[t.trajectory_id] = [lp if m else None for lp, m in zip(grid[i], t.response_mask, strict=False)]


class StepTally:
    """The step's figures as its updates run: per-update loss and gradient norm, sums of
    :func:`policy_loss`'s figures over the micro-steps, the importance weight's extremes, and the tokens
    forwarded by real and dummy micro-steps."""

    SUMMED = ("tokens", "clipped", "is_weight_sum", "is_truncated", "is_masked", "mismatch_kl_sum", "mismatch",
              "kl_sum")

    def __init__(self) -> None:
        self.losses: list[float] = []
        self.grad_norms: list[float] = []
        # kl_sum joins only when the loss has a KL term, which is how metrics() knows to report kl.
        self.sums = dict.fromkeys(self.SUMMED[:-1], 0.0)
        self.ratios: list[torch.Tensor] = []  # the trained tokens' π_prox / π_behav, for their quantiles
        self.w_max, self.w_min = -math.inf, math.inf
        self.real_tokens = self.dummy_tokens = 0

    def add_micro_step(self, tokens: int, stats: dict[str, float] | None, ratios: torch.Tensor | None = None) -> None:
        """``stats`` None: the tokens were forwarded here, the loss's figures are counted elsewhere.
        ``ratios``: the micro-step's trained tokens' importance ratios (on the first update only)."""
        self.real_tokens += tokens
        if stats is None:
            return
        if ratios is not None:
            self.ratios.append(ratios.detach().float().cpu())
        for key in self.SUMMED:
            if key in stats:
                self.sums[key] = self.sums.get(key, 0.0) + stats[key]
        self.w_max, self.w_min = max(self.w_max, stats["is_weight_max"]), min(self.w_min, stats["is_weight_min"])

    def metrics(self, trajs: Sequence[Trajectory], advs: Sequence[torch.Tensor], elapsed: float,
                peak_mb: float | None) -> dict[str, float]:
        out = {k: sum(v) / len(v) for k, v in (("loss", self.losses), ("grad_norm", self.grad_norms)) if v}
        sums, tokens = self.sums, self.sums["tokens"]
        if tokens:
            out.update(loss_tokens=tokens, clip_frac=sums["clipped"] / tokens, lp_mismatch=sums["mismatch"] / tokens,
                       is_weight_mean=sums["is_weight_sum"] / tokens, is_weight_max=self.w_max,
                       is_weight_min=self.w_min, is_truncated_frac=sums["is_truncated"] / tokens)
            out.update(is_masked_frac=sums["is_masked"] / tokens, mismatch_kl=sums["mismatch_kl_sum"] / tokens)
            if "kl_sum" in sums:
                out["kl"] = sums["kl_sum"] / tokens
        if self.ratios and (ratios := torch.cat(self.ratios)).numel():
            low, mid, high = torch.quantile(ratios, torch.tensor([0.05, 0.5, 0.95])).tolist()
            out.update(is_ratio_p05=low, is_ratio_p50=mid, is_ratio_p95=high)
        out["trained_tokens"] = float(sum(sum(t.response_mask) for t in trajs))
        per_traj = torch.stack([(row * mask).sum() / mask.sum() for row, mask in
                                zip(advs, (torch.tensor(t.response_mask, dtype=torch.float32) for t in trajs), strict=True)])
        out["advantage_mean"] = float(per_traj.mean())
        out["advantage_std"] = float(per_traj.std(unbiased=False))
        out["advantage_abs_mean"] = float(per_traj.abs().mean())
        out["padding_fraction"] = self.dummy_tokens / max(self.real_tokens + self.dummy_tokens, 1)
        out["trainer_tokens_per_s"] = self.real_tokens / elapsed
        if peak_mb is not None:
            out["trainer_peak_mb"] = peak_mb
        return out
