"""The critic of PPO: a value model, its per-token values on packed batches, the clipped value loss and
its update, sharded and checkpointed like the policy (docs/critic.md).

The value of response token ``t`` is read where the policy reads its log-prob, at the hidden state that
predicts ``t``, so values exist exactly at trained tokens. Per trained token::

    V_clip = V_old + clip(V − V_old, −ε, ε)
    loss   = max((V − R)², (V_clip − R)²)

a token mean normalised by the whole mini-batch's trained tokens, so the sum of the ranks' gradients is
the one-rank gradient, as for the policy.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from toolrl import model_sources
from toolrl.config import Config
from toolrl.model_sources import model_path
from toolrl.training.microbatch import plan
from toolrl.training.optimizer import OptimizerSettings, adamw, clipped_step
from toolrl.training.packing import (
    PackedBatch,
    input_length,
    packed_hidden_states,
    sharing_metrics,
    tree_keys,
)
from toolrl.training.sharding import shard_root
from toolrl.training.step import MicroStep, packed_micro_steps
from toolrl.trajectory import Trajectory

__all__ = ["Critic", "CriticOptions", "ValueModel", "batch_values", "critic_update", "load_state", "shard_critic",
           "state", "value_loss", "value_metrics"]


class ValueModel(torch.nn.Module):
    """A value head on ``backbone`` (a causal LM's base model, e.g. ``Qwen3Model``). ``forward(batch)``
    gives the values (B, R) of a :class:`~toolrl.training.packing.PackedBatch`'s trained tokens, 0
    elsewhere. Under FSDP2 it is the root unit: its forward runs the backbone and the head."""

    # packed_hidden_states reads the backbone under this name, as it reads a causal LM's base model.
    base_model_prefix = "backbone"

    def __init__(self, backbone: Any) -> None:
        super().__init__()
        self.backbone = backbone
        param = next(backbone.parameters())
        self.head = torch.nn.Linear(backbone.config.get_text_config().hidden_size, 1, dtype=param.dtype, device=param.device)
        # Zero: every value starts at 0, the same on every rank without a shared random draw.
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)

    @classmethod
    def from_causal_lm(cls, lm: Any) -> ValueModel:
        """A value model on ``lm``'s backbone (taken, not copied: pass a copy to keep ``lm`` intact);
        every parameter trains."""
        return cls(getattr(lm, lm.base_model_prefix)).requires_grad_(True)

    def forward(self, batch: PackedBatch) -> torch.Tensor:
        hidden = packed_hidden_states(self, batch)[batch.head_pos]
        values = self.head(hidden).squeeze(-1).float()
        return batch.response_mask.new_zeros(batch.response_mask.shape).index_put((batch.rows, batch.cols), values)


@dataclass(frozen=True)
class CriticOptions:
    """What a critic update runs with, as the policy's (``value_clip``: ``ε``, None the plain squared
    error; ``grad_clip``: the largest global gradient norm, 0 for no clipping)."""

    value_clip: float | None = 0.2
    grad_clip: float = 1.0
    epochs: int = 1
    mini_batches: int = 1
    micro_batch_size: int = 4
    max_tokens_per_micro_batch: int | None = None
    pad_id: int = 0
    rank: int = 0
    world_size: int = 1
    processor: Any = None
    share_prefixes: bool = False


def shard_critic(critic: ValueModel, mesh: Any, *, offload: bool = False) -> ValueModel:
    """FSDP2 over ``mesh`` as for the policy: each backbone layer a unit, the rest (embeddings, final
    norm, value head) the root."""
    return shard_root(critic, critic.backbone, mesh, offload=offload)


def _micro_steps(trajs: Sequence[Trajectory], indices: Sequence[int], options: CriticOptions,
                 device: torch.device) -> list[MicroStep]:
    """This rank's packed micro-steps over ``indices``."""
    lengths = [input_length(t) for t in trajs]
    seqs = tree_keys(trajs, options.processor) if options.share_prefixes else None
    shares = plan(indices, lengths, options.world_size, options.micro_batch_size, options.max_tokens_per_micro_batch,
                  seqs)
    return packed_micro_steps(trajs, [0.0] * len(trajs), shares[options.rank], device, options.pad_id,
                              options.share_prefixes, options.processor, {})


def _trainable(trajs: Sequence[Trajectory]) -> list[int]:
    # A micro-batch without trained tokens would skip the backbone (and its collectives) altogether.
    return [i for i, t in enumerate(trajs) if any(t.response_mask)]


