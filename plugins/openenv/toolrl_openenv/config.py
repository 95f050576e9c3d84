"""The ``openenv`` session's options (``session_options``): where the OpenEnv server is, its capacity,
and the timeouts."""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator


class OpenEnvBlock(BaseModel):
    """Either ``base_url`` (a running server) or ``app``/``app_dir`` (the plugin starts the server on a
    loopback port for the run and stops it afterwards)."""

    model_config = ConfigDict(extra="forbid")

    base_url: str | None = Field(None, description="a running OpenEnv server, e.g. http://127.0.0.1:8000")
    app: str | None = Field(None, description="'module:attr' of the server's ASGI app (create_app(...))")
    app_dir: str | None = Field(None, description="directory to import app from; with an openenv.yaml "
                                                  "and no app, that file's app")
    startup_timeout_s: float = Field(180.0, gt=0, description="a started server must answer /health by then")
    connect_timeout_s: float = Field(30.0, gt=0, description="opening a session's WebSocket")
    message_timeout_s: float = Field(30.0, gt=0, description="each reset/step/list/close round trip")
    max_sessions: int | None = Field(None, gt=0, description="sessions open at once (the server's capacity, "
                                     "create_app's max_concurrent_envs); default: what the server says "
                                     "when it first refuses one. Trajectories beyond it wait")
    queue_timeout_s: float = Field(3600.0, gt=0, description="how long a trajectory waits for a session")
    ws_compression: bool = Field(False, description="offer permessage-deflate on each episode's WebSocket: "
                                 "about 60 KiB of zlib state per open session; worth it only for large "
                                 "observations over a slow link")
    action_tool: str = Field("step", pattern=r"^[A-Za-z0-9_-]{1,64}$",
                             description="tool name for a non-MCP environment's action")

    @model_validator(mode="after")
    def _one_source(self) -> OpenEnvBlock:
        if (self.base_url is None) == (self.app is None and self.app_dir is None):
            raise ValueError("give either base_url (a running server) or app/app_dir (a server to start)")
        return self


class ServerConfigError(ValueError):
    """The options name a server that cannot be started or reached."""


def app_to_start(block: OpenEnvBlock, base: Path | None) -> tuple[str | None, Path | None]:
    """The app to start (None with base_url) and the directory to start it in."""
    if block.base_url is not None:
        return None, None
    app_dir = Path(block.app_dir).expanduser() if block.app_dir else None
    if app_dir is not None and not app_dir.is_absolute() and base is not None:
        app_dir = base / app_dir
    if app_dir is not None and not app_dir.is_dir():
        raise ServerConfigError(f"openenv.app_dir: {app_dir} is not a directory")
    app = block.app or _manifest_app(app_dir)
    if ":" not in app:
        raise ServerConfigError(f"openenv.app: expected 'module:attr', got {app!r}")
    return app, app_dir


def _manifest_app(app_dir: Path | None) -> str:
    manifest = (app_dir or Path(".")) / "openenv.yaml"
    try:
        app = yaml.safe_load(manifest.read_text()).get("app")
    except (OSError, yaml.YAMLError, AttributeError) as exc:
        raise ServerConfigError(f"openenv.app is not set and {manifest} gives none: {exc}") from None
    if not isinstance(app, str):
        raise ServerConfigError(f"openenv.app is not set and {manifest} has no 'app: module:attr'")
    return app
