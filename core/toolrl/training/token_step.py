"""One forward and backward over rows of tokens with a named policy loss, for a trainer outside
toolrl's loop (the Tinker service, yours): docs/training_api.md has an example and what is not covered.

Every position of every row is trained and the loss is the sum of the policy loss's per-token terms
(:func:`toolrl.training.step.policy_loss`, ``seq-mean-token-sum-norm`` over normalisers of 1). A row's
sampling log-probs are its proximal and behaviour log-probs both; a row without them is on-policy.

The sum is what lets a batch be split: any split's losses and gradients add up to the whole batch's,
so :func:`forward_backward` runs micro-batches of ``max_tokens`` and data-parallel ranks' gradients are
summed, not averaged; ``forwards=`` pads a smaller share with idle forwards (FSDP2's collectives are per
forward): docs/training_api.md "Data-parallel ranks". One call at a time per model (adapters' routing
lives on the model's layers): the lock is the caller's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Annotated, Any

import numpy as np
import torch
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from toolrl.algorithms import build_loss
from toolrl.config import AlgorithmConfig
from toolrl.modeling.adapter_routing import adapter_names, has_routing
from toolrl.training.packing import PackedBatch, through_adapters
from toolrl.training.step import Policy, causal_lm, policy_loss, response_logprobs

__all__ = ["LossSpec", "StepOutput", "TokenRow", "forward_backward", "micro_batch_spans"]

# policy_loss's seq-mean-token-sum-norm over these normalisers is the plain sum over positions.
_SUM = {"seqs": 1.0, "max_len": 1.0, "tokens": 1.0}


def _per_position(dtype: type) -> BeforeValidator:
    def convert(value: Any) -> np.ndarray:
        array = np.asarray(value, dtype=dtype)
        if array.ndim != 1:
            raise ValueError(f"one value per position is needed, not an array of shape {list(array.shape)}")
        return array
    return BeforeValidator(convert)


class TokenRow(BaseModel):
    """One sequence: ``tokens`` (N input ids) and, per position i, the token it is scored against
    (``targets[i]``; for plain next-token prediction ``tokens[i + 1]``), its advantage
    (``advantages[i]``: the policy loss's advantage, cross_entropy's weight), and the log-prob of
    ``targets[i]`` when it was sampled (``logprobs``; None: sampled by the weights being trained)."""

    model_config = ConfigDict(arbitrary_types_allowed=True, frozen=True, extra="forbid")

    tokens: Annotated[np.ndarray, _per_position(np.int64)]
    targets: Annotated[np.ndarray, _per_position(np.int64)]
    advantages: Annotated[np.ndarray, _per_position(np.float32)]
    logprobs: Annotated[np.ndarray, _per_position(np.float32)] | None = None

    @model_validator(mode="after")
    def _one_value_per_position(self) -> TokenRow:
        if not len(self.tokens):
            raise ValueError("tokens is empty")
        for name in ("targets", "advantages", "logprobs"):
            value = getattr(self, name)
            if value is not None and len(value) != len(self.tokens):
                raise ValueError(f"{name} has {len(value)} values and tokens {len(self.tokens)}: one per position")
        return self


class LossSpec(BaseModel):
    """A registered policy loss (``toolrl list-plugins``) by name, and its options."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    options: dict[str, Any] = Field(default_factory=dict)


class StepOutput(BaseModel):
    """What :func:`forward_backward` gives back: each row's log-probs of its targets (float32, one per
    position), the loss (the sum over every position), the tokens forwarded and the micro-batches they
    ran in."""

    model_config = ConfigDict(arbitrary_types_allowed=True, frozen=True)

    logprobs: list[np.ndarray]
    loss: float
    tokens: int
    micro_batches: int


def micro_batch_spans(lengths: Sequence[int], max_tokens: int | None = None) -> list[tuple[int, int]]:
    """The consecutive ranges ``[start, end)`` of rows of these ``lengths`` that hold at most
    ``max_tokens`` tokens each (a longer row makes one alone; None: one range of all)."""
    spans, start, held = [], 0, 0
    for i, n in enumerate(lengths):
        if max_tokens is not None and i > start and held + n > max_tokens:
            spans.append((start, i))
            start, held = i, 0
        held += n
    spans.append((start, len(lengths)))
    return spans


