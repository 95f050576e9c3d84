"""toolrl.tools.SharedResources: one resource per trajectory, shared by that trajectory's tools."""

import asyncio
import threading
import time

import pytest
from toolrl.schemas import ToolCall
from toolrl.tools import SharedResources, Tool, ToolSet, trajectory_of


class Resource:
    def __init__(self, n: int) -> None:
        self.n, self.closed = n, 0


class Factory:
    """Creates numbered resources after ``delay`` seconds (failing when ``fail`` is set) and records
    every creation and close."""

    def __init__(self, delay: float = 0.05, fail: str | None = None) -> None:
        self.delay, self.fail = delay, fail
        self.created: list[Resource] = []
        self.closed: list[int] = []

    async def create(self) -> Resource:
        await asyncio.sleep(self.delay)
        if self.fail:
            raise RuntimeError(self.fail)
        self.created.append(Resource(len(self.created)))
        return self.created[-1]

    async def close(self, resource: Resource) -> None:
        resource.closed += 1
        self.closed.append(resource.n)


async def test_concurrent_acquires_create_once_and_the_last_release_closes():
    factory = Factory()
    shared = SharedResources(close=factory.close)
    got = await asyncio.gather(*(shared.acquire("t1", f"t1:{i}", factory.create) for i in range(5)))
    assert len(factory.created) == 1 and all(r is got[0] for r in got)
    assert shared.get("t1") is got[0] and len(shared) == 1
    for i in range(4):
        await shared.release("t1", f"t1:{i}")
        await shared.release("t1", f"t1:{i}")  # a repeated release counts once
        assert factory.closed == [] and shared.get("t1") is got[0]
    await shared.release("t1", "t1:4")
    assert factory.closed == [0] and got[0].closed == 1 and len(shared) == 0
    with pytest.raises(KeyError, match="t1"):
        shared.get("t1")
    await shared.release("t1", "t1:4")  # nothing left: a no-op
    assert factory.closed == [0]


async def test_trajectories_get_their_own_resources():
    factory = Factory()
    shared = SharedResources(close=factory.close)
    a, b = await asyncio.gather(shared.acquire("a", "a:x", factory.create), shared.acquire("b", "b:x", factory.create))
    assert a is not b and len(shared) == 2
    await shared.release("a", "a:x")
    assert factory.closed == [a.n] and shared.get("b") is b


async def test_a_failed_creation_reaches_every_waiter_and_is_not_kept():
    factory = Factory(fail="no environment")
    shared = SharedResources(close=factory.close)
    results = await asyncio.gather(*(shared.acquire("t", f"t:{i}", factory.create) for i in range(3)),
                                   return_exceptions=True)
    assert [str(r) for r in results] == ["no environment"] * 3
    assert len(shared) == 0
    factory.fail = None
    resource = await shared.acquire("t", "t:0", factory.create)  # created afresh
    assert resource.n == 0 and len(factory.created) == 1


async def test_an_acquire_after_a_failure_creates_afresh_before_the_failed_waiters_wake():
    shared = SharedResources()
    late: list[asyncio.Future] = []

    async def fail() -> Resource:
        await asyncio.sleep(0.01)
        # Runs after the creation has failed, ahead of its waiter's wake-up.
        asyncio.get_running_loop().call_soon(
            lambda: late.append(asyncio.ensure_future(shared.acquire("t", "t:late", Factory(delay=0).create))))
        raise RuntimeError("no environment")

    with pytest.raises(RuntimeError, match="no environment"):
        await shared.acquire("t", "t:a", fail)
    resource = await late[0]
    assert resource.n == 0 and shared.get("t") is resource and len(shared) == 1


async def test_a_release_while_the_creation_runs_lets_go_of_it():
    factory = Factory(delay=0.05)
    shared = SharedResources(close=factory.close)
    waiting = asyncio.ensure_future(shared.acquire("t", "t:a", factory.create))
    await asyncio.sleep(0)
    await shared.release("t", "t:a")
    assert len(shared) == 0
    resource = await waiting  # what it was waiting for, no longer held: closed as it arrives
    await until(lambda: resource.closed)
    assert factory.closed == [0]


async def test_a_creation_that_raises_at_once_fails_only_its_caller():
    factory = Factory(delay=0.1)
    shared = SharedResources(close=factory.close)

    def refuse() -> asyncio.Future:
        raise ValueError("create_kwargs.task is missing")

    with pytest.raises(ValueError, match="task is missing"):
        await shared.acquire("t", "t:a", refuse)
    assert len(shared) == 0
    first = asyncio.ensure_future(shared.acquire("t", "t:a", factory.create))
    await asyncio.sleep(0)
    # Joining a creation under way does not call create() again: this one would have raised.
    assert await shared.acquire("t", "t:b", refuse) is await first


async def test_a_close_that_raises_still_forgets_the_resource():
    shared: SharedResources[Resource] = SharedResources(close=lambda r: _boom(r))
    factory = Factory()
    await shared.acquire("t", "t:a", factory.create)
    with pytest.raises(RuntimeError, match="close failed"):
        await shared.release("t", "t:a")
    assert len(shared) == 0
    assert (await shared.acquire("t", "t:a", factory.create)).n == 1


async def _boom(resource: Resource) -> None:
    raise RuntimeError("close failed")