def batch_values(critic: torch.nn.Module, trajs: Sequence[Trajectory], options: CriticOptions) -> torch.Tensor:
    """The critic's values (N, R) of the whole batch (R: its longest response), 0 at untrained tokens,
    without gradient. Sharded: each rank runs its share and one sum over ranks gives every rank all."""
    device = next(critic.parameters()).device
    width = max(1, max((len(t.response_ids) for t in trajs), default=1))
    values = torch.zeros((len(trajs), width), dtype=torch.float32, device=device)
    usable = _trainable(trajs)
    if usable:
        critic.eval()
        with torch.no_grad():
            for micro, batch in _micro_steps(trajs, usable, options, device):
                v = critic(batch)
                if micro is not None:
                    values[micro, :v.shape[1]] = v
    if options.world_size > 1:
        import torch.distributed as dist

        dist.all_reduce(values)
    return values.cpu()


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
               clip: float | None, tokens: float) -> tuple[torch.Tensor, dict[str, float]]:
    """The clipped value loss (module docstring) of one micro-batch, summed over its trained tokens
    and divided by ``tokens`` (the mini-batch's); and its figures: ``tokens`` and ``clipped`` (trained
    tokens where the clipped error was the larger)."""
    error = (values - returns) ** 2
    trained = mask > 0
    clipped = torch.zeros_like(trained)
    if clip is not None:
        clipped_values = old_values + (values - old_values).clamp(-clip, clip)
        clipped_error = (clipped_values - returns) ** 2
        clipped = (clipped_error > error) & trained
        error = torch.maximum(error, clipped_error)
    loss = (error * mask).sum() / max(tokens, 1.0)
    counts = torch.stack([mask.sum(), clipped.sum().to(mask.dtype)]).tolist()
    return loss, {"tokens": counts[0], "clipped": counts[1]}


def critic_update(critic: torch.nn.Module, optimizer: torch.optim.Optimizer, trajs: Sequence[Trajectory],
                  old_values: torch.Tensor, returns: torch.Tensor, options: CriticOptions) -> dict[str, float]:
    """Regress the critic's values on ``returns`` (N, R), ``options.epochs`` × ``options.mini_batches``
    optimizer updates; ``old_values`` are :func:`batch_values` before the first. Every rank passes the
    whole batch and trains its share. Metrics, this rank's: ``value_loss`` (its part of the mean
    update's loss: sum over ranks), ``value_tokens`` and ``value_clip_frac`` over them (every epoch
    counted), ``critic_grad_norm`` (global); ``critic_tokens_computed``/``critic_tokens_total``/
    ``critic_prefix_share``: :func:`~toolrl.training.packing.sharing_metrics` of its micro-steps."""
    usable = _trainable(trajs)
    if not usable:
        return {}
    device = next(critic.parameters()).device
    old_values, returns = old_values.to(device), returns.to(device)
    minis = [(float(sum(sum(trajs[i].response_mask) for i in mini)), _micro_steps(trajs, mini, options, device))
             for mini in (m.tolist() for m in torch.tensor(usable).chunk(options.mini_batches))]
    losses, norms, counted, clipped = [], [], 0.0, 0.0
    critic.train()
    for _ in range(options.epochs):
        for tokens, steps in minis:
            optimizer.zero_grad(set_to_none=True)
            loss_sum = 0.0
            for micro, batch in steps:
                v = critic(batch)
                rows = [0] if micro is None else micro
                width = v.shape[1]
                loss, figures = value_loss(v, old_values[rows, :width], returns[rows, :width], batch.response_mask,
                                           options.value_clip, tokens)
                if micro is None:  # in step with busier ranks' collectives, no gradient
                    (loss * 0.0).backward()
                    continue
                loss.backward()
                loss_sum += float(loss.detach())
                counted, clipped = counted + figures["tokens"], clipped + figures["clipped"]
            norms.append(clipped_step(optimizer, critic.parameters(), options.grad_clip))
            losses.append(loss_sum)
    optimizer.zero_grad(set_to_none=True)
    critic.eval()
    shared = sharing_metrics([batch for _, steps in minis for micro, batch in steps if micro is not None])
    return {"value_loss": sum(losses) / len(losses), "critic_grad_norm": sum(norms) / len(norms),
            "value_tokens": counted, "value_clip_frac": clipped / max(counted, 1.0),
            "critic_tokens_computed": shared["trainer_tokens_computed"],
            "critic_tokens_total": shared["trainer_tokens_total"], "critic_prefix_share": shared["prefix_share"]}


