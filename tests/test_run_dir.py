"""A run starts only when all of it is valid and never overwrites a run (issue 24).

Through the CLI: for every invalid config, an earlier run in the output directory is byte-identical
afterwards (whether the command named --resume, --overwrite or neither); a valid run refuses an
earlier run unless told, naming the flags; --overwrite replaces it; ``config.json`` is written
atomically. And one run resolves its parts and loads each data split once (issue 23)."""

import json

import pytest
import yaml
from click.testing import CliRunner
from toolrl.cli import cli

ROW = {"prompt": [{"role": "user", "content": "What is 2+3?"}], "reward_model": {"ground_truth": "5"}}
BASE = {"model": {"source": "tiny-qwen3"}, "env": "arithmetic", "env_options": {"train_size": 4},
        "tools": {"entries": [{"class_name": "calculator"}]},
        "rollout": {"n": 2, "max_new_tokens": 4, "max_response_tokens": 8},
        "trainer": {"total_steps": 1, "progress": False, "plot": False}}


def invoke(*args):
    result = CliRunner().invoke(cli, [str(a) for a in args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def error_line(result):
    """The one error line (a case that gets as far as loading the model also has its progress bar)."""
    assert result.exit_code == 2, (result.exit_code, result.output[-2000:])
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr
    return errors[0]


def snapshot(root):
    """Every file's bytes and every directory under ``root``."""
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else None for p in sorted(root.rglob("*"))}


def write_earlier_run(out, *, checkpoint=True):
    """What a finished run leaves: config, metrics, traces, roles, a checkpoint, a file of the user's."""
    (out / "rollouts").mkdir(parents=True)
    (out / "config.json").write_text('{"earlier": "run"}\n')
    (out / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "reward_mean": 0.5, "reward_std": 0.0,
                                                            "tool_call_rate": 0.0}) + "\n" for s in (1, 2)))
    (out / "rollouts" / "step_00001.jsonl").write_text('{"trajectory_id": "t1-0"}\n')
    (out / "placement.json").write_text("{}\n")
    (out / "notes.txt").write_text("the user's own file\n")
    if checkpoint:
        import random

        import torch

        (out / "checkpoints" / "step_000002").mkdir(parents=True)
        (out / "checkpoints" / "step_000002" / "meta.json").write_text('{"step": 2}')
        torch.save({"python_rng": random.getstate(), "torch_rng": torch.get_rng_state()},
                   out / "checkpoints" / "step_000002" / "controller.pt")
    return snapshot(out)


@pytest.fixture
def project(tmp_path):
    """A valid config (``config.yaml``), data files for the cases and an earlier run in ``run/``."""
    (tmp_path / "train.jsonl").write_text(json.dumps(ROW) + "\n")
    (tmp_path / "bad.jsonl").write_text(json.dumps(ROW) + "\n{not json\n")
    (tmp_path / "empty.jsonl").write_text("\n")
    (tmp_path / "ghost-tool.jsonl").write_text(json.dumps({**ROW, "extra_info": {"tools_kwargs": {"ghost": {}}}}) + "\n")
    (tmp_path / "ghost-env.jsonl").write_text(json.dumps({**ROW, "extra_info": {"env": "ghost"}}) + "\n")
    trainer = {**BASE["trainer"], "output_dir": str(tmp_path / "run")}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({**BASE, "trainer": trainer}, sort_keys=False))
    return tmp_path


