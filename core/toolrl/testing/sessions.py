"""The conformance kit for environment sessions: a registered session kind played through
:class:`toolrl.sessions.SessionRun`, the rollout loop's driver, with fixed calls instead of a model
(a :class:`SessionPlay`: a sample, the calls, the answers without calls). The checks: a play runs
within the deadlines and gives a well-formed result (:func:`check_session_play`); plays side by side give
what each gives alone (:func:`check_session_isolation`); a session whose backend a ``kill`` took away
ends in errors within its deadlines (:func:`check_dead_session`). :class:`SessionConformance` runs them as
pytest tests (docs/plugins.md, "The conformance kit").
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from toolrl.schemas import Sample, ToolCall, ToolResponse, ToolResult
from toolrl.sessions import SessionError, SessionKind, SessionRun
from toolrl.tools import Tool
from toolrl.trajectory import Trajectory


@dataclass
class SessionPlay:
    """One trajectory's play: its ``sample`` (what ``reset`` gets), the ``calls`` it steps in order, then
    the ``answers`` it hands to ``respond``. A call may name only a tool that this play's ``reset`` handed
    out (as a model sees only those): a call to any other fails the play (``the play calls 'x', which
    reset did not hand out``), so a session whose tools depend on the sample needs plays whose calls fit
    each sample. A step that says done ends the calls."""

    sample: Sample
    calls: Sequence[ToolCall] = ()
    answers: Sequence[str] = ()  # answers without calls, each handed to respond
    model_text: Sequence[str] | None = None  # each model turn's text, for a score that reads it
    terms: Mapping[str, float] | None = None  # the reward terms the play must score (None: any)


@dataclass
class PlayedSession:
    """What one play saw: the reset's tool names, each step's response text (an error's too) and how
    many steps failed, whether a step said done, the user turns, the reward terms, the errors."""

    tools: list[str]
    responses: list[str] = field(default_factory=list)
    failed_steps: int = 0
    done: bool = False
    user_turns: list[str | None] = field(default_factory=list)
    terms: dict[str, float] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


async def prepared_session_kind(name: str, options: Mapping[str, Any] | None = None, base_dir: Path | str = ".") -> SessionKind:
    """The registered session kind ``name`` with ``options``, prepared as the routes prepare it."""
    kind = SessionKind.resolve(name, options, base_dir)
    await kind.prepare()
    return kind


async def play_session(kind: SessionKind, play: SessionPlay, trajectory_id: str = "kit-0") -> PlayedSession:
    """One trajectory's session driven as the rollout loop drives it; every call must end within
    the session's deadline (plus a second for the guard), or AssertionError."""
    session_run = SessionRun(kind, trajectory_id)
    traj = Trajectory(trajectory_id=trajectory_id, sample_index=0, group=0, prompt_ids=[],
                      ground_truth=play.sample.ground_truth)
    try:
        reset = await _within(session_run, "reset", session_run.reset(play.sample))
        played = PlayedSession(tools=[t.name if isinstance(t, Tool) else t["function"]["name"] for t in reset.tools])
        if session_run.error is not None:
            played.errors.append(session_run.error)
            return played
        for call in play.calls:
            if played.done:
                break
            assert call.name in played.tools, f"the play calls {call.name!r}, which reset did not hand out"
            try:
                result = await _within(session_run, f"step {call.name}", session_run.step(call))
            except AssertionError:
                raise
            except Exception as exc:  # what the tool driver makes an error result
                response = ToolResponse.error(f"{type(exc).__name__}: {exc}")
            else:
                response = ToolResponse(text=result.response) if isinstance(result.response, str) else result.response
                played.done = session_run.done
            played.responses.append(response.text)
            played.failed_steps += response.is_error
            traj.tool_results.append(ToolResult(name=call.name, arguments=call.arguments, response=response,
                                                status="error" if response.is_error else "ok"))
        for answer in play.answers:
            try:
                played.user_turns.append(await _within(session_run, "respond", session_run.respond(answer)))
            except SessionError as exc:
                played.errors.append(str(exc))
        _record(traj, play, played)
        played.terms = await _within(session_run, "score and close", session_run.finish(traj))
        played.errors += list(traj.reward_errors.values())
        return played
    finally:
        await _within(session_run, "close", session_run.close())


def _record(traj: Trajectory, play: SessionPlay, played: PlayedSession) -> None:
    """What the play did, as the rollout loop records it for ``score``."""
    traj.model_text = list(play.model_text if play.model_text is not None else play.answers)
    traj.final_response = play.answers[-1] if play.answers else ""
    traj.turns = len(traj.model_text)
    traj.user_turns = [u for u in played.user_turns if u is not None]
    traj.termination = "done" if played.done else "answered"


async def _within(session_run: SessionRun, what: str, awaitable: Awaitable[Any]) -> Any:
    start = time.monotonic()
    try:
        async with asyncio.timeout(session_run.timeout + 1.0):
            return await awaitable
    except TimeoutError:
        raise AssertionError(f"session {session_run.name!r} {what} ran past its {session_run.timeout:g} s deadline "
                             f"({time.monotonic() - start:.1f} s)") from None


async def check_session_play(kind: SessionKind, play: SessionPlay) -> PlayedSession:
    """The play runs without errors, and scores its ``terms`` when it names them; a step that said
    done ends it."""
    played = await play_session(kind, play)
    assert not played.errors, f"session {kind.name!r}: {played.errors}"
    if play.terms is not None:
        assert played.terms == dict(play.terms), f"session {kind.name!r} scored {played.terms}, the play " \
                                                 f"expects {dict(play.terms)}"
    return played


async def check_session_isolation(kind: SessionKind, plays: Sequence[SessionPlay], concurrency: int = 8) -> None:
    """``concurrency`` trajectories at once, cycling through ``plays``, each see what its play sees
    alone: no state leaks between a kind's sessions."""
    alone = [await play_session(kind, p, f"kit-alone-{i}") for i, p in enumerate(plays)]
    together = await asyncio.gather(*(play_session(kind, plays[i % len(plays)], f"kit-{i}") for i in range(concurrency)))
    for i, played in enumerate(together):
        expected = alone[i % len(plays)]
        assert played == expected, (f"session {kind.name!r}: play {i % len(plays)} run beside others gave "
                                    f"{played}, alone {expected}")


async def check_dead_session(kind: SessionKind, play: SessionPlay, kill: Callable[[], Awaitable[None]]) -> PlayedSession:
    """After ``kill`` (the session's backend gone), the play ends with errors within its deadlines —
    a failed reset, error responses or a failed score — never a hang, a made-up success or a score."""
    await kill()
    played = await play_session(kind, play, "kit-dead")
    assert played.errors or played.failed_steps, f"session {kind.name!r} reported no error with its backend gone: {played}"
    assert not any(v for n, v in played.terms.items()), f"a dead session scored {played.terms}"
    return played


class SessionConformance:
    """Subclass in your plugin's tests (plain pytest, no asyncio plugin needed), setting ``session_name``,
    ``session_options`` and ``plays`` (:class:`SessionPlay`: each may call only the tools its ``reset``
    hands out), and either ``kill`` (an async method taking the prepared kind: stops the session's
    backend for the dead-session test) or ``no_backend`` (why there is none: that test then reports
    itself not applicable); setting neither, or both, fails it. An example and the three tests:
    docs/plugins.md, "Environment sessions".
    """

    session_name: ClassVar[str] = ""
    session_options: ClassVar[Mapping[str, Any]] = {}
    plays: ClassVar[Sequence[SessionPlay]] = ()
    base_dir: ClassVar[Path | str] = "."
    concurrency: ClassVar[int] = 8
    kill: ClassVar[Callable[..., Awaitable[None]] | None] = None
    no_backend: ClassVar[str] = ""  # why there is no backend to kill (then no ``kill``)

    def _run(self, check: Callable[[SessionKind], Awaitable[Any]]) -> None:
        async def main() -> None:
            kind = await prepared_session_kind(self.session_name, self.session_options, self.base_dir)
            try:
                await check(kind)
            finally:
                await kind.close()

        assert self.session_name and self.plays, "set session_name and plays"
        asyncio.run(main())

    def test_plays_within_deadlines(self) -> None:
        async def check(kind: SessionKind) -> None:
            for play in self.plays:
                await check_session_play(kind, play)

        self._run(check)

    def test_sessions_are_isolated(self) -> None:
        self._run(lambda kind: check_session_isolation(kind, self.plays, self.concurrency))

    def test_a_dead_session_ends_in_errors(self) -> None:
        import pytest

        has_kill = type(self).kill is not None
        assert has_kill != bool(self.no_backend), \
            "set kill (stop the session's backend) or no_backend (why it has none), one of them"
        if not has_kill:
            pytest.skip(f"not applicable (no_backend): {self.no_backend}")
        self._run(lambda kind: check_dead_session(kind, self.plays[0], lambda: self.kill(kind)))  # type: ignore[misc]
