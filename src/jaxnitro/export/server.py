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
sample shape, a body that is not valid JSON or `.npy`: 400, with
`{"error": "..."}` naming the input and the manifest's spec. An unknown model name:
404. Concurrent requests are merged by a `DynamicBatcher` (`batching.py`).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import time
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import ConfigError
from ..extras import require
from .batching import Arrays, DynamicBatcher
from .loader import LoadedBundle, load_bundle

if TYPE_CHECKING:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response

NPY = "application/x-npy"
NPZ = "application/x-npz"
FORM = "application/x-www-form-urlencoded"  # curl -d's default: read as JSON


class RequestError(ConfigError):
    """A predict request the bundle cannot take; its message is the 400's body."""


def create_app(
    bundle: LoadedBundle | str | os.PathLike[str],
    *,
    max_delay: float = 0.005,
    max_batch: int | None = None,
    warm_up: bool = True,
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

    Returns:
        A Starlette application; serve it with uvicorn, or test it with Starlette's
        `TestClient` / httpx's `ASGITransport`.

    Raises:
        MissingExtraError: starlette is not installed (the `serve` extra).
    """
    require("starlette", extra="serve", feature="nitro serve")
    from starlette.applications import Starlette
    from starlette.routing import Route

    model = bundle if isinstance(bundle, LoadedBundle) else load_bundle(bundle)
    name = model.manifest["name"]
    batcher = DynamicBatcher(
        model,
        batch_sizes=model.manifest["batch_sizes"],
        max_batch=max_batch,
        max_delay=max_delay,
    )
    if warm_up:
        for n in batcher.batch_sizes:
            model(**_zeros(model, n))

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

    async def predict(request: Request) -> Response:
        if request.path_params["name"] != name:
            return _unknown_model(request.path_params["name"], name)
        try:
            inputs = await _read_inputs(request, model)
            wire = model.check_inputs(inputs)
            want_npy = NPY in request.headers.get("accept", "")
            output = _output_name(request, model) if want_npy else None
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

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await batcher.aclose()

    app = Starlette(
        routes=[
            Route("/healthz", health, methods=["GET"]),
            Route("/v1/models/{name}:predict", predict, methods=["POST"]),
            Route("/v1/models/{name}", manifest, methods=["GET"]),
        ],
        lifespan=lifespan,
    )
    app.state.batcher = batcher
    app.state.bundle = model
    return app


def serve(
    path: str | os.PathLike[str],
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    max_delay: float = 0.005,
) -> None:
    """Load the bundle at `path` and serve it with uvicorn until interrupted.

    Args:
        path: the bundle's folder.
        host: the address to listen on; the default is loopback only.
        port: the TCP port.
        max_delay: the dynamic batching delay, in seconds.

    Raises:
        MissingExtraError: starlette or uvicorn is not installed (the `serve`
            extra).
    """
    require("starlette", extra="serve", feature="nitro serve")
    uvicorn = require("uvicorn", extra="serve", feature="nitro serve")
    started = time.perf_counter()
    app = create_app(path, max_delay=max_delay)
    model = app.state.bundle
    print(
        f"nitro serve: {model.manifest['name']!r} from {model.path} "
        f"(inputs {list(model.input_names)}, batch sizes "
        f"{model.manifest['batch_sizes']}, ready in "
        f"{time.perf_counter() - started:.1f} s) on http://{host}:{port}",
        flush=True,
    )
    uvicorn.run(app, host=host, port=port, access_log=False, log_level="warning")


async def _read_inputs(request: Request, model: LoadedBundle) -> dict[str, Any]:
    content_type = request.headers.get("content-type", "application/json")
    body = await request.body()
    if content_type.startswith(NPY):
        name = request.query_params.get("input")
        if name is None:
            if len(model.input_names) != 1:
                raise RequestError(
                    f"a .npy body is one input; bundle {model.manifest['name']!r} "
                    f"takes {list(model.input_names)}: name it with ?input=NAME, or "
                    f"send them all as one .npz ({NPZ})."
                )
            name = model.input_names[0]
        return {name: _load_array(body, f"the .npy body for input {name!r}")}
    if content_type.startswith(NPZ):
        try:
            with np.load(io.BytesIO(body), allow_pickle=False) as archive:
                return {key: archive[key] for key in archive.files}
        except (ValueError, OSError, EOFError) as error:
            raise RequestError(
                f"the body is not a readable .npz archive ({error}); write it with "
                "np.savez(buffer, name=array, ...)."
            ) from error
    if not content_type.startswith(("application/json", FORM)):
        raise RequestError(
            f"Content-Type {content_type!r} is not one this server reads: send "
            f"application/json, {NPY} (with ?input=NAME) or {NPZ}."
        )
    try:
        payload = json.loads(body)
    except ValueError as error:
        raise RequestError(
            f"the body is not valid JSON ({error}); send "
            '{"inputs": {"NAME": [[...], ...]}}.'
        ) from error
    if not isinstance(payload, dict) or not isinstance(payload.get("inputs"), dict):
        example = ", ".join(f'"{n}": [[...], ...]' for n in model.input_names)
        raise RequestError(
            'the JSON body must be an object with an "inputs" object, '
            f'{{"inputs": {{{example}}}}}; got {_brief(payload)}.'
        )
    specs = {s["name"]: s for s in model.manifest["inputs"]}
    return {
        key: _from_json(value, specs[key]) if key in specs else value
        for key, value in payload["inputs"].items()
    }


def _from_json(value: Any, spec: Mapping[str, Any]) -> np.ndarray:
    """Nested lists as an array of the spec's dtype, refusing what would change a
    value: fractions for an integer input, values out of its range, non-numbers."""
    dtype = np.dtype(spec["dtype"])
    expected = f"{spec['dtype']}[batch, {', '.join(map(str, spec['shape'][1:]))}]"
    try:
        array = np.asarray(value)
    except ValueError as error:  # ragged nesting
        raise RequestError(
            f"input {spec['name']!r}: the nested lists are not rectangular "
            f"({error}); the bundle takes {expected} (batch axis first)."
        ) from error
    if array.dtype.kind not in "biuf" or (
        array.dtype.kind == "f" and dtype.kind in "biu"
    ):
        seen = "fractions" if array.dtype.kind == "f" else f"{array.dtype} values"
        raise RequestError(
            f"input {spec['name']!r}: got {seen}, but the bundle takes {expected}; "
            "send numbers of that type."
        )
    if dtype.kind in "iu" and array.size:
        info = np.iinfo(dtype)
        low, high = array.min(), array.max()
        if low < info.min or high > info.max:
            raise RequestError(
                f"input {spec['name']!r}: values from {low} to {high} do not fit "
                f"the bundle's {expected} (range {info.min}..{info.max})."
            )
    return array.astype(dtype)


def _load_array(body: bytes, what: str) -> np.ndarray:
    try:
        return np.load(io.BytesIO(body), allow_pickle=False)
    except (ValueError, OSError, EOFError) as error:
        raise RequestError(
            f"{what} is not a readable .npy array ({error}); write it with "
            "np.save(buffer, array)."
        ) from error


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
    return {
        s["name"]: np.zeros((n, *s["shape"][1:]), np.dtype(s["dtype"]))
        for s in model.manifest["inputs"]
    }


def _unknown_model(asked: str, name: str) -> Response:
    return _json(
        {"error": f"no model {asked!r} here; this server serves {name!r}."},
        status=404,
    )


def _brief(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _json(value: Any, status: int = 200) -> Response:
    # json.dumps, not JSONResponse: a NaN output is written as NaN, not a 500.
    return _response(
        json.dumps(value).encode(), media_type="application/json", status=status
    )


def _response(body: bytes, *, media_type: str, status: int = 200) -> Response:
    from starlette.responses import Response

    return Response(body, status_code=status, media_type=media_type)
