"""The attention implementations a model runs under toolrl: one table (:data:`IMPLEMENTATIONS`), one
installer (:func:`install`), and the questions the trainer asks of a model's implementation
(:func:`takes_trees`, :func:`takes_packed_rows`, :func:`is_sdpa`). The one place toolrl registers an
attention function with transformers (``AttentionInterface`` and its mask function).

toolrl's own implementations form one chain over transformers' sdpa, each taking every call the one
before it takes and falling back to it for those: the engine's decode attention (a decode step's one
query per row over grouped heads: :mod:`~toolrl.modeling.decode_attention`), the trainer's packed rows
(one causal sdpa per span, or one call per layer over a prefix tree:
:mod:`~toolrl.modeling.packed_attention`), and Ulysses sequence parallelism (that attention between two
all-to-alls: :mod:`~toolrl.modeling.ulysses_attention`). Installing one switches a model that runs an
earlier one of the chain, so a module the engine and the trainer share runs the latest installed for
both. A new implementation is a row of the table (and, in the chain, a fallback to the one before it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from toolrl.modeling import decode_attention, packed_attention, ulysses_attention

DECODE_SDPA = "toolrl_decode_sdpa"
VARLEN_SDPA = "toolrl_varlen_sdpa"
ULYSSES_SDPA = "toolrl_ulysses_sdpa"


@dataclass(frozen=True)
class Implementation:
    """One attention implementation: ``forward`` (transformers' attention-function signature; None for
    transformers' own), whether it is of the sdpa chain (sdpa's mask function; installed over the
    implementations before it), takes a packed row (``cu_seq_lens``, a row pattern or a tree's spans:
    :func:`toolrl.training.packing.run_packed`) and a prefix-shared row (else the trainer runs the tree
    unshared)."""

    forward: Callable[..., Any] | None
    sdpa: bool
    packed_rows: bool
    trees: bool


# The sdpa chain in its order; a name missing here (flash, flex, kernels) takes neither rows nor trees.
IMPLEMENTATIONS: dict[str, Implementation] = {
    "eager": Implementation(None, sdpa=False, packed_rows=False, trees=True),  # one mask over the row
    "sdpa": Implementation(None, sdpa=True, packed_rows=False, trees=True),  # packed rows install VARLEN_SDPA
    DECODE_SDPA: Implementation(decode_attention.sdpa, sdpa=True, packed_rows=False, trees=True),
    VARLEN_SDPA: Implementation(packed_attention.varlen_sdpa, sdpa=True, packed_rows=True, trees=True),
    ULYSSES_SDPA: Implementation(ulysses_attention.ulysses_attention, sdpa=True, packed_rows=True, trees=True),
}
_CHAIN = [name for name, impl in IMPLEMENTATIONS.items() if impl.sdpa]


def install(model: Any, name: str) -> None:
    """Run implementation ``name`` in ``model`` where its config (and its text config) runs one that comes
    before it in the sdpa chain; any other implementation stays. Registers ``name`` with transformers first."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    earlier = _CHAIN[:_CHAIN.index(name)]
    configs = {id(c): c for c in (model.config, model.config.get_text_config())}.values()
    switched = [c for c in configs if c._attn_implementation in earlier]
    if switched and name not in ALL_MASK_ATTENTION_FUNCTIONS:
        AttentionInterface.register(name, IMPLEMENTATIONS[name].forward)
        ALL_MASK_ATTENTION_FUNCTIONS.register(name, sdpa_mask)
    for config in switched:
        # A composite config sets its sub-configs too: the text config may be switched already.
        if config._attn_implementation in earlier:
            config._attn_implementation = name


def is_sdpa(name: str | None) -> bool:
    """Whether implementation ``name`` is transformers' sdpa or one of toolrl's over it."""
    return name in IMPLEMENTATIONS and IMPLEMENTATIONS[name].sdpa


def takes_packed_rows(name: str | None) -> bool:
    """Whether implementation ``name`` takes a packed row's spans itself (``cu_seq_lens`` and toolrl's keywords)."""
    return name in IMPLEMENTATIONS and IMPLEMENTATIONS[name].packed_rows


def takes_trees(name: str | None) -> bool:
    """Whether a packed row under implementation ``name`` can hold a prefix tree (shared prefixes once)."""
    return name in IMPLEMENTATIONS and IMPLEMENTATIONS[name].trees
