"""The ``judge`` reward: a model behind an OpenAI-compatible endpoint grades each finished trajectory.

A rubric prompt (a template over the question, the final answer, the ground truth and the whole
conversation) goes to ``/chat/completions``; the verdict parser turns the answer into a score in
[0, 1]. Connection failures, timeouts, error statuses and verdicts the parser cannot read are retried;
when every try fails the judgement raises :class:`JudgeError`, which the rollout loop records as the
term's error (``reward_errors.judge``) — never a crash, never a 0 that passes for a grade.

The reward is async: judgements run concurrently with the rollout loop (at most ``concurrency`` at
once per process), so a slow judge delays only the trajectories it grades. :meth:`JudgeReward.judge`
grades any chat messages, for environments that judge other things (natural-language assertions).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import string
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

PLACEHOLDERS = ("question", "response", "ground_truth", "conversation", "full_response")

DEFAULT_PROMPT = """You are grading an assistant's answer to a question.

Question:
{question}

Reference answer:
{ground_truth}

Assistant's final answer:
{response}

Does the assistant's final answer agree with the reference answer? Reason briefly, then give your \
grade as <score>1</score> (correct) or <score>0</score> (incorrect)."""


class VerdictError(ValueError):
    """The judge's answer holds no verdict the parser can read."""


class JudgeError(RuntimeError):
    """No verdict after every try; the message is one line naming the judge and the last failure."""


class _Verdict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TagVerdict(_Verdict):
    """The number in the last ``<tag>…</tag>``, in [min, max], scaled to [0, 1]."""

    type: Literal["tag"] = "tag"
    tag: str = Field("score", pattern=r"^[\w.-]+$")
    min: float = 0.0
    max: float = 1.0

    @model_validator(mode="after")
    def _range(self) -> TagVerdict:
        if not self.max > self.min:
            raise ValueError("max must be greater than min")
        return self

    def parse(self, text: str) -> float:
        found = re.findall(rf"<{re.escape(self.tag)}>\s*(.*?)\s*</{re.escape(self.tag)}>", text, re.DOTALL)
        if not found:
            raise VerdictError(f"no <{self.tag}>…</{self.tag}>")
        try:
            value = float(found[-1])
        except ValueError:
            raise VerdictError(f"<{self.tag}> holds {found[-1][:40]!r}, not a number") from None
        if not (math.isfinite(value) and self.min <= value <= self.max):
            raise VerdictError(f"<{self.tag}> holds {value:g}, outside [{self.min:g}, {self.max:g}]")
        return (value - self.min) / (self.max - self.min)


class YesNoVerdict(_Verdict):
    """1 when the last yes-or-no word (whole word, any case) is a ``yes`` word, 0 when a ``no`` word."""

    type: Literal["yes_no"] = "yes_no"
    yes: list[str] = Field(default_factory=lambda: ["yes"], min_length=1)
    no: list[str] = Field(default_factory=lambda: ["no"], min_length=1)

    def parse(self, text: str) -> float:
        words = {w.lower(): 1.0 for w in self.yes} | {w.lower(): 0.0 for w in self.no}
        pattern = r"\b(" + "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True)) + r")\b"
        found = re.findall(pattern, text, re.IGNORECASE)
        if not found:
            raise VerdictError(f"none of {', '.join(words)}")
        return words[found[-1].lower()]


class RegexVerdict(_Verdict):
    """The last match of ``pattern``: its group ``score`` (else its first group), a number, or a label
    looked up in ``values``."""

    type: Literal["regex"] = "regex"
    pattern: str
    values: dict[str, float] | None = None

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, pattern: str) -> str:
        try:
            compiled = re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"not a regular expression: {exc}") from None
        if compiled.groups == 0:
            raise ValueError("needs a group: the part of the match that is the verdict")
        return pattern

    def parse(self, text: str) -> float:
        matches = list(re.finditer(self.pattern, text))
        if not matches:
            raise VerdictError(f"no match for {self.pattern!r}")
        last = matches[-1]
        label = (last.group("score") if "score" in last.re.groupindex else last.group(1)) or ""
        label = label.strip()
        if self.values is not None:
            if label not in self.values:
                raise VerdictError(f"{label[:40]!r} is none of {', '.join(self.values)}")
            return self.values[label]
        try:
            value = float(label)
        except ValueError:
            raise VerdictError(f"{label[:40]!r} is not a number") from None
        if not math.isfinite(value):
            raise VerdictError(f"{label!r} is not a finite number")
        return value


Verdict = Annotated[TagVerdict | YesNoVerdict | RegexVerdict, Field(discriminator="type")]


