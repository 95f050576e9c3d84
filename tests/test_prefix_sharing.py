"""Prefix-shared (tree) packing: common prefixes run once, with the unshared packing's loss and gradients."""

import copy
import logging
import random

import pytest
import torch
from test_microbatch import Recorder
from toolrl.config import AlgorithmConfig, OptimConfig
from toolrl.model_sources import load_model
from toolrl.training import packing
from toolrl.training.microbatch import plan, tree_pieces
from toolrl.training.packing import build_batch, input_tokens
from toolrl.training.prefix_tree import MIN_SHARED_TOKENS, layout
from toolrl.training.step import StepOptions, policy_loss, response_logprobs, train_step
from toolrl.trajectory import Trajectory


@pytest.fixture(scope="module")
def model(tiny_qwen3_path):
    return load_model(tiny_qwen3_path)


def ids(rng, n):
    return [rng.randrange(100, 150_000) for _ in range(n)]


def traj(prompt, response, mask=None, group=0):
    mask = [1] * len(response) if mask is None else mask
    return Trajectory(trajectory_id="x", sample_index=0, group=group, prompt_ids=prompt, response_ids=response,
                      response_mask=mask, logprobs=[-1.0] * len(response))


def shared_prompt():
    """Two groups of three with 40-token prompts; one response has a tool span, one ends untrained."""
    rng = random.Random(0)
    out = []
    for g in range(2):
        prompt = ids(rng, 40)
        out += [traj(prompt, ids(rng, 9), [1, 1, 1, 0, 0, 0, 1, 1, 1], g),
                traj(prompt, ids(rng, 5), group=g), traj(prompt, ids(rng, 12), [1] * 6 + [0] * 6, g)]
    return out


def common_first_turn():
    """A group whose first turn (an assistant call and its tool output) is common to three of four
    samples, two of which also share part of the second turn; plus a sample identical to another."""
    rng = random.Random(1)
    prompt, turn, second = ids(rng, 36), ids(rng, 12), ids(rng, 4)
    turn_mask = [1] * 6 + [0] * 6
    out = [traj(prompt, turn + second + ids(rng, 5), turn_mask + [1] * 9),
           traj(prompt, turn + second + ids(rng, 3), turn_mask + [1] * 7),
           traj(prompt, turn + ids(rng, 8), turn_mask + [1] * 8),
           traj(prompt, ids(rng, 10))]
    return [*out, copy.deepcopy(out[2])]


def nothing_shared():
    """Different prompts that begin with the same few chat-template tokens (too few to share)."""
    rng = random.Random(2)
    head = ids(rng, 3)
    return [traj(head + ids(rng, 30), ids(rng, 6), group=g) for g in range(3)]


def loss_and_grads(model, trajs, share, processor=None, max_len=32.0):
    """One policy-loss backward over ``trajs`` packed with or without shared prefixes: the batch, the
    log-probs, the loss and every parameter's gradient (``processor``: a vision model's)."""
    batch = build_batch(trajs, [0.5 - 0.3 * i for i in range(len(trajs))], share_prefixes=share, processor=processor)
    model.zero_grad(set_to_none=True)
    lp = response_logprobs(model, batch, chunk_size=7)
    norm = {"tokens": float(batch.response_mask.sum()), "seqs": float(len(trajs)), "max_len": max_len}
    loss, _ = policy_loss(lp, lp.detach() + 0.01, batch, AlgorithmConfig(tis_cap=2.0), norm)
    loss.backward()
    return batch, lp.detach(), loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def assert_same(want, got):
    _, want_lp, want_loss, want_grads = want
    _, got_lp, got_loss, got_grads = got
    assert torch.allclose(got_lp, want_lp, atol=1e-5, rtol=0)
    assert abs(float(got_loss - want_loss)) <= 1e-6 * abs(float(want_loss))
    for name, g in want_grads.items():
        assert float((got_grads[name] - g).norm()) <= 1e-6 * float(g.norm()), name


