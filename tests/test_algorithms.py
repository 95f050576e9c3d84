"""Advantage estimators and policy losses as parts (toolrl.algorithms): the default is today's GRPO
bit for bit, each estimator on hand-worked numbers, the composition rules, DAPO's overlong shaping."""

import math

import pytest
import torch
from toolrl.algorithms import AdvantageEstimator, AdvantageInputs, build_estimator, build_loss
from toolrl.algorithms.overlong import length_penalty, shape_rewards
from toolrl.algorithms.rules import check_algorithm
from toolrl.config import AlgorithmConfig, ConfigError, OptimConfig, OverlongConfig, load_config
from toolrl.plugins import get_plugins
from toolrl.plugins.registry import Part
from toolrl.training.packing import build_batch
from toolrl.training.step import StepOptions, policy_loss, token_advantages, train_step
from toolrl.trajectory import Trajectory

# -- today's GRPO, as it was before the estimators and losses became parts (copied from main) ---------


def main_group_advantages(rewards, groups, norm_by_std=True, eps=1e-6):
    by_group = {}
    for r, g in zip(rewards, groups, strict=True):
        by_group.setdefault(g, []).append(r)
    stats = {}
    for g, rs in by_group.items():
        mean = sum(rs) / len(rs)
        std = math.sqrt(sum((r - mean) ** 2 for r in rs) / (len(rs) - 1)) if len(rs) > 1 else 0.0
        stats[g] = (mean, std)
    out = []
    for r, g in zip(rewards, groups, strict=True):
        mean, std = stats[g]
        if len(by_group[g]) == 1:
            out.append(0.0)
        else:
            out.append((r - mean) / (std + eps) if norm_by_std else r - mean)
    return out


def main_per_token_loss(new_lp, prox_lp, batch, cfg, ref_lp=None):
    adv = batch.advantages[:, None]
    ratio = torch.exp(new_lp - prox_lp)
    opts = build_loss(cfg).options
    clipped = torch.clamp(ratio, 1 - opts.clip_eps_low, 1 + opts.clip_eps_high)
    per_token = torch.maximum(-adv * ratio, -adv * clipped)
    weight = torch.exp(prox_lp.detach() - batch.engine_logprobs)
    if cfg.tis_cap is not None:
        per_token = per_token * weight.clamp(max=cfg.tis_cap)
    if ref_lp is not None and opts.kl_coef > 0:
        delta = ref_lp - new_lp
        per_token = per_token + opts.kl_coef * (torch.exp(delta) - delta - 1)
    return per_token


def traj(response, mask=None, reward=0.0, group=0, logprobs=None, prompt=(5, 6, 7)):
    mask = mask or [1] * len(response)
    return Trajectory(trajectory_id=f"t{reward}-{len(response)}", sample_index=0, group=group, prompt_ids=list(prompt),
                      response_ids=response, response_mask=mask,
                      logprobs=logprobs or [-0.5 - 0.1 * j for j in range(len(response))], reward=reward)


def ragged_batch():
    """Five trajectories in two groups (and ragged lengths, a tool span), as the step records them."""
    return [traj([21, 22, 23, 24], reward=1.0), traj([31, 32], reward=0.0),
            traj([41, 42, 43, 44, 45], mask=[1, 1, 0, 0, 1], reward=0.5),
            traj([51, 52, 53], reward=0.2, group=1, prompt=(8, 9)), traj([61], reward=0.9, group=1, prompt=(8, 9))]


@pytest.mark.parametrize("cfg", [AlgorithmConfig(), AlgorithmConfig(advantage_options={"norm_by_std": False}, tis_cap=1.3,
                                                                 loss_options={"kl_coef": 0.1}),
                                 AlgorithmConfig(loss_agg="seq-mean-token-mean",
                                                 loss_options={"clip_eps_low": 0.1, "clip_eps_high": 0.1}),
                                 AlgorithmConfig(loss_agg="seq-mean-token-sum-norm", tis_cap=2.0)])
