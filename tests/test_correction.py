"""Rollout correction (``algorithm.correction``): each mode's weights against a hand-computed example,
and the loss and figures of the step that uses them."""

from __future__ import annotations

import math

import pytest
import torch
from toolrl.algorithms.correction import correction
from toolrl.config import AlgorithmConfig, ConfigError, load_config
from toolrl.training.packing import build_batch
from toolrl.training.step import policy_loss
from toolrl.trajectory import Trajectory

# Two sequences of three tokens, the second's last untrained. log ρ = prox - behav:
#   seq 0: 0.0, ln 3, -ln 4        ρ = 1, 3, 0.25     ρ_seq = (1 · 3 · 0.25)^(1/3) = 0.75^(1/3)
#   seq 1: ln 1.5, ln 0.8, (ln 9)  ρ = 1.5, 0.8       ρ_seq = (1.5 · 0.8)^(1/2) = 1.2^(1/2)
BEHAV = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, -1.0, -1.0]])
LOG_RATIO = torch.tensor([[0.0, math.log(3), -math.log(4)], [math.log(1.5), math.log(0.8), math.log(9)]])
PROX = BEHAV + LOG_RATIO
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
S0, S1 = 0.75 ** (1 / 3), 1.2 ** 0.5


def weights(tis_cap=None, **options):
    c = correction(PROX, BEHAV, MASK, AlgorithmConfig(tis_cap=tis_cap, correction=options))
    return c, None if c.weight is None else (c.weight * MASK).tolist()


def near(got, want):
    return all(g == pytest.approx(w, rel=1e-6) for row_g, row_w in zip(got, want, strict=True)
               for g, w in zip(row_g, row_w, strict=True))


def test_token_truncation_is_todays_weight():
    c, w = weights()
    assert w is None  # no cap: no weight, as before
    c, w = weights(tis_cap=2.0)
    assert near(w, [[1.0, 2.0, 0.25], [1.5, 0.8, 0.0]]) and not c.dropped.any()


def test_sequence_truncation_weighs_each_token_by_its_sequences_geometric_mean():
    _, w = weights(tis_cap=1.05, level="sequence")
    assert near(w, [[S0] * 3, [1.05, 1.05, 0.0]])  # S1 = 1.095 is truncated


def test_token_mask_keeps_the_ratio_inside_the_bounds_and_drops_the_rest():
    c, w = weights(mode="mask", lo=0.5, hi=2.0)
    assert near(w, [[1.0, 0.0, 0.0], [1.5, 0.8, 0.0]])
    assert (c.dropped & MASK.bool()).tolist() == [[False, True, True], [False, False, False]]


def test_sequence_mask_keeps_or_drops_whole_sequences():
    c, w = weights(mode="mask", level="sequence", lo=0.95, hi=2.0)
    assert near(w, [[0.0] * 3, [S1, S1, 0.0]])  # S0 = 0.909 is below lo
    assert (c.dropped & MASK.bool()).sum() == 3


def test_veto_drops_a_sequence_with_one_token_below_the_threshold():
    # ρ = 0.25 in sequence 0 is below 0.3; the untrained ρ = 9 of sequence 1 counts for nothing.
    _, w = weights(tis_cap=2.0, veto=0.3)
    assert near(w, [[0.0] * 3, [1.5, 0.8, 0.0]])
    _, w = weights(veto=0.3)  # without a cap: weight 1 where not vetoed
    assert near(w, [[0.0] * 3, [1.0, 1.0, 0.0]])


def test_the_loss_applies_the_weight_and_reports_the_mismatch():
    trajs = [Trajectory(trajectory_id=f"t{i}", sample_index=i, group=0, prompt_ids=[5, 6], response_ids=[7, 8, 9],
                        response_mask=[int(m) for m in MASK[i].tolist()], logprobs=BEHAV[i].tolist())
             for i in range(2)]
    batch = build_batch(trajs, [1.0, -1.0])
    new = PROX.clone().requires_grad_()
    norm = {"tokens": 5.0, "seqs": 2.0, "max_len": 3.0}
    cfg = AlgorithmConfig(correction={"mode": "mask", "lo": 0.5, "hi": 2.0})
    loss, stats = policy_loss(new, PROX, batch, cfg, norm)
    # On-policy ratio 1, inside the clip range: per token -A · w; token-mean over 5 tokens.
    assert loss.item() == pytest.approx(-(1.0 + 0 + 0) / 5 + (1.5 + 0.8) / 5, rel=1e-6)
    assert stats["is_masked"] == 2
    k3 = [r - 1 - math.log(r) for r in (1.0, 3.0, 0.25, 1.5, 0.8)]
    assert stats["mismatch_kl_sum"] == pytest.approx(sum(k3), rel=1e-5)


def test_sequence_truncation_needs_a_cap_and_bounds_are_ordered():
    from toolrl.algorithms.rules import check_algorithm

    def config(*overrides):
        return load_config(None, list(overrides), data={"env": "arithmetic"})

    with pytest.raises(ConfigError, match="^algorithm.correction.level=sequence truncates"):
        check_algorithm(config("algorithm.correction={level: sequence}"))
    check_algorithm(config("algorithm.correction={level: sequence}", "algorithm.tis_cap=2"))
    with pytest.raises(ConfigError, match=r"algorithm.correction: .*lo \(3.0\) must be below hi \(2.0\)"):
        config("algorithm.correction={mode: mask, lo: 3}")
