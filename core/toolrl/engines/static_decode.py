"""The transformers engine's static decode step (``decode: static``; the default on CUDA).

The growing path (:meth:`TransformersEngine._forward`) hands the model the used columns of the KV
buffers, so every step has new shapes and runs op by op from Python: on a GPU the host's launches,
not the memory bandwidth, set the rate. Here a step has fixed shapes per *bucket*: the rows are padded
to a power of two (at most ``max_batch_size``), the model attends over the buffer's whole capacity
(a power of two; the mask hides the columns not in use) and writes its token's KV at a column held in
a device tensor. On CUDA each bucket's step is captured once as a CUDA graph and replayed, by hand:
no compiler (Triton's compile of a model per shape would take minutes of a GPU call), and the kernels
are eager PyTorch's, so the graph computes what the eager step computes. On CPU the same step runs
eagerly; the tests check its tokens and log-probs against the growing path.

A graph holds the addresses it was captured with: those of the weights (updated in place, so a
weight update is seen), the KV buffers (part of its key: a reallocated buffer gets a new graph) and
its own input tensors, which each step fills before the replay.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicLayer

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


class StaticDecoder:
    """Runs decode steps of fixed shape; ``graphs``: capture each shape's step as a CUDA graph."""

    def __init__(self, model: Any, graphs: bool) -> None:
        self.model = model
        self.graphs: dict[tuple[Any, ...], tuple[torch.cuda.CUDAGraph, dict[str, Any], torch.Tensor]] | None = (
            {} if graphs else None)
        self._pool: Any = None
        self.captures = 0  # graphs captured so far (the GPU suite reports it)

    def reset(self) -> None:
        """Drop the captured graphs (the weights' tensors were replaced, or memory is to be freed)."""
        if self.graphs is not None:
            self.graphs.clear()

    def step(self, keys: list[torch.Tensor], values: list[torch.Tensor], ids: torch.Tensor,
             positions: torch.Tensor, column: torch.Tensor,
             mask: torch.Tensor | dict[str, torch.Tensor]) -> torch.Tensor:
        """Logits [rows, vocab] (float32) of one step: ``ids``/``positions`` [rows, 1], the KV written at
        ``column`` of ``keys``/``values`` (per layer [rows, kv_heads, capacity, head_dim]), ``mask`` the
        prepared 4-D mask(s) [rows, 1, 1, capacity]."""
        inputs = {"ids": ids, "positions": positions, "column": column, "mask": mask}
        if self.graphs is None:
            return self._forward(keys, values, **inputs)
        key = (ids.shape[0], keys[0].shape[2], *(t.data_ptr() for t in keys + values))
        if key not in self.graphs:
            if len(self.graphs) >= _MAX_GRAPHS:
                self.graphs.clear()
            self.graphs[key] = self._capture(keys, values, inputs)
        graph, static, out = self.graphs[key]
        for name in ("ids", "positions", "column"):
            static[name].copy_(inputs[name])
        if isinstance(mask, dict):
            for name, m in mask.items():
                static["mask"][name].copy_(m)
        else:
            static["mask"].copy_(mask)
        graph.replay()
        return out

    def _forward(self, keys: list[torch.Tensor], values: list[torch.Tensor], ids: torch.Tensor,
                 positions: torch.Tensor, column: torch.Tensor,
                 mask: torch.Tensor | dict[str, torch.Tensor]) -> torch.Tensor:
        cache = Cache(layers=[StaticLayer(k, v, column) for k, v in zip(keys, values, strict=True)])
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
                self._forward(keys, values, **static)
        torch.cuda.current_stream().wait_stream(side)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        # thread_local: a trainer sharing the process (and the module) may launch work meanwhile.
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            out = self._forward(keys, values, **static)
        self.captures += 1
        return graph, static, out
