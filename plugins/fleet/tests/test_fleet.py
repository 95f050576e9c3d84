"""Environment fleets (toolrl_fleet): the docs' ``counter`` session served by real ``toolrl env serve``
processes on loopback and used through the ``fleet`` session kind. A server killed mid-run takes only
its own sessions (each masked: an infrastructure failure), the others finish with their scores, new
trajectories go elsewhere, and the server is used again once it is back (restarted by the test, or by
the kind when it started the server itself)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import toolrl.plugins
from support import counter_session, install, run_toolrl, train_error
from toolrl.plugins import Plugins
from toolrl.schemas import InfrastructureError, Sample, ToolCall
from toolrl.sessions import SessionKind, SessionRun
from toolrl.trajectory import Trajectory
from toolrl_fleet.launch import free_port

GOAL = {"goal": 100}
TALK = """
import asyncio
from toolrl.sessions import EnvironmentSession, Reset, StepResult

TOOLS = [{"type": "function", "function": {"name": n, "parameters": {"type": "object", "properties": {}}}}
         for n in ("tick", "crash", "hang")]


class Talk(EnvironmentSession):
    timeout = 1.0

    async def reset(self, sample):
        self.ticks, self.asked = 0, 0
        return Reset(tools=TOOLS, messages=[{"role": "user", "content": sample.extra_info["greeting"]}])

    async def step(self, call):
        if call.name == "crash":
            raise ValueError("the session's own bug")
        if call.name == "hang":
            await asyncio.sleep(5)
        self.ticks += 1
        return StepResult(response=f"tick {self.ticks}", reward=0.5)

    async def respond(self, message):
        self.asked += 1
        return f"you said {message}" if self.asked == 1 else None

    async def state_key(self):
        return f"ticks={self.ticks}"

    async def score(self, trajectory):
        return {"reward": float(self.ticks), "id_length": float(len(trajectory.trajectory_id))}


@hookimpl
def register_environment_sessions(register):
    register(Talk, name="talk")
"""


@pytest.fixture(autouse=True)
def counter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The docs' counter session and the talk session above as installed distributions, here and in the
    servers' processes."""
    install(tmp_path, "counter", counter_session())
    install(tmp_path, "talk", "from toolrl import hookimpl\n" + TALK)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    monkeypatch.setattr(toolrl.plugins, "_plugins", Plugins(env={}))
    return tmp_path


class Served:
    """``toolrl env serve counter`` on a fixed port, killed and started again at will."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.start()

    def start(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "toolrl", "env", "serve", "counter", "--port", str(self.port), "--capacity", "16",
             "--options", '{"goal": 100}'], stdout=subprocess.PIPE, text=True, start_new_session=True)
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line.startswith(f"serving counter (session counter) on {self.url}"), line

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()


@pytest.fixture
def servers() -> list[Served]:
    started = [Served(), Served()]
    yield started
    for s in started:
        s.kill()


async def opened(kind: SessionKind, i: int) -> SessionRun:
    run = SessionRun(kind, f"t{i}")
    await run.reset(Sample.model_validate({"prompt": "count"}))
    assert run.error is None, run.error
    return run


async def step(run: SessionRun, x: int, tool: str = "add") -> str | None:
    """The step's text, or None when it failed (the run records why)."""
    try:
        response = (await run.step(ToolCall(name=tool, arguments={"x": x} if tool == "add" else {}))).response
    except Exception:
        assert run.error is not None
        return None
    return response if isinstance(response, str) else response.text


async def finish(run: SessionRun) -> Trajectory:
    traj = Trajectory(trajectory_id=run.trajectory_id, sample_index=0, group=0, prompt_ids=[])
    traj.reward_terms = await run.finish(traj)
    return traj


def server_of(run: SessionRun):
    return run.session.link[0]