# (overrides, the error's fragment). Problems found only once tools are built or the engine is created
# come after the run directory's check, so without a flag the earlier run is named instead.
INVALID = {
    "unknown env": (["env=nope"], "env: unknown environment 'nope'"),
    "bad env option": (["env_options.train_size=0"], "env_options.train_size"),
    "unknown engine": (["engine.name=nope"], "engine.name: unknown rollout engine 'nope'"),
    "bad engine option": (["engine.options={bogus: 1}"], "engine.options.bogus: unknown key"),
    "unknown parser": (["rollout.parser=nope"], "rollout.parser: unknown tool parser 'nope'"),
    "bad parser option": (["rollout.parser_options={bogus: 1}"], "rollout.parser_options:"),
    "unknown reward": (["reward.functions=[{name: nosuch}]"], "reward.functions.0: unknown reward function 'nosuch'"),
    "bad reward option": (["reward.functions=[{name: gsm8k, options: {bogus: 1}}]"],
                          "reward.functions.0.options.bogus: unknown key"),
    "unknown tool": (["tools.entries=[{class_name: nope}]"], "unknown tool 'nope'"),
    "tool class not importable": (["tools.entries=[{class_name: no_such_module.Tool}]"], "cannot import"),
    "missing tools file": (["tools.config_path=missing-tools.yaml"], "missing-tools.yaml"),
    "unknown logger": (["trainer.loggers=[nope]"], "trainer.loggers: unknown logger 'nope'"),
    "missing data file": (["data.train_files=[missing.jsonl]"], "missing.jsonl does not exist"),
    "invalid data row": (["data.train_files=[bad.jsonl]"], "bad.jsonl:2: invalid JSON"),
    "empty data file": (["data.train_files=[empty.jsonl]"], "data.train_files: no rows"),
    "row names an unknown tool": (["data.train_files=[ghost-tool.jsonl]"], "tools_kwargs.ghost: unknown tool"),
    "row names an unknown env": (["data.train_files=[ghost-env.jsonl]"], "environment 'ghost' is not configured"),
    "missing recorded trajectories": (["data.trajectories=[missing.jsonl]"], "data.trajectories:"),
    "no test split to validate on": (["env=null", "env_options={}", "data.train_files=[train.jsonl]",
                                      "trainer.eval_every=1"], "data.test_files: no test split configured"),
    "unknown eval metric": (["trainer.eval_every=1", "eval.metric=nosuch"], "eval.metric: no reward term 'nosuch'"),
    "several ranks without Ray": (["trainer.world_size=3"], "trainer.world_size=3 needs Ray"),
    "cpu offload on CPU": (["trainer.cpu_offload=true"], "trainer.cpu_offload:"),
    "missing model": (["model.source=no-such-model-dir"], "model.source: 'no-such-model-dir'"),
}
AFTER_THE_CHECK = {"bad engine option", "row names an unknown tool"}


@pytest.mark.parametrize("case", list(INVALID))
def test_an_invalid_config_leaves_an_earlier_run_untouched(project, case):
    overrides, fragment = INVALID[case]
    before = write_earlier_run(project / "run")
    for flags in ([], ["--resume"], ["--overwrite"]):
        line = error_line(invoke("train", project / "config.yaml", *overrides, *flags))
        if flags == ["--resume"] and case in AFTER_THE_CHECK:
            # Its checkpoint holds no trainer shards: found from the files, before the engine's model loads.
            assert "the trainer's state cannot be read" in line, line
        elif flags or case not in AFTER_THE_CHECK:
            assert fragment in line, (flags, line)
        else:
            assert "holds an earlier run" in line, line
        assert snapshot(project / "run") == before, (flags, line)


@pytest.mark.parametrize(("command", "overrides"), [
    (["rollout"], ["env=nope"]),
    (["rollout"], ["reward.functions=[{name: nosuch}]"]),
    (["eval"], ["engine.name=nope"]),
    (["eval"], ["rollout.parser=nope"]),
], ids=["rollout-env", "rollout-reward", "eval-engine", "eval-parser"])
def test_rollout_and_eval_with_an_invalid_config_leave_the_directory_untouched(project, command, overrides):
    before = write_earlier_run(project / "run")
    output = ["--output", project / "run"] if command == ["eval"] else []
    for flags in ([], ["--overwrite"]):
        error_line(invoke(*command, project / "config.yaml", *output, *overrides, *flags))
        assert snapshot(project / "run") == before


