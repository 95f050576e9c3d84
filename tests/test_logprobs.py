import pytest
import torch
from toolrl.training.logprobs import token_logprobs


def naive(h, head, targets, temperature):
    """The full computation: every position's fp32 logits kept for backward."""
    logits = head(h).float()
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    return torch.log_softmax(logits, -1).gather(-1, targets[:, None]).squeeze(-1)


def rel(a, b):
    return float((a - b).detach().norm() / b.detach().norm().clamp(min=1e-30))


@pytest.mark.parametrize("chunk, temperature, bias", [(7, 1.0, False), (16, 0.7, True), (1000, 1.3, False),
                                                      (1, 0.0, False)])
def test_chunked_equals_full_values_and_gradients(chunk, temperature, bias):
    torch.manual_seed(0)
    n, hidden, vocab = 37, 24, 1500
    head = torch.nn.Linear(hidden, vocab, bias=bias)
    h = torch.randn(n, hidden, requires_grad=True)
    targets = torch.randint(0, vocab, (n,))
    # A generic downstream loss: gradients of both signs, and exact zeros (masked positions).
    upstream = torch.randn(n) * (torch.arange(n) % 5 != 0)

    want_lp = naive(h, head, targets, temperature)
    want = torch.autograd.grad((want_lp * upstream).sum(), [h, *head.parameters()])
    got_lp = token_logprobs(h, head, targets, temperature, chunk_size=chunk)
    got = torch.autograd.grad((got_lp * upstream).sum(), [h, *head.parameters()])

    assert rel(got_lp, want_lp) <= 1e-6
    for g, w in zip(got, want, strict=True):
        assert rel(g, w) <= 1e-6


def test_half_precision_head_matches_its_naive_computation():
    torch.manual_seed(0)
    head = torch.nn.Linear(32, 800, bias=False).to(torch.bfloat16)
    h = torch.randn(20, 32, dtype=torch.bfloat16, requires_grad=True)
    targets = torch.randint(0, 800, (20,))
    want_lp = naive(h, head, targets, 0.8)
    want = torch.autograd.grad(want_lp.sum(), [h, head.weight])
    got_lp = token_logprobs(h, head, targets, 0.8, chunk_size=6)
    got = torch.autograd.grad(got_lp.sum(), [h, head.weight])
    assert got_lp.dtype == torch.float32 and rel(got_lp, want_lp) <= 1e-6  # same bf16 logits, fp32 after
    assert all(g.dtype == torch.bfloat16 and rel(g.float(), w.float()) <= 2e-2 for g, w in zip(got, want, strict=True))
    with pytest.raises(ValueError, match="chunk_size"):
        token_logprobs(h, head, targets, chunk_size=0)


def test_backward_keeps_one_chunk_of_logits_not_all():
    """Memory the head holds for backward: the hidden states and one log-sum-exp per position, never
    the (positions × vocabulary) logits."""
    n, hidden, vocab = 256, 8, 4000
    head = torch.nn.Linear(hidden, vocab, bias=False)
    h = torch.randn(n, hidden, requires_grad=True)
    saved = []

    def pack(t):
        saved.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        lp = token_logprobs(h, head, torch.zeros(n, dtype=torch.long), chunk_size=32)
    assert max(saved) < n * vocab / 8  # the largest saved tensor is the head weight, not logits
    lp.sum().backward()
    assert h.grad is not None and head.weight.grad is not None
