"""The ``geo3k`` environment: preprocessed parquet given as options, or a ``datasets`` dataset (a
local dataset directory here, offline) converted record by record as the preprocessor converts it;
its route holds the calc_geo3k_reward tool and the geo3k reward."""

from __future__ import annotations

import io
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image
from toolrl.config import ConfigError, load_config
from toolrl.data.sources import load_samples
from toolrl.environments import configured_envs
from toolrl.rollout.routes import build_routes
from toolrl.testing.environments import listed_environments
from toolrl_geo3k.preprocess import convert, preprocess

PROBLEMS = {"train": [("<image>Find x.", "16.5"), ("Find the area.", "2\\sqrt{3}")], "test": [("<image>Find y.", "60")]}


def png() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (4, 4), "red").save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture
def dataset_dir(tmp_path: Path) -> Path:
    """Geometry3K's layout on the Hub: data/<split>-*.parquet with images as {bytes, path} structs."""
    data = tmp_path / "geometry3k" / "data"
    data.mkdir(parents=True)
    for split, items in PROBLEMS.items():
        rows = [{"problem": p, "answer": a, "images": [{"bytes": png(), "path": None}]} for p, a in items]
        pq.write_table(pa.Table.from_pylist(rows), data / f"{split}-00000-of-00001.parquet")
    return tmp_path / "geometry3k"


def test_preprocessed_parquet_from_options(dataset_dir: Path, tmp_path: Path) -> None:
    for split in PROBLEMS:
        preprocess(dataset_dir / "data", tmp_path / "verl", split)
    config = load_config(None, data={"env": "geo3k", "env_options": {
        "train_files": ["verl/train.parquet"], "test_files": ["verl/test.parquet"]}, "base_dir": str(tmp_path)})
    train, [test] = load_samples(config), load_samples(config, "test")
    assert [s.ground_truth for s in train] == ["16.5", "2\\sqrt{3}"] and test.ground_truth == "60"
    assert all(s.env == "geo3k" for s in [*train, test])
    assert train[0].tools_kwargs["calc_geo3k_reward"].create_kwargs == {"ground_truth": "16.5"}
    assert train[0].origin == f"{tmp_path / 'verl/train.parquet'} row 1"


def test_hub_records_are_converted_like_the_preprocessor(dataset_dir: Path) -> None:
    pytest.importorskip("datasets")
    config = load_config(None, data={"env": "geo3k", "env_options": {"hub_id": str(dataset_dir)}})
    for split in PROBLEMS:
        samples = load_samples(config, split)
        expected = convert(dataset_dir / "data", split)
        assert [s.prompt for s in samples] == [
            [type(s.prompt[0]).model_validate(m) for m in row["prompt"]] for s, row in zip(samples, expected)]
        assert [s.ground_truth for s in samples] == [a for _, a in PROBLEMS[split]]
        assert [s.tools_kwargs["calc_geo3k_reward"].create_kwargs["ground_truth"] for s in samples] == [
            a for _, a in PROBLEMS[split]]
        assert all(s.env == "geo3k" and s.images for s in samples)


def test_a_record_that_does_not_convert_names_its_row(tmp_path: Path) -> None:
    pytest.importorskip("datasets")
    data = tmp_path / "bad" / "data"
    data.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist([{"problem": "Find x.", "answer": "1"}, {"problem": "", "answer": "2"}]),
                   data / "train-00000-of-00001.parquet")
    config = load_config(None, data={"env": "geo3k", "env_options": {"hub_id": str(tmp_path / "bad")}})
    with pytest.raises(ConfigError, match="bad train row 2: 'problem' must be a non-empty string"):
        load_samples(config)


async def test_route_has_the_tool_and_reward(dataset_dir: Path, tmp_path: Path) -> None:
    preprocess(dataset_dir / "data", tmp_path / "verl", "train")
    config = load_config(None, data={"env": "geo3k", "env_options": {"train_files": ["verl/train.parquet"]},
                                     "base_dir": str(tmp_path)})
    env = configured_envs(config)["geo3k"].env
    assert env.metric == "geo3k" and env.max_turns == 5
    routes, tools = await build_routes(config, load_samples(config))
    try:
        route = routes["geo3k"]
        assert list(route.tools) == ["calc_geo3k_reward"] and [r[0] for r in route.reward_functions] == ["geo3k"]
        assert route.max_turns == 5 and route.parser.name == "hermes"
    finally:
        for tool in tools:
            await tool.close()


def test_listed_by_this_plugin_and_absent_without_it() -> None:
    [row] = [r for r in listed_environments() if r["name"] == "geo3k"]
    assert row["plugin"] == "geo3k" and row["tools"] == ["calc_geo3k_reward"] and row["rewards"] == {"geo3k": 1.0}
    assert row["splits"]["train"] == {"source": "hub hiyouga/geometry3k split train", "size": None}  # not downloaded
    assert "geo3k" not in {r["name"] for r in listed_environments(TOOLRL_DISABLE_PLUGINS="geo3k")}
