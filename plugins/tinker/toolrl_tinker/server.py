"""The HTTP side of ``toolrl tinker serve``: the routes under ``/api/v1/`` the official ``tinker`` SDK
calls, each checking the ``X-API-Key`` and handing the body (parsed with the SDK's own request types)
to :class:`toolrl_tinker.service.Service`; ``GET /metrics`` (:mod:`toolrl_tinker.metrics`) needs no key.

A request refused at once is answered 400 (401 without a key this server holds, 404 for an unknown id, 410
for a heartbeat of an ended session, 413 for a body over ``--max-request-bytes``, 429 with ``Retry-After``
over a key's quota for now) with ``{"error", "category"}``, which the SDK raises as ``BadRequestError`` and
the like (429: sends again); a request that fails while it runs fails its future (``RequestFailedError``).
"""

from __future__ import annotations

import asyncio
import datetime
import functools
import hashlib
import hmac
import json
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import uvicorn
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from tinker import types as t

from toolrl_tinker import wire
from toolrl_tinker.futures import REQUEST_KIND
from toolrl_tinker.limits import Limits
from toolrl_tinker.quotas import RETRY_AFTER_S, QuotaExceeded
from toolrl_tinker.requests import UserError
from toolrl_tinker.service import Service, owner_of
from toolrl_tinker.sessions import SessionGone
from toolrl_tinker.trainer import Ranks

log = logging.getLogger(__name__)
API = "/api/v1"
CHECKPOINT = f"{API}/training_runs/{{run_id}}/checkpoints/{{kind}}/{{name}}"
# How long uvicorn waits for open requests (a long poll waits 40 s) when the server is stopped.
SHUTDOWN_GRACE_S = 5


class TooLarge(Exception):
    """A request body over ``--max-request-bytes``: HTTP 413."""


def _iso(t: float | None) -> str | None:
    return None if t is None else datetime.datetime.fromtimestamp(t, datetime.UTC).isoformat()


def _error(status: int, message: str, category: str = "user", headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message, "detail": message, "category": category}, status_code=status,
                        headers=headers)


