"""The built-in rollout engine: a Hugging Face causal LM driven by its own continuous-batching loop, in
parts (the modules of this package): the requests' queue and admission (:mod:`.scheduler`), the KV of
the running rows and of a trajectory's turns (:mod:`.kv_store`), how a forward runs, chosen once
(:mod:`.step_runner`, :mod:`.static_decode`), and what it takes of the modeling layer: each row's
adapter per role (:class:`~toolrl.modeling.adapter_routing.RowAdapters`), packed linears
(:class:`~toolrl.modeling.packed_linears.PackedLinears`) and recorded routes
(:class:`~toolrl.modeling.expert_routing.ExpertRouting`).

Weights may change while requests are running (asynchronous training): an update made inside
:meth:`updating_weights` holds the step lock for the whole update, so it lands between two steps;
running rows continue on the new weights (the KV already computed for their earlier tokens stays as it
was), and each generation reports the version its first token was sampled with.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from toolrl.engines import (
    Generation,
    ModelSource,
    PromptLogprobs,
    RolloutEngine,
    SamplingParams,
    check_request,
    rows_of,
    score_starts,
)
from toolrl.engines.transformers.adapter_slots import AdapterSlots
from toolrl.engines.transformers.scheduler import Request, Scheduler
from toolrl.engines.transformers.scheduler import Row as _Row
from toolrl.model_sources import (
    check_model_dir,
    load_model,
    load_processor,
    resolve_device,
    tokenizer_or_load,
)
from toolrl.modeling.adapter_routing import RowAdapters
from toolrl.seeds import unseeded

if TYPE_CHECKING:
    import torch

    from toolrl.config import AdapterConfig
    from toolrl.engines.transformers.decoding import sample
    from toolrl.engines.transformers.kv_store import KVBatch, prefill_sources
    from toolrl.modeling.packed_linears import PackedLinears
    from toolrl.plugins.parts import RunFacts


def _import_torch() -> None:
    """Bind torch and the engine's parts built on it as this module's names, once, when the first engine is
    made. Not at import: the run check reads this class (its options and ``check_run``) before anything
    loads, and torch's import alone is a second of ``toolrl train --check``."""
    global torch, sample, KVBatch, prefill_sources, PackedLinears
    import torch

    from toolrl.engines.transformers.decoding import sample
    from toolrl.engines.transformers.kv_store import KVBatch, prefill_sources
    from toolrl.modeling.packed_linears import PackedLinears


def static_steps(decode: str, cuda: bool, vision: bool, routes: bool, adapters: bool) -> bool:
    """Whether ``engine.options.decode`` steps at static shapes: ``static``, or ``auto`` on CUDA. A
    vision-language model, recorded routes and adapters per role take inputs of their own each step:
    they step eagerly, and ``static`` refuses them."""
    if decode == "static" and (vision or routes or adapters):
        raise ValueError("decode: static takes a text model that records no routes (record_routes: false) "
                         "and serves no adapter per role (model.adapters)")
    return decode == "static" or (decode == "auto" and cuda and not (vision or routes or adapters))


