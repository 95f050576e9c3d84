import copy

import pytest
import torch
from toolrl.config import AlgorithmConfig
from toolrl.model_sources import load_model
from toolrl.modeling.attention import VARLEN_SDPA
from toolrl.training.packing import build_batch, input_length
from toolrl.training.step import policy_loss, response_logprobs
from toolrl.trajectory import Trajectory


@pytest.fixture(scope="module")
def model(tiny_qwen3_path):
    return load_model(tiny_qwen3_path)


def traj(prompt, response, mask, reward=0.0):
    return Trajectory(trajectory_id="x", sample_index=0, group=0, prompt_ids=prompt, response_ids=response,
                      response_mask=mask, logprobs=[0.0] * len(response), reward=reward)


def ragged():
    g = torch.Generator().manual_seed(1)

    def ids(n):
        return torch.randint(100, 150_000, (n,), generator=g).tolist()

    return [
        traj(ids(5), ids(9), [1, 1, 1, 0, 0, 0, 1, 1, 1]),  # a tool span inside the response
        traj(ids(17), ids(3), [1, 1, 1]),
        traj(ids(2), ids(30), [1] * 12 + [0] * 18),  # ends in untrained tokens: they are cut off
        traj(ids(8), ids(1), [1]),
    ]


def padded_logprobs(model, trajs):
    """The reference: right-padded rows with an attention mask, full logits, log-softmax, gather."""
    width = max(len(t.prompt_ids) + len(t.response_ids) for t in trajs)
    ids = torch.zeros((len(trajs), width), dtype=torch.long)
    attention = torch.zeros_like(ids)
    rwidth = max(len(t.response_ids) for t in trajs)
    out = []
    for i, t in enumerate(trajs):
        seq = t.prompt_ids + t.response_ids
        ids[i, : len(seq)] = torch.tensor(seq)
        attention[i, : len(seq)] = 1
    logp = torch.log_softmax(model(input_ids=ids, attention_mask=attention).logits.float(), -1)
    for i, t in enumerate(trajs):
        p = len(t.prompt_ids)
        # One gather a row: an index per token would give backward a whole-logits gradient per token.
        row = logp[i, torch.arange(p - 1, p - 1 + len(t.response_ids)), torch.tensor(t.response_ids)]
        out.append(torch.nn.functional.pad(row * torch.tensor(t.response_mask), (0, rwidth - len(row))))
    return torch.stack(out)


def loss_and_grads(model, trajs, lp_fn, share=False):
    batch = build_batch(trajs, [1.0, -0.5, 0.25, -1.0], share_prefixes=share)
    model.zero_grad(set_to_none=True)
    lp = lp_fn(batch)
    norm = {"tokens": float(batch.response_mask.sum()), "seqs": 4.0, "max_len": 32.0}
    loss, _ = policy_loss(lp, lp.detach(), batch, AlgorithmConfig(loss_agg="seq-mean-token-mean"), norm)
    loss.backward()
    return lp.detach(), loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("variant", ["sdpa", "gradient-checkpointing", "eager"])
def test_packed_batch_gives_the_padded_loss_and_gradients(model, variant):
    m = copy.deepcopy(model).train()
    if variant == "gradient-checkpointing":
        m.gradient_checkpointing_enable()
    if variant == "eager":
        m.config._attn_implementation = "eager"
    trajs = ragged()
    want_lp, want_loss, want = loss_and_grads(m, trajs, lambda b: padded_logprobs(m, trajs))
    got_lp, got_loss, got = loss_and_grads(m, trajs, lambda b: response_logprobs(m, b, chunk_size=5))
    assert (m.config._attn_implementation == VARLEN_SDPA) == (variant != "eager")
    assert torch.allclose(got_lp, want_lp, atol=1e-5, rtol=0)
    assert abs(float(got_loss - want_loss)) <= 1e-6 * max(1.0, abs(float(want_loss)))
    for name, g in want.items():
        assert float((got[name] - g).norm()) <= 1e-5 * float(g.norm()) + 1e-9, name


def with_shared_prompt():
    """Three samples of one 40-token prompt, two of them with a common first turn, and a fourth prompt."""
    g = torch.Generator().manual_seed(2)

    def ids(n):
        return torch.randint(100, 150_000, (n,), generator=g).tolist()

    prompt, turn = ids(40), ids(10)
    return [traj(prompt, turn + ids(6), [1] * 4 + [0] * 6 + [1] * 6), traj(prompt, turn + ids(3), [1] * 4 + [0] * 6 + [1] * 3),
            traj(prompt, ids(12), [1] * 12), traj(ids(20), ids(5), [1] * 5)]


@pytest.mark.parametrize(("which", "variant"), [("gemma3", "sdpa"), ("gemma3", "eager"), ("gemma3", "shared prefixes"),
                                              ("gemma3", "eager shared prefixes"), ("gpt-oss", "eager"),
                                              ("gpt-oss", "eager shared prefixes"), ("mistral", "shared prefixes"),
                                              ("mistral", "eager shared prefixes")])
def test_sliding_window_layers_keep_their_window_in_a_packed_row(windowed, tiny_gpt_oss, tiny_mistral, which,
                                                                 variant):
    """Gemma 3, gpt-oss (attention sinks, eager only; its mask functions never see position ids, so
    transformers cannot tell packed sequences apart for it) and Mistral (one window for every layer)
    with a 6-position window."""
    model = {"gemma3": windowed, "gpt-oss": tiny_gpt_oss, "mistral": tiny_mistral}[which]
    m = copy.deepcopy(model).train()
    if variant.startswith("eager"):
        m.config._attn_implementation = "eager"
    share = variant.endswith("shared prefixes")
    trajs = with_shared_prompt() if share else ragged()
    want_lp, want_loss, want = loss_and_grads(m, trajs, lambda b: padded_logprobs(m, trajs))
    got_lp, got_loss, got = loss_and_grads(m, trajs, lambda b: response_logprobs(m, b, chunk_size=5), share)
    assert torch.allclose(got_lp, want_lp, atol=1e-5, rtol=0)
    assert abs(float(got_loss - want_loss)) <= 1e-6 * max(1.0, abs(float(want_loss)))
    for name, g in want.items():
        assert float((got[name] - g).norm()) <= 1e-5 * float(g.norm()) + 1e-9, name


def test_packed_row_holds_only_needed_tokens():
    trajs = ragged()
    batch = build_batch(trajs, [0.0] * 4)
    # Each sequence stops before its last trained token; no padding anywhere.
    assert [input_length(t) for t in trajs] == [5 + 8, 17 + 2, 2 + 11, 8 + 0]
    assert batch.tokens == sum(input_length(t) for t in trajs) and batch.bounds == [0, 13, 32, 45, 53]
    assert batch.position_ids[0].tolist() == [*range(13), *range(19), *range(13), *range(8)]
    assert batch.head_pos.numel() == sum(sum(t.response_mask) for t in trajs)
    with pytest.raises(ValueError, match="empty prompt"):
        build_batch([traj([], [5, 6], [1, 1])], [0.0])
