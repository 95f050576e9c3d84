"""The Tinker API's training requests in toolrl's terms: a ``forward_backward`` as the public step's
rows and loss (:mod:`toolrl.training.token_step`), an ``optim_step``'s ``AdamParams`` as its optimizer
settings (:mod:`toolrl.training.optimizer`), and the user errors a request that does not fit gets.
A datum (``model_input`` and ``loss_fn_inputs`` of as many values: ``target_tokens``, ``weights``,
``logprobs``, ``advantages``) becomes one :class:`toolrl.training.token_step.TokenRow`, every position trained
and the loss their plain sum, as the API defines it: cross_entropy's weights are the row's advantages, the RL
losses' ``logprobs`` its sampling log-probs (the ratio is against the sampler; no correction weight).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from pydantic import ValidationError
from toolrl.algorithms import build_loss
from toolrl.config import AlgorithmConfig, ConfigError
from toolrl.training.optimizer import OptimizerSettings
from toolrl.training.token_step import LossSpec, TokenRow

if TYPE_CHECKING:
    from tinker import types


class UserError(ConfigError):
    """A request the API answers with a user error (the SDK's ``RequestFailedError``, category user); a
    ConfigError, so a command that meets one says it in one line (``toolrl.cli.user_errors``)."""


# Tinker loss -> (toolrl loss, its loss_fn_inputs beside target_tokens, its loss_fn_config keys and defaults,
# the toolrl loss's options from the config's values: the same values where None).
CLIP = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
LOSSES: dict[str, tuple[str, tuple[str, ...], dict[str, float], Callable[[dict[str, float]], dict[str, float]] | None]] = {
    "cross_entropy": ("cross_entropy", ("weights",), {}, None),
    "importance_sampling": ("importance_sampling", ("logprobs", "advantages"), {}, None),
    "ppo": ("ppo_clip", ("logprobs", "advantages"), CLIP, lambda v: {
        "clip_eps_low": 1.0 - v["clip_low_threshold"], "clip_eps_high": v["clip_high_threshold"] - 1.0}),
    "cispo": ("cispo", ("logprobs", "advantages"), CLIP, lambda v: {
        "min_weight": v["clip_low_threshold"], "max_weight": v["clip_high_threshold"]}),
    "dro": ("dro", ("logprobs", "advantages"), {"beta": 0.05}, None),
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
    if loss_fn not in LOSSES:
        raise UserError(f"unknown loss_fn {loss_fn!r}: this server computes {', '.join(LOSSES)}")
    name, _, defaults, convert = LOSSES[loss_fn]
    given = dict(config or {})
    if extra := sorted(set(given) - set(defaults)):
        takes = ", ".join(defaults) or "none"
        raise UserError(f"loss_fn_config of {loss_fn}: unknown key(s) {', '.join(extra)} (it takes: {takes})")
    if bad := sorted(k for k, v in given.items() if not math.isfinite(float(v))):
        raise UserError(f"loss_fn_config of {loss_fn}: {', '.join(f'{k}={given[k]}' for k in bad)}: not a finite number")
    values = {**defaults, **{k: float(v) for k, v in given.items()}}
    options = values if convert is None else convert(values)
    try:  # its options checked now: a bad threshold is the client's error, not the step's
        build_loss(AlgorithmConfig(loss=name, loss_options=options))
    except ValueError as exc:
        raise UserError(f"loss_fn_config of {loss_fn}: {str(exc).splitlines()[0]}") from None
    return LossSpec(name=name, options=options)


def token_rows(req: ForwardBackward, vocab: int, max_tokens: int,
               context: int | None = None) -> tuple[list[TokenRow], LossSpec]:
    """The request's datums as rows and its loss (a forward without a loss: cross_entropy's, over
    advantages of 0), once :func:`check` passes. A datum without ``target_tokens`` (a forward) predicts
    the next input token, its last position its own."""
    loss = loss_spec(req.loss_fn or "cross_entropy", req.config if req.loss_fn is not None else None)
    check(req.data, req.loss_fn, vocab, max_tokens, context)
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


def check(data: Sequence[Datum], loss_fn: str | None, vocab: int, max_tokens: int, context: int | None = None) -> None:
    """Raise :class:`UserError` for a batch the loss cannot take: empty, too many tokens, a datum longer
    than the model's ``context``, inputs of the wrong length or name or not finite, token ids outside the
    vocabulary."""
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
        if context is not None and n > context:
            raise UserError(f"datum {i}: model_input holds {n} tokens, beyond the model's context of {context}")
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
            if value.dtype.kind == "f" and not np.isfinite(value).all():
                at = int(np.flatnonzero(~np.isfinite(value))[0])
                raise UserError(f"datum {i}: loss_fn_inputs[{key!r}] holds {value[at]} at position {at}: "
                                "every value must be a finite number")
        for key, ids in (("model_input", d.tokens), ("target_tokens", d.inputs.get("target_tokens"))):
            if ids is not None and len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
                raise UserError(f"datum {i}: {key} holds token id {int(ids.max()) if ids.max() >= vocab else int(ids.min())}, "
                                f"outside the model's vocabulary of {vocab}")


def optimizer_settings(req: types.OptimStepRequest) -> OptimizerSettings:
    """An ``optim_step``'s ``AdamParams`` as the optimizer settings; any other optimizer (Dimuon), or a
    value out of its range, is the client's error."""
    params = req.optim_params
    if not hasattr(params, "beta2"):
        raise UserError(f"optimizer {getattr(params, 'type', '?')!r}: this server steps AdamW only (AdamParams)")
    for name in ("learning_rate", "beta1", "beta2", "eps", "weight_decay", "grad_clip_norm"):
        if not math.isfinite(getattr(params, name)):
            raise UserError(f"AdamParams: {name}={getattr(params, name)}: not a finite number")
    try:
        return OptimizerSettings(lr=params.learning_rate, betas=(params.beta1, params.beta2), eps=params.eps,
                                 weight_decay=params.weight_decay, grad_clip=params.grad_clip_norm)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise UserError(f"AdamParams: {'.'.join(map(str, first['loc']))}: {first['msg']}") from None


