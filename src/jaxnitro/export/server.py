"""`nitro serve`: a StableHLO bundle behind HTTP (Starlette + uvicorn, extra `serve`).

Endpoints, for a bundle exported with `name="v1"`:

- `GET /healthz`: `{"status": "ok", "model": "v1", "batches": 12, "rows": 40}` once
  the programs are compiled (the program calls and the samples served so far).
- `GET /v1/models/v1`: the bundle's manifest (the wire contract, batch sizes, ...).
- `POST /v1/models/v1:predict`: one batch of wire inputs, batch axis first. The body
  is one of
  - JSON (`Content-Type: application/json`, the default; `curl -d`'s
    `application/x-www-form-urlencoded` is read as JSON too):
    `{"inputs": {"x": [[0.1, ...], ...]}}`, every input by name as nested lists;
  - a raw `.npy` array (`Content-Type: application/x-npy`) for a large tensor: the
    body is one input, named by the query, `...:predict?input=x` (it may be left out
    when the bundle has one input);
  - an `.npz` archive (`Content-Type: application/x-npz`): every input by name.
  The answer is JSON, `{"outputs": {"logits": [[...], ...]}}`, unless the request
  sends `Accept: application/x-npy`: then the body is one output as `.npy`, named by
  `?output=NAME` (optional when the bundle has one output).

A wrong input name, a dtype that does not convert safely (a fraction for an integer
input, a value out of its range, a float64 `.npy` for a float32 input), a wrong
sample shape, a NaN or infinite value in an input whose contract refuses them (the
default; `ExportSpec(..., nonfinite="allow")` at export lets them through), a body
that is not valid JSON, `.npy` or `.npz`, or one nested too deeply: 400, with
`{"error": "..."}` naming the input and the manifest's spec. A body, a batch or
decoded inputs past `ServeLimits` (checked before the memory is allocated,
`request_body.py`): 413. An unknown model name or path: 404; a method an endpoint
does not take (`GET` on `:predict`): 405. Every error answer is JSON. Concurrent
requests are merged by a `DynamicBatcher` (`batching.py`).

The server logs one line per request (client, method, path, status, answer bytes,
milliseconds) and a line when it shuts down, on the `jaxnitro.serve` logger;
`serve` prints them on stdout.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import ConfigError
from ..extras import require
from .batching import Arrays, DynamicBatcher
from .format import BundleProgramError
from .loader import LoadedBundle, load_bundle
from .request_body import (
    NPY,
    NPZ,
    RequestError,
    ServeLimits,
    decode_json,
    decode_npy,
    decode_npz,
    read_body,
)

if TYPE_CHECKING:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response

FORM = "application/x-www-form-urlencoded"  # curl -d's default: read as JSON
LOGGER = "jaxnitro.serve"
log = logging.getLogger(LOGGER)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
ASGIApp = Callable[
    [Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]],
    Awaitable[None],
]


def create_app(
    bundle: LoadedBundle | str | os.PathLike[str],
    *,
    max_delay: float = 0.005,
    max_batch: int | None = None,
    warm_up: bool = True,
    limits: ServeLimits | None = None,
) -> Starlette:
    """The ASGI application serving one bundle.

    Args:
        bundle: a loaded bundle, or the folder of one (`load_bundle` reads it).
        max_delay: seconds the first request of a batch waits for more (dynamic
            batching); 0 batches only what is already queued.
        max_batch: the most rows one program call merges; default the largest
            exported batch size.
        warm_up: run every exported program once now, so the first requests do not
            pay their compilation.
        limits: what one request may carry (`ServeLimits()` by default: a 16 MiB
            body, 8192 rows, 64 MiB of decoded inputs, JSON 32 levels deep).

    Returns:
        A Starlette application; serve it with uvicorn, or test it with Starlette's
        `TestClient` / httpx's `ASGITransport`. `app.state.requests` counts the
        requests answered.

    Raises:
        MissingExtraError: starlette is not installed (the `serve` extra).
        BundleProgramError: a program fails its warm-up call on zeros.
    """
    require("starlette", extra="serve", feature="nitro serve")
    from starlette.applications import Starlette
    from starlette.middleware import Middleware

    limits = ServeLimits() if limits is None else limits
    if not isinstance(limits, ServeLimits):
        raise ConfigError(
            f"create_app: limits={limits!r} is not a ServeLimits; pass "
            "ServeLimits(max_body_bytes=..., max_rows=..., ...)."
        )
    model = bundle if isinstance(bundle, LoadedBundle) else load_bundle(bundle)
    batcher = DynamicBatcher(
        model,
        batch_sizes=model.batch_sizes,
        max_batch=max_batch,
        max_delay=max_delay,
    )
    if warm_up:
        for n in batcher.batch_sizes:
            _warm_up(model, n)
    app = Starlette(
        routes=_routes(model, batcher, limits),
        middleware=[Middleware(_AccessLog)],
        exception_handlers=_error_handlers(model.name),
        lifespan=_lifespan(model.name, batcher),
    )
    app.state.batcher = batcher
    app.state.bundle = model
    app.state.limits = limits
    app.state.requests = 0
    return app


def _routes(
    model: LoadedBundle, batcher: DynamicBatcher, limits: ServeLimits
) -> list[Any]:
    """The three endpoints (module docstring): health, the manifest, predict."""
    from starlette.routing import Route

    name = model.name

    async def health(request: Request) -> Response:
        return _json(
            {
                "status": "ok",
                "model": name,
                "batches": batcher.batches_run,
                "rows": batcher.rows_run,
            }
        )

    async def manifest(request: Request) -> Response:
        if request.path_params["name"] != name:
            return _unknown_model(request.path_params["name"], name)
        return _json(model.manifest)

    predict = _predict_endpoint(model, batcher, limits)
    predict_methods = ["POST", "GET", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"]
    return [
        Route("/healthz", health, methods=["GET"]),
        Route("/v1/models/{name}:predict", predict, methods=predict_methods),
        Route("/v1/models/{name}", manifest, methods=["GET"]),
    ]


def _predict_endpoint(
    model: LoadedBundle, batcher: DynamicBatcher, limits: ServeLimits
) -> Callable[[Request], Awaitable[Response]]:
    """`POST /v1/models/NAME:predict`: the body's inputs checked against the wire
    contract, run in a dynamic batch, answered as JSON or `.npy`; it answers
    every other method with a 405 naming POST (the route takes them all)."""
    name = model.name

    async def predict(request: Request) -> Response:
        if request.method != "POST":
            return _json(
                {
                    "error": f"{request.method} {request.url.path}: predict takes "
                    "POST with the inputs as its body (JSON, .npy or .npz); GET "
                    f"/v1/models/{name} returns the manifest."
                },
                status=405,
                headers={"Allow": "POST"},
            )
        if request.path_params["name"] != name:
            return _unknown_model(request.path_params["name"], name)
        try:
            inputs = await _read_inputs(request, model, limits)
            wire = model.check_inputs(inputs)
            want_npy = NPY in request.headers.get("accept", "")
            output = _output_name(request, model) if want_npy else None
        except RequestError as error:
            return _json({"error": str(error)}, status=error.status)
        except ConfigError as error:
            return _json({"error": str(error)}, status=400)
        try:
            outputs = await batcher.submit(wire)
        except Exception as error:  # the program failed: the batch's requests see it
            return _json(
                {"error": f"model {name!r} failed on this batch: {error!r}"},
                status=500,
            )
        if output is not None:
            buffer = io.BytesIO()
            np.save(buffer, outputs[output], allow_pickle=False)
            return _response(buffer.getvalue(), media_type=NPY)
        return _json({"outputs": {k: v.tolist() for k, v in outputs.items()}})

    return predict


def _error_handlers(name: str) -> dict[Any, Callable[..., Any]]:
    """Starlette's HTTP errors and any unexpected exception answered as JSON
    `{"error": ...}`: a 404 names the endpoints, a 405 the methods allowed."""
    from starlette.exceptions import HTTPException

    async def http_error(request: Request, error: Exception) -> Response:
        assert isinstance(error, HTTPException)
        detail = error.detail
        if error.status_code == 404:
            detail = (
                f"no endpoint {request.url.path}; this server answers GET /healthz, "
                f"GET /v1/models/{name} and POST /v1/models/{name}:predict."
            )
        headers = dict(error.headers or {})
        if error.status_code == 405:
            allowed = ", ".join(sorted(headers.get("Allow", "").split(", ")))
            headers["Allow"] = allowed
            detail = (
                f"{request.method} {request.url.path}: this endpoint takes {allowed}."
            )
        return _json({"error": detail}, status=error.status_code, headers=headers)

    async def server_error(request: Request, error: Exception) -> Response:
        return _json(
            {"error": f"internal error: {type(error).__name__}: {error}"}, status=500
        )

    return {HTTPException: http_error, Exception: server_error}


def _lifespan(
    name: str, batcher: DynamicBatcher
) -> Callable[[Starlette], contextlib.AbstractAsyncContextManager[None]]:
    """The app's lifespan: at shutdown, the batcher closed and a line logged with
    what the server answered."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await batcher.aclose()
        log.info(
            "nitro serve: %r shutting down after %d requests (%d program calls, "
            "%d rows)",
            name,
            app.state.requests,
            batcher.batches_run,
            batcher.rows_run,
        )

    return lifespan


