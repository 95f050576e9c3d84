"""Context policies (toolrl.context): built through build_part, and each edit a new segment of the
trajectory, trained token-exact: every generated token in exactly one segment, each segment's tokens
the template's rendering of its context, the summary turn trained. Real Qwen2.5 tokenizer and chat
template, real agent loop and tools; the model's turns are scripted (tests/scripted.py)."""

from __future__ import annotations

import asyncio
import json

import pytest
import torch
from toolrl.algorithms.advantages import Grpo
from toolrl.config import AlgorithmConfig, Config, ConfigError, RewardConfig, RolloutConfig
from toolrl.context import SUMMARY_HEADER, SUMMARY_REQUEST
from toolrl.engines import Generation
from toolrl.model_sources import qwen_tokenizer
from toolrl.parsers.hermes import HermesParser
from toolrl.renderers.chat import ChatRenderer
from toolrl.rollout import RolloutContext, Route, run_trajectory_pieces
from toolrl.rollout.routes import build_context_policy
from toolrl.schemas import Sample
from toolrl.testing import ScriptedEngine
from toolrl.tools import Tool
from toolrl.training.step import token_advantages

PAGES = 8
SUMMARY = "The code is 4417. Pages 1-5 are read; pages 6-8 remain."


class Page(Tool):
    """Page n of a ledger: about 120 tokens of filler; page 1 holds the code."""

    schema = {"type": "function", "function": {
        "name": "page", "description": "Read a page.",
        "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}}}

    async def execute(self, instance_id, arguments, **kw):
        n = arguments["n"]
        head = "The code is 4417. " if n == 1 else ""
        return head + " ".join(f"row{n}.{i} amount {7 * i + n}" for i in range(24)), 0.0, {}


def call(n: int) -> str:
    return "<tool_call>\n" + json.dumps({"name": "page", "arguments": {"n": n}}) + "\n</tool_call>"


SAMPLE = Sample(prompt=[{"role": "system", "content": "Read every page, then say the code."},
                        {"role": "user", "content": "What is the code?"}], ground_truth="4417")
CALLS = [f"Reading page {n}.\n{call(n)}" for n in range(1, PAGES + 1)]
ANSWER = "The code is 4417."


@pytest.fixture(scope="module")
def tokenizer():
    return qwen_tokenizer("qwen2_5")


def config(context: dict | None, max_context: int | None = 1024) -> Config:
    return Config.model_validate({"data": {"train_files": ["x.jsonl"]}, "model": {"max_context": max_context},
                                  "rollout": {"context": context}})


def test_policies_are_built_through_build_part_with_one_line_errors():
    assert build_context_policy(config(None)).name == "none"
    assert build_context_policy(config({"name": "window", "keep_turns": 3})).options.keep_turns == 3
    assert build_context_policy(config({"name": "summarise"})).trigger == 512  # half of max_context
    with pytest.raises(ConfigError, match=r"^rollout.context.name: unknown context policy 'windw'.*did you mean 'window'"):
        build_context_policy(config({"name": "windw"}))
    with pytest.raises(ConfigError, match=r"^rollout.context.keep_turn: unknown key \(did you mean 'keep_turns'\?\)"):
        build_context_policy(config({"name": "window", "keep_turn": 3}))
    with pytest.raises(ConfigError, match=r"^rollout.context: window needs trigger_tokens or model.max_context$"):
        build_context_policy(config({"name": "window"}, max_context=None))
    with pytest.raises(ConfigError, match=r"^rollout.context: trigger_tokens \(800\) \+ max_summary_tokens \(256\)"):
        build_context_policy(config({"name": "summarise", "trigger_tokens": 800}))


class SummarisingEngine(ScriptedEngine):
    """The scripted turns, and SUMMARY whenever the prompt ends with the summary request (a model
    asked to summarise); the script goes on where it was after the summary."""

    async def generate(self, prompt_ids, params, n=1, session_id=None, images=()):
        if SUMMARY_REQUEST in self.tokenizer.decode(prompt_ids[-80:]):
            ids = self.tokenizer.encode(SUMMARY, add_special_tokens=False) + [params.stop_token_ids[0]]
            self.summaries += 1
            return [Generation(ids, [-0.25] * len(ids), "stop", params.stop_token_ids[0])]
        return await super().generate(prompt_ids, params, n, session_id, images)


def run(tokenizer, context: dict | None, max_context: int = 1024, script: list[str] = (*CALLS, ANSWER)):
    engine = SummarisingEngine(tokenizer, list(script))
    engine.summaries = 0
    policy = build_context_policy(config(context, max_context))
    route = Route({"page": Page()}, 40, HermesParser(), [], RewardConfig(), context=policy)
    ctx = RolloutContext(engine=engine, renderer_factory=lambda schemas: ChatRenderer(tokenizer, schemas),
                         config=RolloutConfig(max_response_tokens=20_000, max_new_tokens=256), routes={None: route})
    pieces = asyncio.run(run_trajectory_pieces(ctx, SAMPLE, 0, "t", seed=0))
    return pieces, engine, ctx.renderer(route)


def generated(tokenizer, engine) -> int:
    """The tokens the engine generated for the trajectory (each scripted turn and summary + its end)."""
    turns = len(engine.calls)  # the scripted turns (a summary is not a call of the script)
    texts = CALLS[:turns] + [SUMMARY] * engine.summaries
    if turns > len(CALLS):
        texts.append(ANSWER)
    return sum(len(tokenizer.encode(t, add_special_tokens=False)) + 1 for t in texts)


def page_turn(n: int) -> list[dict]:
    """Page n's turn as the conversation holds it: the model's call, the tool's result."""
    result = asyncio.run(Page().execute("i", {"n": n}))[0]
    return [{"role": "assistant", "content": CALLS[n - 1]}, {"role": "tool", "name": "page", "content": result}]


def pages(first: int, last: int) -> list[dict]:
    return [m for n in range(first, last + 1) for m in page_turn(n)]


TASK = [m.to_template() for m in SAMPLE.prompt]


def assert_segment(renderer, piece, context: list[dict], after: list[dict]) -> None:
    """The segment's prompt is the template's rendering of its context, and prompt + response the
    template's rendering of the context and what followed it (up to the newline the template writes
    after the closing turn, which the next segment's tokens hold)."""
    assert piece.prompt_ids == renderer.conversation_ids(context)
    whole = renderer._render(context + after, False, renderer.tool_schemas)
    ids = piece.prompt_ids + piece.response_ids
    assert whole[:len(ids)] == ids and len(whole) - len(ids) <= 1


def assert_trained_once(tokenizer, engine, pieces) -> None:
    assert sum(sum(p.response_mask) for p in pieces) == generated(tokenizer, engine)
    assert all(len(p.response_ids) == len(p.response_mask) == len(p.logprobs) for p in pieces)
    assert [p.piece for p in pieces] == list(range(len(pieces)))
    assert {p.key for p in pieces} == {"t"} and [p.edit is not None for p in pieces] == [False] + [True] * (len(pieces) - 1)


def test_none_ends_the_trajectory_where_its_context_is_full(tokenizer):
    pieces, engine, _ = run(tokenizer, None)
    (traj,) = pieces
    assert traj.termination == "length" and traj.edit is None
    assert len(traj.prompt_ids) + len(traj.response_ids) <= 1024 and traj.response_mask[-1] == 1
    assert len(engine.calls[-1].prompt_ids) + 300 > 1024  # the next result would not have fitted


def test_window_keeps_the_task_and_the_last_turns_each_segment_token_exact(tokenizer):
    pieces, engine, renderer = run(tokenizer, {"name": "window", "keep_turns": 1})
    assert len(pieces) > 1 and pieces[-1].termination == "answered"
    assert [p.termination for p in pieces[:-1]] == ["forked"] * (len(pieces) - 1)
    assert_trained_once(tokenizer, engine, pieces)
    cuts = [0] + [p.edit.turn for p in pieces[1:]] + [PAGES + 1]
    for k, piece in enumerate(pieces):
        start, end = cuts[k], cuts[k + 1]  # the segment holds the pages after start, up to end's call
        context = TASK + (page_turn(start) if start else [])
        after = pages(start + 1, end - 1) + [{"role": "assistant", "content": (CALLS + [ANSWER])[end - 1]}]
        assert_segment(renderer, piece, context, after)
        assert piece.edit is None or (piece.edit.action == "window" and piece.edit.tokens_after < piece.edit.tokens_before)
        assert len(piece.prompt_ids) + len(piece.response_ids) <= 1024


def test_drop_tool_outputs_stubs_older_results_each_segment_token_exact(tokenizer):
    pieces, engine, renderer = run(tokenizer, {"name": "drop_tool_outputs", "keep_last": 1})
    assert len(pieces) > 1 and pieces[-1].termination == "answered"
    assert_trained_once(tokenizer, engine, pieces)
    stub = "[tool output dropped to save context]"
    cuts = [0] + [p.edit.turn for p in pieces[1:]] + [PAGES + 1]
    for k, piece in enumerate(pieces):
        start, end = cuts[k], cuts[k + 1]
        context = TASK + [dict(m, content=stub) if m["role"] == "tool" and i < 2 * (start - 1) else m
                          for i, m in enumerate(pages(1, start))]
        after = pages(start + 1, end - 1) + [{"role": "assistant", "content": (CALLS + [ANSWER])[end - 1]}]
        assert_segment(renderer, piece, context, after)


def test_summarise_trains_the_summary_turn_and_goes_on_from_the_task_and_it(tokenizer):
    pieces, engine, renderer = run(tokenizer, {"name": "summarise"})
    assert len(pieces) > 1 and engine.summaries == len(pieces) - 1 and pieces[-1].termination == "answered"
    assert_trained_once(tokenizer, engine, pieces)
    summary_ids = tokenizer.encode(SUMMARY, add_special_tokens=False) + [renderer.eos_id]
    read = 0
    for k, piece in enumerate(pieces):
        # The closed segment ends with the summary, trained (mask 1, the engine's logprobs).
        if k < len(pieces) - 1:
            assert piece.response_ids[-len(summary_ids):] == summary_ids
            assert piece.response_mask[-len(summary_ids):] == [1] * len(summary_ids)
            assert piece.logprobs[-len(summary_ids):] == [-0.25] * len(summary_ids)
            upto = pieces[k + 1].edit.turn - (k + 1)  # the pages read when it was asked for
            after = pages(read + 1, upto) + [{"role": "user", "content": SUMMARY_REQUEST},
                                             {"role": "assistant", "content": SUMMARY}]
        else:
            upto = PAGES
            after = pages(read + 1, upto) + [{"role": "assistant", "content": ANSWER}]
        context = TASK + ([{"role": "user", "content": SUMMARY_HEADER + SUMMARY}] if k else [])
        assert_segment(renderer, piece, context, after)
        assert piece.edit is None or piece.edit.summary == SUMMARY
        read = upto


def test_segments_share_the_trajectory_advantage_counted_once(tokenizer):
    """GRPO groups over trajectories, not segments: every segment of a trajectory gets its number,
    and a trajectory cut into more segments weighs no more in its group's statistics."""
    long, _, _ = run(tokenizer, {"name": "window", "keep_turns": 1})
    whole, _, _ = run(tokenizer, {"name": "none"}, max_context=8192)
    for p in long:
        p.reward = 1.0
    other = whole[0].model_copy(update={"trajectory_id": "u", "reward": 0.0})
    batch = [*long, other]
    algo = AlgorithmConfig()
    adv = token_advantages(batch, Grpo(Grpo.Options(), algo), 20_000, algo)
    assert torch.allclose(adv[:len(long), 0], adv[0, 0]) and adv[0, 0] > 0 > adv[-1, 0]
    assert torch.isclose(adv[0, 0], -adv[-1, 0])  # two trajectories, not len(long) + 1


def test_an_environment_sets_its_own_policy_and_the_config_overrides_it():
    from toolrl.environments import Environment

    env = Environment(name="long", splits={"train": lambda options, split: []},
                      context={"name": "window", "keep_turns": 1})
    assert build_context_policy(config(None), env).options.keep_turns == 1
    assert build_context_policy(config({"name": "summarise"}), env).name == "summarise"
    bad = env.model_copy(update={"context": {"name": "window", "keep_turn": 1}})
    with pytest.raises(ConfigError, match=r"^environment 'long' context.keep_turn: unknown key"):
        build_context_policy(config(None), bad)


def test_segments_pack_as_a_prefix_tree_training_each_generated_token_once(tokenizer):
    """The trainer's packed row of a trajectory's segments: the task they share is held once, and the
    tokens the loss trains are exactly the generated ones, each once, in order."""
    from toolrl.training.packing import build_batch, input_length

    pieces, engine, _ = run(tokenizer, {"name": "summarise"})
    batch = build_batch(pieces, [1.0] * len(pieces), share_prefixes=True)
    assert batch.tokens < batch.total_tokens == sum(input_length(p) for p in pieces)
    assert int(batch.response_mask.sum()) == generated(tokenizer, engine)
    trained = batch.response_mask[batch.rows, batch.cols] > 0
    assert batch.targets[trained].tolist() == [t for p in pieces for t, m in zip(p.response_ids, p.response_mask) if m]


def test_a_misnamed_policy_is_one_error_line_from_the_command(tmp_path):
    import yaml
    from click.testing import CliRunner
    from toolrl.cli import cli

    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"model": {"source": "tiny-qwen3", "max_context": 2048}, "env": "arithmetic",
                                    "env_options": {"train_size": 4}, "rollout": {"context": {"name": "windw"}}}))
    result = CliRunner().invoke(cli, ["rollout", str(path)])
    assert result.exit_code == 2 and result.stderr.strip().splitlines() == [
        f"error: {path}:9: rollout.context.name: unknown context policy 'windw' (did you mean 'window'? "
        "available: drop_tool_outputs, fold, none, summarise, window, summarize (= summarise))"], result.stderr