async def test_a_killed_server_takes_only_its_sessions_and_comes_back(servers: list[Served]) -> None:
    kind = SessionKind.resolve("fleet", {"urls": [s.url for s in servers], "retry_s": 0.2, "queue_timeout_s": 5}, ".")
    await kind.prepare()
    try:
        runs = await asyncio.gather(*(opened(kind, i) for i in range(8)))
        on = [server_of(r).url for r in runs]
        assert sorted(on) == sorted([servers[0].url] * 4 + [servers[1].url] * 4)  # least loaded first
        assert await asyncio.gather(*(step(r, 2) for r in runs)) == ["2"] * 8  # affinity: state kept per server

        servers[0].kill()
        after = await asyncio.gather(*(step(r, 3) for r in runs))
        for run, url, text in zip(runs, on, after):
            if url == servers[0].url:  # masked: an infrastructure failure, nothing to score
                assert text is None and run.infrastructure and isinstance(run.failed(), InfrastructureError)
                assert "gone" in run.error
            else:  # none lost elsewhere
                assert text == "5" and run.error is None
        trajs = await asyncio.gather(*(finish(r) for r in runs))
        # Scored under the served kind's name, as where it runs locally (not the fleet's).
        assert [t.reward_terms for t, url in zip(trajs, on) if url == servers[1].url] == [{"counter": 0.0}] * 4
        assert [t.reward_terms for t, url in zip(trajs, on) if url == servers[0].url] == [{}] * 4

        more = await asyncio.gather(*(opened(kind, 10 + i) for i in range(4)))  # the run goes on, elsewhere
        assert {server_of(r).url for r in more} == {servers[1].url}
        await asyncio.gather(*(finish(r) for r in more))

        servers[0].start()
        for i in range(50):  # a new trajectory's connect asks it again (every retry_s, in the background)
            back = await opened(kind, 20 + i)
            url = server_of(back).url
            assert await step(back, 1) == "1"
            await finish(back)
            if url == servers[0].url:
                break
            await asyncio.sleep(0.1)
        assert url == servers[0].url
    finally:
        await kind.close()


async def test_servers_the_kind_started_are_restarted() -> None:
    kind = SessionKind.resolve("fleet", {"serve": "counter", "serve_options": GOAL, "servers": 2, "retry_s": 0.2,
                                         "queue_timeout_s": 10}, ".")
    await kind.prepare()
    try:
        runs = await asyncio.gather(*(opened(kind, i) for i in range(4)))
        victim = server_of(runs[0])
        victim.local.process.send_signal(signal.SIGKILL)
        victim.local.process.wait()
        after = await asyncio.gather(*(step(r, 1) for r in runs))
        assert [t is None for t in after] == [server_of(r) is victim for r in runs]
        await asyncio.gather(*(finish(r) for r in runs))
        assert victim.local.starts == 2 and not victim.up  # started again at once, used once it answers
        for _ in range(100):
            again = await opened(kind, 9)
            used = server_of(again)
            assert await step(again, 1) == "1"
            await finish(again)
            if used is victim:
                break
            await asyncio.sleep(0.1)
        assert victim.up and victim.losses == 1
        fleet = await kind.shared.get("fleet", None)
    finally:
        await kind.close()
    assert all(not m.local.alive() for m in fleet.members)  # stopped with the route


async def test_every_call_of_the_contract_crosses_the_wire() -> None:
    """reset (tools, messages), step, respond, state_key and score (the trajectory sent) run on the server;
    the session's own bug is its error (lost), a deadline the environment missed an infrastructure one."""
    kind = SessionKind.resolve("fleet", {"serve": "talk", "servers": 1}, ".")
    await kind.prepare()
    sample = Sample.model_validate({"prompt": "hi", "extra_info": {"greeting": "hello"}})
    try:
        run = SessionRun(kind, "traj-7")
        reset = await run.reset(sample)
        assert [t["function"]["name"] for t in reset.tools] == ["tick", "crash", "hang"]
        assert reset.messages == [{"role": "user", "content": "hello"}]
        assert await run.state_key() == "ticks=0"
        result = await run.step(ToolCall(name="tick"))
        assert (result.response, result.reward) == ("tick 1", 0.5)
        assert await run.state_key() == "ticks=1"
        assert (await run.respond("yes"), await run.respond("again")) == ("you said yes", None)
        traj = await finish(run)
        assert traj.reward_terms == {"talk": 1.0} and traj.reward_parts == {"talk.id_length": 6.0}

        for tool, infrastructure, why in (("crash", False, "the session's own bug"), ("hang", True, "timed out")):
            run = SessionRun(kind, tool)
            await run.reset(sample)
            assert await step(run, 0, tool) is None
            assert run.infrastructure is infrastructure and why in run.error
            await finish(run)
    finally:
        await kind.close()