class JudgeOptions(BaseModel):
    """``options`` of a ``judge`` reward term."""

    model_config = ConfigDict(extra="forbid")

    base_url: str = Field(description="The judge's API root, e.g. http://127.0.0.1:8001/v1.")
    model: str = Field(description="The judge's served model name.")
    api_key_env: str = Field("OPENAI_API_KEY", description="Environment variable holding the key (may be unset).")
    prompt: str = Field(DEFAULT_PROMPT, description="The rubric: a str.format template over "
                                                    + ", ".join(PLACEHOLDERS) + " ({{ }} for a literal brace).")
    system: str | None = Field(None, description="A system message before the rubric.")
    temperature: float = Field(0.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    max_tokens: int = Field(512, gt=0)
    seed: int | None = None
    extra_body: dict[str, Any] = Field(default_factory=dict, description="Extra request fields (server-specific).")
    verdict: Verdict = Field(default_factory=TagVerdict)
    retries: int = Field(2, ge=0, description="Tries after the first, on any failure (garbage verdicts too).")
    retry_backoff_s: float = Field(0.5, ge=0, description="Wait before the first retry; doubles per retry.")
    timeout_s: float = Field(60.0, gt=0, description="Per try, the whole request.")
    concurrency: int = Field(16, ge=1, description="Judgements in flight at once (per process).")

    @field_validator("prompt")
    @classmethod
    def _placeholders(cls, prompt: str) -> str:
        try:
            fields = {f for _, f, _, _ in string.Formatter().parse(prompt) if f is not None}
        except ValueError as exc:
            raise ValueError(f"not a str.format template: {exc} (write {{{{ }}}} for a literal brace)") from None
        unknown = sorted(f for f in fields if f not in PLACEHOLDERS)
        if unknown:
            raise ValueError(f"unknown placeholder {{{unknown[0]}}} (known: {', '.join(PLACEHOLDERS)})")
        return prompt


class JudgeReward:
    """``reward: {functions: [{name: judge, options: {base_url, model, ...}}]}``: a model's grade."""

    name = "judge"
    Options = JudgeOptions

    def __init__(self, options: JudgeOptions) -> None:
        self.options = options
        self._state: tuple[Any, Any, asyncio.Semaphore] | None = None  # (loop, client, limit)

    @classmethod
    def build(cls, options: JudgeOptions, context: Any) -> JudgeReward:
        """The build contract (toolrl.plugins.parts): options checked against :class:`JudgeOptions`."""
        return cls(options)

    async def __call__(self, response: str, ground_truth: Any, **info: Any) -> float:
        fields = render_fields(response, ground_truth, info)
        messages = [{"role": "system", "content": self.options.system}] if self.options.system else []
        messages.append({"role": "user", "content": self.options.prompt.format_map(fields)})
        return await self.judge(messages)

    async def judge(self, messages: list[dict[str, Any]]) -> float:
        """The verdict on ``messages`` (chat messages for the judge): a float, or :class:`JudgeError`."""
        import openai

        opts = self.options
        client, limit = self._connection()
        request = {"model": opts.model, "messages": messages, "temperature": opts.temperature, "top_p": opts.top_p,
                   "max_tokens": opts.max_tokens, **({"seed": opts.seed} if opts.seed is not None else {})}
        last = ""
        async with limit:
            for attempt in range(opts.retries + 1):
                if attempt:
                    await asyncio.sleep(opts.retry_backoff_s * 2 ** (attempt - 1))
                try:
                    async with asyncio.timeout(opts.timeout_s):  # not wait_for: on 3.11 it can drop a cancellation
                        answer = await client.chat.completions.create(**request, extra_body=opts.extra_body or None)
                    return opts.verdict.parse(_verdict_text(answer))
                except VerdictError as exc:
                    last = f"unreadable verdict ({exc})"
                except ValueError as exc:  # a body that is not JSON
                    last = f"malformed answer ({_one_line(exc)})"
                except asyncio.TimeoutError:
                    last = f"timed out after {opts.timeout_s:g} s"
                except openai.APIStatusError as exc:
                    last = f"answered {exc.status_code}"
                except openai.APIError as exc:  # connection failures; malformed responses
                    last = _one_line(exc.__cause__ or exc)
        raise JudgeError(f"judge {opts.model} at {opts.base_url}: no verdict after {opts.retries + 1} "
                         f"tr{'y' if opts.retries == 0 else 'ies'}; last: {last}")

    def _connection(self) -> tuple[Any, asyncio.Semaphore]:
        # A client and a limit belong to one event loop; a reward used from another loop (recorded
        # rows are scored on their own) gets its own.
        import openai

        loop = asyncio.get_running_loop()
        if self._state is None or self._state[0] is not loop:
            opts = self.options
            client = openai.AsyncOpenAI(base_url=opts.base_url.rstrip("/"), max_retries=0, timeout=opts.timeout_s,
                                        api_key=os.environ.get(opts.api_key_env) or "EMPTY")
            self._state = (loop, client, asyncio.Semaphore(opts.concurrency))
        return self._state[1], self._state[2]


def render_fields(response: str, ground_truth: Any, info: dict[str, Any]) -> dict[str, str]:
    """What the rubric's placeholders stand for, as text."""
    sample = info.get("sample")
    prompt = list(sample.prompt) if sample is not None else []
    users = [m for m in prompt if m.role == "user"]
    lines = [f"{m.role}: {_content(m.content)}" for m in prompt]
    full = info.get("full_response", response)
    lines.append(f"assistant: {full}")
    lines += [f"tool call {r.name}({json.dumps(r.arguments, ensure_ascii=False)}) -> {r.response.text}"
              for r in info.get("tool_results", ())]
    return {"question": _content(users[-1].content) if users else "", "response": response,
            "ground_truth": ground_truth if isinstance(ground_truth, str) else json.dumps(ground_truth, default=str),
            "conversation": "\n".join(lines), "full_response": full}


def _content(content: Any) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))


def _verdict_text(answer: Any) -> str:
    """The judge's answer without its reasoning block (a verdict format quoted there is not the verdict)."""
    try:
        text = answer.choices[0].message.content or ""
    except (AttributeError, IndexError, TypeError):
        raise VerdictError("the answer is not a chat completion with a message") from None
    if not isinstance(text, str):
        raise VerdictError("the message's content is not text")
    return text.rsplit("</think>", 1)[-1]


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__
