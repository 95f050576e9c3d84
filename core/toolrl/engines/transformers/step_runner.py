"""The transformers engine's step runner, chosen once for its model (``engine.options.decode``): how its
forwards run on the running batch's KV buffers (:mod:`.kv_store`).

:class:`EagerSteps` (``decode: eager``) hands the model the used columns of the buffers, so every step
has new shapes; :class:`~.static_decode.StaticSteps` prefills the same way and decodes at fixed shapes.
Every forward routes each row through its own adapter (:class:`~toolrl.modeling.adapter_routing.RowAdapters`)
and runs on packed linears where the engine has them; sliding-window layers (Gemma 3, gpt-oss, Mistral)
get masks built from each column's position, not its column distance: a token sees the
``sliding_window`` positions before it, whatever gaps its row has.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch.nn.utils.rnn import pad_sequence
from transformers.cache_utils import Cache

from toolrl import masks
from toolrl.engines import PromptLogprobs
from toolrl.engines.transformers.decoding import BufferLayer
from toolrl.engines.transformers.kv_store import KVBatch
from toolrl.modeling import attention
from toolrl.modeling.adapter_routing import RowAdapters
from toolrl.modeling.expert_routing import ExpertRouting
from toolrl.modeling.packed_linears import PackedLinears


class EagerSteps:
    """Every forward on the used columns of the buffers; the base of the static steps."""

    def __init__(self, model: Any, adapters: RowAdapters, routing: ExpertRouting | None,
                 packed: PackedLinears | None) -> None:
        text_config = model.config.get_text_config()
        if other := set(getattr(text_config, "layer_types", None) or ()) - {"full_attention", "sliding_attention"}:
            raise ValueError(f"the transformers engine supports full and sliding-window attention, got {other}")
        self.model, self.adapters, self.routing, self.packed = model, adapters, routing, packed
        self.linears = packed.applied if packed is not None else contextlib.nullcontext  # each forward's
        attention.install(model, attention.DECODE_SDPA)
        self.num_layers = text_config.num_hidden_layers
        self.window, _ = masks.sliding_window(model.config)
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        # One byte an expert id up to 256 experts a layer (RoutedExperts), two beyond.
        self.expert_dtype = torch.uint8 if routing is None or routing.num_experts <= 256 else torch.int16
        self.experts: torch.Tensor | None = None  # the last forward's expert ids [rows, q, layers, top_k]

    def capacity(self, columns: int) -> int:
        """Buffer columns to allocate for ``columns``."""
        return columns

    def slots(self, rows: int) -> int:
        """Buffer slots a decode step of ``rows`` rows runs on (0: the live rows')."""
        return 0

    def forward(self, batch: KVBatch, input_ids: torch.Tensor, positions: torch.Tensor,
                adapters: list[str | None], **images: torch.Tensor) -> torch.Tensor:
        """Run the model on ``input_ids`` [rows, q] after ``batch.length`` cached columns; returns the
        last position's logits [rows, vocab] in float32. ``adapters``: each row's name (Request.adapter);
        ``images``: a VLM's pixel inputs for them."""
        b, q = input_ids.shape
        layers = [BufferLayer(batch.keys[i][:b] if batch.keys else None,
                              batch.values[i][:b] if batch.values else None,
                              batch.length, batch.capacity) for i in range(self.num_layers)]
        mask = batch.mask[:, : batch.length + q]
        if self.routing is not None:
            self.routing.replay(None)
        with self.adapters.forward(adapters), self.linears():
            out = self.model(input_ids=input_ids, position_ids=positions, past_key_values=Cache(layers=layers),
                             attention_mask=mask if self.window is None else self.window_masks(mask, q),
                             use_cache=True, logits_to_keep=1, **images)
        if self.routing is not None:  # left on the device: copied to the host once per generation, not per step
            self.experts = self.routing.recorded().view(b, q, self.routing.layers, -1).to(self.expert_dtype)
        if not batch.keys:  # the layers allocated them (a prefill without kept KV)
            batch.keys = [layer.kbuf for layer in layers]
            batch.values = [layer.vbuf for layer in layers]
        batch.length += q
        return out.logits[:, -1].float()

    def decode(self, batch: KVBatch, ids: torch.Tensor) -> torch.Tensor:
        """The logits of a decode step feeding ``ids`` [rows, 1] at the column the batch has marked (each
        row's experts for its fed token recorded on it, with record_routes)."""
        logits = self.forward(batch, ids, batch.positions[:, None], [r.req.adapter for r in batch.rows])
        for row, fed in zip(batch.rows, self.experts) if self.experts is not None else ():
            row.experts.append(fed)
        return logits

    def prompt_experts(self, kept: list[torch.Tensor | None], prefix: list[int], deltas: list[list[int]]
                       ) -> list[torch.Tensor] | None:
        """After a prefill, each prompt's expert ids (record_routes): its first ``prefix`` tokens' ``kept``
        ones, then its new tokens' (``deltas``, left-padded in the forward)."""
        if self.experts is None:
            return None
        width = max(map(len, deltas))
        return [torch.cat(([e[:p]] if e is not None else []) + [self.experts[i, width - len(d):]])
                for i, (e, p, d) in enumerate(zip(kept, prefix, deltas))]

    def score(self, prompts: list[list[int]], top: int, starts: list[int], size: int,
              adapter: str | None) -> list[PromptLogprobs]:
        """Each prompt's tokens from its ``starts`` on (each at least 1) scored
        (:meth:`~toolrl.engines.RolloutEngine.prompt_logprobs`) under ``adapter``, in forwards of up to
        ``size`` prompts, right-padded (a causal model's positions before the padding do not see it). The
        LM head and log-softmax run only from a forward's first scored position on: on a teacher's
        sequences the prompt's [positions, vocab] logits are never made."""
        out: list[PromptLogprobs] = []
        for b in range(0, len(prompts), size):
            chunk, first = prompts[b:b + size], starts[b:b + size]
            rows = [torch.tensor(p) for p in chunk]
            x = pad_sequence(rows, batch_first=True).to(self.device)
            mask = pad_sequence([torch.ones_like(r) for r in rows], batch_first=True).to(self.device)
            lo = min(first) - 1  # the first position whose logits are kept: it predicts token lo + 1
            with self.adapters.forward([adapter] * len(chunk)), self.linears():
                logits = self.model(input_ids=x, attention_mask=mask, logits_to_keep=x.shape[1] - lo).logits
            lp = torch.log_softmax(logits[:, :-1].float(), -1)
            chosen = lp.gather(-1, x[:, lo + 1:, None])
            ranks = (lp > chosen).sum(-1) + 1
            best = lp.topk(top, -1) if top else None
            for i, p in enumerate(chunk):
                kept = range(first[i] - 1 - lo, len(p) - 1 - lo)
                pairs = [list(zip(best.indices[i, j].tolist(), best.values[i, j].tolist())) if best is not None else []
                         for j in kept]
                out.append(PromptLogprobs(chosen[i, kept.start:kept.stop, 0].tolist(),
                                          ranks[i, kept.start:kept.stop].tolist(), pairs))
        return out

    def window_masks(self, mask: torch.Tensor, q: int) -> torch.Tensor | dict[str, torch.Tensor]:
        """Additive [rows, 1, q, columns] masks for the last ``q`` columns of ``mask``: causal, and
        for sliding-window layers also within the window, both by position (a row's real columns hold
        its positions 0, 1, ... in order)."""
        pos = mask.cumsum(1) - 1
        keys, queries = pos[:, None, None, :], pos[:, None, -q:, None]
        return masks.by_layer_type(mask[:, None, None, :] & (keys <= queries), queries, keys, self.model.config,
                                   self.dtype)

    def weights_written(self) -> None:
        """The weights were updated (in place, or some replaced)."""

    def release(self) -> None:
        """Free what the steps keep between phases (packed linears' copies: packed again at the next forward
        of 2+ rows)."""
        if self.packed is not None:
            self.packed.drop()
