"""The built-in rollout engine: a Hugging Face causal LM driven by its own continuous-batching loop.

Every ``generate`` call (one per trajectory turn) becomes a request in a queue. A scheduler task on
the event loop repeatedly runs one *step* in a worker thread (``asyncio.to_thread``, so tool calls
keep running meanwhile): decode one token for every running row, then prefill the requests that
arrived since the last step and merge them into the running batch. A request therefore waits at
most one step before it starts, never for a whole batch to finish.

The KV cache is a per-layer buffer ``[slots, kv_heads, capacity, head_dim]`` that the engine owns:
rows are added and removed between steps, each by copying its own KV into or within the buffer (the
live rows are the first slots; see ``_Batch``). Columns are token positions in the buffer; a boolean
mask marks each row's real tokens (padding sits on the left of a row, between a reused session
prefix and the new tokens, and where a longer row joined after it). Keys are stored after RoPE with
each token's true position id, so a row's padding layout never changes its attention result, only the
floating-point summation order. Sliding-window layers (Gemma 3, gpt-oss, Mistral) get masks built
from each column's position, not its column distance: a token sees the ``sliding_window`` positions
before it, whatever gaps its row has.

With ``session_id`` (and ``n == 1``), the KV of a finished turn is kept; the next turn of the same
trajectory prefills only the tokens after the longest common prefix. The kept state is dropped when
the weights change (``update_weights`` or any in-place update of the module's parameters).

With an adapter per role (``model.adapters``: :meth:`apply_adapters` with
:func:`toolrl.training.lora.apply_adapters`), every request names its ``adapter`` and rows of different
adapters decode and prefill in one batch, each through its own (:func:`toolrl.engines.adapters.routed`).
KV is reused only under the adapter that computed it: a kept session serves a next turn of the same
adapter, and admitted requests share a prompt's prefill only when their adapters match.

Weights may change while requests are running (asynchronous training): an update made inside
:meth:`updating_weights` holds the step lock for the whole update, so it lands between two steps;
running rows continue on the new weights (the KV already computed for their earlier tokens stays
as it was), and each generation reports the version its first token was sampled with.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from toolrl.engines import (
    FinishReason,
    Generation,
    ModelSource,
    PromptLogprobs,
    RolloutEngine,
    SamplingParams,
    check_request,
    rows_of,
)
from toolrl.engines.adapters import adapter_names, has_routing, routed
from toolrl.model_sources import check_model_dir, load_model, load_processor, load_tokenizer, resolve_device
from toolrl.seeds import sample_seed, unseeded
from toolrl.trajectory import RoutedExperts

if TYPE_CHECKING:
    import torch
    from transformers.cache_utils import Cache

    from toolrl import masks
    from toolrl.engines.decoding import UNIFORM_BLOCK, BufferLayer, inverse_cdf
    from toolrl.engines.expert_routing import ExpertRouting
    from toolrl.engines.static_decode import StaticDecoder


def _import_torch() -> None:
    """Bind torch and the modules built on it as this module's names, once, when the first engine is made.
    Not at import: the run check reads this class (its options and ``check_run``) before anything loads,
    and torch's import alone is a second of ``toolrl train --check``."""
    global torch, Cache, masks, UNIFORM_BLOCK, BufferLayer, inverse_cdf, ExpertRouting
    import torch
    from transformers.cache_utils import Cache

    from toolrl import masks
    from toolrl.engines.decoding import UNIFORM_BLOCK, BufferLayer, inverse_cdf
    from toolrl.engines.expert_routing import ExpertRouting


class TransformersEngineConfig(BaseModel):
    """The ``engine:`` section for ``name: transformers``."""

    model_config = ConfigDict(extra="forbid")

    name: str = "transformers"
    device: str = Field("auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$", description="Ignored for a shared module.")
    dtype: Literal["float32", "bfloat16"] = Field("float32", description="Ignored for a shared module.")
    max_batch_size: int = Field(32, ge=1, description="Most rows (samples) decoded together.")
    max_model_len: int | None = Field(None, ge=1, description="Prompt + generation cap; default: the model's.")
    reuse_kv_cache: bool = Field(True, description="Keep a trajectory's KV between turns (session_id).")
    max_sessions: int = Field(1024, ge=0, description="Kept session caches (least recently used dropped).")
    seed: int | None = Field(None, description="Seeds requests whose SamplingParams.seed is None.")
    share_prompts: bool = Field(True, description="Prefill a prompt that several admitted requests share (a "
                                "group's n trajectories) once and clone its KV to them.")
    record_routes: bool = Field(False, description="A mixture-of-experts model: record the experts each token "
                                "was routed to (Generation.routed_experts), for algorithm.routing_replay: r3.")
    decode: Literal["auto", "eager", "static"] = Field(
        "auto", description="static: decode steps of fixed shapes per bucket of rows (engines.static_decode), "
        "captured as CUDA graphs on CUDA; eager: the growing buffers; auto: static on CUDA for a text model "
        "that records no routes, else eager.")


@dataclass
class EngineStats:
    """Running totals since the engine started (read them between rollout phases)."""

    prefilled_tokens: int = 0  # prompt tokens run through the model
    prefill_tokens_saved: int = 0  # prompt tokens not run because an identical admitted prompt was
    reused_tokens: int = 0  # prompt tokens whose KV came from the trajectory's previous turn
    generated_tokens: int = 0
    steps: int = 0  # model forward passes


@dataclass
class _Request:
    prompt: list[int]
    params: SamplingParams
    n: int
    session_id: str | None
    future: asyncio.Future[list[Generation]]
    results: list[Generation | None] = field(default_factory=list)
    remaining: int = 0
    weight_version: int = 0  # the engine's when the first token was sampled
    images: list[Any] = field(default_factory=list)  # the prompt's (toolrl.trajectory.TrajectoryImage)
    prefill_tokens_saved: int = 0  # prompt tokens not prefilled for it (kept KV, or another's prefill)
    adapter: int = -1  # its adapter's index in the engine's adapters; -1: the model has none per role


