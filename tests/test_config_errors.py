"""Every bad config, data or run-directory input: exit 2, exactly one line on stderr naming the file,
the 1-based line or row and the dotted field, no traceback (issue 13)."""

import atexit
import json
import math
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from toolrl.cli import cli
from toolrl.config import ConfigError, load_config
from toolrl.run_dir import RunDir, read_metrics, rollout_metrics
from toolrl.trajectory import Trajectory

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


_SAVED_RUNS: list[Path] = []  # the first saved_checkpoint's run directory, copied by the later ones


def saved_checkpoint(tmp_path):
    """A config and the run directory it names, holding one real checkpoint (the trainer's shards, RNG
    files, meta.json) and its metrics line: what ``--resume`` continues from. The trainer's state is
    saved once per test process (a model set up and saved: seconds) and copied for each later test,
    which may damage its copy."""
    from toolrl import run_dir

    path = write_config(tmp_path)
    out = tmp_path / "run"
    if _SAVED_RUNS:
        shutil.copytree(_SAVED_RUNS[0], out)
        return path, run_dir.latest(out / "checkpoints")
    from toolrl.processes.trainer_rank import TrainerRank

    rank = TrainerRank(load_config(path))
    rank.setup()
    staged = run_dir.staging_dir(out / "checkpoints", 1)
    rank.save(str(staged))
    final = run_dir.finalize(out / "checkpoints", staged, 1, {"world_size": 1, "data_position": 4}, keep=2)
    (out / "metrics.jsonl").write_text('{"step": 1, "reward_mean": 0.5, "reward_std": 0.0, "tool_call_rate": 0}\n')
    pristine = Path(tempfile.mkdtemp(prefix="toolrl-saved-run-")) / "run"
    atexit.register(shutil.rmtree, pristine.parent, True)  # the test process's copy goes with it
    shutil.copytree(out, pristine)
    _SAVED_RUNS.append(pristine)
    return path, final


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
    one_error_line(invoke("train", str(path)),
                   f"{path}:{line}: reward.functions.1.wieght: unknown key (did you mean 'weight'?)")


def test_an_unknown_key_names_the_closest_field_of_its_section(tmp_path):
    path = write_config(tmp_path)
    one_error_line(invoke("train", str(path), "trainr.total_steps=1"), "trainr: unknown key (did you mean 'trainer'?)")
    one_error_line(invoke("train", str(path), "rollout.temprature=1"),
                   "rollout.temprature: unknown key (did you mean 'temperature'?)")
    one_error_line(invoke("train", str(path), "algorithm.loss=cispo", "algorithm.loss_options.max_weigth=2"),
                   "algorithm.loss_options.max_weigth: unknown key (did you mean 'max_weight'?)")
    line = one_error_line(invoke("train", str(path), "rollout.zzz=1"), "rollout.zzz: unknown key")
    assert "did you mean" not in line  # nothing close


def test_model_tiny_unknown_key_from_an_override_and_from_the_file(tmp_path):
    path = write_config(tmp_path)
    one_error_line(invoke("train", str(path), "model.tiny={bogus: 1}"),
                   "override model.tiny={bogus: 1}: model.tiny: bogus: unknown key")
    path = write_config(tmp_path, model={"source": "tiny-qwen3", "tiny": {"hidden_size": "wide"}})
    line = next(i for i, ln in enumerate(path.read_text().splitlines(), 1) if "tiny:" in ln)
    one_error_line(invoke("rollout", str(path)), f"{path}:{line}: model.tiny: hidden_size: Input should be a valid integer")
    assert load_config(path, ["model.tiny={hidden_size: 32, num_hidden_layers: 1}"]).model.tiny == {
        "hidden_size": 32, "num_hidden_layers": 1}


def test_model_tiny_is_checked_against_the_tiny_source_it_builds(tmp_path):
    """The vision-language tiny model's own settings (a vision tower, its shape rule) are known at load."""
    path = write_config(tmp_path, model={"source": "tiny-qwen2.5-vl"})
    assert load_config(path, ["model.tiny={vision_depth: 3}"]).model.tiny == {"vision_depth": 3}
    one_error_line(invoke("rollout", str(path), "model.tiny={head_dim: 16}"),
                   "model.tiny: head_dim (16) must be hidden_size")