@pytest.mark.parametrize("case", [shared_prompt, common_first_turn, nothing_shared])
@pytest.mark.parametrize("variant", ["sdpa", "gradient-checkpointing", "eager"])
def test_tree_gives_the_unshared_loss_and_gradients(model, case, variant):
    m = copy.deepcopy(model).train()
    if variant == "gradient-checkpointing":
        m.gradient_checkpointing_enable()
    if variant == "eager":  # the tree as one dense mask
        m.config._attn_implementation = "eager"
    trajs = case()
    unshared = loss_and_grads(m, trajs, share=False)
    shared = loss_and_grads(m, trajs, share=True)
    assert_same(unshared, shared)
    batch = shared[0]
    assert batch.total_tokens == unshared[0].tokens == sum(len(input_tokens(t)) for t in trajs)
    if case is nothing_shared:
        assert batch.attention is None and batch.tokens == batch.total_tokens
    elif case is shared_prompt:  # each group's 40-token prompt once instead of three times
        assert batch.tokens == batch.total_tokens - 2 * 2 * 40
    else:  # the prompt once (5 samples), the first turn once (4), the 4 common second-turn tokens (2) and
        # the duplicate's last 7 tokens once
        assert batch.tokens == batch.total_tokens - 4 * 36 - 3 * 12 - 4 - 7


def test_attention_without_tree_support_runs_unshared_and_says_so_once(model, caplog, monkeypatch, unknown_kernel):
    """An attention implementation toolrl does not know gets the unshared row."""
    packing._warn_unshared.cache_clear()
    m = copy.deepcopy(model).train()
    trajs = common_first_turn()
    want = loss_and_grads(m, trajs, share=False)
    m.config._attn_implementation = unknown_kernel
    with caplog.at_level(logging.WARNING, logger="toolrl.training.packing"):
        got = loss_and_grads(m, trajs, share=True)
        loss_and_grads(m, trajs, share=True)
    assert [r.getMessage() for r in caplog.records if "cannot take a prefix-shared" in r.getMessage()] == [
        "attention 'test_kernel' cannot take a prefix-shared (tree) batch: each sequence runs its shared prefix "
        "again, as without optim.share_prefixes"]
    # the kernel against toolrl's own sdpa path: the same computation up to kernel rounding
    _, want_lp, want_loss, want_grads = want
    _, got_lp, got_loss, got_grads = got
    assert torch.allclose(got_lp, want_lp, atol=1e-5, rtol=0)
    for name, g in want_grads.items():
        assert float((got_grads[name] - g).norm()) <= 1e-5 * float(g.norm()), name


def test_layout_paths_spell_each_sequence_with_its_positions():
    rng = random.Random(3)
    a = ids(rng, MIN_SHARED_TOKENS)
    seqs = [a + [1, 2, 3], a + [1, 2], a + [1, 2, 9, 9], a, ids(rng, 50), [], a[:5] + ids(rng, 40)]
    tree = layout(seqs)
    for seq, path in zip(seqs, tree.paths, strict=True):
        assert [tree.ids[r] for r in path] == seq
        assert [tree.positions[r] for r in path] == list(range(len(seq)))
    # a once, then [1, 2] once, then 3 and 9 9; the last (5 tokens of a) and the random one unshared
    spans = [(s.end - s.start, len(s.context)) for s in tree.spans]
    assert spans == [(MIN_SHARED_TOKENS, 0), (2, MIN_SHARED_TOKENS), (1, MIN_SHARED_TOKENS + 2),
                     (2, MIN_SHARED_TOKENS + 2), (45, 0), (50, 0)]
    assert len(tree.ids) == sum(n for n, _ in spans)


def test_a_common_start_shorter_than_the_minimum_is_not_shared():
    rng = random.Random(4)
    head = ids(rng, MIN_SHARED_TOKENS - 1)
    seqs = [head + ids(rng, 10), head + ids(rng, 10)]
    assert not layout(seqs).shared and len(layout(seqs).ids) == 2 * (MIN_SHARED_TOKENS + 9)
    assert layout(seqs, min_shared=MIN_SHARED_TOKENS - 1).shared
    assert not layout([head + [5], head + [5]], share=False).shared


def test_tree_pieces_count_shared_tokens_once_and_cut_between_continuations():
    rng = random.Random(5)
    prompt = ids(rng, 40)
    seqs = [prompt + ids(rng, 10) for _ in range(4)] + [ids(rng, 50)]
    # 40 + 3 × 10 fills a 70-token budget; the fourth continuation starts a piece of its own (50)
    assert tree_pieces(range(5), seqs, micro_batch_size=8, max_tokens=70) == [([0, 1, 2], 70), ([3], 50),
                                                                              ([4], 50)]
    assert tree_pieces(range(5), seqs, micro_batch_size=8) == [([0, 1, 2, 3], 80), ([4], 50)]
    assert tree_pieces(range(5), seqs, micro_batch_size=2) == [([0, 1], 60), ([2, 3], 60), ([4], 50)]
    # whole pieces go to micro-batches: 80 | 50 under a 100-token budget, never a group split
    assert plan(range(5), [50] * 5, 1, 8, max_tokens=100, seqs=seqs) == [[[0, 1, 2, 3], [4]]]
    # two ranks balanced by computed tokens (80 against 50), not by sequences
    assert plan(range(5), [50] * 5, 2, 8, seqs=seqs) == [[[0, 1, 2, 3]], [[4]]]