def test_a_valid_run_refuses_an_earlier_run_and_names_the_flags(project):
    before = write_earlier_run(project / "run")
    run = project / "run"
    assert error_line(invoke("train", project / "config.yaml")) == (
        f"error: trainer.output_dir: {run} holds an earlier run (config.json, metrics.jsonl, placement.json, "
        "rollouts, checkpoints); pass --resume to continue it or --overwrite to replace it")
    assert error_line(invoke("rollout", project / "config.yaml")) == (
        f"error: trainer.output_dir: {run} holds an earlier run (config.json, metrics.jsonl, placement.json, "
        "rollouts, checkpoints); pass --overwrite to replace it")
    (run / "summary.json").write_text("{}")
    before = snapshot(run)
    assert error_line(invoke("eval", project / "config.yaml", "--output", run)).startswith(
        f"error: --output: {run} holds an earlier run (config.json")
    assert error_line(invoke("train", project / "config.yaml", "--resume", "--overwrite")) == (
        "error: --resume continues the run in the output directory and --overwrite replaces it: pass one of them")
    assert snapshot(run) == before


def test_resume_without_a_checkpoint_changes_nothing(project):
    before = write_earlier_run(project / "run", checkpoint=False)
    assert error_line(invoke("train", project / "config.yaml", "--resume")) == (
        f"error: --resume: no checkpoint in {project / 'run' / 'checkpoints'}")
    assert snapshot(project / "run") == before


def test_overwrite_replaces_the_earlier_run(project):
    """A real one-step run over an earlier one: the earlier metrics, traces and checkpoints go, the
    user's own file stays, and config.json is the new run's."""
    run = project / "run"
    write_earlier_run(run)
    result = invoke("train", project / "config.yaml", "--overwrite")
    assert result.exit_code == 0, result.output[-3000:]
    assert [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()] == [1]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["hf", "step_000001"]
    assert json.loads((run / "rollouts" / "step_00001.jsonl").read_text().splitlines()[0])["trajectory_id"] != "t1-0"
    assert json.loads((run / "config.json").read_text())["trainer"]["total_steps"] == 1
    assert (run / "notes.txt").read_text() == "the user's own file\n"
    assert not list(run.glob(".*.tmp"))


def test_config_json_is_written_atomically(tmp_path):
    """A write that fails half-way leaves the earlier run whole (config.json included, also when
    overwriting); one that succeeds leaves no temporary file behind."""
    from toolrl.config import ConfigError, load_config
    from toolrl.run_dir import RunDir

    config = load_config(None, [f"trainer.output_dir={tmp_path}"], data={"env": "arithmetic"})
    before = write_earlier_run(tmp_path)
    (tmp_path / ".config.json.tmp").mkdir()  # where the new content would be staged: cannot be opened
    before[".config.json.tmp"] = None
    for mode in ("resume", "overwrite"):
        with pytest.raises(ConfigError, match=rf"^trainer.output_dir: cannot write {tmp_path / '.config.json.tmp'}"):
            RunDir(tmp_path, mode).start(config)
        assert snapshot(tmp_path) == before
    (tmp_path / ".config.json.tmp").rmdir()
    RunDir(tmp_path, "overwrite").start(config)
    assert json.loads((tmp_path / "config.json").read_text())["env"] == "arithmetic"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "notes.txt"]