def check_run_facts(facts: RunFacts) -> None:
    """The engine's run check (:mod:`toolrl.processes.run_check`): the model loads from the source's directory,
    experts are recorded only where a model has them, static decode takes the model's rows, and packed
    linears a CPU engine's float32 weights."""
    check_model_dir(facts.model_dir, "the transformers engine", facts.config)
    options = facts.config.engine.options
    if options.get("record_routes") and not facts.experts:
        raise ValueError(f"record_routes: {facts.model_dir} is a dense model (its config.json names no experts): "
                         "there are no routed experts to record")
    static_steps(options.get("decode", "auto"), False, "vision_config" in facts.model_config,
                 bool(options.get("record_routes")), bool(facts.config.model.adapters))
    if options.get("packed_linears"):  # "auto" may be a GPU: the engine checks again on its device
        from toolrl.modeling.packed_linears import PackedLinears
        device = str(options.get("device", "auto"))
        PackedLinears.check("cpu" if device == "auto" else device.split(":")[0], options.get("dtype", "float32"))


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
        "auto", description="static: decode steps of fixed shapes per bucket of rows (engines.transformers.static_decode), "
        "captured as CUDA graphs on CUDA; eager: the growing buffers; auto: static on CUDA for a text model "
        "that records no routes, else eager.")
    max_adapters: int | None = Field(None, ge=1, description="Adapter slots: of the adapters added at run time "
                                     "(add_adapter), at most this many resident in the model, the least recently used "
                                     "others in host memory until a request names them (engines.transformers."
                                     "adapter_slots); a step's rows name at most this many. None: all resident.")
    packed_linears: bool = Field(False, description="A CPU engine with float32 weights: forwards of 2+ rows run "
                                 "their linear layers through oneDNN on weights packed for it "
                                 "(modeling.packed_linears: a 4-row decode step's linears 1.3-1.5x faster), at the "
                                 "cost of a second copy of those weights. Off: CPU runs keep their sampled bits.")


@dataclass
class EngineStats:
    """Running totals since the engine started (read them between rollout phases)."""

    prefilled_tokens: int = 0  # prompt tokens run through the model
    prefill_tokens_saved: int = 0  # prompt tokens not run because an identical admitted prompt was
    reused_tokens: int = 0  # prompt tokens whose KV came from the trajectory's previous turn
    generated_tokens: int = 0
    steps: int = 0  # model forward passes


