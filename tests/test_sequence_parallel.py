"""Sequence parallelism (toolrl.training.sequence_parallel) on two real gloo ranks with FSDP2: the tiny
Qwen3 (grouped-query attention, one key/value head for two query heads, so the key/value heads are
repeated) gives the one-rank loss and every gradient for a packed batch, a prefix-shared batch and a
batch with one row far longer than the others; and what it cannot run with is refused in one line."""

from __future__ import annotations

import copy
import random
from pathlib import Path

import pytest
import torch
from _processes import spawn_ranks
from test_sharded_training import cluster  # noqa: F401  (the fixture: a local Ray seeing the even_tokens reward)
from toolrl.config import AlgorithmConfig, ConfigError, OptimConfig, load_config
from toolrl.model_sources import load_model
from toolrl.trajectory import Trajectory

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "examples" / "tiny.yaml")


def traj(rng, prompt, n, group, mask=None):
    response = [rng.randrange(100, 150_000) for _ in range(n)]
    return Trajectory(trajectory_id="x", sample_index=0, group=group, prompt_ids=prompt, response_ids=response,
                      response_mask=mask or [1] * n, logprobs=[-1.0 - 0.01 * j for j in range(n)],
                      reward=float(rng.random()))


def ids(rng, n):
    return [rng.randrange(100, 150_000) for _ in range(n)]