def test_one_run_resolves_its_parts_and_loads_each_split_once(tmp_path, monkeypatch):
    """Two steps with validation after each: the environment, engine class, parser and reward are looked
    up once, the training split is read once and the test split once (not again at every validation)."""
    import asyncio
    from collections import Counter

    from toolrl.config import load_config
    from toolrl.data import sources
    from toolrl.plugins import Plugins
    from toolrl.plugins.parts import registered_parts
    from toolrl.processes.controller import train_async

    parts, splits = Counter(), Counter()
    load_part, load = Plugins.load_part, sources.load_split

    def counted_part(self, kind, name):
        parts[kind] += 1
        return load_part(self, kind, name)

    def counted_load(env, split, *args, **kwargs):
        splits[split] += 1
        return load(env, split, *args, **kwargs)

    monkeypatch.setattr(Plugins, "load_part", counted_part)
    monkeypatch.setattr(sources, "load_split", counted_load)
    config = load_config(None, [f"trainer.output_dir={tmp_path / 'run'}", "trainer.total_steps=2",
                                "trainer.eval_every=1", "eval.num_samples=2"], data=BASE)
    asyncio.run(train_async(config))
    # The algorithm's parts: looked up by the controller's checks (the estimator twice: does it need a
    # critic, then the pair rules) and built once by the trainer rank (on Ray, another process); never per step.
    # The engine and the tools are looked up again where they are built (the registry hands back the part
    # it loaded); the logger once, when the run opens its loggers; the context policy once, with the route,
    # and the weight transport and the curriculum once, when the run is checked. What a weight sync sends and whether sessions
    # are asked for their turns' state keys are decided by the run check and carried to the roles
    # (toolrl.processes.resolve.run_plan): no role looks the engine or the estimator up again for them.
    # Every model family is built once, when the tokenizer's family is detected.
    assert parts.pop("model_families") == len(registered_parts("model_families"))
    assert parts == {"environments": 1, "rollout_engines": 2, "tool_parsers": 1, "reward_functions": 1, "tools": 2,
                     "loggers": 1, "advantage_estimators": 3, "policy_losses": 2, "context_policies": 1,
                     "weight_transports": 1, "curricula": 1}, parts
    assert splits == {"train": 1, "test": 1}
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["val/num_samples"] for r in rows] == [2, 2]


@pytest.mark.parametrize("steps", [1, 3, 40])
def test_the_reward_curve_has_integer_steps_a_labelled_band_a_title_and_its_legend_off_the_data(tmp_path, steps):
    import matplotlib.pyplot as plt
    from toolrl.run_dir import plot_rewards, reward_figure

    rows = [{"step": s, "reward_mean": s / steps, "reward_std": 0.1, "tool_call_rate": 1.0} for s in range(1, steps + 1)]
    fig = reward_figure(rows, "run: reward by training step")
    try:
        ax = fig.axes[0]
        fig.canvas.draw()
        ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
        assert ticks and all(float(t).is_integer() for t in ticks), ticks
        assert ax.get_title() == "run: reward by training step"
        legend = fig.legends[0]
        labels = [t.get_text() for t in legend.get_texts()]
        assert "reward ± 1 std (across trajectories)" in labels and "tool calls / trajectory" in labels
        renderer = fig.canvas.get_renderer()
        box, data = legend.get_window_extent(renderer), ax.get_window_extent(renderer)
        assert box.y1 < data.y0, "the legend overlaps the axes"
    finally:
        plt.close(fig)
    out = plot_rewards(rows, tmp_path / "reward_curve.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_step_whose_groups_all_had_equal_rewards_says_so():
    from toolrl.run_dir import rollout_metrics, step_line
    from toolrl.trajectory import Trajectory

    def trajs(rewards_by_group):
        return [Trajectory(trajectory_id=f"{g}-{k}", sample_index=g, group=g, prompt_ids=[1], reward=r)
                for g, rewards in enumerate(rewards_by_group) for k, r in enumerate(rewards)]

    def line(rewards_by_group):
        row = {"step": 3, **rollout_metrics(trajs(rewards_by_group), 1.0), "groups_generated": len(rewards_by_group),
               "loss": 0.0, "step_s": 1.0}
        return row["equal_reward_groups"], step_line(row)

    count, text = line([[0.0, 0.0], [1.0, 1.0]])
    assert count == 2 and text.endswith("loss 0.0000 1.0s (all 2 groups had equal rewards: zero advantage, nothing learned)")
    count, text = line([[0.0, 1.0], [1.0, 1.0]])
    assert count == 1 and text.endswith("loss 0.0000 1.0s")

