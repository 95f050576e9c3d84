"""``toolrl eval``, pass@k, an environment's own figures (``Environment.report``), validation during
training (``trainer.eval_every``) and training on recorded trajectories (``data.trajectories``), on the
tiny random Qwen3 of examples/tiny.yaml (or the scripted engine)."""

import itertools
import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner
from toolrl.cli import cli
from toolrl.processes.evaluate import pass_at_k

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "examples" / "tiny.yaml")
# Small generations: the tiny random model never answers well, the test is about the plumbing.
SMALL = ("rollout.max_new_tokens=8", "rollout.max_response_tokens=24", "trainer.progress=false", "trainer.plot=false")


def toolrl(*args):
    """The CLI in this process (no second torch import); click's result: exit_code, stdout, stderr."""
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def lines(path):
    return [json.loads(x) for x in Path(path).read_text().splitlines() if x.strip()]


@pytest.fixture
def test_split(tmp_path):
    """A held-out split of ten arithmetic problems (the data.test_files layout)."""
    path = tmp_path / "test.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"What is {a} + {a + 1}? Use the calculator.",
                                        "reward_model": {"ground_truth": str(2 * a + 1)}}) + "\n" for a in range(10)))
    return f"data.test_files=[{path}]"


@pytest.mark.parametrize("n", range(1, 7))
def test_pass_at_k_is_the_chance_that_k_of_the_n_samples_hold_a_success(n):
    for c, k in itertools.product(range(n + 1), range(1, n + 1)):
        outcomes = [True] * c + [False] * (n - c)
        subsets = list(itertools.combinations(outcomes, k))
        assert pass_at_k(n, c, k) == pytest.approx(sum(any(s) for s in subsets) / len(subsets), abs=1e-12)
    with pytest.raises(ValueError, match="pass@k needs"):
        pass_at_k(n, n + 1, 1)


def test_eval_writes_results_and_summary_then_compares(tmp_path):
    """A config of a model and an environment: its test split, its metric."""
    config = tmp_path / "eval.yaml"
    config.write_text("model: {source: tiny-qwen3}\nenv: arithmetic\n"
                      "rollout: {max_new_tokens: 8, max_response_tokens: 24}\n")
    out = tmp_path / "eval"
    result = toolrl("eval", config, "eval.num_samples=8", "--output", out)
    assert result.exit_code == 0, result.output[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_samples"] == 8 and summary["n"] == 1 and summary["num_trajectories"] == 8
    assert summary["metric"] == "gsm8k"  # the environment's
    assert math.isfinite(summary["reward_mean"]) and 0 <= summary["pass@1"] == summary["pass@k"] <= 1
    assert sum(summary["terminations"].values()) == 8
    rows = lines(out / "results.jsonl")
    assert sorted(r["problem"] for r in rows) == list(range(8))  # the first eight, in file order
    assert {r["k"] for r in rows} == {0}
    for r in rows:
        assert {"reward", "reward_terms", "success", "tool_calls", "termination", "response_text"} <= set(r)
        assert r["success"] == (r["reward_terms"]["gsm8k"] >= 1.0 and r["error"] is None)
    assert "pass@1" in result.stdout and "reward_mean" in result.stdout
    # Not a terminal: progress as plain lines (at each tenth of the problems that finish), the last at 8/8.
    progress = [line.split(",")[0] for line in result.stderr.splitlines() if line.startswith("eval: ")]
    assert progress and progress[-1] == "eval: 8/8 problems", result.stderr

    # A second evaluation with other numbers, side by side with the first as A and B; nothing runs.
    other = tmp_path / "other"
    other.mkdir()
    (other / "summary.json").write_text(json.dumps({**summary, "reward_mean": 0.625, "pass@1": 0.5}))
    flipped = [{**r, "success": r["problem"] in (0, 1)} for r in rows]  # B solves problems 0 and 1 only
    (other / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in flipped))
    compared = toolrl("eval", out, "--compare", other)
    assert compared.exit_code == 0, compared.output
    assert f"A: {out}" in compared.stdout and f"B: {other}" in compared.stdout and "B − A" in compared.stdout
    pass_row = next(line for line in compared.stdout.splitlines() if "pass@1" in line)
    assert pass_row.replace("│", " ").split()[1:] == [f"{summary['pass@1']:.4g}", "0.5", f"{0.5 - summary['pass@1']:.4g}"]
    solved_a = sorted(r["problem"] for r in rows if r["success"])
    only_a, only_b = [p for p in solved_a if p not in (0, 1)], [p for p in (0, 1) if p not in solved_a]
    listed = lambda ps: f"{len(ps)}" + (f" ({', '.join(map(str, ps))})" if ps else "")  # noqa: E731
    assert compared.stdout.splitlines()[-1] == (
        f"problems in both: 8; solved by A {len(solved_a)}, by B 2; only by A: {listed(only_a)}; "
        f"only by B: {listed(only_b)}")

    missing = toolrl("eval", out, "--compare", tmp_path)
    assert missing.exit_code == 2
    assert missing.stderr.strip() == f"error: {tmp_path / 'summary.json'}: no such file (a `toolrl eval --output` " \
                                     "directory has one)"


