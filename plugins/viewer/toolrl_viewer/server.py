"""The HTTP side of ``toolrl view``: the standard library's threading server on 127.0.0.1, serving the
page, plotly.min.js from the plotly package's own data (never a CDN: the page works offline) and a
small JSON API over :mod:`toolrl_viewer.runs`.

    GET /api/runs                                   the runs and their trajectory sources
    GET /api/metrics?run=I&since=S                  metric rows of steps after S (polled: live runs)
    GET /api/traces?run=I&source=STEP&<TraceQuery>  a filtered, sorted page of a step's trajectories (whole:
                                                    a trajectory in pieces is one row)
    GET /api/trajectory?run=I&source=STEP&t=KEY     one trajectory, each of its segments turn by turn
    GET /api/trajectory?run=I&source=STEP&row=K     the trajectory row K is a piece of
    GET /api/compare?a=I&b=J                        two evaluations side by side
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from functools import cache
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib.resources import files
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from pydantic import ValidationError

from toolrl_viewer.runs import Run, compare
from toolrl_viewer.traces import TraceQuery
from toolrl_viewer.turns import Tokenizers, view_trajectory

STATIC = {"/": ("index.html", "text/html; charset=utf-8"),
          "/app.js": ("app.js", "text/javascript; charset=utf-8"),
          "/app.css": ("app.css", "text/css; charset=utf-8")}


@cache
def plotly_js() -> bytes:
    """plotly.min.js as the installed plotly package ships it."""
    import plotly

    return (Path(plotly.__file__).parent / "package_data" / "plotly.min.js").read_bytes()


@cache
def plotly_etag() -> str:
    """plotly.min.js's validator: a browser whose copy has expired asks with it, and a 304 keeps its copy
    and the code it compiled from it (a full answer would have it compiled again)."""
    return '"' + hashlib.sha256(plotly_js()).hexdigest()[:32] + '"'


def _clean(value: Any) -> Any:
    """JSON has no NaN or infinity: they become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


class Viewer:
    """The runs being shown and their tokenizers: the state every request reads."""

    def __init__(self, paths: Sequence[Path]) -> None:
        self.runs = [Run(i, p) for i, p in enumerate(paths)]
        self.tokenizers = Tokenizers()

    def run(self, query: dict[str, str], key: str = "run") -> Run:
        try:
            return self.runs[int(query.get(key, ""))]
        except (ValueError, IndexError):
            raise KeyError(f"no run {query.get(key)!r}") from None

    def answer(self, route: str, query: dict[str, str]) -> Any:
        if route == "/api/runs":
            return [r.describe() for r in self.runs]
        if route == "/api/metrics":
            return self.run(query).metrics(int(query.get("since", 0) or 0))
        if route == "/api/traces":
            run = self.run(query)
            # The tokenizer (seconds to import) loads once the trajectories are asked for, while a row is
            # picked: loading it at start-up would hold the interpreter while the first page is served.
            self.tokenizers.preload(run.path)
            fields = {k: v for k, v in query.items() if k not in ("run", "source") and v != ""}
            return run.traces(query.get("source", "")).page(TraceQuery.model_validate(fields))
        if route == "/api/trajectory":
            run = self.run(query)
            index = run.traces(query.get("source", ""))
            found = index.trajectory(query["t"]) if "t" in query else index.trajectory_of(int(query.get("row", "-1")))
            tokenizer, why_not = self.tokenizers.get(run.path)
            # A trajectory cut into segments (context edits, template forks, fold branches): all of them, in order.
            return view_trajectory(found, index.segments(found), [index.read(r) for r in found.rows],
                                   tokenizer, why_not)
        if route == "/api/compare":
            return compare(self.run(query, "a"), self.run(query, "b"))
        raise KeyError(f"no route {route}")


def handler(viewer: Viewer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            url = urlsplit(self.path)
            if url.path in STATIC:
                name, kind = STATIC[url.path]
                return self._send(files("toolrl_viewer").joinpath("static", name).read_bytes(), kind)
            if url.path == "/plotly.min.js":
                tag, kind = plotly_etag(), "text/javascript; charset=utf-8"
                if self.headers.get("If-None-Match") == tag:
                    return self._send(b"", kind, HTTPStatus.NOT_MODIFIED, etag=tag)
                return self._send(plotly_js(), kind, etag=tag)
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            try:
                body = viewer.answer(url.path, query)
            except (KeyError, ValueError, ValidationError) as exc:
                message = exc.args[0] if isinstance(exc, KeyError) else str(exc).splitlines()[0]
                return self._send(json.dumps({"error": message}).encode(), "application/json",
                                  status=HTTPStatus.NOT_FOUND if isinstance(exc, KeyError) else HTTPStatus.BAD_REQUEST)
            self._send(json.dumps(_clean(body)).encode(), "application/json")

        def _send(self, body: bytes, kind: str, status: HTTPStatus = HTTPStatus.OK, etag: str | None = None) -> None:
            """``body``; with an ``etag``, cached by the browser for an hour, then revalidated."""
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "max-age=3600" if etag else "no-store")
            if etag:
                self.send_header("ETag", etag)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server's name)
            pass  # one line per request would bury the URL the command printed

    return Handler


def serve(paths: Sequence[Path], port: int = 8765, host: str = "127.0.0.1") -> ThreadingHTTPServer:
    """A server for ``paths`` bound to ``host:port`` (port 0: any free one), not yet serving."""
    server = ThreadingHTTPServer((host, port), handler(Viewer(paths)))
    server.daemon_threads = True
    return server
