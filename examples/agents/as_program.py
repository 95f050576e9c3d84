"""What an example agent does as a program of its own (``rollout.agent: {command: "python FILE"}``): read
its task from TOOLRL_TASK, run the agent with an OpenAI client of the episode's endpoint (the client reads
OPENAI_BASE_URL and OPENAI_API_KEY itself), and POST the reward to TOOLRL_REWARD_URL. Nothing of toolrl:
these are the environment variables any program gets."""

from __future__ import annotations

import asyncio
import json
import os
import urllib.request
from collections.abc import Awaitable, Callable

from openai import AsyncOpenAI


def main(run: Callable[[dict, AsyncOpenAI], Awaitable[float]]) -> None:
    task = json.loads(os.environ["TOOLRL_TASK"])
    reward = asyncio.run(run(task, AsyncOpenAI(max_retries=0)))
    request = urllib.request.Request(os.environ["TOOLRL_REWARD_URL"], json.dumps({"reward": reward}).encode(), {
        "Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}", "Content-Type": "application/json"})
    urllib.request.urlopen(request).close()
