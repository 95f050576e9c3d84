"""Methods mixed into vLLM's worker class (engine argument ``worker_extension_cls``), called by name
through ``collective_rpc``. Imported only inside vLLM's worker processes, before the worker loads its
model: importing it registers the ``toolrl`` weight-transfer backend (:mod:`toolrl_vllm.transfer`)
with vLLM's factory there, where the worker creates its transfer engine."""

from __future__ import annotations

import contextlib
from typing import Any

from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

from toolrl_vllm.translate import TRANSFER_BACKEND

with contextlib.suppress(ValueError):  # registered already (this module imported twice in one process)
    WeightTransferEngineFactory.register_engine(TRANSFER_BACKEND, "toolrl_vllm.transfer", "LinkTransferEngine")


def reprocess_tied_embeddings(model: Any) -> int:
    """Re-run weight post-processing of embedding-type layers that share their weight with another
    layer; returns how many were redone.

    vLLM 0.32's in-place reload re-processes only layers that loaded a tensor from the checkpoint. A
    tied ``lm_head`` loads none (its weight is the embedding's), so on CPU it kept the GEMM kernel
    prepacked from the *old* embedding and the logits came from stale weights. Re-running the
    unquantized embedding method's processing repacks from the freshly loaded weight (on GPU it
    is a no-op).
    """
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    owners: dict[int, list[Any]] = {}
    for module in model.modules():
        for param in module.parameters(recurse=False):
            owners.setdefault(id(param), []).append(module)
    shared = {id(m): m for mods in owners.values() if len(mods) > 1 for m in mods}
    redone = 0
    for module in shared.values():
        method = getattr(module, "quant_method", None)
        if isinstance(method, UnquantizedEmbeddingMethod):
            method.process_weights_after_loading(module)
            redone += 1
    return redone


class ToolrlWorkerExtension:
    """``self`` is the vLLM worker (``reload_weights``, ``model_runner``, ``weight_transfer_engine``)."""

    def toolrl_reload_weights(self, weights_path: str) -> int:
        """Load the checkpoint in ``weights_path`` into the running model, in place."""
        self.reload_weights(weights_path=weights_path, is_checkpoint_format=True)  # type: ignore[attr-defined]
        return reprocess_tied_embeddings(self.model_runner.get_model())  # type: ignore[attr-defined]

    def toolrl_bytes_received(self) -> int:
        """Bytes the ``toolrl`` transfer engine took in its last update."""
        return self.weight_transfer_engine.received  # type: ignore[attr-defined]
