"""Asynchronous training in one process: staleness bounds, policy versions, the synchronous case,
dynamic sampling and resuming a streaming run after kill -9."""

import asyncio
import json
import os
import random
import re
import sys
from pathlib import Path

import pytest
from _processes import kill_after_checkpoint, toolrl_in_process
from toolrl.config import load_config
from toolrl.plugins import get_plugins
from toolrl.plugins.registry import Part

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "examples" / "tiny.yaml")
os.environ.setdefault("OMP_NUM_THREADS", "1")


def lines(path):
    return [json.loads(x) for x in Path(path).read_text().splitlines() if x.strip()]


def small(out, *overrides):
    return load_config(TINY, [f"trainer.output_dir={out}", "trainer.plot=false", "trainer.progress=false",
                              "env_options.train_size=16", "rollout.n=2", "rollout.max_new_tokens=8",
                              "rollout.max_response_tokens=16", *overrides])


def staleness(out, steps):
    """Every trace's ``(step - 1) - policy_version`` (first generation's version), by step."""
    ages = {}
    for s in range(1, steps + 1):
        traces = lines(Path(out) / "rollouts" / f"step_{s:05d}.jsonl")
        versions = [t["policy_version"] for t in traces]
        assert all(v is not None for v in versions)
        ages[s] = [s - 1 - (v[0] if isinstance(v, list) else v) for v in versions]
    return ages


def old_batch_for_step(samples, step, batch_size, seed, shuffle):
    """The prompts of a step as the synchronous loop chose them before streaming existed."""
    out = []
    for k in range(step * batch_size, (step + 1) * batch_size):
        epoch, pos = divmod(k, len(samples))
        order = list(range(len(samples)))
        if shuffle:
            random.Random(seed * 1_000_003 + epoch).shuffle(order)
        out.append(samples[order[pos]])
    return out


@pytest.mark.slow
def test_staleness_zero_is_the_synchronous_run(tmp_path):
    """max_staleness=0 trains what the synchronous loop trained (same rewards, losses, gradient norms,
    final weights), and so does the group stream held to staleness 0: its prompts and seeds per
    group are the synchronous loop's."""
    import torch
    from toolrl.data.batches import GroupStream
    from toolrl.data.draws import open_draws
    from toolrl.data.sources import load_samples
    from toolrl.processes.controller import train_async
    from toolrl.processes.start import start_processes

    steps = 2
    cfg = small(tmp_path / "run", f"trainer.total_steps={steps}")
    asyncio.run(train_async(cfg))
    got = [{k: m[k] for k in ("reward_mean", "loss", "grad_norm")} for m in lines(tmp_path / "run/metrics.jsonl")]

    async def reference(stream: bool):
        samples = load_samples(cfg)
        processes = await start_processes(cfg)
        groups = GroupStream(processes.rollouts, open_draws(cfg, samples), cfg, 0, 0) if stream else None
        rows = []
        try:
            for step in range(steps):
                if groups is not None:
                    trajs = (await groups.next(step)).trajectories
                else:  # the loop as it was: a step's batch, one rollout call, its seed
                    prompts = old_batch_for_step(samples, step, cfg.data.batch_size, cfg.trainer.seed,
                                                 cfg.data.shuffle)
                    trajs = await processes.rollouts.run(prompts, cfg.rollout.n, seed=cfg.rollout.seed + 7_777 * step,
                                                     id_prefix=f"t{step + 1}-")
                train = await processes.trainer.step(trajs, step + 1)
                await processes.sync_weights(step + 1)
                if groups is not None:
                    groups.set_version(step + 1)
                rows.append({"reward_mean": sum(t.reward for t in trajs) / len(trajs), "loss": train["loss"],
                             "grad_norm": train["grad_norm"]})
            return rows, {k: v.detach().clone() for k, v in processes.trainer.rank.model.state_dict().items()}
        finally:
            if groups is not None:
                await groups.close()
            await processes.close()

    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(str(tmp_path / f"run/checkpoints/step_{steps:06d}"), str(tmp_path / "w.pt"))
    trained = torch.load(tmp_path / "w.pt", weights_only=False)["model"]
    for stream in (False, True):
        rows, weights = asyncio.run(reference(stream))
        assert rows == got, (stream, rows, got)
        assert all(torch.equal(trained[k], weights[k]) for k in trained), stream
    m = lines(tmp_path / "run/metrics.jsonl")
    assert [r["groups"] for r in m] == [[0, 1], [2, 3]]
    assert all(r["staleness_max"] == 0 for r in m)