@dataclass
class _Row:
    """One sample being decoded."""

    req: _Request
    index: int
    generator: torch.Generator | None  # on the host, whatever the device; None: greedy
    next_token: int = -1  # sampled but not yet fed to the model
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    experts: list[torch.Tensor] = field(default_factory=list)  # [tokens, layers, top_k] pieces (record_routes)
    uniforms: list[float] = field(default_factory=list)  # drawn from the generator, not yet used (last first)

    def uniform(self) -> float:
        """The generator's next uniform in [0, 1), drawn UNIFORM_BLOCK at a time."""
        if not self.uniforms:
            block = torch.rand(UNIFORM_BLOCK, generator=self.generator, dtype=torch.float64)
            self.uniforms = block.tolist()[::-1]
        return self.uniforms.pop()


@dataclass
class _Session:
    tokens: list[int]  # tokens whose KV is kept (prompt + generation minus the last, unfed, token)
    keys: list[torch.Tensor]  # per layer [1, kv_heads, len(tokens), head_dim]
    values: list[torch.Tensor]
    version: int
    experts: torch.Tensor | None = None  # [len(tokens), layers, top_k] uint8 on the device (record_routes)
    adapter: int = -1  # the adapter its KV was computed under (_Request.adapter)


class _Batch:
    """The running rows and their KV buffers (touched only by the worker thread).

    The KV buffers have row slots to spare: the live rows are the first ``len(mask)`` slots, so the
    model runs on the contiguous view ``buf[:live]``, and a row joins or leaves by copying its own KV,
    never the whole batch's."""

    def __init__(self) -> None:
        self.rows: list[_Row] = []
        self.keys: list[torch.Tensor] = []  # per layer [slots, kv_heads, capacity, head_dim]
        self.values: list[torch.Tensor] = []
        self.mask: torch.Tensor | None = None  # [live rows, capacity] bool
        self.positions: torch.Tensor | None = None  # [rows] next position id per row
        self.rope_deltas: torch.Tensor | None = None  # [rows] a VLM's text position offset (engines.vision)
        self.prompt_experts: list[torch.Tensor] = []  # a prefill's: per prefilled row (record_routes)
        self.length = 0  # used columns

    @property
    def capacity(self) -> int:
        return 0 if self.mask is None else self.mask.shape[1]

    @property
    def slots(self) -> int:
        return self.keys[0].shape[0] if self.keys else 0


