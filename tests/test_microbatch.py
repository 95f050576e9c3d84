import asyncio
import copy

import pytest
import torch
from toolrl.config import AlgorithmConfig, OptimConfig, load_config
from toolrl.model_sources import load_model
from toolrl.training.microbatch import micro_batches, plan, split_across_ranks
from toolrl.training.step import StepOptions, train_step
from toolrl.trajectory import Trajectory

MODES = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


def test_ranks_get_balanced_token_shares_in_order():
    lengths = [100, 10, 60, 50, 40, 30, 5]
    shares = split_across_ranks(range(7), lengths, 2)
    assert sorted(shares[0] + shares[1]) == list(range(7)) and all(s == sorted(s) for s in shares)
    loads = [sum(lengths[i] for i in s) for s in shares]
    assert abs(loads[0] - loads[1]) <= 10
    assert split_across_ranks([3, 1, 2], lengths, 1) == [[3, 1, 2]]  # one rank: untouched order


def test_token_budget_bins():
    lengths = [70, 20, 50, 200, 30, 60]
    bins = micro_batches(range(6), lengths, micro_batch_size=1, max_tokens=128)
    assert sorted(i for b in bins for i in b) == list(range(6))
    assert [3] in bins  # longer than the budget: alone
    assert all(sum(lengths[i] for i in b) <= 128 for b in bins if b != [3])
    assert bins == [[3], [0, 2], [1, 4, 5]]  # first-fit decreasing: 200 | 70 + 50 | 60 + 30 + 20
    assert micro_batches([4, 5, 6, 7, 8], lengths * 2, micro_batch_size=2) == [[4, 5], [6, 7], [8]]


def test_every_rank_runs_the_same_number_of_micro_steps():
    lengths = [500, 10, 10, 10, 10]
    per_rank = plan(range(5), lengths, 2, micro_batch_size=2)
    assert len(per_rank[0]) == len(per_rank[1])
    assert per_rank[0] == [[0], None] and per_rank[1] == [[1, 2], [3, 4]]
    assert plan([0], [5], 3, micro_batch_size=4) == [[[0]], [None], [None]]


class Recorder(torch.optim.Optimizer):
    """Keeps each step's gradients instead of applying them (lets tests compare raw gradients)."""

    def __init__(self, params):
        super().__init__(params, {})
        self.grads = []

    def step(self, closure=None):
        self.grads.append([p.grad.clone() if p.grad is not None else torch.zeros_like(p)
                           for g in self.param_groups for p in g["params"]])


@pytest.fixture(scope="module")
def model(tiny_qwen3_path):
    return load_model(tiny_qwen3_path)


def batch():
    g = torch.Generator().manual_seed(3)
    out = []
    for i, (p, r) in enumerate([(6, 20), (3, 4), (12, 9), (2, 30), (7, 1), (9, 14), (4, 7), (5, 25)]):
        ids = torch.randint(100, 150_000, (p + r,), generator=g).tolist()
        mask = [0 if 3 <= j < 6 else 1 for j in range(r)]
        out.append(Trajectory(trajectory_id=str(i), sample_index=i // 4, group=i // 4, prompt_ids=ids[:p],
                              response_ids=ids[p:], response_mask=mask, logprobs=[-5.0] * r, reward=float(i % 3)))
    return out


def step(model, trajs, algo, optim, ref_model=None, **kw):
    m = copy.deepcopy(model)
    opt = Recorder(m.parameters())
    options = StepOptions(algo, optim, pad_id=0, temperature=0.9, max_response_tokens=32, **kw)
    metrics = train_step(m, opt, trajs, options, ref_model=ref_model)
    return metrics, opt.grads


