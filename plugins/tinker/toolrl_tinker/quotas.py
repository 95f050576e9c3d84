"""What one API key may hold at once: training clients (``--max-runs-per-client``), futures not yet
ended (``--max-futures-per-client``) and their tokens (``--max-tokens-per-client``; a ``forward_backward``
holds its datums' tokens, a ``sample`` its prompt and every sample's most new tokens).

A request over a key's futures or tokens for now is answered 429 with ``Retry-After``, which the SDK waits out
and sends again, so a key that queues without bound slows itself, not the others. A request that could never
fit, and a training client over the quota, are the client's errors at once (400). The request its training
client's queue waits for (the next ``seq_id``) is always taken: those queued behind it hold the quota, and
refusing it would stall them all.
"""

from __future__ import annotations

from dataclasses import dataclass

from toolrl_tinker.futures import Futures
from toolrl_tinker.limits import Limits
from toolrl_tinker.metrics import Metrics
from toolrl_tinker.requests import UserError

# How soon the SDK sends a refused request again (its client reads Retry-After-Ms before Retry-After).
RETRY_AFTER_S = 0.25


class QuotaExceeded(Exception):
    """A request over its key's quota for now: HTTP 429, sent again by the SDK."""

    def __init__(self, quota: str, message: str) -> None:
        super().__init__(message)
        self.quota = quota


@dataclass(eq=False)
class Quotas:
    limits: Limits  # read at each request
    futures: Futures
    metrics: Metrics

    def admit(self, owner: str, tokens: int, next_in_line: bool = False) -> None:
        """Raise unless ``owner`` may start one more request of ``tokens`` tokens now."""
        limits, running, held = self.limits, self.futures.running[owner], self.futures.tokens[owner]
        if tokens > limits.max_tokens_per_client:
            raise self._refused(owner, "request_tokens", UserError(
                f"this request holds {tokens} tokens, over this server's limit of {limits.max_tokens_per_client} "
                "tokens in flight per client (tinker serve --max-tokens-per-client): send it in smaller pieces"))
        if next_in_line:
            return
        if running >= limits.max_futures_per_client:
            raise self._refused(owner, "futures", QuotaExceeded("futures", (
                f"this client has {running} requests queued or running, this server's limit (tinker serve "
                "--max-futures-per-client): sent again shortly")))
        if held + tokens > limits.max_tokens_per_client:
            raise self._refused(owner, "tokens", QuotaExceeded("tokens", (
                f"this client's requests queued or running hold {held} tokens; with this one's {tokens} that is over "
                f"this server's limit of {limits.max_tokens_per_client} (tinker serve --max-tokens-per-client): "
                "sent again shortly")))

    def admit_run(self, owner: str, held: int) -> None:
        """Raise unless ``owner``, holding ``held`` training clients, may hold one more (and start the request
        that makes it)."""
        if held >= self.limits.max_runs_per_client:
            raise self._refused(owner, "training_clients", UserError(
                f"this client holds {held} models, the server's limit (tinker serve --max-runs-per-client): close "
                "a ServiceClient, or wait for an idle one's session to time out"))
        self.admit(owner, 0)

    def _refused(self, owner: str, quota: str, error: Exception) -> Exception:
        """``error``, counted as a refusal for ``quota``."""
        self.metrics.count("tinker_quota_refusals_total", key=owner, quota=quota)
        return error
