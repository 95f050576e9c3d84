"""The command line's one error path: what a user hands in (config, data, tool configs, part names)
that is wrong becomes one line on stderr and exit code 2, never a traceback."""

from __future__ import annotations

from typing import Any

import click


class UsageFailure(click.ClickException):
    """A user error: one line on stderr, exit 2, no traceback."""

    exit_code = 2

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {' '.join(self.message.split())}", err=True)  # always one line


def error_text(exc: Exception) -> str:
    """An exception's text; KeyError subclasses quote theirs, so drop a pair of enclosing quotes."""
    text = str(exc)
    return text[1:-1] if len(text) > 1 and text[0] == text[-1] and text[0] in "'\"" else text


def user_errors(fn: Any, *args: Any, tools_origin: str = "", **kwargs: Any) -> Any:
    """The one error path for what a user hands in: config, data and tool-config problems and
    unknown part names become one line on stderr and exit 2. Tool-config errors that do not name
    their file get ``tools_origin`` in front."""
    from toolrl.config import ConfigError
    from toolrl.model_sources import ModelUnavailable
    from toolrl.tools import ToolConfigError

    try:
        return fn(*args, **kwargs)
    except ToolConfigError as exc:
        message = error_text(exc)
        if tools_origin and tools_origin.partition(":")[0] not in message:
            message = f"{tools_origin}: {message}"
        raise UsageFailure(message) from None
    except (ConfigError, ModelUnavailable) as exc:
        raise UsageFailure(error_text(exc)) from None


def json_option(value: str | None, what: str) -> Any:
    """An option's JSON, decoded within bounds (20,000 nested brackets are one error line, not a RecursionError)."""
    from toolrl.parsers.arguments import decode_json

    if value is None:
        return None
    try:
        return decode_json(value, what)
    except ValueError as exc:
        raise UsageFailure(str(exc)) from None


def mapping_option(value: str | None, what: str) -> dict[str, Any]:
    """An option's JSON object ({} when the option is not given)."""
    parsed = json_option(value, what)
    if parsed is None:
        return {}
    if not isinstance(parsed, dict):
        raise UsageFailure(f"{what} must be a JSON object")
    return parsed
