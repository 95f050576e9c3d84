"""The server's limits, in one table: each field with a help text is also an option of ``toolrl tinker
serve`` (``--max-batch-tokens``...), its default and help taken from here. "client" is an API key. Light
at import: the CLI reads it whenever toolrl builds its commands."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


def _option(default: Any, help: str, least: float = 1) -> Any:
    """A limit ``serve`` takes as an option: an integer ``least`` or more, or a number above ``least``."""
    return field(default=default, metadata={"help": help, "least": least})


# Mutable so that a test changes a running server's limits in place: every part reads them at each request.
@dataclass
class Limits:
    max_batch_tokens: int = _option(
        65536, "Most tokens in one forward_backward request (the SDK sends larger ones in pieces).")
    micro_batch_tokens: int = _option(
        512, "Most tokens one forward pass holds: a request runs in micro-batches of this many (gradients "
        "accumulated), which bounds the memory a request takes, each in its turn.")
    max_samplers: int = _option(
        4, "Saved weight sets a training run keeps on the sampler (older ones reload from file).")
    max_runs_per_client: int = _option(16, "Training clients one API key may hold at once.")
    max_futures_per_client: int = _option(
        256, "Requests one API key may have queued or running; more are answered 429 (the SDK waits).")
    max_tokens_per_client: int = _option(
        1 << 20, "Tokens one API key's requests queued or running may hold (a sample: its prompt and "
        "num_samples x max_tokens); more are answered 429 (the SDK waits).")
    request_timeout: float = _option(
        600.0, "Seconds one request may hold a base (its micro-batches; a sample from its arrival); past it "
        "the request stops and fails.", least=0)
    session_timeout: float = _option(
        300.0, "Seconds without a heartbeat (the SDK sends one every 10 s) after which a client's session ends "
        "and its training clients leave memory (what they saved stays).", least=0)
    keep_checkpoints: int = _option(0, "Checkpoints kept per training run and kind, the latest (0: all).", least=0)
    checkpoint_ttl: float | None = _option(
        None, "Seconds a checkpoint is kept when its save names no TTL (default: no expiry).", least=0)
    max_request_bytes: int = _option(64 << 20, "Most bytes one request body holds (decompressed).")
    sampler_slots: int = _option(
        32, "Saved weight sets resident on the sampler's engine at once (transformers max_adapters, vLLM "
        "max_loras); the least recently used others wait in host memory.")
    # Not options: the engine ``--sampler`` resolves to (toolrl_tinker.sampler.ENGINES), and the largest rank.
    sampler: str = "transformers"
    max_rank: int = 64