def test_eval_metric_names_the_served_kinds_term(tmp_path: Path) -> None:
    """A fleet's scores are the served kind's terms, so an environment's metric (its session's name)
    holds when its session is served through a fleet."""
    from toolrl.config import ConfigError, load_config
    from toolrl.environments import ConfiguredEnv, Environment
    from toolrl.processes.resolve import with_metric

    env = ConfiguredEnv(Environment(name="c", splits={"train": lambda options, split: []}, session="counter",
                                    metric="counter"), None, 1.0, None)
    for session in ({}, {"name": "fleet", "options": {"serve": "c", "servers": 1}}):
        config = load_config(None, data={"data": {"train_files": ["t.jsonl"]}, "session": session,
                                         "base_dir": str(tmp_path)})
        assert with_metric(config, {"c": env}).eval.metric == "counter"
    other = load_config(None, data={"data": {"train_files": ["t.jsonl"]}, "session": {"name": "talk"},
                                    "base_dir": str(tmp_path)})
    with pytest.raises(ConfigError, match=r"no reward term 'counter' \(terms: talk, tools, steps\)"):
        with_metric(other, {"c": env})  # another kind in its place: its own term


async def test_servers_that_cannot_start_fail_the_configuration_at_once() -> None:
    kind = SessionKind.resolve("fleet", {"serve": "no-such-thing", "servers": 2}, ".")
    with pytest.raises(ValueError, match="no environment server answers .*unknown environment session 'no-such-thing'"):
        await kind.prepare()  # their error, not a wait for startup_timeout_s
    await kind.close()


def test_a_fleet_url_that_is_not_a_url_is_one_line_at_the_check(tmp_path: Path) -> None:
    """Not "no environment server answers" once the model has loaded: the check names the setting."""
    line = train_error(tmp_path, "--check",
                       session={"name": "fleet", "options": {"urls": ["http://127.0.0.1:8700", "not a url"]}})
    assert ": session.options: urls: 'not a url' is not a URL (http://HOST:PORT)" in line, line


def test_the_fleet_kind_cannot_clone_so_a_tree_rollout_is_refused_before_weights_load(tmp_path: Path) -> None:
    """Its sessions live on servers, which cannot copy one."""
    line = train_error(tmp_path, session={"name": "fleet", "options": {"urls": ["http://127.0.0.1:9"]}},
                       rollout={"n": 2, "tree": {"width": 2, "depth": 1}})
    assert all(f in line for f in ("rollout.tree", "session 'fleet'", "cannot clone")), line


def test_serve_names_what_is_wrong() -> None:
    result = run_toolrl("env", "serve", "no-such-thing")
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "NAME" in result.stderr and "no-such-thing" in result.stderr
    result = run_toolrl("env", "serve", "counter", "--options", '{"goal": "x"}')
    assert result.returncode == 2 and "goal" in result.stderr, result.stderr
    for options in ("[1]", "{bad", "[" * 20000):  # the core's reader: one line, no traceback, however deep
        result = run_toolrl("env", "serve", "counter", "--options", options)
        assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr[-300:]
        assert "--options" in result.stderr, result.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        result = run_toolrl("env", "serve", "counter", "--port", str(port))
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"error: cannot listen on 127.0.0.1:{port}: "), result.stderr
    result = run_toolrl("env", "serve", "counter", "--port", "70000")
    assert result.returncode == 2 and "Invalid value for '--port'" in result.stderr, result.stderr