def test_the_default_parts_are_todays_grpo_bit_for_bit(cfg):
    trajs = ragged_batch()
    advs = main_group_advantages([t.reward for t in trajs], [t.group for t in trajs],
                                 build_estimator(cfg).options.norm_by_std)
    grid = token_advantages(trajs, build_estimator(cfg), 8, cfg)
    assert torch.equal(grid, torch.tensor(advs, dtype=torch.float32)[:, None].expand(grid.shape))
    old_batch = build_batch(trajs, advs)
    g = torch.Generator().manual_seed(1)
    prox = -torch.rand(old_batch.response_mask.shape, generator=g) * 3
    ref = -torch.rand(old_batch.response_mask.shape, generator=g) * 3
    new_old = (prox + (torch.rand(prox.shape, generator=g) - 0.5)).requires_grad_()
    new_new = new_old.detach().clone().requires_grad_()
    norm = {"tokens": 11.0, "seqs": 5.0, "max_len": 8.0}
    from toolrl.training.step import aggregate

    expected = aggregate(main_per_token_loss(new_old, prox, old_batch, cfg, ref), old_batch.response_mask,
                         cfg.loss_agg, norm)
    new_batch = build_batch(trajs, [0.0] * 5)
    new_batch.advantages = grid[:, :new_batch.response_mask.shape[1]]
    got, _ = policy_loss(new_new, prox, new_batch, cfg, norm, ref, build_loss(cfg))
    expected.backward()
    got.backward()
    assert torch.equal(got.detach(), expected.detach()) and torch.equal(new_new.grad, new_old.grad)


def reference_step(model, trajectories, advantages, lr):
    """The default GRPO step written plainly: each trajectory forwarded alone (no packing, no shared
    prefixes, no chunked head), on-policy ratio exp(lp - lp.detach()), token-mean over every trained
    token, the gradient clipped to norm 1, one SGD step. Returns (loss, grad_norm)."""
    model.zero_grad(set_to_none=True)
    total = sum(sum(t.response_mask) for t in trajectories)
    loss = 0.0
    for t, adv in zip(trajectories, advantages):
        ids = torch.tensor([t.prompt_ids + t.response_ids])
        logits = model(input_ids=ids).logits[0, :-1].float()
        lp = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None])[:, 0][len(t.prompt_ids) - 1:]
        mask = torch.tensor(t.response_mask, dtype=torch.float32)
        loss = loss + (-(adv * torch.exp(lp - lp.detach())) * mask).sum() / total
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p -= lr * p.grad
    return float(loss.detach()), float(grad_norm)


def step_on_a_fresh_model(path, algo, micro_batch_size, lr):
    from toolrl.model_sources import load_model

    model = load_model(path)
    opt = torch.optim.SGD(model.parameters(), lr=lr)  # linear in the gradient: no sign flips on tiny values
    metrics = train_step(model, opt, ragged_batch(), StepOptions(algo, OptimConfig(micro_batch_size=micro_batch_size),
                                                               pad_id=0, temperature=1.0, max_response_tokens=8))
    return model, metrics


def assert_same_update(a, b, path):
    """``a`` and ``b`` moved from the weights at ``path`` alike: within 1e-4 of the largest move."""
    from toolrl.model_sources import load_model

    start = list(load_model(path).parameters())
    moved = max((p - s).abs().max().item() for p, s in zip(a.parameters(), start))
    apart = max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters()))
    assert moved > 1e-4 and apart <= 1e-4 * moved, (moved, apart)


def test_train_step_equals_the_plain_step_computed_beside_it(tiny_qwen3_path):
    """Packed rows, a shared group prompt and the chunked LM head change nothing but the cost: the
    step's loss, gradient norm and updated weights equal the plain computation's, made in this process
    (so the comparison holds on any CPU and torch build)."""
    from toolrl.model_sources import load_model

    model, metrics = step_on_a_fresh_model(tiny_qwen3_path, AlgorithmConfig(), micro_batch_size=2, lr=1e-2)
    plain = load_model(tiny_qwen3_path)
    advs = [float(a) for a in metrics["advantages"]]
    loss, grad_norm = reference_step(plain, ragged_batch(), advs, lr=1e-2)
    assert metrics["loss"] == pytest.approx(loss, rel=1e-5)
    assert metrics["grad_norm"] == pytest.approx(grad_norm, rel=1e-5)
    assert_same_update(model, plain, tiny_qwen3_path)
    assert len(metrics["advantages"]) == 5 and all(isinstance(a, float) for a in metrics["advantages"])