def forward_backward(model: Any, rows: Sequence[TokenRow], loss: LossSpec, *, adapter: str | None = None,
                     backward: bool = True, max_tokens: int | None = None, forwards: int = 0) -> StepOutput:
    """``rows`` through the causal LM ``model`` (through its adapter ``adapter`` alone, on a model with
    several: :func:`toolrl.modeling.adapter_routing.routed`; None: the model as it is, or its base weights when it
    routes adapters), ``loss`` over them, and its gradient added to the parameters' ``.grad`` unless not
    ``backward``; in :func:`micro_batch_spans` of ``max_tokens``. ``model`` may be the
    :class:`toolrl.training.step.Policy` around it that a data-parallel rank shards
    (:func:`toolrl.training.sharding.shard`). ``forwards``: run at least this many forwards (and backwards):
    the ones past the rows' are idle, a one-token row through the adapter whose loss counts zero, so that a
    rank with a smaller share (or none: ``rows`` may then be empty) keeps FSDP2's collectives in step. An
    unknown loss or option is a :class:`toolrl.config.ConfigError`; a token id outside the vocabulary or an
    unknown adapter a ValueError, both before any forward."""
    algo = AlgorithmConfig(loss=loss.name, loss_options=loss.options, loss_agg="seq-mean-token-sum-norm")
    loss_part = build_loss(algo)
    lm = causal_lm(model)
    if not rows and not forwards:
        raise ValueError("forward_backward: no rows")
    check_ids(rows, int(lm.get_output_embeddings().weight.shape[0]))
    route = _adapter_index(lm, adapter)
    device = next(model.parameters()).device
    lengths = [len(row.tokens) for row in rows]
    spans = micro_batch_spans(lengths, max_tokens) if rows else []
    idle = TokenRow(tokens=[0], targets=[0], advantages=[0.0])
    pieces = [rows[start:end] for start, end in spans] + [None] * (forwards - len(spans))
    logprobs: list[np.ndarray] = []
    total = 0.0
    for piece in pieces:
        batch, sampled = _packed(piece or [idle], route, device)
        with torch.set_grad_enabled(backward), through_adapters(lm, batch):
            new = model(batch) if isinstance(model, Policy) else response_logprobs(model, batch)
            behaviour = torch.where(sampled[:, None], batch.engine_logprobs, new.detach())
            batch = dataclasses.replace(batch, engine_logprobs=behaviour)
            term, _ = policy_loss(new, behaviour, batch, algo, _SUM, loss_fn=loss_part)
            if piece is None:
                term = term * 0.0
            if backward and term.requires_grad:
                term.backward()
        if piece is None:
            continue
        total += float(term.detach())
        grid = new.detach().float().cpu()
        logprobs.extend(grid[i, :len(row.tokens)].numpy().copy() for i, row in enumerate(piece))
    return StepOutput(logprobs=logprobs, loss=total, tokens=sum(lengths), micro_batches=len(spans))


def check_ids(rows: Sequence[TokenRow], vocab: int) -> None:
    for i, row in enumerate(rows):
        for name, ids in (("tokens", row.tokens), ("targets", row.targets)):
            if int(ids.min()) < 0 or int(ids.max()) >= vocab:
                bad = int(ids.min()) if ids.min() < 0 else int(ids.max())
                raise ValueError(f"row {i}: {name} holds token id {bad}, outside the model's vocabulary of {vocab}")


def _adapter_index(model: Any, adapter: str | None) -> int | None:
    """What the rows' tokens are routed to: ``adapter``'s index, -1 (the base weights) on a model that
    routes adapters, None (no routing) on one that does not."""
    if adapter is None:
        return -1 if has_routing(model) else None
    names = adapter_names(model)
    if adapter not in names:
        raise ValueError(f"adapter {adapter!r}: the model holds {', '.join(names) or 'none'}")
    return names.index(adapter)


def _packed(rows: Sequence[TokenRow], adapter: int | None, device: torch.device) -> tuple[PackedBatch, torch.Tensor]:
    """The rows as one packed row whose LM head runs at every position, every position trained, on the
    (rows, longest row) grid; and which rows carry sampling log-probs."""
    lengths = [len(row.tokens) for row in rows]
    starts = np.cumsum([0, *lengths])
    cols = np.concatenate([np.arange(n) for n in lengths])
    mask, sampling, advantages = (torch.zeros((len(rows), max(lengths))) for _ in range(3))
    for i, (row, n) in enumerate(zip(rows, lengths, strict=True)):
        mask[i, :n] = 1.0
        advantages[i, :n] = torch.tensor(row.advantages)
        if row.logprobs is not None:
            sampling[i, :n] = torch.tensor(row.logprobs)

    def long(values: Any) -> torch.Tensor:
        return torch.as_tensor(np.asarray(values), dtype=torch.long, device=device)

    batch = PackedBatch(long(np.concatenate([row.tokens for row in rows]))[None], long(cols)[None], starts.tolist(),
                        long(np.arange(starts[-1])), long(np.concatenate([row.targets for row in rows])),
                        long(np.repeat(np.arange(len(rows)), lengths)), long(cols), mask.to(device),
                        sampling.to(device), advantages.to(device),
                        adapter_ids=None if adapter is None else torch.full((1, int(starts[-1])), adapter,
                                                                            dtype=torch.long, device=device))
    return batch, torch.tensor([row.logprobs is not None for row in rows], device=device)
