"""toolrl's policy losses against TRL 1.16's own loss code (``GRPOTrainer._compute_loss``, called on a
trainer whose model forward is replaced by the hand-built log-probs): the same loss value and gradient
within 1e-6 (fp32) on a ragged batch, for every loss type TRL implements that toolrl has; and the
place where toolrl differs on purpose (the normaliser under gradient accumulation)."""

from collections import defaultdict

import pytest
import torch
from toolrl.algorithms import build_loss
from toolrl.config import AlgorithmConfig
from toolrl.training.packing import build_batch
from toolrl.training.step import policy_loss
from toolrl.trajectory import Trajectory

trl = pytest.importorskip("trl")
LENGTHS = [4, 1, 3, 6, 2]  # ragged responses
MAX_COMPLETION = 8


def hand_built(seed=0):
    """Per-token log-probs (new, old, reference), advantages of both signs and a mask with a tool
    span, with ratios inside and outside every clip range."""
    g = torch.Generator().manual_seed(seed)
    width = max(LENGTHS)
    mask = torch.tensor([[1.0] * n + [0.0] * (width - n) for n in LENGTHS])
    mask[3, 2] = 0.0  # a tool token inside a response
    old = -torch.rand((len(LENGTHS), width), generator=g) * 3 * mask
    new = (old + (torch.rand(old.shape, generator=g) - 0.5) * 0.8) * mask
    ref = (old + (torch.rand(old.shape, generator=g) - 0.5) * 0.4) * mask
    adv = torch.tensor([1.2, -0.7, 0.3, -1.5, 0.9])
    return new, old, ref, adv, mask


def trl_loss(tmp_path, loss_type, new, old, adv, mask, *, ref=None, level="token", accumulation=1, **args):
    """TRL's loss for the micro-batch (new, old, adv, mask): ``_compute_loss`` on a ``GRPOTrainer`` built
    without a model, its per-token log-probs function answering ``new``."""
    from accelerate import Accelerator
    from trl import GRPOConfig, GRPOTrainer

    cfg = GRPOConfig(output_dir=str(tmp_path), loss_type=loss_type, importance_sampling_level=level,
                     max_completion_length=MAX_COMPLETION, beta=0.0 if ref is None else 0.04, report_to="none",
                     use_cpu=True, **args)
    trainer = GRPOTrainer.__new__(GRPOTrainer)
    trainer.args = cfg
    for name in ("loss_type", "importance_sampling_level", "off_policy_mask_threshold", "top_entropy_quantile",
                 "use_vllm", "beta", "max_completion_length", "entropy_coef", "use_adaptive_entropy"):
        setattr(trainer, name, getattr(cfg, name))
    trainer.epsilon_low, trainer.epsilon_high = cfg.epsilon, cfg.epsilon_high
    trainer._entropy_bonus_enabled, trainer.aux_loss_enabled = False, False
    trainer.accelerator = Accelerator(cpu=True)
    trainer.current_gradient_accumulation_steps = accumulation
    trainer.model = torch.nn.Linear(1, 1).train()
    trainer._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    trainer._get_per_token_logps_and_entropies = lambda *a, **k: (new, torch.zeros_like(new), None)
    b, width = mask.shape
    inputs = {"prompt_ids": torch.zeros((b, 1), dtype=torch.long), "prompt_mask": torch.ones((b, 1)),
              "completion_ids": torch.zeros((b, width), dtype=torch.long), "completion_mask": mask,
              "advantages": adv, "old_per_token_logps": old, "num_items_in_batch": mask.sum() * accumulation}
    if ref is not None:
        inputs["ref_per_token_logps"] = ref
    return trainer._compute_loss(None, inputs)


def toolrl_loss(algo, new, old, adv, mask, ref=None, norm=None):
    """toolrl's loss of the same micro-batch: proximal = old, the engine's (behaviour) log-probs = old
    too (one policy, as in TRL without vLLM), so the importance weight is 1."""
    trajs = [Trajectory(trajectory_id=str(i), sample_index=0, group=0, prompt_ids=[1], response_ids=[2] * n,
                        response_mask=mask[i, :n].int().tolist(), logprobs=old[i, :n].tolist())
             for i, n in enumerate(LENGTHS)]
    batch = build_batch(trajs, adv.tolist())
    norm = norm or {"tokens": float(mask.sum()), "seqs": float(len(LENGTHS)), "max_len": float(MAX_COMPLETION)}
    return policy_loss(new, old, batch, algo, norm, ref, build_loss(algo))[0]


# TRL loss type (and importance-sampling level) -> the toolrl algorithm that is the same objective.
CASES = {
    "grpo": ({}, AlgorithmConfig(loss_agg="seq-mean-token-mean")),
    "bnpo": ({}, AlgorithmConfig(loss_agg="token-mean")),
    "dapo": ({}, AlgorithmConfig(loss_agg="token-mean")),
    "dr_grpo": ({}, AlgorithmConfig(loss_agg="seq-mean-token-sum-norm")),
    "cispo": ({"epsilon_high": 1.15}, AlgorithmConfig(loss="cispo", loss_options={"max_weight": 1.15},
                                                      loss_agg="token-mean")),
    "gspo": ({"importance_sampling_level": "sequence", "epsilon": 0.03, "epsilon_high": 0.04},
             AlgorithmConfig(loss="gspo", loss_options={"clip_low": 0.03, "clip_high": 0.04},
                             loss_agg="seq-mean-token-mean")),
}