def test_micro_batching_does_not_change_the_update(tiny_qwen3_path):
    """Two mini-batches, two epochs, a TIS cap and seq-mean-token-mean: one sequence per micro-step
    gives the update two per micro-step gives (gradient accumulation is exact)."""
    algo = AlgorithmConfig(mini_batches=2, ppo_epochs=2, tis_cap=2.0, loss_agg="seq-mean-token-mean",
                           advantage_options={"norm_by_std": False})
    # Its gradients are ~1e-5 (advantages not divided by the std): a large step makes the moves measurable.
    one, m1 = step_on_a_fresh_model(tiny_qwen3_path, algo, micro_batch_size=1, lr=100.0)
    two, m2 = step_on_a_fresh_model(tiny_qwen3_path, algo, micro_batch_size=2, lr=100.0)
    assert m1["loss"] == pytest.approx(m2["loss"], rel=1e-5)
    assert m1["grad_norm"] == pytest.approx(m2["grad_norm"], rel=1e-5)
    assert_same_update(one, two, tiny_qwen3_path)


# -- estimators on hand-worked numbers ------------------------------------------------------------


def estimate(name, rewards, groups, lengths, **options):
    algo = AlgorithmConfig(advantage=name, advantage_options=options)
    width = max(lengths)
    mask = torch.tensor([[1.0] * n + [0.0] * (width - n) for n in lengths])
    return build_estimator(algo)(AdvantageInputs(torch.tensor(rewards, dtype=torch.float64), torch.tensor(groups), mask))


def test_rloo_subtracts_the_mean_of_the_others():
    adv = estimate("rloo", [1.0, 0.0, 0.5, 2.0], [0, 0, 0, 1], [2, 1, 3, 1])
    # 1 - (0 + 0.5)/2 = 0.75; 0 - (1 + 0.5)/2 = -0.75; 0.5 - (1 + 0)/2 = 0; alone in its group: 0.
    assert adv.shape == (4, 3) and torch.allclose(adv[:, 0], torch.tensor([0.75, -0.75, 0.0, 0.0]))
    assert torch.equal(adv, adv[:, :1].expand(4, 3))  # an outcome estimator: one number per row


def test_dr_grpo_does_not_divide_by_the_std():
    adv = estimate("dr_grpo", [1.0, 0.0, 0.5, 4.0, 2.0], [0, 0, 0, 1, 1], [1] * 5)
    assert torch.allclose(adv[:, 0], torch.tensor([0.5, -0.5, 0.0, 1.0, -1.0]))
    grpo = estimate("grpo", [1.0, 0.0, 0.5, 4.0, 2.0], [0, 0, 0, 1, 1], [1] * 5)
    assert grpo[0, 0] == pytest.approx(0.5 / (0.5 + 1e-6)) and grpo[3, 0] == pytest.approx(1 / (math.sqrt(2) + 1e-6))


def test_reinforce_pp_normalises_over_the_batchs_tokens():
    adv = estimate("reinforce_pp", [1.0, 0.0], [0, 1], [2, 1])
    # Token returns 1, 1, 0: mean 2/3, unbiased variance ((1/3)² · 2 + (2/3)²) / 2 = 1/3.
    std = math.sqrt(1 / 3)
    assert adv[0, 0] == pytest.approx((1 / 3) / std, rel=1e-6) and adv[1, 0] == pytest.approx((-2 / 3) / std, rel=1e-6)
    assert adv[0, 1] == adv[0, 0]


def test_reinforce_pp_baseline_centres_in_the_group_then_normalises():
    adv = estimate("reinforce_pp_baseline", [1.0, 0.0, 3.0, 3.0], [0, 0, 1, 1], [1, 1, 2, 2])
    # Centred: 0.5, -0.5, 0, 0 over tokens 0.5, -0.5, 0, 0, 0, 0: mean 0, unbiased variance 0.5 / 5.
    assert torch.allclose(adv[:, 0], torch.tensor([0.5, -0.5, 0.0, 0.0]) / math.sqrt(0.1), atol=1e-6)


def test_overlong_penalty_ramps_over_the_buffer():
    assert [length_penalty(n, 10, 4) for n in (5, 6, 8, 10, 11)] == [0.0, 0.0, -0.5, -1.0, -1.0]
    assert shape_rewards([1.0, 1.0], [6, 9], 10, OverlongConfig(buffer=4, penalty=0.5)) == [1.0, 1.0 - 0.5 * 0.75]
    assert shape_rewards([1.0], [11], 10, None) == [1.0]
    # Equal rewards carry no signal until the long response pays for its length.
    trajs = [traj([1] * 3, reward=1.0), traj([1] * 8, reward=1.0)]
    plain = AlgorithmConfig(advantage="dr_grpo")
    shaped = AlgorithmConfig(advantage="dr_grpo", overlong=OverlongConfig(buffer=4, penalty=1.0))
    assert token_advantages(trajs, build_estimator(plain), 8, plain).abs().max() == 0
    adv = token_advantages(trajs, build_estimator(shaped), 8, shaped)
    assert adv[0, 0] == pytest.approx(0.5) and adv[1, 0] == pytest.approx(-0.5)