def close(a, b, tol=1e-5):
    return all(float((x - y).norm()) <= tol * float(y.norm()) + 1e-9 for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("mode", MODES)
def test_token_budget_micro_batches_give_the_full_batch_gradient(model, mode):
    algo = AlgorithmConfig(loss_agg=mode, mini_batches=2)
    full, full_grads = step(model, batch(), algo, OptimConfig(micro_batch_size=8, grad_clip=1e9))
    budget, budget_grads = step(model, batch(), algo, OptimConfig(max_tokens_per_micro_batch=24, grad_clip=1e9))
    assert full["grad_norm"] > 0 and abs(budget["grad_norm"] - full["grad_norm"]) <= 1e-5 * full["grad_norm"]
    assert len(full_grads) == 2 and all(close(b, f) for b, f in zip(budget_grads, full_grads, strict=True))
    assert budget["padding_fraction"] == 0 and budget["trained_tokens"] == full["trained_tokens"] == 91
    assert budget["trainer_tokens_per_s"] > 0 and budget["trainer_peak_mb"] > 0


# Each aggregation with the token-level loss, and the sequence-level one (gspo: one ratio per sequence).
@pytest.mark.parametrize("mode, loss", [(m, "ppo_clip") for m in MODES] + [("seq-mean-token-mean", "gspo")])
def test_two_ranks_sum_to_the_one_rank_gradient(model, mode, loss):
    algo = AlgorithmConfig(loss=loss, loss_agg=mode, loss_options={"kl_coef": 0.1}, ppo_epochs=2)
    optim = OptimConfig(micro_batch_size=2, grad_clip=1e9)
    ref = copy.deepcopy(model)
    with torch.no_grad():  # a reference policy that differs, so the KL term has a gradient
        ref.model.norm.weight.mul_(1.5)
    one, one_grads = step(model, batch(), algo, optim, ref_model=ref)
    ranks = [step(model, batch(), algo, optim, ref_model=ref, rank=r, world_size=2) for r in (0, 1)]
    for epoch in range(2):  # epoch 2 is after a no-op step (the Recorder applies nothing): same weights
        summed = [a + b for a, b in zip(ranks[0][1][epoch], ranks[1][1][epoch], strict=True)]
        assert close(summed, one_grads[epoch])
    assert abs(ranks[0][0]["loss"] + ranks[1][0]["loss"] - one["loss"]) <= 1e-5 * abs(one["loss"]) + 1e-7
    # Balanced by tokens, rank 0 got 3 long sequences (2 micro-batches of 2) and rank 1 five short ones
    # (3): rank 0 ran one zero-weight dummy step to keep in step, and its gradient is still exact.
    assert ranks[0][0]["padding_fraction"] > 0 and ranks[1][0]["padding_fraction"] == 0


def test_token_budget_on_a_real_tiny_rollout_keeps_grad_norm(tmp_path):
    """``toolrl train examples/tiny.yaml optim.max_tokens_per_micro_batch=128``: same rollouts, same
    gradient norm as the default micro-batching."""
    from pathlib import Path

    from toolrl.processes.controller import batch_for_step
    from toolrl.processes.in_process import build_local_run
    from toolrl.rollout import run_rollouts

    tiny = Path(__file__).resolve().parents[1] / "examples" / "tiny.yaml"
    config = load_config(tiny, [f"trainer.output_dir={tmp_path}", "rollout.max_new_tokens=16"])

    async def rollouts():
        run = await build_local_run(config)
        prompts = batch_for_step(run.samples, 0, config.data.batch_size, config.trainer.seed, config.data.shuffle)
        trajs = await run_rollouts(run.ctx, prompts, config.rollout.n, seed=5, id_prefix="t1-")
        await run.rollouts.close()
        return run.model, trajs

    model, trajs = asyncio.run(rollouts())
    assert len(trajs) == 8 and max(len(t.prompt_ids) + len(t.response_ids) for t in trajs) > 128
    # The random tiny model earns the same (zero) reward everywhere, which gives no gradient: rewards
    # that differ within each group make the comparison mean something.
    for i, t in enumerate(trajs):
        t.reward = float(i % 2)
    results = []
    for optim in (config.optim, config.optim.model_copy(update={"max_tokens_per_micro_batch": 128})):
        m = copy.deepcopy(model)
        options = StepOptions(config.algorithm, optim, pad_id=0, temperature=config.rollout.temperature,
                              max_response_tokens=config.rollout.max_response_tokens)
        results.append(train_step(m, torch.optim.AdamW(m.parameters(), lr=optim.lr), trajs, options))
    default, budget = results
    assert default["grad_norm"] > 0
    assert abs(budget["grad_norm"] - default["grad_norm"]) <= 1e-4 * default["grad_norm"]
    assert default["lp_mismatch"] < 1e-3 and budget["lp_mismatch"] < 1e-3
