"""The planner and the executor through the real gateway (the official openai client over HTTP, the duo
environment's tags route, the real Qwen3 tokenizer and chat template) in a run with the two roles: a
model stand-in answers each call from what its prompt asks (the planner's problem, the executor's
expression, the calculator's result). Each episode's pieces are one role's each, the planner's reward
is its expression's value against the answer, the executor's its answer against its expression's
value (only where it ran), and the episode's the pair's success."""

from __future__ import annotations

from typing import Any

import pytest
from toolrl.config import load_config
from toolrl.data.sources import load_samples
from toolrl.renderers.chat import ChatRenderer
from toolrl.rollout import RolloutContext, run_rollouts
from toolrl.rollout.routes import build_routes
from toolrl.testing import ScriptedEngine
from toolrl_duo.agent import PLANNER_SYSTEM, answered, planned, value


class Model(ScriptedEngine):
    """Answers each call from its prompt: the planner's reply to the problem in it (``plans``), the
    executor's calculator call on its expression (or ``mental``: an answer in words, no call), then
    ``The answer is`` the result the calculator gave."""

    def __init__(self, tokenizer: Any, plans: dict[str, str], mental: dict[str, str]) -> None:
        super().__init__(tokenizer, [""])
        self.plans, self.mental = plans, mental

    def text(self, session_id: str | None, prompt_ids: list[int]) -> str:
        prompt = self.tokenizer.decode(prompt_ids)
        last = prompt[prompt.rindex("<|im_start|>user"):]
        if PLANNER_SYSTEM in prompt:
            return next(reply for question, reply in self.plans.items() if question in last)
        if "<tool_response>" in last:
            return f"The answer is {last.split('<tool_response>')[1].split('</tool_response>')[0].strip()}."
        expression = last.split("Use the calculator: ")[1].split("<|im_end|>")[0]
        return self.mental.get(expression, f"<calculator>{expression}</calculator>")


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from toolrl.model_sources import qwen_tokenizer

    return qwen_tokenizer("qwen3")


async def test_each_role_is_a_piece_and_has_its_own_reward(tokenizer: Any) -> None:
    config = load_config(None, data={"env": "duo", "rollout": {
        "roles": ["planner", "executor"], "agent": {"callable": "toolrl_duo.agent:run"}}})
    samples = load_samples(config, "test")[:4]
    questions = [s.prompt[-1].content for s in samples]
    right = [s.extra_info["expression"] for s in samples]
    a, op, b = right[1].split()
    wrong = f"{a} {'+' if op != '+' else '*'} {b}"  # the numbers, another operation
    plans = {questions[0]: f"{right[0]} = the answer", questions[1]: wrong, questions[2]: "I cannot tell.",
             questions[3]: right[3]}
    mental = {right[3]: f"The answer is {int(samples[3].ground_truth) + 1}."}  # no calculator call, and wrong
    routes, parts = await build_routes(config, samples)
    ctx = RolloutContext(engine=Model(tokenizer, plans, mental), config=config.rollout, routes=routes,
                         renderer_factory=lambda schemas: ChatRenderer(tokenizer, schemas), roles=config.roles)
    try:
        pieces = await run_rollouts(ctx, samples, n=1, seed=0)
    finally:
        for part in parts:
            await part.close()
        await ctx.close()
    by_episode = {g: [p for p in pieces if p.group == g] for g in range(4)}
    # The executor's calculator call ends at the tag (a stop string, not the end of its turn), so its answer,
    # asked with the result, is a piece of its own.
    assert [[p.role for p in by_episode[g]] for g in range(4)] == [["planner", "executor", "executor"]] * 2 + \
        [["planner"], ["planner", "executor"]]
    assert all(p.error is None for p in pieces)
    episodes = [(by_episode[g][-1].reward, by_episode[g][-1].role_rewards) for g in range(4)]
    assert episodes == [(1.0, {"planner": 1.0, "executor": 1.0}), (0.0, {"planner": 0.0, "executor": 1.0}),
                        (0.0, {"planner": 0.0}), (0.0, {"planner": 1.0, "executor": 0.0})]
    assert all(p.role_rewards == by_episode[p.group][-1].role_rewards for p in pieces)  # every piece knows them
    call, answer = (tokenizer.decode(p.response_ids) for p in by_episode[0][1:])
    assert call == f"<calculator>{right[0]}</calculator>"
    assert answer == f"The answer is {samples[0].ground_truth}.<|im_end|>"


def test_the_replies_are_read_as_the_roles_write_them() -> None:
    assert planned(" 37 * 58 = 2146\nso 2146") == "37 * 58" and planned("") == ""
    assert value("37 * 58") == "2146" and value("37 apples") is None and value("") is None
    assert answered("The answer is 2,146.") == "2146" and answered("12 - 5 = 7.0") == "7" and answered("none") is None
