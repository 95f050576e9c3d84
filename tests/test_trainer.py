import json
import os
from pathlib import Path
from typing import Any, ClassVar

import pytest
from _dists import run_toolrl
from toolrl.config import ConfigError, load_config
from toolrl.plugins import get_plugins
from toolrl.plugins.registry import Part

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "examples" / "tiny.yaml")
FAST = {"OMP_NUM_THREADS": "1"}


def lines(path):
    return [json.loads(x) for x in Path(path).read_text().splitlines() if x.strip()]


@pytest.mark.slow
def test_train_writes_metrics_traces_checkpoints_and_the_curve_and_exports(tmp_path):
    """What a default run leaves in its directory, and `toolrl export` of it: a model that loads with
    from_pretrained and AutoTokenizer and holds the latest checkpoint's weights. (Resuming:
    test_resume_restores_identical_state continues a finished run, test_algorithm_resume a killed one,
    both through the same --resume.)"""
    import torch
    from click.testing import CliRunner
    from toolrl.cli import cli
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # `toolrl train` and `toolrl export` in this process (click's runner): the same commands, without three
    # interpreters' starts (test_cli_interrupt and the resume tests run the command as a process of its own).
    out = tmp_path / "run"
    first = CliRunner().invoke(cli, ["train", TINY, "trainer.total_steps=2", f"trainer.output_dir={out}"])
    assert first.exit_code == 0 and first.exception is None, (first.exception, first.stderr[-2000:])
    metrics = lines(out / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    for key in ("reward_mean", "reward_std", "tool_call_count", "tool_success_count", "tool_latency_s",
                "response_length", "loss", "grad_norm", "lp_mismatch", "tokens_per_s", "prefill_tokens_saved"):
        assert key in metrics[0], key
    assert metrics[0]["lp_mismatch"] < 1e-3  # engine and trainer agree (fp32, same weights)
    traces = lines(out / "rollouts" / "step_00001.jsonl")
    assert len(traces) == 8
    t = traces[0]
    assert len(t["response_ids"]) == len(t["response_mask"]) == len(t["logprobs"])
    assert {"response_text", "prompt_text", "reward", "termination", "tool_results"} <= set(t)
    assert sorted(p.name for p in (out / "checkpoints").glob("step_*")) == ["step_000001", "step_000002"]
    assert (out / "checkpoints" / "hf" / "config.json").exists()  # what export needs besides a checkpoint
    assert (out / "reward_curve.png").stat().st_size > 1000

    bad = CliRunner().invoke(cli, ["export", str(out), str(tmp_path / "hf"), "--step", "7"])
    assert bad.exit_code == 2 and isinstance(bad.exception, SystemExit), (bad.exception, bad.stderr[-2000:])
    assert "no checkpoint for step 7 (have: 1, 2)" in bad.stderr and "Traceback" not in bad.stderr
    res = CliRunner().invoke(cli, ["export", str(out), str(tmp_path / "hf")])
    assert res.exit_code == 0 and res.exception is None, (res.exception, res.stderr[-2000:])
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert tokenizer("2+3")["input_ids"]
    want = checkpoint_state(out / "checkpoints/step_000002", tmp_path / "ckpt.pt")["model"]
    got = model.state_dict()
    assert set(want) == set(got)
    assert all(torch.equal(got[k], want[k]) for k in want)


@pytest.mark.slow
def test_resume_restores_identical_state(tmp_path):
    """Two steps straight through equal one step, stop, and resume: same weights, same metrics."""
    import asyncio

    import torch
    from toolrl.processes.controller import train_async

    def config(out, steps):
        return load_config(TINY, [f"trainer.output_dir={out}", f"trainer.total_steps={steps}", "trainer.plot=false",
                                  "trainer.progress=false", "env_options.train_size=8", "rollout.n=2",
                                  "rollout.max_new_tokens=8", "rollout.max_response_tokens=8"])

    asyncio.run(train_async(config(tmp_path / "a", 2)))
    asyncio.run(train_async(config(tmp_path / "b", 1)))
    asyncio.run(train_async(config(tmp_path / "b", 2), resume=True))
    wa = checkpoint_state(tmp_path / "a/checkpoints/step_000002", tmp_path / "a.pt")
    wb = checkpoint_state(tmp_path / "b/checkpoints/step_000002", tmp_path / "b.pt")
    for part in ("model", "optim"):
        assert all(torch.equal(wa[part][k], wb[part][k]) for k in wa[part] if isinstance(wa[part][k], torch.Tensor))
    timing = {"tokens_per_s", "tool_latency_s", "trainer_peak_mb", "weight_sync_peak_mb"}  # measured, not computed: differ run to run
    strip = [{k: v for k, v in m.items() if not k.endswith("_s") and k not in timing}
             for m in lines(tmp_path / "a/metrics.jsonl")]
    assert strip == [{k: v for k, v in m.items() if not k.endswith("_s") and k not in timing}
                     for m in lines(tmp_path / "b/metrics.jsonl")]


@pytest.mark.slow
def test_a_failed_step_is_recorded_and_resume_continues(tmp_path):
    """A step that fails half-way (here: its checkpoint cannot be staged, a real OSError) leaves its
    metrics and traces plus a line saying what failed; --resume then redoes it."""
    import asyncio

    from toolrl.processes.controller import train_async

    out = tmp_path / "run"
    blocker = out / "checkpoints" / ".tmp_step_000002"
    blocker.parent.mkdir(parents=True)
    blocker.write_text("a file where the staging directory goes")
    cfg = load_config(TINY, [f"trainer.output_dir={out}", "trainer.total_steps=2", "trainer.plot=false",
                             "trainer.progress=false", "env_options.train_size=4", "rollout.n=2",
                             "rollout.max_new_tokens=4", "rollout.max_response_tokens=4", "tools.entries=[]"])
    with pytest.raises(FileExistsError):
        asyncio.run(train_async(cfg))
    rows = lines(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 2]
    assert rows[2]["failed"].startswith("FileExistsError") and rows[2]["reward_mean"] == rows[1]["reward_mean"]
    assert len(lines(out / "rollouts" / "step_00002.jsonl")) == 4
    blocker.unlink()
    asyncio.run(train_async(cfg, resume=True))
    rows = lines(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2] and "failed" not in rows[1]


def checkpoint_state(path, scratch):
    """A sharded checkpoint read back whole, without a process group."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(str(path), str(scratch))
    return torch.load(scratch, weights_only=False)


# long: test_environments' test_a_config_of_only_model_and_env_runs_toolrl_rollout runs `toolrl rollout` by default
# and asserts the same (its traces, one metrics row, no checkpoint), on the arithmetic environment's config.
@pytest.mark.slow
@pytest.mark.long
def test_rollout_command_evaluates_without_training(tmp_path):
    out = tmp_path / "eval"
    res = run_toolrl("rollout", TINY, "trainer.total_steps=1", f"trainer.output_dir={out}", env=FAST, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    assert len(lines(out / "metrics.jsonl")) == 1 and (out / "rollouts" / "step_00001.jsonl").exists()
    assert not (out / "checkpoints").exists()


@pytest.mark.parametrize("override, message", [
    ("trainer.total_stepz=3", "trainer.total_stepz: unknown key"),
    ("trainer.total_steps=-1", "trainer.total_steps: Input should be greater than 0"),
    ("engine.name=nope", "unknown rollout engine 'nope'"),
    ("rollout.parser=nope", "unknown tool parser 'nope'"),
    ("reward.functions=[{name: nope}]", "unknown reward function 'nope'"),
    ("tools.entries=[{class_name: nope}]", "unknown tool 'nope'"),
    ("env=ghost", "env: unknown environment 'ghost' (available: arithmetic"),
    ("env_options.digits=0", "env_options.digits: Input should be greater than or equal to 1"),
    ("trainer.total_steps", "must look like dotted.key=value"),
    ("algorithm.loss=nope", "algorithm.loss: unknown policy loss 'nope'"),
    ("algorithm.loss_options.max_weight=2", "algorithm.loss_options.max_weight: unknown key"),
])
def test_bad_config_names_the_field_without_traceback(tmp_path, override, message):
    res = run_toolrl("train", TINY, override, f"trainer.output_dir={tmp_path}", env=FAST, timeout=300)
    assert res.returncode == 2
    assert message in res.stderr and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_config_from_mapping_and_errors():
    cfg = load_config(None, ["rollout.n=8"], data={"env": "arithmetic"})
    assert cfg.rollout.n == 8 and cfg.engine.name == "transformers"
    with pytest.raises(ConfigError, match=r"set env \(toolrl env list\), envs or data.train_files"):
        load_config(None, data={"data": {}})
    with pytest.raises(ConfigError, match="set env or envs, not both"):
        load_config(None, data={"env": "arithmetic", "envs": {"arithmetic": {}}})


def test_trace_rows_record_the_trainers_logprobs_of_the_weights_the_step_started_from(tmp_path):
    """Each trained trajectory's row holds the trainer's log-prob of every response token under the
    step's starting weights (null at untrained tokens): a forward of the initial model over the row's
    tokens gives them, and they agree with the engine's as closely as lp_mismatch says. Two
    mini-batches: the second trains after the first's update, so a log-prob kept from the training
    forward instead of the proximal one would not match the initial model."""
    import asyncio

    import torch
    from toolrl.model_sources import load_model, model_path
    from toolrl.processes.controller import train_async

    registry = get_plugins().registry
    if not registry.has("reward_functions", "aligned_tokens"):
        registry.add(Part("reward_functions", "aligned_tokens", "tests", AlignedTokens))
    config = load_config(TINY, [f"trainer.output_dir={tmp_path}", "trainer.total_steps=1", "trainer.plot=false",
                                "trainer.progress=false", "env_options.train_size=4", "rollout.n=2",
                                "rollout.max_new_tokens=12", "rollout.max_response_tokens=12", "tools.entries=[]",
                                "reward.functions=[{name: aligned_tokens}]", "algorithm.mini_batches=2",
                                "optim.lr=1e-2"])
    model = load_model(model_path(config))
    AlignedTokens.good = model.get_input_embeddings().weight[:, 0] > 0  # rewards that differ: a gradient
    asyncio.run(train_async(config))
    rows = lines(tmp_path / "rollouts" / "step_00001.jsonl")
    (metrics,) = lines(tmp_path / "metrics.jsonl")
    assert len(rows) == 4 and metrics["grad_norm"] > 0
    worst_engine = 0.0
    for row in rows:
        got, mask = row["trainer_logprobs"], row["response_mask"]
        assert len(got) == len(row["response_ids"]) == len(row["logprobs"])
        assert [v is not None for v in got] == [bool(m) for m in mask] and any(mask)
        ids = torch.tensor([row["prompt_ids"] + row["response_ids"]])
        with torch.no_grad():
            logits = model(ids).logits[0].float()
        p = len(row["prompt_ids"])
        # Response token j is predicted at position p + j - 1 (tiny.yaml samples at temperature 1).
        want = torch.log_softmax(logits[p - 1:-1], -1).gather(1, ids[0, p:, None])[:, 0]
        trained = torch.tensor(mask, dtype=torch.bool)
        recorded = torch.tensor([0.0 if v is None else v for v in got])
        assert torch.allclose(recorded[trained], want[trained], atol=1e-5), (recorded, want)
        engine = torch.tensor(row["logprobs"])
        worst_engine = max(worst_engine, float((recorded - engine)[trained].abs().max()))
    assert worst_engine < 1e-3  # fp32 engine and trainer on the same weights (measured: 2e-6)
    # lp_mismatch compares the training forwards, the second mini-batch's after an update (lr 1e-2):
    # far from the engine (measured: 0.08), where the recorded proximal log-probs are not.
    assert metrics["lp_mismatch"] > 1e-3


class AlignedTokens:
    """A dense reward a tiny random model can learn: the share of generated tokens whose (initial)
    embedding points to the positive side of a fixed direction. That set is half the vocabulary and
    linearly separable in the model's own embedding space, so GRPO can move all of it at once."""

    name = "aligned_tokens"
    good: ClassVar[Any] = None  # bool tensor over the vocabulary, set by the fixture

    def __call__(self, response, ground_truth, **info):
        ids = info["response_ids"]
        return sum(bool(self.good[t]) for t in ids) / max(len(ids), 1)


@pytest.fixture(scope="module")
def peaked_tiny_model(tmp_path_factory, tiny_qwen3_path):
    """The tiny random Qwen3 with its (tied) embeddings scaled up, so its next-token distributions
    are peaked like a trained model's instead of near-uniform over 152k tokens: sampled responses
    then differ in reward and GRPO has a signal to follow from step one."""
    import shutil

    import torch
    from toolrl.model_sources import load_model

    out = tmp_path_factory.mktemp("peaked")
    model = load_model(tiny_qwen3_path)
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(6.0)
    AlignedTokens.good = model.get_input_embeddings().weight[:, 0] > 0
    model.save_pretrained(out)
    for f in Path(tiny_qwen3_path).iterdir():
        if f.name.startswith("tokenizer") or f.name.endswith(".jinja") or f.name == "special_tokens_map.json":
            shutil.copy2(f, out / f.name)
    return out


# The same run (model, prompts, seeds, budget) is the synchronous half of
# test_learning_async.test_async_reaches_the_sync_reward_in_the_same_samples, which asserts this gain too.
@pytest.mark.slow
@pytest.mark.long
def test_grpo_learns_a_learnable_task(tmp_path, peaked_tiny_model):
    import asyncio

    from toolrl.processes.controller import train_async

    registry = get_plugins().registry
    if not registry.has("reward_functions", "aligned_tokens"):
        registry.add(Part("reward_functions", "aligned_tokens", "tests", AlignedTokens))
    cfg = load_config(TINY, [
        f"model.source={peaked_tiny_model}",
        f"trainer.output_dir={tmp_path}", "trainer.total_steps=16", "trainer.plot=false", "trainer.progress=false",
        "trainer.save_every=100", "rollout.n=8", "rollout.max_new_tokens=12", "rollout.max_response_tokens=12",
        "rollout.temperature=1.0", "reward.functions=[{name: aligned_tokens}]", "optim.lr=5.0e-3",
        "optim.micro_batch_size=16", "tools.entries=[]",
    ])
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    asyncio.run(train_async(cfg))
    rewards = [m["reward_mean"] for m in lines(tmp_path / "metrics.jsonl")]
    first, last = sum(rewards[:2]) / 2, sum(rewards[-4:]) / 4
    assert last > first + 0.1, rewards  # measured: 0.55 -> 0.71