# Stop strings a sample may give, and their longest (each is looked for in a window of new tokens).
MAX_STOPS = 32
MAX_STOP_BYTES = 512


def sample_tokens(req: types.SampleRequest, context: int, vocab: int) -> int:
    """The tokens a ``sample`` holds while it runs (its prompt, and every sample's most new tokens), once
    its numbers are in range; else :class:`UserError`, before it is queued."""
    sp, n = req.sampling_params, req.prompt.length
    if n < 1:
        raise UserError("prompt: it is empty; a prompt holds 1 token or more")
    if req.num_samples < 1:
        raise UserError(f"num_samples {req.num_samples}: ask for 1 sample or more")
    new = sp.max_tokens if sp.max_tokens is not None else context - n
    if new < 1 or n + new > context:
        raise UserError(f"sampling_params.max_tokens {sp.max_tokens}: the prompt's {n} tokens and the new ones must fit "
                        f"the model's context of {context}, with 1 new token or more")
    if not (math.isfinite(sp.temperature) and sp.temperature >= 0):
        raise UserError(f"sampling_params.temperature {sp.temperature}: a finite number, 0 (greedy) or more")
    if not (math.isfinite(sp.top_p) and 0 < sp.top_p <= 1):
        raise UserError(f"sampling_params.top_p {sp.top_p}: above 0, at most 1")
    if sp.seed is not None and not -(1 << 63) <= sp.seed < 1 << 64:
        raise UserError(f"sampling_params.seed {sp.seed}: a 64-bit integer")
    if not 0 <= req.topk_prompt_logprobs <= vocab:
        raise UserError(f"topk_prompt_logprobs {req.topk_prompt_logprobs}: 0 to the vocabulary's {vocab}")
    stops = [sp.stop] if isinstance(sp.stop, str) else list(sp.stop or [])
    if len(stops) > MAX_STOPS or any(len(str(s).encode()) > MAX_STOP_BYTES for s in stops):
        raise UserError(f"sampling_params.stop: at most {MAX_STOPS} stops of at most {MAX_STOP_BYTES} bytes each")
    return n + req.num_samples * new