# -- composition rules ----------------------------------------------------------------------------


class PerTokenEstimator(AdvantageEstimator):
    """A per-token estimator (as gae is): each token's reward-to-go from a reward at the last token."""

    name = "per_token_test"
    outcome = False

    def __call__(self, inputs):
        return inputs.rewards.float()[:, None] * inputs.response_mask.flip(-1).cumsum(-1).flip(-1)


def config(*overrides):
    return load_config(None, [*overrides], data={"env": "arithmetic"})


def test_rules_reject_a_sequence_level_loss_with_per_token_advantages():
    registry = get_plugins().registry
    if not registry.has("advantage_estimators", "per_token_test"):
        registry.add(Part("advantage_estimators", "per_token_test", "tests", PerTokenEstimator))
    with pytest.raises(ConfigError, match=r"^algorithm.advantage=per_token_test with algorithm.loss=gspo: "
                                          "a sequence-level loss"):
        check_algorithm(config("algorithm.advantage=per_token_test", "algorithm.loss=gspo"))
    estimator, loss = check_algorithm(config("algorithm.advantage=per_token_test", "algorithm.loss=cispo"))
    assert not estimator.outcome and loss.name == "cispo"


@pytest.mark.parametrize("overrides, message", [
    (["algorithm.advantage=dr_grpo", "algorithm.loss_agg=seq-mean-token-mean"],
     "algorithm.advantage=dr_grpo with algorithm.loss_agg=seq-mean-token-mean: Dr. GRPO removes"),
    (["algorithm.loss=nope"], "override algorithm.loss=nope: algorithm.loss: unknown policy loss 'nope' (available: "
                              "cispo, gspo, ppo_clip"),
    # The override that wins (the last of a key) is the one named.
    (["algorithm.loss=nope", "algorithm.loss=nada"],
     "override algorithm.loss=nada: algorithm.loss: unknown policy loss 'nada'"),
    (["algorithm.advantage=nope"], "override algorithm.advantage=nope: algorithm.advantage: unknown advantage "
                                   "estimator 'nope' (available: dr_grpo"),
    (["algorithm.loss=cispo", "algorithm.loss_options.max_weight=-1"],
     "override algorithm.loss_options.max_weight=-1: algorithm.loss_options.max_weight: Input should be greater than 0"),
    (["algorithm.loss_options.clip=0.2"], "override algorithm.loss_options.clip=0.2: algorithm.loss_options.clip: "
                                          "unknown key"),
    (["algorithm.overlong={buffer: 600}"], "algorithm.overlong.buffer=600: must be below rollout.max_response_tokens=512"),
])
def test_rules_and_options_are_one_line_config_errors(overrides, message):
    with pytest.raises(ConfigError) as err:
        check_algorithm(config(*overrides))
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_every_builtin_pair_composes_by_default():
    for advantage in ("grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline"):
        for loss in ("ppo_clip", "gspo", "cispo"):
            agg = ["algorithm.loss_agg=token-mean"] if advantage == "dr_grpo" else []
            estimator, built = check_algorithm(config(f"algorithm.advantage={advantage}", f"algorithm.loss={loss}", *agg))
            assert (estimator.name, built.name) == (advantage, loss)


