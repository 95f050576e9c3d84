"""The public step for outside trainers (toolrl.training.token_step) and the one AdamW
(toolrl.training.optimizer): a forward/backward through one adapter equal to the trainer's own step on
the same tokens, micro-batches that add up to one pass, bad input refused before any forward, every
AdamW of toolrl built by the one factory, and ``grad_clip`` meaning one thing (0: not clipped)."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest
import torch
from pydantic import ValidationError
from toolrl.config import AdapterConfig, AlgorithmConfig, ConfigError, CriticConfig, OptimConfig
from toolrl.model_sources import load_model
from toolrl.modeling.adapter_routing import adapter_names
from toolrl.modeling.adapters import adapter_of, add_adapter
from toolrl.training.optimizer import OptimizerSettings, adamw, clipped_step, optimizer_step
from toolrl.training.packing import build_batch, through_adapters
from toolrl.training.step import policy_loss, response_logprobs
from toolrl.training.token_step import LossSpec, TokenRow, forward_backward, micro_batch_spans
from toolrl.trajectory import Trajectory

ROOT = Path(__file__).resolve().parents[1]
TOKENS = [3, 17, 99, 2048, 5, 77, 1023, 64, 8, 300, 41]
PPO = LossSpec(name="ppo_clip", options={"clip_eps_low": 0.2, "clip_eps_high": 0.2})


@pytest.fixture(scope="module")
def model(tiny_qwen3_path):
    """The tiny model with two routed adapters, ``b``'s up-projections made non-zero (so that every
    adapter weight gets a gradient)."""
    torch.manual_seed(0)
    lm = load_model(tiny_qwen3_path)
    for name in ("a", "b"):
        add_adapter(lm, name, AdapterConfig(r=4, alpha=8.0, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for n, p in lm.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05)
    return lm


def _row(n: int, seed: int, sampled: bool = True) -> TokenRow:
    rng = np.random.default_rng(seed)
    tokens = (TOKENS * 2)[:n + 1]
    return TokenRow(tokens=tokens[:-1], targets=tokens[1:], advantages=rng.normal(0, 1, n),
                    logprobs=rng.uniform(-12.5, -11.0, n) if sampled else None)


def _grads(model) -> dict[str, torch.Tensor]:
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return grads


@pytest.mark.parametrize("sampled", [True, False])
def test_a_row_through_an_adapter_equals_the_trainers_step(model, sampled: bool) -> None:
    """The trainer's packing, log-probs and loss on the same tokens (a trajectory of one prompt token),
    summed (seq-mean-token-sum-norm over 1); a row without sampling log-probs is on-policy."""
    row = _row(len(TOKENS) - 1, seed=1, sampled=sampled)
    out = forward_backward(model, [row], PPO, adapter="b")
    served = _grads(model)
    assert served and {adapter_of(n) for n in served} == {"b"}  # adapter a untouched

    n = len(TOKENS) - 1
    traj = Trajectory(trajectory_id="t", sample_index=0, group=0, prompt_ids=TOKENS[:1], response_ids=TOKENS[1:],
                      response_mask=[1] * n, logprobs=(row.logprobs if sampled else np.zeros(n)).tolist())
    batch = build_batch([traj], [torch.from_numpy(row.advantages)], adapters=[adapter_names(model).index("b")])
    algo = AlgorithmConfig(loss="ppo_clip", loss_options=PPO.options, loss_agg="seq-mean-token-sum-norm")
    with through_adapters(model, batch):
        new = response_logprobs(model, batch)
        prox = batch.engine_logprobs if sampled else new.detach()
        loss, _ = policy_loss(new, prox, batch, algo, {"seqs": 1.0, "max_len": 1.0, "tokens": 1.0})
        loss.backward()
    own = _grads(model)
    assert abs(out.loss - loss.item()) <= 1e-6 * max(1.0, abs(loss.item()))
    np.testing.assert_allclose(out.logprobs[0], new[0].detach().numpy(), rtol=0, atol=1e-6)
    assert served.keys() == own.keys()
    for key, g in own.items():
        torch.testing.assert_close(served[key], g, rtol=0, atol=1e-6)
    assert (out.tokens, out.micro_batches) == (n, 1)


def test_micro_batches_add_up_to_one_pass(model) -> None:
    """Rows cut to a token budget: the same loss, log-probs and gradients as one pass (the loss is a
    sum), no forward over the budget (the forwards the model ran, seen at its embedding)."""
    lengths = [10, 3, 7, 4, 9, 5, 3, 4]
    assert micro_batch_spans(lengths) == [(0, 8)]
    assert micro_batch_spans(lengths, 13) == [(0, 2), (2, 4), (4, 5), (5, 8)]
    assert micro_batch_spans(lengths, 7) == [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 6), (6, 8)]  # 10 and 9 alone
    rows = [_row(n, seed=10 + i) for i, n in enumerate(lengths)]
    seen: list[int] = []
    hook = model.get_input_embeddings().register_forward_hook(lambda m, args, out: seen.append(args[0].shape[-1]))
    try:
        whole = forward_backward(model, rows, PPO, adapter="a")
        whole_grads = _grads(model)
        split = forward_backward(model, rows, PPO, adapter="a", max_tokens=13)
        split_grads = _grads(model)
    finally:
        hook.remove()
    assert seen == [45, 13, 11, 9, 12] and (whole.micro_batches, split.micro_batches) == (1, 4)
    assert abs(split.loss - whole.loss) <= 1e-6 * max(1.0, abs(whole.loss))
    for a, b in zip(whole.logprobs, split.logprobs, strict=True):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-6)
    assert whole_grads.keys() == split_grads.keys() and whole_grads
    for key, g in whole_grads.items():  # float32 sums in another order: 1e-6 of the tensor's largest gradient
        torch.testing.assert_close(split_grads[key], g, rtol=0, atol=1e-6 * max(1.0, float(g.abs().max())))


def test_idle_forwards_keep_a_data_parallel_rank_in_step_and_add_nothing(model) -> None:
    """``forwards=``: the forwards past the rows' micro-batches (a rank with a smaller share, or none) run
    through the adapter and add nothing: the same loss, log-probs and gradients, bit for bit, and a rank
    without rows adds zero gradients; the model may come as the Policy a sharded rank steps."""
    from toolrl.training.step import Policy

    rows = [_row(n, seed=20 + i) for i, n in enumerate([6, 4, 5])]
    seen: list[int] = []
    hook = model.get_input_embeddings().register_forward_hook(lambda m, args, out: seen.append(args[0].shape[-1]))
    try:
        plain = forward_backward(model, rows, PPO, adapter="a", max_tokens=10)
        plain_grads = _grads(model)
        padded = forward_backward(Policy(model), rows, PPO, adapter="a", max_tokens=10, forwards=4)
        padded_grads = _grads(model)
        idle = forward_backward(model, [], PPO, adapter="a", forwards=2)
        idle_grads = _grads(model)
    finally:
        hook.remove()
    assert seen == [10, 5, 10, 5, 1, 1, 1, 1]
    assert (padded.loss, padded.micro_batches, padded.tokens) == (plain.loss, plain.micro_batches, 15)
    assert all(np.array_equal(a, b) for a, b in zip(plain.logprobs, padded.logprobs, strict=True))
    assert padded_grads.keys() == plain_grads.keys() == idle_grads.keys() and plain_grads
    assert all(torch.equal(padded_grads[k], g) and not idle_grads[k].any() for k, g in plain_grads.items())
    assert (idle.loss, idle.logprobs, idle.micro_batches) == (0.0, [], 0)
    with pytest.raises(ValueError, match="no rows"):
        forward_backward(model, [], PPO, adapter="a")


def test_bad_input_is_refused_before_any_forward(model) -> None:
    row = _row(5, seed=2)
    with pytest.raises(ConfigError, match="unknown policy loss 'nope'"):
        forward_backward(model, [row], LossSpec(name="nope"), adapter="a")
    with pytest.raises(ValueError, match="adapter 'c': the model holds a, b"):
        forward_backward(model, [row], PPO, adapter="c")
    far = TokenRow(tokens=[1, 2], targets=[2, 10**7], advantages=[1.0, 1.0])
    with pytest.raises(ValueError, match="row 1: targets holds token id 10000000, outside the model's vocabulary"):
        forward_backward(model, [row, far], PPO, adapter="a")
    assert all(p.grad is None for p in model.parameters())
    with pytest.raises(ValidationError, match="advantages has 2 values and tokens 3"):
        TokenRow(tokens=[1, 2, 3], targets=[2, 3, 4], advantages=[1.0, 1.0])


def test_optimizer_step_is_adamw_with_its_settings_bit_for_bit(model) -> None:
    params = [p for n, p in model.named_parameters() if adapter_of(n) == "a"]
    forward_backward(model, [_row(6, seed=3)], PPO, adapter="a")
    mirror = [p.detach().clone().requires_grad_(True) for p in params]
    for mine, theirs in zip(mirror, params, strict=True):
        mine.grad = theirs.grad.clone()
    settings = OptimizerSettings(lr=3e-3, betas=(0.8, 0.9), eps=1e-8, weight_decay=0.01, grad_clip=0.5)
    optimizer = adamw(params, OptimizerSettings(lr=1.0))
    norm = optimizer_step(optimizer, settings)  # the step's settings, not the ones it was built with
    expected = float(torch.nn.utils.clip_grad_norm_(mirror, 0.5))
    torch.optim.AdamW(mirror, lr=3e-3, betas=(0.8, 0.9), eps=1e-8, weight_decay=0.01).step()
    assert norm == expected and all(p.grad is None for p in params)
    assert all(torch.equal(mine.detach(), theirs.detach()) for mine, theirs in zip(mirror, params, strict=True))


def test_grad_clip_0_steps_unclipped_and_reports_the_norm() -> None:
    """``grad_clip`` 0 is no clipping wherever it is set (the policy's and the critic's config, the public
    settings); the step made by :func:`clipped_step` then is AdamW's on the gradients as they are, and
    its norm is measured all the same (a step's ``grad_norm``)."""
    assert OptimConfig(grad_clip=0).grad_clip == CriticConfig(grad_clip=0).grad_clip == 0
    for section in (OptimConfig, CriticConfig, lambda grad_clip: OptimizerSettings(lr=1.0, grad_clip=grad_clip)):
        with pytest.raises(ValidationError, match="grad_clip"):
            section(grad_clip=-1.0)
    torch.manual_seed(0)
    params = [torch.randn(5, requires_grad=True), torch.randn(2, 3, requires_grad=True)]
    for p in params:
        p.grad = 10 * torch.randn_like(p)  # a norm far above 1
    mirror = [p.detach().clone().requires_grad_(True) for p in params]
    for mine, theirs in zip(mirror, params, strict=True):
        mine.grad = theirs.grad.clone()
    norm = clipped_step(torch.optim.AdamW(params, lr=1e-2), params, 0.0)
    assert norm == pytest.approx(float(torch.cat([p.grad.flatten() for p in mirror]).norm()), rel=1e-6)
    assert norm > 1 and all(torch.equal(p.grad, m.grad) for p, m in zip(params, mirror, strict=True))
    torch.optim.AdamW(mirror, lr=1e-2).step()
    assert all(torch.equal(p.detach(), m.detach()) for p, m in zip(params, mirror, strict=True))


def test_every_adamw_is_built_by_the_factory() -> None:
    """torch.optim.AdamW is called in training/optimizer.py alone, in the core and every plugin's package."""
    files = [*(ROOT / "core" / "toolrl").rglob("*.py"), *ROOT.glob("plugins/*/toolrl_*/**/*.py")]
    built = [str(f.relative_to(ROOT)) for f in files for node in ast.walk(ast.parse(f.read_text()))
             if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "AdamW"]
    assert built == ["core/toolrl/training/optimizer.py"]
