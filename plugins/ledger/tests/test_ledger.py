"""The ledger environment: its splits and pages, and a whole trajectory through the real agent loop,
routes (built from a config), Qwen2.5 chat template and read_page tool, driven by the rule-following
agent: at model.max_context 4096 it ends at the limit with no context policy and completes, with the
audit key, under summarise and under fold."""

from __future__ import annotations

import pytest
from toolrl.config import Config
from toolrl.data.sources import load_samples, load_split
from toolrl.model_sources import qwen_tokenizer
from toolrl.renderers.families import renderer_factory
from toolrl.rollout import RolloutContext, run_trajectory_pieces
from toolrl.rollout.routes import build_routes
from toolrl_ledger.agent import LedgerAgent
from toolrl_ledger.environment import LEDGER
from toolrl_ledger.pages import audit_key, page_text


@pytest.fixture(scope="module")
def tokenizer():
    return qwen_tokenizer("qwen2_5")


def test_splits_are_disjoint_and_page_one_states_the_key(tokenizer) -> None:
    env, options = LEDGER.resolve({"pages": 32, "train_size": 4, "test_size": 4})
    train, test = load_split(env, "train", options), load_split(env, "test", options)
    seeds = [s.tools_kwargs["read_page"].create_kwargs["seed"] for s in train + test]
    assert len(set(seeds)) == 8 and env.max_turns == 66
    for sample, seed in zip(train + test, seeds):
        assert sample.ground_truth == str(audit_key(seed)) and f"is {sample.ground_truth};" in page_text(seed, 1, 32, 32)
        assert sample.ground_truth not in page_text(seed, 2, 32, 32)
    tokens = len(tokenizer.encode(page_text(seeds[0], 7, 32, 32)))
    assert 800 <= tokens <= 1300  # about 1k tokens a result


async def trajectory(tokenizer, context: dict | None):
    config = Config.model_validate({
        "env": "ledger", "env_options": {"pages": 12, "train_size": 1}, "model": {"max_context": 4096},
        "rollout": {"context": context, "tool_response_max_tokens": 1500, "max_response_tokens": 60_000}})
    (sample,) = load_samples(config)
    routes, owned = await build_routes(config, [sample])
    try:
        ctx = RolloutContext(LedgerAgent(tokenizer), renderer_factory(tokenizer), config.rollout, routes)
        return sample, await run_trajectory_pieces(ctx, sample, 0, "t", seed=0)
    finally:
        for part in owned:
            await part.close()


async def test_without_a_policy_the_trajectory_ends_at_the_limit(tokenizer) -> None:
    _, pieces = await trajectory(tokenizer, None)
    assert [p.termination for p in pieces] == ["length"] and pieces[0].reward == 0.0


async def test_summarise_completes_with_the_key_from_page_one(tokenizer) -> None:
    sample, pieces = await trajectory(tokenizer, {"name": "summarise"})
    assert len(pieces) > 2 and pieces[-1].termination == "answered"
    assert pieces[-1].reward == 1.0 and sample.ground_truth in pieces[-1].final_response
    assert all(len(p.prompt_ids) + len(p.response_ids) <= 4096 for p in pieces)
    assert all(p.edit is not None and p.edit.summary.startswith(f"Audit key: {sample.ground_truth}.") for p in pieces[1:])


async def test_fold_completes_with_the_key_reading_the_pages_in_branches(tokenizer) -> None:
    sample, pieces = await trajectory(tokenizer, {"name": "fold"})
    *branches, main = pieces
    assert main.termination == "answered" and main.reward == 1.0 and sample.ground_truth in main.final_response
    assert [b.edit.task for b in branches] == [f"Read pages {n} to {min(n + 1, 12)} of 12." for n in range(2, 13, 2)]
    assert all(b.edit.result == f"Pages read: 1-{min(n + 1, 12)} of 12." for b, n in zip(branches, range(2, 13, 2)))
    assert [r.arguments["n"] for r in main.tool_results if r.name == "read_page"] == [1]  # the rest in branches
    assert all(len(p.prompt_ids) + len(p.response_ids) <= 4096 for p in pieces)


def test_an_adapter_per_role_is_refused_at_the_run_check() -> None:
    from toolrl.config import ConfigError, load_config
    from toolrl.processes.resolve import run_plan

    config = load_config(None, data={"env": "arithmetic", "engine": {"name": "ledger_agent"},
                                     "model": {"adapters": {"planner": {"r": 4}}}})
    with pytest.raises(ConfigError, match=r"model.adapters: several policies need an engine that serves LoRA adapters "
                                          r"\(transformers, vllm\); the ledger_agent engine serves none"):
        run_plan(config, engine_cls=LedgerAgent)
