"""Rollout engines: token ids in; token ids, per-token logprobs and a finish reason out.

An engine serves many concurrent ``generate`` calls (one per trajectory turn) and batches them
itself, so a trajectory waiting on a tool never holds up the others. Logprobs are those of the
sampling distribution after temperature scaling (before top-p), which is what the trainer
recomputes.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from toolrl.plugins.parts import UncheckedOptions

if TYPE_CHECKING:
    from toolrl.config import AdapterConfig
    from toolrl.plugins.parts import RunFacts

FinishReason = Literal["stop", "length", "stop_string", "abort"]


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 256
    stop_token_ids: list[int] = field(default_factory=list)
    stop_strings: list[str] = field(default_factory=list)
    seed: int | None = None


@dataclass
class Generation:
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    # The stop token id or stop string that ended generation (kept in token_ids), if any.
    stop: int | str | None = None
    # The engine's weight version (trainer steps applied to its weights) when the first token was sampled.
    weight_version: int = 0
    # Prompt tokens the engine did not prefill for this request (KV it kept from the trajectory's last
    # turn, a prompt prefilled once for a group, a prefix cache); on the request's first sample only.
    prefill_tokens_saved: int = 0
    # A mixture-of-experts engine recording them (engine.options.record_routes): the experts of every
    # token it ran for this sample (the prompt, then each generated token but the last), a
    # toolrl.trajectory.RoutedExperts.
    routed_experts: Any = None


@dataclass
class PromptLogprobs:
    """A prompt scored by the model (:meth:`RolloutEngine.prompt_logprobs`): for each token after the
    first, its log-prob given the tokens before it (log-softmax of the logits, no temperature), its
    rank in that distribution (1: the most likely) and the ``top`` most likely tokens (id, log-prob)."""

    logprobs: list[float]
    ranks: list[int]
    top: list[list[tuple[int, float]]]


@dataclass
class ModelSource:
    """Where an engine gets its model: a directory with HF weights and tokenizer, and optionally the
    live module the trainer optimises (engines in the trainer's process may share it)."""

    path: str
    module: Any = None
    tokenizer: Any = None


def context_overflow(tokens: int, context: int, stated: str, detail: str = "") -> str:
    """The one wording of a prompt that leaves a model no room for a response, in the data check before
    the run (:mod:`toolrl.rollout.context_check`) and in every engine during it: ``tokens`` (``detail``:
    what they include), the ``context`` and where it is ``stated``."""
    return f"prompt: {tokens:,} tokens{detail}; the model's context is {context:,} ({stated}), so no response fits"


def score_starts(prompts: Sequence[list[int]], start: int | Sequence[int]) -> list[int]:
    """Each prompt's first scored token (:meth:`RolloutEngine.prompt_logprobs`'s ``start``), at least 1,
    checked against its length."""
    starts = [start] * len(prompts) if isinstance(start, int) else list(start)
    if len(starts) != len(prompts):
        raise ValueError(f"prompt_logprobs got {len(starts)} starts for {len(prompts)} prompts")
    for ids, s in zip(prompts, starts):
        if not 0 <= s < max(len(ids), 1):
            raise ValueError(f"a prompt to score from token {s} holds {len(ids)} tokens: start must be 0 to {len(ids) - 1}")
    return [max(s, 1) for s in starts]


def check_request(prompt_ids: list[int], params: SamplingParams, n: int, max_model_len: int) -> list[Generation] | None:
    """Validate a generate() request the same way in every engine: raises on bad input, returns the
    (empty) result when nothing may be generated, else None."""
    if not prompt_ids:
        raise ValueError("prompt_ids is empty")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if len(prompt_ids) >= max_model_len:
        raise ValueError(context_overflow(len(prompt_ids), max_model_len, "the engine's max_model_len"))
    if params.max_new_tokens <= 0:
        return [Generation([], [], "length") for _ in range(n)]
    return None


class CoreEngineOptions(BaseModel):
    """What the core puts in every engine's options (``engine.max_batch_size``, ``model.device`` resolved,
    ``model.dtype``), no other key: the ``Options`` of an engine that takes none of its own, and the base
    of one that does, so a misspelt ``engine.options`` key is an error at the run check."""

    model_config = ConfigDict(extra="forbid")

    max_batch_size: int = Field(32, ge=1, description="engine.max_batch_size")
    device: str = Field("cpu", description="model.device, resolved")
    dtype: str = Field("float32", description="model.dtype")


def rows_of(tensor: Any, start: int, rows: Any) -> Any:
    """The view of ``tensor`` that ``rows`` (rows from ``start`` along dim 0; 0-d: one row) fills."""
    return tensor if tensor.dim() == 0 else tensor.narrow(0, start, rows.shape[0] if rows.dim() else 1)


class RolloutEngine(ABC):
    name: ClassVar[str] = ""
    # Trainer steps applied to the weights the engine samples with; set by :meth:`updating_weights`.
    weight_version: int = 0
    # Whether the engine takes LoRA adapters (:meth:`apply_adapters`) and then loads only the adapter
    # tensors; an engine that does not gets merged weights under LoRA, and no run of several policies
    # (toolrl.agent_roles.check_engine_serves).
    loads_adapters: ClassVar[bool] = False
    # Whether an update may hold only some weights, the others kept as they are (trainer.weight_sync: delta).
    partial_weight_updates: ClassVar[bool] = False

    # The engine's options (``engine:`` besides ``name``, with the model's device and dtype); an engine
    # that declares its own model has them checked, field by field, before anything loads; one that
    # declares none gets them as given, for its ``create`` to check once the model has loaded.
    Options: ClassVar[type[BaseModel]] = UncheckedOptions

    @classmethod
    def check_run(cls, facts: RunFacts) -> list[str]:
        """The run check before any weights load (:class:`toolrl.plugins.parts.RunFacts`; hookspecs): raise
        ValueError on a setting this engine cannot run with, return warning lines; none here."""
        return []

    @classmethod
    def build(cls, options: BaseModel, context: Any) -> RolloutEngine:
        """The build contract (:mod:`toolrl.plugins.parts`): the engine on ``context.inputs["source"]``."""
        return cls.create(context.input("source"), options.model_dump())

    @classmethod
    @abstractmethod
    def create(cls, source: ModelSource, config: Mapping[str, Any]) -> RolloutEngine:
        """Build the engine from a model source and its validated options (as a mapping)."""

    @abstractmethod
    async def generate(self, prompt_ids: list[int], params: SamplingParams, n: int = 1,
                       session_id: str | None = None, images: Sequence[Any] = (),
                       adapter: str | None = None) -> list[Generation]:
        """Generate ``n`` samples for one prompt. ``session_id`` names the trajectory so an engine can
        reuse its KV cache across turns (the next prompt extends this prompt plus the generation).
        ``images``: the prompt's images (toolrl.trajectory.TrajectoryImage) in the order of their token
        runs; the rollout passes them only when there are some, so text-only engines need not take them.
        ``adapter``: the role whose LoRA adapter samples (``model.adapters``; the rollout and the gateway
        pass it only then, and only to an engine with ``loads_adapters``)."""

    @abstractmethod
    def update_weights(self, state_dict: Mapping[str, Any]) -> None:
        """Load whole tensors (a no-op for those the engine shares with the trainer): where the default
        :meth:`finish_weight_rows` puts the rows it assembled. Weights reach an engine as rows
        (:meth:`load_weight_rows`), never through this directly."""

    def weight_tensors(self) -> Mapping[str, Any] | None:
        """The engine's weights by the names :meth:`load_weight_rows` takes, read in place (tied ones
        may appear under each name): what a live engine sends a new one in place of the trainer. None:
        it cannot give them (a new engine then gets the trainer's weights)."""
        return None

    def apply_adapters(self, inject: Callable[[Any], Any]) -> None:
        """Take the run's LoRA adapters: ``inject(model)`` is the trainer's own injection (peft layers
        put into a Hugging Face model in place), so both hold the same adapters under the same names. An
        engine on a torch model runs it on that model; one that serves adapters some other way (vLLM)
        runs it on a weightless skeleton to learn the adapters' names, shapes, rank and alpha. From
        then on weight updates carry the adapter tensors only, by name; until the first, the adapters
        are the trainer's initial ones (``lora_B`` zero). Engines with ``loads_adapters`` implement it."""
        raise NotImplementedError(f"the {self.name} engine does not load LoRA adapters")

    def add_adapter(self, name: str, config: AdapterConfig) -> None:
        """Serve LoRA adapter ``name`` (``config``: its rank, alpha and target modules) from now on,
        beside the others, to the requests that name it (``generate(..., adapter=name)``,
        :meth:`prompt_logprobs`): adapters that come and go at run time (a service's clients), where
        :meth:`apply_adapters` takes a run's fixed set. Its tensors arrive as any weights do, as rows
        (:meth:`load_weight_rows` inside :meth:`updating_weights`) under the trainer's names for an
        adapter of that name (``<module>.lora_A.<name>.weight``, :mod:`toolrl.modeling.adapters`);
        until they do it is the base model (``lora_B`` zero). An engine may hold more adapters than it
        keeps resident (its adapter slots: the transformers engine's ``max_adapters``, vLLM's
        ``max_loras``/``max_cpu_loras``), the others in host memory; a request naming one brings it back.
        Raises ValueError for a name in use. Engines with ``loads_adapters`` implement it."""
        raise NotImplementedError(f"the {self.name} engine does not load LoRA adapters")

    def remove_adapter(self, name: str) -> None:
        """Adapter ``name`` (:meth:`add_adapter`'s) no longer served, its tensors freed wherever they are
        held; no request in flight may name it (the caller waits for them). ValueError: no such adapter."""
        raise NotImplementedError(f"the {self.name} engine does not load LoRA adapters")

    def adapters(self) -> list[str]:
        """The adapters the engine serves by name, resident or not (none for an engine without them)."""
        return []

    def load_weight_rows(self, name: str, shape: Sequence[int], start: int, rows: Any) -> None:
        """The one way weights reach an engine: rows ``start ..`` (dim 0) of weight ``name`` (whole:
        ``shape``), inside :meth:`updating_weights`, then :meth:`finish_weight_rows`. A full load, a
        bucket of one, a delta and LoRA adapters are all rows (:mod:`toolrl.transports.weight_rows`);
        several senders may call it at once, for different rows. ``rows`` is valid only during the
        call. This default assembles whole tensors and loads them all in :meth:`finish_weight_rows`;
        engines that can write their weights in place override both and keep no copy."""
        with self._rows_staged[0]:
            staged = self._rows_staged[1]
            if name not in staged:
                staged[name] = rows.new_empty(tuple(shape))
            rows_of(staged[name], start, rows).copy_(rows)

    def finish_weight_rows(self) -> None:
        """Every row of the update is in: load what :meth:`load_weight_rows` assembled."""
        with self._rows_staged[0]:
            staged, self._rows_staged[1] = self._rows_staged[1], {}
        self.update_weights(staged)

    @functools.cached_property
    def _rows_staged(self) -> list[Any]:
        return [threading.Lock(), {}]

    def open_weight_receivers(self, transport: Any, links: Sequence[Any], index: int) -> list[Any]:
        """Receiver ``index`` of every link of a sync over a linked transport (``transport``: a
        :class:`toolrl.transports.LinkedTransport`), opened where this engine takes the bytes. This
        default opens them in this process and every bucket reaches the engine through
        :meth:`load_weight_rows`; an engine whose weights live in processes of its own (vllm's workers)
        may open them there and return receivers that load in place, leaving ``load`` uncalled."""
        return [transport.open_receiver(link, index) for link in links]

    @contextlib.contextmanager
    def updating_weights(self, version: int) -> Iterator[None]:
        """Load new weights inside this context; on leaving it they are ``version``. Engines that
        decode while weights load override it to hold decoding between two steps for the whole
        update, so no token is sampled from a mix of old and new weights."""
        yield
        self.weight_version = version

    async def check_trainable(self) -> str | None:
        """None when training may use this engine; else a one-line reason (an engine that cannot give
        token ids and logprobs, say). May ask the backend once."""
        return None

    async def prompt_logprobs(self, prompts: Sequence[list[int]], top: int = 0, start: int | Sequence[int] = 0,
                              adapter: str | None = None) -> list[PromptLogprobs]:
        """Each prompt's tokens scored by the model, in one batch: what a distillation teacher served
        by ``toolrl serve`` returns (vLLM's ``prompt_logprobs``). ``start`` (one for all prompts, or one
        a prompt, each 0 to len(prompt) - 1): the index of the first token to score; the result then holds
        the tokens from ``max(start, 1)`` on, exactly the tail ``[max(start, 1) - 1:]`` of the lists
        ``start=0`` gives, and an engine may skip the work for the positions before it (a teacher scores
        only the response). ``adapter``: the LoRA adapter that scores, on an engine serving adapters by
        name (as :meth:`generate`'s). An engine that cannot score given tokens raises NotImplementedError
        with the reason."""
        raise NotImplementedError(f"the {self.name} engine does not score given tokens (prompt log-probs)")

    def end_session(self, session_id: str) -> None:
        """Forget cached state of a finished trajectory."""

    def clone_session(self, session_id: str, into: Sequence[str]) -> None:
        """Give each session of ``into`` what is kept for ``session_id``, as if its turns had been
        theirs (a tree rollout's continuations, toolrl.rollout.tree): their next requests then prefill
        only what follows. This default keeps nothing, which is right for an engine that keeps no
        per-session state or whose prefix cache finds the shared prefix itself (vLLM, a server)."""

    async def sleep(self) -> None:
        """Release memory between rollout phases (KV caches, buffers) where the backend allows."""

    async def close(self) -> None:
        """Shut the engine down."""
