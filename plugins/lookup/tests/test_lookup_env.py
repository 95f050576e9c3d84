"""The ``lookup-chain`` environment: disjoint seeded splits, the worked example, and its session
through the real rollout loop (tags parser, Qwen3 tokenizer and chat template, tool lifecycle) with
a scripted engine standing in for the model: a solved episode, a lost one and one with a failed
lookup, their scores, turns and per-turn calls."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner
from toolrl.cli import cli
from toolrl.config import ConfigError, load_config
from toolrl.data.sources import load_samples, load_split
from toolrl.plugins import get_plugins
from toolrl.processes.evaluate import turn_outcomes
from toolrl.renderers.chat import ChatRenderer
from toolrl.rollout import RolloutContext, run_rollouts
from toolrl.rollout.routes import build_routes
from toolrl.testing import ScriptedEngine
from toolrl.testing.environments import listed_environments
from toolrl_lookup.environment import LOOKUP_CHAIN, TAG_ROUTES, held_out


def split(options: dict, name: str) -> list:
    env, validated = LOOKUP_CHAIN.resolve(options)
    return load_split(env, name, validated)


@pytest.mark.parametrize("hops", [1, 2, 3])
def test_splits_are_disjoint_seeded_and_consistent(hops: int) -> None:
    options = {"hops": hops, "train_size": 300, "test_size": 50}
    train, test = split(options, "train"), split(options, "test")
    chains = [tuple(s.extra_info["chain"]) for s in train], [tuple(s.extra_info["chain"]) for s in test]
    assert set(chains[0]).isdisjoint(chains[1]) and len(set(chains[1])) == 50 and len(chains[0]) == 300
    assert all(held_out(list(c)) for c in chains[1]) and not any(held_out(list(c)) for c in chains[0])
    for s in train + test:
        chain = s.extra_info["chain"]
        assert len(chain) == hops + 1 and s.ground_truth == chain[-1] and f"key {chain[0]}." in s.prompt[0].content
        assert len(set(chain)) == len(chain)  # every key names one position
    assert [s.prompt for s in split(options, "train")] == [s.prompt for s in train]
    assert [s.prompt for s in split({**options, "seed": 1}, "train")] != [s.prompt for s in train]


def test_configured_prompt_parser_and_listing() -> None:
    sample = load_samples(load_config(None, data={"env": "lookup-chain", "env_options": {"hops": 2}}))[0]
    assert [m.role for m in sample.prompt] == ["system", "user", "assistant", "user"]
    example = sample.prompt[2].content
    assert example.count("<lookup>") == 3 and example.endswith("<answer>731</answer>")
    assert "```output\n23: the value is 731\n```" in example  # rendered as the tags parser inserts results
    env, _ = LOOKUP_CHAIN.resolve({"hops": 3, "max_failures": 0})
    assert env.max_turns == 5 and env.session_options == {"max_failures": 0, "progress": 0.2} and env.parser_options == TAG_ROUTES
    parser = get_plugins().load_part("tool_parsers", "tags")(**env.parser_options)
    assert [c.arguments for c in parser.parse("<lookup>owl</lookup> <answer>7</answer>").calls] == [
        {"key": "owl"}, {"value": "7"}]
    assert "lookup-chain" in {e["name"] for e in listed_environments()}
    with pytest.raises(ConfigError, match="hops"):
        LOOKUP_CHAIN.resolve({"hops": 9})
    shown = CliRunner().invoke(cli, ["env", "show", "lookup-chain"])
    assert shown.exit_code == 0, shown.output
    assert "  session: lookup-chain\n" in shown.output and "  session_options: {'max_failures': 2" in shown.output


async def test_session_keeps_state_feeds_back_and_ends_the_episode(qwen3_tokenizer: Any) -> None:
    config = load_config(None, data={"env": "lookup-chain", "env_options": {"max_failures": 0}})
    samples = load_samples(config, "test")[:3]
    (a, k1, va), (b, k2, _), (c, k3, vc) = (s.extra_info["chain"] for s in samples)
    scripts = {  # 0 solves it; 1 looks up the second key before it was revealed (lost: max_failures 0);
        # 2 follows the chain but answers before the last lookup, with the value it guessed
        "s0-": [f"<lookup>{a}</lookup>", f"Next: <lookup>{k1}</lookup>", f"<answer>{va}</answer>"],
        "s1-": [f"<lookup>{k2}</lookup>"],
        "s2-": [f"<lookup>{c}</lookup>", f"<answer>{vc}</answer>"],
    }
    routes, parts = await build_routes(config, samples)
    ctx = RolloutContext(engine=ScriptedEngine(qwen3_tokenizer, scripts), config=config.rollout, routes=routes,
                         renderer_factory=lambda schemas: ChatRenderer(qwen3_tokenizer, schemas))
    try:
        solved, lost, early = await run_rollouts(ctx, samples, n=1, seed=0)
    finally:
        for part in parts:
            await part.close()
    assert [(r.name, r.status, r.turn, r.response.text) for r in solved.tool_results] == [
        ("lookup", "ok", 1, f"{a}: look up {k1} next"), ("lookup", "ok", 2, f"{k1}: the value is {va}"),
        ("answer", "ok", 3, "correct")]
    assert solved.termination == "done" and solved.turns == 3 and solved.reward == 1.0 and solved.error is None
    # The results are inline in the response: the model's tokens are trained, the results' are not.
    text = qwen3_tokenizer.decode(solved.response_ids)
    assert f"```output\n{a}: look up {k1} next\n```" in text
    model = qwen3_tokenizer.decode([t for t, m in zip(solved.response_ids, solved.response_mask) if m])
    assert "next" not in model and model.count("<lookup>") == 2
    assert lost.tool_results[0].status == "error" and f"look up {b}" in lost.tool_results[0].response.text
    assert lost.termination == "done" and lost.turns == 1 and lost.reward == 0.0 and turn_outcomes(lost) == [False]
    # One of two hops looked up: partial credit, never a solved episode's; the answer is an error.
    assert early.termination == "done" and early.reward == pytest.approx(0.1) and early.tool_results[1].status == "error"
