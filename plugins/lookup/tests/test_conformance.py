"""The ``lookup-chain`` session through the environment-session conformance kit: a solved chain, a
wrong answer and a lost episode (failed lookups past ``max_failures``) each score what the session's
rules give, within the deadlines and side by side. The episode lives in the session object: there is
no backend to take away."""

from __future__ import annotations

from toolrl.schemas import Sample, ToolCall
from toolrl.testing import SessionConformance, SessionPlay

CHAIN = ["owl", "23", "731"]  # owl -> 23 -> the value 731


def lookup(key: str) -> ToolCall:
    return ToolCall(name="lookup", arguments={"key": key})


def answer(value: str) -> ToolCall:
    return ToolCall(name="answer", arguments={"value": value})


SAMPLE = Sample(prompt="Follow the chain from owl.", ground_truth="731", extra_info={"chain": CHAIN})


class TestLookupChain(SessionConformance):
    session_name = "lookup-chain"
    session_options = {"max_failures": 1, "progress": 0.5}
    plays = [
        SessionPlay(SAMPLE, [lookup("owl"), lookup("23"), answer("731")], terms={"lookup-chain": 1.0}),
        # one hop of two looked up, then a wrong answer: progress * 1/2
        SessionPlay(SAMPLE, [lookup("owl"), answer("999"), lookup("23")], terms={"lookup-chain": 0.25}),
        # two failed lookups with max_failures 1: lost at the second; the third call never runs
        SessionPlay(SAMPLE, [lookup("cat"), lookup("dog"), lookup("owl")], terms={"lookup-chain": 0.0}),
    ]
    no_backend = "the episode is the session object's state, in the rollout worker's process"
