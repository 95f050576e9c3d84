"""The Tinker API's training requests in toolrl's terms: a ``forward_backward`` as the public step's
rows and loss (:mod:`toolrl.training.token_step`), an ``optim_step``'s ``AdamParams`` as its optimizer
settings (:mod:`toolrl.training.optimizer`), and the user errors a request that does not fit gets.

A datum is ``model_input`` (N tokens) and ``loss_fn_inputs`` of N values each: ``target_tokens`` (what
position i predicts), ``weights`` (cross_entropy), ``logprobs`` (the sampler's, RL losses) and
``advantages``. It becomes one :class:`toolrl.training.token_step.TokenRow`, every position trained and
the loss their plain sum, as the API defines it: cross_entropy's weights are the row's advantages, the
RL losses' ``logprobs`` its sampling log-probs (the ratio is against the sampler; no correction weight).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from toolrl.config import AlgorithmConfig

if TYPE_CHECKING:
    from tinker import types
    from toolrl.training.optimizer import OptimizerSettings
    from toolrl.training.token_step import LossSpec, TokenRow


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


@dataclass
class Datum:
    """One datum as arrays: the input tokens and each loss input (float32, target_tokens int64)."""

    tokens: np.ndarray
    inputs: dict[str, np.ndarray]


@dataclass
class ForwardBackward:
    """A ``forward_backward`` (or ``forward``: ``forward_only``; ``loss_fn`` None: no loss named)."""

    model_id: str
    seq_id: int | None
    loss_fn: str | None
    config: dict[str, float] | None
    forward_only: bool
    data: list[Datum]


def loss_spec(loss_fn: str, config: Mapping[str, float] | None) -> LossSpec:
    """The toolrl policy loss and options that compute Tinker's ``loss_fn`` with ``config``."""
    from toolrl.algorithms import build_loss
    from toolrl.training.token_step import LossSpec

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
    try:  # its options checked now: a bad threshold is the client's error, not the step's
        build_loss(AlgorithmConfig(loss=name, loss_options=options))
    except ValueError as exc:
        raise UserError(f"loss_fn_config of {loss_fn}: {str(exc).splitlines()[0]}") from None
    return LossSpec(name=name, options=options)


def token_rows(req: ForwardBackward, vocab: int, max_tokens: int) -> tuple[list[TokenRow], LossSpec]:
    """The request's datums as rows and its loss (a forward without a loss: cross_entropy's, over
    advantages of 0), once :func:`check` passes. A datum without ``target_tokens`` (a forward) predicts
    the next input token, its last position its own."""
    from toolrl.training.token_step import TokenRow

    loss = loss_spec(req.loss_fn or "cross_entropy", req.config if req.loss_fn is not None else None)
    check(req.data, req.loss_fn, vocab, max_tokens)
    key = "weights" if req.loss_fn == "cross_entropy" else "advantages"
    rows = []
    for d in req.data:
        targets = d.inputs.get("target_tokens")
        advantages = d.inputs.get(key)
        rows.append(TokenRow(tokens=d.tokens,
                             targets=np.append(d.tokens[1:], d.tokens[-1:]) if targets is None else targets,
                             advantages=np.full(len(d.tokens), OPTIONAL.get(key, 0.0)) if advantages is None else advantages,
                             logprobs=d.inputs.get("logprobs")))
    return rows, loss


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


def optimizer_settings(req: types.OptimStepRequest) -> OptimizerSettings:
    """An ``optim_step``'s ``AdamParams`` as the optimizer settings; any other optimizer (Dimuon), or a
    value out of its range, is the client's error."""
    from pydantic import ValidationError
    from toolrl.training.optimizer import OptimizerSettings

    params = req.optim_params
    if not hasattr(params, "beta2"):
        raise UserError(f"optimizer {getattr(params, 'type', '?')!r}: this server steps AdamW only (AdamParams)")
    try:
        return OptimizerSettings(lr=params.learning_rate, betas=(params.beta1, params.beta2), eps=params.eps,
                                 weight_decay=params.weight_decay, grad_clip_norm=params.grad_clip_norm)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise UserError(f"AdamParams: {'.'.join(map(str, first['loc']))}: {first['msg']}") from None