def build_app(service: Service, api_keys: list[str]) -> Starlette:
    """The app; ``api_keys``: the keys clients may send (each its own owner of models and futures)."""
    owners = {key: owner_of(key) for key in api_keys}

    def endpoint(handler: Callable[[Request, str], Awaitable[Any]], auth: bool = True) -> Callable[..., Any]:
        async def run(request: Request) -> Response:
            response = await answer(request)
            service.metrics.count("tinker_http_requests_total", route=handler.__name__, code=str(response.status_code))
            return response

        async def answer(request: Request) -> Response:
            owner = owners.get(request.headers.get("x-api-key", ""))
            if auth and owner is None:
                return _error(401, "an API key this server holds is required (X-API-Key, the SDK's TINKER_API_KEY)")
            REQUEST_KIND.set(handler.__name__)  # the futures this request makes are of its kind
            try:
                result = await handler(request, owner or "")
            except QuotaExceeded as exc:
                return _error(429, str(exc), headers={"Retry-After": str(max(1, round(RETRY_AFTER_S))),
                                                      "Retry-After-Ms": str(int(RETRY_AFTER_S * 1000))})
            except SessionGone as exc:
                return _error(410, str(exc))
            except TooLarge as exc:
                return _error(413, str(exc))
            except ClientDisconnect:  # the client went away mid-request: nothing was made
                return Response(status_code=499)
            except UserError as exc:
                return _error(400, str(exc))
            except KeyError as exc:
                return _error(404, f"unknown id {exc.args[0]!r}")
            except ValueError as exc:  # the SDK's request types refusing a body
                return _error(400, str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            return result if isinstance(result, Response) else JSONResponse(result)
        return run

    app = Starlette(routes=[*session_routes(service, endpoint), *model_routes(service, endpoint),
                            *rest_routes(service, endpoint), *download_routes(service, endpoint)])
    app.state.service = service  # its limits bound each body (_read)
    return app


async def _read(request: Request, limit: int | None = None) -> bytes:
    """The body, refused (:class:`TooLarge`) as soon as it passes ``limit`` bytes (default: the server's
    ``--max-request-bytes``)."""
    limit = limit or request.app.state.service.limits.max_request_bytes
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise TooLarge(f"the request body holds {declared} bytes, over this server's limit of {limit} "
                       "(tinker serve --max-request-bytes)")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise TooLarge(f"the request body passes this server's limit of {limit} bytes (tinker serve "
                           "--max-request-bytes)")
        chunks.append(chunk)
    return b"".join(chunks)


async def _object(request: Request, limit: int = 1 << 16) -> dict[str, Any]:
    """A small JSON object body (the rest client's)."""
    data = json.loads(await _read(request, limit) or b"{}")
    if not isinstance(data, dict):
        raise UserError(f"the body is a JSON {type(data).__name__}, not an object")
    return data


async def _body(request: Request, model: Any, refused: Callable[[Any], None] | None = None) -> Any:
    """The JSON body as one of the SDK's request types; one it refuses is the
    client's error, naming the first field it refused (the SDK sends a NaN or infinity as null), after
    ``refused`` had the body (a training client's request takes its turn all the same)."""
    data = json.loads(await _read(request) or b"{}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        if refused is not None:
            refused(data)
        first = exc.errors()[0]
        given = json.dumps(first.get("input"), default=str)[:80]
        raise UserError(f"{model.__name__}: {'.'.join(map(str, first['loc'])) or 'body'}: {first['msg']} "
                        f"(given {given})") from None


def _typed(endpoint: Callable[..., Any], path: str, model: Any, answer: Callable[[str, Any], Any],
           refused: Callable[[str, Any], None] | None = None, kind: str | None = None) -> Route:
    """POST ``path``: its body as ``model`` (:func:`_body`), answered by ``answer(owner, body)``; ``refused(owner,
    data)`` gets a body the type refuses. ``kind`` (default: the path) names the route in the metrics."""
    async def handler(request: Request, owner: str) -> Any:
        return answer(owner, await _body(request, model, refused and functools.partial(refused, owner)))

    handler.__name__ = kind or path
    return Route(f"{API}/{path}", endpoint(handler), methods=["POST"])


def session_routes(service: Service, endpoint: Callable[..., Any]) -> list[Route]:
    """Health, client config, capabilities, sessions, and the futures' retrieval."""
    async def healthz(request: Request, owner: str) -> Any:
        return {"status": "ok"}

    async def client_config(request: Request, owner: str) -> Any:
        # A forward_backward's chunks: the SDK's estimate is at least 4 bytes a token, so no chunk of
        # several datums passes --max-batch-tokens.
        return {"proto_compress_fwdbwd": True, "parallel_fwdbwd_chunks": True, "pjwt_auth_enabled": False,
                "use_pyqwest_transport": False, "fwdbwd_max_chunk_bytes_count": 4 * service.limits.max_batch_tokens}

    async def metrics(request: Request, owner: str) -> Any:
        return PlainTextResponse(await service.metrics_text(), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def capabilities(request: Request, owner: str) -> Any:
        return {"supported_models": [{"model_name": name, "trainable": True, "sampleable": True,
                                      "max_context_length": base.trainer.context}
                                     for name, base in service.bases.items()]}

    async def heartbeat(request: Request, owner: str) -> Any:
        service.sessions.heartbeat(owner, (await _body(request, t.SessionHeartbeatRequest)).session_id)
        return {"type": "session_heartbeat"}

    async def telemetry(request: Request, owner: str) -> Any:
        return {"status": "accepted"}

    async def nothing(request: Request, owner: str) -> Any:
        return {}

    async def finish(request: Request, owner: str) -> Any:
        await service.finish_session(owner, request.path_params["session_id"])
        return {}

    async def retrieve(request: Request, owner: str) -> Any:
        req = await _body(request, t.FutureRetrieveRequest)
        fut = await service.futures.wait(req.request_id, owner)
        if fut is None:
            return {"type": "try_again", "request_id": req.request_id, "queue_state": "active"}
        if fut.error is not None:
            return {"error": fut.error, "category": fut.category}
        return Response(fut.body, media_type=fut.content_type)

    return [
        Route(f"{API}/healthz", endpoint(healthz, auth=False), methods=["GET"]),
        Route("/metrics", endpoint(metrics, auth=False), methods=["GET"]),
        Route(f"{API}/client/config", endpoint(client_config), methods=["POST"]),
        Route(f"{API}/client/dynamic_config", endpoint(nothing), methods=["POST"]),
        Route(f"{API}/get_server_capabilities", endpoint(capabilities), methods=["GET"]),
        _typed(endpoint, "create_session", t.CreateSessionRequest,
               lambda owner, _: {"type": "create_session", "session_id": service.sessions.create(owner)}),
        Route(f"{API}/session_heartbeat", endpoint(heartbeat), methods=["POST"]),
        Route(f"{API}/telemetry", endpoint(telemetry), methods=["POST"]),
        Route(f"{API}/sessions/{{session_id}}/finish", endpoint(finish), methods=["POST"]),
        Route(f"{API}/cancel_future", endpoint(nothing), methods=["POST"]),
        Route(f"{API}/retrieve_future", endpoint(retrieve), methods=["POST"]),
    ]


def model_routes(service: Service, endpoint: Callable[..., Any]) -> list[Route]:
    """Training clients, their weights, and sampling; a training client's requests take their turn in its
    ``seq_id`` order even when their body is refused."""
    async def forward_backward(request: Request, owner: str) -> Any:
        req = wire.forward_backward_request(await _read(request), request.headers.get("content-encoding"),
                                            service.limits.max_request_bytes, functools.partial(turn, owner))
        return service.training.forward_backward(owner, req)

    async def get_sampler(request: Request, owner: str) -> Any:
        found = service.sampling.sampler(owner, request.path_params["sampler_id"])
        return {"sampler_id": request.path_params["sampler_id"], "base_model": found.base, "model_path": found.path}

    training, sampling, turn = service.training, service.sampling, service.runs.skip_turn
    return [
        _typed(endpoint, "create_model", t.CreateModelRequest, training.create_model),
        _typed(endpoint, "get_info", t.GetInfoRequest, training.get_info),
        Route(f"{API}/forward_backward", endpoint(forward_backward), methods=["POST"]),
        _typed(endpoint, "optim_step", t.OptimStepRequest, training.optim_step, turn),
        _typed(endpoint, "save_weights", t.SaveWeightsRequest, training.save_weights, turn),
        _typed(endpoint, "load_weights", t.LoadWeightsRequest, training.load_weights, turn),
        _typed(endpoint, "save_weights_for_sampler", t.SaveWeightsForSamplerRequest, sampling.save_for_sampler, turn,
               kind="save_for_sampler"),
        _typed(endpoint, "save_weights_external", t.SaveWeightsExternalRequest, training.save_external, turn,
               kind="save_external"),
        _typed(endpoint, "create_sampling_session", t.CreateSamplingSessionRequest, sampling.create_sampling_session),
        Route(f"{API}/samplers/{{sampler_id}}", endpoint(get_sampler), methods=["GET"]),
        _typed(endpoint, "asample", t.SampleRequest, sampling.sample),
    ]


def rest_routes(service: Service, endpoint: Callable[..., Any]) -> list[Route]:
    """The rest client's: training runs, their checkpoints, and a checkpoint's file to download."""

    def checkpoint_json(c: dict[str, Any]) -> dict[str, Any]:
        kinds = {"weights": "training", "sampler_weights": "sampler", "external_weights": "external"}
        return {"checkpoint_id": f"{c['kind']}/{c['name']}", "tinker_path": c["path"],
                "checkpoint_type": kinds[c["kind"]], "time": _iso(c["created"]), "size_bytes": c["size"],
                "public": False, "expires_at": _iso(c["expires"])}

    def run_json(r: dict[str, Any]) -> dict[str, Any]:
        return {"training_run_id": r["model_id"], "base_model": r["base"], "model_owner": r["owner"],
                "is_lora": True, "lora_rank": r["rank"], "corrupted": False, "last_request_time": _iso(r["created"])}

    def page(key: str, found: list[dict[str, Any]]) -> dict[str, Any]:
        return {key: found, "cursor": {"offset": 0, "limit": len(found), "total_count": len(found)}}

    async def runs(request: Request, owner: str) -> Any:
        return page("training_runs", [run_json(r) for r in service.store.runs(owner)])

    async def one_run(request: Request, owner: str) -> Any:
        run_id = request.path_params["run_id"]
        return run_json(_owned(service.store.run(run_id), owner, run_id))

    async def run_checkpoints(request: Request, owner: str) -> Any:
        run_id = request.path_params["run_id"]
        _owned(service.store.run(run_id), owner, run_id)
        return {"checkpoints": [checkpoint_json(c) for c in service.store.checkpoints(owner, run_id)]}

    async def all_checkpoints(request: Request, owner: str) -> Any:
        return page("checkpoints", [checkpoint_json(c) for c in service.store.checkpoints(owner)])

    async def delete_checkpoint(request: Request, owner: str) -> Any:
        service.checkpoints.delete(_checkpoint_of(service, request, owner)["path"], "client")
        return Response(status_code=204)

    async def checkpoint_ttl(request: Request, owner: str) -> Any:
        found = _checkpoint_of(service, request, owner)
        ttl = (await _object(request)).get("ttl_seconds")
        if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, int)):
            raise UserError(f"ttl_seconds {ttl!r}: a whole number of seconds, or null")
        service.checkpoints.set_ttl(found["path"], ttl)
        return Response(status_code=204)

    async def weights_info(request: Request, owner: str) -> Any:
        found = service.store.owned_checkpoint(owner, (await _object(request)).get("tinker_path"))
        row = service.store.run(found["model_id"]) or {}
        return {"base_model": row.get("base"), "is_lora": True, "lora_rank": row.get("rank")}

    return [
        Route(f"{API}/training_runs", endpoint(runs), methods=["GET"]),
        Route(f"{API}/training_runs/{{run_id}}", endpoint(one_run), methods=["GET"]),
        Route(f"{API}/training_runs/{{run_id}}/checkpoints", endpoint(run_checkpoints), methods=["GET"]),
        Route(f"{API}/checkpoints", endpoint(all_checkpoints), methods=["GET"]),
        Route(CHECKPOINT, endpoint(delete_checkpoint), methods=["DELETE"]),
        Route(f"{CHECKPOINT}/ttl", endpoint(checkpoint_ttl), methods=["PUT"]),
        Route(f"{API}/weights_info", endpoint(weights_info), methods=["POST"]),
    ]


def _checkpoint_of(service: Service, request: Request, owner: str) -> dict[str, Any]:
    p = request.path_params
    path = f"tinker://{p['run_id']}/{p['kind']}/{p['name']}"
    return _owned(service.store.checkpoint(path), owner, path)


def _owned(row: dict[str, Any] | None, owner: str, key: str) -> dict[str, Any]:
    """``row`` when it is ``owner``'s; KeyError (404) for one that is not there or is another key's."""
    if row is None or row["owner"] != owner:
        raise KeyError(key)
    return row


def download_routes(service: Service, endpoint: Callable[..., Any]) -> list[Route]:
    """External weights' files through URLs signed for an hour (no key needed to fetch them)."""
    secret = secrets.token_bytes(32)

    def signature(path: str, expires: int) -> str:
        return hmac.new(secret, f"{path}|{expires}".encode(), hashlib.sha256).hexdigest()

    async def download_urls(request: Request, owner: str) -> Any:
        found = _checkpoint_of(service, request, owner)
        folder = Path(found["file"])
        if not folder.is_dir():
            raise UserError(f"{found['path']} is not an external weights checkpoint (save_weights_external)")
        expires = int(time.time()) + 3600
        urls = {}
        for file in sorted(folder.iterdir()):
            key = f"{found['path']}|{file.name}"
            query = urlencode({"path": found["path"], "file": file.name, "expires": expires,
                               "sig": signature(key, expires)})
            urls[file.name] = str(request.base_url).rstrip("/") + f"{API}/checkpoint_file?{query}"
        return {"urls": urls, "expires": _iso(expires)}

    async def checkpoint_file(request: Request, owner: str) -> Any:
        q = request.query_params
        path, name, expires = q.get("path", ""), q.get("file", ""), int(q.get("expires", "0") or 0)
        if expires < time.time() or not hmac.compare_digest(signature(f"{path}|{name}", expires), q.get("sig", "")):
            return _error(403, "this download URL is not valid (expired, or signed by another server run)")
        found = service.store.checkpoint(path)
        if found is None or not (Path(found["file"]) / name).is_file():
            raise KeyError(path)
        return FileResponse(Path(found["file"]) / name, filename=name)

    return [
        Route(f"{CHECKPOINT}/external_weights_urls", endpoint(download_urls), methods=["GET"]),
        Route(f"{API}/checkpoint_file", endpoint(checkpoint_file, auth=False), methods=["GET"]),
    ]


async def serve_async(bases: list[str], state_dir: Path, api_keys: list[str], host: str, port: int,
                      limits: Limits | None = None, announce: Callable[[str], None] = print,
                      started: Callable[[Any], None] | None = None, ranks: Ranks | None = None) -> None:
    """Load the bases (their trainers where ``ranks`` say), then serve until cancelled (the trainers and the
    samplers' engines closed then); ``started`` gets the uvicorn server once it listens."""
    service = Service(bases, state_dir, limits or Limits(), ranks)
    listening = asyncio.Event()

    class Server(uvicorn.Server):
        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets=sockets)
            listening.set()

    try:
        await service.load_bases()
        server = Server(uvicorn.Config(build_app(service, api_keys), host=host, port=port, log_level="warning",
                                       timeout_keep_alive=75, timeout_graceful_shutdown=SHUTDOWN_GRACE_S))
        task = asyncio.ensure_future(server.serve())
        waiting = asyncio.ensure_future(listening.wait())
        await asyncio.wait([task, waiting], return_when=asyncio.FIRST_COMPLETED)  # listening, or failed to
        waiting.cancel()
        if server.started:
            bound = server.servers[0].sockets[0].getsockname()[1]
            # One URL on the line: scripts read it with a pattern (scripts/tinker_demo.sh).
            announce(f"tinker API on http://{host}:{bound} (bases: {', '.join(service.bases.names)}; "
                     f"state: {service.store.root}; metrics: GET /metrics)")
            if started is not None:
                started(server)
        await task
    finally:
        await service.close()
