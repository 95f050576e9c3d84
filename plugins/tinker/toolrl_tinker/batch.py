"""Tinker datums as toolrl's packed batch, and the Tinker losses as toolrl's policy losses.

A datum is ``model_input`` (N tokens) and ``loss_fn_inputs`` of N values each: ``target_tokens`` (what
position i predicts), ``weights`` (cross_entropy), ``logprobs`` (the sampler's, RL losses) and
``advantages``. It becomes one row of a :class:`toolrl.training.packing.PackedBatch` whose LM head runs
at every position, every position trained (``response_mask`` 1): the loss is
:func:`toolrl.training.step.policy_loss` with ``loss_agg: seq-mean-token-sum-norm`` normalised by 1,
the plain sum over tokens the API defines. The RL losses' proximal and behaviour log-probs are both the
datum's ``logprobs`` (the ratio is against the sampler; no correction weight); cross_entropy's proximal
log-probs are the new ones detached and its advantages the weights.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from toolrl.config import AlgorithmConfig


class UserError(ValueError):
    """A request the API answers with a user error (the SDK's ``RequestFailedError``, category user)."""


# Tinker loss -> (toolrl loss, its loss_fn_inputs beside target_tokens, its loss_fn_config keys and defaults).
LOSSES: dict[str, tuple[str, tuple[str, ...], dict[str, float]]] = {
    "cross_entropy": ("cross_entropy", ("weights",), {}),
    "importance_sampling": ("importance_sampling", ("logprobs", "advantages"), {}),
    "ppo": ("ppo_clip", ("logprobs", "advantages"), {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}),
    "cispo": ("cispo", ("logprobs", "advantages"), {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}),
    "dro": ("dro", ("logprobs", "advantages"), {"beta": 0.05}),
}
# Inputs a datum may leave out, and their value.
OPTIONAL = {"weights": 1.0}


def algorithm(loss_fn: str, config: Mapping[str, float] | None) -> tuple[AlgorithmConfig, Any]:
    """The toolrl algorithm section and policy loss that compute Tinker's ``loss_fn`` with ``config``."""
    from toolrl.algorithms import build_loss

    if loss_fn not in LOSSES:
        raise UserError(f"unknown loss_fn {loss_fn!r}: this server computes {', '.join(LOSSES)}")
    name, _, defaults = LOSSES[loss_fn]
    given = dict(config or {})
    if extra := sorted(set(given) - set(defaults)):
        takes = ", ".join(defaults) or "none"
        raise UserError(f"loss_fn_config of {loss_fn}: unknown key(s) {', '.join(extra)} (it takes: {takes})")
    values = {**defaults, **{k: float(v) for k, v in given.items()}}
    options: dict[str, float] = {}
    if loss_fn == "ppo":
        options = {"clip_eps_low": 1.0 - values["clip_low_threshold"], "clip_eps_high": values["clip_high_threshold"] - 1.0}
    elif loss_fn == "cispo":
        options = {"min_weight": values["clip_low_threshold"], "max_weight": values["clip_high_threshold"]}
    elif loss_fn == "dro":
        options = {"beta": values["beta"]}
    try:
        algo = AlgorithmConfig(loss=name, loss_options=options, loss_agg="seq-mean-token-sum-norm")
        return algo, build_loss(algo)
    except ValueError as exc:
        raise UserError(f"loss_fn_config of {loss_fn}: {str(exc).splitlines()[0]}") from None


# Every position counts once: the sum over tokens (toolrl.training.step.aggregate).
SUM = {"seqs": 1.0, "max_len": 1.0, "tokens": 1.0}


@dataclass
class Datum:
    """One datum as arrays: the input tokens and each loss input (float32, target_tokens int64)."""

    tokens: np.ndarray
    inputs: dict[str, np.ndarray]


def check(data: Sequence[Datum], loss_fn: str | None, vocab: int, max_tokens: int) -> None:
    """Raise :class:`UserError` for a batch the loss cannot take: empty, too many tokens, inputs of the
    wrong length or name, token ids outside the vocabulary."""
    if not data:
        raise UserError("forward_backward: no datums")
    total = sum(len(d.tokens) for d in data)
    if total > max_tokens:
        raise UserError(f"the batch holds {total} tokens, over this server's limit of {max_tokens} per request "
                        "(tinker-service --max-batch-tokens)")
    takes = ("target_tokens", *LOSSES[loss_fn][1]) if loss_fn is not None else ("target_tokens",)
    for i, d in enumerate(data):
        n = len(d.tokens)
        if n == 0:
            raise UserError(f"datum {i}: model_input is empty")
        if extra := sorted(set(d.inputs) - set(takes)):
            raise UserError(f"datum {i}: loss_fn_inputs key(s) {', '.join(extra)} are not inputs of "
                            f"{loss_fn or 'forward'} (it takes: {', '.join(takes)})")
        for key in takes:
            if key not in d.inputs and key not in OPTIONAL and (loss_fn is not None or key != "target_tokens"):
                raise UserError(f"datum {i}: loss_fn_inputs lacks {key!r}, which {loss_fn} needs")
        for key, value in d.inputs.items():
            if value.shape != (n,):
                raise UserError(f"datum {i}: loss_fn_inputs[{key!r}] has shape {list(value.shape)}; "
                                f"model_input has {n} tokens, so it must be [{n}]")
        for key, ids in (("model_input", d.tokens), ("target_tokens", d.inputs.get("target_tokens"))):
            if ids is not None and len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
                raise UserError(f"datum {i}: {key} holds token id {int(ids.max()) if ids.max() >= vocab else int(ids.min())}, "
                                f"outside the model's vocabulary of {vocab}")


def packed(data: Sequence[Datum], adapter: int, loss_fn: str | None, device: Any = "cpu") -> Any:
    """The datums as one packed row: every position predicts its target (a forward without targets
    predicts the next input token, the last position its own), row i of the (B, N) grid holding
    datum i's advantages (cross_entropy: weights) and sampling log-probs."""
    import torch
    from toolrl.training.packing import PackedBatch

    n = len(data)
    width = max(len(d.tokens) for d in data)
    ids, pos, head, targets, rows, cols, bounds = [], [], [], [], [], [], [0]
    mask = torch.zeros((n, width))
    engine = torch.zeros((n, width))
    adv = torch.zeros((n, width))
    for i, d in enumerate(data):
        k = len(d.tokens)
        start = bounds[-1]
        ids.extend(d.tokens.tolist())
        pos.extend(range(k))
        head.extend(range(start, start + k))
        tgt = d.inputs.get("target_tokens")
        targets.extend((tgt if tgt is not None else np.append(d.tokens[1:], d.tokens[-1:])).tolist())
        rows.extend([i] * k)
        cols.extend(range(k))
        bounds.append(start + k)
        mask[i, :k] = 1.0
        if "logprobs" in d.inputs:
            engine[i, :k] = torch.from_numpy(d.inputs["logprobs"])
        key = "weights" if loss_fn == "cross_entropy" else "advantages"
        adv[i, :k] = torch.from_numpy(d.inputs[key]) if key in d.inputs else OPTIONAL.get(key, 0.0)

    def long(v: list[int]) -> torch.Tensor:
        return torch.tensor(v, dtype=torch.long, device=device)

    batch = PackedBatch(long(ids)[None], long(pos)[None], bounds, long(head), long(targets), long(rows), long(cols),
                        mask.to(device), engine.to(device), adv.to(device))
    batch.adapter_ids = torch.full_like(batch.input_ids, adapter)
    return batch
