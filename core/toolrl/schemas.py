"""Pydantic models at toolrl's boundaries: tool schemas, calls, responses, messages, samples."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from toolrl import InfrastructureError as InfrastructureError  # re-exported beside ToolResult


class FunctionSchema(BaseModel):
    """An OpenAI function declaration. ``parameters`` is a full JSON Schema (nested objects, arrays,
    enums, ``$defs``...) checked against the JSON Schema meta-schema, not a flattened subset."""

    model_config = ConfigDict(extra="allow")

    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]{1,128}$")
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    strict: bool | None = None

    @field_validator("parameters", mode="before")
    @classmethod
    def _drop_nulls(cls, value: Any) -> Any:
        """verl dumps unset schema keywords as null (``"enum": null``); JSON Schema has no null
        keywords, so they are dropped rather than rejected."""

        def clean(node: Any) -> Any:
            if isinstance(node, dict):
                return {k: clean(v) for k, v in node.items() if v is not None}
            if isinstance(node, list):
                return [clean(v) for v in node]
            return node

        return clean(value)

    @field_validator("parameters")
    @classmethod
    def _valid_json_schema(cls, value: dict[str, Any]) -> dict[str, Any]:
        from jsonschema import Draft202012Validator  # lazy: about 1 s to import, and list-plugins needs none
        from jsonschema.exceptions import SchemaError

        try:
            Draft202012Validator.check_schema(value)
        except SchemaError as exc:
            path = "/".join(str(p) for p in exc.absolute_path) or "(root)"
            raise ValueError(f"parameters is not a valid JSON Schema at {path}: {exc.message}") from None
        if value.get("type", "object") != "object":
            raise ValueError("parameters must describe an object (type: object)")
        return value


class ToolSchema(BaseModel):
    """``{"type": "function", "function": {...}}`` as passed to chat templates' ``tools=``."""

    type: Literal["function"] = "function"
    function: FunctionSchema

    @property
    def name(self) -> str:
        return self.function.name


class ToolCall(BaseModel):
    """One call parsed from a model response."""

    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    id: str | None = None


class ParseError(BaseModel):
    """A malformed call. The rollout sends ``message`` back to the model as a tool message."""

    message: str
    raw: str = ""


class ParseResult(BaseModel):
    content: str = ""
    calls: list[ToolCall] = Field(default_factory=list)
    errors: list[ParseError] = Field(default_factory=list)


class ToolResponse(BaseModel):
    """What a tool returns to the model: text, optionally images (base64 strings, data URLs or PIL
    images). ``is_error`` marks failures so traces and metrics can count them."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    text: str = ""
    images: list[Any] = Field(default_factory=list)
    is_error: bool = False

    @classmethod
    def error(cls, text: str) -> ToolResponse:
        return cls(text=text, is_error=True)


class ToolResult(BaseModel):
    """The outcome of one call as recorded in a trajectory. ``infra_error``: the tool raised
    :class:`InfrastructureError` (the trajectory ends there, untrained)."""

    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    response: ToolResponse
    step_reward: float = 0.0
    metrics: dict[str, Any] = Field(default_factory=dict)
    status: Literal["ok", "error", "invalid_arguments", "timeout", "unknown_tool", "infra_error"] = "ok"
    latency_s: float = 0.0
    # Seconds the tool's code held the event loop (steps of toolrl.tools.guard.LOOP_BLOCK_S or more): a
    # blocking call inside an async execute. Nonzero values deserve a metric and a fix.
    loop_blocked_s: float = 0.0
    turn: int = 0  # the model turn (1-based) whose generation made the call; 0: not made by a turn


class Message(BaseModel):
    """A chat message in the OpenAI/Hugging Face format chat templates consume."""

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = ""
    tool_calls: list[dict[str, Any]] | None = None
    name: str | None = None
    tool_call_id: str | None = None

    def to_template(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


class ToolKwargs(BaseModel):
    """Per-sample arguments for each lifecycle stage of one tool (verl's ``tools_kwargs[name]``)."""

    model_config = ConfigDict(extra="forbid")

    create_kwargs: dict[str, Any] = Field(default_factory=dict)
    execute_kwargs: dict[str, Any] = Field(default_factory=dict)
    calc_reward_kwargs: dict[str, Any] = Field(default_factory=dict)
    release_kwargs: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _drop_nulls(cls, data: Any) -> Any:
        # Parquet structs fill absent stages with nulls.
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if v is not None}
        return data


class Sample(BaseModel):
    """One dataset row in verl's format, normalised."""

    model_config = ConfigDict(extra="allow", ser_json_bytes="base64", val_json_bytes="base64")

    prompt: list[Message]
    ground_truth: Any = None
    data_source: str = ""
    env: str | None = None  # the environment whose tools, rewards, parser and turn limit it gets
    tools_kwargs: dict[str, ToolKwargs] = Field(default_factory=dict)
    extra_info: dict[str, Any] = Field(default_factory=dict)
    index: int | None = None
    # Its difficulty level: an index into its environment's ``levels`` (easiest first); None: no level.
    level: int | None = Field(None, ge=0)
    # PNG images (toolrl.images) in the order the prompt refers to them: ``<image>`` in a message's
    # text (verl's layout) or an image part of its content.
    images: list[bytes] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _from_verl(cls, data: Any) -> Any:
        """Accept verl rows: ``reward_model.ground_truth``, ``extra_info.tools_kwargs``, a plain
        string prompt, ``extra_info.index``, the environment it belongs to under ``extra_info.env`` and its
        difficulty level under ``extra_info.level``."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if isinstance(data.get("prompt"), str):
            data["prompt"] = [{"role": "user", "content": data["prompt"]}]
        reward_model = data.pop("reward_model", None)
        if isinstance(reward_model, dict) and "ground_truth" not in data:
            data["ground_truth"] = reward_model.get("ground_truth")
        extra = data.get("extra_info") or {}
        if isinstance(extra, dict):
            data.setdefault("tools_kwargs", extra.get("tools_kwargs") or {})
            for key in ("env", "index", "level"):
                if data.get(key) is None and extra.get(key) is not None:
                    data[key] = extra[key]
            data["extra_info"] = extra
        return data
