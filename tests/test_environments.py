"""Data splits and environments: ``compose.load_samples(config, split)``."""

import json

import pytest
from toolrl.compose import load_samples
from toolrl.config import ConfigError, load_config


def rows(path, *questions):
    path.write_text("".join(json.dumps({"prompt": q, "reward_model": {"ground_truth": "1"}}) + "\n"
                            for q in questions))
    return path


def test_train_and_test_files_are_separate_splits(tmp_path):
    rows(tmp_path / "train.jsonl", "a", "b")
    rows(tmp_path / "test.jsonl", "c")
    config = load_config(None, data={"data": {"train_files": ["train.jsonl"], "test_files": ["test.jsonl"]},
                                     "base_dir": str(tmp_path)})
    assert [s.prompt[0].content for s in load_samples(config)] == ["a", "b"]
    assert [s.prompt[0].content for s in load_samples(config, "test")] == ["c"]


def test_a_missing_split_is_a_config_error(tmp_path):
    rows(tmp_path / "train.jsonl", "a")
    config = load_config(None, data={"data": {"train_files": ["train.jsonl"]}, "base_dir": str(tmp_path)})
    with pytest.raises(ConfigError, match="data.test_files: no test split"):
        load_samples(config, "test")
    with pytest.raises(ConfigError, match="unknown data split 'dev'"):
        load_samples(config, "dev")
    config = load_config(None, data={"data": {"test_files": ["gone.jsonl"]}, "base_dir": str(tmp_path)})
    with pytest.raises(ConfigError, match="data.test_files: .*gone.jsonl does not exist"):
        load_samples(config, "test")