# Two environments for toolrl eval: "counted" gives its own figures (rows by the kind of their ground truth),
# "plain" none. Each test split: counted's two simple problems and one multiple, plain's two simple ones.
REPORTING = '''
from toolrl import hookimpl
from toolrl.environments import Environment

def problems(*kinds):
    return lambda options, split: [{"prompt": f"{k} {i}?", "reward_model": {"ground_truth": {"kind": k}}}
                                   for i, k in enumerate(kinds)]

def by_kind(rows):
    kinds = [r["ground_truth"]["kind"] for r in rows]
    return {"rows": len(rows), "simple": kinds.count("simple"), "multiple": kinds.count("multiple")}

COUNTED = Environment(name="counted", splits={"test": problems("simple", "simple", "multiple")}, report=by_kind)
PLAIN = Environment(name="plain", splits={"test": problems("simple", "simple")})

@hookimpl
def register_environments(register):
    register(COUNTED)
    register(PLAIN)
'''


@pytest.fixture
def reporting(tmp_path, monkeypatch):
    """The two environments above as the process-wide plugins; a scripted model (no weights) answers."""
    import toolrl.plugins
    from _dists import make_dist
    from toolrl.plugins import Plugins

    make_dist(tmp_path, "toolrl-plugin-reporting", "reporting", "reporting_envs", REPORTING)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(toolrl.plugins, "_plugins", Plugins(env={}))
    config = tmp_path / "eval.yaml"
    config.write_text("model: {source: tiny-qwen3}\nengine: {name: scripted, options: {script: [Done.]}}\n"
                      "trainer: {progress: false}\n")
    return config


def table(stdout, title):
    """The rows of the printed table titled ``title``: ``{figure: [cells]}``."""
    text = stdout.split(title, 1)[1]
    return {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
            for line in text.split("\n\n", 1)[0].splitlines() if line.count("│") >= 3}