class _AccessLog:
    """ASGI middleware: one log line per request, and the count on `app.state`."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(
        self,
        scope: Scope,
        receive: Callable[[], Awaitable[Message]],
        send: Callable[[Message], Awaitable[None]],
    ) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status, size = 500, 0

        async def sending(message: Message) -> None:
            nonlocal status, size
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body":
                size += len(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            state = scope["app"].state
            state.requests += 1
            if log.isEnabledFor(logging.INFO):
                client = scope.get("client")
                query = scope.get("query_string", b"").decode("latin-1")
                path = scope["path"] + (f"?{query}" if query else "")
                log.info(
                    '%s "%s %s" %d %d B %.1f ms',
                    f"{client[0]}:{client[1]}" if client else "-",
                    scope["method"],
                    _printable(path),
                    status,
                    size,
                    (time.perf_counter() - started) * 1e3,
                )


def _printable(text: str, limit: int = 200) -> str:
    """`text` for a log line: control and non-ASCII characters escaped, cut short."""
    escaped = text.encode("unicode_escape").decode("ascii")
    return escaped if len(escaped) <= limit else escaped[: limit - 3] + "..."


def _warm_up(model: LoadedBundle, n: int) -> None:
    program = model.program_files.get(str(n), model.program_files["dynamic"])
    try:
        model(**_zeros(model, n))
    except Exception as error:  # XLA's own error types: named for the program
        raise BundleProgramError(
            f"nitro serve: the program {os.path.join(model.path, program)} for "
            f"batch size {n} fails on zeros ({type(error).__name__}: {error}); the "
            "bundle is damaged or made for another platform. Export it again.",
            file=os.path.join(model.path, program),
            field=f"programs[{str(n)!r}]",
        ) from error


def serve(
    path: str | os.PathLike[str],
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    max_delay: float = 0.005,
    limits: ServeLimits | None = None,
) -> None:
    """Load the bundle at `path` and serve it with uvicorn until interrupted.

    Prints a start line, one access line per request and a shutdown line on
    stdout (the `jaxnitro.serve` logger).

    Args:
        path: the bundle's folder.
        host: the address to listen on; the default is loopback only.
        port: the TCP port.
        max_delay: the dynamic batching delay, in seconds.
        limits: what one request may carry; `ServeLimits()` by default.

    Raises:
        MissingExtraError: starlette or uvicorn is not installed (the `serve`
            extra).
        BundleError: `load_bundle` refuses the bundle, or a program fails its
            warm-up.
    """
    require("starlette", extra="serve", feature="nitro serve")
    uvicorn = require("uvicorn", extra="serve", feature="nitro serve")
    _log_to_stdout()
    started = time.perf_counter()
    app = create_app(path, max_delay=max_delay, limits=limits)
    model = app.state.bundle
    log.info(
        "nitro serve: %r from %s (inputs %s, batch sizes %s, ready in %.1f s) on "
        "http://%s:%d; limits: %s",
        model.name,
        model.path,
        list(model.input_names),
        list(model.batch_sizes),
        time.perf_counter() - started,
        host,
        port,
        app.state.limits.describe(),
    )
    uvicorn.run(app, host=host, port=port, access_log=False, log_level="warning")


def _log_to_stdout() -> None:
    """The `jaxnitro.serve` lines on stdout, timestamped, once per process."""
    if any(getattr(h, "_nitro_serve", False) for h in log.handlers):
        return
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    handler._nitro_serve = True  # type: ignore[attr-defined]
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False


async def _read_inputs(
    request: Request, model: LoadedBundle, limits: ServeLimits
) -> dict[str, Any]:
    content_type = request.headers.get("content-type", "application/json")
    if not content_type.startswith((NPY, NPZ, "application/json", FORM)):
        raise RequestError(
            f"Content-Type {content_type!r} is not one this server reads: send "
            f"application/json, {NPY} (with ?input=NAME) or {NPZ}."
        )
    body = await read_body(request, limits)
    if content_type.startswith(NPY):
        name = request.query_params.get("input")
        if name is None:
            if len(model.input_names) != 1:
                raise RequestError(
                    f"a .npy body is one input; bundle {model.name!r} "
                    f"takes {list(model.input_names)}: name it with ?input=NAME, or "
                    f"send them all as one .npz ({NPZ})."
                )
            name = model.input_names[0]
        return decode_npy(body, name, model, limits)
    if content_type.startswith(NPZ):
        return decode_npz(body, model, limits)
    return decode_json(body, model, limits)


def _output_name(request: Request, model: LoadedBundle) -> str:
    name = request.query_params.get("output")
    if name is None and len(model.output_names) == 1:
        return model.output_names[0]
    if name is None or name not in model.output_names:
        raise RequestError(
            f"Accept: {NPY} answers with one output; name it with ?output=NAME, one "
            f"of {list(model.output_names)} (got {name!r})."
        )
    return name


def _zeros(model: LoadedBundle, n: int) -> Arrays:
    return {s.name: np.zeros((n, *s.sample_shape), s.dtype) for s in model.inputs}


def _unknown_model(asked: str, name: str) -> Response:
    return _json(
        {"error": f"no model {asked!r} here; this server serves {name!r}."},
        status=404,
    )


def _json(
    value: Any, status: int = 200, headers: MutableMapping[str, str] | None = None
) -> Response:
    # json.dumps, not JSONResponse: a NaN output is written as NaN, not a 500.
    return _response(
        json.dumps(value).encode(),
        media_type="application/json",
        status=status,
        headers=headers,
    )


def _response(
    body: bytes,
    *,
    media_type: str,
    status: int = 200,
    headers: MutableMapping[str, str] | None = None,
) -> Response:
    from starlette.responses import Response

    return Response(
        body,
        status_code=status,
        media_type=media_type,
        headers=dict(headers) if headers else None,
    )