def test_a_trainer_rank_that_asks_for_no_resource(tmp_path):
    path = write_config(tmp_path)
    one_error_line(invoke("train", str(path), "ray.trainer_rank_resources=[{CPU: 1}, {node2: 0}]"),
                   "ray.trainer_rank_resources", "rank 1: name at least one resource")


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
    from toolrl.rollout.routes import check_samples_against_tools
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
    path, _ = saved_checkpoint(tmp_path)
    metrics = tmp_path / "run" / "metrics.jsonl"
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


# -- sizes, non-finite numbers, YAML that repeats or expands, removed keys (issue 24) ---------------
# Each case runs the real entry point (python -m toolrl train) in a process capped at 4 GiB of
# address space: a check that regresses fails its test with a MemoryError, not the machine.

BASE_YAML = """model: {source: tiny-qwen3}
env: arithmetic
env_options: {train_size: 4}
tools: {entries: [{class_name: calculator}]}
trainer: {total_steps: 1, output_dir: %s, progress: false, plot: false}
"""


def toolrl_process(*args, timeout=180):
    def cap_memory():
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))

    return subprocess.run([sys.executable, "-m", "toolrl", *args], capture_output=True, text=True, timeout=timeout,
                          preexec_fn=cap_memory)


def laughs(indent, levels=9):
    """A 'billion laughs': each level lists the previous one nine times (9**levels strings)."""
    lines = [f"{indent}l0: &l0 [{', '.join(['lol'] * 9)}]"]
    lines += [f"{indent}l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def line_of(path, fragment):
    return next(i for i, ln in enumerate(path.read_text().splitlines(), 1) if fragment in ln)


def case_group_size(tmp_path, cfg):
    cfg.write_text(BASE_YAML % (tmp_path / "run"))
    return ["rollout.n=99999999999999999999999999"], [
        "override rollout.n=99999999999999999999999999: rollout.n: at most 4,096 ("]


def case_trajectories_per_step(tmp_path, cfg):
    cfg.write_text(BASE_YAML % (tmp_path / "run") + "data: {batch_size: 512}\nrollout: {n: 4096}\n")
    return [], [f"{cfg}: data.batch_size × rollout.n = 2,097,152 trajectories per step; at most 65,536 ("]


def case_empty_prompt(tmp_path, cfg):
    data = jsonl(tmp_path, json.dumps(ROW), json.dumps({**ROW, "prompt": []}))
    cfg.write_text(BASE_YAML % (tmp_path / "run") + f"data: {{train_files: [{data}]}}\n")
    return [], [f"{data}:2: prompt: no messages"]


def case_laughs_in_engine_options(tmp_path, cfg):
    cfg.write_text(BASE_YAML % (tmp_path / "run") + "engine:\n  options:\n" + laughs("    "))
    # Past 100,000 repeated nodes at the second alias of l4 (66,430 nodes each).
    return [], [f"{cfg}:{line_of(cfg, 'l4: &l4')}: YAML aliases of the value anchored here expand past 100,000 nodes"]


def case_laughs_in_env_options(tmp_path, cfg):
    cfg.write_text((BASE_YAML % (tmp_path / "run")).replace("env_options: {train_size: 4}\n",
                                                            "env_options:\n" + laughs("  ")))
    return [], [f"{cfg}:{line_of(cfg, 'l4: &l4')}: YAML aliases", "billion laughs"]


def case_recursive_alias(tmp_path, cfg):
    cfg.write_text(BASE_YAML % (tmp_path / "run") + "engine:\n  options: &loop {self: [*loop]}\n")
    return [], [f"{cfg}:7: a YAML alias inside the value it refers to"]


def case_50mb_system_prompt_in_a_data_row(tmp_path, cfg):
    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps({**ROW, "prompt": [{"role": "system", "content": "x" * (50 << 20)},
                                                  {"role": "user", "content": "2+3?"}]}) + "\n")
    cfg.write_text(BASE_YAML % (tmp_path / "run") + f"data: {{train_files: [{data}]}}\n")
    return [], [f"{data}:1: prompt: 52,428,", " characters of prompt text; at most 1,000,000 ("]