def test_an_environments_own_figures_are_in_the_summary_and_tables(tmp_path, reporting):
    # One environment: every row is its, even a data file's that names no environment.
    (tmp_path / "mine.jsonl").write_text("".join(json.dumps({"prompt": f"{k}?", "reward_model": {"ground_truth": {
        "kind": k}}}) + "\n" for k in ("simple", "multiple", "multiple", "multiple")))
    out = tmp_path / "eval"
    result = toolrl("eval", reporting, "env=counted", f"data.test_files=[{tmp_path / 'mine.jsonl'}]", "--output", out)
    assert result.exit_code == 0, result.output[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["reports"] == {"counted": {"rows": 4, "simple": 1, "multiple": 3}}
    assert {r["env"] for r in lines(out / "results.jsonl")} == {None}
    assert table(result.stdout, "counted: its own figures") == {"rows": ["4"], "simple": ["1"], "multiple": ["3"]}
    assert "reward_mean" in result.stdout.split("counted: its own figures")[0]  # after the summary's own table

    # Compared: the environment's table with both columns and B − A.
    other = tmp_path / "other"
    other.mkdir()
    (other / "summary.json").write_text(json.dumps({**summary, "reports": {"counted": {"rows": 4, "simple": 3,
                                                                                       "multiple": 1}}}))
    compared = toolrl("eval", out, "--compare", other)
    assert compared.exit_code == 0, compared.output
    assert table(compared.stdout, "counted: its own figures") == {
        "rows": ["4", "4", "0"], "simple": ["1", "3", "2"], "multiple": ["3", "1", "-2"]}
    assert "B − A" in compared.stdout.split("counted: its own figures")[1]


def test_in_a_mixture_an_environment_reports_on_its_own_rows(tmp_path, reporting):
    out = tmp_path / "eval"
    result = toolrl("eval", reporting, "envs={counted: {}, plain: {}}", "--output", out)
    assert result.exit_code == 0, result.output[-3000:]
    assert sorted(r["env"] for r in lines(out / "results.jsonl")) == ["counted"] * 3 + ["plain"] * 2
    summary = json.loads((out / "summary.json").read_text())
    assert summary["reports"] == {"counted": {"rows": 3, "simple": 2, "multiple": 1}}  # plain gives none
    assert "counted: its own figures" in result.stdout and "plain: its own figures" not in result.stdout


def test_eval_with_several_samples_per_problem(tmp_path, test_split):
    out = tmp_path / "eval"
    result = toolrl("eval", TINY, test_split, *SMALL, "eval.num_samples=2", "eval.n=3", "eval.temperature=1.0",
                    "--output", out)
    assert result.exit_code == 0, result.output[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["num_samples"], summary["k"], summary["num_trajectories"]) == (2, 3, 6)
    rows = lines(out / "results.jsonl")
    assert sorted((r["problem"], r["k"]) for r in rows) == [(p, k) for p in range(2) for k in range(3)]
    by_problem = [[r["success"] for r in rows if r["problem"] == p] for p in range(2)]
    assert summary["pass@k"] == pytest.approx(sum(any(s) for s in by_problem) / 2)

    # Sampled, yet reproducible: the same config draws the same tokens again.
    again = toolrl("eval", TINY, test_split, *SMALL, "eval.num_samples=2", "eval.n=3", "eval.temperature=1.0",
                   "--output", tmp_path / "again")
    assert again.exit_code == 0, again.output[-3000:]
    assert [r["response_ids"] for r in lines(tmp_path / "again" / "results.jsonl")] == [r["response_ids"] for r in rows]


@pytest.mark.parametrize(("args", "message"), [
    (("eval.n=4",), "error: override eval.n=4: eval: n=4 with temperature 0: greedy samples are all the same; "
                    "set eval.temperature > 0 for pass@k, or eval.n=1"),
    (("eval.metric=exact",), "error: eval.metric: no reward term 'exact' (terms: gsm8k, tools, steps)"),
])
def test_eval_config_errors_are_one_line(tmp_path, test_split, args, message):
    result = toolrl("eval", TINY, test_split, *args, "--output", tmp_path / "out")
    assert result.exit_code == 2
    assert result.stderr.strip() == message


@pytest.mark.slow
def test_eval_every_logs_val_metrics(tmp_path):
    out = tmp_path / "run"
    result = toolrl("train", TINY, *SMALL, "trainer.total_steps=2", "trainer.eval_every=2",
                    "eval.num_samples=3", "rollout.n=2", f"trainer.output_dir={out}")
    assert result.exit_code == 0, result.output[-3000:]
    first, second = lines(out / "metrics.jsonl")
    assert not any(k.startswith("val/") for k in first)
    assert second["val/num_samples"] == 3 and math.isfinite(second["val/reward_mean"])
    assert {"val/pass@1", "val/pass@k", "val/tool_calls_per_trajectory", "val/wall_s"} <= set(second)
    assert len(lines(out / "eval" / "step_00002.jsonl")) == 3


@pytest.mark.slow
def test_train_on_recorded_trajectories(tmp_path):
    """A run's own traces are recorded trajectories: one step on them trains (groups from their
    ``group`` field, rewards from their ``reward``); rows without a usable reward are one-line errors."""
    source = tmp_path / "source"
    made = toolrl("train", TINY, *SMALL, "trainer.total_steps=1", "rollout.n=2",
                  "rollout.temperature=1.0", f"trainer.output_dir={source}")
    assert made.exit_code == 0, made.output[-3000:]
    rows = lines(source / "rollouts" / "step_00001.jsonl")
    for k, row in enumerate(rows):  # distinct rewards within each group, so the advantages are not all 0
        row["reward"] = float(k % 2)
    recorded = tmp_path / "recorded.jsonl"
    recorded.write_text("".join(json.dumps(r) + "\n" for r in rows))

    out = tmp_path / "run"
    result = toolrl("train", TINY, *SMALL, "trainer.total_steps=1", f"data.trajectories={recorded}",
                    f"trainer.output_dir={out}")
    assert result.exit_code == 0, result.output[-3000:]
    (metrics,) = lines(out / "metrics.jsonl")
    assert metrics["step"] == 1 and math.isfinite(metrics["grad_norm"]) and metrics["grad_norm"] > 0
    trained = lines(out / "rollouts" / "step_00001.jsonl")
    assert sorted(t["response_ids"] for t in trained) == sorted(r["response_ids"] for r in rows)
    assert sorted(t["reward"] for t in trained) == sorted(r["reward"] for r in rows)

    # No reward and no reward function to score it: the row's line is named.
    bare = [{k: v for k, v in r.items() if k not in ("reward", "group")} for r in rows]
    recorded.write_text("".join(json.dumps(r) + "\n" for r in bare))
    result = toolrl("train", TINY, "reward.functions=[]", f"data.trajectories={recorded}", f"trainer.output_dir={out}")
    assert result.exit_code == 2
    assert result.stderr.strip() == f"error: {recorded}:1: reward: the row has none, and no reward functions " \
                                    "(reward.functions or the environment's) score it"
    bare[1]["logprobs"] = bare[1]["logprobs"][:-1]
    recorded.write_text("".join(json.dumps(r) + "\n" for r in bare))
    result = toolrl("train", TINY, f"data.trajectories={recorded}", f"trainer.output_dir={out}")
    assert result.exit_code == 2
    assert result.stderr.strip().startswith(f"error: {recorded}:2: response_ids, response_mask and logprobs differ")

    # What the trainer would fail on (an empty prompt, a token id past the embedding) or train silently wrong
    # (a mask of 2, a positive log-probability) is refused with the row's line, before the model loads.
    row = rows[0]
    for change, message in (
            ({"prompt_ids": []}, "prompt_ids: empty (a trajectory starts from its prompt)"),
            ({"response_ids": [151936] + row["response_ids"][1:]},
             "response_ids: token id 151936 is outside the model's vocabulary (0 to 151935: vocab_size in its "
             "config.json)"),
            ({"prompt_ids": [-1] + row["prompt_ids"][1:]},
             "prompt_ids: token id -1 is outside the model's vocabulary (0 to 151935"),
            ({"response_mask": [2] + row["response_mask"][1:]},
             "response_mask: each value is 1 (a model token, trained) or 0, got 2"),
            ({"logprobs": [0.5] + row["logprobs"][1:]}, "logprobs: a log-probability is at most 0, got 0.5")):
        recorded.write_text(json.dumps(row) + "\n" + json.dumps({**row, **change}) + "\n")
        result = toolrl("train", TINY, f"data.trajectories={recorded}", f"trainer.output_dir={out}", "--check")
        assert result.exit_code == 2 and result.stderr.strip().startswith(f"error: {recorded}:2: {message}"), \
            result.stderr


def test_validation_on_ray_samples_as_training_does():
    from toolrl.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"trainer.eval_every: rollout workers on Ray sample at rollout.temperature=1.0; "
                                          "set eval.temperature to the same value"):
        load_config(TINY, ["trainer.eval_every=1", "ray.address=local"])
    assert load_config(TINY, ["trainer.eval_every=1", "ray.address=local", "eval.temperature=1.0"]).eval.temperature == 1


def test_problem_results_tally_each_problems_samples_successes_and_finite_rewards():
    from toolrl.run_dir import problem_results

    got = problem_results([(3, True, 1.0), (1, False, float("nan")), (3, False, 0.5), (1, "yes", None),
                           (3, True, True)])
    assert list(got) == [3, 1]  # in the order problems first appear
    three, one = got[3], got[1]
    assert (three.n, three.successes, three.solved, three.reward) == (3, 2, True, 0.75)  # a bool is no reward
    assert three.success_rate == 2 / 3
    assert (one.n, one.successes, one.solved, one.reward, one.success_rate) == (2, 0, False, None, 0.0)
