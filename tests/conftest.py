"""Shared session fixtures: the real Qwen3 tokenizer, a tiny random Qwen3 model, and tiny random Gemma 3,
gpt-oss and Mistral models with sliding-window layers.

The tokenizer and the Qwen3 are built once and cached on disk (``$TOOLRL_CACHE`` or ``~/.cache/toolrl``), so later test
sessions only load them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture
def hide_package(monkeypatch) -> Any:
    """``hide_package(name)``: ``importlib.util.find_spec`` finds no package ``name`` for the rest of the
    test, as on a machine without it (toolrl asks find_spec before importing an optional package)."""
    import importlib.util

    real = importlib.util.find_spec

    def hide(name: str) -> None:
        monkeypatch.setattr(importlib.util, "find_spec", lambda found, *a: None if found == name else real(found, *a))

    return hide


@pytest.fixture(scope="session")
def qwen3_tokenizer() -> Any:
    from toolrl.model_sources import qwen_tokenizer

    return qwen_tokenizer("qwen3")


_LOADED: dict[tuple[Any, ...], tuple[Any, Any]] = {}  # (kind, path, ...) -> (what was read, its chat template)


def _read_once(load: Any, kind: str, files: tuple[str, ...], extra_key: Any = tuple) -> Any:
    """``load`` (a saved directory -> a tokenizer or processor) reading each directory once per test process;
    read again when one of its ``files`` was saved again (``extra_key()``: more of what the result depends
    on). One whose chat template changed since it was read fails the test that finds it so: the next test to
    load it would get the change (building the tiny Qwen2.5-VL once set its template on the shared Qwen2.5
    tokenizer)."""
    from pathlib import Path

    def cached(path):
        key = (kind, str(path), *extra_key(),
               tuple((Path(path) / f).stat().st_mtime if (Path(path) / f).exists() else 0.0 for f in files))
        if key not in _LOADED:
            loaded = load(path)
            _LOADED[key] = (loaded, getattr(loaded, "chat_template", None))
        loaded, template = _LOADED[key]
        assert getattr(loaded, "chat_template", None) == template, \
            f"the shared {kind} of {path} had its chat_template changed"
        return loaded

    return cached


@pytest.fixture(autouse=True, scope="session")
def shared_tokenizers() -> Iterator[None]:
    """Every in-process load of a saved tokenizer (a run's controller, engine and trainer; the CLI through
    CliRunner; ``qwen_tokenizer``) reads it once per test process, not once per load: transformers takes one to
    two seconds to read a 151k-token vocabulary, and nothing in toolrl changes a tokenizer it loaded (roles in
    one process share one already; :func:`_read_once`). Session-scoped, so that module and session fixtures
    load through it too."""
    from toolrl import model_sources

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(model_sources, "load_tokenizer", _read_once(
            model_sources.load_tokenizer, "tokenizer", ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")))
        yield


@pytest.fixture(autouse=True)
def shared_processors(monkeypatch) -> None:
    """As :func:`shared_tokenizers`, for a vision-language model's processor: an in-process run loads it
    three times (the rollout's engine_processor, the transformers engine, the trainer rank), each reading
    the 151k-token tokenizer again (two seconds). Keyed also by whether torchvision is found (a test that
    hides it gets the processor built without it). The modules that bound the name at import get the cached
    one too, once imported (as any that loads one is by the time its test runs: its test module imports them)."""
    import importlib.util
    import sys

    from toolrl import model_sources

    load = model_sources.load_processor
    cached = _read_once(load, "processor", ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                                            "chat_template.json", "preprocessor_config.json", "processor_config.json"),
                        lambda: (importlib.util.find_spec("torchvision") is not None,))
    monkeypatch.setattr(model_sources, "load_processor", cached)
    for name in ("toolrl.engines.build", "toolrl.engines.transformers"):
        if getattr(sys.modules.get(name), "load_processor", None) is load:
            monkeypatch.setattr(sys.modules[name], "load_processor", cached)


@pytest.fixture(scope="session")
def tiny_qwen3_path() -> str:
    from toolrl.model_sources import tiny_qwen3

    return tiny_qwen3()


@pytest.fixture(scope="session")
def windowed() -> Any:
    """A tiny Gemma 3 whose first layer sees only the 6 positions before each token."""
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    config = Gemma3TextConfig(vocab_size=151_936, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=6,
                              layer_types=["sliding_attention", "full_attention"], attn_implementation="sdpa")
    return Gemma3ForCausalLM(config)


@pytest.fixture(scope="session")
def tiny_gpt_oss() -> Any:
    """A tiny gpt-oss: attention sinks (eager attention only), a 6-position sliding window in its first
    layer, 4 experts; weights drawn wide enough that the sinks and the router matter."""
    import torch
    from transformers import GptOssConfig, GptOssForCausalLM

    torch.manual_seed(0)
    config = GptOssConfig(vocab_size=151_936, hidden_size=32, intermediate_size=32, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=6,
                          layer_types=["sliding_attention", "full_attention"], num_local_experts=4,
                          num_experts_per_tok=2, attn_implementation="eager")
    model = GptOssForCausalLM(config)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)
    return model


@pytest.fixture(scope="session")
def tiny_mistral() -> Any:
    """A tiny Mistral: no layer types, every layer sees the 6 positions before each token."""
    import torch
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    config = MistralConfig(vocab_size=151_936, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=6,
                           attn_implementation="sdpa")
    return MistralForCausalLM(config)


@pytest.fixture(scope="session")
def unknown_kernel() -> str:
    """An attention implementation toolrl does not know, registered with transformers as a kernel
    package's would be (sdpa underneath): its name."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register("test_kernel", sdpa_attention_forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register("test_kernel", sdpa_mask)
    return "test_kernel"
