"""The attention implementations a model runs under toolrl: one table (:data:`IMPLEMENTATIONS`), one
installer (:func:`install`, the one place one is registered with transformers or a model switched to
it), and what the table says of an implementation (:func:`of`). toolrl's own form a chain over
transformers' sdpa, each taking every call the one before it takes and falling back to it for those:
the engine's decode attention (:mod:`.decode_attention`), the trainer's packed rows and Ulysses around
them (:mod:`.packed_attention`); a module the engine and the trainer share runs the latest installed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from toolrl.modeling import decode_attention, packed_attention

DECODE_SDPA = "toolrl_decode_sdpa"
VARLEN_SDPA = "toolrl_varlen_sdpa"
ULYSSES_SDPA = "toolrl_ulysses_sdpa"


@dataclass(frozen=True)
class Implementation:
    forward: Callable[..., Any] | None  # transformers' attention-function signature (None: transformers' own)
    sdpa: bool  # of the chain (sdpa's mask function)
    packed_rows: bool  # takes a packed row's spans itself (cu_seq_lens and toolrl's keywords: packing.run_packed)
    trees: bool  # a packed row may hold a prefix tree (else the trainer runs the tree unshared)


# The sdpa chain in its order. A name not here (flash, flex, kernels) takes neither packed rows nor trees.
IMPLEMENTATIONS: dict[str, Implementation] = {
    "eager": Implementation(None, sdpa=False, packed_rows=False, trees=True),  # one mask over the row
    "sdpa": Implementation(None, sdpa=True, packed_rows=False, trees=True),  # packed rows install VARLEN_SDPA
    DECODE_SDPA: Implementation(decode_attention.sdpa, sdpa=True, packed_rows=False, trees=True),
    VARLEN_SDPA: Implementation(packed_attention.varlen_sdpa, sdpa=True, packed_rows=True, trees=True),
    ULYSSES_SDPA: Implementation(packed_attention.ulysses_sdpa, sdpa=True, packed_rows=True, trees=True),
}
_CHAIN = [name for name, impl in IMPLEMENTATIONS.items() if impl.sdpa]
_OTHER = Implementation(None, sdpa=False, packed_rows=False, trees=False)


def of(name: str | None) -> Implementation:  # name: a model config's _attn_implementation
    return IMPLEMENTATIONS.get(name or "", _OTHER)


def install(model: Any, name: str) -> None:
    """Run implementation ``name`` in ``model`` where its config (or its text config) runs one before it in
    the sdpa chain; any other stays. Registers ``name`` with transformers the first time."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    earlier = _CHAIN[:_CHAIN.index(name)]
    configs = [c for c in {id(c): c for c in (model.config, model.config.get_text_config())}.values()
               if c._attn_implementation in earlier]
    if configs and name not in ALL_MASK_ATTENTION_FUNCTIONS:
        AttentionInterface.register(name, IMPLEMENTATIONS[name].forward)
        ALL_MASK_ATTENTION_FUNCTIONS.register(name, sdpa_mask)
    for config in configs:
        if config._attn_implementation in earlier:  # a composite config switched its text config already
            config._attn_implementation = name
