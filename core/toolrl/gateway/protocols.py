"""The kind of part each API the gateway serves is (``register_gateway_protocols``), and those registered."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, ClassVar

from toolrl.config import ConfigError
from toolrl.gateway.protocol import RequestError
from toolrl.plugins.builtin import BUILTINS
from toolrl.plugins.parts import lookup_part, registered_parts, report_part

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
    """Every registered protocol that loads, one a path (a built-in's, else the first by name): one that does
    not load, or finds its path taken, is its plugin's error and a warning, never the gateway's."""
    found: dict[str, type[GatewayProtocol]] = {}
    for part in sorted(registered_parts("gateway_protocols"), key=lambda part: part.plugin not in BUILTINS):
        where = f"gateway protocol {part.name!r} (plugin {part.plugin!r}) not served"
        try:
            protocol = lookup_part("gateway_protocols", part.name, where)
            if found.setdefault(protocol.path, protocol) is not protocol:
                taken = f"{where}: {found[protocol.path].__name__} serves /v1/{protocol.path}"
                report_part("gateway_protocols", part.name, taken)
                raise ConfigError(taken)
        except ConfigError as exc:  # its plugin's status says so too (toolrl list-plugins)
            log.warning("%s", exc)
    return list(found.values())
