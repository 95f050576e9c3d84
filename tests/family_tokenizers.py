"""Tokenizers for model families without one offline: Qwen's real BPE vocabulary plus the family's
special tokens, with the family's chat template from the installed ``trl`` package."""

from __future__ import annotations

import copy
from functools import cache
from typing import Any

from toolrl.families import family_named
from toolrl.model_sources import qwen_tokenizer_path
from toolrl.templates import trl_template

BOS = {"llama3": "<|begin_of_text|>", "deepseek_v3": "<｜begin▁of▁sentence｜>", "gemma": "<bos>"}


@cache
def _qwen_base() -> Any:
    from toolrl import model_sources

    return model_sources.load_tokenizer(qwen_tokenizer_path("qwen3"))  # the tests' shared read (conftest)


@cache
def family_tokenizer(name: str, template: str | None = None) -> Any:
    """``template``: a TRL template file (default: the family's first)."""
    family = family_named(name)
    tok = copy.deepcopy(_qwen_base())  # loading takes seconds; every family gets its own copy
    vocab = tok.get_vocab()  # a 151k-entry dict built at each call: once, not once a token
    tok.add_tokens([t for t in family.special_tokens if t not in vocab], special_tokens=True)
    if name in BOS:
        tok.bos_token = BOS[name]
    tok.chat_template = trl_template(template) if template else family.detection.templates[0].text()
    return tok