@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.slow
def test_streaming_staleness_stays_within_the_bound(tmp_path, k):
    from toolrl.processes.controller import train_async

    steps = 4
    asyncio.run(train_async(small(tmp_path, f"trainer.total_steps={steps}", f"trainer.max_staleness={k}",
                                  "trainer.save_every=100")))
    ages = staleness(tmp_path, steps)
    flat = [a for s in ages.values() for a in s]
    assert min(flat) >= 0 and max(flat) <= k, ages
    assert 1 in flat, ages  # groups of step 2 generated while step 1 trained: the overlap happened
    metrics = lines(tmp_path / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(1, steps + 1))
    assert [g for m in metrics for g in m["groups"]] == list(range(steps * 2))  # data order kept
    for m in metrics:
        assert m["staleness_max"] <= k and sum(m["staleness_hist"].values()) == 4
        assert m["staleness_max"] == max(ages[m["step"]])
        assert all(t["group"] in m["groups"] for t in lines(tmp_path / "rollouts" / f"step_{m['step']:05d}.jsonl"))


def test_what_one_step_off_refuses_is_one_line():
    from toolrl.config import ConfigError

    for overrides, message in [(["trainer.max_staleness=2"], "set trainer.max_staleness=1 (not 2)"),
                               ([], "set trainer.max_staleness=1 (not 0)"),
                               (["trainer.max_staleness=1", "algorithm.skip_zero_variance_groups=true"],
                                "algorithm.skip_zero_variance_groups needs async_schedule=stream")]:
        with pytest.raises(ConfigError, match=r"trainer.async_schedule=one_step_off .*" + re.escape(message)) as err:
            load_config(TINY, ["trainer.async_schedule=one_step_off", *overrides])
        assert "\n" not in str(err.value)


@pytest.mark.slow
def test_one_step_off_trains_each_step_on_the_batch_the_weights_before_it_generated(tmp_path):
    """async_schedule=one_step_off: step s trains the synchronous loop's batch s (same prompts and seeds)
    generated on the weights step s-1 started from, while step s-1 trained. Its figures and final weights
    are those of the same schedule run one call after another, with nothing overlapping."""
    import torch
    from toolrl.data.batches import batch_for_step
    from toolrl.data.sources import load_samples
    from toolrl.processes.controller import train_async
    from toolrl.processes.start import start_processes
    from toolrl.seeds import step_seed

    steps = 3
    cfg = small(tmp_path / "run", f"trainer.total_steps={steps}", "trainer.max_staleness=1",
                "trainer.async_schedule=one_step_off")
    asyncio.run(train_async(cfg))
    m = lines(tmp_path / "run/metrics.jsonl")
    got = [{k: r[k] for k in ("reward_mean", "loss", "grad_norm")} for r in m]

    async def one_after_another():
        samples = load_samples(cfg)
        processes = await start_processes(cfg)

        async def generate(step):
            prompts = batch_for_step(samples, step, cfg.data.batch_size, cfg.trainer.seed, cfg.data.shuffle)
            return await processes.rollouts.run(prompts, cfg.rollout.n, seed=step_seed(cfg.rollout.seed, step),
                                            id_prefix=f"t{step + 1}-")

        rows = []
        try:
            batch = await generate(0)
            for step in range(steps):
                ahead = await generate(step + 1) if step + 1 < steps else None  # on the weights step `step` starts from
                train = await processes.trainer.step(batch, step + 1)
                await processes.sync_weights(step + 1)
                rows.append({"reward_mean": sum(t.reward for t in batch) / len(batch), "loss": train["loss"],
                             "grad_norm": train["grad_norm"]})
                batch = ahead
            return rows, {k: v.detach().clone() for k, v in processes.trainer.rank.model.state_dict().items()}
        finally:
            await processes.close()

    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(str(tmp_path / f"run/checkpoints/step_{steps:06d}"), str(tmp_path / "w.pt"))
    trained = torch.load(tmp_path / "w.pt", weights_only=False)["model"]
    rows, weights = asyncio.run(one_after_another())
    assert rows == got and all(torch.equal(trained[k], weights[k]) for k in trained)
    assert {s: set(a) for s, a in staleness(tmp_path / "run", steps).items()} == {1: {0}, 2: {1}, 3: {1}}
    assert [r["groups"] for r in m] == [[0, 1], [2, 3], [4, 5]]


@pytest.mark.slow
def test_a_killed_one_step_off_run_resumes_to_the_uninterrupted_figures(tmp_path, monkeypatch, toolrl_reload_plugins):
    """The checkpoint keeps the batch generated ahead (on weights no checkpoint holds), so a run killed
    after its second checkpoint and resumed gives every step the figures of the run left alone."""
    from _processes import straight_and_resumed

    def args(out):
        return ["train", TINY, "trainer.total_steps=4", f"trainer.output_dir={out}", "trainer.plot=false",
                "trainer.progress=false", "env_options.train_size=8", "rollout.n=2", "rollout.max_new_tokens=8",
                "rollout.max_response_tokens=16", "reward.functions=[{name: even_tokens}]",
                "trainer.max_staleness=1", "trainer.async_schedule=one_step_off"]

    want, got = straight_and_resumed(args, tmp_path, 4, monkeypatch, toolrl_reload_plugins)
    assert got == want
    assert [r["staleness_max"] for r in want] == [0, 1, 1, 1]
    ckpts = tmp_path / "straight" / "checkpoints"
    assert (ckpts / "step_000003" / "ahead.pt").is_file() and not (ckpts / "step_000004" / "ahead.pt").exists()


