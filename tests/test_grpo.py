import asyncio

import pytest
import torch
from toolrl.config import AlgorithmConfig, OptimConfig
from toolrl.engines import ModelSource, SamplingParams
from toolrl.grpo import aggregate, build_batch, group_advantages, grpo_step, response_logprobs
from toolrl.models import load_model
from toolrl.rollout import Trajectory


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
    metrics = grpo_step(m, opt, [good, bad, tool_span], AlgorithmConfig(), OptimConfig(micro_batch_size=2),
                        pad_id=0, temperature=1.0, max_response_tokens=8)
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
        grpo_step(m, opt, trajs, AlgorithmConfig(loss_agg="seq-mean-token-mean"),
                  OptimConfig(micro_batch_size=micro, grad_clip=1e9), pad_id=0, temperature=1.0,
                  max_response_tokens=8)
        params.append(torch.cat([p.detach().flatten() for p in m.parameters()]))
    start = torch.cat([p.detach().flatten() for p in model.parameters()])
    assert (params[0] - start).abs().max() > 1e-3  # the step did move the weights
    # Equal up to float summation order.
    assert (params[0] - params[1]).abs().max() < 1e-5 and (params[0] - params[2]).abs().max() < 1e-5


def test_trainer_logprobs_agree_with_engine_logprobs(model, tiny_qwen3_path):
    """fp32, same weights: the engine's sampling logprobs vs the trainer's recomputation."""
    from toolrl.engines.transformers import TransformersEngine
    from toolrl.models import load_tokenizer

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
