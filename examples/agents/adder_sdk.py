"""An OpenAI Agents SDK agent as a user writes it: a function tool, the SDK's own loop, nothing of toolrl.

Trained by toolrl either way it can be run:
- as a program (``rollout.agent: {command: "python examples/agents/adder_sdk.py"}``): the endpoint comes
  in the environment (OPENAI_BASE_URL, OPENAI_API_KEY), the task in TOOLRL_TASK, and the reward goes to
  TOOLRL_REWARD_URL;
- as a function (``rollout.agent: {callable: "adder_sdk:run"}``, this directory on the Python path).
"""

from __future__ import annotations

import os

import as_program  # this directory's: what the program does around its agent
from agents import Agent, OpenAIChatCompletionsModel, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
from openai import AsyncOpenAI

set_tracing_disabled(True)  # the SDK sends traces to OpenAI's servers otherwise


@function_tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def agent(client: AsyncOpenAI, model: str, api: str = "responses") -> Agent:
    chosen = OpenAIResponsesModel if api == "responses" else OpenAIChatCompletionsModel
    return Agent(name="adder", instructions="Answer the question. Add numbers with the add tool.", tools=[add],
                 model=chosen(model=model, openai_client=client))


async def run(task: dict, client: AsyncOpenAI, api: str = "responses") -> float:
    question = task["prompt"][-1]["content"]
    result = await Runner.run(agent(client, os.environ.get("TOOLRL_MODEL", "toolrl"), api), input=question, max_turns=6)
    return float(str(task["ground_truth"]) in str(result.final_output))


if __name__ == "__main__":
    as_program.main(run)
