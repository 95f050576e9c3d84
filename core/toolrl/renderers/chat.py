"""Chat-template rendering as token deltas — where the loss mask's correctness lives.

A trajectory's tokens are never re-tokenized: the prompt is rendered once, the model's tokens are
appended as generated, and each round of tool results is appended as the *delta* the chat template
adds for those messages. The delta is found by rendering a fixed synthetic conversation with and
without the new messages and asserting the shorter rendering is a token prefix of the longer
(append-only). The template text that follows the assistant's end-of-turn token (Qwen's ``\\n``
after ``<|im_end|>``), which the model never generates, is prepended to the delta, so the training
sequence is exactly what the template would render (verl's mismatch, fixed there in #6779).

With a processor, each image renders as the template's one image token, expanded to its run (patch
grid / merge²) as the processor expands its text, so renderings and deltas hold no pixels and cache as text.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal

from toolrl.families import token_id
from toolrl.images import from_png

if TYPE_CHECKING:
    from toolrl.schemas import ParseResult, ToolCall

Truncation = Literal["keep_head", "keep_tail", "keep_head_and_tail"]

# Used when a chat template ignores ``tools=`` (e.g. SmolLM2's): the hermes convention, stated plainly.
FALLBACK_TOOL_PROMPT = (
    "You can call functions to help you answer. Their JSON schemas are listed inside <tools></tools>:\n"
    "<tools>\n{tools}\n</tools>\n"
    "To call a function, write exactly:\n"
    '<tool_call>{{"name": "<function-name>", "arguments": {{<arguments as JSON>}}}}</tool_call>\n'
    "The result comes back inside <tool_response></tool_response>."
)

# Synthetic assistant turns tried in order. The first carries a reasoning block because Qwen3's
# template renders the last assistant turn differently from earlier ones unless it has reasoning.
_SYNTHETIC_ASSISTANTS = ("<think>\nx\n</think>\n\ny", "y")


def _synthetic_turns(tool_messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The synthetic assistant turns, then one with structured calls to the tools that answered
    (gpt-oss, Gemma 4 and GLM's training template render tool results only after those)."""
    turns: list[dict[str, Any]] = [{"role": "assistant", "content": a} for a in _SYNTHETIC_ASSISTANTS]
    # A result that names its call (Mistral's tool_call_id) answers a call with that id.
    calls = [{"type": "function", "function": {"name": m.get("name", "tool"), "arguments": {}},
              **({"id": m["tool_call_id"]} if "tool_call_id" in m else {})}
             for m in tool_messages if m["role"] == "tool"]
    if calls:
        turns.append({"role": "assistant", "content": "", "tool_calls": calls})
    return turns


