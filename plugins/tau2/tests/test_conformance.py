"""The ``tau2`` session through the environment-session conformance kit on the mock domain: each
task's ground-truth actions then the answer score what τ² gives them (1.0), a call on a task that does
not exist is an error result the model reads and scores 0; with a simulated user on an OpenAI-compatible
endpoint (a loopback HTTP server answering as a scripted user: it stands in for a model, as the
scripted engines do), the conversation runs to the user's stop, and with that endpoint gone the
session ends in errors instead of hanging."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from toolrl.schemas import Sample, ToolCall
from toolrl.testing import SessionConformance, SessionPlay, play_session, prepared_session_kind

CREATE = ToolCall(name="create_task", arguments={"user_id": "user_1", "title": "Important Meeting"})
UPDATE = ToolCall(name="update_task_status", arguments={"task_id": "task_1", "status": "completed"})
MISSING = ToolCall(name="update_task_status", arguments={"task_id": "no_such_task", "status": "completed"})


def sample(task: str) -> Sample:
    return Sample(prompt="Help the user.", ground_truth=task)


PLAYS = [SessionPlay(sample("create_task_1"), [CREATE], answers=["Done."], terms={"tau2": 1.0}),
         SessionPlay(sample("update_task_1"), [UPDATE], answers=["Done."], terms={"tau2": 1.0}),
         SessionPlay(sample("update_task_1"), [MISSING], answers=["Done."], terms={"tau2": 0.0})]


class TestTau2Mock(SessionConformance):
    session_name = "tau2"
    session_options = {"domain": "mock"}
    plays = PLAYS
    no_backend = "without a simulated user the τ² domain runs in the session's process (its own database copy)"


class ScriptedUser(ThreadingHTTPServer):
    """``POST /v1/chat/completions``: a first message asking for the task, then a stop (τ²'s
    ``###STOP###``) once the agent has answered."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _UserHandler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}/v1"
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


class _UserHandler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        messages = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["messages"]
        said = "Thanks, that is all. ###STOP###" if len(messages) >= 4 else "Please create my task Important Meeting."
        body = json.dumps({"id": "u", "object": "chat.completion", "created": int(time.time()), "model": "user",
                           "choices": [{"index": 0, "finish_reason": "stop",
                                        "message": {"role": "assistant", "content": said}}],
                           "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


class TestTau2WithAUser(SessionConformance):
    session_name = "tau2"
    plays = [SessionPlay(sample("create_task_1"), [CREATE], answers=["Done."])]

    @pytest.fixture(autouse=True)
    def _user(self) -> Iterator[None]:
        self.user = ScriptedUser()
        yield
        self.user.stop()

    @property
    def session_options(self) -> dict[str, Any]:  # type: ignore[override]
        return {"domain": "mock", "user": {"base_url": self.user.url, "model": "user"}, "max_user_turns": 3}

    async def kill(self, kind: Any) -> None:
        self.user.stop()


async def test_the_user_speaks_first_and_stops_after_the_answer() -> None:
    user = ScriptedUser()
    try:
        kind = await prepared_session_kind("tau2", {"domain": "mock", "user": {"base_url": user.url, "model": "u"}})
        played = await play_session(kind, PLAYS[0])
        await kind.close()
    finally:
        user.stop()
    assert not played.errors and played.user_turns == [None]  # the user stopped after the answer
    assert played.terms["tau2"] == 1.0
