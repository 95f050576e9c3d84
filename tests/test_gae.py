"""GAE over trained tokens (toolrl.algorithms.gae), against numbers worked out by hand."""

import pytest
import torch
from toolrl.algorithms.advantages import masked_whiten
from toolrl.algorithms.gae import gae, token_rewards

MASK = torch.tensor([[1, 1, 0, 1], [1, 1, 0, 0]], dtype=torch.float32)


def test_gae_skips_tool_tokens_by_hand():
    rewards = torch.tensor([[0.0, 0.0, 0.0, 1.0], [0.0, -1.0, 0.0, 0.0]])
    values = torch.tensor([[0.5, 0.6, 9.0, 0.8], [0.2, -0.4, 0.0, 0.0]])
    adv, ret = gae(rewards, values, MASK, gamma=0.9, lam=0.5)
    # Row 0, trained positions 0, 1, 3 (position 2 is tool output; its value 9.0 is never read):
    #   δ3 = 1 + 0.9·0 − 0.8 = 0.2                     A3 = 0.2
    #   δ1 = 0 + 0.9·0.8 − 0.6 = 0.12                  A1 = 0.12 + 0.45·0.2 = 0.21
    #   δ0 = 0 + 0.9·0.6 − 0.5 = 0.04                  A0 = 0.04 + 0.45·0.21 = 0.1345
    # Row 1, trained positions 0, 1:
    #   δ1 = −1 + 0 − (−0.4) = −0.6                    A1 = −0.6
    #   δ0 = 0 + 0.9·(−0.4) − 0.2 = −0.56              A0 = −0.56 + 0.45·(−0.6) = −0.83
    expected = torch.tensor([[0.1345, 0.21, 0.0, 0.2], [-0.83, -0.6, 0.0, 0.0]])
    assert torch.allclose(adv, expected, atol=1e-6)
    assert torch.allclose(ret, torch.tensor([[0.6345, 0.81, 0.0, 1.0], [-0.63, -1.0, 0.0, 0.0]]), atol=1e-6)


def test_gamma_lambda_one_is_return_minus_value():
    gen = torch.Generator().manual_seed(0)
    mask = (torch.rand(5, 9, generator=gen) > 0.3).float()
    rewards = torch.randn(5, 9, generator=gen) * mask
    values = torch.randn(5, 9, generator=gen)
    adv, ret = gae(rewards, values, mask, gamma=1.0, lam=1.0)
    to_go = rewards.flip(1).cumsum(1).flip(1)  # Σ_{k ≥ t} r_k (untrained rewards are 0 here)
    assert torch.allclose(adv, (to_go - values) * mask, atol=1e-5)
    assert torch.allclose(ret, to_go * mask, atol=1e-5)


def test_lambda_zero_is_one_step_td():
    rewards = torch.tensor([[0.0, 0.0, 0.0, 2.0]])
    values = torch.tensor([[1.0, 3.0, 5.0, 4.0]])
    adv, _ = gae(rewards, values, MASK[:1], gamma=0.5, lam=0.0)
    # A_t = r_t + γ·V_next_trained − V_t: 0 + 0.5·3 − 1, 0 + 0.5·4 − 3, (tool), 2 − 4
    assert torch.allclose(adv, torch.tensor([[0.5, -1.0, 0.0, -2.0]]))


def test_untrained_values_and_rewards_are_never_read():
    gen = torch.Generator().manual_seed(1)
    rewards, values = torch.randn(2, 4, generator=gen), torch.randn(2, 4, generator=gen)
    a1, r1 = gae(rewards, values, MASK, 0.95, 0.9)
    off = MASK == 0
    a2, r2 = gae(rewards.masked_fill(off, 7.0), values.masked_fill(off, -3.0), MASK, 0.95, 0.9)
    assert torch.equal(a1, a2) and torch.equal(r1, r2)


