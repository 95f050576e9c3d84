"""The ``openai`` rollout engine: generation on any OpenAI-compatible server (vLLM, SGLang,
``toolrl serve``, hosted APIs) through the completions API.

Token-exact mode sends the prompt as token ids and asks for logprobs with vLLM's
``return_tokens_as_token_ids``, so the generated ids come back exactly (``token_id:N``) with the
sampling logprob of each: what the trainer needs. A server that answers with text only (hosted APIs)
is usable for evaluation: the text is re-tokenized here, logprobs are unknown (0.0), and
:meth:`OpenAIEngine.check_trainable` says why training must not use it.

No weights reach the server through this API: every generation reports ``weight_version``, the
version of the weights the server was given (``engine.options.weight_version``, e.g. the step of
the checkpoint it serves), and weight updates leave it as it is.

:meth:`OpenAIEngine.prompt_logprobs` asks for vLLM's ``prompt_logprobs`` (``toolrl serve`` answers them
too), one request per prompt, all in flight at once: what makes the engine a distillation teacher.

Requests share a concurrency cap; 408/409/429/5xx answers, timeouts and dropped connections are
retried with exponential backoff and jitter (``Retry-After`` is honoured); anything else, or the
last failure, is one line naming ``base_url``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from toolrl.config import ApiRoot
from toolrl.engines import (
    FinishReason,
    Generation,
    PromptLogprobs,
    RolloutEngine,
    SamplingParams,
    check_request,
    score_starts,
)

from toolrl_openai.tokens import parse_token_ids

if TYPE_CHECKING:  # annotations only
    from toolrl.engines import ModelSource

log = logging.getLogger(__name__)

_RETRY_STATUS = {408, 409, 429}


class OpenAIEngineConfig(BaseModel):
    """``engine.options`` for ``engine.name: openai``."""

    model_config = ConfigDict(extra="forbid")

    name: str = "openai"
    base_url: ApiRoot = Field(description="The API root, e.g. http://127.0.0.1:8000/v1.")
    model: str | None = Field(None, description="Served model name; default: the first the server lists.")
    api_key_env: str = Field("OPENAI_API_KEY", description="Environment variable holding the key (may be unset).")
    token_exact: Literal["auto"] | bool = Field(
        "auto", description="true: require token ids back; false: text in, text out (eval only); "
                            "auto: token ids when the server returns them.")
    max_concurrency: int = Field(64, ge=1, description="Requests in flight at once.")
    timeout_s: float = Field(600.0, gt=0, description="Per request.")
    connect_timeout_s: float = Field(10.0, gt=0)
    max_retries: int = Field(5, ge=0)
    retry_base_s: float = Field(0.5, ge=0, description="First backoff; doubles per retry, with jitter.")
    retry_max_s: float = Field(30.0, ge=0)
    max_model_len: int | None = Field(None, ge=2, description="Checked here before sending; default: the server's.")
    weight_version: int = Field(0, ge=0, description="Trainer steps in the weights the server serves; every "
                                                     "generation reports it (no weights are sent to the server).")
    check_server: bool = Field(True, description="List the server's models when the engine is created.")
    # Passed by the trainer to every engine; the server owns batching, device and dtype.
    max_batch_size: int | None = None
    device: str | None = None
    dtype: str | None = None


class OpenAIEngineError(RuntimeError):
    """A request that failed for good; the message is one line and names the server."""


class OpenAIEngine(RolloutEngine):
    name = "openai"
    Options = OpenAIEngineConfig  # checked at the run check, before any model loads

    def __init__(self, config: OpenAIEngineConfig, model: str, tokenizer: Any = None,
                 tokenizer_path: str | None = None) -> None:
        import openai

        self.config = config
        self.model = model
        self.base_url = config.base_url.rstrip("/")
        # None until the first response tells (auto); the trainer may only train when True.
        self.token_exact: bool | None = None if config.token_exact == "auto" else config.token_exact
        self._tokenizer = tokenizer
        self._tokenizer_path = tokenizer_path
        self._limit = asyncio.Semaphore(config.max_concurrency)
        self._warned: set[str] = set()
        self.max_model_len = config.max_model_len or 1 << 30
        self.weight_version = config.weight_version
        self.client = openai.AsyncOpenAI(
            base_url=self.base_url, api_key=_api_key(config), max_retries=0,
            timeout=openai.Timeout(config.timeout_s, connect=config.connect_timeout_s))

    # ----------------------------------------------------------------- construction

    @classmethod
    def create(cls, source: ModelSource, config: Mapping[str, Any]) -> OpenAIEngine:
        from toolrl.config import ConfigError, format_errors

        try:
            cfg = OpenAIEngineConfig.model_validate(dict(config))
        except ValidationError as exc:
            raise ConfigError(f"engine.options: {format_errors(exc)}") from None
        model = cfg.model
        if cfg.check_server:
            model = _check_server(cfg)
        if model is None:
            raise ConfigError("engine.options.model: not set and check_server is off")
        return cls(cfg, model, tokenizer=source.tokenizer, tokenizer_path=source.path)

    @property
    def tokenizer(self) -> Any:
        from toolrl.model_sources import tokenizer_or_load

        self._tokenizer = tokenizer_or_load(self._tokenizer, self._tokenizer_path,
                                            "text-only generation needs the model's tokenizer (ModelSource.path)",
                                            OpenAIEngineError)
        return self._tokenizer

    # ----------------------------------------------------------------- RolloutEngine

    async def generate(self, prompt_ids: list[int], params: SamplingParams, n: int = 1,
                       session_id: str | None = None, adapter: str | None = None) -> list[Generation]:
        if adapter is not None:
            raise ValueError(f"adapter {adapter!r}: the openai engine serves no adapter per role")
        if (empty := check_request(prompt_ids, params, n, self.max_model_len)) is not None:
            return [replace(g, weight_version=self.weight_version) for g in empty]
        text_mode = self.config.token_exact is False
        request: dict[str, Any] = {
            "model": self.model, "max_tokens": params.max_new_tokens, "n": n,
            "temperature": params.temperature, "top_p": params.top_p,
        }
        if params.seed is not None:
            request["seed"] = params.seed
        if params.stop_strings:
            request["stop"] = list(params.stop_strings)
        if text_mode:
            # Plain OpenAI parameters only: hosted APIs reject unknown ones.
            request["prompt"] = self.tokenizer.decode(list(prompt_ids), skip_special_tokens=False)
        else:
            request["prompt"] = list(prompt_ids)
            request["logprobs"] = 0
            # vLLM's extensions: exact ids back (as logprob tokens, and listed), stop only where the core engines stop (the listed
            # ids, not the model's own EOS), stop strings kept in the output as the core engines do.
            request["extra_body"] = {
                "return_tokens_as_token_ids": True, "return_token_ids": True,
                "stop_token_ids": list(params.stop_token_ids),
                "ignore_eos": True, "include_stop_str_in_output": True, "skip_special_tokens": False,
            }
        response = await self._request(request)
        choices = sorted(response.choices, key=lambda c: c.index)
        if len(choices) != n:
            raise OpenAIEngineError(f"{self.base_url} returned {len(choices)} choices for n={n}")
        return [replace(self._generation(c, params, text_mode), weight_version=self.weight_version) for c in choices]

    def update_weights(self, state_dict: Mapping[str, Any]) -> None:
        # The served model is the server's: new weights cannot be pushed through the OpenAI API.
        self._warn_once("weights", f"the openai engine cannot send new weights to {self.base_url}: rollouts keep "
                                   "sampling the served model (off-policy; consider algorithm.tis_cap)")

    @contextlib.contextmanager
    def updating_weights(self, version: int) -> Iterator[None]:
        # Nothing reaches the server, so the served weights keep their version.
        yield

    async def check_trainable(self) -> str | None:
        """None when training may use this engine; else a one-line reason. Asks the server once (a
        one-token completion) when no response has told yet whether it returns token ids."""
        if self.token_exact is None:
            await self.generate([0], SamplingParams(max_new_tokens=1, temperature=0.0))
        if self.token_exact:
            return None
        how = "token_exact is false" if self.config.token_exact is False else \
            "it returns no token ids (vLLM's return_tokens_as_token_ids)"
        return (f"engine openai at {self.base_url} is not token-exact ({how}): its re-tokenized text has no "
                "logprobs to train on; use it with `toolrl rollout` (evaluation) only")

    async def prompt_logprobs(self, prompts: Sequence[list[int]], top: int = 0,
                              start: int | Sequence[int] = 0) -> list[PromptLogprobs]:
        """Each prompt scored by the server (vLLM's ``prompt_logprobs: top`` on the completions API, one
        token generated and dropped), all requests at once under ``max_concurrency``. The server scores
        every prompt token (vLLM has no start); only those from ``start`` on are read."""
        starts = score_starts(prompts, start)
        return list(await asyncio.gather(*(self._prompt_logprobs(list(ids), top, s) for ids, s in zip(prompts, starts))))

    async def _prompt_logprobs(self, ids: list[int], top: int, start: int) -> PromptLogprobs:
        response = await self._request({"model": self.model, "prompt": ids, "max_tokens": 1, "temperature": 0.0,
                                        "extra_body": {"prompt_logprobs": top}})
        try:
            rows = response.choices[0].model_extra["prompt_logprobs"]
            chosen = [rows[j][str(ids[j])] for j in range(start, len(ids))]
            best = [sorted((int(e["rank"]), int(i), float(e["logprob"])) for i, e in rows[j].items() if e["rank"] <= top)
                    for j in range(start, len(ids))]
            return PromptLogprobs([float(e["logprob"]) for e in chosen], [int(e["rank"]) for e in chosen],
                                  [[(i, v) for _, i, v in b] for b in best])
        except (KeyError, IndexError, TypeError, ValueError, AttributeError):
            raise OpenAIEngineError(f"{self.base_url} does not return prompt log-probs (vLLM's prompt_logprobs on "
                                    "/v1/completions)") from None

    async def close(self) -> None:
        await self.client.close()

    # ----------------------------------------------------------------- internals

    def _generation(self, choice: Any, params: SamplingParams, text_mode: bool) -> Generation:
        logprobs = getattr(choice, "logprobs", None)
        ids = None
        if not text_mode and logprobs is not None:
            # Newer vLLM also lists the ids themselves (return_token_ids); both must agree.
            ids = parse_token_ids(logprobs.tokens)
            listed = getattr(choice, "token_ids", None)
            if ids is not None and listed is not None and list(listed) != ids:
                raise OpenAIEngineError(f"{self.base_url} returned token_ids that differ from its logprob tokens")
        stop_reason = getattr(choice, "stop_reason", None)  # vLLM: the stop string or token id that ended it
        finish: FinishReason = choice.finish_reason if choice.finish_reason in ("stop", "length", "abort") \
            else "stop"
        if ids is not None:
            values = logprobs.token_logprobs or []
            if len(values) != len(ids) or any(v is None for v in values):
                raise OpenAIEngineError(f"{self.base_url} returned {len(ids)} tokens but {len(values)} logprobs")
            self._set_exact(True)
            return _finish(ids, [float(v) for v in values], finish, stop_reason, params)
        if self.config.token_exact is True:
            raise OpenAIEngineError(f"{self.base_url} returned no token ids (token_exact: true needs vLLM's "
                                    "return_tokens_as_token_ids)")
        self._set_exact(False)
        text = choice.text or ""
        if finish == "stop" and isinstance(stop_reason, str) and not text.endswith(stop_reason):
            text += stop_reason  # the core engines keep the stop string; OpenAI servers drop it
        ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        if finish == "stop" and not isinstance(stop_reason, str) and params.stop_token_ids \
                and (not ids or ids[-1] not in params.stop_token_ids):
            ids.append(params.stop_token_ids[0])  # an end of turn the server does not show as text
        return _finish(ids, [0.0] * len(ids), finish, stop_reason, params)

    def _set_exact(self, exact: bool) -> None:
        if self.token_exact is None:
            self.token_exact = exact
        if not exact:
            self._warn_once("exact", f"{self.base_url} returns text, not token ids: rollouts are re-tokenized "
                                     "text without logprobs (evaluation only)")

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message)

    async def _request(self, request: dict[str, Any]) -> Any:
        import openai

        cfg = self.config
        async with self._limit:
            for attempt in range(cfg.max_retries + 1):
                last = attempt == cfg.max_retries
                try:
                    return await self.client.completions.create(**request)
                except openai.APIConnectionError as exc:  # also timeouts
                    if last:
                        raise OpenAIEngineError(
                            f"cannot reach the OpenAI-compatible server at {self.base_url}: {_cause(exc)} "
                            f"(after {attempt + 1} attempts)") from None
                    await asyncio.sleep(self._backoff(attempt, None))
                except openai.APIStatusError as exc:
                    status = exc.status_code
                    if (status not in _RETRY_STATUS and status < 500) or last:
                        raise OpenAIEngineError(
                            f"{self.base_url} answered {status} {_message(exc)}"
                            + (f" (after {attempt + 1} attempts)" if attempt else "")) from None
                    await asyncio.sleep(self._backoff(attempt, exc.response.headers.get("retry-after")))
        raise AssertionError("unreachable")

    def _backoff(self, attempt: int, retry_after: str | None) -> float:
        cap = min(self.config.retry_max_s, self.config.retry_base_s * 2 ** attempt)
        delay = random.uniform(cap / 2, cap)  # jitter: retries of many requests spread out
        try:
            return max(delay, min(float(retry_after), self.config.retry_max_s)) if retry_after else delay
        except ValueError:  # an HTTP date: not worth parsing for a backoff
            return delay


def _finish(ids: list[int], logprobs: list[float], finish: FinishReason, stop_reason: Any,
            params: SamplingParams) -> Generation:
    if finish != "stop":
        return Generation(ids, logprobs, finish)
    if isinstance(stop_reason, str):
        return Generation(ids, logprobs, "stop_string", stop_reason)
    if isinstance(stop_reason, int):
        return Generation(ids, logprobs, "stop", stop_reason)
    return Generation(ids, logprobs, "stop", ids[-1] if ids and ids[-1] in params.stop_token_ids else None)


def _api_key(cfg: OpenAIEngineConfig) -> str:
    # Local servers need no key, but the client insists on one: vLLM's placeholder for "none".
    return os.environ.get(cfg.api_key_env) or "EMPTY"


def _cause(exc: BaseException) -> str:
    cause = exc.__cause__ or exc.__context__
    text = str(cause or exc).strip() or type(cause or exc).__name__
    return text.splitlines()[0]


def _message(exc: Any) -> str:
    body = exc.body
    if isinstance(body, dict):
        err = body.get("error", body)
        msg = err.get("message") if isinstance(err, dict) else err
        if msg:
            return str(msg).splitlines()[0]
    return str(exc.message).splitlines()[0]


def _check_server(cfg: OpenAIEngineConfig) -> str | None:
    """The model to use, after asking the server which it serves; a ConfigError naming base_url when
    the server is down, rejects the key or does not serve ``model``."""
    import openai
    from toolrl.config import ConfigError

    base = cfg.base_url.rstrip("/")
    client = openai.OpenAI(base_url=base, api_key=_api_key(cfg), max_retries=0,
                           timeout=openai.Timeout(cfg.connect_timeout_s * 3, connect=cfg.connect_timeout_s))
    try:
        served = [m.id for m in client.models.list()]
    except openai.APIConnectionError as exc:
        raise ConfigError(f"engine.options.base_url: no OpenAI-compatible server answers at {base} "
                          f"({_cause(exc)})") from None
    except openai.AuthenticationError as exc:
        raise ConfigError(f"engine.options.api_key_env: {base} rejected the key in ${cfg.api_key_env} "
                          f"({_message(exc)})") from None
    except openai.APIStatusError as exc:
        if cfg.model is not None and exc.status_code in (404, 405):
            return cfg.model  # a server without /models: trust the configured name
        raise ConfigError(f"engine.options.base_url: {base}/models answered {exc.status_code} "
                          f"{_message(exc)}") from None
    finally:
        client.close()
    if cfg.model is None:
        if not served:
            raise ConfigError(f"engine.options.model: {base} lists no models; set one")
        return served[0]
    if served and cfg.model not in served:
        raise ConfigError(f"engine.options.model: {cfg.model!r} is not served at {base} "
                          f"(it serves {', '.join(served[:10])})")
    return cfg.model