def case_50mb_config(tmp_path, cfg):
    cfg.write_text(BASE_YAML % (tmp_path / "run") + f"data: {{system_prompt: {'x' * (50 << 20)}}}\n")
    return [], [f"{cfg}: larger than 4,194,304 bytes (put long texts in data files)"]


def case_long_system_prompt(tmp_path, cfg):
    cfg.write_text(BASE_YAML % (tmp_path / "run") + f"data:\n  system_prompt: {'x' * 1_500_000}\n")
    return [], [f"{cfg}:7: data.system_prompt: 1,500,000 characters of prompt text; at most 1,000,000 ("]


def case_infinite_lr(tmp_path, cfg):
    cfg.write_text(BASE_YAML % (tmp_path / "run"))
    return ["optim.lr=.inf"], ["override optim.lr=.inf: optim.lr: Input should be a finite number"]


def case_infinite_temperature(tmp_path, cfg):
    cfg.write_text(BASE_YAML % (tmp_path / "run"))
    return ["rollout.temperature=.inf"], ["rollout.temperature: Input should be a finite number"]


def case_nan_in_the_file(tmp_path, cfg):
    cfg.write_text(BASE_YAML % (tmp_path / "run") + "reward:\n  tool_reward_weight: .nan\n")
    return [], [f"{cfg}:7: reward.tool_reward_weight: Input should be a finite number"]


def case_duplicated_section(tmp_path, cfg):
    cfg.write_text("rollout: {n: 2}\n" + BASE_YAML % (tmp_path / "run") + "rollout: {n: 8}\n")
    return [], [f"{cfg}:7: duplicate key 'rollout' (first at line 1)"]


def case_duplicated_nested_key(tmp_path, cfg):
    cfg.write_text(BASE_YAML % (tmp_path / "run") + "rollout:\n  n: 2\n  max_new_tokens: 8\n  n: 8\n")
    return [], [f"{cfg}:9: duplicate key 'n' (first at line 7)"]


def case_removed_synthetic_data(tmp_path, cfg):
    cfg.write_text("model: {source: tiny-qwen3}\ndata:\n  synthetic: {kind: arithmetic, num_samples: 8}\n")
    return [], [f"{cfg}:3: data.synthetic was removed: use env: arithmetic", "docs/environments.md"]


def case_removed_tasks(tmp_path, cfg):
    cfg.write_text(BASE_YAML % (tmp_path / "run"))
    return ["tasks={math: {max_turns: 2}}"], ["override tasks={math: {max_turns: 2}}: tasks was replaced by envs"]


@pytest.mark.parametrize("case", [
    case_group_size, case_trajectories_per_step, case_empty_prompt, case_laughs_in_engine_options,
    case_laughs_in_env_options, case_recursive_alias, case_50mb_system_prompt_in_a_data_row, case_50mb_config,
    case_long_system_prompt, case_infinite_lr, case_infinite_temperature, case_nan_in_the_file,
    case_duplicated_section, case_duplicated_nested_key, case_removed_synthetic_data, case_removed_tasks,
], ids=lambda case: case.__name__.removeprefix("case_"))
def test_bad_sizes_and_values_are_one_line_before_anything_loads(tmp_path, case):
    cfg = tmp_path / "config.yaml"
    overrides, fragments = case(tmp_path, cfg)
    res = toolrl_process("train", str(cfg), *overrides)
    assert res.returncode == 2 and len(res.stderr.splitlines()) == 1, (res.returncode, res.stderr[-3000:])
    line = res.stderr.strip()
    assert line.startswith("error: ") and all(f in line for f in fragments), (fragments, line[:500])
    run = tmp_path / "run"  # data errors come after the run directory is prepared, before the model loads
    written = sorted(p.relative_to(run).as_posix() for p in run.rglob("*")) if run.exists() else []
    assert written in ([], ["config.json", "rollouts"]), written


