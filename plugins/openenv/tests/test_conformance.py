"""The ``openenv`` session through the environment-session conformance kit, on the ledger server
(tests/envs/ledger_env.py: a real OpenEnv MCP tool environment, the session-wide one of conftest.py)
reached as ``base_url`` through a loopback TCP relay of this test's own: calls over the wire, ``done``
once the balance reaches the reset's target, the last observation's reward as the score, per-episode
tools (``bonus``), episodes side by side; and with the relay gone (the server unreachable, as when it
dies), the session ends in errors instead of hanging."""

from __future__ import annotations

import contextlib
import select
import socket
import socketserver
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from support import LedgerServer
from toolrl.schemas import Sample, ToolCall
from toolrl.testing import SessionConformance, SessionPlay


class Relay(socketserver.ThreadingTCPServer):
    """Every connection to ``base_url`` piped to ``upstream``; :meth:`stop` closes the listener and
    every open connection."""

    daemon_threads = True

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream, self.open, self.lock = upstream, set[socket.socket](), threading.Lock()
        super().__init__(("127.0.0.1", 0), _Pipe)
        self.base_url = f"http://127.0.0.1:{self.server_address[1]}"
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
        with self.lock:
            for s in self.open:
                with contextlib.suppress(OSError):  # its peer may have closed it already
                    s.shutdown(socket.SHUT_RDWR)


class _Pipe(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        server: Relay = self.server  # type: ignore[assignment]
        with socket.create_connection(server.upstream) as up:
            with server.lock:
                server.open |= {self.request, up}
            peers = {self.request: up, up: self.request}
            try:
                while True:
                    for s in select.select(list(peers), [], [], 1.0)[0]:
                        data = s.recv(65536)
                        if not data:
                            return
                        peers[s].sendall(data)
            except OSError:
                return
            finally:
                with server.lock:
                    server.open -= {self.request, up}


def deposit(amount: int) -> ToolCall:
    return ToolCall(name="deposit", arguments={"amount": amount})


def episode(target: int, bonus: bool = False) -> Sample:
    return Sample(prompt="Reach the target.", extra_info={"reset_kwargs": {"target": target, "bonus": bonus}})


class TestLedger(SessionConformance):
    session_name = "openenv"
    plays = [
        # done at the target: the third call never runs
        SessionPlay(episode(3), [deposit(1), deposit(2), deposit(5)], terms={"openenv": 1.0}),
        SessionPlay(episode(10), [deposit(4), ToolCall(name="balance")], terms={"openenv": 0.0}),
        SessionPlay(episode(8, bonus=True), [deposit(4), ToolCall(name="bonus")], terms={"openenv": 1.0}),
    ]

    @pytest.fixture(autouse=True)
    def _relay(self, ledger: LedgerServer) -> Iterator[None]:
        self.relay = Relay(("127.0.0.1", ledger.port))
        yield
        self.relay.stop()

    @property
    def session_options(self) -> dict[str, Any]:  # type: ignore[override]
        return {"base_url": self.relay.base_url, "connect_timeout_s": 10, "message_timeout_s": 10,
                "queue_timeout_s": 30}

    async def kill(self, kind: Any) -> None:
        self.relay.stop()