class TransformersEngine(RolloutEngine):
    name = "transformers"
    Options = TransformersEngineConfig
    loads_adapters = True
    partial_weight_updates = True

    def __init__(self, model: Any, tokenizer: Any, config: TransformersEngineConfig,
                 tokenizer_path: str | None = None, processor: Any = None) -> None:
        from toolrl.engines.transformers.kv_store import SessionStore
        from toolrl.engines.transformers.vision import PromptVision
        from toolrl.modeling.expert_routing import ExpertRouting

        _import_torch()
        self.model = model
        # A vision-language model's prompt inputs (images, 3-D positions); None: a text model.
        self.vision = PromptVision(model, processor) if processor is not None else None
        self.config, self._tokenizer, self._tokenizer_path = config, tokenizer, tokenizer_path
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        text_config = model.config.get_text_config()
        self.max_model_len = config.max_model_len or getattr(text_config, "max_position_embeddings", None) or 1 << 30
        self._unseeded = unseeded(config.seed)
        # record_routes: the routers' hooks; the step runner records each forward's expert ids.
        self._routing = ExpertRouting(model) if config.record_routes else None
        self._packed = PackedLinears(model) if config.packed_linears else None  # kept across step runners
        self._slots = AdapterSlots(model, config.max_adapters, self._adapters_changed)  # adapters added at run time
        self._choose_steps()
        self._scheduler = Scheduler(config.max_batch_size, config.max_adapters)
        self._batch = KVBatch()
        self._sessions = SessionStore(model, config.reuse_kv_cache, config.max_sessions, self._new_weights)
        # Held while the model runs; weight updates wait for it (reentrant: update_weights takes it again).
        self._step_lock = threading.RLock()
        self.stats = EngineStats()
        self._closed = False

    def _choose_steps(self) -> None:
        """The adapters per row and the step runner, for the model as it is (made, or given adapters)."""
        from toolrl.engines.transformers.static_decode import StaticSteps
        from toolrl.engines.transformers.step_runner import EagerSteps

        self._adapters = RowAdapters(self.model)
        self._runner: EagerSteps = (
            StaticSteps(self.model, self._adapters, self.config.max_batch_size, self._packed)
            if static_steps(self.config.decode, self.device.type == "cuda", self.vision is not None,
                            self._routing is not None, bool(self._adapters.names))
            else EagerSteps(self.model, self._adapters, self._routing, self._packed))
        self._static = self._runner if isinstance(self._runner, StaticSteps) else None  # where shapes are static

    @classmethod
    def check_run(cls, facts: RunFacts) -> list[str]:
        check_run_facts(facts)
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
        self._tokenizer = tokenizer_or_load(self._tokenizer, self._tokenizer_path,
                                            "stop strings need a tokenizer: give ModelSource.tokenizer or a model path")
        return self._tokenizer

    async def generate(self, prompt_ids: list[int], params: SamplingParams, n: int = 1,
                       session_id: str | None = None, images: Sequence[Any] = (),
                       adapter: str | None = None) -> list[Generation]:
        if self._closed:
            raise RuntimeError("engine is closed")
        self._slots.check(self._adapters, adapter)  # now; each step routes its rows by name
        if images and self.vision is None:
            raise ValueError("the prompt has images but the model is not a vision-language model")
        if (empty := check_request(prompt_ids, params, n, self.max_model_len)) is not None:
            for gen in empty:
                gen.weight_version = self.weight_version
            return empty
        if params.stop_strings:
            _ = self.tokenizer  # load it now, not inside a step
        loop = asyncio.get_running_loop()
        if self._scheduler.start(loop, self._step):
            self._batch = KVBatch()  # what another loop left running can never complete
        req = Request(list(prompt_ids), params, n, session_id, loop.create_future(),
                      results=[None] * n, remaining=n, images=list(images), adapter=adapter)
        self._scheduler.submit(req)
        return await req.future

    async def prompt_logprobs(self, prompts: Sequence[list[int]], top: int = 0, start: int | Sequence[int] = 0,
                              adapter: str | None = None) -> list[PromptLogprobs]:
        """As the engine interface's (the LM head runs only from ``start`` on); on a model with adapters
        per role, under ``adapter``'s."""
        if self._closed:
            raise RuntimeError("engine is closed")
        self._slots.check(self._adapters, adapter, "scores prompts")
        for ids in prompts:
            if not 0 < len(ids) <= self.max_model_len:
                raise ValueError(f"a prompt to score holds {len(ids)} tokens: it must hold 1 to {self.max_model_len}")
        starts = score_starts(prompts, start)
        return await asyncio.to_thread(self._score, [list(p) for p in prompts], top, starts, adapter)

    def _score(self, prompts: list[list[int]], top: int, starts: list[int], adapter: str | None) -> list[PromptLogprobs]:
        # Under the step lock: between two decode steps, never inside one.
        with self._step_lock, torch.no_grad():
            self._slots.bring({adapter})
            return self._runner.score(prompts, top, starts, self.config.max_batch_size, adapter)

    def update_weights(self, state_dict: Mapping[str, Any]) -> None:
        # Whole tensors as rows, their names checked before any is written.
        if unknown := sorted(set(state_dict) - set(self._weights_by_name)):
            raise KeyError(f"update_weights got keys the model does not have: {unknown[:5]}")
        with self.updating_weights(self.weight_version):
            for name, value in state_dict.items():  # written here, not staged again by a rows loader
                TransformersEngine.load_weight_rows(self, name, value.shape, 0, value)

    def load_weight_rows(self, name: str, shape: Sequence[int], start: int, rows: Any) -> None:
        # In place, straight from the sender's tensor or the transport's buffer (nothing to copy from a
        # module shared with the trainer); updating_weights holds decoding meanwhile.
        own = self._weights_by_name
        if name not in own:
            if self._slots.write(name, shape, start, rows):  # an adapter evicted to host memory
                return
            raise KeyError(f"a weight update sent {name!r}, which the model does not have")
        if tuple(own[name].shape) != tuple(shape):
            raise ValueError(f"a weight update sent {name!r} as {tuple(shape)}, the model's is {tuple(own[name].shape)}")
        target = rows_of(own[name], start, rows)
        if (rows.data_ptr(), rows.shape) != (target.data_ptr(), target.shape):
            with torch.no_grad():
                target.copy_(rows)

    def finish_weight_rows(self) -> None:
        """Nothing is staged: the rows were written in place (sessions are dropped by updating_weights)."""

    def weight_tensors(self) -> Mapping[str, Any]:
        return {name: t.detach() for name, t in self._weights_by_name.items()}

    def apply_adapters(self, inject: Callable[[Any], Any]) -> None:
        # peft wraps the adapted Linears in place: the base weights stay, the names gain lora_A/lora_B.
        with self._step_lock:
            inject(self.model)
            self._adapters_changed()
            self._sessions.invalidate()

    def add_adapter(self, name: str, config: AdapterConfig) -> None:
        with self._step_lock:
            self._slots.add(name, config)

    def remove_adapter(self, name: str) -> None:
        with self._step_lock:
            self._slots.remove(name)
            self._sessions.invalidate()  # its KV: a later adapter of that name is another

    def adapters(self) -> list[str]:
        return self._slots.names()

    def _adapters_changed(self) -> None:
        # Adapters went into the model or out of it. peft's new modules start in training mode (adapter dropout).
        self.model.requires_grad_(False).eval()
        self.__dict__.pop("_weights_by_name", None)
        self._choose_steps()  # new modules: a static runner's graphs read the old ones

    @functools.cached_property
    def _weights_by_name(self) -> dict[str, torch.Tensor]:
        return self.model.state_dict(keep_vars=True)

    @contextlib.contextmanager
    def updating_weights(self, version: int) -> Iterator[None]:
        with self._step_lock:
            yield
            self._new_weights()  # also when the update wrote a shared module directly
            self.weight_version = version

    def _new_weights(self) -> None:
        self._sessions.invalidate()
        self._runner.weights_written()

    def end_session(self, session_id: str) -> None:
        self._sessions.end(session_id)

    def clone_session(self, session_id: str, into: Sequence[str]) -> None:
        self._sessions.clone(session_id, into)

    async def sleep(self) -> None:
        # The running batch frees its buffers whenever it empties; only kept sessions outlive it.
        self._sessions.clear()
        self._runner.release()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    async def close(self) -> None:
        self._closed = True
        await self._scheduler.close()
        self._batch = KVBatch()
        self._sessions.clear()

    def _step(self, admitted: list[Request], cancelled: set[int], finished: list[Request]) -> None:
        """One decode step of the batch and the prefill of the admitted requests; the requests they
        complete go into ``finished`` as they do. A step that fails leaves no rows running."""
        with self._step_lock, torch.no_grad():
            batch = self._batch
            try:
                if cancelled:
                    self._keep(batch, [i for i, r in enumerate(batch.rows) if id(r.req) not in cancelled], [])
                self._slots.bring({r.req.adapter for r in batch.rows} | {req.adapter for req in admitted})
                if batch.rows:
                    self._advance(batch, self._decode(batch), finished)
                if admitted:
                    for req in admitted:
                        req.weight_version = self.weight_version
                    new, logits = self._prefill(admitted)
                    self._advance(new, logits, finished)
                    self._batch = batch.merge(new, self.config.max_batch_size, self._capacity)
            except Exception:
                self._batch = KVBatch()
                raise

    def _decode(self, batch: KVBatch) -> torch.Tensor:
        ids = torch.tensor([[r.next_token] for r in batch.rows], device=self.device)
        # The step's rows get their slots before its column is marked.
        batch.reserve(batch.length + 1, self._runner.slots(len(batch.rows)), self._capacity)
        batch.mask[:, batch.length] = True
        logits = self._runner.decode(batch, ids)
        self.stats.steps += 1
        batch.positions += 1
        return logits

    def _prefill(self, admitted: list[Request]) -> tuple[KVBatch, torch.Tensor]:
        """Prefill the admitted prompts together (left-padded), each on top of its kept session KV if
        any; returns a batch with one row per sample. A prompt is prefilled once for all its samples:
        those of a request with n > 1 and those of admitted requests that share it (prefill_sources)."""
        reused = [self._sessions.take(req) for req in admitted]
        source, unique = prefill_sources(admitted, reused, self.config.share_prompts)
        firsts, kept = [admitted[i] for i in unique], [reused[i] for i in unique]
        prefix = [len(s.tokens) if s else 0 for s in kept]
        deltas = [req.prompt[p:] for req, p in zip(firsts, prefix)]
        tc, dm = max(prefix), max(map(len, deltas))
        # Room for the whole generation, so a long context's turn never copies its buffer to grow; at
        # most the prompt's own size again (a short prompt grows cheaply), within the model's context.
        longest = max(req.params.max_new_tokens for req in firsts)
        capacity = self._capacity(tc + dm + max(1, min(longest, max(64, tc + dm), self.max_model_len - tc - dm)))
        group, ids, pos = KVBatch.prefill(deltas, [(s.keys, s.values) if s else None for s in kept], prefix,
                                          capacity, self.device)
        images: dict[str, torch.Tensor] = {}
        rope_deltas: torch.Tensor | int = 0  # a VLM's text position offsets (engines.transformers.vision)
        if self.vision is not None and any(req.images for req in firsts):
            pos, rope_deltas, images = self.vision.prefill(firsts, prefix, dm, self.device, self.dtype)
        logits = self._runner.forward(group, ids, pos, [req.adapter for req in firsts], **images)
        group.positions = group.mask.sum(1) + rope_deltas
        experts = self._runner.prompt_experts([s.experts if s else None for s in kept], prefix, deltas)
        self.stats.steps += 1
        self.stats.prefilled_tokens += sum(map(len, deltas))
        self.stats.reused_tokens += sum(prefix)
        for i, req in enumerate(admitted):
            shared = unique[source[i]] != i
            req.prefill_tokens_saved = len(req.prompt) if shared else len(reused[i].tokens) if reused[i] else 0
            self.stats.prefill_tokens_saved += len(req.prompt) if shared else 0
        # One row per sample: each sample reads its prompt's prefilled row.
        expand = [source[i] for i, req in enumerate(admitted) for _ in range(req.n)]
        group.rows = [row for req in admitted for row in req.rows(self._unseeded)]
        for row, i in zip(group.rows, expand) if experts is not None else ():
            row.experts = [experts[i]]
        if expand != list(range(len(unique))):
            group.select(expand)
            logits = logits.index_select(0, torch.tensor(expand, device=self.device))
        return group, logits

    def _advance(self, batch: KVBatch, logits: torch.Tensor, finished: list[Request]) -> None:
        """Sample one token per row, record it, and drop rows that are done."""
        tokens, logprobs = sample(batch.rows, logits)
        self.stats.generated_tokens += len(tokens)
        keep: list[int] = []
        done: list[tuple[int, _Row]] = []
        for i, (row, tok, lp) in enumerate(zip(batch.rows, tokens, logprobs)):
            row.tokens.append(tok)
            row.logprobs.append(lp)
            row.next_token = tok
            reason, stop = row.finish(self._tokenizer, self.max_model_len)
            if reason is None:
                keep.append(i)
                continue
            row.req.results[row.index] = row.generation(reason, stop)
            row.req.remaining -= 1
            if row.req.remaining == 0:
                finished.append(row.req)
            done.append((i, row))
        if done:
            self._keep(batch, keep, done)

    def _keep(self, batch: KVBatch, keep: list[int], done: list[tuple[int, _Row]]) -> None:
        """Keep rows ``keep`` of ``batch``; the ``done`` rows' KV is kept for their trajectories' next turns."""
        for i, row in done:
            self._sessions.save(row, batch, i)
        batch.keep(keep, self._capacity)

    def _capacity(self, columns: int) -> int:
        return self._runner.capacity(columns)
