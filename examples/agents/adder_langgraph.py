"""A LangGraph agent as a user writes it: a model node bound to a tool, a tool node, and the edge that
loops between them until the model answers; nothing of toolrl.

Trained by toolrl as ``rollout.agent: {callable: "adder_langgraph:run"}`` (this directory on the Python
path), or as a program (``{command: "python examples/agents/adder_langgraph.py"}``: the endpoint in
OPENAI_BASE_URL and OPENAI_API_KEY, the task in TOOLRL_TASK, the reward to TOOLRL_REWARD_URL).
"""

from __future__ import annotations

import os

import as_program  # this directory's: what the program does around its agent
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def graph(base_url: str, api_key: str, model: str):
    llm = ChatOpenAI(model=model, base_url=base_url, api_key=api_key, max_retries=0).bind_tools([add])

    async def think(state: MessagesState) -> dict:
        return {"messages": [await llm.ainvoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("model", think)
    builder.add_node("tools", ToolNode([add]))
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", tools_condition)
    builder.add_edge("tools", "model")
    return builder.compile()


async def run(task: dict, client) -> float:
    agent = graph(str(client.base_url), client.api_key, os.environ.get("TOOLRL_MODEL", "toolrl"))
    state = await agent.ainvoke({"messages": [HumanMessage(task["prompt"][-1]["content"])]}, {"recursion_limit": 12})
    return float(str(task["ground_truth"]) in str(state["messages"][-1].content))


if __name__ == "__main__":
    as_program.main(run)
