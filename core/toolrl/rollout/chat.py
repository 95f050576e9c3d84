"""Chat-template rendering as token deltas — where the loss mask's correctness lives.

A trajectory's tokens are never re-tokenized: the prompt is rendered once, the model's tokens are
appended as generated, and each round of tool results is appended as the *delta* the chat template
adds for those messages. The delta is found by rendering a fixed synthetic conversation with and
without the new messages and asserting the shorter rendering is a token prefix of the longer
(append-only). The template text that follows the assistant's end-of-turn token (Qwen's ``\\n``
after ``<|im_end|>``), which the model never generates, is prepended to the delta, so the training
sequence is exactly what the template would render (verl's mismatch, fixed there in #6779).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Literal

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


class TemplateError(RuntimeError):
    """The chat template is not append-only for tool messages, so deltas cannot be exact."""


class ChatRenderer:
    def __init__(self, tokenizer: Any, tool_schemas: Sequence[dict[str, Any]] = ()) -> None:
        self.tokenizer = tokenizer
        self.tool_schemas = list(tool_schemas)
        self.eos_id: int = tokenizer.convert_tokens_to_ids("<|im_end|>") if "<|im_end|>" in tokenizer.get_vocab() \
            else tokenizer.eos_token_id
        self.native_tools = self._template_renders_tools()
        self._delta_cache: dict[str, list[int]] = {}
        self._before_cache: dict[str, list[int]] = {}
        self._working_assistant = _SYNTHETIC_ASSISTANTS[0]
        self._prompt_cache: dict[str, list[int]] = {}

    # -- rendering --------------------------------------------------------------------------------

    def _render(self, messages: list[dict[str, Any]], generation_prompt: bool,
                tools: Sequence[dict[str, Any]] | None = None) -> list[int]:
        out = self.tokenizer.apply_chat_template(
            messages, tools=list(tools) if tools else None, add_generation_prompt=generation_prompt,
            tokenize=True, return_dict=False,
        )
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

    def prompt_ids(self, messages: Sequence[dict[str, Any]]) -> list[int]:
        """The rendered prompt; memoised, since every trajectory of a GRPO group renders the same one."""
        key = json.dumps(list(messages), sort_keys=True, default=str)
        if key not in self._prompt_cache:
            if len(self._prompt_cache) > 8192:
                self._prompt_cache.clear()
            tools = self.tool_schemas if self.native_tools else None
            self._prompt_cache[key] = self._render(self.prompt_messages(messages), True, tools)
        return list(self._prompt_cache[key])

    def tool_message(self, text: str, name: str) -> dict[str, Any]:
        if self.native_tools:
            return {"role": "tool", "name": name, "content": text}
        # Templates without tool support get results as a user turn in the hermes wrapping.
        return {"role": "user", "content": f"<tool_response>\n{text}\n</tool_response>"}

    def tool_delta(self, tool_messages: list[dict[str, Any]]) -> list[int]:
        """Tokens that follow a finished assistant turn (ending in the end-of-turn token) when
        ``tool_messages`` (tool results, or a user turn) are added, up to and including the next
        assistant generation prompt."""
        key = json.dumps(tool_messages, sort_keys=True, default=str)
        if key in self._delta_cache:
            return self._delta_cache[key]
        problems = []
        # Try the synthetic turn that worked last time first; its "before" rendering is cached.
        for assistant in sorted(_SYNTHETIC_ASSISTANTS, key=lambda a: a != self._working_assistant):
            base = [{"role": "user", "content": "q"}, {"role": "assistant", "content": assistant}]
            if assistant not in self._before_cache:
                self._before_cache[assistant] = self._render(base, False)
            before = self._before_cache[assistant]
            after = self._render(base + tool_messages, True)
            if after[: len(before)] != before:
                problems.append(assistant)
                continue
            if self.eos_id not in before:
                raise TemplateError(f"the chat template does not end assistant turns with token {self.eos_id}")
            self._working_assistant = assistant
            last_eos = len(before) - 1 - before[::-1].index(self.eos_id)
            delta = before[last_eos + 1:] + after[len(before):]
            if len(self._delta_cache) < 4096:
                self._delta_cache[key] = delta
            return delta
        raise TemplateError("the chat template is not append-only for tool messages "
                            f"(tried synthetic assistant turns {problems!r})")

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
        dropped = len(ids) - max_tokens
        note = f"...[{dropped} tokens truncated]..."
        if mode == "keep_head":
            return self.decode(ids[:max_tokens]) + "\n" + note
        if mode == "keep_tail":
            return note + "\n" + self.decode(ids[-max_tokens:])
        head = max_tokens - max_tokens // 2
        return self.decode(ids[:head]) + "\n" + note + "\n" + self.decode(ids[len(ids) - max_tokens // 2:])
