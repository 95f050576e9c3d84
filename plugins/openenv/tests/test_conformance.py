"""The ``openenv`` session through the environment-session conformance kit, on the ledger server
(tests/envs/ledger_env.py: a real OpenEnv MCP tool environment, started by the session's ``prepare``
as ``app`` as a user's config starts it): calls over the wire, ``done`` once the balance reaches the
reset's target, the last observation's reward as the score, per-episode tools (``bonus``), episodes
side by side; and with the server killed, the session ends in errors instead of hanging."""

from __future__ import annotations

import signal
from typing import Any

import pytest
from support import ENVS
from toolrl.schemas import Sample, ToolCall
from toolrl.testing.sessions import SessionConformance, SessionPlay

pytestmark = pytest.mark.slow  # each test starts its ledger server (12-50 s on the shared 2-core machine)


def deposit(amount: int) -> ToolCall:
    return ToolCall(name="deposit", arguments={"amount": amount})


def episode(target: int, bonus: bool = False) -> Sample:
    return Sample(prompt="Reach the target.", extra_info={"reset_kwargs": {"target": target, "bonus": bonus}})


class TestLedger(SessionConformance):
    session_name = "openenv"
    session_options = {"app": "ledger_env:app", "app_dir": str(ENVS), "connect_timeout_s": 10,
                       "message_timeout_s": 10, "queue_timeout_s": 30}
    plays = [
        # done at the target: the fourth call never runs
        SessionPlay(episode(3), [deposit(1), deposit(2), deposit(5)], terms={"openenv": 1.0}),
        SessionPlay(episode(10), [deposit(4), ToolCall(name="balance")], terms={"openenv": 0.0}),
        SessionPlay(episode(8, bonus=True), [deposit(4), ToolCall(name="bonus")], terms={"openenv": 1.0}),
    ]

    async def kill(self, kind: Any) -> None:
        _, local = await kind.shared.get("server", None)
        local.process.send_signal(signal.SIGKILL)
        local.process.wait()