def test_token_rewards_put_the_outcome_on_the_last_trained_token():
    mask = torch.cat([MASK, torch.zeros(1, 4)])
    assert torch.equal(token_rewards([1.0, -1.0, 5.0], mask),
                       torch.tensor([[0.0, 0.0, 0.0, 1.0], [0.0, -1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]))
    with pytest.raises(ValueError, match="2 outcome rewards for 3 rows"):
        token_rewards([1.0, 2.0], mask)


def test_whiten_over_trained_tokens():
    x = torch.tensor([[1.0, 2.0, 50.0], [3.0, -9.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    # trained values 1, 2, 3: mean 2, unbiased variance 1; untrained positions take the same numbers
    want = torch.tensor([[-1.0, 0.0, 48.0], [1.0, -11.0, -2.0]]) / (1 + 1e-8) ** 0.5
    assert torch.allclose(masked_whiten(x, mask), want, atol=1e-6)
    assert torch.equal(masked_whiten(x, torch.tensor([[0.0, 0.0, 0.0], [0.0, 1.0, 0.0]]))[1, 1], torch.tensor(0.0))
    assert torch.isfinite(masked_whiten(x, torch.zeros(2, 3))).all()  # nothing trained: no NaN


def test_bad_shapes_and_discounts_are_refused():
    with pytest.raises(ValueError, match="one shape"):
        gae(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3))
    with pytest.raises(ValueError, match="gamma 1.5"):
        gae(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), gamma=1.5)


# -- the gae estimator and the critic's composition rules ----------------------------------------------


def config(*overrides):
    from toolrl.config import load_config

    return load_config(None, [*overrides], data={"env": "arithmetic"})


def test_the_gae_estimator_is_built_in_and_whitens_gae():
    from toolrl.algorithms import VALUES, AdvantageInputs, build_estimator

    estimator = build_estimator(config("algorithm.advantage=gae", "algorithm.advantage_options={gamma: 0.9, lam: 0.5}").algorithm)
    assert (estimator.name, estimator.outcome, estimator.reads) == ("gae", False, {VALUES})
    values = torch.tensor([[0.5, 0.6, 9.0, 0.8], [0.2, -0.4, 0.0, 0.0]])
    inputs = AdvantageInputs(torch.tensor([1.0, -1.0], dtype=torch.float64), torch.tensor([0, 0]), MASK, {VALUES: values})
    raw, returns = gae(token_rewards([1.0, -1.0], MASK), values, MASK, 0.9, 0.5)
    assert torch.allclose(estimator(inputs), torch.where(MASK > 0, masked_whiten(raw, MASK), 0.0))
    assert torch.equal(estimator(inputs) * (1 - MASK), torch.zeros(2, 4))  # 0 on untrained positions
    assert torch.allclose(estimator.value_targets(inputs), returns)
    plain = build_estimator(config("algorithm.advantage=gae", "algorithm.advantage_options={whiten: false}").algorithm)
    assert torch.equal(plain(inputs), gae(token_rewards([1.0, -1.0], MASK), values, MASK)[0])
    with pytest.raises(ValueError, match="needs a critic"):
        estimator(AdvantageInputs(inputs.rewards, inputs.groups, MASK))


def test_gae_gets_the_default_critic_and_a_critic_nothing_reads_is_an_error():
    from toolrl.algorithms.rules import check_algorithm, with_critic
    from toolrl.config import ConfigError, CriticConfig

    assert config("algorithm.advantage=gae").critic is None
    filled = with_critic(config("algorithm.advantage=gae"))
    assert filled.critic == CriticConfig()
    check_algorithm(filled, has_critic=True)
    assert with_critic(config("algorithm.advantage=gae", "critic.lr=0.001")).critic.lr == 0.001
    assert with_critic(config()).critic is None
    with pytest.raises(ConfigError, match=r"^critic: set, but algorithm.advantage=grpo reads no values"):
        with_critic(config("critic.lr=0.001"))
    with pytest.raises(ConfigError, match=r"^algorithm.advantage=gae with algorithm.loss=gspo: a sequence-level"):
        check_algorithm(with_critic(config("algorithm.advantage=gae", "algorithm.loss=gspo")), has_critic=True)


def test_a_value_reading_estimator_must_give_the_critic_targets():
    from toolrl.algorithms import VALUES, AdvantageEstimator
    from toolrl.algorithms.rules import with_critic
    from toolrl.config import ConfigError
    from toolrl.plugins import get_plugins
    from toolrl.plugins.registry import Part

    class ValuesOnly(AdvantageEstimator):
        name = "values_only_test"
        outcome = False
        reads = frozenset({VALUES})

        def __call__(self, inputs):
            return -inputs.fields[VALUES]

    registry = get_plugins().registry
    if not registry.has("advantage_estimators", "values_only_test"):
        registry.add(Part("advantage_estimators", "values_only_test", "tests", ValuesOnly))
    with pytest.raises(ConfigError, match=r"^algorithm.advantage=values_only_test: reads values but gives the "
                                          r"critic no targets"):
        with_critic(config("algorithm.advantage=values_only_test"))


def test_gae_runs_its_recursion_once_for_advantages_and_targets(monkeypatch):
    from toolrl.algorithms import VALUES, AdvantageInputs, build_estimator
    from toolrl.algorithms import gae as module

    calls = []
    monkeypatch.setattr(module, "gae", lambda *a: calls.append(1) or gae(*a))
    estimator = build_estimator(config("algorithm.advantage=gae").algorithm)
    values = torch.tensor([[0.5, 0.6, 9.0, 0.8], [0.2, -0.4, 0.0, 0.0]])

    def inputs(v):  # built afresh for each call, as the trainer does
        return AdvantageInputs(torch.tensor([1.0, -1.0], dtype=torch.float64), torch.tensor([0, 0]), MASK.clone(),
                               {VALUES: v.clone()})

    estimator(inputs(values))
    assert torch.equal(estimator.value_targets(inputs(values)), gae(token_rewards([1.0, -1.0], MASK), values, MASK)[1])
    assert len(calls) == 1
    other = values + 1.0  # the next step's batch: a pass of its own
    assert torch.equal(estimator.value_targets(inputs(other)), gae(token_rewards([1.0, -1.0], MASK), other, MASK)[1])
    assert len(calls) == 2