async def test_a_cancelled_creator_leaves_the_creation_to_the_other_waiters():
    factory = Factory(delay=0.1)
    shared = SharedResources(close=factory.close)
    creator = asyncio.ensure_future(shared.acquire("t", "t:a", factory.create))
    other = asyncio.ensure_future(shared.acquire("t", "t:b", factory.create))
    await asyncio.sleep(0.02)
    creator.cancel()
    resource = await other
    assert creator.cancelled() and len(factory.created) == 1
    await shared.release("t", "t:b")  # "t:a" holds nothing: this release is the last
    assert resource.closed == 1 and len(shared) == 0


async def test_a_creation_nobody_waits_for_any_more_is_closed_when_it_finishes():
    closed: list[Resource] = []
    started = threading.Event()

    async def close(resource: Resource) -> None:
        closed.append(resource)

    def build() -> Resource:  # a creation in a thread: cancelling it would lose what it makes
        started.set()
        time.sleep(0.2)
        return Resource(3)

    shared = SharedResources(close=close)
    waiters = [asyncio.ensure_future(shared.acquire("t", f"t:{i}", lambda: asyncio.to_thread(build)))
               for i in range(2)]
    await asyncio.to_thread(started.wait, 5)
    for w in waiters:
        w.cancel()
    await asyncio.gather(*waiters, return_exceptions=True)
    assert len(shared) == 0 and closed == []  # forgotten at once: a new acquire creates afresh
    await until(lambda: closed)
    assert [r.n for r in closed] == [3]


async def until(condition, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        await asyncio.sleep(0.02)


async def test_close_all_closes_the_created_and_stops_the_pending():
    factory = Factory(delay=0.05)
    shared = SharedResources(close=factory.close)
    held = await shared.acquire("a", "a:x", factory.create)
    pending = asyncio.ensure_future(shared.acquire("b", "b:x", factory.create))
    abandoned = asyncio.ensure_future(shared.acquire("c", "c:x", factory.create))
    await asyncio.sleep(0)
    abandoned.cancel()  # nobody waits for "c": its creation runs on, to be closed when it ends
    await asyncio.sleep(0)
    await shared.close_all()
    assert held.closed == 1 and len(shared) == 0
    with pytest.raises(asyncio.CancelledError):
        await pending
    await asyncio.sleep(0.1)
    assert len(factory.created) == 1 and factory.closed == [0]


# -- driven by ToolSet, as in a rollout ------------------------------------------------------------------


def shared_tools(factory: Factory, shared: SharedResources, names=("lead", "other"), **behaviour) -> dict:
    class SharedTool(Tool):
        async def create(self, instance_id=None, **kw):
            instance_id = await super().create(instance_id, **kw)
            if behaviour.get("refuse") == self.name:
                raise ValueError("refused before acquiring")
            await shared.acquire(trajectory_of(instance_id), instance_id, factory.create)
            return instance_id

        async def execute(self, instance_id, arguments, **kw):
            if behaviour.get("explode"):
                raise RuntimeError("kaboom")
            return str(shared.get(trajectory_of(instance_id)).n), 0.0, {}

        async def release(self, instance_id, **kw):
            try:
                await shared.release(trajectory_of(instance_id), instance_id)
            finally:
                await super().release(instance_id)
            if behaviour.get("release_raises") == self.name:
                raise RuntimeError("release failed")

    def schema(name):
        return {"type": "function", "function": {"name": name, "description": name, "parameters": {
            "type": "object", "properties": {}}}}

    return {n: SharedTool({}, schema(n)) for n in names}


async def test_a_toolset_shares_one_resource_and_frees_it_even_when_calls_and_releases_fail():
    factory = Factory()
    shared = SharedResources(close=factory.close)
    toolset = ToolSet(shared_tools(factory, shared, explode=True, release_raises="lead"), trajectory_id="traj")
    await toolset.start()
    assert toolset.create_errors == {} and len(factory.created) == 1
    result = await toolset.call(ToolCall(name="other", arguments={}))
    assert result.status == "error"  # the trajectory ends in an error
    await toolset.finish()
    assert "release failed" in toolset.finish_errors["lead"]
    assert factory.closed == [0] and len(shared) == 0


async def test_a_toolset_whose_creation_fails_or_times_out_leaves_nothing():
    failing = Factory(fail="server down")
    shared = SharedResources(close=failing.close)
    toolset = ToolSet(shared_tools(failing, shared), trajectory_id="t1")
    await toolset.start()
    assert set(toolset.create_errors) == {"lead", "other"} and "server down" in toolset.create_errors["lead"]
    await toolset.finish()
    assert len(shared) == 0

    refused = Factory()
    shared = SharedResources(close=refused.close)
    toolset = ToolSet(shared_tools(refused, shared, refuse="other"), trajectory_id="t2")
    await toolset.start()
    assert list(toolset.create_errors) == ["other"] and len(refused.created) == 1
    await toolset.finish()  # releases only "lead", the one holder
    assert refused.closed == [0] and len(shared) == 0

    slow = Factory(delay=0.3)
    shared = SharedResources(close=slow.close)
    toolset = ToolSet(shared_tools(slow, shared), trajectory_id="t3", lifecycle_timeout=0.1)
    await toolset.start()
    assert all("timed out" in e for e in toolset.create_errors.values()) and len(toolset.create_errors) == 2
    await toolset.finish()
    assert len(shared) == 0
    await until(lambda: slow.closed)  # the creation the timed-out creates left running is closed when it ends
    assert slow.closed == [0]
