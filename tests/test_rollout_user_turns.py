"""An environment's user turns (Tool.respond) and a calc_reward's parts: the user's replies join the
response as mask-0 tokens, exactly the chat template's rendering; the parts reach the trajectory."""

import pytest
from scripted import ScriptedEngine
from toolrl.config import RewardConfig, RolloutConfig
from toolrl.model_sources import qwen_tokenizer
from toolrl.parsers.hermes import HermesParser
from toolrl.rollout import RolloutContext, Route, run_trajectory
from toolrl.rollout.chat import ChatRenderer
from toolrl.schemas import Sample
from toolrl.tools import Tool, ToolSet


class Customer(Tool):
    """A simulated user with two replies, then satisfied; scores the conversation with its parts."""

    schema = {"type": "function", "function": {"name": "lookup", "description": "Look up.",
                                               "parameters": {"type": "object", "properties": {}}}}
    replies = ["My order is 42.", "Thanks, bye."]

    async def respond(self, instance_id, message):
        heard = self.state(instance_id).setdefault("heard", [])
        heard.append(message)
        return self.replies[len(heard) - 1] if len(heard) <= len(self.replies) else None

    async def execute(self, instance_id, arguments, **kw):
        return "found", 0.0, {}

    async def calc_reward(self, instance_id, **kw):
        return {"reward": 0.5, "db": 1.0, "communicate": 0.5, "heard": len(self.state(instance_id)["heard"])}


SAMPLE = Sample(prompt=[{"role": "user", "content": "Hi!"}])
TEXTS = ["<think>\n\n</think>\n\nHow can I help?", "<think>\n\n</think>\n\nLet me see.",
         "<think>\n\n</think>\n\nGlad to help."]


def ctx(tokenizer, texts, tools, max_turns=8):
    return RolloutContext(engine=ScriptedEngine(tokenizer, texts),
                          renderer_factory=lambda schemas: ChatRenderer(tokenizer, schemas),
                          config=RolloutConfig(max_response_tokens=4096),
                          routes={None: Route(tools, max_turns, HermesParser(), [], RewardConfig())})


@pytest.fixture(scope="module")
def tokenizer():
    return qwen_tokenizer("qwen2_5")


async def test_user_turns_are_environment_tokens_and_parts_are_kept(tokenizer):
    traj = await run_trajectory(ctx(tokenizer, TEXTS, {"lookup": Customer()}), SAMPLE, 0, "t0", seed=0)
    assert traj.error is None and traj.termination == "answered" and traj.turns == 3
    assert traj.user_turns == Customer.replies
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi!"}, {"role": "assistant", "content": TEXTS[0]},
         {"role": "user", "content": Customer.replies[0]}, {"role": "assistant", "content": TEXTS[1]},
         {"role": "user", "content": Customer.replies[1]}, {"role": "assistant", "content": TEXTS[2]}],
        tools=[Customer.schema], tokenize=False)
    assert tokenizer.decode(traj.prompt_ids + traj.response_ids, skip_special_tokens=False) + "\n" == rendered
    user_ids = [t for t, m in zip(traj.response_ids, traj.response_mask) if not m]
    assert tokenizer.decode(user_ids).count("My order is 42.") == 1 and "Glad" not in tokenizer.decode(user_ids)
    assert all(lp == 0.0 for lp, m in zip(traj.logprobs, traj.response_mask) if not m)
    assert traj.reward_terms == {"tools": 0.5} and traj.reward == 0.5
    assert traj.reward_parts == {"lookup.db": 1.0, "lookup.communicate": 0.5, "lookup.heard": 3.0}


async def test_user_turn_past_the_turn_limit_ends_the_trajectory(tokenizer):
    traj = await run_trajectory(ctx(tokenizer, TEXTS, {"lookup": Customer()}, max_turns=1), SAMPLE, 0, "t0", seed=0)
    assert traj.termination == "max_turns" and traj.turns == 1 and traj.user_turns == Customer.replies[:1]
    assert all(traj.response_mask)  # the reply no generation reads is not appended


class Broken(Customer):
    async def respond(self, instance_id, message):
        raise ConnectionError("user endpoint down")

    async def calc_reward(self, instance_id, **kw):
        return {"db": 1.0}


async def test_a_failing_user_is_an_error_not_a_crash(tokenizer):
    traj = await run_trajectory(ctx(tokenizer, TEXTS, {"lookup": Broken()}), SAMPLE, 0, "t0", seed=0)
    assert traj.termination == "error" and "user endpoint down" in traj.error
    assert traj.tool_errors == {}  # a mapping without "reward" is the sum of its parts
    assert traj.tool_rewards == {"lookup": 1.0} and traj.reward_parts == {"lookup.db": 1.0}


async def test_tools_without_respond_are_not_asked():
    tools = {"lookup": Customer(), "plain": Tool(tool_schema={"type": "function", "function": {
        "name": "plain", "parameters": {"type": "object", "properties": {}}}})}
    toolset = ToolSet(tools, trajectory_id="t")
    await toolset.start()
    assert await toolset.respond("hello") == "My order is 42."
    await toolset.finish()
