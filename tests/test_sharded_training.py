"""The trainer group on real Ray (loopback) with real gloo process groups and FSDP2: two ranks train
exactly like one, hold about half the state each, checkpoint and resume bit-for-bit, and a rank that
dies stops the run with one clear error from which ``--resume`` continues."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from _dists import EVEN_TOKENS, make_dist
from test_vision_training import processor, trajectories, vlm_path  # noqa: F401  (fixtures)
from toolrl.config import Config, load_config
from toolrl.ray_cluster import init_ray

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow  # Ray actors: minutes on two shared cores

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "examples" / "tiny.yaml")



def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def even_tokens_plugin(plugin_dir: Path) -> str:
    """Register a plugin's ``even_tokens`` reward in this process (built in ``plugin_dir``, put on
    sys.path); the PYTHONPATH Ray's workers need to import it."""
    from toolrl.plugins import get_plugins
    from toolrl.plugins.registry import Part

    make_dist(plugin_dir, "even-tokens", "even", "even_tokens_plugin", EVEN_TOKENS)
    sys.path.insert(0, str(plugin_dir))
    registry = get_plugins().registry
    if not registry.has("reward_functions", "even_tokens"):
        registry.add(Part("reward_functions", "even_tokens", "tests", "even_tokens_plugin:EvenTokens"))
    return os.pathsep.join(filter(None, [str(plugin_dir), os.environ.get("PYTHONPATH")]))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A local Ray whose workers (and this process) see a plugin registering ``even_tokens``."""
    if ray.is_initialized():
        pytest.fail("a Ray connection from an earlier test is still open")
    plugin_dir = tmp_path_factory.mktemp("plugin")
    path = even_tokens_plugin(plugin_dir)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_AUTH_MODE", "disabled")
        init_ray("local", 4, runtime_env={"env_vars": {"PYTHONPATH": path, "OMP_NUM_THREADS": "1"}})
        try:
            yield
        finally:
            ray.shutdown()
            sys.path.remove(str(plugin_dir))


def config(out: Path, world_size: int, steps: int = 3, on_ray: bool = True, extra: tuple[str, ...] = ()) -> Config:
    # Sampling is a step function of the weights: 1 and 2 ranks agree to ~1e-7 after a step, which
    # moves a draw to the neighbouring token only when it lies that close to a CDF boundary (the tiny
    # random model's 150k near-uniform probabilities make such boundaries dense). The prompts of
    # env_options.seed=1 hit none in these 3 steps; the default seed's do at step 3 (22029 vs 22030).
    return load_config(TINY, [
        f"trainer.output_dir={out}", f"trainer.total_steps={steps}", f"trainer.world_size={world_size}",
        "trainer.progress=false", "trainer.plot=false", "trainer.keep_checkpoints=3",
        *(["ray.address=local"] if on_ray else []),
        "reward.functions=[{name: even_tokens}]", "tools.entries=[]", "optim.lr=1e-3", "optim.micro_batch_size=2",
        "env_options.train_size=16", "env_options.seed=1", "data.batch_size=2", "rollout.n=3", "rollout.max_new_tokens=6",
        "rollout.max_response_tokens=6",
        "trainer.weight_sync_bucket_mb=4",  # several buckets even for the tiny model
        *extra,
    ])


def train(cfg: Config, resume: bool = False) -> Path:
    from toolrl.processes.controller import train_async

    t0 = time.perf_counter()
    out = asyncio.run(train_async(cfg, resume=resume))
    print(f"\n{cfg.trainer.world_size} rank(s), {cfg.trainer.total_steps} steps{' (resumed)' if resume else ''}: "
          f"{time.perf_counter() - t0:.1f} s")
    return out


def weights(run: Path, step: int, scratch: Path) -> dict[str, Any]:
    """The model of checkpoint ``step``, read whole in this process (DCP reshards the ranks' pieces)."""
    import torch
    from toolrl.training.export import export

    out = export(run, scratch / f"{run.name}-{step}", step)
    from safetensors.torch import load_file

    return {k: v.to(torch.float64) for k, v in load_file(str(out / "model.safetensors")).items()}


@pytest.fixture(scope="module")
def two_ranks(cluster, tmp_path_factory):
    return train(config(tmp_path_factory.mktemp("w2") / "run", 2))


@pytest.fixture(scope="module")
def one_rank(cluster, tmp_path_factory):
    # In this process, not on Ray: the reference run needs no actors of its own (their starts are most of
    # its time), and its engine samples what a Ray worker's would (test_distributed: the same trajectories).
    return train(config(tmp_path_factory.mktemp("w1") / "run", 1, on_ray=False))


def test_two_ranks_train_like_one(cluster, two_ranks, one_rank, tmp_path):
    one = one_rank
    m1, m2 = lines(one / "metrics.jsonl"), lines(two_ranks / "metrics.jsonl")
    w1, w2 = weights(one, 3, tmp_path), weights(two_ranks, 3, tmp_path)
    largest_mb = max(v.numel() for v in w1.values()) * 4 / 2**20
    assert [m["step"] for m in m2] == [1, 2, 3]
    for a, b in zip(m1, m2):
        # Same rollouts: the engines sampled from the same weights.
        rows1 = lines(one / "rollouts" / f"step_{a['step']:05d}.jsonl")
        rows2 = lines(two_ranks / "rollouts" / f"step_{b['step']:05d}.jsonl")
        assert [t["reward"] for t in rows1] == [t["reward"] for t in rows2]
        # Each rank returned the trainer log-probs of its share: together every row's, as one rank's.
        for r1, r2 in zip(rows1, rows2, strict=True):
            assert [v is not None for v in r2["trainer_logprobs"]] == [bool(m) for m in r2["response_mask"]]
            assert r2["trainer_logprobs"] == pytest.approx(r1["trainer_logprobs"], abs=1e-4)
        assert a["reward_std"] > 0 and a["grad_norm"] > 0  # a real gradient, not zero
        assert abs(a["grad_norm"] - b["grad_norm"]) <= 1e-3 * a["grad_norm"], (a["grad_norm"], b["grad_norm"])
        assert abs(a["loss"] - b["loss"]) <= 1e-4 * max(abs(a["loss"]), 1e-3)
        # Each rank holds about half of parameters, gradients and optimizer state.
        assert b["trainer_state_mb"] <= 0.6 * a["trainer_state_mb"], (a["trainer_state_mb"], b["trainer_state_mb"])
        # A bucket (4 MB, or the one tensor larger than that: the 38 MB embedding) and its copy in
        # the object store; never the whole model plus that.
        assert b["weight_sync_peak_mb"] <= 2 * max(4, largest_mb) + 1
    assert set(w1) == set(w2)
    diff = sum(float((w1[k] - w2[k]).abs().sum()) for k in w1) / sum(v.numel() for v in w1.values())
    assert diff <= 1e-6, diff
    start = weights(one, 1, tmp_path)
    assert max(float((w1[k] - start[k]).abs().max()) for k in w1) > 1e-4  # and training moved them


def test_broadcast_with_delta_sync_trains_to_the_same_figures_as_the_object_store(cluster, two_ranks, tmp_path):
    """``trainer.weight_transport=broadcast`` (each FSDP2 rank sends its own shards over its own gloo
    group, to two rollout workers) with ``trainer.weight_sync=delta`` (the shards count their own
    writes) trains to the figures of ``two_ranks`` (the object store, whole syncs, one worker): every
    step has a gradient (even_tokens), so each sync carries weights that differ from the last, and a
    sync that lost or garbled a bucket would change the next step's rewards and gradient. (Only the
    last step is checkpointed: nothing here reads a checkpoint, and a save changes no figure.)"""
    want = lines(two_ranks / "metrics.jsonl")
    run = train(config(tmp_path / "broadcast", 2, extra=("trainer.weight_transport=broadcast", "trainer.weight_sync=delta",
                                                          "ray.num_rollout_workers=2", "trainer.save_every=3")))
    got = lines(run / "metrics.jsonl")
    assert [m["step"] for m in got] == [1, 2, 3]
    for a, b in zip(got, want, strict=True):
        assert a["reward_std"] > 0 and a["weight_sync_s"] > 0
        assert (a["reward_mean"], a["grad_norm"]) == (b["reward_mean"], b["grad_norm"]), (a["step"], a, b)


def kill_rank_after_checkpoint(run: Path, rank: int, step: int, found: dict[str, Any], timeout: float = 600) -> None:
    """SIGKILL trainer rank ``rank`` once checkpoint ``step`` is published (the next step is starting)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (run / "checkpoints" / f"step_{step:06d}" / "meta.json").exists():
            pid = json.loads((run / "placement.json").read_text())["trainer"][rank]["pid"]
            os.kill(pid, signal.SIGKILL)
            found["pid"] = pid
            return
        time.sleep(0.05)


# The sequence-level loss's sharding is checked on two ranks by test_microbatch (its gspo case), and RLOO's
# advantages are the controller's, computed once for every rank: this whole-run twin is in the long session.
@pytest.mark.long
def test_two_ranks_train_like_one_with_rloo_and_gspo(cluster, tmp_path):
    """Another estimator and loss (a sequence-level one) shard like the default: same rewards, and
    grad_norm within 1e-3, on one rank and two, with the same advantages traced."""
    algo = ("algorithm.advantage=rloo", "algorithm.loss=gspo")
    one = train(config(tmp_path / "w1", 1, steps=2, extra=algo))
    two = train(config(tmp_path / "w2", 2, steps=2, extra=algo))
    for a, b in zip(lines(one / "metrics.jsonl"), lines(two / "metrics.jsonl"), strict=True):
        t1 = lines(one / "rollouts" / f"step_{a['step']:05d}.jsonl")
        t2 = lines(two / "rollouts" / f"step_{b['step']:05d}.jsonl")
        assert [t["reward"] for t in t1] == [t["reward"] for t in t2]
        assert [t["advantage"] for t in t1] == pytest.approx([t["advantage"] for t in t2], abs=1e-6)
        assert a["grad_norm"] > 0 and abs(a["grad_norm"] - b["grad_norm"]) <= 1e-3 * a["grad_norm"]
        assert abs(a["reward_mean"] - b["reward_mean"]) <= 1e-3


# on_rank_failure=stop then --resume on two ranks: test_sharded_critic's resume test runs the same path by
# default (with a critic besides), so this one is in the long session.
@pytest.mark.long
def test_dead_rank_stops_the_run_and_resume_matches_an_uninterrupted_run(cluster, two_ranks, tmp_path):
    from toolrl.processes.trainer_group import TrainerFailed

    run = tmp_path / "killed"
    found: dict[str, Any] = {}
    killer = threading.Thread(target=kill_rank_after_checkpoint, args=(run, 1, 2, found), daemon=True)
    killer.start()
    t0 = time.perf_counter()
    with pytest.raises(TrainerFailed) as info:
        train(config(run, 2, extra=("trainer.on_rank_failure=stop",)))
    killer.join(timeout=5)
    print(f"failed after {time.perf_counter() - t0:.1f} s: {info.value}")
    message = str(info.value)
    assert f"trainer rank 1 (pid {found['pid']} on " in message and "died during step 3" in message
    assert "\n" not in message
    # The failed step is on record: its trajectories and a metrics line saying what failed.
    rows = lines(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3] and "died during step 3" in rows[2]["failed"]
    assert len(lines(run / "rollouts" / "step_00003.jsonl")) == 6

    train(config(run, 2, extra=("trainer.on_rank_failure=stop",)), resume=True)
    assert [r["step"] for r in lines(run / "metrics.jsonl")] == [1, 2, 3]
    assert "failed" not in lines(run / "metrics.jsonl")[2]
    want, got = weights(two_ranks, 3, tmp_path), weights(run, 3, tmp_path)
    assert max(float((want[k] - got[k]).abs().max()) for k in want) <= 1e-6


# Figures that measure time or memory of a process, not the computation: they differ run to run.
def _computed(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if not (k.endswith(("_s", "_per_s", "_peak_mb")) or k == "recoveries"
                                                 or k == "tool_latency_s")}


# A re-formed group (every rank a new process: started, model built, state restored). Measured on two
# cores shared with four other sessions' Ray tests (load average 14): 56-80 s.
RECOVERY_BOUND_S = 120


def kill_ranks(run: Path, kills: list[tuple[str, int, int]], found: list[dict[str, Any]], timeout: float = 600) -> None:
    """For each (after, step, rank): SIGKILL that rank (where placement.json says it runs now) once step
    ``step``'s ``checkpoint`` is published (the next step starts) or its ``metrics`` line is written
    (its checkpoint is being saved)."""
    deadline = time.monotonic() + timeout
    for after, step, rank in kills:
        while time.monotonic() < deadline:
            if after == "checkpoint":
                ready = (run / "checkpoints" / f"step_{step:06d}" / "meta.json").exists()
            else:
                ready = (run / "metrics.jsonl").exists() and any(r["step"] == step for r in lines(run / "metrics.jsonl"))
            if ready:
                pid = json.loads((run / "placement.json").read_text())["trainer"][rank]["pid"]
                if not any(f["pid"] == pid for f in found):
                    os.kill(pid, signal.SIGKILL)
                    found.append({"pid": pid, "at": time.monotonic()})
                    break
            time.sleep(0.05)


# long: test_a_rank_killed_before_its_copy_is_complete_trains_the_step_again (below, in the default run) kills a
# rank of the same group and checks the replaced group trains the step again to the same figures; this one kills
# twice (a second rank while a checkpoint is written), two and a half minutes.
@pytest.mark.long
@pytest.mark.timeout(1500)
def test_a_killed_rank_is_replaced_and_the_run_equals_an_uninterrupted_one(cluster, two_ranks, tmp_path):
    """trainer.on_rank_failure=replace (the default): rank 1 is killed -9 after step 1 (the death is
    seen by step 2), then rank 0 of the re-formed group while step 2's checkpoint is written. Each time the group re-forms from the in-memory copies of the
    last step and runs the interrupted step again: the run finishes by itself, every step once in
    metrics.jsonl, nothing lost, and every step's figures and the final weights equal the
    uninterrupted run's bit for bit."""
    run = tmp_path / "replaced"
    found: list[dict[str, Any]] = []
    killer = threading.Thread(target=kill_ranks, args=(run, [("checkpoint", 1, 1), ("metrics", 2, 0)], found),
                              daemon=True)
    killer.start()
    train(config(run, 2))
    killer.join(timeout=5)
    assert len(found) == 2
    rows, want = lines(run / "metrics.jsonl"), lines(two_ranks / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3] and not any("failed" in r for r in rows)
    assert sum(r["recoveries"] for r in rows) == 2 and all(r["steps_lost"] == 0 for r in rows)
    for got, expected in zip(rows, want, strict=True):
        assert _computed(got) == _computed(expected), got["step"]
    recoveries = lines(run / "recoveries.jsonl")
    print("recoveries:", [(r["died"], r["during"], r["source"], round(r["recovery_s"], 1)) for r in recoveries])
    assert [r["died"].split(" (")[0] for r in recoveries] == ["trainer rank 1", "trainer rank 0"]
    assert [r["during"] for r in recoveries] == ["step 2", "checkpoint of step 2"]
    assert all(r["mode"] == "replace" and r["world_size"] == 2 and r["steps_lost"] == 0 for r in recoveries)
    # Step 2's copies are made while its weights are pushed: nearly always complete by the time rank 0
    # is killed, else the group re-forms from step 1's and trains step 2 again (the figures are the same).
    assert recoveries[0]["source"] == "memory (step 1)"
    assert recoveries[1]["source"] in ("memory (step 2)", "memory (step 1), step 2 run again")
    assert all(r["recovery_s"] < RECOVERY_BOUND_S for r in recoveries)
    assert {f["pid"] for f in found}.isdisjoint(r["pid"] for r in recoveries[-1]["ranks"])
    w_want, w_got = weights(two_ranks, 3, tmp_path), weights(run, 3, tmp_path)
    assert max(float((w_want[k] - w_got[k]).abs().max()) for k in w_want) == 0.0


@pytest.mark.timeout(900)
def test_a_rank_killed_before_its_copy_is_complete_trains_the_step_again(cluster, two_ranks, tmp_path, monkeypatch):
    """Step 2's in-memory copies are made while its weights are pushed and its row is written. Rank 1's
    is held up: the one thread of its ``copy`` concurrency group is pulling a copy that is not ready
    (``hold_copies``, as a peer's copy over a slow network), so its snapshot of step 2 waits behind
    it, and the rank is killed -9 once step 2's row is written. The checkpoint of step 2 waits for
    the copies and finds the death: the group re-forms from step 1's copies and trains step 2 again
    on the same batch. Nothing lost; every step's figures and the final weights equal the
    uninterrupted run's bit for bit."""
    from toolrl.processes.trainer_group import RayTrainerGroup

    @ray.remote(num_cpus=0)
    def not_ready() -> None:
        time.sleep(600)

    blocker = not_ready.remote()
    step = RayTrainerGroup.step

    async def held_step(self: RayTrainerGroup, batch: Any, number: int) -> dict[str, Any]:
        if number == 2:  # the first group's rank 1: a re-formed group trains step 2 again without this call
            self.ranks[1].hold_copies.options(concurrency_group="copy").remote(0, [blocker])
        return await step(self, batch, number)

    monkeypatch.setattr(RayTrainerGroup, "step", held_step)
    run = tmp_path / "uncopied"
    found: list[dict[str, Any]] = []
    killer = threading.Thread(target=kill_ranks, args=(run, [("metrics", 2, 1)], found), daemon=True)
    killer.start()
    try:
        train(config(run, 2))
    finally:
        ray.cancel(blocker, force=True)
    killer.join(timeout=5)
    assert len(found) == 1
    rows, want = lines(run / "metrics.jsonl"), lines(two_ranks / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3] and [r["recoveries"] for r in rows] == [0, 0, 1]
    assert all(r["steps_lost"] == 0 and "failed" not in r for r in rows)
    for got, expected in zip(rows, want, strict=True):
        assert _computed(got) == _computed(expected), got["step"]
    (recovery,) = lines(run / "recoveries.jsonl")
    print("recovery:", {k: recovery[k] for k in ("died", "during", "source", "recovery_s")})
    assert recovery["died"].startswith(f"trainer rank 1 (pid {found[0]['pid']} ")
    assert (recovery["during"], recovery["source"], recovery["steps_lost"]) == \
        ("checkpoint of step 2", "memory (step 1), step 2 run again", 0)
    w_want, w_got = weights(two_ranks, 3, tmp_path), weights(run, 3, tmp_path)
    assert max(float((w_want[k] - w_got[k]).abs().max()) for k in w_want) == 0.0
    w_want, w_got = weights(two_ranks, 2, tmp_path), weights(run, 2, tmp_path)
    assert max(float((w_want[k] - w_got[k]).abs().max()) for k in w_want) == 0.0


@pytest.mark.timeout(1200)
@pytest.mark.long
def test_a_killed_rank_in_shrink_mode_goes_on_with_one_rank(cluster, one_rank, tmp_path):
    """trainer.on_rank_failure=shrink: rank 1 killed -9 after step 1; steps 2 and 3 train on the one
    rank left, from the two ranks' in-memory copies resharded (each piece cut from the whole
    tensor). The run matches one trained on one rank throughout to fp32 reduction-order noise."""
    run = tmp_path / "shrunk"
    found: list[dict[str, Any]] = []
    killer = threading.Thread(target=kill_ranks, args=(run, [("checkpoint", 1, 1)], found), daemon=True)
    killer.start()
    train(config(run, 2, extra=("trainer.on_rank_failure=shrink",)))
    killer.join(timeout=5)
    rows = lines(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3] and [r["recoveries"] for r in rows] == [0, 1, 0]
    (recovery,) = lines(run / "recoveries.jsonl")
    assert (recovery["mode"], recovery["world_size_before"], recovery["world_size"], recovery["source"],
            recovery["steps_lost"]) == ("shrink", 2, 1, "memory (step 1)", 0)
    assert recovery["recovery_s"] < RECOVERY_BOUND_S
    assert_trained_like_one_rank(run, one_rank, tmp_path)


def assert_trained_like_one_rank(run: Path, one: Path, scratch: Path) -> None:
    """``run`` (shrunk to one rank) ends one-rank and matches the one-rank run ``one``: the same rewards
    every step, loss and grad_norm to fp32 reduction-order noise, final weights within 1e-5."""
    assert json.loads((run / "checkpoints" / "step_000003" / "meta.json").read_text())["world_size"] == 1
    for got, expected in zip(lines(run / "metrics.jsonl"), lines(one / "metrics.jsonl"), strict=True):
        assert [t["reward"] for t in lines(run / "rollouts" / f"step_{got['step']:05d}.jsonl")] == \
            [t["reward"] for t in lines(one / "rollouts" / f"step_{got['step']:05d}.jsonl")]
        assert got["grad_norm"] == pytest.approx(expected["grad_norm"], rel=1e-5)
        assert got["loss"] == pytest.approx(expected["loss"], rel=1e-5, abs=1e-7)
    w_want, w_got = weights(one, 3, scratch), weights(run, 3, scratch)
    assert max(float((w_want[k] - w_got[k]).abs().max()) for k in w_want) <= 1e-5


def test_a_lora_run_on_ray_samples_with_the_adapters_each_step_trained(cluster, tmp_path):
    """Under ``model.lora`` the Ray rollout worker's engine carries the run's adapters (its own copy of
    the model, unlike an in-process run's engine, which shares the trainer's) and each sync fills
    them through the object store: step 2 samples with step 1's adapters, the checkpoint holds only
    them. (test_lora's CLI run trains the same in one process.)"""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    run = train(config(tmp_path / "lora", 1, steps=2, extra=(
        "model.lora={r: 8, alpha: 16, target_modules: [q_proj, v_proj]}", "optim.lr=0.05")))
    rows = lines(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[0]["grad_norm"] > 0  # step 1 moved the adapters ...
    assert rows[1]["lp_mismatch"] < 1e-4  # ... and step 2's engine sampled with them
    dcp_to_torch_save(str(run / "checkpoints" / "step_000002"), str(tmp_path / "ckpt.pt"))
    saved = torch.load(tmp_path / "ckpt.pt", weights_only=False)["model"]
    assert len(saved) == 8 and all("lora_" in k for k in saved)


def test_two_vision_language_ranks_train_like_one(cluster, processor, trajectories, tmp_path):  # noqa: F811
    """A step of the tiny Qwen2.5-VL on trajectories with images (test_vision_training's) through two
    FSDP2 ranks on Ray: one rank's loss and grad_norm."""
    from test_vision_training import rank_config
    from toolrl.processes.trainer_group import LocalTrainer, RayTrainerGroup
    from toolrl.processes.trainer_rank import TrainerRank

    one = TrainerRank(rank_config(tmp_path / "one", 1))
    one.setup()
    m1 = asyncio.run(LocalTrainer(one).step(trajectories, 1))
    group = RayTrainerGroup(rank_config(tmp_path / "two", 2, "ray.address=local"))

    async def run() -> dict:
        await group.start()
        try:
            return await group.step(trajectories, 1)
        finally:
            group.close()

    m2 = asyncio.run(run())
    assert m1["grad_norm"] > 0
    assert abs(m1["grad_norm"] - m2["grad_norm"]) <= 1e-3 * m1["grad_norm"], (m1["grad_norm"], m2["grad_norm"])
    assert abs(m1["loss"] - m2["loss"]) <= 1e-4 * max(abs(m1["loss"]), 1e-3)


def test_a_two_rank_checkpoint_loads_into_one_rank(two_ranks, tmp_path):
    """DCP reshards on load: one rank (no process group) resumes what two ranks wrote."""
    import torch
    from toolrl.processes.trainer_rank import TrainerRank

    rank = TrainerRank(config(tmp_path / "w1", 1, on_ray=False))
    rank.setup()
    rank.load(str(two_ranks / "checkpoints" / "step_000002"))
    want = weights(two_ranks, 2, tmp_path)
    got = rank.model.state_dict()
    assert max(float((got[k].to(torch.float64) - want[k]).abs().max()) for k in want) == 0.0
    assert all(len(s) > 0 for s in rank.optimizer.state.values())  # Adam moments came back too


# tests/test_async_ray.py replaces a worker that died during rollouts, and one found dead by a weight push,
# each getting the current weights and version (a scripted trainer, real Ray actors): this twin with real
# trainer ranks is in the long session.
@pytest.mark.long
def test_a_replaced_rollout_worker_gets_the_trainers_weights(cluster, tmp_path):
    """A rollout worker that dies after a weight sync is replaced; before its first rollout the
    trainer ranks send it their current weights, so it samples from the trained policy, not the
    initial one (the trainer's recomputed logprobs match the engine's)."""
    from toolrl.data.sources import load_samples
    from toolrl.processes import RolloutGroup, TrainerGroup
    from toolrl.processes.controller import batch_for_step
    from toolrl.processes.start import start_processes

    cfg = config(tmp_path / "replaced", 1)
    samples = load_samples(cfg)

    async def scenario() -> tuple[list[dict[str, float]], int]:
        processes = await start_processes(cfg)
        try:
            # The Ray implementations of the role interfaces the controller drives.
            assert isinstance(processes.trainer, TrainerGroup) and isinstance(processes.rollouts, RolloutGroup)
            stats = []
            for step in range(2):
                prompts = batch_for_step(samples, step, cfg.data.batch_size, cfg.trainer.seed, cfg.data.shuffle)
                trajs = await processes.rollouts.run(prompts, cfg.rollout.n, seed=step)
                stats.append(await processes.trainer.step(trajs, step + 1))
                await processes.sync_weights(step + 1)
                if step == 0:
                    ray.kill(processes.pool.workers[0], no_restart=True)
            return stats, processes.pool.slots.restarts
        finally:
            await processes.close()

    (first, second), restarts = asyncio.run(scenario())
    assert restarts == 1
    assert first["lp_mismatch"] < 1e-5 and first["grad_norm"] > 0
    # Sampled by the replacement after one update: same weights as the trainer's.
    assert second["lp_mismatch"] < 1e-5, second["lp_mismatch"]
