import asyncio

import pytest
import torch
from toolrl.config import AlgorithmConfig, OptimConfig
from toolrl.engines import ModelSource, SamplingParams
from toolrl.model_sources import load_model
from toolrl.training.step import (
    StepOptions,
    aggregate,
    build_batch,
    group_advantages,
    response_logprobs,
    train_step,
)
from toolrl.trajectory import Trajectory


def test_group_advantages():
    adv = group_advantages([1.0, 0.0, 0.5, 0.5, 2.0], [0, 0, 1, 1, 2])
    assert adv[0] == pytest.approx(0.7071, abs=1e-3) and adv[1] == pytest.approx(-0.7071, abs=1e-3)
    assert adv[2:] == [0.0, 0.0, 0.0]  # equal rewards and a group of one carry no signal
    assert group_advantages([3.0, 1.0], [0, 0], norm_by_std=False) == [1.0, -1.0]


def test_aggregation_modes():
    per_token = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    norm = {"tokens": 4.0, "seqs": 2.0, "max_len": 8.0}
    assert aggregate(per_token, mask, "token-mean", norm) == pytest.approx(10 / 4)
    assert aggregate(per_token, mask, "seq-mean-token-mean", norm) == pytest.approx((2 + 4) / 2)
    assert aggregate(per_token, mask, "seq-mean-token-sum-norm", norm) == pytest.approx(10 / (8 * 2))


@pytest.fixture(scope="module")
def model(tiny_qwen3_path):
    torch.manual_seed(0)
    return load_model(tiny_qwen3_path)


def traj(prompt, response, mask=None, reward=0.0, group=0, logprobs=None):
    mask = mask or [1] * len(response)
    return Trajectory(trajectory_id="x", sample_index=0, group=group, prompt_ids=prompt, response_ids=response,
                      response_mask=mask, logprobs=logprobs or [0.0] * len(response), reward=reward)


def seq_logprob(model, t):
    with torch.no_grad():
        lp = response_logprobs(model, build_batch([t], [0.0]))
    return float((lp[0] * torch.tensor(t.response_mask, dtype=torch.float32)).sum())


def test_logprobs_match_a_plain_full_forward(model):
    t = traj([11, 12, 13, 14], [21, 22, 23], mask=[1, 0, 1])
    with torch.no_grad():
        full = torch.log_softmax(model(torch.tensor([[11, 12, 13, 14, 21, 22, 23]])).logits[0].float(), -1)
    expected = [full[3 + j, tok] for j, tok in enumerate([21, 22, 23])]
    with torch.no_grad():
        got = response_logprobs(model, build_batch([t, traj([5], [6])], [0.0, 0.0]))[0]
    # The head runs only where a token is trained: the tool-output position (mask 0) gets nothing.
    assert torch.allclose(got[[0, 2]], torch.stack(expected)[[0, 2]], atol=1e-5) and got[1] == 0


def test_one_step_moves_logprobs_the_way_advantages_say(model):
    import copy

    m = copy.deepcopy(model)
    good = traj([101, 102, 103], [201, 202, 203, 204], reward=1.0)
    bad = traj([101, 102, 103], [301, 302, 303, 304], reward=0.0)
    # A tool span (mask 0) inside the good response must not be trained.
    tool_span = traj([101, 102, 103], [201, 202, 999, 204], mask=[1, 1, 0, 1], reward=1.0)
    before = [seq_logprob(m, t) for t in (good, bad)]
    masked_before = seq_logprob(m, traj([101, 102, 103, 201, 202], [999]))
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    metrics = train_step(m, opt, [good, bad, tool_span], StepOptions(AlgorithmConfig(), OptimConfig(micro_batch_size=2),
                                                                    pad_id=0, temperature=1.0, max_response_tokens=8))
    after = [seq_logprob(m, t) for t in (good, bad)]
    assert after[0] > before[0] + 0.01 and after[1] < before[1] - 0.01, (before, after)
    assert metrics["grad_norm"] > 0 and metrics["trained_tokens"] == 11
    # The masked token's own probability moved far less than the trained ones (only via shared weights).
    masked_after = seq_logprob(m, traj([101, 102, 103, 201, 202], [999]))
    assert abs(masked_after - masked_before) < abs(after[0] - before[0]) / 4