def value_metrics(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Over the batch's trained tokens: ``value_mean`` and ``explained_variance``
    (``1 − Var(R − V) / Var(R)``: 1 for a perfect critic, 0 for one no better than the mean return;
    left out when the returns do not vary)."""
    trained = mask > 0
    if not trained.any():
        return {}
    v, r = values[trained].double(), returns[trained].double()
    out = {"value_mean": float(v.mean()), "return_mean": float(r.mean())}
    var = float(r.var(unbiased=False))
    if var > 0:
        out["explained_variance"] = 1.0 - float((r - v).var(unbiased=False)) / var
    return out


def state(critic: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The critic's part of a checkpoint (``torch.distributed.checkpoint`` state: sharded tensors stay
    sharded, so any world size can load it)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(critic, optimizer)
    return {"critic": model_sd, "critic_optim": optim_sd}


def load_state(critic: torch.nn.Module, optimizer: torch.optim.Optimizer, loaded: dict[str, Any]) -> None:
    """Put :func:`state`'s tensors, once filled by ``dcp.load``, back into the critic and its optimizer."""
    from torch.distributed.checkpoint.state_dict import set_state_dict

    set_state_dict(critic, optimizer, model_state_dict=loaded["critic"], optim_state_dict=loaded["critic_optim"])


class Critic:
    """A trainer rank's critic: the value model (sharded like the policy), its optimizer and options;
    what the rank asks of it each step (values before advantages, the update after) and its part of
    checkpoints."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, options: CriticOptions) -> None:
        self.model, self.optimizer, self.options = model, optimizer, options

    @classmethod
    def build(cls, config: Config, policy_lm: Any, device: str, pad_id: int, rank: int = 0, world_size: int = 1,
              mesh: Any = None, processor: Any = None) -> Critic:
        """From ``config.critic``: a copy of ``policy_lm``'s backbone (before sharding, and without
        adapters: a LoRA run's critic starts from ``model.source`` again), or ``critic.model``."""
        cfg = config.critic
        if cfg.model is None and config.model.lora is None:
            backbone = copy.deepcopy(getattr(policy_lm, policy_lm.base_model_prefix))
        else:
            source = model_path(config) if cfg.model is None else model_sources.resolve_source(
                config.model.model_copy(update={"source": cfg.model}), config.base_dir)
            lm = model_sources.load_model(source, dtype=config.model.dtype, device=device)
            if config.model.gradient_checkpointing:
                lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            backbone = getattr(lm, lm.base_model_prefix)
        model: torch.nn.Module = ValueModel(backbone.requires_grad_(True))
        if mesh is not None:
            model = shard_critic(model, mesh, offload=config.trainer.cpu_offload)
        settings = OptimizerSettings(lr=cfg.lr, betas=config.optim.betas, eps=config.optim.eps,
                                     weight_decay=cfg.weight_decay)
        optimizer = adamw([p for p in model.parameters() if p.requires_grad], settings)
        algo, optim = config.algorithm, config.optim
        options = CriticOptions(value_clip=cfg.value_clip, grad_clip=cfg.grad_clip, epochs=algo.ppo_epochs,
                                mini_batches=algo.mini_batches, micro_batch_size=optim.micro_batch_size,
                                max_tokens_per_micro_batch=optim.max_tokens_per_micro_batch, pad_id=pad_id,
                                rank=rank, world_size=world_size, processor=processor,
                                share_prefixes=optim.share_prefixes)
        return cls(model, optimizer, options)

    def values(self, trajs: Sequence[Trajectory]) -> torch.Tensor:
        return batch_values(self.model, trajs, self.options)

    def update(self, trajs: Sequence[Trajectory], values: torch.Tensor, returns: torch.Tensor,
               mask: torch.Tensor) -> dict[str, float]:
        """The update, and the value metrics of the batch (the values before it against the returns)."""
        return {**critic_update(self.model, self.optimizer, trajs, values, returns, self.options),
                **value_metrics(values, returns, mask)}

    def state(self) -> dict[str, Any]:
        return state(self.model, self.optimizer)

    def load(self, loaded: dict[str, Any]) -> None:
        load_state(self.model, self.optimizer, loaded)