def _text_of(content: Any) -> str:
    """A message's text: its content, or its text parts' last one (each rendered as written)."""
    if isinstance(content, list):
        texts = [p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        return texts[-1] if texts else ""
    return str(content)


class TemplateError(RuntimeError):
    """The chat template refuses the messages, or is not append-only for tool messages (deltas cannot be exact)."""


class ChatRenderer:
    """``chat_template``: rendered instead of the tokenizer's own (a family's training template);
    ``end_of_turn``: the token that closes an assistant turn (a family's), else ``<|im_end|>`` where the
    vocabulary has it, else the tokenizer's eos; ``stop_tokens``: other tokens that end a generation."""

    def __init__(self, tokenizer: Any, tool_schemas: Sequence[dict[str, Any]] = (),
                 chat_template: str | None = None, end_of_turn: str | None = None,
                 stop_tokens: Sequence[str] = (), processor: Any = None) -> None:
        self.tokenizer = tokenizer
        self.processor = processor
        self.image_token_id: int | None = None
        if processor is not None:
            self.image_token_id = tokenizer.convert_tokens_to_ids(processor.image_token)
            self.merge: int = processor.image_processor.merge_size
            self._grids: dict[bytes, tuple[int, int, int]] = {}
        self.tool_schemas = list(tool_schemas)
        self.chat_template = chat_template
        end_of_turn = end_of_turn or ("<|im_end|>" if token_id(tokenizer, "<|im_end|>") is not None else None)
        self.end_of_turn: str | None = end_of_turn
        self.eos_id: int = tokenizer.convert_tokens_to_ids(end_of_turn) if end_of_turn else tokenizer.eos_token_id
        # Every token that ends a generation: the end of turn first, then the family's other ones.
        stops = (token_id(tokenizer, t) for t in stop_tokens)
        self.stop_ids: list[int] = [self.eos_id, *(i for i in stops if i is not None and i != self.eos_id)]
        self.native_tools = self._template_renders_tools()
        self._delta_cache: dict[str, list[int]] = {}
        self._before_cache: dict[str, list[int]] = {}
        self._working_assistant = _SYNTHETIC_ASSISTANTS[0]
        self._prompt_cache: dict[str, list[int]] = {}

    # -- rendering --------------------------------------------------------------------------------

    def _render(self, messages: list[dict[str, Any]], generation_prompt: bool,
                tools: Sequence[dict[str, Any]] | None = None, **options: Any) -> list[int]:
        try:
            out = self.tokenizer.apply_chat_template(
                messages, tools=list(tools) if tools else None, add_generation_prompt=generation_prompt,
                tokenize=True, return_dict=False, chat_template=self.chat_template, **options)
        except Exception as exc:  # the template's own checks (jinja's raise_exception, mistral-common's)
            raise TemplateError(f"the chat template cannot render these messages: {exc}") from exc
        return list(out["input_ids"] if isinstance(out, dict) else out)

    def _template_renders_tools(self) -> bool:
        if not self.tool_schemas:
            return True
        probe = [{"role": "user", "content": "x"}]
        return self._render(probe, True, self.tool_schemas) != self._render(probe, True)

    def prompt_messages(self, messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """The messages to render, with tool instructions in the system prompt when the template
        cannot render ``tools=`` itself."""
        messages = [dict(m) for m in messages]
        if self.native_tools or not self.tool_schemas:
            return messages
        block = FALLBACK_TOOL_PROMPT.format(tools="\n".join(json.dumps(s) for s in self.tool_schemas))
        if messages and messages[0]["role"] == "system":
            messages[0]["content"] = f"{messages[0]['content']}\n\n{block}"
        else:
            messages.insert(0, {"role": "system", "content": block})
        return messages

    def prompt_ids(self, messages: Sequence[dict[str, Any]], grids: Sequence[tuple[int, int, int]] = ()) -> list[int]:
        """The rendered prompt; memoised, since every trajectory of a GRPO group renders the same one.
        ``grids``: the patch grids of its images, in order (:meth:`image_grid`)."""
        key = json.dumps(list(messages), sort_keys=True, default=str)
        if key not in self._prompt_cache:
            if len(self._prompt_cache) > 8192:
                self._prompt_cache.clear()
            tools = self.tool_schemas if self.native_tools else None
            self._prompt_cache[key] = self._render(self.prompt_messages(messages), True, tools)
        return self.expand_images(self._prompt_cache[key], grids)

    def conversation_ids(self, messages: Sequence[dict[str, Any]],
                         grids: Sequence[tuple[int, int, int]] = ()) -> list[int]:
        """The template's rendering of a whole conversation so far (its prompt as
        :meth:`prompt_messages` gives it), ending in the next assistant generation prompt."""
        ids = self._render(list(messages), True, self.tool_schemas if self.native_tools else None)
        return self.expand_images(ids, grids)

    # -- images ---------------------------------------------------------------------------------

    def image_grid(self, png: bytes) -> tuple[int, int, int]:
        """The processor's patch grid (t, h, w) for an image (toolrl.images PNG bytes)."""
        if self.processor is None:
            raise TemplateError("images need a model with a processor (a vision-language model)")
        key = hashlib.sha256(png).digest()
        if key not in self._grids:
            out = self.processor.image_processor(images=[from_png(png)], return_tensors="np")
            if len(self._grids) > 4096:
                self._grids.clear()
            self._grids[key] = tuple(int(v) for v in out["image_grid_thw"][0])  # type: ignore[assignment]
        return self._grids[key]

    def expand_images(self, ids: Sequence[int], grids: Sequence[tuple[int, int, int]]) -> list[int]:
        """``ids`` with each image token the template wrote replaced by its image's run of
        ``t*h*w / merge²`` tokens (``grids`` in order), as the processor expands its text."""
        if self.image_token_id is None or (not grids and self.image_token_id not in ids):
            return list(ids)
        out: list[int] = []
        runs = iter(grids)
        for token in ids:
            if token != self.image_token_id:
                out.append(token)
                continue
            grid = next(runs, None)
            if grid is None:
                raise TemplateError(f"the rendering holds more images than the {len(grids)} given")
            out += [token] * (grid[0] * grid[1] * grid[2] // self.merge**2)
        if next(runs, None) is not None:
            raise TemplateError(f"{len(grids)} images given for {ids.count(self.image_token_id)} in the rendering")
        return out

    def with_image_parts(self, messages: Sequence[dict[str, Any]], placeholder: str) -> list[dict[str, Any]]:
        """``messages`` with each ``placeholder`` in their text made an image part (verl's ``<image>``),
        the layout a processor's chat template renders images from."""
        out = []
        for message in messages:
            content = message.get("content")
            if isinstance(content, str) and placeholder in content:
                pieces = content.split(placeholder)
                parts: list[dict[str, Any]] = [{"type": "text", "text": pieces[0]}] if pieces[0] else []
                for piece in pieces[1:]:
                    parts.append({"type": "image"})
                    parts += [{"type": "text", "text": piece}] if piece else []
                message = {**message, "content": parts}
            out.append(message)
        return out

    def turn_text(self, ids: Sequence[int]) -> str:
        """A generated turn's text, without the end-of-turn token the template adds itself."""
        ids = list(ids)
        return self.decode(ids[:-1] if ids and ids[-1] == self.eos_id else ids)

    def assistant_message(self, ids: Sequence[int], parsed: ParseResult | None = None) -> dict[str, Any]:
        """A generated turn as the conversation holds it: its text (reasoning and calls stay in it, as
        the model wrote them). ``parsed``: the turn's calls with their ids (:meth:`with_call_ids`),
        for renderers whose templates read structured calls instead."""
        return {"role": "assistant", "content": self.turn_text(ids)}

    def with_call_ids(self, calls: list[ToolCall], seed: str) -> list[ToolCall]:
        """The calls with the ids their results must name; ``seed`` makes generated ids unique per
        turn. Only formats whose results name their call (Mistral's) need ids: here they stay as read."""
        return calls

    def tool_message(self, text: str, name: str, images: int = 0, call_id: str | None = None) -> dict[str, Any]:
        """A tool result as the template renders it; ``images``: how many images it shows, before its
        text (an image part each; rendering them needs a processor); ``call_id``: the id of the call
        it answers (None: a parse error's report), for templates that pair results with calls."""
        parts: list[dict[str, Any]] = [{"type": "image"}] * images
        if self.native_tools:
            return {"role": "tool", "name": name, "content": [*parts, {"type": "text", "text": text}] if images else text}
        # Templates without tool support get results as a user turn in the hermes wrapping.
        if images:
            return {"role": "user", "content": [{"type": "text", "text": "<tool_response>\n"}, *parts,
                                                {"type": "text", "text": f"{text}\n</tool_response>"}]}
        return {"role": "user", "content": f"<tool_response>\n{text}\n</tool_response>"}

    def tool_delta(self, tool_messages: list[dict[str, Any]], grids: Sequence[tuple[int, int, int]] = ()) -> list[int]:
        """Tokens that follow a finished assistant turn (ending in the end-of-turn token) when
        ``tool_messages`` (tool results, or a user turn) are added, up to and including the next
        assistant generation prompt. ``grids``: the patch grids of the images they show, in order."""
        key = json.dumps(tool_messages, sort_keys=True, default=str)
        if key not in self._delta_cache:
            delta = self._find_delta(tool_messages)
            if len(self._delta_cache) >= 4096:
                return self.expand_images(delta, grids)
            self._delta_cache[key] = delta
        return self.expand_images(self._delta_cache[key], grids)

    def _find_delta(self, tool_messages: list[dict[str, Any]]) -> list[int]:
        problems = []
        # Try the synthetic turn that worked last time first; its "before" rendering is cached.
        turns = sorted(_synthetic_turns(tool_messages), key=lambda t: t["content"] != self._working_assistant)
        for turn in turns:
            base = [{"role": "user", "content": "q"}, turn]
            try:  # gpt-oss's template raises on tool results that follow no structured tool call
                before_key = json.dumps(turn, sort_keys=True)
                if before_key not in self._before_cache:
                    self._before_cache[before_key] = self._render_closed_turn(base)
                before = self._before_cache[before_key]
                after = self._render(base + tool_messages, True)
            except Exception as exc:
                problems.append(f"{turn['content']!r}: {type(exc).__name__}: {exc}")
                continue
            if after[: len(before)] != before:
                problems.append(f"{turn['content']!r}: not a prefix")
                continue
            delta = self._after_end_of_turn(before, after)
            if delta is None:
                problems.append(f"{turn['content']!r}: the turn does not end with token {self.eos_id}")
                continue
            # Gemma 4 renders tool results only after a structured call: a delta without them is wrong.
            if not all(self._shows(_text_of(m["content"]), self.decode(delta)) for m in tool_messages):
                problems.append(f"{turn['content']!r}: the tool results are not rendered")
                continue
            self._working_assistant = turn["content"]
            return delta
        what = "a user turn" if all(m.get("role") == "user" for m in tool_messages) else "tool messages"
        raise TemplateError(f"the chat template is not append-only for {what} "
                            f"(tried synthetic assistant turns: {'; '.join(problems)})")

    def _shows(self, text: str, rendered: str) -> bool:
        """Whether a rendering holds a message's text (as the template writes it)."""
        return text in rendered

    def _render_closed_turn(self, messages: list[dict[str, Any]]) -> list[int]:
        """A conversation whose last message is a finished assistant turn."""
        return self._render(messages, False)

    def _after_end_of_turn(self, before: list[int], after: list[int]) -> list[int] | None:
        """The delta after a generated turn that ended with the end-of-turn token: what the template
        renders after that token (only a separator may follow it in ``before``). GLM's template writes
        the token (``<|observation|>``) as the start of the tool turn instead of the end of the
        assistant's, so there it is dropped from the delta. None: the turn has no such ending."""
        if self.eos_id in before:
            last_eos = len(before) - 1 - before[::-1].index(self.eos_id)
            tail = before[last_eos + 1:]
            return tail + after[len(before):] if not self.decode(tail).strip() else None
        if after[len(before):len(before) + 1] == [self.eos_id]:
            return after[len(before) + 1:]
        return None

    def text_ids(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    # -- tool responses -------------------------------------------------------------------------

    def truncate(self, text: str, max_tokens: int, mode: Truncation) -> str:
        """Cut a tool response to ``max_tokens`` tokens, keeping the named part and saying so."""
        ids = self.text_ids(text)
        if len(ids) <= max_tokens:
            return text
        note = f"...[{len(ids) - max_tokens} tokens truncated]..."
        return truncated(ids, max_tokens, mode, note, self.decode)


def truncated(pieces: Sequence[Any], keep: int, mode: Truncation, note: str,
              text: Callable[[Any], str]) -> str:
    """``pieces`` (tokens, characters) cut to ``keep`` of them, the part ``mode`` names, ``note`` on a line
    of its own where the cut is; ``text`` writes the kept pieces."""
    if mode == "keep_head":
        return f"{text(pieces[:keep])}\n{note}"
    if mode == "keep_tail":
        return f"{note}\n{text(pieces[len(pieces) - keep:])}"
    half = keep // 2
    return f"{text(pieces[:keep - half])}\n{note}\n{text(pieces[len(pieces) - half:])}"
