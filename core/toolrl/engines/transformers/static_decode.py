"""The transformers engine's static decode steps (``decode: static``; the default on CUDA): fixed shapes per
bucket (rows padded to a power of two, attention over the KV buffer's whole capacity, the token's KV
written at a column held in a device tensor), so that on CUDA each bucket's step is captured once as a
CUDA graph and replayed by hand: a GPU decodes at the host's launch rate otherwise. On CPU the same step
runs eagerly. The design and its limits: docs/gpu.md, "Static decode and one-call attention".

A graph holds the addresses it was captured with: those of the weights (updated in place, so a
weight update is seen; a replaced one drops the graphs), the KV buffers (part of its key: a reallocated
buffer gets a new graph) and its own input tensors, which each step fills before the replay.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicLayer

from toolrl.engines.transformers.kv_store import KVBatch
from toolrl.engines.transformers.step_runner import EagerSteps
from toolrl.modeling.adapter_routing import RowAdapters
from toolrl.modeling.packed_linears import PackedLinears

# Captured graphs kept before all are dropped (each bucket of rows and capacity, per buffer).
_MAX_GRAPHS = 64


def bucket(n: int, cap: int) -> int:
    """The power of two at or above ``n``, at most ``cap``."""
    return min(1 << max(n - 1, 0).bit_length(), cap)


class StaticLayer(DynamicLayer):
    """One layer's KV buffer [rows, kv_heads, capacity, head_dim] at full capacity: ``update`` writes
    the step's KV at the column in ``column`` (a one-element device tensor) and returns the whole
    buffer."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, column: torch.Tensor) -> None:
        super().__init__()
        self.keys, self.values, self.column = keys, values, column
        self.dtype, self.device = keys.dtype, keys.device
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
        self.keys.index_copy_(2, self.column, key_states)
        self.values.index_copy_(2, self.column, value_states)
        return self.keys, self.values


class StaticSteps(EagerSteps):
    """Decode steps of fixed shape; on CUDA each shape's step is a captured graph (``graphs``)."""

    def __init__(self, model: Any, adapters: RowAdapters, max_rows: int, packed: PackedLinears | None) -> None:
        super().__init__(model, adapters, None, packed)
        self.max_rows = max_rows
        self.graphs: dict[tuple[Any, ...], tuple[torch.cuda.CUDAGraph, dict[str, Any], torch.Tensor]] | None = (
            {} if self.device.type == "cuda" else None)
        self._pool: Any = None
        self.captures = 0  # graphs captured so far (the GPU suite reports it)
        self._pointers = [p.data_ptr() for p in self.model.parameters()]

    def capacity(self, columns: int) -> int:
        # A power of two, so that the steps take few shapes (one CUDA graph each).
        return 1 << (columns - 1).bit_length()

    def slots(self, rows: int) -> int:
        return bucket(rows, self.max_rows)

    def decode(self, batch: KVBatch, ids: torch.Tensor) -> torch.Tensor:
        """Rows padded to their bucket (a padding row sees only its own column, so its softmax has a
        key), attention over the whole capacity."""
        live = len(batch.rows)
        rows = self.slots(live)
        mask, positions = batch.mask, batch.positions[:, None]
        if rows > live:
            pad = mask.new_zeros(rows - live, batch.capacity)
            pad[:, batch.length] = True
            mask = torch.cat([mask, pad])
            ids = torch.cat([ids, ids.new_zeros(rows - live, 1)])
            positions = torch.cat([positions, positions.new_zeros(rows - live, 1)])
        inputs = {"ids": ids, "positions": positions, "column": torch.tensor([batch.length], device=mask.device),
                  "mask": mask[:, None, None, :] if self.window is None else self.window_masks(mask, 1)}
        keys, values = [k[:rows] for k in batch.keys], [v[:rows] for v in batch.values]
        logits = self._step(keys, values, **inputs) if self.graphs is None else self._replay(keys, values, inputs)
        batch.length += 1
        return logits[:live]

    def _replay(self, keys: list[torch.Tensor], values: list[torch.Tensor], inputs: dict[str, Any]) -> torch.Tensor:
        """The step through its shape's graph, captured on first use."""
        assert self.graphs is not None
        key = (inputs["ids"].shape[0], keys[0].shape[2], *(t.data_ptr() for t in keys + values))
        if key not in self.graphs:
            if len(self.graphs) >= _MAX_GRAPHS:
                self.graphs.clear()
            self.graphs[key] = self._capture(keys, values, inputs)
        graph, static, out = self.graphs[key]
        for name in ("ids", "positions", "column"):
            static[name].copy_(inputs[name])
        if isinstance(inputs["mask"], dict):
            for name, m in inputs["mask"].items():
                static["mask"][name].copy_(m)
        else:
            static["mask"].copy_(inputs["mask"])
        graph.replay()
        return out

    def _step(self, keys: list[torch.Tensor], values: list[torch.Tensor], ids: torch.Tensor,
              positions: torch.Tensor, column: torch.Tensor,
              mask: torch.Tensor | dict[str, torch.Tensor]) -> torch.Tensor:
        """Logits [rows, vocab] (float32) of one step: ``ids``/``positions`` [rows, 1], the KV written at
        ``column`` of ``keys``/``values`` (per layer [rows, kv_heads, capacity, head_dim]), ``mask`` the
        prepared 4-D mask(s) [rows, 1, 1, capacity]."""
        cache = Cache(layers=[StaticLayer(k, v, column) for k, v in zip(keys, values, strict=True)])
        with self.linears():
            out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                             use_cache=True, logits_to_keep=1)
        return out.logits[:, -1].float()

    def _capture(self, keys: list[torch.Tensor], values: list[torch.Tensor],
                 inputs: dict[str, Any]) -> tuple[torch.cuda.CUDAGraph, dict[str, Any], torch.Tensor]:
        static = {name: ({k: m.clone() for k, m in t.items()} if isinstance(t, dict) else t.clone())
                  for name, t in inputs.items()}
        # Warm-up on a side stream (lazy initialisations, cuBLAS workspaces), as capture requires. It
        # writes this step's KV at its column: the replay writes the same values there again.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self._step(keys, values, **static)
        torch.cuda.current_stream().wait_stream(side)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        # thread_local: a trainer sharing the process (and the module) may launch work meanwhile.
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            out = self._step(keys, values, **static)
        self.captures += 1
        return graph, static, out

    def weights_written(self) -> None:
        if (pointers := [p.data_ptr() for p in self.model.parameters()]) != self._pointers:
            self.release()  # a weight was replaced, not written in place: graphs read the old one
            self._pointers = pointers

    def release(self) -> None:
        super().release()
        if self.graphs is not None:
            self.graphs.clear()  # their memory pool goes too
