"""Hostile configs, data files and run directories: every one is a single error line naming the file,
line or field, exit 2, and nothing is trained or printed on the way. The rule: every config and data
value is checked before anything is written; a ``--resume`` over a damaged checkpoint names the file."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
from test_config_errors import ROW, invoke, jsonl, one_error_line, saved_checkpoint, write_config
from toolrl.config import ConfigError, load_config
from toolrl.tools import ToolConfigError

# -- the config file ------------------------------------------------------------------------------


def test_an_integer_past_pythons_digit_limit_names_the_file(tmp_path):
    path = write_config(tmp_path)
    path.write_text(path.read_text().replace("total_steps: 1", "total_steps: " + "1" * 5000))
    one_error_line(invoke("train", str(path)), f"{path}: a value cannot be read", "4300 digits")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_a_fifo_as_config_or_data_file_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    one_error_line(invoke("train", str(fifo)), f"{fifo}: not a regular file")
    data = tmp_path / "train.jsonl"
    os.mkfifo(data)
    path = write_config(tmp_path, data={"train_files": [str(data)]})
    one_error_line(invoke("rollout", str(path)), f"{data}: not a regular file")


def test_a_directory_as_config_is_named_as_the_user_wrote_it(tmp_path):
    assert one_error_line(invoke("train", str(tmp_path)), "") == f"error: {tmp_path}: not a regular file"


@pytest.mark.parametrize(("override", "expected"), [
    ("trainer.output_dir=''", "trainer.output_dir: String should have at least 1 character"),
    ("model.source=''", "model.source: String should have at least 1 character"),
])
def test_an_empty_path_is_no_path(tmp_path, override, expected):
    one_error_line(invoke("train", str(write_config(tmp_path)), override), expected)
    assert not (tmp_path / "run").exists()


def test_a_nul_byte_in_a_path_names_the_field():
    with pytest.raises(ConfigError, match=r"trainer\.output_dir: a path cannot hold a NUL byte"):
        load_config(None, data={"env": "arithmetic", "trainer": {"output_dir": "runs/a\0b"}})
    with pytest.raises(ConfigError, match=r"data\.train_files\.0: a path cannot hold a NUL byte"):
        load_config(None, data={"data": {"train_files": ["a\0.jsonl"]}})


def test_tiny_settings_too_large_for_this_machine_fail_before_any_allocation(tmp_path):
    maxima = "model.tiny={hidden_size: 4096, num_hidden_layers: 64, intermediate_size: 16384, head_dim: 512}"
    one_error_line(invoke("train", str(write_config(tmp_path)), maxima),
                   "model.tiny: these settings make a model of about", "more than this machine's memory builds")


# -- the model source -----------------------------------------------------------------------------


def test_a_model_source_longer_than_a_file_name_is_one_line(tmp_path):
    one_error_line(invoke("train", str(write_config(tmp_path)), "model.source=" + "m" * 300),
                   "model.source: 'mmmm", "File name too long")


def test_a_model_directory_with_a_damaged_config_json_names_it(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "qwen3",')
    one_error_line(invoke("train", str(write_config(tmp_path)), f"model.source={model}"),
                   f"model.source: {model / 'config.json'}:1: not valid JSON")
    (model / "config.json").write_text("[1, 2]")
    one_error_line(invoke("train", str(write_config(tmp_path)), f"model.source={model}"), "must be a JSON object")


def _tokenizer_only(tmp_path):
    """A directory holding the tiny model's tokenizer and nothing else (what a run against a remote
    server needs to render its prompts)."""
    from toolrl import model_sources

    folder = tmp_path / "tokenizer"
    folder.mkdir()
    for file in Path(model_sources.tiny_qwen3()).iterdir():
        if file.name.startswith("tokenizer") or file.name == "chat_template.jinja":
            shutil.copy(file, folder / file.name)
    return folder


def test_a_directory_holding_only_a_tokenizer_serves_only_an_engine_that_loads_no_weights(tmp_path):
    """Training and the transformers engine load the model from model.source: one line at the check. An
    evaluation whose engine loads no weights (a remote server's, here the scripted one) needs none."""
    tokenizer, path = _tokenizer_only(tmp_path), write_config(tmp_path)
    one_error_line(invoke("train", str(path), f"model.source={tokenizer}", "--check"),
                   f"model.source: training loads the model from {tokenizer}, and there is no "
                   f"{tokenizer / 'config.json'}")
    one_error_line(invoke("eval", str(path), f"model.source={tokenizer}", "--output", str(tmp_path / "refused")),
                   f"model.source: the transformers engine loads the model from {tokenizer}")
    result = invoke("eval", str(path), f"model.source={tokenizer}", "engine.name=scripted",
                    "engine.options={script: ['<answer>5</answer>']}", "eval.num_samples=2",
                    "--output", str(tmp_path / "eval"))
    assert result.exit_code == 0, result.stderr
    assert json.loads((tmp_path / "eval" / "summary.json").read_text())["num_samples"] == 2


def test_a_model_directory_without_a_model_type_or_a_tokenizer_is_one_line(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    path = write_config(tmp_path)
    one_error_line(invoke("train", str(path), f"model.source={model}", "--check"),
                   f"there is {model / 'config.json'}, which names no model_type")
    one_error_line(invoke("eval", str(path), f"model.source={model}", "engine.name=scripted",
                          "engine.options={script: [x]}", "--output", str(tmp_path / "eval")),
                   f"model.source: {model} holds no tokenizer transformers can load")


def test_a_run_on_ray_without_ray_installed_is_one_line(tmp_path, hide_package):
    """Not a ModuleNotFoundError out of start_processes once the check has passed."""
    hide_package("ray")
    one_error_line(invoke("train", str(write_config(tmp_path)), "ray.address=local", "--check"),
                   "override ray.address=local: ray.address: Ray is not installed: pip install 'toolrl[ray]'")


# -- data rows ------------------------------------------------------------------------------------


def test_a_lone_surrogate_in_a_prompt_is_refused_before_the_run_starts(tmp_path):
    row = json.dumps(ROW).replace("What is 2+3?", "What is \\ud800?")
    data = jsonl(tmp_path, json.dumps(ROW), row)
    path = write_config(tmp_path, data={"train_files": [str(data)]})
    one_error_line(invoke("train", str(path)), f"{data}:2: invalid JSON: a lone surrogate")
    assert not (tmp_path / "run").exists()
    emoji = json.dumps(ROW).replace("What is 2+3?", "\\ud83d\\ude00 2+3?")  # a pair is one character
    from toolrl.data import load_files

    assert load_files([jsonl(tmp_path, emoji, name="ok.jsonl")])[0].prompt[0].content.startswith("\U0001f600")


def test_a_prompt_part_neither_text_nor_an_image_is_refused_not_dropped(tmp_path):
    """A video part (Qwen-VL templates know it; no engine here shows one) left out would train the model
    on a prompt without what the row asked about."""
    row = {**ROW, "prompt": [{"role": "user", "content": [{"type": "text", "text": "What happens?"},
                                                           {"type": "video", "video": "clip.mp4"}]}]}
    data = jsonl(tmp_path, json.dumps(ROW), json.dumps(row))
    path = write_config(tmp_path, data={"train_files": [str(data)]})
    one_error_line(invoke("train", str(path)),
                   f"{data}:2: prompt.0.content.1: a 'video' part; a prompt holds text and image parts")


# -- tool classes named by import path --------------------------------------------------------------


def test_a_tool_module_that_prints_or_exits_at_import_is_a_config_error(tmp_path, monkeypatch, capsys):
    from toolrl.tools.verl_config import resolve_tool_class

    with pytest.raises(ToolConfigError, match=r"'this\.Zen': cannot import \(AttributeError"):
        resolve_tool_class("this.Zen")
    (tmp_path / "exits_at_import.py").write_text("import sys\nprint('noise')\nsys.exit(0)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ToolConfigError, match=r"cannot import \(SystemExit\(0\)"):
        resolve_tool_class("exits_at_import.Tool")
    out = capsys.readouterr()
    assert "Zen of Python" not in out.out + out.err and "noise" not in out.out + out.err
    sys.modules.pop("exits_at_import", None)


def test_train_with_a_tool_module_that_exits_at_import_fails_with_exit_2(tmp_path, monkeypatch):
    (tmp_path / "exits_too.py").write_text("import sys\nsys.exit(0)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    path = write_config(tmp_path, tools={"entries": [{"class_name": "exits_too.Calculator"}]})
    one_error_line(invoke("train", str(path)), "exits_too.Calculator", "SystemExit(0)")
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


# -- --resume over a damaged checkpoint -----------------------------------------------------------


@pytest.fixture
def saved_run(tmp_path):
    return saved_checkpoint(tmp_path)


@pytest.mark.parametrize(("damage", "expected"), [
    (lambda ckpt: (ckpt / "meta.json").write_text('{"step": '), "meta.json:1: not valid JSON"),
    (lambda ckpt: (ckpt / "meta.json").write_text('{"step": "one"}'), "meta.json: not a checkpoint's meta"),
    (lambda ckpt: (ckpt / "controller.pt").write_bytes(b"garbage"), "controller.pt: cannot be read"),
    (lambda ckpt: (ckpt / "ahead.pt").write_bytes(b"garbage"), "ahead.pt: not a batch generated ahead"),
])
def test_resume_over_damaged_controller_files_names_the_file(saved_run, damage, expected):
    path, ckpt = saved_run
    damage(ckpt)
    one_error_line(invoke("train", str(path), "--resume", "trainer.total_steps=2"), "--resume: ", expected)


def test_resume_over_a_truncated_shard_or_another_model_names_the_checkpoint(saved_run):
    """Found from the checkpoint's files and the model's config before any weight loads: one line, no
    loading progress or torch warning before it."""
    path, ckpt = saved_run
    one_error_line(invoke("train", str(path), "--resume", "trainer.total_steps=2",
                          "model.tiny={hidden_size: 32, head_dim: 32}"),
                   f"--resume: {ckpt}: the trainer's state cannot be loaded into this model: ",
                   "model.embed_tokens.weight is [")
    shard = max((p for p in ckpt.iterdir() if p.suffix == ".distcp"), key=lambda p: p.stat().st_size)
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    one_error_line(invoke("train", str(path), "--resume", "trainer.total_steps=2"),
                   f"--resume: {ckpt}: the trainer's state cannot be loaded: {shard.name} is cut short (")
    (ckpt / ".metadata").write_bytes(b"garbage")
    one_error_line(invoke("train", str(path), "--resume", "trainer.total_steps=2"),
                   f"--resume: {ckpt}: the trainer's state cannot be read (")