@pytest.mark.parametrize("key, value, new_place", [
    ("clip_eps_low", "0.1", "algorithm.loss_options.clip_eps_low"),
    ("clip_eps_high", "0.3", "algorithm.loss_options.clip_eps_high"),
    ("kl_coef", "0.1", "algorithm.loss_options.kl_coef"),
    ("norm_adv_by_std", "false", "algorithm.advantage_options.norm_by_std"),
])
def test_moved_algorithm_keys_name_their_new_place(tmp_path, key, value, new_place):
    path = tmp_path / "run.yaml"
    path.write_text(f"model: {{tiny: {{}}}}\nalgorithm:\n  loss_agg: token-mean\n  {key}: {value}\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value).startswith(f"{path}:4: algorithm.{key} moved: use {new_place} (an option of ")
    assert "\n" not in str(err.value)


def test_moved_knobs_act_from_their_parts_options():
    """The knobs read from their part's options: a narrower clip range clips more, no std division
    gives the plain centred reward."""
    grpo = build_estimator(AlgorithmConfig(advantage_options={"norm_by_std": False}))
    inputs = AdvantageInputs(torch.tensor([1.0, 0.0], dtype=torch.float64), torch.tensor([0, 0]), torch.ones(2, 1))
    assert grpo(inputs)[:, 0].tolist() == [0.5, -0.5]
    loss = build_loss(AlgorithmConfig(loss_options={"clip_eps_low": 0.0, "clip_eps_high": 0.0, "kl_coef": 0.2}))
    from toolrl.algorithms import LossInputs

    new = torch.tensor([[0.1, -0.1]])
    terms = loss(LossInputs(new, torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2)))
    assert terms.clipped.tolist() == [[True, True]] and loss.kl_coef == 0.2


def test_cispo_floor_bounds_the_weight_from_below():
    """CISPO's ``min_weight`` (the Tinker API's clip_low_threshold): below it the stopped weight is the
    floor and the token counts as clipped; the default floor 0 bounds nothing."""
    from toolrl.algorithms import LossInputs
    from toolrl.algorithms.losses import Cispo

    new = torch.tensor([[-1.0, -2.0, -3.0]], requires_grad=True)
    prox = torch.tensor([[-0.5, -2.0, -4.0]])  # ratios e^-0.5, 1, e^1
    adv = torch.tensor([[1.0, -1.0, 2.0]])
    mask = torch.ones(1, 3)
    inputs = LossInputs(new, prox, prox, adv, mask)
    floored = Cispo(Cispo.Options(min_weight=0.8, max_weight=2.0), AlgorithmConfig())(inputs)
    plain = Cispo(Cispo.Options(max_weight=2.0), AlgorithmConfig())(inputs)
    weights = torch.tensor([[0.8, 1.0, 2.0]])
    torch.testing.assert_close(floored.per_token, -weights * adv * new, rtol=0, atol=0)
    assert floored.clipped.tolist() == [[True, False, True]]
    torch.testing.assert_close(plain.per_token[0, 0], -(torch.exp(torch.tensor(-0.5))) * new[0, 0], rtol=0, atol=0)
    assert plain.clipped.tolist() == [[False, False, True]]


# -- what a part reads, declared one way: fields -------------------------------------------------------


def builtin_parts():
    registry = get_plugins().registry
    loaded = [registry.load(kind, name) for kind in ("advantage_estimators", "policy_losses")
              for name in registry.names(kind)]
    return [cls for cls in loaded if cls.__module__.startswith("toolrl.")]


def step_names(path):
    """What ``path`` names that could select a field: its string constants (docstrings aside), the attributes
    it reads (methods called aside: ``dict.values()``), its parameters and keyword arguments."""
    import ast

    tree = ast.parse(path.read_text())
    docs = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    methods = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            found.add(node.value)
        elif isinstance(node, ast.Attribute) and id(node) not in methods:
            found.add(node.attr)
        elif isinstance(node, ast.arg) or isinstance(node, ast.keyword) and node.arg:
            found.add(node.arg)
    return found


def test_what_a_part_reads_is_a_field_never_a_flag():
    """Values, turns and trees are fields a part names in ``reads`` like any other: no part, built in or
    base, carries a ``needs_*`` flag, and no module of core reads one."""
    from pathlib import Path

    import toolrl
    from toolrl.algorithms import AlgorithmPart, PolicyLoss

    parts = [AlgorithmPart, AdvantageEstimator, PolicyLoss, *builtin_parts()]
    assert {"gae", "gigpo", "tree_grpo", "opd"} <= {cls.name for cls in parts[3:]}
    assert [(cls.__name__, n) for cls in parts for n in dir(cls) if n.startswith("needs_")] == []
    core = Path(toolrl.__file__).parent
    flags = sorted(f"{p.relative_to(core)}: {n}" for p in core.rglob("*.py") for n in step_names(p)
                   if n in ("needs_values", "needs_turns", "needs_trees"))
    assert flags == []


def test_the_step_names_no_field_a_part_reads():
    """The step carries every field alike: it names none that a built-in part reads (the candidate tokens'
    log-probs aside, which its own forward gives), so a part's field never needs a branch in it."""
    from pathlib import Path

    import toolrl
    from toolrl.algorithms import CANDIDATE_IDS, CANDIDATE_LOGPROBS

    read = {name for cls in builtin_parts() for name in cls.reads} - {CANDIDATE_IDS, CANDIDATE_LOGPROBS}
    assert {"values", "turn_ids", "trees", "teacher_logprobs"} <= read
    named = step_names(Path(toolrl.__file__).parent / "training" / "step.py")
    assert sorted(n for n in named if n in read or n.startswith("needs_")) == []
