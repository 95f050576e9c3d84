"""A verifiers tool environment for the tests: three addition problems; a task-scoped toolset of two
tools (``calc_add``, and ``calc_calls``, which reads the per-rollout state) and a taskset-scoped one
(``define``, shared); a rubric of two weighted rewards and a metric (verifiers awaits them: they must
be async). ``load_environment`` is the environment-package entry."""

from __future__ import annotations

import verifiers.v1 as vf

ROWS = [(2, 3), (10, 32), (7, 8)]
SYSTEM_PROMPT = "Use the calc_add tool, then answer with the sum."


class AdderData(vf.TaskData):
    answer: str


class AdderState(vf.State):
    calls: int = 0


class Calc(vf.Toolset[vf.ToolsetConfig, AdderState]):
    TOOL_PREFIX = "calc"

    async def setup_task(self, task) -> None:  # verifiers hands a toolset the task's data
        self.task_idx = task.idx

    @vf.tool
    async def add(self, a: int, b: int) -> int:
        """Add two integers."""
        self.state.calls += 1
        return a + b

    @vf.tool
    def calls(self) -> str:
        """How many additions this rollout has made."""
        return f"task {self.task_idx}: {self.state.calls} calls"


class Glossary(vf.Toolset[vf.ToolsetConfig]):
    """Taskset-scoped: one instance for every rollout, its tool advertised bare (no prefix)."""

    TOOL_PREFIX = None

    async def setup(self) -> None:
        self.words = {"sum": "the result of adding numbers"}

    @vf.tool
    def define(self, word: str) -> str:
        """Look a word up."""
        return self.words.get(word, "unknown word")


class AdderTask(vf.Task[AdderData, AdderState, vf.TaskConfig]):
    @classmethod
    def toolsets(cls, config: vf.TaskConfig) -> list[vf.Toolset]:
        return [Calc(vf.ToolsetConfig())]

    @vf.reward(weight=0.75)
    async def correct(self, trace: vf.Trace) -> float:
        return float(trace.last_reply.strip().endswith(self.data.answer))

    @vf.reward(weight=0.25)
    async def used_tool(self, trace: vf.Trace) -> float:
        return float(any(m.name == "calc_add" for m in trace.tool_messages))

    @vf.metric
    async def turns(self, trace: vf.Trace) -> float:
        return float(trace.num_turns)


class AdderTaskset(vf.Taskset[AdderTask, vf.TasksetConfig]):
    @classmethod
    def toolsets(cls, config: vf.TasksetConfig) -> list[vf.Toolset]:
        return [Glossary(vf.ToolsetConfig())]

    def load(self):
        for a, b in ROWS:
            yield AdderTask(AdderData(prompt=f"What is {a} + {b}?", answer=str(a + b), system_prompt=SYSTEM_PROMPT),
                            self.config.task)


__all__ = ["AdderTaskset"]


def load_environment(**kwargs) -> vf.Taskset:
    return AdderTaskset(vf.TasksetConfig(id="vf_adder_env", **kwargs))
