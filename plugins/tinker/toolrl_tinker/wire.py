"""The SDK's wire formats: ``forward_backward`` arrives as protobuf (``tinker.proto``, zstd when the
client compresses), its output and ``sample``'s leave as protobuf (the SDK accepts nothing else for
them), every other body is JSON. Also the sampling itself (a toolrl rollout engine's ``generate`` and
``prompt_logprobs``) and the optimizer state a checkpoint holds."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from toolrl_tinker.batch import Datum, UserError

PROTO = "application/x-protobuf"
Result = tuple[bytes, str]


def json_body(value: Any) -> Result:
    return json.dumps(value).encode(), "application/json"


@dataclass
class ForwardBackward:
    model_id: str
    seq_id: int | None
    loss_fn: str | None
    config: dict[str, float] | None
    forward_only: bool
    data: list[Datum]


def _array(t: Any) -> np.ndarray:
    from tinker.proto import tinker_public_pb2 as pb

    if t.HasField("sparse_csr"):
        raise UserError("sparse loss_fn_inputs: this server takes dense tensors")
    dtype = {pb.DTYPE_FLOAT32: np.float32, pb.DTYPE_INT64: np.int64, pb.DTYPE_INT32: np.int32}.get(t.dtype)
    if dtype is None:
        raise UserError(f"loss_fn_inputs tensor of dtype {t.dtype}: this server takes float32 and int64")
    arr = np.frombuffer(t.dense, dtype=dtype)
    if list(t.shape) and int(np.prod(list(t.shape))) != arr.size:
        raise UserError(f"a tensor of shape {list(t.shape)} holds {arr.size} values")
    arr = arr.reshape(list(t.shape)) if list(t.shape) else arr
    return arr.astype(np.float32) if dtype == np.float32 else arr.astype(np.int64)


def forward_backward_request(body: bytes, encoding: str | None) -> ForwardBackward:
    from tinker.proto import tinker_public_pb2 as pb

    if encoding == "zstd":
        import zstandard

        body = zstandard.ZstdDecompressor().decompress(body, max_output_size=1 << 31)
    msg = pb.ForwardBackwardRequest()
    try:
        msg.ParseFromString(body)
    except Exception as exc:
        raise UserError(f"forward_backward: not a ForwardBackwardRequest protobuf ({exc})") from None
    data = []
    for i, d in enumerate(msg.data):
        tokens: list[np.ndarray] = []
        for chunk in d.model_input:
            if chunk.WhichOneof("chunk") != "encoded_text":
                raise UserError(f"datum {i}: only token chunks (encoded_text) are served, not images or audio")
            tokens.append(np.frombuffer(chunk.encoded_text.tokens, dtype=np.int32).astype(np.int64))
        inputs = {name: _array(t) for name, t in d.loss_fn_inputs.items()}
        data.append(Datum(np.concatenate(tokens) if tokens else np.zeros(0, np.int64), inputs))
    config: dict[str, float] = {k: v.number for k, v in msg.loss_fn_config_v2.items()} or dict(msg.loss_fn_config)
    if any(v.WhichOneof("value") == "text" for v in msg.loss_fn_config_v2.values()):
        raise UserError("loss_fn_config: text values are not taken by any loss this server computes")
    loss = msg.loss_fn if not msg.forward_only or msg.loss_fn else None
    return ForwardBackward(msg.model_id, msg.seq_id or None, loss, config or None, msg.forward_only, data)


def _batched(arrays: list[np.ndarray]) -> Any:
    from tinker.proto import tinker_public_pb2 as pb

    flat = np.concatenate(arrays).astype(np.float32)
    offsets = np.cumsum([0] + [a.size * 4 for a in arrays]).astype(np.int64)
    return pb.BatchedTensor(data=flat.tobytes(), offsets=offsets.tobytes(), dtype=pb.DTYPE_FLOAT32)


def forward_backward_output(logprobs: list[np.ndarray], loss: float) -> Result:
    """Per datum its target tokens' ``logprobs``; the metric ``loss:sum``."""
    from tinker.proto import tinker_public_pb2 as pb

    record = pb.ArrayRecord(type_tag="ArrayRecord", num_datums=len(logprobs))
    record.fields["logprobs"].CopyFrom(_batched(logprobs))
    out = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord", loss_fn_outputs=[record],
                                   metrics={"loss:sum": loss})
    return out.SerializeToString(), PROTO


def optimizer_state(run: Any) -> dict[str, Any]:
    return run.optimizer.state_dict()


