"""The environment-session conformance kit (toolrl.testing.sessions) over the docs' ``counter``
session (read from docs/plugins.md, registered by a real distribution), and the kit failing a session
that leaks state between trajectories, hangs, or scores with its backend gone."""

from __future__ import annotations

from pathlib import Path

import pytest
import toolrl.plugins
from _dists import make_dist
from test_scripted_engine import DOCS, fenced
from toolrl.plugins import Plugins
from toolrl.schemas import Sample, ToolCall
from toolrl.testing.sessions import (
    SessionConformance,
    SessionPlay,
    check_dead_session,
    check_session_isolation,
    check_session_play,
    prepared_session_kind,
)

SESSIONS = '''
import asyncio
from toolrl import hookimpl
from toolrl.sessions import EnvironmentSession, Reset, StepResult

ADD = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"x": {"type": "integer"}}}}}


class Leaky(EnvironmentSession):
    """Counts in a class attribute: every trajectory sees the others' additions."""
    total = 0

    async def reset(self, sample):
        return Reset(tools=[ADD])

    async def step(self, call):
        await asyncio.sleep(0.01)
        type(self).total += call.arguments["x"]
        return StepResult(response=str(type(self).total))


class Hangs(EnvironmentSession):
    timeout = 0.5

    async def reset(self, sample):
        return Reset(tools=[ADD])

    async def step(self, call):
        await asyncio.sleep(60)


class Backend:
    alive = True


class Remote(EnvironmentSession):
    """A session on a backend that every session of the route shares; ``careless`` scores 1 with it gone."""

    async def reset(self, sample):
        self.backend = await self.context.shared.get("backend", self._backend)
        return Reset(tools=[ADD])

    @staticmethod
    async def _backend():
        return Backend()

    async def step(self, call):
        if not self.backend.alive:
            raise ConnectionError("the backend is gone")
        return StepResult(response="ok")

    async def score(self, trajectory):
        if not self.backend.alive and not self.careless:
            raise ConnectionError("the backend is gone")
        return 1.0

    careless = False


class Careless(Remote):
    careless = True

    async def step(self, call):
        return StepResult(response="ok")


@hookimpl
def register_environment_sessions(register):
    register(Leaky, name="leaky")
    register(Hangs, name="hangs")
    register(Remote, name="remote")
    register(Careless, name="careless")
'''


@pytest.fixture(autouse=True)
def kit_sessions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The docs' counter session and the sessions above, installed as distributions, as the
    process-wide plugins."""
    counter = fenced((DOCS / "plugins.md").read_text(), "python", "class Counter(EnvironmentSession)")
    make_dist(tmp_path, "toolrl-plugin-counter", "counter", "toolrl_counter", counter)
    make_dist(tmp_path, "toolrl-plugin-kit-sessions", "kit-sessions", "kit_sessions", SESSIONS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(toolrl.plugins, "_plugins", Plugins(env={}))


def add(x: int) -> ToolCall:
    return ToolCall(name="add", arguments={"x": x})


class TestCounter(SessionConformance):
    session_name = "counter"
    session_options = {"goal": 5}
    plays = [SessionPlay(Sample(prompt="count to 5"), [add(2), add(3), add(9)], terms={"counter": 1.0}),
             SessionPlay(Sample(prompt="count to 5"), [add(1)], answers=["I added one."], terms={"counter": 0.0})]
    no_backend = "the count lives in the session object"


class TestRemote(SessionConformance):
    session_name = "remote"
    plays = [SessionPlay(Sample(prompt="go"), [add(1)])]

    async def kill(self, kind):
        from kit_sessions import Remote

        (await kind.shared.get("backend", Remote._backend)).alive = False


async def test_the_counter_plays_as_the_docs_say() -> None:
    kind = await prepared_session_kind("counter", {"goal": 5})
    played = await check_session_play(kind, SessionPlay(Sample(prompt="x"), [add(2), add(3), add(9)]))
    assert played.tools == ["add"] and played.responses == ["2", "5"] and played.done  # done: no third step
    assert played.terms == {"counter": 1.0}


async def test_the_kit_fails_a_session_that_breaks_a_rule() -> None:
    play = SessionPlay(Sample(prompt="x"), [add(1), add(1)])
    with pytest.raises(AssertionError, match="run beside others gave"):
        await check_session_isolation(await prepared_session_kind("leaky"), [play], concurrency=4)
    with pytest.raises(AssertionError, match="step add ran past its 0.5 s deadline"):
        await check_session_play(await prepared_session_kind("hangs"), play)
    from kit_sessions import Remote

    careless = await prepared_session_kind("careless")

    async def kill() -> None:
        (await careless.shared.get("backend", Remote._backend)).alive = False

    with pytest.raises(AssertionError, match="reported no error with its backend gone"):
        await check_dead_session(careless, play, kill)
    await careless.close()
    counter = await prepared_session_kind("counter", {"goal": 5})
    with pytest.raises(AssertionError, match=r"scored \{'counter': 0.0\}, the play expects \{'counter': 1.0\}"):
        await check_session_play(counter, SessionPlay(Sample(prompt="x"), [add(1)], terms={"counter": 1.0}))


class Undeclared(SessionConformance):  # neither kill nor no_backend
    session_name = "counter"
    plays = TestCounter.plays


def test_the_dead_session_test_needs_a_kill_or_a_reason() -> None:
    with pytest.raises(AssertionError, match="set kill .* or no_backend"):
        Undeclared().test_a_dead_session_ends_in_errors()
