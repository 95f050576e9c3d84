"""Mixture-of-experts models of the installed transformers (Qwen3-MoE, OLMoE, Mixtral shapes; tiny and
random, built offline): the transformers engine generates with them, the trainer trains them, also
sharded with FSDP2 over two gloo ranks (data parallel, and sequence parallel) with routing replay, and
a GRPO run with R3 learns a learnable reward."""

from __future__ import annotations

import asyncio
import socket

import pytest
import torch
from test_routing_replay import Recorder
from toolrl import model_sources
from toolrl.config import AlgorithmConfig, OptimConfig
from toolrl.engines import SamplingParams
from toolrl.engines.transformers import TransformersEngine, TransformersEngineConfig
from toolrl.model_sources import load_model, tiny_moe
from toolrl.training.step import StepOptions, train_step
from toolrl.trajectory import Trajectory

PROMPT = list(range(300, 340))


def sampled(path: str, n: int = 4, new: int = 8) -> list[Trajectory]:
    engine = TransformersEngine(load_model(path), model_sources.load_tokenizer(path),
                                TransformersEngineConfig(record_routes=True, seed=0))
    gens = asyncio.run(engine.generate(PROMPT, SamplingParams(max_new_tokens=new, seed=1), n))
    return [Trajectory(trajectory_id=f"t{k}", sample_index=k, group=0, prompt_ids=PROMPT, response_ids=g.token_ids,
                       response_mask=[1] * len(g.token_ids), logprobs=g.logprobs, reward=float(k % 2), routed_experts=g.routed_experts)
            for k, g in enumerate(gens)]


@pytest.mark.parametrize("architecture", ["qwen3_moe", "olmoe", "mixtral"])
def test_each_moe_architecture_generates_and_trains(architecture):
    path = tiny_moe(architecture=architecture)
    trajs = sampled(path)
    assert all(t.routed_experts is not None and t.routed_experts.tokens == len(PROMPT) + len(t.response_ids) - 1 for t in trajs)
    model = load_model(path)
    opt = Recorder(model)
    options = StepOptions(AlgorithmConfig(routing_replay="r3"), OptimConfig(micro_batch_size=2), pad_id=0,
                          temperature=1.0, max_response_tokens=8)
    metrics = train_step(model, opt, trajs, options)
    assert metrics["grad_norm"] > 0 and metrics["lp_mismatch"] < 1e-4  # same weights, same dtype, same experts
    grads = opt.grads[0]
    experts = [n for n in grads if ".experts." in n]
    routers = [n for n in grads if n.endswith("gate.weight")]
    assert experts and len(routers) == 2 and all(grads[n].abs().sum() > 0 for n in experts + routers)


CASES = {"dp": dict(micro_batch_size=2), "sp": dict(micro_batch_size=2, share_prefixes=True)}


def run_case(model, trajs, name, rank=0, world_size=1, sp=None):
    opt = Recorder(model)
    options = StepOptions(AlgorithmConfig(routing_replay="r3", ppo_epochs=2), OptimConfig(grad_clip=1e9, **CASES[name]),
                          pad_id=0, temperature=1.0, max_response_tokens=8, rank=rank, world_size=world_size, sp=sp)
    out = train_step(model, opt, trajs, options)
    return out["loss"], [{k: (g.full_tensor() if hasattr(g, "full_tensor") else g) for k, g in u.items()}
                         for u in opt.grads]


def _rank(rank: int, port: int, path: str, trajs: list[Trajectory], out: str) -> None:
    import torch.distributed as dist
    from toolrl.training.sequence_parallel import new_groups
    from toolrl.training.sharding import shard
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        results = {}
        for name in CASES:
            sp = new_groups(rank, 2, 2) if name == "sp" else None
            policy = shard(load_model(path), init_device_mesh("cpu", (2,)))
            loss, grads = run_case(policy, trajs, name, rank, 2, sp)
            total = torch.tensor([loss], dtype=torch.float64)
            dist.all_reduce(total)
            results[name] = (total.item(), grads)
        if rank == 0:
            torch.save(results, out)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # two spawned processes with FSDP2 over gloo
def test_two_fsdp_ranks_with_r3_give_the_one_rank_gradients(tmp_path):
    """Data parallel (each rank its trajectories, gradients summed by FSDP2) and sequence parallel (each
    rank its slice of every row, replaying its slice of the routed experts): the one-rank loss and gradients."""
    from _processes import start_ranks

    path = tiny_moe()
    trajs = sampled(path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "moe.pt"
    start_ranks(_rank, (port, path, trajs, str(out)), nprocs=2)
    got = torch.load(out)
    for name in CASES:
        want_loss, want = run_case(load_model(path), trajs, name)
        loss, grads = got[name]
        assert abs(loss - want_loss) <= 1e-5 * max(abs(want_loss), 1e-3), name
        assert len(grads) == len(want) == 2
        for w_update, g_update in zip(want, grads, strict=True):
            for key, w in w_update.items():
                g = g_update[f"lm.{key}"]  # the sharded root is the Policy around the model
                assert float((g - w).norm()) <= 1e-4 * float(w.norm()) + 1e-7, (name, key)


@pytest.fixture(scope="module")
def peaked_moe(tmp_path_factory):
    """The tiny Qwen3-MoE with its embeddings scaled up, as test_trainer's peaked tiny model: sampled
    responses differ in reward from step one."""
    import shutil
    from pathlib import Path

    from test_trainer import AlignedTokens

    path = tiny_moe()
    out = tmp_path_factory.mktemp("peaked_moe")
    model = load_model(path)
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(6.0)
    AlignedTokens.good = model.get_input_embeddings().weight[:, 0] > 0
    model.save_pretrained(out)
    for f in Path(path).iterdir():
        if f.name.startswith("tokenizer") or f.name.endswith(".jinja") or f.name == "special_tokens_map.json":
            shutil.copy2(f, out / f.name)
    return out


@pytest.mark.slow  # a 16-step GRPO run
def test_grpo_with_r3_on_the_tiny_moe_learns(tmp_path, peaked_moe):
    """test_learning_algorithms' task and budget, the engine recording experts and the trainer replaying
    them: finite throughout, and the mean reward of the last 4 steps beats that of the first 2 by 0.1."""
    import math

    from test_learning_async import run

    rows = run(tmp_path, peaked_moe, 0, extra=["algorithm.routing_replay=r3", "engine.options.record_routes=true"])
    rewards = [r["reward_mean"] for r in rows]
    assert all(math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) for r in rows)
    assert sum(rewards[-4:]) / 4 > sum(rewards[:2]) / 2 + 0.1, rewards


def test_tiny_moe_is_a_builtin_source_with_checked_settings():
    from toolrl.config import ConfigError, load_config
    from toolrl.model_sources import resolve_source

    config = load_config(None, ["model.source=tiny-moe", "model.tiny={architecture: mixtral, num_experts: 4}"],
                         data={"env": "arithmetic"})
    path = resolve_source(config.model)
    assert path == tiny_moe(architecture="mixtral", num_experts=4)
    assert load_model(path).config.num_local_experts == 4
    with pytest.raises(ConfigError, match=r"model.tiny: num_experts_per_tok \(8\) exceeds num_experts \(4\)$"):
        load_config(None, ["model.source=tiny-moe", "model.tiny={num_experts: 4, num_experts_per_tok: 8}"],
                    data={"env": "arithmetic"})
