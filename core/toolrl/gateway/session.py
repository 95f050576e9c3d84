"""One episode's side of the gateway: its model calls, its models, its rewards.

A model call (:meth:`GatewaySession.turn`, whichever API it came through) renders its messages with the
family's template (continuing a segment where it can: :mod:`toolrl.gateway.record`), generates under the
rollout's sampling settings (the program's own are not what is trained) and parses calls with the route's
parser. A run with roles serves each role as a model name, the role that acts in the call (under
``model.adapters``, the adapter the engine samples with); a run without serves ``rollout.agent.model``.
"""

from __future__ import annotations

import json
import secrets
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from toolrl.agent_roles import adapter_keyword
from toolrl.config import RolloutConfig
from toolrl.engines import Generation, RolloutEngine, SamplingParams
from toolrl.gateway.messages import finish_reason, reply_message, template_messages, tool_schemas
from toolrl.gateway.protocol import Body, ChatMessage, RequestError, message_key
from toolrl.gateway.record import Call, EpisodeRecord
from toolrl.parsers import ToolParser, parse_within
from toolrl.renderers.chat import ChatRenderer, TemplateError
from toolrl.rewards.scoring import RewardValueError, coerce_reward
from toolrl.schemas import ParseResult
from toolrl.seeds import turn_seed


@dataclass(frozen=True)
class Ask:
    """What a call asks of the model besides its messages and tools, whichever API it came through."""

    n: int = 1
    max_tokens: int | None = None  # None: rollout.max_new_tokens (a call may ask for fewer, never more)
    stop: Sequence[str] = ()
    parse_calls: bool = True
    parallel_calls: bool = True
    tool: str | None = None  # the function tool_choice forces: one of the call's tools


@dataclass
class Choice:
    """One generated choice: the assistant message a client gets (OpenAI chat form), why it ended
    (``stop``, ``length``, ``tool_calls``), and the generation."""

    message: dict[str, Any]
    finish: str
    generation: Generation


@dataclass
class Turn:
    """A model call's answer: its completion id (a step reward names it), its choices, its prompt's length."""

    id: str
    choices: list[Choice]
    prompt_tokens: int
    decode: Callable[[Sequence[int]], str]  # the tokenizer's

    def usage(self) -> dict[str, int]:
        used = sum(len(c.generation.token_ids) for c in self.choices)
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": used, "total_tokens": self.prompt_tokens + used}


@dataclass(frozen=True)
class Reply:
    """A reply as the model wrote it: its tokens, its parse (calls with the ids they were served with)."""

    ids: list[int]
    parsed: ParseResult | None


class RewardPost(Body):
    """``{"reward": x}`` (the episode's reward), ``{"reward": x, "call_id": ID}`` (a step reward for the
    completion ``ID``) or ``{"reward": x, "role": R}`` (role ``R``'s reward, in a run with roles)."""

    reward: Any  # a number (coerce_reward says what is not)
    call_id: str | None = None
    role: str | None = None