def test_prompt_longer_than_the_context_names_the_row_before_the_model_loads(tmp_path, monkeypatch):
    """A prompt the model's context cannot hold fails once, naming its row, after the tokenizer and
    before the model loads (today every trajectory of it fails in the engine and the run goes on)."""
    from toolrl.processes import in_process

    def no_model(*args, **kwargs):
        raise AssertionError("the model was built before the prompts were checked")

    monkeypatch.setattr(in_process, "build_policy", no_model)
    long_row = {**ROW, "prompt": [{"role": "user", "content": "7" * 40_000}]}  # Qwen: one token per digit
    data = jsonl(tmp_path, json.dumps(ROW), json.dumps(long_row))
    path = write_config(tmp_path, data={"train_files": [str(data)]})
    # 40,000 digits and the calculator's schema (known before the tool is built), as the rollout renders them.
    one_error_line(invoke("rollout", str(path)), f"{data}:2: prompt: 40,", " tokens with the chat template and its "
                   "tools' schemas; the model's context is 32,768 (max_position_embeddings in ")


def test_prompt_tokens_are_counted_only_for_prompts_that_may_not_fit(qwen3_tokenizer, tiny_qwen3_path, monkeypatch):
    from toolrl.rollout.context_check import check_prompt_tokens, model_context
    from toolrl.schemas import Sample

    config_json = Path(tiny_qwen3_path) / "config.json"
    assert model_context(qwen3_tokenizer, tiny_qwen3_path) == (32768, f"max_position_embeddings in {config_json}")
    assert model_context(qwen3_tokenizer, "/nonexistent") == (131072, "the tokenizer's model_max_length")
    rendered = []
    render = qwen3_tokenizer.apply_chat_template

    def counted(messages, *args, **kwargs):
        rendered.append(messages)
        return render(messages, *args, **kwargs)

    monkeypatch.setattr(qwen3_tokenizer, "apply_chat_template", counted)
    # 34,000 UTF-8 bytes may be 32,768 tokens, so it is rendered; it is far fewer and fits.
    check_prompt_tokens([Sample(prompt="2+3?"), Sample(prompt="é" * 17_000)], qwen3_tokenizer, tiny_qwen3_path, None, "data")
    assert [m[-1]["content"][:1] for m in rendered] == ["", "é"]  # the template's own tokens, then the long one
    # One token per digit, and 8 for the template: one token too many.
    with pytest.raises(ConfigError, match=r"^data sample 2: prompt: 32,768 tokens with the chat template; "
                                          r"the model's context is 32,768 \(max_position_embeddings in "):
        check_prompt_tokens([Sample(prompt="2+3?"), Sample(prompt="7" * 32_760)], qwen3_tokenizer, tiny_qwen3_path,
                            None, "data")


def test_prompt_tokens_count_each_image_as_the_processor_expands_it(tmp_path):
    """A vision-language model's prompt holds each image as its run of image tokens: a prompt whose text
    fits but whose figures do not is refused before the model loads."""
    import shutil

    from PIL import Image
    from toolrl import model_sources
    from toolrl.images import ImageLimits, prepare
    from toolrl.renderers.chat import ChatRenderer
    from toolrl.rollout.context_check import check_prompt_tokens, image_token_bound
    from toolrl.schemas import Sample

    model = tmp_path / "vlm"
    shutil.copytree(model_sources.tiny_qwen2_5_vl(), model)
    config = json.loads((model / "config.json").read_text())
    processor, tokenizer = model_sources.load_processor(model), model_sources.load_tokenizer(model)
    figure = prepare(Image.new("RGB", (112, 112), "white"), ImageLimits())
    sample = Sample(prompt=[{"role": "user", "content": "Find x. <image>"}], images=[figure])
    renderer = ChatRenderer(tokenizer, processor=processor)
    grid = renderer.image_grid(figure)
    run = grid[0] * grid[1] * grid[2] // 4
    assert run > 1 and run <= image_token_bound(processor, ImageLimits())
    tokens = len(renderer.prompt_ids(renderer.with_image_parts([m.to_template() for m in sample.prompt], "<image>"),
                                     [grid]))

    def context(n: int) -> None:
        config["text_config"]["max_position_embeddings"] = n
        (model / "config.json").write_text(json.dumps(config))

    context(tokens + 1)
    check_prompt_tokens([sample], tokenizer, model, processor, "data")
    context(tokens)  # the text alone would still fit: the image's run is what does not
    with pytest.raises(ConfigError, match=rf"^data sample 1: prompt: {tokens} tokens with the chat template, 1 image "
                                          rf"included; the model's context is {tokens} "):
        check_prompt_tokens([sample], tokenizer, model, processor, "data")


