"""The kind of part each API the gateway serves is (``register_gateway_protocols``), and those registered."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, ClassVar

from toolrl.gateway.protocol import RequestError
from toolrl.plugins import get_plugins
from toolrl.plugins.registry import PartError

if TYPE_CHECKING:
    from toolrl.gateway.session import GatewaySession

log = logging.getLogger(__name__)


class GatewayProtocol:
    """An API the gateway serves on every episode's endpoint (``register_gateway_protocols``): a request to
    ``POST /e/{episode}/v1/{path}`` is ``parse`` d (a pydantic model with a ``stream`` field; a RequestError
    naming a bad field), ``answer`` ed as the chat turn it amounts to (``GatewaySession.turn``) and, when it
    asks, sent as ``stream`` 's server-sent events; a refusal is ``error_body``. ``environ``: the variables
    that point the API's clients at an episode's endpoint (``root``: ``/e/{episode}``), which a program gets."""

    path: ClassVar[str]
    parse: ClassVar[Callable[[bytes], Any]]
    answer: ClassVar[Callable[[GatewaySession, Any], Awaitable[dict[str, Any]]]]
    stream: ClassVar[Callable[[Any, dict[str, Any]], AsyncIterator[str]]]

    @staticmethod
    def error_body(error: RequestError) -> dict[str, Any]:
        return error.body()

    @staticmethod
    def environ(root: str, key: str) -> dict[str, str]:
        return {}


def gateway_protocols() -> list[type[GatewayProtocol]]:
    """Every registered protocol that loads, by path (the first registered of a path): one that does not
    load is its plugin's error (``toolrl list-plugins``) and a warning, never the gateway's."""
    plugins, found = get_plugins(), {}
    for part in plugins.registry.parts("gateway_protocols"):
        try:
            protocol = plugins.load_part("gateway_protocols", part.name)
        except PartError as exc:
            log.warning("gateway protocol %r not served: %s", part.name, exc)
            continue
        if found.setdefault(protocol.path, protocol) is not protocol:
            log.warning("gateway protocol %r not served: another serves /v1/%s", part.name, protocol.path)
    return list(found.values())
