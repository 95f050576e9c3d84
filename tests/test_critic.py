"""The critic (toolrl.training.critic): values at trained tokens from the packed forward, the clipped
value loss by hand, an update that lowers it, two gloo ranks under FSDP2 equal to one, and a
checkpoint round trip."""

from __future__ import annotations

import copy
import socket

import pytest
import torch
from toolrl.training.critic import (
    CriticOptions,
    ValueModel,
    batch_values,
    critic_update,
    load_state,
    shard_critic,
    state,
    value_loss,
    value_metrics,
)
from toolrl.training.optimizer import OptimizerSettings, adamw
from toolrl.training.packing import build_batch
from toolrl.trajectory import Trajectory


def traj(i: int, prompt: list[int], response: list[int], mask: list[int], reward: float = 0.0) -> Trajectory:
    return Trajectory(trajectory_id=f"t{i}", sample_index=i, group=i // 2, prompt_ids=prompt, response_ids=response,
                      response_mask=mask, logprobs=[0.0] * len(response), reward=reward)


# Ragged responses with tool output (mask 0) in the middle, and one with nothing trained.
TRAJS = [traj(0, [11, 12, 13], [21, 22, 90, 91, 23], [1, 1, 0, 0, 1], 1.0),
         traj(1, [14, 15], [24, 25], [1, 1], 0.0),
         traj(2, [16, 17, 18, 19], [26, 92, 27], [1, 0, 1], 1.0),
         traj(3, [20], [93, 94], [0, 0], 0.0),
         traj(4, [31, 32], [33, 34, 35, 36], [1, 1, 1, 1], 0.5)]


@pytest.fixture(scope="module")
def lm(tiny_qwen3_path):
    from toolrl.model_sources import load_model

    return load_model(tiny_qwen3_path)


def critic_of(lm, seed: int = 0) -> ValueModel:
    critic = ValueModel.from_causal_lm(copy.deepcopy(lm))
    with torch.no_grad():  # a non-zero head, so values differ between tokens
        critic.head.weight.copy_(torch.randn(critic.head.weight.shape, generator=torch.Generator().manual_seed(seed)))
    return critic


def test_values_are_read_where_the_policy_reads_logprobs(lm):
    """Value of response token j: the head on the hidden state at the position predicting it (an
    unpacked forward of prompt + response[:j]); 0 at tool output and padding."""
    critic = critic_of(lm)
    batch = build_batch(TRAJS[:3], [0.0] * 3)
    with torch.no_grad():
        values = critic(batch)
        for i, t in enumerate(TRAJS[:3]):
            ids = torch.tensor([t.prompt_ids + t.response_ids])
            hidden = critic.backbone(input_ids=ids).last_hidden_state[0]
            for j, m in enumerate(t.response_mask):
                want = critic.head(hidden[len(t.prompt_ids) + j - 1]).item() if m else 0.0
                assert values[i, j].item() == pytest.approx(want, abs=1e-5), (i, j)
            assert (values[i, len(t.response_ids):] == 0).all()
    assert values.shape == (3, 5)


def test_a_fresh_head_values_everything_at_zero(lm):
    critic = ValueModel.from_causal_lm(copy.deepcopy(lm))
    assert torch.equal(batch_values(critic, TRAJS, CriticOptions()), torch.zeros(5, 5))


