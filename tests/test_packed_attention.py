"""One attention call per layer over a packed row (modeling.packed_attention) against the loop of one
sdpa call per span: the same log-probs, loss and gradients, trees and sliding windows included."""

from __future__ import annotations

import copy

import pytest
import torch
from test_prefix_sharing import common_first_turn, loss_and_grads, nothing_shared, shared_prompt
from toolrl.modeling.packed_attention import RowPattern, attend
from toolrl.training import packing

_OF = RowPattern.of


def _assert_close(want, got, tol=1e-5):
    _, want_lp, want_loss, want_grads = want
    _, got_lp, got_loss, got_grads = got
    assert torch.allclose(got_lp, want_lp, atol=tol, rtol=0)
    assert abs(float(got_loss - want_loss)) <= tol * abs(float(want_loss))
    for name, g in want_grads.items():
        assert float((got_grads[name] - g).norm()) <= tol * float(g.norm()), name


def _both(monkeypatch, module, trajs, share):
    """(the span loop's, one call's) loss_and_grads, and the patterns the one-call run built."""
    patterns = []

    def recorded(bounds, tree, device):
        patterns.append(_OF(bounds, tree, device))
        return patterns[-1]

    monkeypatch.setattr(RowPattern, "of", staticmethod(recorded))
    monkeypatch.setattr(packing, "one_call_attention", lambda device: False)
    loop = loss_and_grads(module, trajs, share)
    assert not patterns
    monkeypatch.setattr(packing, "one_call_attention", lambda device: True)
    one = loss_and_grads(module, trajs, share)
    return loop, one, patterns


@pytest.mark.parametrize("case", [shared_prompt, common_first_turn, nothing_shared])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_one_call_gives_the_span_loop_loss_and_gradients(monkeypatch, tiny_qwen3_path, case, checkpointing):
    from toolrl.model_sources import load_model

    module = load_model(tiny_qwen3_path).train()
    if checkpointing:
        module.gradient_checkpointing_enable()
    for share in (False, True):
        loop, one, patterns = _both(monkeypatch, module, case(), share)
        _assert_close(loop, one)
        # The pattern is built once per batch, not per layer (nor again by checkpointing's recompute).
        assert len(patterns) == 1
    if case is not nothing_shared:
        assert bool(patterns[0].sees.any())  # a tree: some span sees its ancestors


def test_one_call_keeps_sliding_windows(monkeypatch, windowed):
    """Gemma 3's first layer sees only the 6 positions before each token: in a tree too, the window
    counts positions in the sequence, across the span's context."""
    module = copy.deepcopy(windowed).train()
    for case in (shared_prompt, common_first_turn):
        for share in (False, True):
            loop, one, _ = _both(monkeypatch, module, case(), share)
            _assert_close(loop, one)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_attention_takes_the_dense_rule():
    """FlexAttention's BlockMask (the CUDA path; forward only on CPU, which has no flex backward) gives
    the dense mask's attention, grouped-query heads and a sliding window included."""
    torch.manual_seed(0)
    # Spans: a 40-row root, two children of it (one with a child of its own), and a separate sequence.
    bounds = [0, 40, 52, 60, 75, 100]
    tree = [None, torch.arange(0, 52), torch.cat([torch.arange(0, 52), torch.arange(52, 60)]),
            torch.cat([torch.arange(0, 40), torch.arange(60, 75)]), None]
    pattern = RowPattern.of(bounds, tree, torch.device("cpu"))
    assert pattern.position[[0, 39, 40, 52, 60, 75, 99]].tolist() == [0, 39, 40, 52, 40, 0, 24]
    q, k, v = torch.randn(1, 4, 100, 16), torch.randn(1, 2, 100, 16), torch.randn(1, 2, 100, 16)
    module = type("Attention", (), {"num_key_value_groups": 2})()
    for window in (None, 6):
        with torch.no_grad():
            dense = attend(module, q, k, v, pattern, window, 0.25, flex=False)
            flex = attend(module, q, k, v, pattern, window, 0.25, flex=True)
        assert torch.allclose(dense, flex, atol=1e-5, rtol=0), window
    rule = pattern.dense(6)
    assert rule[55, 50] and not rule[55, 49] and rule[55, 52] and not rule[55, 56]  # window, context, causal
    assert not rule[62, 45] and rule[62, 39] and not rule[80, 10]  # not a sibling's rows; another sequence's


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_block_mask_is_create_block_masks_over_many_blocks():
    """The BlockMask built from the rule's values block by block holds create_block_mask's blocks (partial
    and full, in its order) for rows of several 128-blocks, trees and windows included, and FlexAttention
    under it gives the dense mask's attention."""
    from torch.nn.attention.flex_attention import create_block_mask

    torch.manual_seed(0)
    tree = [None, torch.arange(0, 450), torch.cat([torch.arange(0, 200), torch.arange(450, 520)]), None]
    for bounds, spans in (([0, 100, 300, 301, 700], None), ([0, 200, 450, 520, 650], tree), ([0, 128, 256], None)):
        pattern = RowPattern.of(bounds, spans, torch.device("cpu"))
        t = bounds[-1]
        q, k, v = torch.randn(1, 4, t, 16), torch.randn(1, 2, t, 16), torch.randn(1, 2, t, 16)
        module = type("Attention", (), {"num_key_value_groups": 2})()
        for window in (None, 60):
            got = pattern.block_mask(window)
            want = create_block_mask(pattern.mask_mod(window), None, None, t, t, device="cpu")
            for name in ("kv_num_blocks", "full_kv_num_blocks", "q_num_blocks", "full_q_num_blocks"):
                assert torch.equal(getattr(got, name), getattr(want, name)), (bounds, window, name)
            for name, count in (("kv_indices", want.kv_num_blocks), ("full_kv_indices", want.full_kv_num_blocks)):
                for row, n in enumerate(count[0, 0].tolist()):
                    assert torch.equal(getattr(got, name)[0, 0, row, :n], getattr(want, name)[0, 0, row, :n])
            with torch.no_grad():
                dense = attend(module, q, k, v, pattern, window, 0.25, flex=False)
                flex = attend(module, q, k, v, pattern, window, 0.25, flex=True)
            assert torch.allclose(dense, flex, atol=1e-5, rtol=0), (bounds, window)
