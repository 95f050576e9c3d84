"""A fleet of environment servers as one client sees it: which answer, how many of this client's
sessions each holds, which to give the next trajectory (the least loaded that answers and has room;
ties: the least used). A server that fails is marked down and asked again (``/health``) every
``retry_s``, in the background; one this client started itself is started again first
(:mod:`toolrl_fleet.launch`)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
from toolrl import InfrastructureError

from toolrl_fleet.launch import LocalServer
from toolrl_fleet.protocol import HEALTH_PATH, MAX_MESSAGE, SESSION_PATH, Health
from toolrl_fleet.ray_servers import address, stop_actors

WAIT_S = 0.05  # between looks for a free server when every one is busy or down


@dataclass(eq=False)
class Member:
    url: str
    local: LocalServer | None = None
    actor: Any = None  # a Ray actor running the server (toolrl_fleet.ray_servers): the URL is the one it gives
    capacity: int = 1
    open: int = 0
    up: bool = False
    retry_at: float = 0.0
    full_until: float = 0.0  # it refused a session for want of room (others' sessions): not asked before
    state_key: bool = True  # its kind keys states (Health.state_key)
    session: str = ""  # the session kind it serves (Health.session): its sessions' reward term
    losses: int = 0  # times it was found gone
    taken: int = 0  # trajectories it was given


class Fleet:
    """The servers of one route's sessions, and the HTTP client that reaches them."""

    def __init__(self, urls: list[str], local: list[LocalServer], retry_s: float, connect_timeout_s: float,
                 actors: list[Any] | None = None) -> None:
        self.members = ([Member(u.rstrip("/")) for u in urls] + [Member(s.url, s) for s in local]
                        + [Member("", actor=a) for a in actors or []])
        self.retry_s, self.connect_timeout_s = retry_s, connect_timeout_s
        # No limit on connections: each open trajectory holds one WebSocket (the servers' capacity limits them).
        self.http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                          timeout=aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout_s))
        self._probes: dict[Member, asyncio.Future[None]] = {}

    async def start(self, startup_timeout_s: float) -> None:
        """Start this client's own servers, wait for them, ask every server its health. None answering
        is a ValueError (the configuration cannot run); one of its own that exits while starting is not
        started again here (its error is in the message)."""
        for m in self.members:
            if m.local is not None:
                m.local.spawn()
        deadline = time.monotonic() + startup_timeout_s
        while True:
            for m in self.members:
                if not m.up and (m.local is None or m.local.alive()):
                    await self.probe(m)
            pending = [m for m in self.members if not m.up
                       and (m.actor is not None or (m.local is not None and m.local.alive()))]
            if not pending or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        if not any(m.up for m in self.members):
            why = "; ".join(f"{m.url}: {m.local.error_tail()}" for m in self.members if m.local is not None)
            raise ValueError("no environment server answers " + ", ".join(m.url + HEALTH_PATH for m in self.members)
                             + (f" ({why})" if why else ""))

    async def probe(self, member: Member) -> None:
        """Ask ``member`` its health; up when it answers, else down until ``retry_s`` from now. An actor's
        server is asked at the address the actor gives now."""
        if member.actor is not None:
            url = await address(member.actor)
            if url is None:
                self.down(member)
                return
            member.url = url
        try:
            async with self.http.get(member.url + HEALTH_PATH, timeout=aiohttp.ClientTimeout(total=2)) as reply:
                health = Health.model_validate(await reply.json())
        except Exception:  # refused, timed out, not a toolrl environment server: down either way
            self.down(member)
            return
        member.up, member.capacity, member.state_key = True, health.capacity, health.state_key
        member.session = health.session

    def down(self, member: Member) -> None:
        """``member`` failed: no new trajectory goes to it until it answers again; one of this client's
        own servers whose process exited is started again."""
        if member.up:
            member.losses += 1
        member.up, member.retry_at = False, time.monotonic() + self.retry_s
        if member.local is not None:
            member.local.restart_if_dead()

    def _revive(self) -> None:
        """Ask every server that is down and due again, in the background: no trajectory waits for it."""
        now = time.monotonic()
        for member in [m for m in self.members if not m.up and m.retry_at <= now and m not in self._probes]:
            self._probes[member] = asyncio.ensure_future(self.probe(member))
            self._probes[member].add_done_callback(lambda _, m=member: self._probes.pop(m, None))

    async def connect(self, trajectory_id: str, queue_timeout_s: float) -> tuple[Member, aiohttp.ClientWebSocketResponse]:
        """A WebSocket to the least loaded server that answers and has room (waiting for one at most
        ``queue_timeout_s``); a server that refuses the connection is marked down and the next tried.
        Pair with :meth:`release`."""
        deadline = time.monotonic() + queue_timeout_s
        while True:
            self._revive()
            now = time.monotonic()
            free = [m for m in self.members if m.up and m.open < m.capacity and m.full_until <= now]
            if free:
                member = min(free, key=lambda m: (m.open / m.capacity, m.taken))  # least loaded, then least used
                member.open += 1
                try:
                    ws = await self.http.ws_connect(f"{member.url}{SESSION_PATH}", params={"trajectory_id": trajectory_id},
                                                    max_msg_size=MAX_MESSAGE)
                    member.taken += 1
                    return member, ws
                except BaseException as exc:  # the slot is not taken
                    member.open -= 1
                    if isinstance(exc, aiohttp.WSServerHandshakeError) and exc.status == 503:
                        member.full_until = time.monotonic() + self.retry_s  # full: others hold its sessions
                    elif isinstance(exc, (aiohttp.ClientError, OSError)):
                        self.down(member)
                    else:  # cancelled (the call's deadline)
                        raise
                continue
            if time.monotonic() > deadline:
                up = sum(m.up for m in self.members)
                raise InfrastructureError(f"no environment server free within {queue_timeout_s:g} s ({up} of "
                                          f"{len(self.members)} up; fleet.queue_timeout_s)")
            await asyncio.sleep(WAIT_S)

    def release(self, member: Member) -> None:
        member.open -= 1

    def lost(self, member: Member, exc: BaseException | str) -> InfrastructureError:
        """A trajectory's server went away mid-session: mark it down; the error that ends (masks) it."""
        if member.up:
            self.down(member)
        why = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        return InfrastructureError(f"environment server {member.url} gone: {why}")

    async def close(self) -> None:
        for probe in list(self._probes.values()):
            probe.cancel()
        await self.http.close()
        for m in self.members:
            if m.local is not None:
                m.local.stop()
        actors = [m.actor for m in self.members if m.actor is not None]
        if actors:
            await asyncio.to_thread(stop_actors, actors)
