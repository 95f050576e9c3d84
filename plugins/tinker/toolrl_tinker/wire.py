"""The SDK's wire formats, translated and nothing more: ``forward_backward`` arrives as protobuf (``tinker.proto``,
zstd when the client compresses) and leaves as a typed request (:class:`toolrl_tinker.requests.ForwardBackward`);
its result and ``sample``'s go back as protobuf (the SDK accepts nothing else for them); every other body is
JSON (the server parses requests with the SDK's own pydantic types)."""

from __future__ import annotations

import io
import json
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import zstandard
from tinker.proto import tinker_public_pb2 as pb

from toolrl_tinker.requests import Datum, ForwardBackward, UserError

if TYPE_CHECKING:
    from tinker import types
    from toolrl.training.token_step import StepOutput

    from toolrl_tinker.sampler import Sampled

PROTO = "application/x-protobuf"
Result = tuple[bytes, str]


def json_body(value: Any) -> Result:
    return json.dumps(value).encode(), "application/json"


def _array(t: Any) -> np.ndarray:
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


def forward_backward_request(body: bytes, encoding: str | None, limit: int = 1 << 31,
                             refused: Callable[[dict[str, Any]], None] | None = None) -> ForwardBackward:
    """A ``forward_backward``'s body (zstd-compressed when ``encoding`` says so, at most ``limit`` bytes once
    decompressed) as a typed request; a body that is not one is the client's error, after ``refused`` had its
    ``model_id`` and ``seq_id`` where it names them (its training client's request takes its turn all the same)."""
    if encoding == "zstd":
        try:
            body = _unzstd(body, limit)
        except zstandard.ZstdError as exc:
            raise UserError(f"forward_backward: not a zstd body ({exc})") from None
    elif encoding not in (None, "", "identity"):
        raise UserError(f"forward_backward: content-encoding {encoding!r}: this server takes zstd or none")
    msg = pb.ForwardBackwardRequest()
    try:
        msg.ParseFromString(body)
    except Exception as exc:
        raise UserError(f"forward_backward: not a ForwardBackwardRequest protobuf ({exc})") from None
    try:
        data = [_datum(i, d) for i, d in enumerate(msg.data)]
        if any(v.WhichOneof("value") == "text" for v in msg.loss_fn_config_v2.values()):
            raise UserError("loss_fn_config: text values are not taken by any loss this server computes")
    except UserError:
        if refused is not None:
            refused({"model_id": msg.model_id, "seq_id": msg.seq_id})
        raise
    config: dict[str, float] = {k: v.number for k, v in msg.loss_fn_config_v2.items()} or dict(msg.loss_fn_config)
    loss = msg.loss_fn if not msg.forward_only or msg.loss_fn else None
    return ForwardBackward(msg.model_id, msg.seq_id or None, loss, config or None, msg.forward_only, data)


def _datum(i: int, d: Any) -> Datum:
    for chunk in d.model_input:
        if chunk.WhichOneof("chunk") != "encoded_text":
            raise UserError(f"datum {i}: only token chunks (encoded_text) are served, not images or audio")
    tokens = [np.frombuffer(chunk.encoded_text.tokens, dtype=np.int32).astype(np.int64) for chunk in d.model_input]
    return Datum(np.concatenate(tokens) if tokens else np.zeros(0, np.int64),
                 {name: _array(t) for name, t in d.loss_fn_inputs.items()})


def _unzstd(body: bytes, limit: int) -> bytes:
    """``body`` decompressed, read a piece at a time and refused past ``limit`` bytes (a frame's declared
    size is not trusted: a few bytes may declare any)."""
    with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(body)) as reader:
        out = reader.read(limit + 1)  # fills up to that many bytes, or to the frame's end
    if len(out) > limit:
        raise UserError(f"forward_backward: the body decompresses past this server's limit of {limit} bytes "
                        "(tinker serve --max-request-bytes)")
    return out


def _batched(arrays: list[np.ndarray]) -> Any:
    flat = np.concatenate(arrays).astype(np.float32)
    offsets = np.cumsum([0] + [a.size * 4 for a in arrays]).astype(np.int64)
    return pb.BatchedTensor(data=flat.tobytes(), offsets=offsets.tobytes(), dtype=pb.DTYPE_FLOAT32)


def forward_backward_output(result: StepOutput) -> Result:
    """Per datum its target tokens' ``logprobs``; the metric ``loss:sum``."""
    record = pb.ArrayRecord(type_tag="ArrayRecord", num_datums=len(result.logprobs))
    record.fields["logprobs"].CopyFrom(_batched(result.logprobs))
    out = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord", loss_fn_outputs=[record],
                                   metrics={"loss:sum": result.loss})
    return out.SerializeToString(), PROTO


def sample_response(sampled: Sampled, req: types.SampleRequest) -> Result:
    """The sequences with their log-probs, and the prompt's log-probs (NaN where not asked for: the
    first position, those before the last ``prompt_logprobs_last_n``) and top-k when asked for."""
    out = pb.SampleResponse()
    for g in sampled.sequences:
        out.sequences.add(stop_reason=pb.STOP_REASON_LENGTH if g.finish_reason == "length" else pb.STOP_REASON_STOP,
                          tokens=np.asarray(g.token_ids, np.int32).tobytes(),
                          logprobs=np.asarray(g.logprobs, np.float32).tobytes())
    if sampled.scored is None:
        return out.SerializeToString(), PROTO
    prompt, scored, k = sampled.prompt, sampled.scored, req.topk_prompt_logprobs
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
    return out.SerializeToString(), PROTO