@pytest.mark.parametrize("kl", [False, True], ids=["no-kl", "kl"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_loss_and_gradient_equal_trls(tmp_path, case, kl):
    trl_args, algo = CASES[case]
    if kl:
        algo = algo.model_copy(update={"loss_options": {**algo.loss_options, "kl_coef": 0.04}})
    trl_args = dict(trl_args)
    level = trl_args.pop("importance_sampling_level", "token")
    trl_args.setdefault("epsilon", algo.loss_options.get("clip_eps_low", 0.2))
    trl_args.setdefault("epsilon_high", algo.loss_options.get("clip_eps_high", 0.28))
    new, old, ref, adv, mask = hand_built()
    new_trl, new_ours = new.clone().requires_grad_(), new.clone().requires_grad_()
    # TRL 1.16 multiplies the KL term by the ratio by default (use_bias_correction_kl); toolrl's KL is
    # the plain k3 (test_trls_bias_corrected_kl_is_a_different_objective).
    theirs = trl_loss(tmp_path, "grpo" if case == "gspo" else case, new_trl, old, adv, mask,
                      ref=ref if kl else None, level=level, use_bias_correction_kl=False, **trl_args)
    ours = toolrl_loss(algo, new_ours, old, adv[:, None].expand(mask.shape), mask, ref if kl else None)
    theirs.backward()
    ours.backward()
    assert abs(ours.item() - theirs.item()) <= 1e-6, (ours.item(), theirs.item())
    assert torch.allclose(new_ours.grad, new_trl.grad, atol=1e-6, rtol=0)
    assert new_ours.grad.abs().sum() > 0
    if case in ("grpo", "gspo", "cispo"):  # some ratio lies outside the range: the clip is exercised
        ratio = torch.exp(new - old)
        if case == "gspo":
            ratio = torch.exp(((new - old) * mask).sum(-1) / mask.sum(-1))
            assert ((ratio < 0.97) | (ratio > 1.04)).any() and ((ratio > 0.97) & (ratio < 1.04)).any()
        else:
            assert ((ratio > 1.15) & mask.bool()).any()


def test_under_accumulation_toolrl_normalises_by_the_whole_mini_batch(tmp_path):
    """TRL's ``grpo`` and ``bnpo`` normalise each micro-batch by its own sequences or tokens, then divide
    by the accumulation steps, so with micro-batches of unequal size the accumulated loss is not the
    mini-batch's. toolrl normalises every micro-batch by the whole mini-batch's counts (docs/algorithms.md):
    accumulating its micro-batches gives exactly the loss of one big batch, which TRL gives only without
    accumulation. (TRL's ``dapo`` does the same as toolrl, through ``num_items_in_batch``.)"""
    new, old, _, adv, mask = hand_built()
    parts = [slice(0, 2), slice(2, 5)]
    for trl_type, agg in (("grpo", "seq-mean-token-mean"), ("bnpo", "token-mean")):
        algo = AlgorithmConfig(loss_agg=agg)
        whole = float(trl_loss(tmp_path, trl_type, new, old, adv, mask, epsilon=0.2, epsilon_high=0.28))
        accumulated_trl = sum(float(trl_loss(tmp_path, trl_type, new[s], old[s], adv[s], mask[s], accumulation=2,
                                             epsilon=0.2, epsilon_high=0.28)) for s in parts)
        norm = {"tokens": float(mask.sum()), "seqs": 5.0, "max_len": float(MAX_COMPLETION)}
        per_token = build_loss(algo)
        accumulated_ours = 0.0
        for s in parts:
            lengths = LENGTHS[s]
            trajs = [Trajectory(trajectory_id=str(i), sample_index=0, group=0, prompt_ids=[1], response_ids=[2] * n,
                                response_mask=mask[s][i, :n].int().tolist(), logprobs=old[s][i, :n].tolist())
                     for i, n in enumerate(lengths)]
            batch = build_batch(trajs, adv[s].tolist())
            width = batch.response_mask.shape[1]
            accumulated_ours += float(policy_loss(new[s][:, :width], old[s][:, :width], batch, algo, norm,
                                                  loss_fn=per_token)[0])
        assert accumulated_ours == pytest.approx(whole, abs=1e-6)
        assert abs(accumulated_trl - whole) > 1e-3, (trl_type, accumulated_trl, whole)


def test_trls_bias_corrected_kl_is_a_different_objective(tmp_path):
    """TRL's default KL (k3 times the ratio π_θ / π_old, DeepSeek-V3.2) against toolrl's k3: equal
    without the correction (above), different with it wherever the policy moved off the old one."""
    new, old, ref, adv, mask = hand_built()
    algo = AlgorithmConfig(loss_agg="token-mean", loss_options={"kl_coef": 0.04})
    ours = toolrl_loss(algo, new, old, adv[:, None].expand(mask.shape), mask, ref)
    corrected = trl_loss(tmp_path, "bnpo", new, old, adv, mask, ref=ref, epsilon=0.2, epsilon_high=0.28)
    plain = trl_loss(tmp_path, "bnpo", new, old, adv, mask, ref=ref, epsilon=0.2, epsilon_high=0.28,
                     use_bias_correction_kl=False)
    assert ours.item() == pytest.approx(plain.item(), abs=1e-6) and abs(ours.item() - corrected.item()) > 1e-5
