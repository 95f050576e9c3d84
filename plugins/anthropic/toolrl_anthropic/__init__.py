"""Anthropic's Messages API on the gateway's episode endpoints (:mod:`toolrl_anthropic.messages`): an agent
program written with Anthropic's client (the ``anthropic`` SDK, a harness that speaks ``/v1/messages``) is
trained unchanged, as OpenAI clients are through the core's protocols. Light at import."""

from __future__ import annotations

from toolrl import hookimpl
from toolrl.hookspecs import Register


@hookimpl
def register_gateway_protocols(register: Register) -> None:
    register("toolrl_anthropic.messages:AnthropicMessages", name="anthropic_messages")