def test_clipped_value_loss_by_hand():
    values = torch.tensor([[1.0, 0.5, 7.0]], requires_grad=True)
    old = torch.tensor([[0.8, 0.5, 0.0]])
    returns = torch.tensor([[2.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss, figures = value_loss(values, old, returns, mask, clip=0.1, tokens=2.0)
    # token 0: (1 − 2)² = 1; clipped value 0.8 + 0.1 = 0.9: (0.9 − 2)² = 1.21, the larger (clipped)
    # token 1: (0.5 − 0)² = 0.25 either way; token 2 is untrained
    assert loss.item() == pytest.approx((1.21 + 0.25) / 2)
    assert figures == {"tokens": 2.0, "clipped": 1.0}
    loss.backward()
    # the clipped branch is flat in V; token 1: 2 · (0.5 − 0) / 2 tokens
    assert torch.allclose(values.grad, torch.tensor([[0.0, 0.5, 0.0]]))
    unclipped, _ = value_loss(values, old, returns, mask, clip=None, tokens=2.0)
    assert unclipped.item() == pytest.approx((1.0 + 0.25) / 2)


def test_value_metrics_by_hand():
    values = torch.tensor([[1.0, 2.0, 9.0], [3.0, 0.0, 0.0]])
    returns = torch.tensor([[1.0, 2.0, 5.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    got = value_metrics(values, returns, mask)
    # R = 1, 2, 4: Var 14/9; R − V = 0, 0, 1: Var 2/9; 1 − 2/14 = 6/7
    assert got["value_mean"] == pytest.approx(2.0) and got["return_mean"] == pytest.approx(7 / 3)
    assert got["explained_variance"] == pytest.approx(6 / 7)
    assert "explained_variance" not in value_metrics(values, torch.ones(2, 3), mask)


def returns_of(trajs, width: int) -> torch.Tensor:
    """Each trajectory's reward at every trained token (GAE with γ = λ = 1 and zero values)."""
    out = torch.zeros(len(trajs), width)
    for i, t in enumerate(trajs):
        out[i, :len(t.response_mask)] = t.reward * torch.tensor(t.response_mask, dtype=torch.float32)
    return out


def test_updates_lower_the_value_loss(lm):
    critic = ValueModel.from_causal_lm(copy.deepcopy(lm))
    optimizer = adamw(critic.parameters(), OptimizerSettings(lr=1e-2))
    options = CriticOptions(value_clip=None, micro_batch_size=2)
    returns = returns_of(TRAJS, 5)
    losses = []
    for _ in range(12):
        old = batch_values(critic, TRAJS, options)
        out = critic_update(critic, optimizer, TRAJS, old, returns, options)
        losses.append(out["value_loss"])
        assert out["value_tokens"] == 11.0
    assert losses[0] == pytest.approx(float((returns ** 2).sum() / 11), rel=1e-5)  # V = 0 at first
    assert losses[-1] < 0.25 * losses[0], losses
    mask = torch.tensor([t.response_mask + [0] * (5 - len(t.response_mask)) for t in TRAJS], dtype=torch.float32)
    assert value_metrics(batch_values(critic, TRAJS, options), returns, mask)["explained_variance"] > 0.4


def shared_group() -> list[Trajectory]:
    """A group of four on one 40-token prompt (ragged responses, one with a tool span, two with a common
    first turn) and a trajectory of another prompt."""
    import random

    rng = random.Random(7)

    def ids(n: int) -> list[int]:
        return [rng.randrange(100, 150_000) for _ in range(n)]

    prompt, turn = ids(40), ids(6)
    return [traj(0, prompt, turn + ids(5), [1] * 3 + [0] * 3 + [1] * 5, 1.0),
            traj(1, prompt, turn + ids(3), [1] * 3 + [0] * 3 + [1] * 3, 0.0),
            traj(2, prompt, ids(9), [1] * 9, 0.5),
            traj(3, prompt, ids(4), [1, 1, 0, 1], 1.0),
            traj(4, ids(35), ids(6), [1] * 6, 0.0)]


@pytest.mark.parametrize("micro", [{"micro_batch_size": 8}, {"micro_batch_size": 2},
                                   {"max_tokens_per_micro_batch": 70}])
def test_shared_prefixes_give_the_unshared_values_and_gradients(lm, micro):
    from test_microbatch import Recorder

    trajs = shared_group()
    returns = returns_of(trajs, 11) + torch.linspace(-1, 1, 11)

    def run(share: bool):
        critic = critic_of(lm, seed=3)
        options = CriticOptions(value_clip=0.2, grad_clip=1e9, mini_batches=1, share_prefixes=share, **micro)
        values = batch_values(critic, trajs, options)
        optimizer = Recorder(critic.parameters())
        # Old values off the current ones, so that some tokens are clipped and some are not.
        old = values + 0.3 * torch.sin(torch.arange(values.numel(), dtype=torch.float32)).view_as(values)
        out = critic_update(critic, optimizer, trajs, old, returns, options)
        return values, out, dict(zip([n for n, _ in critic.named_parameters()], optimizer.grads[0], strict=True))

    (want_v, want, want_grads), (got_v, got, got_grads) = run(False), run(True)
    # float32 through kernels of other shapes (a tree row against separate rows): equal up to rounding,
    # which differs by CPU (AVX-512 machines sum in another order), so the bounds are a few ulps of
    # the sums involved, not one.
    assert want_v.abs().sum() > 0 and torch.allclose(got_v, want_v, rtol=1e-5, atol=1e-5)
    assert 0 < want["value_clip_frac"] < 1 and got["value_clip_frac"] == want["value_clip_frac"]
    assert got["value_loss"] == pytest.approx(want["value_loss"], rel=1e-5)
    for name, w in want_grads.items():
        assert float(w.norm()) > 0 and float((got_grads[name] - w).norm()) <= 1e-4 * float(w.norm()), name
    # The group's prompt runs once per micro-batch holding its trajectories, not once per trajectory.
    assert want["critic_prefix_share"] == 0 and want["critic_tokens_total"] == got["critic_tokens_total"]
    assert got["critic_tokens_computed"] < got["critic_tokens_total"] - 40
    assert got["critic_prefix_share"] == 1 - got["critic_tokens_computed"] / got["critic_tokens_total"]


def test_checkpoint_round_trip(lm, tmp_path):
    import torch.distributed.checkpoint as dcp

    critic = critic_of(lm)
    optimizer = adamw(critic.parameters(), OptimizerSettings(lr=1e-3))
    options = CriticOptions()
    critic_update(critic, optimizer, TRAJS, batch_values(critic, TRAJS, options), returns_of(TRAJS, 5), options)
    dcp.save(state(critic, optimizer), checkpoint_id=str(tmp_path), no_dist=True)

    fresh = ValueModel.from_causal_lm(copy.deepcopy(lm))
    fresh_opt = adamw(fresh.parameters(), OptimizerSettings(lr=1e-3))
    loaded = state(fresh, fresh_opt)
    dcp.load(loaded, checkpoint_id=str(tmp_path), no_dist=True)
    load_state(fresh, fresh_opt, loaded)
    for (name, a), (_, b) in zip(critic.state_dict().items(), fresh.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    assert torch.equal(fresh.head.weight, critic.head.weight) and not torch.equal(fresh.head.weight, torch.zeros(1, 1))
    assert fresh_opt.state_dict()["state"][0]["step"] == optimizer.state_dict()["state"][0]["step"] == 1
    # The next update goes the same way from both.
    old = batch_values(critic, TRAJS, options)
    a = critic_update(critic, optimizer, TRAJS, old, returns_of(TRAJS, 5), options)
    b = critic_update(fresh, fresh_opt, TRAJS, old, returns_of(TRAJS, 5), options)
    assert a == b


def _rank(rank: int, world: int, port: int, path: str, queue) -> None:
    import torch.distributed as dist
    from toolrl.model_sources import load_model
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        critic = shard_critic(critic_of(load_model(path)), init_device_mesh("cpu", (world,)))
        optimizer = adamw(critic.parameters(), OptimizerSettings(lr=1e-2))
        options = CriticOptions(value_clip=0.05, micro_batch_size=1, rank=rank, world_size=world)
        old = batch_values(critic, TRAJS, options)
        out = critic_update(critic, optimizer, TRAJS, old, returns_of(TRAJS, 5), options)
        after = batch_values(critic, TRAJS, options)
        loss = torch.tensor([out["value_loss"]], dtype=torch.float64)
        dist.all_reduce(loss)  # each rank holds its share of the loss
        if rank == 0:
            # Plain lists: a tensor would travel as a handle into this process, gone once it exits.
            queue.put((old.tolist(), after.tolist(), float(loss), out["critic_grad_norm"]))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # two spawned processes: a couple of minutes on shared cores
def test_two_ranks_update_like_one(lm, tiny_qwen3_path):
    import torch.multiprocessing as mp
    from _processes import PRELOAD

    options = CriticOptions(value_clip=0.05, micro_batch_size=1)
    critic = critic_of(lm)
    optimizer = adamw(critic.parameters(), OptimizerSettings(lr=1e-2))
    old = batch_values(critic, TRAJS, options)
    out = critic_update(critic, optimizer, TRAJS, old, returns_of(TRAJS, 5), options)
    after = batch_values(critic, TRAJS, options)

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("forkserver")  # ranks forked from a server that imported torch once (start_ranks)
    ctx.set_forkserver_preload(PRELOAD)
    queue = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, 2, port, tiny_qwen3_path, queue)) for r in range(2)]
    for p in procs:
        p.start()
    old2, after2, loss2, norm2 = queue.get(timeout=300)
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    old2, after2 = torch.tensor(old2), torch.tensor(after2)
    assert torch.allclose(old2, old, atol=1e-6)
    assert loss2 == pytest.approx(out["value_loss"], abs=1e-6)
    assert norm2 == pytest.approx(out["critic_grad_norm"], rel=1e-4)
    assert torch.allclose(after2, after, atol=1e-5)
    assert not torch.allclose(after, old, atol=1e-3)  # the update moved the values


def test_a_trainer_rank_trains_its_critic_and_resume_restores_it(tiny_qwen3_path, tmp_path):
    """The trainer role with ``algorithm.advantage=gae``: values before the advantages (per-token,
    recorded for the traces), the critic's update and metrics; a checkpoint holds the critic, and a
    rank loading it takes the next step exactly as the one that wrote it."""
    from pathlib import Path

    from toolrl.algorithms.rules import with_critic
    from toolrl.config import load_config
    from toolrl.model_sources import load_model, load_tokenizer
    from toolrl.processes.trainer_rank import TrainerRank

    tiny = str(Path(__file__).resolve().parents[1] / "examples" / "tiny.yaml")
    cfg = with_critic(load_config(tiny, ["algorithm.advantage=gae", "critic.lr=0.01", "optim.micro_batch_size=2",
                                         "optim.eps=1e-6"]))

    def rank() -> TrainerRank:
        r = TrainerRank(cfg)
        r.setup(model=load_model(tiny_qwen3_path), tokenizer=load_tokenizer(tiny_qwen3_path))
        return r

    a = rank()
    assert {g["eps"] for g in a.critic.optimizer.param_groups} == {1e-6}  # optim.eps reaches the critic's AdamW
    first = a.step(TRAJS)
    assert first["value_loss"] == pytest.approx(float((returns_of(TRAJS, 5) ** 2).sum() / 11), rel=1e-5)
    assert first["value_mean"] == 0.0 and first["value_tokens"] == 11.0
    assert [len(x) for x in first["advantages"]] == [len(t.response_ids) for t in TRAJS]  # per token
    assert not torch.equal(a.critic.model.head.weight, torch.zeros_like(a.critic.model.head.weight))
    a.save(str(tmp_path))
    second = a.step(TRAJS)
    assert second["value_mean"] != 0.0 and "explained_variance" in second

    b = rank()
    b.load(str(tmp_path))
    again = b.step(TRAJS)
    def steady(m):
        return {k: v for k, v in m.items() if not k.endswith("_per_s") and k != "trainer_peak_mb"}
    assert steady(again) == steady(second)
    for (name, x), (_, y) in zip(a.critic.model.state_dict().items(), b.critic.model.state_dict().items(), strict=True):
        assert torch.equal(x, y), name


def test_a_gae_step_reports_the_critics_saving(tiny_qwen3_path):
    """With ``optim.share_prefixes`` a GAE step's critic packs the group's prompt once, like the policy,
    and says so in the step's metrics."""
    from pathlib import Path

    from toolrl.algorithms.rules import with_critic
    from toolrl.config import load_config
    from toolrl.model_sources import load_model, load_tokenizer
    from toolrl.processes.trainer_rank import TrainerRank

    tiny = str(Path(__file__).resolve().parents[1] / "examples" / "tiny.yaml")
    cfg = with_critic(load_config(tiny, ["algorithm.advantage=gae", "optim.micro_batch_size=8",
                                         "optim.share_prefixes=true"]))
    rank = TrainerRank(cfg)
    rank.setup(model=load_model(tiny_qwen3_path), tokenizer=load_tokenizer(tiny_qwen3_path))
    trajs = shared_group()
    out = rank.step(trajs)
    total = sum(len(t.prompt_ids) + len(t.response_ids) - t.response_mask[::-1].index(1) - 1 for t in trajs)
    assert out["critic_tokens_total"] == out["trainer_tokens_total"] == total
    # The 40-token prompt once instead of four times, and the common first turn once instead of twice.
    assert out["critic_tokens_computed"] == out["trainer_tokens_computed"] == total - 3 * 40 - 6
    assert out["critic_prefix_share"] == out["prefix_share"] == pytest.approx(1 - (total - 126) / total)
