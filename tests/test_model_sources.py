"""model.source: built-in names, local directories and Hub ids resolved through huggingface_hub.

There is no network to the Hub here: each test builds a Hugging Face cache by hand
(``models--org--name/{blobs,snapshots/<commit>,refs/<ref>}``, files as symlinks into ``blobs/``) holding
the tiny model, and resolves against it offline.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _dists import run_toolrl
from toolrl.config import ConfigError, ModelConfig, load_config
from toolrl.model_sources import load_tokenizer, resolve_source, tiny_qwen3

ROOT = Path(__file__).resolve().parents[1]
MAIN = "a" * 40
V2 = "b" * 40


def add_snapshot(cache: Path, repo: str, commit: str, files: Path, refs: tuple[str, ...] = (),
                 extra: dict[str, str] | None = None) -> Path:
    """Put ``files`` (a directory) into the cache layout huggingface_hub writes, as commit ``commit``."""
    repo_dir = cache / ("models--" + repo.replace("/", "--"))
    snap = repo_dir / "snapshots" / commit
    snap.mkdir(parents=True)
    (repo_dir / "blobs").mkdir(exist_ok=True)
    contents = {f.name: f.read_bytes() for f in files.iterdir() if f.is_file()}
    contents.update({name: text.encode() for name, text in (extra or {}).items()})
    for name, data in contents.items():
        blob = repo_dir / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snap / name).symlink_to(Path("..", "..", "blobs", blob.name))
    for ref in refs:
        (repo_dir / "refs").mkdir(exist_ok=True)
        (repo_dir / "refs" / ref).write_text(commit)
    return snap


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory, tiny_qwen3_path):
    """``org/tiny`` at two commits: ``main`` and the tag ``v2`` (whose config carries a marker)."""
    cache = tmp_path_factory.mktemp("hub")
    add_snapshot(cache, "org/tiny", MAIN, Path(tiny_qwen3_path), refs=("main",))
    config = json.loads((Path(tiny_qwen3_path) / "config.json").read_text())
    add_snapshot(cache, "org/tiny", V2, Path(tiny_qwen3_path), refs=("v2",),
                 extra={"config.json": json.dumps({**config, "toolrl_marker": "v2"})})
    return cache


@pytest.fixture
def offline(monkeypatch):
    # huggingface_hub reads HF_HUB_OFFLINE when it is imported (transformers already did): set both.
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)


def test_hub_id_resolves_from_the_cache_at_a_revision(hub_cache, offline):
    from toolrl.model_sources import load_model

    main = resolve_source(ModelConfig(source="org/tiny", cache_dir=str(hub_cache)))
    assert Path(main) == hub_cache / "models--org--tiny" / "snapshots" / MAIN
    tagged = resolve_source(ModelConfig(source="org/tiny", revision="v2", cache_dir=str(hub_cache)))
    by_commit = resolve_source(ModelConfig(source="org/tiny", revision=V2, cache_dir=str(hub_cache)))
    assert Path(tagged) == Path(by_commit) == hub_cache / "models--org--tiny" / "snapshots" / V2
    assert json.loads((Path(tagged) / "config.json").read_text())["toolrl_marker"] == "v2"
    model = load_model(main)  # a usable model directory: weights and config through the symlinks
    assert model.config.model_type == "qwen3"


def test_environment_picks_cache_and_offline_mode(hub_cache):
    # A fresh process, as `toolrl train` runs: HF_HUB_CACHE and HF_HUB_OFFLINE come from the environment.
    code = ("from toolrl.config import ModelConfig; from toolrl.model_sources import resolve_source; "
            "print(resolve_source(ModelConfig(source='org/tiny', revision='v2')))")
    env = {**os.environ, "HF_HUB_CACHE": str(hub_cache), "HF_HUB_OFFLINE": "1", "HF_TOKEN": "hf_unused"}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    assert Path(res.stdout.strip()) == hub_cache / "models--org--tiny" / "snapshots" / V2


@pytest.mark.parametrize("source, revision, expect", [
    ("org/missing", None, "at revision 'main'"),
    ("org/tiny", "v3", "at revision 'v3'"),
])
def test_unresolvable_hub_id_is_one_line_naming_what_was_tried(hub_cache, offline, tmp_path, source, revision,
                                                                expect):
    with pytest.raises(ConfigError) as info:
        resolve_source(ModelConfig(source=source, revision=revision, cache_dir=str(hub_cache)), tmp_path)
    msg = str(info.value)
    assert msg.startswith(f"model.source: {source!r} not found") and "\n" not in msg
    assert f"no directory {tmp_path / source}; no usable snapshot in the Hugging Face cache {hub_cache}" in msg
    assert expect in msg
    assert "HF_HUB_OFFLINE is set" in msg


def test_local_directories_and_builtin_names(tmp_path, tiny_qwen3_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "mine").symlink_to(tiny_qwen3_path)
    assert resolve_source(ModelConfig(source="models/mine"), tmp_path) == str(tmp_path / "models" / "mine")
    assert resolve_source(ModelConfig(source=tiny_qwen3_path), "/nonexistent") == tiny_qwen3_path
    assert resolve_source(ModelConfig(source="tiny-qwen3")) == tiny_qwen3()
    with pytest.raises(ConfigError, match=r"model.source: './nope' is not a built-in model \(tiny-qwen3, "
                                          r"tiny-moe, tiny-qwen2.5-vl, smollm2-135m-instruct, gemma3-270m\), not a directory \(no .*nope\) "
                                          r"and not a Hub id org/name"):
        resolve_source(ModelConfig(source="./nope"), tmp_path)


def test_a_saved_fast_tokenizer_is_made_as_from_pretrained_makes_it(tiny_qwen3_path, tmp_path):
    """load_tokenizer makes a tokenizer saved in transformers 5's layout from its files: the same tokenizer as
    the class's from_pretrained, saved byte for byte alike (less where from_pretrained records it was local).
    ``load_tokenizer`` is this module's import of it, made before conftest puts its per-process cache in place."""
    from transformers import PreTrainedTokenizerFast

    ours, theirs = load_tokenizer(tiny_qwen3_path), PreTrainedTokenizerFast.from_pretrained(tiny_qwen3_path)
    assert type(ours) is type(theirs)
    ours.save_pretrained(tmp_path / "ours")
    theirs.save_pretrained(tmp_path / "theirs")
    assert sorted(os.listdir(tmp_path / "ours")) == sorted(os.listdir(tmp_path / "theirs"))
    for file in os.listdir(tmp_path / "theirs"):
        mine, from_pretrained = (tmp_path / "ours" / file).read_bytes(), (tmp_path / "theirs" / file).read_bytes()
        if file == "tokenizer_config.json":
            mine, from_pretrained = json.loads(mine), json.loads(from_pretrained)
            del from_pretrained["is_local"], from_pretrained["local_files_only"]
        assert mine == from_pretrained, file
    text = "Hi <|im_start|>user\n wörld 12 <tool_call>{\"a\": 1}</tool_call><|im_end|>\n\n x"
    messages = [{"role": "user", "content": text}]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]
    assert ours.encode(text) == theirs.encode(text)
    assert ours.apply_chat_template(messages, tools=tools, add_generation_prompt=True) == \
        theirs.apply_chat_template(messages, tools=tools, add_generation_prompt=True)
    assert (ours.all_special_ids, ours.eos_token_id, ours.pad_token_id, str(ours.added_tokens_decoder)) == \
        (theirs.all_special_ids, theirs.eos_token_id, theirs.pad_token_id, str(theirs.added_tokens_decoder))


async def test_trainer_composes_from_a_hub_id(hub_cache, offline, tmp_path):
    from toolrl.processes.in_process import build_local_run

    cfg = load_config(ROOT / "examples" / "tiny.yaml", [
        "model.source=org/tiny", "model.revision=v2", f"model.cache_dir={hub_cache}", "tools.entries=[]",
        f"trainer.output_dir={tmp_path}"])
    run = await build_local_run(cfg)
    try:
        assert Path(run.path) == hub_cache / "models--org--tiny" / "snapshots" / V2
        assert run.model.config.toolrl_marker == "v2"
    finally:
        await run.rollouts.close()


def test_cli_reports_an_unresolvable_source_in_one_line(tmp_path):
    res = run_toolrl("train", str(ROOT / "examples" / "tiny.yaml"), "model.source=org/missing",
                     f"trainer.output_dir={tmp_path}", f"model.cache_dir={tmp_path / 'hub'}",
                     env={"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}, timeout=300)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.strip().splitlines() == [res.stderr.strip()]
    assert "model.source: 'org/missing' not found" in res.stderr and "HF_HUB_OFFLINE is set" in res.stderr