def grpo_batch():
    """Two groups of four: shared prompts, one group with a common first turn; rewards vary."""
    out = shared_prompt()[:3] + common_first_turn()[:4]
    for i, t in enumerate(out):
        t.group, t.reward = i // 4, float(i % 3)
    return [*out, traj(out[0].prompt_ids, [7, 8, 9], group=1)]


@pytest.mark.parametrize("optim", [{"max_tokens_per_micro_batch": 80}, {"micro_batch_size": 3}])
def test_grpo_step_with_shared_prefixes_gives_the_unshared_gradients(model, optim):
    def step(share, **kw):
        m = copy.deepcopy(model)
        opt = Recorder(m.parameters())
        options = StepOptions(AlgorithmConfig(mini_batches=2, ppo_epochs=2), OptimConfig(
            share_prefixes=share, grad_clip=1e9, **optim), pad_id=0, temperature=0.9, max_response_tokens=32, **kw)
        return train_step(m, opt, grpo_batch(), options), opt.grads

    (want, want_grads), (got, got_grads) = step(False), step(True)
    ranks = [step(True, rank=r, world_size=2) for r in (0, 1)]
    # The plans group the micro-batches differently, so their losses are summed in another order: the
    # positive and negative parts cancel to a smaller total (hence 1e-5, as in test_microbatch).
    assert abs(got["loss"] - want["loss"]) <= 1e-5 * abs(want["loss"])
    assert len(got_grads) == len(want_grads) == 4
    assert want["prefix_share"] == 0 and want["trainer_tokens_total"] == got["trainer_tokens_total"]
    assert got["trainer_tokens_computed"] == sum(r[0]["trainer_tokens_computed"] for r in ranks)
    assert got["prefix_share"] == 1 - got["trainer_tokens_computed"] / got["trainer_tokens_total"] > 0.3
    for update in range(4):
        summed = [a + b for a, b in zip(ranks[0][1][update], ranks[1][1][update], strict=True)]
        for w, g, s in zip(want_grads[update], got_grads[update], summed, strict=True):
            assert float((g - w).norm()) <= 1e-6 * float(w.norm()) + 1e-12
            assert float((s - w).norm()) <= 1e-6 * float(w.norm()) + 1e-12


@pytest.mark.parametrize("setting", ["lora", "stale"])
def test_shared_prefixes_under_lora_and_the_decoupled_objective(model, setting):
    """With adapters (only they train) and with behaviour log-probs from older weights (importance
    weights ≠ 1, some truncated), the tree gives the unshared loss and gradients."""
    from toolrl.config import LoraConfig
    from toolrl.modeling.adapters import apply_lora
    from toolrl.training.lora import trainable_parameters

    trajs = grpo_batch()
    if setting == "stale":
        g = torch.Generator().manual_seed(3)
        for t in trajs:
            t.logprobs = (-11.9 + (torch.rand(len(t.response_ids), generator=g) - 0.5) * 1.6).tolist()

    def step(share):
        m = copy.deepcopy(model)
        if setting == "lora":
            apply_lora(m, LoraConfig(r=4))
            torch.manual_seed(0)
            for p in trainable_parameters(m):  # peft starts B at zero: give every adapter a gradient
                torch.nn.init.normal_(p, std=0.02)
        opt = Recorder(trainable_parameters(m))
        options = StepOptions(AlgorithmConfig(mini_batches=2, tis_cap=1.2),
                              OptimConfig(share_prefixes=share, grad_clip=1e9, micro_batch_size=3),
                              pad_id=0, temperature=1.0, max_response_tokens=32)
        return train_step(m, opt, copy.deepcopy(trajs), options), opt.grads

    (want, want_grads), (got, got_grads) = step(False), step(True)
    assert got["prefix_share"] > 0.3 and abs(got["loss"] - want["loss"]) <= 1e-5 * abs(want["loss"])
    if setting == "stale":
        assert got["is_truncated_frac"] == want["is_truncated_frac"] > 0
    assert len(want_grads) == len(got_grads) == 2
    for w_step, g_step in zip(want_grads, got_grads, strict=True):
        for w, g in zip(w_step, g_step, strict=True):
            assert float((g - w).norm()) <= 1e-6 * float(w.norm()) + 1e-12
