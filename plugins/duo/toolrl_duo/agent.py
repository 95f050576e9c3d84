"""The planner and the executor: an agent program of two roles, each a model name at the gateway.

The planner (model ``planner``) reads the word problem and writes one arithmetic expression; the
executor (model ``executor``) gets that expression, runs the calculator on it (an inline
``<calculator>…</calculator>`` call, which the run's ``tags`` parser turns into a function call) and
answers ``The answer is N.``. Each role has its own metric, which is its reward
(``{"reward": x, "role": r}`` posted to the episode's reward URL): the planner's expression has the
problem's answer as its value; the executor's answer is the value of the expression it was given.
The episode's reward, returned, is the pair's success: the final answer is the problem's answer.
A planner reply that is no expression ends the episode there (the executor has nothing to run).

Run by toolrl once per episode as ``rollout.agent: {callable: "toolrl_duo.agent:run"}``; the client
is the official ``openai`` one. Of toolrl it uses nothing but the endpoint's reward URL.
"""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
from openai import AsyncOpenAI
from toolrl_calculator.evaluate import CalculatorError, evaluate, format_number

PLANNER, EXECUTOR = "planner", "executor"  # the roles: the model names each asks the gateway for
PLANNER_SYSTEM = ("You turn a word problem into one arithmetic expression: its two numbers and one of + - *. "
                  "Reply with the expression only.")
# Worked problems, shown as turns the model wrote: small models copy a format they see.
PLANNER_EXAMPLES = [{"role": "user", "content": "A box holds 12 pens. How many pens are in 34 boxes?"},
                    {"role": "assistant", "content": "12 * 34"},
                    {"role": "user", "content": "Tom has 45 marbles and finds 23 more. How many marbles does Tom have?"},
                    {"role": "assistant", "content": "45 + 23"},
                    {"role": "user", "content": "A jar holds 67 sweets and 25 are eaten. How many sweets are left?"},
                    {"role": "assistant", "content": "67 - 25"}]
EXECUTOR_SYSTEM = ("You work out an arithmetic expression. Never compute in your head: write it in "
                   "<calculator></calculator> tags and the calculator's result comes back. Then reply with: "
                   "The answer is N.")
ASK = "Use the calculator: {}"  # the executor's task, as its user turn
EXECUTOR_EXAMPLE = [{"role": "user", "content": ASK.format("12 * 34")},
                    {"role": "assistant", "content": "<calculator>12 * 34</calculator>"},
                    {"role": "user", "content": "<tool_response>\n408\n</tool_response>"},
                    {"role": "assistant", "content": "The answer is 408."}]
CALCULATOR = {"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}
EXECUTOR_CALLS = 3  # model calls the executor gets: a calculator call, its answer, one more try
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def value(expression: str) -> str | None:
    """``expression``'s value as the calculator writes it, or None where it has none."""
    try:
        return format_number(evaluate(expression))
    except CalculatorError:
        return None


def planned(reply: str) -> str:
    """The expression in a planner's reply: its first line, up to an ``=`` (the model often goes on with
    ``= result``, which is the executor's part)."""
    lines = reply.strip().splitlines()
    return lines[0].split("=")[0].strip() if lines else ""


def answered(reply: str) -> str | None:
    """The executor's answer: the last number of its final reply."""
    numbers = NUMBER.findall(reply.replace(",", ""))
    return format_number(float(numbers[-1])) if numbers else None


async def plan(client: AsyncOpenAI, question: str) -> str:
    reply = await client.chat.completions.create(
        model=PLANNER, max_tokens=24,
        messages=[{"role": "system", "content": PLANNER_SYSTEM}, *PLANNER_EXAMPLES, {"role": "user", "content": question}])
    return planned(reply.choices[0].message.content or "")


async def execute(client: AsyncOpenAI, expression: str) -> str | None:
    """The executor's loop: the calculator run on each call it makes, until it answers in text."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": EXECUTOR_SYSTEM}, *EXECUTOR_EXAMPLE,
                                      {"role": "user", "content": ASK.format(expression)}]
    for _ in range(EXECUTOR_CALLS):
        reply = await client.chat.completions.create(model=EXECUTOR, messages=messages, tools=[CALCULATOR],
                                                     max_tokens=32)
        message = reply.choices[0].message
        if not message.tool_calls:
            return answered(message.content or "")
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            arguments = json.loads(call.function.arguments or "{}")
            result = value(str(arguments.get("expression", "")))
            messages.append({"role": "tool", "tool_call_id": call.id,
                             "content": result if result is not None else "error: not an arithmetic expression"})
    return None  # out of calls: no answer


async def episode(task: dict[str, Any], client: AsyncOpenAI) -> tuple[float, dict[str, float]]:
    """One episode: the pair's success, and each role's reward (the executor's only where it ran)."""
    truth = str(task["ground_truth"])
    expression = await plan(client, task["prompt"][-1]["content"])
    target = value(expression)
    if target is None:
        return 0.0, {PLANNER: 0.0}
    answer = await execute(client, expression)
    return float(answer == truth), {PLANNER: float(target == truth), EXECUTOR: float(answer == target)}


async def run(task: dict[str, Any], client: AsyncOpenAI, endpoint: Any) -> float:
    """The episode, each role's reward posted to ``endpoint.reward_url``, the pair's success returned."""
    success, rewards = await episode(task, client)
    async with httpx.AsyncClient() as http:
        for role, reward in rewards.items():
            (await http.post(endpoint.reward_url, json={"reward": reward, "role": role})).raise_for_status()
    return success