class EvenIndexParity:
    """Reward 1 when the first generated token id is even, for samples with an even index; samples
    with an odd index always score 0 (their groups have zero variance)."""

    def __call__(self, response, ground_truth, **info):
        ids = info["response_ids"]
        return 0.0 if info["sample"].index % 2 or not ids else float(ids[0] % 2 == 0)


@pytest.mark.parametrize("k", [0, 1])
@pytest.mark.slow
def test_dynamic_sampling_trains_only_groups_with_variance(tmp_path, k):
    from toolrl.processes.controller import train_async

    registry = get_plugins().registry
    if not registry.has("reward_functions", "even_index_parity"):
        registry.add(Part("reward_functions", "even_index_parity", "tests", EvenIndexParity))
    steps = 3
    asyncio.run(train_async(small(tmp_path, f"trainer.total_steps={steps}", f"trainer.max_staleness={k}",
                                  "algorithm.skip_zero_variance_groups=true", "rollout.n=4",
                                  "reward.functions=[{name: even_index_parity}]", "tools.entries=[]")))
    metrics = lines(tmp_path / "metrics.jsonl")
    consumed = []
    for m in metrics:
        traces = lines(tmp_path / "rollouts" / f"step_{m['step']:05d}.jsonl")
        rewards = {}
        for t in traces:
            rewards.setdefault(t["group"], set()).add(t["reward"])
        assert all(len(rewards[g]) > 1 for g in m["groups"])
        assert all(len(rewards[g]) == 1 for g in m["skipped_groups"])
        assert m["groups_generated"] == len(m["groups"]) + m["groups_skipped"] == len(rewards)
        assert len(m["groups"]) == 2 or m["groups_generated"] == 8  # a full batch, or the cap
        consumed += sorted(m["groups"] + m["skipped_groups"])
        assert m["staleness_max"] <= k
    assert consumed == list(range(len(consumed)))  # every group once, in order
    assert sum(m["groups_skipped"] for m in metrics) > 0


def test_weights_change_between_decode_steps(tiny_qwen3_path, qwen3_tokenizer):
    """An update inside ``updating_weights`` lands between two decode steps of a running generation:
    tokens before it come from the old weights, every token after from the new (here: an LM head of
    zeros, so exactly uniform), and the call reports the version its first token was sampled with."""
    import math
    import threading

    import torch
    from toolrl.engines import ModelSource, SamplingParams
    from toolrl.engines.transformers import TransformersEngine

    engine = TransformersEngine.create(ModelSource(path=tiny_qwen3_path, tokenizer=qwen3_tokenizer),
                                       {"device": "cpu", "dtype": "float32"})
    weight = engine.model.state_dict()["lm_head.weight"]
    engine.update_weights({"lm_head.weight": weight * 50})  # peaked: far from uniform before the update
    head = {"lm_head.weight": torch.zeros_like(weight)}
    uniform = -math.log(engine.model.config.vocab_size)

    async def scenario():
        params = SamplingParams(max_new_tokens=64, seed=1)
        running = asyncio.ensure_future(engine.generate([1, 2, 3], params, session_id="a"))
        while engine.stats.generated_tokens < 8:
            await asyncio.sleep(0.001)

        def update():
            with engine.updating_weights(1):
                engine.update_weights(head)

        thread = threading.Thread(target=update)
        thread.start()
        first = (await running)[0]
        thread.join()
        after = (await engine.generate([4, 5], SamplingParams(max_new_tokens=4, seed=2)))[0]
        await engine.close()
        return first, after

    first, after = asyncio.run(scenario())
    assert first.weight_version == 0 and after.weight_version == 1 and engine.weight_version == 1
    switch = next(i for i, lp in enumerate(first.logprobs) if abs(lp - uniform) < 1e-4)
    assert 8 <= switch < 64
    assert all(abs(lp - uniform) < 1e-4 for lp in first.logprobs[switch:])
    assert all(abs(lp - uniform) > 1e-3 for lp in first.logprobs[:switch])


@pytest.mark.slow
def test_streaming_run_resumes_after_kill_without_losing_or_repeating_groups(tmp_path):
    out = tmp_path / "run"
    args = [sys.executable, "-m", "toolrl", "train", TINY, "trainer.max_staleness=1", "trainer.total_steps=4",
            f"trainer.output_dir={out}", "trainer.plot=false", "trainer.progress=false",
            "env_options.train_size=16", "rollout.n=2", "rollout.max_new_tokens=8",
            "rollout.max_response_tokens=16"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    kill_after_checkpoint(args, env, out / "checkpoints" / "step_000002")
    assert len(lines(out / "metrics.jsonl")) < 4
    toolrl_in_process(*args[3:], "--resume")  # the resume in this process: only the killed run's kill needs one
    metrics = lines(out / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    trained = [g for m in metrics for g in m["groups"]]
    assert trained == list(range(8))  # contiguous, none lost, none twice
    assert all(0 <= a <= 1 for s in staleness(out, 4).values() for a in s)