def test_gradient_accumulation_equals_one_big_batch(model):
    import copy

    trajs = [traj([1, 2, 3][: 1 + i % 3], [10 + i, 20 + i, 30 + i][: 1 + i % 3], reward=float(i % 2), group=i // 4)
             for i in range(8)]
    params = []
    for micro in (8, 3, 1):
        m = copy.deepcopy(model)
        opt = torch.optim.SGD(m.parameters(), lr=1.0)
        train_step(m, opt, trajs, StepOptions(AlgorithmConfig(loss_agg="seq-mean-token-mean"),
                                             OptimConfig(micro_batch_size=micro, grad_clip=1e9), pad_id=0,
                                             temperature=1.0, max_response_tokens=8))
        params.append(torch.cat([p.detach().flatten() for p in m.parameters()]))
    start = torch.cat([p.detach().flatten() for p in model.parameters()])
    assert (params[0] - start).abs().max() > 1e-3  # the step did move the weights
    # Equal up to float summation order.
    assert (params[0] - params[1]).abs().max() < 1e-5 and (params[0] - params[2]).abs().max() < 1e-5


@pytest.mark.parametrize("which", ["qwen3", "gemma3", "gpt-oss", "mistral"])
def test_trainer_logprobs_agree_with_engine_logprobs(model, windowed, tiny_gpt_oss, tiny_mistral, tiny_qwen3_path,
                                                     which):
    """fp32, same weights: the engine's sampling logprobs vs the trainer's recomputation (also for
    models whose sliding window is shorter than the sequences; gpt-oss with its sinks, eager)."""
    import copy

    from toolrl.engines.transformers import TransformersEngine
    from toolrl.model_sources import load_tokenizer

    model = {"qwen3": model, "gemma3": windowed, "gpt-oss": tiny_gpt_oss, "mistral": tiny_mistral}[which]
    model = model if which == "qwen3" else copy.deepcopy(model).eval()
    tok = load_tokenizer(tiny_qwen3_path)
    engine = TransformersEngine.create(ModelSource(tiny_qwen3_path, module=model, tokenizer=tok), {})

    async def sample():
        prompts = [tok.encode(p) for p in ("What is 2+2?", "Hello there, how are", "x")]
        gens = await asyncio.gather(*(engine.generate(p, SamplingParams(temperature=0.7, max_new_tokens=24, seed=i), 2)
                                      for i, p in enumerate(prompts)))
        return [traj(p, g.token_ids, logprobs=g.logprobs) for p, gs in zip(prompts, gens) for g in gs]

    trajs = asyncio.run(sample())
    with torch.no_grad():
        lp = response_logprobs(model, build_batch(trajs, [0.0] * len(trajs)), temperature=0.7)
    diffs = [abs(float(lp[i, j]) - t.logprobs[j]) for i, t in enumerate(trajs) for j in range(len(t.response_ids))]
    assert sum(diffs) / len(diffs) < 1e-3, max(diffs)


def hand_built():
    """Two sequences, four trained tokens (the second has a tool token, mask 0, in the middle), with
    behaviour (engine), proximal and new logprobs chosen so every case of the objective occurs."""
    from toolrl.training.packing import build_batch as pack

    trajs = [traj([1], [5, 6], logprobs=[-1.0, -2.0]), traj([1], [7, 8, 9], mask=[1, 0, 1], logprobs=[-0.5, -3.0, -1.0])]
    batch = pack(trajs, [1.0, -1.0])
    prox = torch.tensor([[-1.0, -1.5, 0.0], [-1.2, 0.0, -0.2]])
    new = torch.tensor([[-0.9, -1.6, 0.0], [-1.2, 0.0, -0.6]], requires_grad=True)
    return batch, prox, new


def test_decoupled_objective_exact_values_and_gradient():
    import math

    from toolrl.training.step import policy_loss

    batch, prox, new = hand_built()
    cfg = AlgorithmConfig(loss_options={"clip_eps_low": 0.2, "clip_eps_high": 0.28}, tis_cap=2.0)
    loss, stats = policy_loss(new, prox, batch, cfg, {"tokens": 4.0, "seqs": 2.0, "max_len": 8.0})
    # Importance weights π_prox / π_behav at the trained tokens; the last is above the cap.
    w = [math.exp(-1.0 + 1.0), math.exp(-1.5 + 2.0), math.exp(-1.2 + 0.5), math.exp(-0.2 + 1.0)]
    r = [math.exp(0.1), math.exp(-0.1), 1.0, math.exp(-0.4)]  # π_θ / π_prox; the last is below 1 - 0.2
    # A = +1: -r (inside the clip range). A = -1: max(r, clip(r)) = r, then the clipped 0.8.
    per_token = [-r[0] * w[0], -r[1] * w[1], r[2] * w[2], 0.8 * min(w[3], 2.0)]
    assert loss.item() == pytest.approx(sum(per_token) / 4, rel=1e-6)
    assert stats["tokens"] == 4 and stats["clipped"] == 1 and stats["is_truncated"] == 1
    assert stats["is_weight_sum"] == pytest.approx(sum(w), rel=1e-6)
    assert stats["is_weight_max"] == pytest.approx(w[3], rel=1e-6) and stats["is_weight_min"] == pytest.approx(w[2], rel=1e-6)
    loss.backward()
    # d/dnew of -A·w·r is -A·w·r; the clipped token gets no gradient, nor the tool token.
    expected = torch.tensor([[-w[0] * r[0], -w[1] * r[1], 0.0], [w[2] * r[2], 0.0, 0.0]]) / 4
    assert torch.allclose(new.grad, expected, atol=1e-6)


def test_tis_cap_none_leaves_the_weight_out_but_reports_it():
    import math

    from toolrl.training.step import policy_loss

    batch, prox, new = hand_built()
    loss, stats = policy_loss(new, prox, batch, AlgorithmConfig(tis_cap=None), {"tokens": 4.0, "seqs": 2.0, "max_len": 8.0})
    assert loss.item() == pytest.approx((-math.exp(0.1) - math.exp(-0.1) + 1.0 + 0.8) / 4, rel=1e-6)
    assert stats["is_truncated"] == 0 and stats["is_weight_max"] == pytest.approx(math.exp(0.8), rel=1e-6)
    # A lower cap truncates more: both weights above 1.2.
    _, low = policy_loss(new, prox, batch, AlgorithmConfig(tis_cap=1.2), {"tokens": 4.0, "seqs": 2.0, "max_len": 8.0})
    assert low["is_truncated"] == 2


def stale_batch(model, seed=0):
    """Trajectories in two groups whose behaviour logprobs are the model's own plus noise (as if sampled
    by older weights), and the model's own logprobs (the proximal ones of a one-update step)."""
    g = torch.Generator().manual_seed(seed)
    trajs = [traj([3 + i, 40 + i, 7], torch.randint(100, 5000, (3 + i % 3,), generator=g).tolist(),
                  reward=float(i % 3), group=i // 4) for i in range(8)]
    with torch.no_grad():
        prox = response_logprobs(model, build_batch(trajs, [0.0] * 8))
    for i, t in enumerate(trajs):
        noise = (torch.rand(len(t.response_ids), generator=g) - 0.5) * 1.6  # log-weights in [-0.8, 0.8]
        t.logprobs = (prox[i, :len(t.response_ids)] - noise).tolist()
    return trajs, prox


def test_stale_behaviour_logprobs_weight_the_gradient_as_the_formula_says(model):
    import copy

    from test_microbatch import Recorder

    trajs, prox = stale_batch(model)
    on_policy = copy.deepcopy(trajs)
    for i, t in enumerate(on_policy):
        t.logprobs = prox[i, :len(t.response_ids)].tolist()
    algo, optim = AlgorithmConfig(tis_cap=1.5), OptimConfig(micro_batch_size=3, grad_clip=1e9)

    def grads(ts):
        m = copy.deepcopy(model)
        opt = Recorder(m.parameters())
        metrics = train_step(m, opt, ts, StepOptions(algo, optim, pad_id=0, temperature=1.0, max_response_tokens=8))
        return metrics, torch.cat([x.flatten() for x in opt.grads[0]])

    stale_metrics, stale = grads(trajs)
    on_metrics, on = grads(on_policy)
    # One update: π_θ = π_prox, so the gradient is that of -Σ A·min(π_prox/π_behav, cap)·log π_θ / tokens.
    m = copy.deepcopy(model)
    adv = group_advantages([t.reward for t in trajs], [t.group for t in trajs])
    batch = build_batch(trajs, adv)
    weight = torch.exp(prox - batch.engine_logprobs).clamp(max=1.5)
    lp = response_logprobs(m, batch)
    (-(batch.advantages[:, None] * weight * lp * batch.response_mask).sum() / batch.response_mask.sum()).backward()
    formula = torch.cat([p.grad.flatten() if p.grad is not None else torch.zeros(p.numel()) for p in m.parameters()])
    assert (stale - formula).norm() <= 1e-4 * formula.norm()
    assert (stale - on).norm() > 0.1 * on.norm()  # staleness changed the update
    assert on_metrics["is_weight_mean"] == pytest.approx(1.0, abs=1e-5) and on_metrics["is_truncated_frac"] == 0
    w = torch.exp(prox - batch.engine_logprobs)[batch.response_mask.bool()]
    assert stale_metrics["is_weight_mean"] == pytest.approx(float(w.mean()), rel=1e-5)
    assert float(w.max()) > 1.5 and stale_metrics["is_weight_max"] == pytest.approx(float(w.max()), rel=1e-5)
    assert stale_metrics["is_truncated_frac"] == pytest.approx(float((w > 1.5).float().mean()))
    assert stale_metrics["loss_tokens"] == float(batch.response_mask.sum())


def _reduce_on_rank(rank, port, outs, path):
    import json

    import torch.distributed as dist
    from toolrl.processes.trainer_rank import _group_metrics

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        group = _group_metrics(outs[rank])
    finally:
        dist.destroy_process_group()
    if rank == 0:
        with open(path, "w") as f:
            json.dump(group, f)


def test_two_ranks_metrics_reduce_to_the_one_rank_figures(model, tmp_path):
    """Each rank's share of a stale batch, reduced over a real gloo group: the token means, extremes
    and token counts are those of the whole batch on one rank."""
    import copy
    import json
    import socket

    from _processes import start_ranks

    trajs, _ = stale_batch(model, seed=1)
    algo, optim = AlgorithmConfig(tis_cap=1.5, ppo_epochs=2), OptimConfig(micro_batch_size=2, grad_clip=1e9)

    def metrics(rank=0, world_size=1):
        m = copy.deepcopy(model)
        return train_step(m, torch.optim.SGD(m.parameters(), lr=0.0), trajs,
                         StepOptions(algo, optim, pad_id=0, temperature=1.0, max_response_tokens=8, rank=rank,
                                     world_size=world_size))

    one = metrics()
    outs = [metrics(r, 2) for r in (0, 1)]
    assert outs[0]["loss_tokens"] != outs[1]["loss_tokens"]  # uneven shares: a plain mean would be wrong
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start_ranks(_reduce_on_rank, (port, outs, str(tmp_path / "group.json")), nprocs=2)
    group = json.loads((tmp_path / "group.json").read_text())
    for key in ("clip_frac", "lp_mismatch", "is_weight_mean", "is_weight_max", "is_weight_min", "is_truncated_frac",
                "loss_tokens"):
        assert group[key] == pytest.approx(one[key], rel=1e-5, abs=1e-7), key


def test_an_asynchronous_run_gets_a_default_cap():
    from pathlib import Path

    from toolrl.config import ASYNC_TIS_CAP, load_config

    tiny = Path(__file__).resolve().parents[1] / "examples" / "tiny.yaml"
    assert load_config(tiny).algorithm.tis_cap is None  # synchronous: on-policy, no weight
    assert load_config(tiny, ["trainer.max_staleness=1"]).algorithm.tis_cap == ASYNC_TIS_CAP == 2.0
    assert load_config(tiny, ["trainer.max_staleness=2", "algorithm.tis_cap=5"]).algorithm.tis_cap == 5.0