def test_renamed_keys_are_a_table_and_each_names_its_replacement(tmp_path):
    from toolrl.config import MOVED_KEYS

    path = write_config(tmp_path)
    for keys, hint in MOVED_KEYS.items():
        override = ".".join(keys) + "={}"
        with pytest.raises(ConfigError) as info:
            load_config(path, [override])
        assert str(info.value) == f"override {override}: {'.'.join(keys)} {hint}"
        assert "use " in hint or "replaced by " in hint


def test_duplicate_keys_are_errors_but_merge_keys_and_small_aliases_load(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text((BASE_YAML % (tmp_path / "run")) + "eval: &sampling {n: 2, temperature: 0.7}\n"
                    "rollout:\n  <<: *sampling\n  n: 4\nengine:\n  options: {a: &a [1, 2], b: [*a, *a]}\n")
    config = load_config(path)
    assert (config.rollout.n, config.rollout.temperature, config.eval.n) == (4, 0.7, 2)
    assert config.engine.options == {"a": [1, 2], "b": [[1, 2], [1, 2]]}
    path.write_text(path.read_text() + "eval: {n: 1}\n")
    with pytest.raises(ConfigError, match=rf"^{path}:12: duplicate key 'eval' \(first at line 6\)"):
        load_config(path)
    with pytest.raises(ConfigError, match=r"^override engine.options={a: 1, a: 2}: duplicate key 'a'"):
        load_config(write_config(tmp_path), ["engine.options={a: 1, a: 2}"])


def test_limits_name_the_limit_and_why(tmp_path):
    path = write_config(tmp_path)
    for override, expected in [
        ("eval.n=5000", "eval.n: at most 4,096 (a group's trajectories are generated and held together)"),
        ("rollout.max_new_tokens=10000000", "rollout.max_new_tokens: at most 1,048,576 (tokens held at once"),
        ("optim.micro_batch_size=100000", "optim.micro_batch_size: at most 65,536 (sequences held in memory"),
        ("trainer.collective_timeout_s=1e300", "trainer.collective_timeout_s: at most 604,800 (a week"),
        ("trainer.seed=4294967296", "trainer.seed: Input should be less than or equal to 4294967295"),
        ("optim.betas=[0.9, 1.5]", "optim.betas.1: Input should be less than 1"),
        ("model.tiny={hidden_size: 100000}", "model.tiny: hidden_size: Input should be less than or equal to 4096"),
        ("model.tiny={num_attention_heads: 3, num_key_value_heads: 2}",
         "model.tiny: num_attention_heads (3) must be a multiple of num_key_value_heads (2)"),
    ]:
        with pytest.raises(ConfigError, match="^" + re.escape(f"override {override}: {expected}")):
            load_config(path, [override])


def test_a_long_override_is_cut_in_the_message(tmp_path):
    override = "data.system_prompt=" + "x" * 1_000_001
    with pytest.raises(ConfigError) as info:
        load_config(write_config(tmp_path), [override])
    assert str(info.value).startswith(f"override {override[:77]}...: data.system_prompt: 1,000,001 characters")
    assert len(str(info.value)) < 300


def test_config_does_not_import_the_model_builders():
    """config validates model.tiny against toolrl.tiny_settings, which models builds from: no cycle."""
    import ast

    imported = set()
    for node in ast.walk(ast.parse(Path(load_config.__code__.co_filename).read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
        elif isinstance(node, ast.Import):
            imported.update(a.name for a in node.names)
    assert "toolrl.model_sources" not in imported and "toolrl.tiny_settings" in imported


@pytest.mark.parametrize("override", ["data.train_files=[missing.jsonl]", "model.source=/no/such/model"])
def test_a_missing_data_file_or_model_is_found_before_torch_loads(tmp_path, override):
    """Checked first, so the one line comes in a second rather than after torch and the parts load."""
    code = ("import sys\nfrom toolrl.cli import cli\ntry:\n    cli.main(sys.argv[1:])\n"
            "except SystemExit as exc:\n    print(exc.code, 'torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code, "train", str(write_config(tmp_path)), override],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.stdout.split() == ["2", "False"], out.stderr[-2000:]
    assert out.stderr.strip().startswith(("error: data.train_files: ", "error: model.source: ")), out.stderr