def packed():
    """Six trajectories of different lengths (one with a tool span) in rows of up to four."""
    rng = random.Random(0)
    out = [traj(rng, ids(rng, 9 + 5 * i), 4 + 3 * i, i // 2) for i in range(6)]
    out[2].response_mask = [1, 1, 0, 0, 0, 1, 1, 1, 1, 1][: len(out[2].response_ids)]
    return out


def shared():
    """Two groups of three sharing 30-token prompts; in one group two also share a first turn."""
    rng = random.Random(1)
    out = []
    for g in range(2):
        prompt, turn = ids(rng, 30), ids(rng, 8)
        out += [traj(rng, prompt, 7, g), traj(rng, prompt, 10, g), traj(rng, prompt, 12, g)]
        if g == 1:
            for t in out[-2:]:
                t.response_ids[:8] = turn  # an assistant call (trained) and its tool output (not)
                t.response_mask = [1] * 4 + [0] * 4 + t.response_mask[8:]
                t.logprobs = t.logprobs[: len(t.response_ids)] + [-1.0] * (len(t.response_ids) - len(t.logprobs))
    return out


def long_row():
    """Four short trajectories and one five times longer than all of them."""
    rng = random.Random(2)
    return [traj(rng, ids(rng, 12), 6, 0), traj(rng, ids(rng, 10), 5, 0), traj(rng, ids(rng, 250), 61, 1),
            traj(rng, ids(rng, 8), 7, 1), traj(rng, ids(rng, 11), 4, 1)]


# name, trajectories, algorithm, optimizer: together they cover the three aggregations, a
# sequence-level loss (gspo), the decoupled objective's importance weights (the engine's log-probs
# are not the model's) over two updates, a KL term against a reference model, and micro-batches by
# tokens and by sequences; the long row's ranks also checkpoint activations.
CASES = {
    "packed": (packed, {"mini_batches": 2, "tis_cap": 2.0}, {"micro_batch_size": 4}),
    "shared": (shared, {"loss_agg": "seq-mean-token-sum-norm"}, {"share_prefixes": True,
                                                            "max_tokens_per_micro_batch": 60}),
    "long": (long_row, {"loss": "gspo", "loss_agg": "seq-mean-token-mean",
                                  "loss_options": {"kl_coef": 0.1}}, {"micro_batch_size": 2}),
}


def reference(model):
    """A frozen reference model a little away from ``model`` (the same in every process), so that the
    KL term has a gradient."""
    ref = copy.deepcopy(model).eval().requires_grad_(False)
    noise = torch.Generator().manual_seed(0)
    for p in ref.parameters():
        p.add_(0.02 * torch.randn(p.shape, generator=noise))
    return ref


class Recorder(torch.optim.Optimizer):
    """Keeps each update's full gradients (gathered from the FSDP shards) instead of applying them."""

    def __init__(self, params):
        super().__init__(params, {})
        self.grads = []

    def step(self, closure=None):
        grads = []
        for p in (p for g in self.param_groups for p in g["params"]):
            grad = p.grad if p.grad is not None else torch.zeros_like(p)
            grads.append(grad.full_tensor() if hasattr(grad, "full_tensor") else grad.clone())
        self.grads.append(grads)


def run_case(model, name, rank=0, world_size=1, sp=None, ref_model=None):
    from toolrl.training.step import StepOptions, train_step

    make, algo, optim = CASES[name]
    opt = Recorder(model.parameters())
    options = StepOptions(AlgorithmConfig(**algo), OptimConfig(grad_clip=1e9, **optim), pad_id=0, temperature=0.9,
                          max_response_tokens=64, rank=rank, world_size=world_size, sp=sp)
    out = train_step(model, opt, make(), options, ref_model=ref_model if algo.get("loss_options") else None)
    return out, opt.grads


def _rank(rank: int, port: int, path: str, out: str) -> None:
    import torch.distributed as dist
    from toolrl.training.sequence_parallel import new_groups
    from toolrl.training.sharding import shard
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        sp = new_groups(rank, 2, 2)
        results = {}
        model = load_model(path)
        for name in CASES:
            local = copy.deepcopy(model)
            if name == "long":  # activation checkpointing re-runs the all-to-alls inside backward
                local.gradient_checkpointing_enable()
            policy = shard(local, init_device_mesh("cpu", (2,)))
            metrics, grads = run_case(policy, name, rank, 2, sp, ref_model=reference(model))
            loss = torch.tensor([metrics["loss"], metrics.get("loss_tokens", 0.0)], dtype=torch.float64)
            dist.all_reduce(loss)  # each rank holds 1/2 of the loss; the group's first counts the tokens
            kept = torch.zeros(2)  # trajectories whose trainer log-probs each rank returned
            kept[rank] = len(metrics["trainer_logprobs"])
            dist.all_reduce(kept)
            results[name] = (loss.tolist(), grads, metrics["trainer_logprobs"], kept.tolist())
        if rank == 0:
            torch.save(results, out)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # two spawned processes with FSDP2 over gloo: about 90 s on two shared cores
def test_two_sequence_parallel_ranks_give_the_one_rank_loss_and_gradients(tiny_qwen3_path, tmp_path):
    model = load_model(tiny_qwen3_path)
    assert model.config.num_key_value_heads == 1 < 2 == model.config.num_attention_heads  # GQA, repeated
    want = {name: run_case(copy.deepcopy(model), name, ref_model=reference(model)) for name in CASES}
    out = tmp_path / "sp.pt"
    spawn_ranks(_rank, 2, tiny_qwen3_path, str(out))
    got = torch.load(out)
    for name, (metrics, grads) in want.items():
        (loss, tokens), sp_grads, sp_logprobs, kept = got[name]
        # The group's first rank alone returns the trainer log-probs (for every trajectory), as one rank's.
        assert kept == [len(metrics["trainer_logprobs"]), 0] and set(sp_logprobs) == set(metrics["trainer_logprobs"])
        for key, want_lp in metrics["trainer_logprobs"].items():
            assert sp_logprobs[key] == pytest.approx(want_lp, abs=1e-5), (name, key)
        # (gspo's seq-mean of group-normalised advantages is 0 up to rounding: an absolute floor)
        assert abs(loss - metrics["loss"]) <= 1e-5 * max(abs(metrics["loss"]), 1e-3), (name, loss, metrics["loss"])
        assert tokens == metrics["loss_tokens"], name
        if "kl" in metrics:  # the reference's KL term, counted once over the group
            assert metrics["kl"] > 1e-4
        assert len(sp_grads) == len(grads) >= 1
        for update, (w_update, g_update) in enumerate(zip(grads, sp_grads, strict=True)):
            assert len(w_update) == len(g_update)
            for k, (w, g) in enumerate(zip(w_update, g_update, strict=True)):
                assert float(w.norm()) > 0, (name, update, k)  # a real gradient, not zeros on both sides
                assert float((g - w).norm()) <= 1e-5 * float(w.norm()), (name, update, k)


def test_what_sequence_parallelism_refuses_is_one_line(tiny_qwen3_path):
    from toolrl.training.sequence_parallel import check_sequence_parallel

    base = ["ray.address=local", "trainer.world_size=2", "trainer.sequence_parallel=2"]
    check_sequence_parallel(load_config(TINY, base), tiny_qwen3_path)  # the tiny Qwen3 splits
    with pytest.raises(ConfigError, match=r"^override trainer.sequence_parallel=2: trainer: sequence_parallel=2 "
                                          r"must divide world_size=3"):
        load_config(TINY, ["trainer.world_size=3", "trainer.sequence_parallel=2"])
    cases = {"model.lora={r: 4}": "not supported with model.lora",
             "algorithm.advantage=gae": "not supported with a critic"}
    for override, message in cases.items():
        cfg = load_config(TINY, [*base, override])
        if override.startswith("algorithm"):
            from toolrl.algorithms.rules import with_critic

            cfg = with_critic(cfg)
        with pytest.raises(ConfigError, match=message) as info:
            check_sequence_parallel(cfg, tiny_qwen3_path)
        assert "\n" not in str(info.value)
    odd = load_config(TINY, ["ray.address=local", "trainer.world_size=3", "trainer.sequence_parallel=3"])
    with pytest.raises(ConfigError, match=r"trainer.sequence_parallel=3 must divide the model's attention heads \(2"):
        check_sequence_parallel(odd, tiny_qwen3_path)


@pytest.mark.slow  # Ray actors: minutes on two shared cores
@pytest.mark.long
def test_a_grpo_run_with_two_sequence_parallel_ranks_trains_like_one_rank(cluster, tmp_path):  # noqa: F811
    """The run `toolrl train examples/tiny.yaml trainer.world_size=2 trainer.sequence_parallel=2` makes
    (ray.address=local): the same rewards, loss and grad_norm as one rank, step after step."""
    from test_sharded_training import config, lines, train

    one = train(config(tmp_path / "w1", 1, steps=2))
    two = train(config(tmp_path / "sp2", 2, steps=2, extra=("trainer.sequence_parallel=2",)))
    for a, b in zip(lines(one / "metrics.jsonl"), lines(two / "metrics.jsonl"), strict=True):
        rewards = [[t["reward"] for t in lines(run / "rollouts" / f"step_{a['step']:05d}.jsonl")] for run in (one, two)]
        assert rewards[0] == rewards[1]
        assert a["grad_norm"] > 0 and abs(a["grad_norm"] - b["grad_norm"]) <= 1e-4 * a["grad_norm"]
        assert abs(a["loss"] - b["loss"]) <= 1e-4 * max(abs(a["loss"]), 1e-3)
        assert a["loss_tokens"] == b["loss_tokens"] and a["clip_frac"] == pytest.approx(b["clip_frac"], abs=1e-6)


def test_four_ranks_in_two_sequence_parallel_groups_share_the_batch_by_group():
    """world_size 4, sequence_parallel 2: the two ranks of a group build the same micro-batches, the two
    groups split the batch between them, and the token budget counts tokens per rank."""
    from toolrl.training.sequence_parallel import SequenceParallel
    from toolrl.training.step import StepOptions, split_mini_batches

    trajs = packed()
    advs = [torch.zeros(len(t.response_ids)) for t in trajs]

    def micro_steps(rank, max_tokens):
        sp = SequenceParallel(None, rank % 2, 2, rank // 2, 2)
        options = StepOptions(AlgorithmConfig(), OptimConfig(micro_batch_size=8, max_tokens_per_micro_batch=max_tokens),
                              pad_id=0, temperature=1.0, max_response_tokens=64, rank=rank, world_size=4, sp=sp)
        [mini] = split_mini_batches(trajs, advs, options, torch.device("cpu"))
        return [micro for micro, _ in mini.micro_steps]

    shares = [micro_steps(r, 30) for r in range(4)]
    assert shares[0] == shares[1] and shares[2] == shares[3]
    trained = [i for steps in (shares[0], shares[2]) for micro in steps if micro for i in micro]
    assert sorted(trained) == list(range(len(trajs)))
    # 30 tokens per rank is 60 per row of the group: rows past 30 tokens, none past 60.
    from toolrl.training.packing import input_length

    lengths = [input_length(t) for t in trajs]
    assert max(lengths) <= 60
    rows = [(len(micro), sum(lengths[i] for i in micro)) for share in (shares[0], shares[2]) for micro in share if micro]
    assert all(n <= 60 for _, n in rows) and any(k > 1 and n > 30 for k, n in rows), rows  # not a 30-token row


def test_shrinking_a_sequence_parallel_group_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="on_rank_failure=shrink with sequence_parallel=2"):
        load_config(TINY, ["ray.address=local", "trainer.world_size=2", "trainer.sequence_parallel=2",
                           "trainer.on_rank_failure=shrink"])
