import asyncio
import json

import pytest
from toolrl.config import RewardConfig, RolloutConfig
from toolrl.model_sources import qwen_tokenizer
from toolrl.parsers.hermes import HermesParser
from toolrl.parsers.tags import TagParser
from toolrl.renderers.chat import ChatRenderer
from toolrl.rewards.builtin import GSM8KReward
from toolrl.rollout import RolloutContext, Route, run_rollouts, run_trajectory
from toolrl.schemas import Sample
from toolrl.testing import ScriptedEngine
from toolrl.tools import Tool


class Add(Tool):
    schema = {"type": "function", "function": {
        "name": "add", "description": "Add two integers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                       "required": ["a", "b"], "additionalProperties": False}}}
    lifecycle: list[str] = []

    async def create(self, instance_id=None, **kw):
        self.lifecycle.append("create")
        return await super().create(instance_id, **kw)

    async def execute(self, instance_id, arguments, **kw):
        if kw.get("sleep"):
            await asyncio.sleep(kw["sleep"])
            self.slept_until = asyncio.get_running_loop().time()
        return str(arguments["a"] + arguments["b"]), 0.25, {}

    async def calc_reward(self, instance_id, **kw):
        self.lifecycle.append("calc_reward")
        return 0.5

    async def release(self, instance_id, **kw):
        self.lifecycle.append("release")
        await super().release(instance_id)


class Calc(Tool):
    schema = {"type": "function", "function": {
        "name": "calculator", "description": "Evaluate.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}

    async def execute(self, instance_id, arguments, **kw):
        a, b = arguments["expression"].split("+")
        return str(int(a) + int(b)), 0.0, {}


def call(name, **args):
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


@pytest.fixture(scope="module", params=["qwen2_5", "qwen3"])
def tokenizer(request):
    return qwen_tokenizer(request.param)


def make_ctx(tokenizer, engine, tools, parser=None, rewards=(), **cfg):
    return RolloutContext(
        engine=engine, renderer_factory=lambda schemas: ChatRenderer(tokenizer, schemas), config=RolloutConfig(**cfg),
        routes={None: Route(tools, cfg.get("max_turns", 4), parser or HermesParser(), list(rewards), RewardConfig())})


SAMPLE = Sample(prompt=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+3 and 4+5?"}],
                ground_truth="14")


def turns_for(tokenizer, texts):
    """What a real model of this family emits: Qwen3 opens each turn with a reasoning block."""
    if "<think>" in tokenizer.get_vocab() and tokenizer.chat_template.count("reasoning_content") > 0:
        return [f"<think>\nstep {i}\n</think>\n\n{t}" for i, t in enumerate(texts)]
    return texts


async def test_multi_turn_masks_are_token_exact(tokenizer):
    texts = turns_for(tokenizer, [
        "Let me add.\n" + call("add", a=2, b=3) + "\n" + call("add", a=4, b=5),
        "Now check: " + call("add", a=5, b=9),
        "The answer is #### 14",
    ])
    engine = ScriptedEngine(tokenizer, texts)
    add = Add()
    ctx = make_ctx(tokenizer, engine, {"add": add}, rewards=[("gsm8k", 1.0, GSM8KReward())])
    traj = await run_trajectory(ctx, SAMPLE, 0, "t0", seed=0)
    assert traj.termination == "answered" and traj.turns == 3 and traj.error is None

    # Every model token is trained, and nothing else.
    model_runs, run, prev = [], [], 1
    for tok, m in zip(traj.response_ids, traj.response_mask):
        if m:
            run.append(tok)
        elif prev:
            model_runs.append(run)
            run = []
        prev = m
    model_runs.append(run)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert [r for r in model_runs if r] == [tokenizer.encode(t, add_special_tokens=False) + [eos] for t in texts]
    assert all(lp == 0.0 for lp, m in zip(traj.logprobs, traj.response_mask) if not m)
    assert all(lp == -1.0 for lp, m in zip(traj.logprobs, traj.response_mask) if m)

    # The sequence is exactly the template's own rendering of the final conversation.
    messages = [m.to_template() for m in SAMPLE.prompt]
    messages += [{"role": "assistant", "content": texts[0]},
                 {"role": "tool", "content": "5"}, {"role": "tool", "content": "9"},
                 {"role": "assistant", "content": texts[1]}, {"role": "tool", "content": "14"},
                 {"role": "assistant", "content": texts[2]}]
    rendered = tokenizer.apply_chat_template(messages, tools=[Add.schema], tokenize=False)
    decoded = tokenizer.decode(traj.prompt_ids + traj.response_ids, skip_special_tokens=False)
    assert decoded + "\n" == rendered
    # Each generation request extended the previous sequence (append-only, token level).
    seqs = [c.prompt_ids for c in engine.calls]
    assert all(b[: len(a)] == a for a, b in zip(seqs, seqs[1:]))

    assert traj.reward_terms == {"gsm8k": 1.0, "tools": 0.5, "steps": 0.75}
    assert traj.reward == pytest.approx(2.25)
    assert Add.lifecycle[-2:] == ["calc_reward", "release"] and add._instances == {}


async def test_parse_errors_and_excess_calls_go_back_to_the_model(tokenizer):
    texts = ["<tool_call>{bad json}</tool_call>" + call("add", a=1, b=1) + call("add", a=2, b=2)
             + call("add", a=3, b=3), "done"]
    engine = ScriptedEngine(tokenizer, texts)
    traj = await run_trajectory(make_ctx(tokenizer, engine, {"add": Add()}, max_parallel_calls=2),
                                SAMPLE, 0, "t1", seed=0)
    second_prompt = tokenizer.decode(engine.calls[1].prompt_ids)
    assert "invalid JSON in tool call" in second_prompt
    assert "at most 2 tool calls run per turn" in second_prompt
    assert [r.status for r in traj.tool_results] == ["ok", "ok", "error"]
    assert len(traj.parse_errors) == 1


async def test_tool_responses_are_truncated_to_the_token_budget(tokenizer):
    class Verbose(Add):
        async def execute(self, instance_id, arguments, **kw):
            return " ".join(str(i) for i in range(500)), 0.0, {}

    engine = ScriptedEngine(tokenizer, [call("add", a=1, b=1), "ok"])
    await run_trajectory(make_ctx(tokenizer, engine, {"add": Verbose()}, tool_response_max_tokens=20,
                                  tool_response_truncation="keep_head_and_tail"), SAMPLE, 0, "t2", seed=0)
    prompt = tokenizer.decode(engine.calls[1].prompt_ids)
    assert "<tool_response>\n0 1 2 3" in prompt and "tokens truncated]" in prompt and "498 499\n</tool_response>" in prompt


async def test_limits_and_termination_reasons(tokenizer):
    engine = ScriptedEngine(tokenizer, [call("add", a=1, b=1)] * 5)
    traj = await run_trajectory(make_ctx(tokenizer, engine, {"add": Add()}, max_turns=2), SAMPLE, 0, "t3", seed=0)
    assert traj.termination == "max_turns" and traj.turns == 2 and len(traj.tool_results) == 2
    engine = ScriptedEngine(tokenizer, ["word " * 50])
    traj = await run_trajectory(make_ctx(tokenizer, engine, {}, max_new_tokens=10, max_response_tokens=10),
                                SAMPLE, 0, "t4", seed=0)
    assert traj.termination == "max_response_tokens" and len(traj.response_ids) == 10


async def test_lifecycle_completes_when_the_engine_fails(tokenizer):
    class Broken(ScriptedEngine):
        async def generate(self, *a, **k):
            raise RuntimeError("engine died")

    add = Add()
    Add.lifecycle = []
    traj = await run_trajectory(make_ctx(tokenizer, Broken(tokenizer, []), {"add": add}), SAMPLE, 0, "t5", seed=0)
    assert traj.termination == "error" and "engine died" in traj.error
    assert Add.lifecycle == ["create", "calc_reward", "release"] and add._instances == {}


async def test_slow_tool_does_not_hold_up_other_trajectories(tokenizer):
    """Trajectory 'slow' waits 3 s on its tool; the others finish all their turns meanwhile (an
    ordering check, not a timing one: the machine may be loaded)."""
    scripts = {"s0-": [call("add", a=1, b=1), "done"], "s1-": [call("add", a=1, b=1), "done"]}
    engine = ScriptedEngine(tokenizer, scripts)
    slow = SAMPLE.model_copy(update={"index": 0, "tools_kwargs": {"add": {"execute_kwargs": {"sleep": 3.0}}}})
    fast = SAMPLE.model_copy(update={"index": 1})
    add = Add()
    ctx = make_ctx(tokenizer, engine, {"add": add})
    start = asyncio.get_running_loop().time()
    trajs = await run_rollouts(ctx, [slow, fast], n=3, seed=0)
    assert all(t.termination == "answered" for t in trajs)
    fast_done = max(c.at for c in engine.calls if c.session_id.startswith("s1-"))
    assert fast_done < add.slept_until and add.slept_until - start >= 3.0
    assert sorted(engine.ended) == sorted({c.session_id for c in engine.calls})


async def test_per_environment_routing(tokenizer):
    engine = ScriptedEngine(tokenizer, [call("calculator", expression="1+2"), call("add", a=1, b=2), "x"])
    ctx = make_ctx(tokenizer, engine, {"add": Add(), "calculator": Calc()})
    default = ctx.routes[None]
    ctx.routes["math"] = Route({"calculator": default.tools["calculator"]}, 2, default.parser, [], RewardConfig())
    sample = SAMPLE.model_copy(update={"env": "math"})
    traj = await run_trajectory(ctx, sample, 0, "t6", seed=0)
    assert [r.status for r in traj.tool_results] == ["ok", "unknown_tool"]
    assert traj.termination == "max_turns" and traj.env == "math"
    assert '"name": "add"' not in tokenizer.decode(traj.prompt_ids)
    with pytest.raises(KeyError, match="environment 'ghost' is not configured"):  # load_samples checks first
        await run_trajectory(ctx, SAMPLE.model_copy(update={"env": "ghost"}), 0, "t6b", seed=0)


async def test_inline_tags_resume_inside_the_turn(tokenizer):
    engine = ScriptedEngine(tokenizer, ["Compute <calculator>2+3</calculator>", " so the answer is #### 14"])
    ctx = make_ctx(tokenizer, engine, {"calculator": Calc()},
                   parser=TagParser(tags={"calculator": {"tool": "calculator", "argument": "expression"}}),
                   rewards=[("gsm8k", 1.0, GSM8KReward())])
    traj = await run_trajectory(ctx, SAMPLE, 0, "t7", seed=0)
    text = tokenizer.decode(traj.response_ids)
    assert text == "Compute <calculator>2+3</calculator>\n```output\n5\n```\n so the answer is #### 14<|im_end|>"
    masked_out = tokenizer.decode([t for t, m in zip(traj.response_ids, traj.response_mask) if not m])
    assert masked_out == "\n```output\n5\n```\n"
    assert traj.reward_terms["gsm8k"] == 1.0 and "output" not in traj.final_response