def load_optimizer_state(run: Any, state: dict[str, Any]) -> None:
    import torch

    run.optimizer = torch.optim.AdamW(run.params(), lr=1e-4)
    try:
        run.optimizer.load_state_dict(state)
    except ValueError as exc:
        raise UserError(f"the checkpoint's optimizer state does not fit this model: {exc}") from None


# ---------------------------------------------------------------------- sampling


def _stops(base: Any, stop: Any) -> tuple[list[int], list[str]]:
    """The request's stop: None the model's end-of-sequence tokens, a string or strings, or token ids."""
    if stop is None:
        eos = base.model.generation_config.eos_token_id if base.model.generation_config else None
        eos = eos if eos is not None else base.tokenizer.eos_token_id
        return ([eos] if isinstance(eos, int) else list(eos or [])), []
    if isinstance(stop, str):
        return [], [stop]
    items = list(stop)
    if all(isinstance(s, int) for s in items):
        return [int(s) for s in items], []
    return [], [str(s) for s in items]


async def sample(base: Any, adapter: str, req: Any) -> Result:
    """``num_samples`` sequences through ``adapter`` on the base's engine, with prompt log-probs
    (and the top-k of each prompt position) when asked for."""
    from tinker.proto import tinker_public_pb2 as pb
    from toolrl.engines import SamplingParams

    prompt = [int(t) for chunk in req.prompt.chunks for t in getattr(chunk, "tokens", ())]
    if len(prompt) != req.prompt.length:
        raise UserError("prompt: only token chunks (encoded_text) are served, not images or audio")
    if prompt and (min(prompt) < 0 or max(prompt) >= base.vocab):
        raise UserError(f"prompt holds token id {max(prompt)}, outside the model's vocabulary of {base.vocab}")
    sp = req.sampling_params
    if sp.top_k not in (-1, 0):
        raise UserError(f"sampling_params.top_k={sp.top_k}: this server samples with top_p only (top_k -1)")
    if req.topk_sample_logprobs or req.prompt_alt_tokens_k or req.target_prompt_logprobs is not None:
        raise UserError("topk_sample_logprobs, prompt_alt_tokens_k and target_prompt_logprobs are not served")
    stop_ids, stop_strings = _stops(base, sp.stop)
    max_tokens = sp.max_tokens if sp.max_tokens is not None else base.context - len(prompt) - 1
    params = SamplingParams(temperature=sp.temperature, top_p=sp.top_p, max_new_tokens=max_tokens,
                            stop_token_ids=stop_ids, stop_strings=stop_strings, seed=sp.seed)
    try:
        gens = await base.engine.generate(prompt, params, n=req.num_samples, adapter=adapter) if max_tokens > 0 else []
    except ValueError as exc:
        raise UserError(str(exc)) from None
    out = pb.SampleResponse()
    for g in gens:
        out.sequences.add(stop_reason=pb.STOP_REASON_LENGTH if g.finish_reason == "length" else pb.STOP_REASON_STOP,
                          tokens=np.asarray(g.token_ids, np.int32).tobytes(),
                          logprobs=np.asarray(g.logprobs, np.float32).tobytes())
    if req.prompt_logprobs or req.topk_prompt_logprobs:
        await _prompt_logprobs(base, adapter, prompt, req, out)
    return out.SerializeToString(), PROTO


async def _prompt_logprobs(base: Any, adapter: str, prompt: list[int], req: Any, out: Any) -> None:
    from tinker.proto import tinker_public_pb2 as pb

    k = req.topk_prompt_logprobs
    (scored,) = await base.engine.prompt_logprobs([prompt], top=k, adapter=adapter)
    last = req.prompt_logprobs_last_n or len(prompt) - 1
    values = np.full(len(prompt), math.nan, np.float32)
    values[1:] = scored.logprobs
    values[: len(prompt) - last] = math.nan
    if req.prompt_logprobs:
        out.prompt_logprobs = values.tobytes()
    if k:
        ids = np.zeros((len(prompt), k), np.int32)
        lps = np.full((len(prompt), k), -99999.0, np.float32)
        for i, pairs in enumerate(scored.top, start=1):
            if i >= len(prompt) - last:
                ids[i, :len(pairs)] = [t for t, _ in pairs]
                lps[i, :len(pairs)] = [v for _, v in pairs]
        out.topk_prompt_logprobs.CopyFrom(pb.TopkLogprobs(token_ids=ids.tobytes(), logprobs=lps.tobytes(), k=k,
                                                          length=len(prompt)))
