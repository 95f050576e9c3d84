"""What ``toolrl serve`` does per request, independent of HTTP: render chat messages with the
model's chat template, generate with the configured engine, parse tool calls with the configured
parser, and shape OpenAI responses (and their streamed chunks)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from toolrl.engines import Generation, RolloutEngine, SamplingParams
from toolrl.gateway.messages import (
    chat_chunks,
    finish_reason,
    model_list,
    reply_message,
    template_messages,
    tool_schemas,
)
from toolrl.gateway.protocol import (
    ChatMessage,
    ChatRequest,
    CompletionRequest,
    RequestError,
    is_assistant_key,
    message_key,
    sse,
)
from toolrl.trajectory import TrajectoryImage

from toolrl_openai.conversations import Conversations, Match, Turn
from toolrl_openai.tokens import token_id_string


@dataclass
class _Choice:
    gen: Generation
    body_ids: list[int]  # the tokens whose text the client sees (no stop token)
    text: str


class Service:
    def __init__(self, engine: RolloutEngine, tokenizer: Any, parser: Any, model_name: str,
                 conversations: Conversations, default_max_tokens: int = 256, token_history: bool = False,
                 processor: Any = None, image_limits: Any = None) -> None:
        from toolrl.images import ImageLimits

        self.engine = engine
        self.processor = processor  # a vision-language model's: image parts are rendered with it
        self.image_limits = image_limits if image_limits is not None else ImageLimits()
        # Continue a recognised chat conversation from the exact tokens served (as training rollouts
        # do) instead of re-rendering its earlier turns with the template.
        self.token_history = token_history
        self.tokenizer = tokenizer
        self.parser = parser
        self.model_name = model_name
        self.conversations = conversations
        self.default_max_tokens = default_max_tokens
        self.created = int(time.time())
        self._renderers: dict[str, Any] = {}

    # ----------------------------------------------------------------- shared

    def models(self) -> dict[str, Any]:
        return model_list(self.model_name, self.created)

    def _check_model(self, model: str) -> None:
        if model != self.model_name:
            raise RequestError(f"the model {model!r} does not exist; this server serves {self.model_name!r}",
                               404, "model")

    async def _generate(self, prompt_ids: list[int], params: SamplingParams, n: int, base: Match | None = None,
                        images: Sequence[Any] = ()) -> tuple[list[Generation], Match | None, str | None]:
        # Image tokens are alike whatever the image: a prompt with images continues no conversation.
        base = base or (None if images else self.conversations.match(prompt_ids))
        session = self.conversations.session_for(base, n)
        extra = {"images": list(images)} if images else {}
        try:
            gens = await self.engine.generate(prompt_ids, params, n, session_id=session, **extra)
        except ValueError as exc:  # the engine's request check: empty or over-long prompts
            raise RequestError(str(exc)) from None
        return gens, base, session

    def _choice(self, gen: Generation, skip_special: bool, keep_stop: bool) -> _Choice:
        ids = list(gen.token_ids)
        stop_token = gen.finish_reason == "stop" and isinstance(gen.stop, int) and ids and ids[-1] == gen.stop
        body = ids[:-1] if stop_token and not keep_stop else ids
        text = self.tokenizer.decode(body, skip_special_tokens=skip_special)
        if gen.finish_reason == "stop_string" and isinstance(gen.stop, str) and gen.stop in text:
            cut = text.index(gen.stop)
            text = text[: cut + len(gen.stop)] if keep_stop else text[:cut]
        return _Choice(gen, body, text)

    def _pieces(self, ids: Sequence[int]) -> list[str]:
        """Each token's share of the decoded text, joining to the whole. Incremental, as streaming
        detokenizers do: a token's text is the decoding of (previous token(s) + it) minus that of the
        previous token(s), so a tokenizer that drops a leading space at the start of a decode is
        handled; a token that ends inside a multi-byte character gets "" and the next one the rest."""
        pieces: list[str] = []
        prefix = read = 0  # the context starts at prefix; text up to read is already given out
        for k in range(len(ids)):
            text = self.tokenizer.decode(list(ids[prefix:k + 1]), skip_special_tokens=False)
            if text.endswith("\ufffd") and k + 1 < len(ids):
                pieces.append("")
                continue
            before = self.tokenizer.decode(list(ids[prefix:read]), skip_special_tokens=False)
            pieces.append(text[len(before):])
            prefix, read = read, k + 1
        return pieces

    def _token_strings(self, ids: Sequence[int], as_ids: bool) -> list[str]:
        return [token_id_string(t) for t in ids] if as_ids else self._pieces(ids)

    @staticmethod
    def _stop_reason(gen: Generation) -> int | str | None:
        return gen.stop if gen.finish_reason in ("stop", "stop_string") else None

    # ----------------------------------------------------------------- /v1/completions

    def _prompts(self, req: CompletionRequest) -> list[list[int]]:
        p = req.prompt
        if isinstance(p, str):
            texts: list[Any] = [p]
        elif p and isinstance(p[0], int):
            texts = [p]
        else:
            texts = list(p)
        out = []
        for item in texts:
            ids = list(self.tokenizer.encode(item, add_special_tokens=False)) if isinstance(item, str) else list(item)
            vocab = len(self.tokenizer)
            if any(not 0 <= t < vocab for t in ids):
                raise RequestError(f"prompt token ids must be in [0, {vocab})", param="prompt")
            out.append(ids)
        if not out:
            raise RequestError("prompt is empty", param="prompt")
        return out

    async def _prompt_logprobs(self, prompts: list[list[int]], top: int) -> list[list[dict[str, Any] | None]]:
        """vLLM's ``prompt_logprobs`` of each prompt: None for its first token, then a dict by token id
        (as a JSON key) of the token's and the ``top`` most likely tokens' log-prob, rank and text."""
        try:
            scored = await self.engine.prompt_logprobs(prompts, top)
        except (NotImplementedError, ValueError) as exc:
            raise RequestError(str(exc), param="prompt_logprobs") from None
        out: list[list[dict[str, Any] | None]] = []
        for prompt, s in zip(prompts, scored, strict=True):
            texts = self._pieces(prompt)
            rows: list[dict[str, Any] | None] = [None]
            for j, token in enumerate(prompt[1:]):
                row = {str(t): {"logprob": lp, "rank": r + 1, "decoded_token": self.tokenizer.decode([t])}
                       for r, (t, lp) in enumerate(s.top[j])}
                row[str(token)] = {"logprob": s.logprobs[j], "rank": s.ranks[j], "decoded_token": texts[j + 1]}
                rows.append(row)
            out.append(rows)
        return out

    async def complete(self, req: CompletionRequest) -> dict[str, Any] | AsyncIterator[str]:
        self._check_model(req.model)
        if req.echo:
            raise RequestError("echo is not supported: ask for prompt_logprobs (vLLM's extension) for the "
                               "prompt's log-probs", param="echo")
        if req.prompt_logprobs is not None and req.stream:
            raise RequestError("prompt_logprobs are not streamed: use stream=false", param="prompt_logprobs")
        if req.logprobs:
            raise RequestError("this server returns the sampled token's logprob only: use logprobs=0",
                               param="logprobs")
        prompts = self._prompts(req)
        stop_ids = list(req.stop_token_ids or [])
        if not req.ignore_eos and self.tokenizer.eos_token_id is not None and self.tokenizer.eos_token_id not in stop_ids:
            stop_ids.append(self.tokenizer.eos_token_id)
        params = SamplingParams(temperature=req.temperature, top_p=req.top_p,
                                max_new_tokens=req.max_tokens if req.max_tokens is not None else 16,
                                stop_token_ids=stop_ids, stop_strings=req.stop_strings(), seed=req.seed)
        results = await asyncio.gather(*(self._generate(p, params, req.n) for p in prompts))
        scored = None if req.prompt_logprobs is None else await self._prompt_logprobs(prompts, req.prompt_logprobs)
        rid, choices, completion_tokens = f"cmpl-{uuid.uuid4().hex}", [], 0
        for k, (prompt, (gens, base, session)) in enumerate(zip(prompts, results)):
            turns = []
            for i, gen in enumerate(gens):
                c = self._choice(gen, req.skip_special_tokens, req.include_stop_str_in_output)
                turns.append(Turn(gen, c.text, c.text))
                completion_tokens += len(gen.token_ids)
                choice: dict[str, Any] = {"index": k * req.n + i, "text": c.text, "logprobs": None,
                                          "finish_reason": finish_reason(gen.finish_reason),
                                          "stop_reason": self._stop_reason(gen)}
                if req.return_token_ids:
                    choice |= {"prompt_token_ids": prompt, "token_ids": list(gen.token_ids)}
                if scored is not None:
                    choice["prompt_logprobs"] = scored[k]
                if req.logprobs is not None:
                    # Every generated token, stop token included: the client rebuilds the exact ids.
                    tokens = self._token_strings(gen.token_ids, req.return_tokens_as_token_ids)
                    pieces = tokens if not req.return_tokens_as_token_ids else self._pieces(gen.token_ids)
                    offsets = [sum(len(p) for p in pieces[:j]) for j in range(len(pieces))]
                    choice["logprobs"] = {"tokens": tokens, "token_logprobs": list(gen.logprobs),
                                          "top_logprobs": None, "text_offset": offsets}
                choices.append(choice)
            self.conversations.add(prompt, turns, base, session)
        usage = {"prompt_tokens": sum(len(p) for p in prompts), "completion_tokens": completion_tokens,
                 "total_tokens": sum(len(p) for p in prompts) + completion_tokens}
        body = {"id": rid, "object": "text_completion", "created": int(time.time()), "model": self.model_name,
                "choices": choices, "usage": usage}
        return self._stream_completion(body, req) if req.stream else body

    async def _stream_completion(self, body: dict[str, Any], req: CompletionRequest) -> AsyncIterator[str]:
        head = {k: body[k] for k in ("id", "object", "created", "model")}
        for choice in body["choices"]:
            yield sse({**head, "choices": [choice]})
        if req.stream_options is not None and req.stream_options.include_usage:
            yield sse({**head, "choices": [], "usage": body["usage"]})
        yield "data: [DONE]\n\n"

    # ----------------------------------------------------------------- /v1/chat/completions

    def _renderer(self, tools: list[dict[str, Any]]) -> Any:
        from toolrl.renderers.chat import ChatRenderer

        key = json.dumps(tools, sort_keys=True)
        if key not in self._renderers:
            if len(self._renderers) > 256:
                self._renderers.clear()
            self._renderers[key] = ChatRenderer(self.tokenizer, tools, processor=self.processor)
        return self._renderers[key]

    def _render(self, renderer: Any, messages: list[dict[str, Any]]) -> list[int]:
        """The prompt as ``ChatRenderer.prompt_ids`` renders it, without its memo: a server sees
        ever-new conversations, and keeping thousands of them would only cost memory."""
        tools = renderer.tool_schemas if renderer.native_tools and renderer.tool_schemas else None
        out = self.tokenizer.apply_chat_template(renderer.prompt_messages(messages), tools=tools,
                                                 add_generation_prompt=True, tokenize=True, return_dict=False)
        return list(out["input_ids"] if isinstance(out, dict) else out)

    async def chat(self, req: ChatRequest) -> dict[str, Any] | AsyncIterator[str]:
        self._check_model(req.model)
        if req.top_logprobs:
            raise RequestError("this server returns the sampled token's logprob only: use top_logprobs=0",
                               param="top_logprobs")
        if req.tool_choice not in (None, "auto", "none"):
            raise RequestError("tool_choice must be 'auto' or 'none' (forced calls are not supported)",
                               param="tool_choice")
        tools = tool_schemas(req.tools)
        renderer = self._renderer(tools)
        pngs: list[bytes] = []
        messages = template_messages(req.messages, renderer, pngs, self.processor, self.image_limits)
        images = [TrajectoryImage(png=p, grid_thw=renderer.image_grid(p)) for p in pngs]
        keys = [json.dumps(tools, sort_keys=True), *(message_key(m) for m in req.messages)]
        # A conversation with images is rendered whole: its image tokens say nothing of its images.
        found = self.conversations.match_messages(keys, is_assistant_key) if self.token_history and not images \
            else None
        prompt: list[int] | None = None
        if found is not None:  # the served tokens, then the template's rendering of the new messages
            try:
                prompt = found[0].conversation.tokens + renderer.tool_delta(messages[found[1] - 1:])
            except Exception:  # a template that is not append-only here: render the whole conversation
                found = None
        if prompt is None:
            try:
                prompt = renderer.expand_images(self._render(renderer, messages), [i.grid_thw for i in images])
            except Exception as exc:  # the template's own checks (e.g. role order)
                raise RequestError(f"the chat template cannot render these messages: {exc}",
                                   param="messages") from None
        stop_ids = [renderer.eos_id]
        if self.tokenizer.eos_token_id is not None and self.tokenizer.eos_token_id not in stop_ids:
            stop_ids.append(self.tokenizer.eos_token_id)
        max_tokens = next((v for v in (req.max_completion_tokens, req.max_tokens) if v is not None),
                          self.default_max_tokens)
        params = SamplingParams(temperature=req.temperature, top_p=req.top_p, max_new_tokens=max_tokens,
                                stop_token_ids=stop_ids, stop_strings=req.stop_strings(), seed=req.seed)
        gens, base, session = await self._generate(prompt, params, req.n, found[0] if found else None, images)
        parse_calls = bool(tools) and req.tool_choice != "none"
        choices, turns, bodies = [], [], []
        for i, gen in enumerate(gens):
            c = self._choice(gen, skip_special=False, keep_stop=False)
            bodies.append(c.body_ids)
            parsed = self.parser.parse(c.text) if parse_calls else None
            message, errors = reply_message(c.text, parsed), parsed.errors if parsed is not None else []
            choice: dict[str, Any] = {"index": i, "message": message, "logprobs": None,
                                      "finish_reason": finish_reason(gen.finish_reason, message),
                                      "stop_reason": self._stop_reason(gen)}
            if req.logprobs:
                tokens = self._token_strings(gen.token_ids, req.return_tokens_as_token_ids)
                choice["logprobs"] = {"content": [
                    {"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
                    for t, lp in zip(tokens, gen.logprobs)]}
            choices.append(choice)
            reply = ChatMessage.model_validate(message)
            turns.append(Turn(gen, c.text, message["content"] or "", errors, [*keys, message_key(reply)]))
        self.conversations.add(prompt, turns, base, session, images)
        completion_tokens = sum(len(g.token_ids) for g in gens)
        body = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
                "model": self.model_name, "choices": choices,
                "usage": {"prompt_tokens": len(prompt), "completion_tokens": completion_tokens,
                          "total_tokens": len(prompt) + completion_tokens}}
        if not req.stream:
            return body
        include_usage = req.stream_options is not None and req.stream_options.include_usage
        # Content as the model produced it, token by token, where those pieces join to it.
        return chat_chunks(body, [self._pieces(ids) for ids in bodies], include_usage)
