"""Every bad config, data or run-directory input: exit 2, exactly one line on stderr naming the file,
the 1-based line or row and the dotted field, no traceback (issue 13)."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from toolrl.cli import cli
from toolrl.config import ConfigError, load_config
from toolrl.roles.run_dir import RunDir, read_metrics, rollout_metrics
from toolrl.rollout import Trajectory

ROW = {"prompt": [{"role": "user", "content": "What is 2+3?"}], "reward_model": {"ground_truth": "5"},
       "extra_info": {"tools_kwargs": {"calculator": {"create_kwargs": {}}}}}


def invoke(*args, stdin=None):
    result = CliRunner().invoke(cli, list(args), input=stdin)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def one_error_line(result, *fragments):
    assert result.exit_code == 2, (result.exit_code, result.stderr, result.stdout)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def write_config(tmp_path, **sections):
    config = {"model": {"source": "tiny-qwen3"}, "env": "arithmetic", "env_options": {"train_size": 4},
              "tools": {"entries": [{"class_name": "calculator"}]},
              "trainer": {"total_steps": 1, "output_dir": str(tmp_path / "run"), "progress": False, "plot": False}}
    config.update(sections)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def jsonl(tmp_path, *lines, name="train.jsonl"):
    path = tmp_path / name
    path.write_bytes(b"\n".join(line if isinstance(line, bytes) else line.encode() for line in lines) + b"\n")
    return path


# -- the config file --------------------------------------------------------------------------------


def test_yaml_syntax_error_is_one_line_with_line_and_column(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("model:\n  source: tiny-qwen3\nenv_options: {train_size: 4\nrollout: {n: 2}\n")
    one_error_line(invoke("train", str(path)), f"{path}:4:", "invalid YAML")


def test_yaml_syntax_error_in_a_real_process(tmp_path):
    """The same through the console entry point: stderr is one line, nothing else."""
    path = tmp_path / "bad.yaml"
    path.write_text("a: 1\n  b: 2\n")
    res = subprocess.run([sys.executable, "-m", "toolrl", "rollout", str(path)], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 2 and res.stderr.splitlines() == [
        f"error: {path}:2:4: invalid YAML: mapping values are not allowed here"]


def test_config_with_invalid_utf8(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_bytes(b"model:\n  source: tiny\xff-qwen3\n")
    one_error_line(invoke("train", str(path)), f"{path}:2: not valid UTF-8 (byte 0xff at column 15)")


def test_missing_config_file(tmp_path):
    one_error_line(invoke("rollout", str(tmp_path / "nope.yaml")), "nope.yaml: cannot read: No such file")


def test_validation_error_names_the_line_in_the_file(tmp_path):
    path = write_config(tmp_path, rollout={"n": 2, "temperature": "hot"})
    text = path.read_text().splitlines()
    line = next(i for i, ln in enumerate(text, 1) if "temperature" in ln)
    one_error_line(invoke("train", str(path)), f"{path}:{line}: rollout.temperature: Input should be a valid number")


def test_unknown_key_in_a_list_item_names_its_line(tmp_path):
    path = write_config(tmp_path, reward={"functions": [{"name": "gsm8k"}, {"name": "format", "wieght": 1}]})
    line = next(i for i, ln in enumerate(path.read_text().splitlines(), 1) if "wieght" in ln)
    one_error_line(invoke("train", str(path)), f"{path}:{line}: reward.functions.1.wieght: unknown key")


def test_model_tiny_unknown_key_from_an_override_and_from_the_file(tmp_path):
    path = write_config(tmp_path)
    one_error_line(invoke("train", str(path), "model.tiny={bogus: 1}"),
                   "override model.tiny={bogus: 1}: model.tiny: unknown key 'bogus'")
    path = write_config(tmp_path, model={"source": "tiny-qwen3", "tiny": {"hidden_size": "wide"}})
    line = next(i for i, ln in enumerate(path.read_text().splitlines(), 1) if "tiny:" in ln)
    one_error_line(invoke("rollout", str(path)), f"{path}:{line}: model.tiny: hidden_size: Input should be a valid integer")
    assert load_config(path, ["model.tiny={hidden_size: 32, num_hidden_layers: 1}"]).model.tiny == {
        "hidden_size": 32, "num_hidden_layers": 1}


def test_output_dir_is_a_file(tmp_path):
    (tmp_path / "taken").write_text("x")
    path = write_config(tmp_path)
    one_error_line(invoke("rollout", str(path), f"trainer.output_dir={tmp_path / 'taken'}"),
                   f"trainer.output_dir: {tmp_path / 'taken'} exists and is not a directory")


def test_tools_config_with_a_bad_timeout(tmp_path):
    tools = tmp_path / "tools.yaml"
    tools.write_text("tools:\n  - class_name: calculator\n    config: {type: native, timeout: abc}\n")
    path = write_config(tmp_path, tools={"config_path": "tools.yaml"})
    one_error_line(invoke("rollout", str(path)), str(tools), "timeout")


# -- data files -------------------------------------------------------------------------------------


def data_error(tmp_path, data_path, *fragments):
    path = write_config(tmp_path, data={"train_files": [str(data_path)]})
    return one_error_line(invoke("rollout", str(path)), *fragments)


def test_data_with_invalid_utf8(tmp_path):
    data = jsonl(tmp_path, json.dumps(ROW), b'{"prompt": "caf\xe9"}')
    data_error(tmp_path, data, f"{data}:2: not valid UTF-8 (byte 0xe9 at column 16)")


def test_data_with_a_deeply_nested_line(tmp_path):
    data = jsonl(tmp_path, json.dumps(ROW), "", '{"prompt": "x", "extra_info": ' + "[" * 5000 + "]" * 5000 + "}")
    data_error(tmp_path, data, f"{data}:3: invalid JSON: nested deeper than 100 levels")


def test_data_with_invalid_json_names_line_and_column(tmp_path):
    data = jsonl(tmp_path, json.dumps(ROW), '{"prompt": "x",}')
    data_error(tmp_path, data, f"{data}:2: invalid JSON: Expecting property name enclosed in double quotes (column 16)")


def test_data_row_field_error_is_dotted_and_one_based(tmp_path):
    bad = {**ROW, "prompt": [{"role": "user", "content": "hi"}, {"role": "robot", "content": "x"}]}
    data = jsonl(tmp_path, json.dumps(ROW), json.dumps(bad))
    data_error(tmp_path, data, f"{data}:2: prompt.1.role: Input should be")


def test_data_row_that_is_not_an_object(tmp_path):
    data = jsonl(tmp_path, json.dumps(ROW), "[1, 2]")
    data_error(tmp_path, data, f"{data}:2: a row must be a JSON object, got list")


def test_corrupt_parquet(tmp_path):
    data = tmp_path / "train.parquet"
    data.write_bytes(b"PAR1" + b"\x00garbage" * 10)
    data_error(tmp_path, data, f"{data}: not a readable parquet file")


def test_parquet_rows_are_numbered_from_one(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist([{"prompt": "fine"}, {"prompt": None}]), data)
    data_error(tmp_path, data, f"{data} row 2: prompt: Input should be a valid list")


def test_unknown_tool_in_tools_kwargs_names_the_row(tmp_path):
    typo = {**ROW, "extra_info": {"tools_kwargs": {"calculater": {"create_kwargs": {"ground_truth": "5"}}}}}
    data = jsonl(tmp_path, json.dumps(ROW), json.dumps(typo))
    data_error(tmp_path, data, f"{data}:2: extra_info.tools_kwargs.calculater: unknown tool (configured tools: calculator)")


def test_check_samples_against_tools_names_samples_without_a_file():
    from toolrl.data import check_samples_against_tools
    from toolrl.schemas import Sample

    samples = [Sample(prompt="a"), Sample(prompt="b", tools_kwargs={"ghost": {}})]
    check_samples_against_tools(samples[:1], [], "data")
    with pytest.raises(ConfigError, match=r"^data sample 2: tools_kwargs.ghost: unknown tool \(configured tools: none\)$"):
        check_samples_against_tools(samples, [], "data")


# -- parse ------------------------------------------------------------------------------------------


def test_parse_invalid_utf8_on_stdin():
    one_error_line(invoke("parse", "-", stdin=b"ok\n<tool_call>\xff</tool_call>"), "<stdin>:2: not valid UTF-8")


def test_parse_deep_nesting_reports_a_parse_error():
    result = invoke("parse", "-", stdin="<tool_call>" + "[" * 1000 + "</tool_call>")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["calls"] == [] and "deeper than 64" in out["errors"][0]["message"]


# -- the run directory ------------------------------------------------------------------------------


def test_metrics_truncated_last_line_is_dropped_and_a_corrupt_line_is_named(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "reward_mean": 0.5}\n{"step": 2, "reward_mean": 0.25}\n{"step": 3, "rew')
    assert [r["step"] for r in read_metrics(path)] == [1, 2]
    RunDir(tmp_path).truncate_metrics(1)
    assert path.read_text() == '{"step": 1, "reward_mean": 0.5}\n'
    path.write_text('{"step": 1}\n{"step": 2, "rew\n{"step": 3}\n')
    with pytest.raises(ConfigError, match=rf"^{path}:2: not a metrics row"):
        RunDir(tmp_path).truncate_metrics(3)


def test_resume_with_a_truncated_metrics_line(tmp_path, tiny_qwen3_path):
    """``train --resume`` after a crash mid-append: the cut line goes, the run continues (exit 0);
    a corrupt line before the last is an error naming it (exit 2)."""
    from toolrl.roles.trainer_rank import TrainerRank
    from toolrl.training import checkpoint

    path = write_config(tmp_path)
    out = tmp_path / "run"
    rank = TrainerRank(load_config(path))
    rank.setup()
    staged = checkpoint.staging_dir(out / "checkpoints", 1)
    rank.save(str(staged))
    checkpoint.finalize(out / "checkpoints", staged, 1, {}, keep=2)
    metrics = out / "metrics.jsonl"
    metrics.write_text('{"step": 1, "reward_mean": 0.5, "reward_std": 0.0, "tool_call_rate": 0}\n{"step": 2, "rew')
    result = invoke("train", str(path), "--resume")
    assert result.exit_code == 0, result.stderr
    assert [r["step"] for r in read_metrics(metrics)] == [1]
    metrics.write_text('{"step": 1}\n{"st\n{"step": 1}\n')
    one_error_line(invoke("train", str(path), "--resume"), f"{metrics}:2: not a metrics row")


def test_rollout_metrics_survive_non_finite_rewards():
    def traj(reward):
        return Trajectory(trajectory_id="t", sample_index=0, group=0, prompt_ids=[1], response_ids=[2, 3],
                          response_mask=[1, 1], reward=reward)

    row = rollout_metrics([traj(1.0), traj(float("nan")), traj(0.0), traj(float("inf"))], wall_s=1.0)
    assert row["reward_mean"] == 0.5 and row["reward_std"] == 0.5 and row["reward_nonfinite"] == 2
    row = rollout_metrics([traj(float("nan"))], wall_s=0.0)
    assert math.isnan(row["reward_mean"]) and row["reward_std"] == 0.0 and row["reward_nonfinite"] == 1
    assert rollout_metrics([], wall_s=0.0)["tool_call_rate"] == 0.0


def test_config_errors_are_one_line_in_python_too(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_config(write_config(tmp_path, rollout={"n": 0, "top_p": 2}))
    assert "\n" not in str(info.value) and "rollout.n" in str(info.value) and "rollout.top_p" in str(info.value)
    assert Path(str(info.value).split(":")[0]).name == "config.yaml"
