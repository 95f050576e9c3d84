"""The lookup-chain task as an OpenAI Agents SDK program: a `lookup` function tool over the task's own
chain of keys, the SDK's loop, the answer as the final output; nothing of toolrl.

Run by toolrl once per episode (``rollout.agent: {command: "python examples/agents/lookup_sdk.py"}``):
the endpoint comes in OPENAI_BASE_URL and OPENAI_API_KEY, the task in TOOLRL_TASK (its
``extra_info.chain``: start key, the keys between, the value), and the reward goes to TOOLRL_REWARD_URL:
1 when the answer is the value and every key on the way was looked up, else 0.3 times the share of the
chain's keys looked up.
"""

from __future__ import annotations

import os

import as_program  # this directory's: what the program does around its agent
from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
from agents.exceptions import AgentsException
from openai import AsyncOpenAI

set_tracing_disabled(True)  # the SDK sends traces to OpenAI's servers otherwise
PROGRESS = 0.3  # the reward of an unsolved episode that looked up every key

INSTRUCTIONS = ("You follow a chain of keys. Call lookup with the key you know; it tells you the next key or "
                "the value. When you know the value, answer with the value only.")


def call(key: str) -> str:
    """A lookup as the model writes it in the worked example: hermes JSON (the default), or a tag for a run
    whose parser reads ``<lookup>KEY</lookup>`` (LOOKUP_CALLS=tags: scripts/agent_demo.sh's small model)."""
    if os.environ.get("LOOKUP_CALLS") == "tags":
        return f"<lookup>{key}</lookup>"
    return f'<tool_call>\n{{"name": "lookup", "arguments": {{"key": "{key}"}}}}\n</tool_call>'


# A solved chain, shown before the task as turns the model wrote: small models copy a format they see.
EXAMPLE = [
    {"role": "user", "content": "Start at key K. Look up keys until you reach the value, then answer it."},
    {"role": "assistant", "content": call("K")},
    {"role": "user", "content": "<tool_response>\nThe next key is 31: look up 31.\n</tool_response>"},
    {"role": "assistant", "content": call("31")},
    {"role": "user", "content": "<tool_response>\nThe next key is 58: look up 58.\n</tool_response>"},
    {"role": "assistant", "content": call("58")},
    {"role": "user", "content": "<tool_response>\nThe value is 402.\n</tool_response>"},
    {"role": "assistant", "content": "402"},
]


async def run(task: dict, client: AsyncOpenAI) -> float:
    chain = task["extra_info"]["chain"]
    looked: set[str] = set()

    @function_tool
    def lookup(key: str) -> str:
        """Look up a key you know: the next key, or the value."""
        key = key.strip()
        known = chain[:min(len(looked) + 1, len(chain) - 1)]
        if key not in known:
            return f"error: no key {key} known: look up {known[-1]}"
        looked.add(key)
        position = chain.index(key)
        nxt = chain[position + 1]
        return f"The value is {nxt}." if position + 2 == len(chain) else f"The next key is {nxt}: look up {nxt}."

    agent = Agent(name="lookup", instructions=INSTRUCTIONS, tools=[lookup],
                  model=OpenAIChatCompletionsModel(model=os.environ.get("TOOLRL_MODEL", "toolrl"), openai_client=client))
    try:
        question = {"role": "user", "content": task["prompt"][-1]["content"]}
        result = await Runner.run(agent, input=[*EXAMPLE, question], max_turns=len(chain) + 1)
    except AgentsException:  # out of turns: unsolved
        result = None
    solved = result is not None and str(result.final_output).strip() == chain[-1] and len(looked) == len(chain) - 1
    # Unsolved: a little for each key of the chain looked up (never as much as solving), so that a model
    # that has not yet solved one gets a signal for getting further along.
    return 1.0 if solved else PROGRESS * len(looked) / (len(chain) - 1)


if __name__ == "__main__":
    as_program.main(run)