@dataclass
class GatewaySession:
    record: EpisodeRecord
    engine: RolloutEngine
    renderers: Callable[[Sequence[dict[str, Any]]], ChatRenderer]  # by the tool schemas
    parser: ToolParser
    config: RolloutConfig
    seed: int
    model: str  # the model name the endpoint gives its program (under roles: one of them)
    roles: Sequence[str] = ()  # the run's roles, the model names served; empty: ``model`` is served
    adapters: bool = False  # model.adapters: the engine samples each call with its role's adapter
    api_key: str = field(default_factory=lambda: f"toolrl-{secrets.token_urlsafe(24)}")
    reward: float | None = None  # posted to the reward URL
    role_rewards: dict[str, float] = field(default_factory=dict)  # posted with a role
    step_rewards: dict[str, float] = field(default_factory=dict)  # by the completion id they name
    served: set[str] = field(default_factory=set)  # completion ids, which a step reward may name
    exhausted: bool = False  # a call found no token left of max_response_tokens
    failures: list[str] = field(default_factory=list)  # calls the engine failed
    replies: dict[str, Reply] = field(default_factory=dict)  # what the model wrote, by the key of the reply served
    _parsers: dict[str, ToolParser] = field(default_factory=dict)  # the parser bound to each set of tools

    def set_reward(self, post: RewardPost) -> dict[str, Any]:
        try:
            value = coerce_reward(post.reward, "reward")
        except RewardValueError as exc:
            raise RequestError(str(exc), param="reward") from None
        call, role = post.call_id, post.role
        if role is not None and call is not None:
            raise RequestError("a reward names a role or a call_id, not both (a step reward is its call's role's)",
                               param="role")
        if role is not None:
            if role not in self.roles:
                raise RequestError(f"role {role!r} is not one of this run's roles ({self._roles_named()})",
                                   param="role")
            self.role_rewards[role] = value
        elif call is None:
            self.reward = value
        elif call not in self.served:
            raise RequestError(f"call_id {call!r} is no completion of this episode", 404, "call_id")
        else:
            self.step_rewards[call] = value
        return {"ok": True}

    def role_of(self, model: str) -> str | None:
        """The role a call asking for ``model`` acts in (None: the run has no roles); a name that is not
        served (no role of the run, or not the endpoint's model) is a 404 naming what is."""
        if not self.roles:
            if model != self.model:
                raise RequestError(f"the model {model!r} does not exist; this endpoint serves {self.model!r}", 404,
                                   "model")
            return None
        if model not in self.roles:
            raise RequestError(f"the model {model!r} does not exist: the models served are this run's roles "
                               f"({self._roles_named()})", 404, "model")
        return model

    def _roles_named(self) -> str:
        return ", ".join(repr(r) for r in self.roles) or "none"

    async def turn(self, messages: Sequence[ChatMessage], tools: Sequence[dict[str, Any]] | None, ask: Ask,
                   id_prefix: str = "chatcmpl", role: str | None = None) -> Turn:
        """One model call of the episode, whichever API it came through: ``messages`` (OpenAI chat
        messages, ``tools`` OpenAI function tools) rendered or continued from the sampled tokens,
        generated by ``role`` (:meth:`role_of` the model asked for), parsed and recorded. Its id
        (``id_prefix-...``) is one a step reward may name."""
        if self.record.ended:  # the program outlived its episode (cut at its deadline)
            raise RequestError("the episode has ended", 404)
        schemas = tool_schemas(tools)
        if ask.tool is not None and ask.tool not in (s["function"]["name"] for s in schemas):
            raise RequestError(f"tool_choice: no function {ask.tool!r} in tools", param="tool_choice")
        renderer = self.renderers(schemas)
        keys = [message_key(m) for m in messages]  # ids are no part of a key: renaming them keeps it
        messages = self._served_ids(messages, keys)
        # A reply the model wrote is rendered as it wrote it, as the rollout loop renders its history.
        rendered = [renderer.assistant_message(self.replies[k].ids, self.replies[k].parsed) if k in self.replies
                    else m for k, m in zip(keys, template_messages(messages, renderer, []))]  # no processor: no images
        try:
            call = self.record.place(keys, json.dumps(schemas, sort_keys=True), renderer, rendered, role)
        except TemplateError as exc:  # the template's own checks (role order...); a bug here is a 500
            raise RequestError(str(exc), param="messages") from None
        prompt_tokens = len(call.prompt_ids)
        gens = await self._generate(call, ask, renderer)
        parser = self._parser(schemas) if schemas and ask.parse_calls else None
        choices, replies, texts, errors = [], [], [], []
        for i, gen in enumerate(gens):
            text = renderer.turn_text(gen.token_ids)
            parsed = await parse_within(parser, self._call_text(renderer, parser, gen, text),
                                        self.config.parser_timeout_s) if parser is not None else None
            if parsed is not None:
                calls = renderer.with_call_ids(parsed.calls, f"{self.record.key}:{self.record.calls}:{i}")
                calls = [c if c.id else c.model_copy(update={"id": f"call_{uuid.uuid4().hex[:24]}"}) for c in calls]
                parsed = parsed.model_copy(update={"calls": calls if ask.parallel_calls else calls[:1]})
            message = reply_message(text, parsed)
            replies.append(message_key(ChatMessage.model_validate(message)))
            self.replies[replies[-1]] = Reply(list(gen.token_ids), parsed)
            texts.append(text)
            errors.append(parsed.errors if parsed is not None else [])
            choices.append(Choice(message, finish_reason(gen.finish_reason, message), gen))
        if not call.abandoned:
            self.record.record(call, gens, replies, texts, errors, choices[0].message["content"] or "")
        completion = f"{id_prefix}-{uuid.uuid4().hex}"
        self.served.add(completion)
        return Turn(completion, choices, prompt_tokens, renderer.decode)

    def _served_ids(self, messages: Sequence[ChatMessage], keys: Sequence[str]) -> Sequence[ChatMessage]:
        """The messages with each call and tool result naming the call by the id the model's reply was
        served with, where the client renamed it: templates that pair results with calls render that id."""
        rename: dict[str, str] = {}
        for m, key in zip(messages, keys):
            reply = self.replies.get(key) if m.role == "assistant" and m.tool_calls else None
            served = [c.id or "" for c in reply.parsed.calls] if reply is not None and reply.parsed else []
            rename.update({c.id: s for c, s in zip(m.tool_calls or [], served) if c.id and c.id != s})
        if not rename:
            return messages
        out = []
        for m in messages:
            if m.role == "tool" and m.tool_call_id in rename:
                m = m.model_copy(update={"tool_call_id": rename[m.tool_call_id]})
            elif m.tool_calls and any(c.id in rename for c in m.tool_calls):
                m = m.model_copy(update={"tool_calls": [c.model_copy(update={"id": rename.get(c.id or "", c.id)})
                                                        for c in m.tool_calls]})
            out.append(m)
        return out

    @staticmethod
    def _call_text(renderer: ChatRenderer, parser: ToolParser, gen: Generation, text: str) -> str:
        """What the parser reads: the turn's text, with its end token where that token closes a call
        in the format (gpt-oss's ``<|call|>``)."""
        end = renderer.decode(gen.token_ids[-1:])
        return text + end if end and end in parser.stop_strings and not text.endswith(end) else text

    def _parser(self, schemas: list[dict[str, Any]]) -> ToolParser:
        """The route's parser bound to these tools (formats whose values are untyped text type them
        from the schemas): one per set of tools (``ToolParser.for_tools``), since parses run on threads."""
        key = json.dumps(schemas, sort_keys=True)
        if key not in self._parsers:
            self._parsers[key] = self.parser.for_tools(schemas)
        return self._parsers[key]

    async def _generate(self, call: Call, ask: Ask, renderer: ChatRenderer) -> list[Generation]:
        """The call's generations within the per-call and the whole-episode budgets; none when the
        episode has no token left (the program gets an empty ``length`` answer)."""
        cfg = self.config
        budget = cfg.max_response_tokens - self.record.response_tokens
        asked = ask.max_tokens if ask.max_tokens is not None else cfg.max_new_tokens
        if budget <= 0 or asked == 0:
            self.record.abandon(call)
            self.exhausted = self.exhausted or budget <= 0
            return [Generation([], [], "length") for _ in range(ask.n)]
        params = SamplingParams(temperature=cfg.temperature, top_p=cfg.top_p,
                                max_new_tokens=min(asked, cfg.max_new_tokens, budget),
                                stop_token_ids=renderer.stop_ids,
                                stop_strings=[*self.parser.stop_strings, *ask.stop],
                                seed=turn_seed(self.seed, self.record.calls))
        session = call.segment.traj.trajectory_id if ask.n == 1 else None
        try:
            return await self.engine.generate(call.prompt_ids, params, ask.n, session_id=session,
                                              **adapter_keyword(call.segment.traj.role, self.adapters))
        except BaseException as exc:
            self.record.abandon(call)
            if isinstance(exc, ValueError):  # the engine's request check: an over-long prompt
                raise RequestError(str(exc)) from None
            if isinstance(exc, Exception):  # not the call given up (its program's deadline, CancelledError)
                self.failures.append(f"{type(exc).__name__}: {exc}")
            raise
