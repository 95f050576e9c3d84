"""The ``lookup-chain`` session: one trajectory's episode of :mod:`toolrl_lookup.environment`.

State per trajectory: the keys revealed so far (at first only the question's start key), how far
along the chain the model got, how many lookups failed. ``lookup`` of a revealed key shows its entry
and reveals the next key; of any other key it is an error the model reads (after ``max_failures``
of them, one more ends the episode, lost). ``answer`` ends the episode: solved when the value is
the chain's and every hop was looked up. Score: 1 when solved, else ``progress`` (an option, below 1)
times the share of hops looked up: a partial signal that never reaches a solved episode's.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field
from toolrl.schemas import Sample, ToolCall, ToolResponse
from toolrl.sessions import EnvironmentSession, Reset, StepResult
from toolrl.trajectory import Trajectory

from toolrl_lookup.environment import entry


def _schema(name: str, argument: str, description: str) -> dict:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": {argument: {"type": "string"}}, "required": [argument]}}}


LOOKUP = _schema("lookup", "key", "The entry of a key you know: the next key, or the value.")
ANSWER = _schema("answer", "value", "Answer the value at the end of the chain (ends the episode).")


class LookupOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_failures: int = Field(2, ge=0)
    progress: float = Field(0.2, ge=0, lt=1)


class LookupSession(EnvironmentSession):
    Options = LookupOptions
    timeout = 5.0

    async def reset(self, sample: Sample) -> Reset:
        chain = sample.extra_info.get("chain")
        if not (isinstance(chain, list) and len(chain) >= 2 and all(isinstance(k, str) for k in chain)):
            raise ValueError("a lookup-chain sample needs extra_info.chain: a list of at least two strings")
        self.chain = chain
        self.reached = 0  # chain positions looked up (hops done)
        self.failures = 0
        self.solved = False
        return Reset(tools=[LOOKUP, ANSWER])

    def step(self, call: ToolCall) -> StepResult:
        if call.name == "answer":
            value = str(call.arguments.get("value", "")).strip()
            self.solved = value == self.chain[-1] and self.reached == len(self.chain) - 1
            return StepResult(response="correct" if self.solved else ToolResponse.error(f"{value} is wrong"), done=True)
        key = str(call.arguments.get("key", "")).strip()
        known = self.chain[:min(self.reached + 1, len(self.chain) - 1)]  # revealed keys (the value is none)
        if key not in known:
            self.failures += 1
            lost = self.failures > self.options.max_failures
            return StepResult(response=ToolResponse.error(f"no key {key} known: look up {known[-1]}"), done=lost)
        position = self.chain.index(key)
        self.reached = max(self.reached, position + 1)
        return StepResult(response=entry(self.chain, position))

    async def score(self, trajectory: Trajectory) -> float:
        hops = len(self.chain) - 1
        return 1.0 if self.solved else self.options.progress * self.reached / hops