class TransformersEngine(RolloutEngine):
    name = "transformers"
    Options = TransformersEngineConfig
    loads_adapters = True
    partial_weight_updates = True

    def __init__(self, model: Any, tokenizer: Any, config: TransformersEngineConfig,
                 tokenizer_path: str | None = None, processor: Any = None) -> None:
        from toolrl.engines.vision import PromptVision

        _import_torch()
        self.model = model
        # The roles' adapters (model.adapters), each request routed through its own; empty: none per role.
        self._adapters = adapter_names(model) if has_routing(model) else []
        # A vision-language model's prompt inputs (images, 3-D positions); None: a text model.
        self.vision = PromptVision(model, processor) if processor is not None else None
        self.config = config
        self._tokenizer = tokenizer
        self._tokenizer_path = tokenizer_path
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        text_config = model.config.get_text_config()
        layer_types = getattr(text_config, "layer_types", None) or ()
        if other := set(layer_types) - {"full_attention", "sliding_attention"}:
            raise ValueError(f"the transformers engine supports full and sliding-window attention, got {other}")
        self.window, _ = masks.sliding_window(model.config)
        self.num_layers = text_config.num_hidden_layers
        self.max_model_len = config.max_model_len or getattr(text_config, "max_position_embeddings", None) or 1 << 30
        self._unseeded = unseeded(config.seed)
        # record_routes: the routers' hooks, and the expert ids of the last forward [rows, q, layers, top_k].
        self._routing = ExpertRouting(model) if config.record_routes else None
        # One byte an expert id up to 256 experts a layer (RoutedExperts), two beyond.
        self._expert_dtype = torch.uint8 if self._routing is None or self._routing.num_experts <= 256 else torch.int16
        self._experts: torch.Tensor | None = None
        self._static = self._static_decoder(config.decode)
        self._weight_ptrs = self._weight_pointers()
        self._pending: list[_Request] = []
        self._batch = _Batch()
        self._sessions: OrderedDict[str, _Session] = OrderedDict()
        self._sessions_lock = threading.Lock()
        # Held while the model runs; weight updates wait for it (reentrant: updating_weights holds it
        # around update_weights calls).
        self._step_lock = threading.RLock()
        self._version = 0
        self.stats = EngineStats()
        self._param_versions = self._parameter_versions()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._closed = False

    # ----------------------------------------------------------------- construction

    def _static_decoder(self, mode: str) -> StaticDecoder | None:
        from toolrl.engines.static_decode import StaticDecoder

        supported = self.vision is None and self._routing is None and not self._adapters
        if mode == "static" and not supported:
            raise ValueError("decode: static takes a text model that records no routes (record_routes: false) "
                             "and serves no adapter per role (model.adapters)")
        if mode == "eager" or (mode == "auto" and (self.device.type != "cuda" or not supported)):
            return None
        return StaticDecoder(self.model, graphs=self.device.type == "cuda")

    @classmethod
    def check_run(cls, run: Any) -> list[str]:
        """The run check (:mod:`toolrl.roles.run_check`): the model loads from the source's directory, and
        experts are recorded only where a model has them."""
        check_model_dir(run.model_dir, "the transformers engine", run.config)
        if run.config.engine.options.get("record_routes") and not run.experts:
            raise ValueError(f"record_routes: {run.model_dir} is a dense model (its config.json names no experts): "
                             "there are no routed experts to record")
        options = run.config.engine.options
        against = [what for what, found in (
            ("model.adapters, whose rows are routed to their role's adapter at each step", run.config.model.adapters),
            ("record_routes: true", options.get("record_routes")),
            (f"a vision-language model ({run.model_dir})", "vision_config" in run.model_config)) if found]
        if options.get("decode") == "static" and against:  # what _static_decoder refuses, before the model loads
            raise ValueError(f"decode: static takes a text model that records no routes and serves one policy, not "
                             f"{against[0]}: use decode: eager or auto")
        return []

    @classmethod
    def create(cls, source: ModelSource, config: Mapping[str, Any]) -> TransformersEngine:
        cfg = TransformersEngineConfig.model_validate(dict(config))
        if source.module is not None:
            model = source.module  # shared with the trainer: its device and dtype win
        else:
            model = load_model(source.path, dtype=cfg.dtype, device=resolve_device(cfg.device))
        return cls(model, source.tokenizer, cfg, tokenizer_path=source.path, processor=load_processor(source.path))

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            if self._tokenizer_path is None:
                raise ValueError("stop strings need a tokenizer: give ModelSource.tokenizer or a model path")
            self._tokenizer = load_tokenizer(self._tokenizer_path)
        return self._tokenizer

    # ----------------------------------------------------------------- public API

    async def generate(self, prompt_ids: list[int], params: SamplingParams, n: int = 1,
                       session_id: str | None = None, images: Sequence[Any] = (),
                       adapter: str | None = None) -> list[Generation]:
        if self._closed:
            raise RuntimeError("engine is closed")
        index = self._adapter_index(adapter)
        if images and self.vision is None:
            raise ValueError("the prompt has images but the model is not a vision-language model")
        if (empty := check_request(prompt_ids, params, n, self.max_model_len)) is not None:
            for gen in empty:
                gen.weight_version = self.weight_version
            return empty
        if params.stop_strings:
            _ = self.tokenizer  # load it now, not inside a step
        loop = asyncio.get_running_loop()
        self._ensure_scheduler(loop)
        req = _Request(list(prompt_ids), params, n, session_id, loop.create_future(),
                       results=[None] * n, remaining=n, images=list(images), adapter=index)
        self._pending.append(req)
        assert self._wake is not None
        self._wake.set()
        return await req.future

    def _adapter_index(self, adapter: str | None) -> int:
        """``adapter``'s index among the engine's adapters (-1 for None on a model without them)."""
        if not self._adapters:
            if adapter is not None:
                raise ValueError(f"adapter {adapter!r}: the engine's model has no LoRA adapter per role")
            return -1
        if adapter not in self._adapters:
            asked = "no adapter" if adapter is None else f"unknown adapter {adapter!r}"
            raise ValueError(f"{asked}: the engine serves an adapter per role: {', '.join(self._adapters)}")
        return self._adapters.index(adapter)

    async def prompt_logprobs(self, prompts: Sequence[list[int]], top: int = 0) -> list[PromptLogprobs]:
        if self._closed:
            raise RuntimeError("engine is closed")
        if self._adapters:
            raise NotImplementedError("the transformers engine scores prompts under one policy, and this one serves "
                                      f"an adapter per role ({', '.join(self._adapters)})")
        for ids in prompts:
            if not 0 < len(ids) <= self.max_model_len:
                raise ValueError(f"a prompt to score holds {len(ids)} tokens: it must hold 1 to {self.max_model_len}")
        return await asyncio.to_thread(self._score, [list(p) for p in prompts], top)

    def _score(self, prompts: list[list[int]], top: int) -> list[PromptLogprobs]:
        """Forwards of up to ``max_batch_size`` prompts, right-padded (a causal model's positions before
        the padding do not see it), under the step lock: between two decode steps, never inside one."""
        out: list[PromptLogprobs] = []
        size = self.config.max_batch_size
        with self._step_lock, torch.no_grad():
            for b in range(0, len(prompts), size):
                chunk = prompts[b:b + size]
                width = max(len(p) for p in chunk)
                x = torch.zeros(len(chunk), width, dtype=torch.long, device=self.device)
                mask = torch.zeros_like(x)
                for i, p in enumerate(chunk):
                    x[i, :len(p)] = torch.tensor(p)
                    mask[i, :len(p)] = 1
                lp = torch.log_softmax(self.model(input_ids=x, attention_mask=mask).logits[:, :-1].float(), -1)
                chosen = lp.gather(-1, x[:, 1:, None])
                ranks = (lp > chosen).sum(-1) + 1
                best = lp.topk(top, -1) if top else None
                for i, p in enumerate(chunk):
                    n = len(p) - 1
                    pairs = [] if best is None else [list(zip(best.indices[i, j].tolist(), best.values[i, j].tolist()))
                                                     for j in range(n)]
                    out.append(PromptLogprobs(chosen[i, :n, 0].tolist(), ranks[i, :n].tolist(),
                                              pairs or [[] for _ in range(n)]))
        return out

    def update_weights(self, state_dict: Mapping[str, Any]) -> None:
        with self._step_lock, torch.no_grad():
            own = self.model.state_dict(keep_vars=True)
            unknown = sorted(set(state_dict) - set(own))
            if unknown:
                raise KeyError(f"update_weights got keys the model does not have: {unknown[:5]}")
            for name, value in state_dict.items():
                target = own[name]
                if value is target or (value.data_ptr() == target.data_ptr() and value.shape == target.shape):
                    continue  # shared with the trainer: nothing to copy
                target.copy_(value)
            self._invalidate_sessions()

    def load_weight_rows(self, name: str, shape: Sequence[int], start: int, rows: Any) -> None:
        # In place, straight from the sender's tensor or the transport's buffer (nothing to copy from a
        # module shared with the trainer); updating_weights holds decoding meanwhile.
        own = self._weights_by_name
        if name not in own:
            raise KeyError(f"a weight update sent {name!r}, which the model does not have")
        if tuple(own[name].shape) != tuple(shape):
            raise ValueError(f"a weight update sent {name!r} as {tuple(shape)}, the model's is {tuple(own[name].shape)}")
        target = rows_of(own[name], start, rows.shape[0] if rows.dim() else 1)
        if (rows.data_ptr(), rows.shape) != (target.data_ptr(), target.shape):
            with torch.no_grad():
                target.copy_(rows)

    def finish_weight_rows(self) -> None:
        """Nothing is staged: the rows were written in place (sessions are dropped by updating_weights)."""

    def weight_tensors(self) -> Mapping[str, Any]:
        return {name: t.detach() for name, t in self._weights_by_name.items()}

    def apply_adapters(self, inject: Callable[[Any], Any]) -> None:
        # peft wraps the adapted Linears in place: the base weights stay, the names gain lora_A/lora_B.
        # Its new modules start in training mode (adapter dropout): the engine only samples.
        # Adapters per role (toolrl.training.lora.apply_adapters) route each row through its own.
        from toolrl.engines.adapters import adapter_names, has_routing

        with self._step_lock:
            inject(self.model)
            self.model.requires_grad_(False).eval()
            self.__dict__.pop("_weights_by_name", None)
            self._invalidate_sessions()
            if self._static is not None:
                self._static.reset()  # new modules: the captured graphs read the old ones
            if has_routing(self.model):
                self._adapters = adapter_names(self.model)
                self._static = self._static_decoder(self.config.decode)

    @functools.cached_property
    def _weights_by_name(self) -> dict[str, torch.Tensor]:
        return self.model.state_dict(keep_vars=True)

    @contextlib.contextmanager
    def updating_weights(self, version: int) -> Iterator[None]:
        with self._step_lock:
            yield
            self._invalidate_sessions()  # also when the update wrote a shared module directly
            self.weight_version = version

    def end_session(self, session_id: str) -> None:
        with self._sessions_lock:
            self._sessions.pop(session_id, None)

    def clone_session(self, session_id: str, into: Sequence[str]) -> None:
        # The clones share the kept tensors (nothing writes them in place), so their first requests,
        # with one prompt, are prefilled once (_prompt_sources).
        with self._sessions_lock:
            kept = self._sessions.get(session_id)
            for sid in into if kept is not None else ():
                self._sessions[sid] = kept
                self._sessions.move_to_end(sid)
            while len(self._sessions) > self.config.max_sessions:
                self._sessions.popitem(last=False)

    async def sleep(self) -> None:
        # The running batch frees its buffers whenever it empties; only kept sessions outlive it.
        with self._sessions_lock:
            self._sessions.clear()
        if self._static is not None:
            self._static.reset()  # their memory pool goes too
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    async def close(self) -> None:
        self._closed = True
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, RuntimeError):
                await self._task
        self._fail_all(RuntimeError("engine closed"))
        with self._sessions_lock:
            self._sessions.clear()

    # ----------------------------------------------------------------- scheduler (event loop)

    def _ensure_scheduler(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._loop is loop and self._task is not None and not self._task.done():
            return
        # First use, or a new event loop (e.g. one asyncio.run per rollout phase): whatever the old
        # loop left behind can never complete, so start clean.
        self._fail_all(RuntimeError("engine restarted on a new event loop"))
        self._loop, self._wake = loop, asyncio.Event()
        self._task = loop.create_task(self._schedule(), name="toolrl-transformers-engine")

    async def _schedule(self) -> None:
        assert self._wake is not None
        while True:
            if not self._pending and not self._batch.rows:
                self._wake.clear()
                await self._wake.wait()
                continue
            admitted = self._admit()
            cancelled = {id(r.req) for r in self._batch.rows if r.req.future.done()}
            finished: list[_Request] = []
            failed: Exception | None = None
            try:
                await asyncio.to_thread(self._step, admitted, cancelled, finished)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a failed step fails its requests, not the engine
                failed = exc
            # Requests completed before a failure later in the step have their whole results: they get
            # them (they have left the batch, so failing the batch would never reach them).
            for req in finished:
                if not req.future.done():
                    req.future.set_result(list(req.results))  # type: ignore[arg-type]
            if failed is not None:
                self._fail_batch(admitted, failed)

    def _admit(self) -> list[_Request]:
        admitted: list[_Request] = []
        rows = len(self._batch.rows)
        while self._pending:
            req = self._pending[0]
            if req.future.done():  # cancelled while queued
                self._pending.pop(0)
                continue
            if rows and rows + req.n > self.config.max_batch_size:
                break
            admitted.append(self._pending.pop(0))
            rows += req.n
        return admitted

    def _fail_batch(self, admitted: list[_Request], exc: BaseException) -> None:
        reqs = {id(r.req): r.req for r in self._batch.rows} | {id(r): r for r in admitted}
        for req in reqs.values():
            if not req.future.done():
                req.future.set_exception(exc)
        self._batch = _Batch()

    def _fail_all(self, exc: BaseException) -> None:
        for req in [r.req for r in self._batch.rows] + self._pending:
            if not req.future.done() and not req.future.get_loop().is_closed():
                req.future.set_exception(exc)
        self._pending.clear()
        self._batch = _Batch()

    # ----------------------------------------------------------------- one step (worker thread)

    def _step(self, admitted: list[_Request], cancelled: set[int], finished: list[_Request]) -> None:
        """One decode step of the batch and the prefill of the admitted requests; the requests they
        complete go into ``finished`` as they do."""
        with self._step_lock, torch.no_grad():
            batch = self._batch
            if cancelled:
                self._keep(batch, [i for i, r in enumerate(batch.rows) if id(r.req) not in cancelled], [])
            if batch.rows:
                logits = self._decode(batch)
                self._advance(batch, batch.rows, logits, finished)
            if admitted:
                for req in admitted:
                    req.weight_version = self.weight_version
                new, logits = self._prefill(admitted)
                self._advance(new, new.rows, logits, finished)
                self._merge(batch, new)

    def _forward(self, batch: _Batch, input_ids: torch.Tensor, positions: torch.Tensor, adapters: list[int],
                 **images: torch.Tensor) -> torch.Tensor:
        """Run the model on ``input_ids`` [rows, q] after ``batch.length`` cached columns; returns the
        last position's logits [rows, vocab] in float32. ``adapters``: each row's (_Request.adapter);
        ``images``: a VLM's pixel inputs for them."""
        b, q = input_ids.shape
        self._reserve(batch, batch.length + q)
        layers = [BufferLayer(batch.keys[i][:b] if batch.keys else None,
                               batch.values[i][:b] if batch.values else None,
                               batch.length, batch.capacity) for i in range(self.num_layers)]
        assert batch.mask is not None
        mask = batch.mask[:, : batch.length + q]
        if self._routing is not None:
            self._routing.replay(None)
        with self._routed(adapters):
            out = self.model(
                input_ids=input_ids,
                attention_mask=mask if self.window is None else self._window_masks(mask, q),
                position_ids=positions,
                past_key_values=Cache(layers=layers),
                use_cache=True,
                logits_to_keep=1,
                **images,
            )
        self.stats.steps += 1
        if self._routing is not None:  # left on the device: copied to the host once per generation, not per step
            self._experts = self._routing.recorded().view(b, q, self._routing.layers, -1).to(self._expert_dtype)
        if not batch.keys:  # the layers allocated them (a prefill without kept KV)
            batch.keys = [layer.kbuf for layer in layers]
            batch.values = [layer.vbuf for layer in layers]
        batch.length += q
        return out.logits[:, -1].float()

    def _routed(self, adapters: list[int]) -> contextlib.AbstractContextManager[None]:
        """Each row through its adapter, when the model has adapters per role."""
        if not self._adapters:
            return contextlib.nullcontext()
        return routed(self.model, torch.tensor(adapters, device=self.device), keep_stacked=True)

    def _static_step(self, batch: _Batch, ids: torch.Tensor) -> torch.Tensor:
        """The decode step's logits through the static decoder: rows padded to their bucket (a padding
        row sees only its own column, so its softmax has a key), attention over the whole capacity."""
        assert batch.mask is not None and batch.positions is not None and self._static is not None
        live = len(batch.rows)
        rows = self._bucket(live)
        mask, positions = batch.mask, batch.positions[:, None]
        if rows > live:
            pad = mask.new_zeros(rows - live, batch.capacity)
            pad[:, batch.length] = True
            mask = torch.cat([mask, pad])
            ids = torch.cat([ids, ids.new_zeros(rows - live, 1)])
            positions = torch.cat([positions, positions.new_zeros(rows - live, 1)])
        prepared = mask[:, None, None, :] if self.window is None else self._window_masks(mask, 1)
        column = torch.tensor([batch.length], device=self.device)
        logits = self._static.step([k[:rows] for k in batch.keys], [v[:rows] for v in batch.values], ids, positions,
                                   column, prepared)
        self.stats.steps += 1
        batch.length += 1
        return logits[:live]

    def _window_masks(self, mask: torch.Tensor, q: int) -> torch.Tensor | dict[str, torch.Tensor]:
        """Additive [rows, 1, q, columns] masks for the last ``q`` columns of ``mask``: causal, and
        for sliding-window layers also within the window, both by position (a row's real columns hold
        its positions 0, 1, ... in order)."""
        pos = mask.cumsum(1) - 1
        keys, queries = pos[:, None, None, :], pos[:, None, -q:, None]
        return masks.by_layer_type(mask[:, None, None, :] & (keys <= queries), queries, keys, self.model.config,
                                   self.dtype)

    def _reserve(self, batch: _Batch, needed: int, slots: int = 0) -> None:
        """Grow the buffers (doubling) so that ``needed`` columns and ``slots`` rows fit; the live rows'
        used columns are copied over."""
        if needed <= batch.capacity and slots <= batch.slots:
            return
        assert batch.mask is not None
        capacity = batch.capacity if needed <= batch.capacity else self._capacity(max(needed + 64, 2 * batch.capacity))
        slots = max(slots, batch.slots)
        live, used = batch.mask.shape[0], batch.length
        mask = batch.mask.new_zeros(live, capacity)
        mask[:, :used] = batch.mask[:, :used]
        batch.mask = mask

        def grown(buf: torch.Tensor) -> torch.Tensor:
            out = buf.new_zeros(slots, buf.shape[1], capacity, buf.shape[3])
            out[:live, :, :used] = buf[:live, :, :used]
            return out

        if batch.keys:
            batch.keys = [grown(k) for k in batch.keys]
            batch.values = [grown(v) for v in batch.values]

    def _capacity(self, columns: int) -> int:
        """Buffer columns for ``columns``: static decode rounds them to a power of two, so that its
        steps take few shapes (one CUDA graph each)."""
        return 1 << (columns - 1).bit_length() if self._static is not None else columns

    def _bucket(self, rows: int) -> int:
        from toolrl.engines.static_decode import bucket

        return bucket(rows, self.config.max_batch_size)

    def _decode(self, batch: _Batch) -> torch.Tensor:
        assert batch.mask is not None and batch.positions is not None
        ids = torch.tensor([[r.next_token] for r in batch.rows], device=self.device)
        # Static steps run on a bucket of rows: the buffers get its slots before the column is marked.
        self._reserve(batch, batch.length + 1, 0 if self._static is None else self._bucket(len(batch.rows)))
        batch.mask[:, batch.length] = True
        if self._static is not None:
            logits = self._static_step(batch, ids)
        else:
            logits = self._forward(batch, ids, batch.positions[:, None], [r.req.adapter for r in batch.rows])
        batch.positions += 1
        if self._experts is not None:
            for row, fed in zip(batch.rows, self._experts):
                row.experts.append(fed)
        return logits

    def _prefill(self, admitted: list[_Request]) -> tuple[_Batch, torch.Tensor]:
        """Prefill the admitted prompts together (left-padded), each on top of its kept session KV if
        any; returns a batch with one row per sample. A prompt is prefilled once for all its samples:
        those of a request with n > 1 and (``share_prompts``) those of admitted requests with the same
        prompt and no kept session, which is how a group's trajectories arrive, or the same kept KV,
        which is how a tree rollout's continuations arrive (:meth:`clone_session`)."""
        reused = [self._take_session(req) for req in admitted]
        source, unique = self._prompt_sources(admitted, reused)
        group, logits = self._prefill_rows([admitted[i] for i in unique], [reused[i] for i in unique])
        for i, req in enumerate(admitted):
            shared = unique[source[i]] != i
            req.prefill_tokens_saved = len(req.prompt) if shared else len(reused[i].tokens) if reused[i] else 0
            self.stats.prefill_tokens_saved += len(req.prompt) if shared else 0
        # One row per sample: each sample reads its prompt's prefilled row.
        expand = [source[i] for i, req in enumerate(admitted) for _ in range(req.n)]
        group.rows = [_Row(req, j, self._generator(req, j)) for req in admitted for j in range(req.n)]
        if self._routing is not None:
            for row, i in zip(group.rows, expand):
                row.experts = [group.prompt_experts[i]]
        if expand != list(range(len(unique))):
            order = torch.tensor(expand, device=self.device)
            group.keys = [k.index_select(0, order) for k in group.keys]
            group.values = [v.index_select(0, order) for v in group.values]
            group.mask = group.mask.index_select(0, order)
            logits = logits.index_select(0, order)
            if group.rope_deltas is not None:
                group.rope_deltas = group.rope_deltas.index_select(0, order)
        group.positions = group.mask.sum(1) + (group.rope_deltas if group.rope_deltas is not None else 0)
        return group, logits

    def _prompt_sources(self, admitted: list[_Request], reused: list[_Session | None]) -> tuple[list[int], list[int]]:
        """Per admitted request, the prefill row it reads; and per row, the request prefilled there."""
        first: dict[tuple[int, ...], int] = {}
        source: list[int] = []
        unique: list[int] = []
        for i, (req, kept) in enumerate(zip(admitted, reused)):
            # Image tokens are alike whatever the image: a prompt with images is keyed by them too; one on
            # kept KV, by that KV (cloned sessions share it: clone_session).
            kv = None if kept is None else (kept.keys[0].data_ptr(), len(kept.tokens))
            key = ((tuple(req.prompt), tuple(i.png for i in req.images), kv, req.adapter) if self.config.share_prompts
                   else None)
            if key is not None and key in first:
                source.append(first[key])
                continue
            if key is not None:
                first[key] = len(unique)
            source.append(len(unique))
            unique.append(i)
        return source, unique

    def _prefill_rows(self, admitted: list[_Request], reused: list[_Session | None]) -> tuple[_Batch, torch.Tensor]:
        """One prefilled row per request (left-padded, on its kept session KV if any): KV and logits."""
        prefix = [len(s.tokens) if s else 0 for s in reused]
        deltas = [req.prompt[p:] for req, p in zip(admitted, prefix)]
        tc, dm, b = max(prefix), max(map(len, deltas)), len(admitted)
        # Room for the whole generation, so a long context's turn never copies its buffer to grow; at
        # most the prompt's own size again (a short prompt grows cheaply), within the model's context.
        longest = max(req.params.max_new_tokens for req in admitted)
        capacity = self._capacity(tc + dm + max(1, min(longest, max(64, tc + dm), self.max_model_len - tc - dm)))
        group = _Batch()
        group.mask = torch.zeros(b, capacity, dtype=torch.bool, device=self.device)
        ids = torch.zeros(b, dm, dtype=torch.long, device=self.device)  # padding ids are masked out
        pos = torch.zeros(b, dm, dtype=torch.long, device=self.device)
        for i, (delta, p) in enumerate(zip(deltas, prefix)):
            group.mask[i, tc - p : tc] = True
            group.mask[i, tc + dm - len(delta) : tc + dm] = True
            ids[i, dm - len(delta) :] = torch.tensor(delta, device=self.device)
            pos[i, dm - len(delta) :] = torch.arange(p, p + len(delta), device=self.device)
        if tc:
            group.keys = [self._place_prefixes([s.keys[li] if s else None for s in reused], prefix, tc, capacity)
                          for li in range(self.num_layers)]
            group.values = [self._place_prefixes([s.values[li] if s else None for s in reused], prefix, tc, capacity)
                            for li in range(self.num_layers)]
            group.length = tc
        images: dict[str, torch.Tensor] = {}
        if any(req.images for req in admitted):
            pos, images = self._vision_prefill(group, admitted, prefix, dm)
        logits = self._forward(group, ids, pos, [req.adapter for req in admitted], **images)
        if self._experts is not None:  # each prompt's: its kept session's, then its new tokens'
            group.prompt_experts = [torch.cat(([s.experts[:p]] if s is not None and s.experts is not None else [])
                                              + [self._experts[i, dm - len(d):]])
                                    for i, (s, p, d) in enumerate(zip(reused, prefix, deltas))]
        self.stats.prefilled_tokens += sum(map(len, deltas))
        self.stats.reused_tokens += sum(prefix)
        return group, logits

    def _vision_prefill(self, group: _Batch, admitted: list[_Request], prefix: list[int],
                        dm: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """A VLM prefill's 3-D positions [3, rows, dm] (each row's new tokens, left-padded) and the pixel
        inputs of the images among the new tokens, in row order (the order the model fills them in);
        sets the rows' rope deltas."""
        assert self.vision is not None
        pos = torch.zeros(3, len(admitted), dm, dtype=torch.long, device=self.device)
        deltas, shown = [], []
        for i, (req, p) in enumerate(zip(admitted, prefix)):
            full, delta = self.vision.positions(req.prompt, req.images, self.device)
            pos[:, i, dm - (len(req.prompt) - p):] = full[:, p:]
            deltas.append(delta)
            shown += self.vision.images_from(req.prompt, req.images, p)
        group.rope_deltas = torch.tensor(deltas, device=self.device)
        return pos, self.vision.pixels(shown, self.device, self.dtype) if shown else {}

    @staticmethod
    def _place_prefixes(parts: list[torch.Tensor | None], prefix: list[int], tc: int, capacity: int) -> torch.Tensor:
        """Stack per-row kept KV [1, heads, p, dim], right-aligned at column ``tc``."""
        like = next(t for t in parts if t is not None)
        out = like.new_zeros(len(parts), like.shape[1], capacity, like.shape[3])
        for i, (t, p) in enumerate(zip(parts, prefix)):
            if t is not None:
                out[i, :, tc - p : tc] = t[0, :, :p]
        return out

    def _generator(self, req: _Request, index: int) -> torch.Generator | None:
        if req.params.temperature == 0:
            return None
        seed = req.params.seed if req.params.seed is not None else next(self._unseeded)
        return torch.Generator().manual_seed(sample_seed(seed, index))

    def _advance(self, batch: _Batch, rows: list[_Row], logits: torch.Tensor, finished: list[_Request]) -> None:
        """Sample one token per row, record it, and drop rows that are done."""
        tokens, logprobs = self._sample(rows, logits)
        self.stats.generated_tokens += len(tokens)
        keep: list[int] = []
        done: list[tuple[int, _Row]] = []
        for i, (row, tok, lp) in enumerate(zip(rows, tokens, logprobs)):
            row.tokens.append(tok)
            row.logprobs.append(lp)
            row.next_token = tok
            reason, stop = self._finish(row)
            if reason is None:
                keep.append(i)
                continue
            row.req.results[row.index] = Generation(list(row.tokens), list(row.logprobs), reason, stop,
                                                    row.req.weight_version,
                                                    row.req.prefill_tokens_saved if row.index == 0 else 0,
                                                    RoutedExperts.of(torch.cat(row.experts).cpu()) if row.experts else None)
            row.req.remaining -= 1
            if row.req.remaining == 0:
                finished.append(row.req)
            done.append((i, row))
        if done:
            self._keep(batch, keep, done)

    def _finish(self, row: _Row) -> tuple[FinishReason | None, int | str | None]:
        params = row.req.params
        tok = row.tokens[-1]
        if tok in params.stop_token_ids:
            return "stop", tok
        if params.stop_strings:
            # A stop string of b bytes spans at most b + 1 tokens (every token is >= 1 byte), and
            # the check runs after every token, so this window sees every new occurrence.
            width = max(len(s.encode()) for s in params.stop_strings) + 1
            tail = self.tokenizer.decode(row.tokens[-width:], skip_special_tokens=False,
                                         clean_up_tokenization_spaces=False)
            for s in params.stop_strings:
                if s in tail:
                    return "stop_string", s
        if len(row.tokens) >= params.max_new_tokens or len(row.req.prompt) + len(row.tokens) >= self.max_model_len:
            return "length", None
        return None, None

    def _sample(self, rows: list[_Row], logits: torch.Tensor) -> tuple[list[int], list[float]]:
        """Greedy rows take the argmax (logprob from the raw logits); sampled rows draw from
        softmax(logits / T), restricted to the top-p nucleus, by inverting the CDF at one uniform from
        their own generator (all rows' reach the device in one copy). The logprob is that of
        softmax(logits / T), before top-p."""
        temps = [r.req.params.temperature for r in rows]
        if any(t not in (0, 1) for t in temps):
            logits = logits / torch.tensor([t or 1.0 for t in temps], device=logits.device)[:, None]
        probs = torch.softmax(logits, dim=-1)
        sampled = [i for i, t in enumerate(temps) if t != 0]
        # argmax over the vocabulary is not free on CPU: only greedy rows need it.
        chosen = logits.argmax(-1) if len(sampled) < len(rows) else logits.new_zeros(len(rows), dtype=torch.long)
        if sampled:
            p = probs if len(sampled) == len(rows) else probs[sampled]
            nucleus = [k for k, i in enumerate(sampled) if rows[i].req.params.top_p < 1.0]
            if nucleus:
                top_p = torch.tensor([rows[sampled[k]].req.params.top_p for k in nucleus], device=p.device)
                sorted_p, order = p[nucleus].sort(dim=-1, descending=True)
                # Keep the smallest prefix whose mass reaches top_p (always at least the top token).
                outside = (sorted_p.cumsum(-1) - sorted_p) >= top_p[:, None]
                p = p.clone() if p is probs else p  # the logprobs are taken before top-p
                p[nucleus] = torch.zeros_like(sorted_p).scatter(-1, order, sorted_p.masked_fill(outside, 0.0))
            u = torch.tensor([rows[i].uniform() for i in sampled], dtype=torch.float64, device=p.device)
            chosen[torch.tensor(sampled, device=p.device)] = inverse_cdf(p, u)
        logprobs = probs.gather(1, chosen[:, None])[:, 0].log()
        # One copy to the host for both (token ids are exact in float64).
        ids, lps = torch.stack((chosen.to(torch.float64), logprobs.to(torch.float64))).tolist()
        return [int(i) for i in ids], lps

    # ----------------------------------------------------------------- batch surgery (worker thread)

    def _keep(self, batch: _Batch, keep: list[int], done: list[tuple[int, _Row]]) -> None:
        """Keep rows ``keep``; save the session KV of ``done`` rows that have a session."""
        for i, row in done:
            if row.req.session_id is not None and row.req.n == 1 and self.config.reuse_kv_cache:
                self._save_session(batch, i, row)
        if len(keep) == len(batch.rows):
            return
        if not keep:
            self._batch_clear(batch)
            return
        # The kept rows past the new end move into the freed slots before it: one row's KV each.
        live, kept = len(keep), set(keep)
        holes = [i for i in range(live) if i not in kept]
        movers = [i for i in keep if i >= live]
        order = list(range(live))
        for hole, mover in zip(holes, movers):
            order[hole] = mover
        if movers:
            dst, src = torch.tensor(holes, device=self.device), torch.tensor(movers, device=self.device)
            for buf in batch.keys + batch.values:
                buf[dst, :, : batch.length] = buf[src, :, : batch.length]
        idx = torch.tensor(order, device=self.device)
        batch.rows = [batch.rows[i] for i in order]
        assert batch.mask is not None and batch.positions is not None
        batch.mask = batch.mask.index_select(0, idx)
        batch.positions = batch.positions.index_select(0, idx)
        self._compact(batch)

    @staticmethod
    def _batch_clear(batch: _Batch) -> None:
        batch.rows, batch.keys, batch.values = [], [], []
        batch.mask = batch.positions = None
        batch.length = 0

    def _compact(self, batch: _Batch) -> None:
        """Drop padding columns when they waste a quarter of the cache: each row's real columns are
        gathered, in order, to the right end (keys keep their RoPE positions, so this is exact)."""
        assert batch.mask is not None
        used = batch.mask[:, : batch.length]
        real = int(used.sum(1).max())
        waste = batch.length - real
        if waste < max(16, batch.length // 4):
            return
        # A stable sort on the mask puts each row's padding first and its real columns last, in order.
        order = torch.sort(used.to(torch.int8), dim=1, stable=True).indices[:, waste:]
        capacity = self._capacity(real + max(64, real // 2))
        mask = torch.zeros(len(batch.rows), capacity, dtype=torch.bool, device=self.device)
        mask[:, :real] = used.gather(1, order)
        batch.keys = [self._gather_columns(k, order, capacity) for k in batch.keys]
        batch.values = [self._gather_columns(v, order, capacity) for v in batch.values]
        batch.mask, batch.length = mask, real

    @staticmethod
    def _gather_columns(buf: torch.Tensor, order: torch.Tensor, capacity: int) -> torch.Tensor:
        """The live rows' columns ``order`` [live, n] of ``buf``, first in a buffer with its slots."""
        (b, n), (slots, h, _, d) = order.shape, buf.shape
        out = buf.new_zeros(slots, h, capacity, d)
        out[:b, :, :n] = buf[:b].gather(2, order[:, None, :, None].expand(b, h, n, d))
        return out

    def _merge(self, batch: _Batch, new: _Batch) -> None:
        """Write the rows of ``new`` into the next free slots of ``batch``, right-aligned at the batch's
        write column. A longer newcomer moves that column right instead: the running rows keep their
        KV where it is and a masked gap (``_compact`` drops gaps once they waste a quarter)."""
        if not new.rows:
            return
        if not batch.rows:
            self._batch = new
            return
        assert batch.mask is not None and new.mask is not None and batch.positions is not None
        b1, b2, length = len(batch.rows), len(new.rows), max(batch.length, new.length)
        # Out of slots: double them (up to max_batch_size), so the next joiner finds its slot free.
        spare = min(2 * batch.slots, self.config.max_batch_size)
        self._reserve(batch, length, b1 + b2 if b1 + b2 <= batch.slots else max(b1 + b2, spare))
        start = length - new.length
        # Masked columns keep what a former row left there: finite KV that gets exactly zero weight.
        for dst, src in zip(batch.keys + batch.values, new.keys + new.values):
            dst[b1 : b1 + b2, :, start:length] = src[:b2, :, : new.length]  # its live rows, not its spare slots
        mask = batch.mask.new_zeros(b1 + b2, batch.capacity)
        mask[:b1] = batch.mask
        mask[b1:, start:length] = new.mask[:, : new.length]
        batch.rows += new.rows
        batch.mask, batch.length = mask, length
        assert new.positions is not None
        batch.positions = torch.cat([batch.positions, new.positions])
        self._compact(batch)

    # ----------------------------------------------------------------- sessions

    def _parameter_versions(self) -> tuple[int, ...]:
        # Tensor._version counts in-place writes: an optimizer step on a shared module bumps it.
        return tuple(p._version for p in self.model.parameters())

    def _weight_pointers(self) -> tuple[int, ...]:
        return tuple(p.data_ptr() for p in self.model.parameters())

    def _invalidate_sessions(self) -> None:
        with self._sessions_lock:
            self._sessions.clear()
        self._version += 1
        self._param_versions = self._parameter_versions()
        if self._static is not None and (ptrs := self._weight_pointers()) != self._weight_ptrs:
            self._static.reset()  # a weight was replaced, not written in place: graphs read the old one
            self._weight_ptrs = ptrs

    def _save_session(self, batch: _Batch, i: int, row: _Row) -> None:
        assert batch.mask is not None
        cols = batch.mask[i, : batch.length].nonzero()[:, 0]
        tokens = row.req.prompt + row.tokens[:-1]
        if cols.numel() != len(tokens):
            return  # cannot happen unless the batch bookkeeping is broken; never store a wrong cache
        # Indexing with a tensor copies, so the kept KV does not pin the batch buffers.
        session = _Session(tokens, [k[i : i + 1, :, cols] for k in batch.keys],
                           [v[i : i + 1, :, cols] for v in batch.values], self._version,
                           torch.cat(row.experts) if row.experts else None, row.req.adapter)
        with self._sessions_lock:
            self._sessions[row.req.session_id] = session  # type: ignore[index]
            self._sessions.move_to_end(row.req.session_id)  # type: ignore[arg-type]
            while len(self._sessions) > self.config.max_sessions:
                self._sessions.popitem(last=False)

    def _take_session(self, req: _Request) -> _Session | None:
        """The kept KV usable for ``req``, cut to its longest common prefix with the prompt (at least
        one prompt token is left to feed, since its logits start the generation)."""
        if req.session_id is None or req.n != 1 or not self.config.reuse_kv_cache:
            return None
        if self._parameter_versions() != self._param_versions:
            self._invalidate_sessions()
        with self._sessions_lock:
            session = self._sessions.pop(req.session_id, None)
        if session is None or session.version != self._version or session.adapter != req.adapter:
            return None  # never a prefix computed under other weights, or another role's adapter
        limit = min(len(session.tokens), len(req.prompt) - 1)
        common = 0
        while common < limit and session.tokens[common] == req.prompt[common]:
            common += 1
        if common == 0:
            return None
        return _Session(session.tokens[:common], [k[:, :, :common] for k in session.keys],
                        [v[:, :, :common] for v in session.values], session.version,
                        None if session.experts is None else session.experts[:common], session.adapter)


